// Trilinear upsampling kernels, forward and backward (compiled once per ISA).
//
// Both directions apply one 1-D map per axis (upsample_plan.h) in one parallel sweep
// over the destination planes:
//
// - forward: dst = D(H(W(src))), a band of dst rows at a time (upsample_plan.h says
//   why). Each source plane a dst plane needs is mapped along W and then H, over the
//   band's rows, into one of two slots (a dst plane reads source planes i1 and i0, equal
//   or adjacent, so the slot is the plane's parity) once per work item, and the slots are
//   combined along D. W runs on the smallest data, and each voxel is PyTorch's nested
//   evaluation fma(lz0, .., lz1 * ..) over fma(ly0, .., ..) over fma(lx0, v0, lx1 * v1),
//   operation for operation (explicit fma; the build never contracts on its own). A
//   large result is written with non-temporal stores (the same bits).
// - backward: dst = W(H(D(src))) with the transposed maps: for each dst plane, the source
//   planes of its D row are combined into scratch, mapped along H, and gathered along W
//   (the costly gather on the smallest data) straight into dst.
//
// 16-bit data is read from its own memory into float32 (a row or a tile at a time) and
// rounded once when stored. The inner loops run over contiguous rows or channel vectors
// with the same operations in every lane, so every ISA gives the scalar path's bits.
//
// Determinism: a work item owns a band of rows of whole dst planes and writes only them
// and its thread's scratch; each dst value is a sum over map entries in a fixed order,
// whatever the band (a band only limits which rows are computed). No atomics, and the
// bits depend neither on the thread count nor on which thread runs which item.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <type_traits>

#include "dtypes.h"
#include "simd.h"
#include "upsample.h"
#include "upsample_plan.h"
#include "upsample_simd.h"
#include "team.h"

namespace vs {
namespace VS_ISA {
namespace {

constexpr int64_t TILE = 512;  // compute-type elements of a stack tile (16-bit loads, stores)
constexpr int64_t kPhaseElements = 1024;  // a row split into phases on the stack; longer: gathers

// Row h of a source plane: element (x, i) (x < n_x, channel i < inner) at
// row + x * sx + i * si. `read` gives a run of it, in flat order x * inner + i, as compute
// type values: the row's own memory where it already holds them, else converted.
template <class S, class C>
struct RowReader {
  int64_t inner, sx, si;
  bool flat;       // element j of the flat order lies at row + j * step
  int64_t step;

  RowReader(int64_t inner_, int64_t sx_, int64_t si_) : inner(inner_), sx(sx_), si(si_) {
    flat = inner == 1 || sx == inner * si;
    step = inner == 1 ? sx : si;
  }

  const C* read(const S* row, int64_t j0, int64_t m, C* buffer) const {
    if constexpr (std::is_same_v<S, C>)
      if (flat && step == 1) return row + j0;
    if (flat) {
      load_run(buffer, row + j0 * step, step, m);
      return buffer;
    }
    int64_t x = j0 / inner, i = j0 % inner;
    for (int64_t j = 0; j < m; ++j) {
      buffer[j] = storage<S>::template load<C>(row + x * sx + i * si);
      if (++i == inner) i = 0, ++x;
    }
    return buffer;
  }
};

// n values into contiguous dst memory: compute(out, j0, m) writes flat values
// [j0, j0 + m) to out; straight into dst where it has the compute type and is not
// `streamed`, else a tile at a time, rounded once or streamed past the caches.
template <class S, class C, class F>
inline void emit(S* dst, int64_t n, bool streamed, F&& compute) {
  if constexpr (std::is_same_v<S, C>) {
    if (!streamed) {
      compute(dst, int64_t(0), n);
      return;
    }
  }
  C tile[TILE];
  for (int64_t j0 = 0; j0 < n; j0 += TILE) {
    const int64_t m = n - j0 < TILE ? n - j0 : TILE;
    compute(tile, j0, m);
    if constexpr (std::is_same_v<S, C>) stream_run(dst + j0, tile, m);
    else store_run(dst + j0, tile, m);
  }
}

constexpr int ENTRIES = 4;  // map entries add_entries takes at a time

// Up to ENTRIES map entries' share of a run of n values, in one pass over o: o = w[0] * v[0]
// for a map row's first entry (`first`, else o = fma(w[0], v[0], o)), then
// o = fma(w[e], v[e], o) for each entry after it (PyTorch's order of operations).
template <int M, bool first, class C>
inline void add_entries_of(C* o, const C* const* v_in, const C* w_in, int64_t n) {
  const C* v[M];
  C w[M];  // local copies: stores to o cannot move them, so they stay in registers
  for (int e = 0; e < M; ++e) v[e] = v_in[e], w[e] = w_in[e];
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    C acc = first ? w[0] * v[0][j] : std::fma(w[0], v[0][j], o[j]);
    for (int e = 1; e < M; ++e) acc = std::fma(w[e], v[e][j], acc);
    o[j] = acc;
  }
}

template <class C>
inline void add_entries(C* o, const C* const* v, const C* w, int m, int64_t n, bool first) {
  switch (m * 2 + first) {  // 1 <= m <= ENTRIES
    case 2: return add_entries_of<1, false>(o, v, w, n);
    case 3: return add_entries_of<1, true>(o, v, w, n);
    case 4: return add_entries_of<2, false>(o, v, w, n);
    case 5: return add_entries_of<2, true>(o, v, w, n);
    case 6: return add_entries_of<3, false>(o, v, w, n);
    case 7: return add_entries_of<3, true>(o, v, w, n);
    case 8: return add_entries_of<4, false>(o, v, w, n);
    default: return add_entries_of<4, true>(o, v, w, n);
  }
}

constexpr int kMaxFusedTaps = 16;

// Up to ENTRIES taps' share of out[x], x in [lo, hi), in one pass: out = w[0][x] *
// v[0][S x] (`first`, else fused into out) and then fused for each later tap, the
// gather's order of operations; with `pads`, then + 0, which is what the rows' trailing
// pad taps fma(0, 0, out) come to.
template <int M, bool first, int S, class C>
inline void fused_taps_of(C* out, const C* const* v_in, const C* const* w_in, int64_t lo,
                          int64_t hi, bool pads) {
  const C* v[M];
  const C* w[M];
  for (int k = 0; k < M; ++k) v[k] = v_in[k], w[k] = w_in[k];
#pragma omp simd
  for (int64_t x = lo; x < hi; ++x) {
    C acc = first ? w[0][x] * v[0][S * x] : std::fma(w[0][x], v[0][S * x], out[x]);
    for (int k = 1; k < M; ++k) acc = std::fma(w[k][x], v[k][S * x], acc);
    out[x] = pads ? acc + C(0) : acc;
  }
}

// The K taps (pad taps last, each `pad` true) in groups of ENTRIES; tap k's value for x
// at v[k][S x].
template <int S, class C>
inline void fused_taps(C* out, const C* const* v, const C* const* w, const bool* pad, int K,
                       int64_t lo, int64_t hi) {
  int real = K;
  while (real > 1 && pad[real - 1]) --real;
  for (int k = 0; k < real; k += ENTRIES) {
    const int m = std::min(ENTRIES, real - k);
    const bool pads = k + m == real && real < K;
    switch (m * 2 + (k == 0)) {
      case 2: fused_taps_of<1, false, S>(out, v + k, w + k, lo, hi, pads); break;
      case 3: fused_taps_of<1, true, S>(out, v + k, w + k, lo, hi, pads); break;
      case 4: fused_taps_of<2, false, S>(out, v + k, w + k, lo, hi, pads); break;
      case 5: fused_taps_of<2, true, S>(out, v + k, w + k, lo, hi, pads); break;
      case 6: fused_taps_of<3, false, S>(out, v + k, w + k, lo, hi, pads); break;
      case 7: fused_taps_of<3, true, S>(out, v + k, w + k, lo, hi, pads); break;
      case 8: fused_taps_of<4, false, S>(out, v + k, w + k, lo, hi, pads); break;
      default: fused_taps_of<4, true, S>(out, v + k, w + k, lo, hi, pads); break;
    }
  }
}

// out[x] = sum over taps k of weight[k, x0 + x] * row[index[k, x0 + x]], x in [lo, hi),
// by vector gathers (one channel): the first tap a product, later ones fused in (two
// taps: fma(l0, v0, l1 * v1)).
template <class C>
void gather_taps(C* out, const C* row, const Taps<C>& t, int64_t x0, int64_t lo, int64_t hi) {
  const int64_t n = t.rows;
  const int64_t* first = t.index.data() + x0;  // tap k of output x0 + x: first[k * n + x]
  const C* w_first = t.weight.data() + x0;
  if (hi - lo <= 4) {  // a run's edges: too short for vector loops
    for (int64_t x = lo; x < hi; ++x) {
      C acc = w_first[x] * row[first[x]];
      for (int64_t k = 1; k < t.K; ++k) acc = std::fma(w_first[k * n + x], row[first[k * n + x]], acc);
      out[x] = acc;
    }
    return;
  }
  if (t.K == 2) {
    const int64_t* second = first + n;
    const C* w_second = w_first + n;
#pragma omp simd
    for (int64_t x = lo; x < hi; ++x)
      out[x] = std::fma(w_second[x], row[second[x]], w_first[x] * row[first[x]]);
    return;
  }
#pragma omp simd
  for (int64_t x = lo; x < hi; ++x) out[x] = w_first[x] * row[first[x]];
  for (int64_t k = 1; k < t.K; ++k) {
    const int64_t* ik = first + k * n;
    const C* wk = w_first + k * n;
#pragma omp simd
    for (int64_t x = lo; x < hi; ++x) out[x] = std::fma(wk[x], row[ik[x]], out[x]);
  }
}

// out[(x - x0) * (c1 - c0) + i - c0] = sum_k weight[k, x] * row[index[k, x] * inner + i]
// for x in [x0, x1), i in [c0, c1): the W map, the first tap a product and later ones
// fused in (two taps: fma(l0, v0, l1 * v1)). One channel: the taps' strided runs in one
// pass, the rest by gathers; channels last: on whole channel vectors.
template <class C>
void gather_w(C* out, const C* row, const Taps<C>& t, int64_t inner, int64_t x0, int64_t x1,
              int64_t c0, int64_t c1) {
  const int64_t n = t.rows;
  const int64_t* index = t.index.data();
  const C* weight = t.weight.data();
  if (inner == 1) {
    const int64_t m = x1 - x0, s = t.stride, P = t.phase_len;
    // Outputs [a, b) (as x) lie in every tap's run: there all taps in one pass, reading
    // the row a stride apart (or its phases). Elsewhere by gathers.
    int64_t a = 0, b = 0;
    if (s > 0 && (s <= 2 || s * P <= kPhaseElements) && t.K <= kMaxFusedTaps) {
      a = x0, b = x1;
      for (int64_t k = 0; k < t.K; ++k) a = std::max(a, t.from[k]), b = std::min(b, t.to[k]);
      a = std::min(a, x1) - x0, b = std::max(b, a + x0) - x0;
    }
    gather_taps(out, row, t, x0, 0, a);
    gather_taps(out, row, t, x0, b, m);
    if (a < b) {
      const C* runs[kMaxFusedTaps];
      const C* weights[kMaxFusedTaps];
      bool pad[kMaxFusedTaps];
      for (int64_t k = 0; k < t.K; ++k) {
        pad[k] = t.start[k] == kPadRun;
        weights[k] = weight + k * n + x0;
      }
      if (s <= 2) {  // read in place, a constant stride apart
        for (int64_t k = 0; k < t.K; ++k) runs[k] = pad[k] ? row : row + t.start[k] + s * x0;
        if (s == 1) fused_taps<1>(out, runs, weights, pad, int(t.K), a, b);
        else fused_taps<2>(out, runs, weights, pad, int(t.K), a, b);
      } else {  // the row's phases, each in order: phases[p * P + j] = row[p + s * j]
        C phases[kPhaseElements];
        const int64_t whole = t.span / s;  // elements j < whole of every phase
        for (int64_t j = 0; j < whole; ++j)
          for (int64_t p = 0; p < s; ++p) phases[p * P + j] = row[s * j + p];
        for (int64_t p = 0; whole * s + p < t.span; ++p) phases[p * P + whole] = row[whole * s + p];
        for (int64_t k = 0; k < t.K; ++k) {
          // Index s * r + c is element r + (c - p) / s of phase p = c mod s.
          const int64_t c = t.start[k], p = (c % s + s) % s;
          runs[k] = pad[k] ? phases : phases + p * P + (c - p) / s + x0;
        }
        fused_taps<1>(out, runs, weights, pad, int(t.K), a, b);
      }
    }
    return;
  }
  const int64_t len = c1 - c0;
  for (int64_t x = x0; x < x1; ++x)
    for (int64_t k = 0; k < t.K; k += ENTRIES) {
      const int m = int(std::min<int64_t>(ENTRIES, t.K - k));
      const C* v[ENTRIES];
      C w[ENTRIES];
      for (int e = 0; e < m; ++e) {
        v[e] = row + index[(k + e) * n + x] * inner + c0;
        w[e] = weight[(k + e) * n + x];
      }
      add_entries(out + (x - x0) * len, v, w, m, len, k == 0);
    }
}

// The W map of one row into contiguous dst memory (rounded once where S is 16-bit).
template <class S, class C>
void gather_w_into(S* out, const C* row, const Taps<C>& t, int64_t inner) {
  const int64_t n = t.rows;
  if constexpr (std::is_same_v<S, C>) {
    gather_w(out, row, t, inner, 0, n, 0, inner);
  } else {
    C tile[TILE];
    if (inner <= TILE) {
      const int64_t xb = TILE / inner;
      for (int64_t x0 = 0; x0 < n; x0 += xb) {
        const int64_t x1 = x0 + xb < n ? x0 + xb : n;
        gather_w(tile, row, t, inner, x0, x1, 0, inner);
        store_run(out + x0 * inner, tile, (x1 - x0) * inner);
      }
      return;
    }
    for (int64_t x = 0; x < n; ++x)
      for (int64_t c0 = 0; c0 < inner; c0 += TILE) {
        const int64_t c1 = c0 + TILE < inner ? c0 + TILE : inner;
        gather_w(tile, row, t, inner, x, x + 1, c0, c1);
        store_run(out + x * inner + c0, tile, c1 - c0);
      }
  }
}

// out row r - r0 (row_len contiguous values) = sum over map row r's entries of
// weight * in row (index - in_first), for r in [r0, r1), in the entries' order (first a
// product, then fused); a row without entries is zero. The H map, on whole rows.
template <class C>
void combine_rows(C* out, const C* in, int64_t row_len, const AxisMap<C>& map, int64_t r0,
                  int64_t r1, int64_t in_first) {
  for (int64_t r = r0; r < r1; ++r) {
    C* o = out + (r - r0) * row_len;
    const int64_t first = map.starts[r], stop = map.starts[r + 1];
    if (first == stop) {
      for (int64_t j = 0; j < row_len; ++j) o[j] = C(0);
      continue;
    }
    for (int64_t k = first; k < stop; k += ENTRIES) {
      const int m = int(std::min<int64_t>(ENTRIES, stop - k));
      const C* v[ENTRIES];
      for (int e = 0; e < m; ++e) v[e] = in + (map.index[k + e] - in_first) * row_len;
      if (m == 2 && k == first)  // the upsampling row, often short: no dispatch
        add_entries_of<2, true>(o, v, &map.weight[k], row_len);
      else
        add_entries(o, v, &map.weight[k], m, row_len, k == first);
    }
  }
}

// What both directions share: the geometry, the tables, the operands' addressing and
// each thread's scratch.
template <class S, class C>
struct Pass {
  const UpsampleGeometry g;
  const UpsampleTables<C> t;
  const S* src;
  S* dst;
  int64_t ss[5], ds[5];     // element strides; ss[1] / ds[1] step a channel group too
  int64_t per_thread;
  std::unique_ptr<C[]> scratch;

  Pass(const UpsampleArgs& a, bool transposed)
      : g(a.src.shape, a.dst.shape, a.channels_last, a.threads, transposed),
        t(g, a.align_corners, a.scales, transposed, a.window_first, a.window_full),
        src(a.src.ptr<S>()),
        dst(a.dst.ptr<S>()),
        per_thread(upsample_scratch_elements(g, t, transposed)) {
    for (int k = 0; k < 5; ++k) ss[k] = a.src.stride[k], ds[k] = a.dst.stride[k];
    // dst planes are dense runs: H, W (and channels last, C) contiguous in that order.
    const int64_t C_ = g.dst[1], H = g.dst[3], W = g.dst[4];
    const int64_t inner = g.inner;
    const bool dense = (inner == 1 || C_ == 1 || ds[1] == 1) && (W == 1 || ds[4] == inner) &&
                       (H == 1 || ds[3] == W * inner);
    if (!dense) throw std::invalid_argument("upsample: dst planes must be contiguous");
    // Zeroed: the backward's zero voxels stay zero, and every page is touched here, so the
    // resident memory is what workspace_nbytes counts whichever threads get work.
    scratch.reset(new C[g.threads * per_thread]());
  }

  // Item -> (source base, dst base, first and end plane, first and end row).
  void item(int64_t it, const S*& s_base, S*& d_base, int64_t& p0, int64_t& p1, int64_t& r0,
            int64_t& r1) const {
    const int64_t per_n = g.groups / g.dst[0];  // channel groups per batch
    const int64_t b = it % g.n_bands, q = it / g.n_bands % g.n_chunks;
    const int64_t ng = it / g.n_bands / g.n_chunks;
    const int64_t n = ng / per_n, c = ng % per_n;
    const int64_t c_src = per_n == 1 ? 0 : c * ss[1], c_dst = per_n == 1 ? 0 : c * ds[1];
    s_base = src + n * ss[0] + c_src;
    d_base = dst + n * ds[0] + c_dst;
    p0 = q * g.chunk;
    p1 = p0 + g.chunk < g.dst[2] ? p0 + g.chunk : g.dst[2];
    r0 = b * g.band_rows;
    r1 = r0 + g.band_rows < g.dst[3] ? r0 + g.band_rows : g.dst[3];
  }
  C* thread_scratch() const { return scratch.get() + int64_t(omp_get_thread_num()) * per_thread; }
};

template <class S, class C>
void forward_pass(const UpsampleArgs& a) {
  Pass<S, C> ps(a, false);
  const UpsampleGeometry& g = ps.g;
  if (g.items == 0) return;
  const int64_t Ws = g.src[4], Wd = g.dst[4];
  const int64_t inner = g.inner, row_len = Wd * inner, band = g.band_rows;
  const RowReader<S, C> reader(inner, ps.ss[4], ps.ss[1]);
  const AxisMap<C>& dmap = ps.t.d;
  // A large result goes past the caches (it would not stay in them anyway) where the
  // slots are large too: then write-allocations would evict them (measured: 1.5x faster
  // at C = 32 channels last; no gain with NCDHW's small slots).
  const int64_t result_bytes =
      g.dst[0] * g.dst[1] * g.dst[2] * g.dst[3] * Wd * int64_t(sizeof(S));
  const bool streamed = result_bytes >= kStreamedResultBytes &&
                        2 * band * row_len * int64_t(sizeof(C)) >= (128 << 10);
  TeamCpus team(int(g.threads));
#pragma omp parallel num_threads(int(g.threads))
  {
    team.settle(omp_get_thread_num());
    C* stage = ps.thread_scratch();
    C* mapped_w = stage + Ws * inner;
    C* slots[2];
    slots[0] = mapped_w + (!ps.t.h_kept ? ps.t.band_span * row_len : 0);
    slots[1] = slots[0] + band * row_len;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < g.items; ++it) {
      const S* s_base;
      S* d_base;
      int64_t p0, p1, r0, r1;
      ps.item(it, s_base, d_base, p0, p1, r0, r1);
      const int64_t n = (r1 - r0) * row_len;  // a band of dst rows, through the item's planes
      int64_t lo = r0, hi = r1;                // the source rows the band reads
      if (!ps.t.h_kept) source_span(ps.t.h, r0, r1, lo, hi);
      int64_t held[2] = {-1, -1};  // the source plane in each slot
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t first = dmap.starts[p], stop = dmap.starts[p + 1];
        for (int64_t k = first; k < stop; ++k) {
          const int64_t s = dmap.index[k];
          if (held[s % 2] == s) continue;
          const S* sp = s_base + s * ps.ss[2];
          C* mapped = ps.t.h_kept ? slots[s % 2] : mapped_w;  // H keeps its size: W into the slot
          for (int64_t h = lo; h < hi; ++h)
            gather_w(mapped + (h - lo) * row_len,
                     reader.read(sp + h * ps.ss[3], 0, Ws * inner, stage), ps.t.w, inner, 0,
                     Wd, 0, inner);
          if (!ps.t.h_kept) combine_rows(slots[s % 2], mapped_w, row_len, ps.t.h, r0, r1, lo);
          held[s % 2] = s;
        }
        const C* v[2] = {slots[dmap.index[first] % 2], slots[dmap.index[stop - 1] % 2]};
        const int m = int(stop - first);  // 1 where D keeps its size
        emit<S, C>(d_base + p * ps.ds[2] + r0 * row_len, n, streamed,
                   [&](C* o, int64_t j0, int64_t count) {
                     const C* at[2] = {v[0] + j0, v[1] + j0};
                     add_entries(o, at, &dmap.weight[first], m, count, true);
                   });
      }
      if (streamed) stream_fence();
    }
  }
}

template <class S, class C>
void backward_pass(const UpsampleArgs& a) {
  Pass<S, C> ps(a, true);
  const UpsampleGeometry& g = ps.g;
  if (g.items == 0) return;
  const int64_t Ws = g.src[4], Wd = g.dst[4];
  const int64_t inner = g.inner;
  const int64_t row_len = (Ws + 1) * inner;  // each scratch row ends in a zero voxel
  const int64_t run = Ws * inner;            // the part of it the D map writes
  const RowReader<S, C> reader(inner, ps.ss[4], ps.ss[1]);
  const AxisMap<C>& dmap = ps.t.d;
  TeamCpus team(int(g.threads));
#pragma omp parallel num_threads(int(g.threads))
  {
    team.settle(omp_get_thread_num());
    C* mapped_d = ps.thread_scratch();
    C* mapped = ps.t.h_kept ? mapped_d : mapped_d + ps.t.band_span * row_len;
    C tiles[ENTRIES][TILE];
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < g.items; ++it) {
      const S* s_base;
      S* d_base;
      int64_t p0, p1, r0, r1;
      ps.item(it, s_base, d_base, p0, p1, r0, r1);
      int64_t lo = r0, hi = r1;  // the source rows the band reads
      if (!ps.t.h_kept) source_span(ps.t.h, r0, r1, lo, hi);
      for (int64_t p = p0; p < p1; ++p) {
        // Along D: the source planes of row p, a tile of each row at a time.
        const int64_t first = dmap.starts[p], stop = dmap.starts[p + 1];
        if (first == stop) {  // none (a window's gradient reaches few planes): +0, as mapped
          std::memset(static_cast<void*>(d_base + p * ps.ds[2] + r0 * Wd * inner), 0,
                      size_t((r1 - r0) * Wd * inner) * sizeof(S));
          continue;
        }
        // The one or two source planes the next dst plane reads and this one does not
        // (the backward of upsampling by 2): fetched ahead, row by row, where rows are
        // short contiguous single channels, streams too short for the hardware to follow
        // (measured: no faster with more planes, long rows or channels last).
        int64_t ahead = stop, ahead_stop = stop;
        if (p + 1 < p1 && inner == 1 && reader.step == 1 && run * int64_t(sizeof(S)) < 1024 &&
            first < stop) {
          ahead = dmap.starts[p + 1], ahead_stop = dmap.starts[p + 2];
          while (ahead < ahead_stop && dmap.index[ahead] <= dmap.index[stop - 1]) ++ahead;
          if (ahead_stop - ahead > 2) ahead = ahead_stop;
        }
        for (int64_t h = lo; h < hi; ++h) {
          for (int64_t k = ahead; k < ahead_stop; ++k) {
            const S* next = s_base + dmap.index[k] * ps.ss[2] + h * ps.ss[3];
            for (int64_t j = 0; j < run; j += 64 / int64_t(sizeof(S))) prefetch_(next + j);
          }
          C* o = mapped_d + (h - lo) * row_len;
          for (int64_t j0 = 0; j0 < run; j0 += TILE) {
            const int64_t n = run - j0 < TILE ? run - j0 : TILE;
            for (int64_t k = first; k < stop; k += ENTRIES) {
              const int m = int(std::min<int64_t>(ENTRIES, stop - k));
              const C* v[ENTRIES];
              for (int e = 0; e < m; ++e)
                v[e] = reader.read(s_base + dmap.index[k + e] * ps.ss[2] + h * ps.ss[3], j0, n,
                                   tiles[e]);
              add_entries(o + j0, v, &dmap.weight[k], m, n, k == first);
            }
          }
        }
        // Zero voxels stay zero.
        if (!ps.t.h_kept) combine_rows(mapped, mapped_d, row_len, ps.t.h, r0, r1, lo);
        S* out = d_base + p * ps.ds[2];
        for (int64_t h = r0; h < r1; ++h)
          gather_w_into(out + h * Wd * inner, mapped + (h - r0) * row_len, ps.t.w, inner);
      }
    }
  }
}

template <bool transposed>
void run(const UpsampleArgs& a) {
  if (a.src.dtype != a.dst.dtype) throw std::invalid_argument("upsample: src and dst dtypes differ");
  auto go = [&](auto s, auto c) {
    using S = decltype(s);
    using C = decltype(c);
    if constexpr (transposed) backward_pass<S, C>(a);
    else forward_pass<S, C>(a);
  };
  switch (a.src.dtype) {
    case DType::float16: return go(float16_bits{}, float{});
    case DType::bfloat16: return go(bfloat16_bits{}, float{});
    case DType::float32: return go(float{}, float{});
    case DType::float64: return go(double{}, double{});
    default: throw std::invalid_argument("upsample: unsupported dtype");
  }
}

}  // namespace

void upsample_forward(const UpsampleArgs& args) { run<false>(args); }
void upsample_backward(const UpsampleArgs& args) { run<true>(args); }

#ifdef VS_ISA_SCALAR
int64_t upsample_workspace_nbytes(const int64_t* src_shape, const int64_t* dst_shape,
                                  bool double_precision, bool channels_last, bool align_corners,
                                  const double* scales, int threads, bool transposed) {
  const UpsampleGeometry g(src_shape, dst_shape, channels_last, threads, transposed);
  return double_precision
             ? upsample_workspace_nbytes<double>(g, align_corners, scales, transposed)
             : upsample_workspace_nbytes<float>(g, align_corners, scales, transposed);
}

template <class T>
void axis_map_into(int64_t in_size, int64_t out_size, bool align_corners, double scale,
                   bool transposed, std::vector<int64_t>& starts, std::vector<int64_t>& index,
                   std::vector<T>& weight) {
  AxisMap<T> m = axis_map<T>(in_size, out_size, align_corners, scale, transposed);
  starts = std::move(m.starts);
  index = std::move(m.index);
  weight = std::move(m.weight);
}

void upsample_axis_map(int64_t in_size, int64_t out_size, bool align_corners, double scale,
                       bool transposed, std::vector<int64_t>& starts,
                       std::vector<int64_t>& index, std::vector<float>& weight) {
  axis_map_into(in_size, out_size, align_corners, scale, transposed, starts, index, weight);
}

void upsample_axis_map(int64_t in_size, int64_t out_size, bool align_corners, double scale,
                       bool transposed, std::vector<int64_t>& starts,
                       std::vector<int64_t>& index, std::vector<double>& weight) {
  axis_map_into(in_size, out_size, align_corners, scale, transposed, starts, index, weight);
}
#endif

}  // namespace VS_ISA
}  // namespace vs
