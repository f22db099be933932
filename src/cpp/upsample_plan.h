// Upsampling's per-call plan: the per-axis maps, the work items and the scratch they
// need. Plain C++, compiled per ISA like every header the kernels include; the bindings
// reach it through upsample.h's plan functions (workspace_nbytes; the tables, which a test
// holds against the GPU backend's, volsample/_upsample_maps.py).
//
// Trilinear weights are separable: along each axis the forward is a sparse matrix with
// two entries per output index (taps i1, i0 with weights l1, l0, in that order; the one
// entry (o, 1) where the axis keeps its size), and the backward applies the transposes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "coords.h"

namespace vs {
namespace VS_ISA {

// One axis's map in CSR form: row r holds entries [starts[r], starts[r + 1]).
template <class T>
struct AxisMap {
  std::vector<int64_t> starts, index;
  std::vector<T> weight;
  int64_t rows() const { return int64_t(starts.size()) - 1; }
  int64_t nbytes() const {
    return int64_t(starts.size() + index.size()) * 8 + int64_t(weight.size() * sizeof(T));
  }
};

// The forward along one axis (out_size x in_size). Row o is (i1, l1) then (i0, l0): the
// kernels compute fma(l0, v0, l1 * v1), the very operations of PyTorch's compiled lerp.
// With a window, the rows are [first, first + out_size) of the map to `full` points.
template <class T>
AxisMap<T> forward_axis_map(int64_t in_size, int64_t out_size, bool align_corners,
                            double scale, int64_t first = 0, int64_t full = 0) {
  if (full <= 0) full = out_size, first = 0;
  const int64_t per_row = in_size == full ? 1 : 2;
  AxisMap<T> m;
  m.starts.resize(out_size + 1);
  m.index.resize(per_row * out_size);
  m.weight.resize(per_row * out_size);
  const T ratio = upsample_ratio<T>(in_size, full, align_corners, scale);
  m.starts[0] = 0;
  for (int64_t o = 0; o < out_size; ++o) {
    const int64_t k = per_row * o;
    m.starts[o + 1] = k + per_row;
    if (per_row == 1) {
      m.index[k] = first + o;
      m.weight[k] = T(1);
      continue;
    }
    const auto t = upsample_taps(upsample_source(ratio, first + o, align_corners), in_size);
    m.index[k] = t.i1;
    m.weight[k] = t.l1;
    m.index[k + 1] = t.i0;
    m.weight[k + 1] = t.l0;
  }
  return m;
}

// The transpose (n_cols = the forward's in_size rows), by a stable counting sort: each
// new row lists its entries in increasing old-row order, and within an old row in the
// old order. That order is the backward's summation order.
template <class T>
AxisMap<T> transpose(const AxisMap<T>& m, int64_t n_cols) {
  AxisMap<T> t;
  t.starts.assign(n_cols + 1, 0);
  for (int64_t i : m.index) ++t.starts[i + 1];
  for (int64_t c = 0; c < n_cols; ++c) t.starts[c + 1] += t.starts[c];
  t.index.resize(m.index.size());
  t.weight.resize(m.weight.size());
  std::vector<int64_t> next(t.starts.begin(), t.starts.end() - 1);
  for (int64_t r = 0; r < m.rows(); ++r)
    for (int64_t k = m.starts[r]; k < m.starts[r + 1]; ++k) {
      const int64_t at = next[m.index[k]]++;
      t.index[at] = r;
      t.weight[at] = m.weight[k];
    }
  return t;
}

// The forward's map of an axis, or with `transposed` the backward's.
template <class T>
AxisMap<T> axis_map(int64_t in_size, int64_t out_size, bool align_corners, double scale,
                    bool transposed, int64_t first = 0, int64_t full = 0) {
  AxisMap<T> m = forward_axis_map<T>(in_size, out_size, align_corners, scale, first, full);
  return transposed ? transpose(m, in_size) : m;
}

// A map as dense tap-major tables: index[k * rows + r] is row r's k-th entry, K the
// longest row. Shorter rows are padded with entries (pad, 0), which must read a zero.
// This is the W map's form: one tap at a time over a whole row of outputs.
//
// Where rows step through the input at a whole stride (a downsampling forward, the
// backward of an integer upsampling), tap k reads index stride * r + c over a run of
// rows [from[k], to[k]): there it reads one phase of the input (every stride-th element)
// in order, which the kernels do without a gather.
template <class T>
struct Taps {
  int64_t K = 0, rows = 0;
  int64_t span = 0;    // the input elements read: indices [0, span)
  int64_t stride = 0;  // the runs' stride; 0: no runs
  std::vector<int64_t> index;
  std::vector<T> weight;
  std::vector<int64_t> start, from, to;  // run k: index stride * r + start[k], r in [from, to)
                                         // (start kPadRun: pads, weight 0 reading a zero)
  int64_t phase_len = 0;                 // elements of each phase of the input (see gather_w)
  int64_t nbytes() const {
    return int64_t(index.size() + from.size() * 3) * 8 + int64_t(weight.size() * sizeof(T));
  }
};

constexpr int64_t kMaxTapStride = 16;  // longer strides: gathers (rare; their phases are short)
constexpr int64_t kMinTapRun = 16;     // shorter runs are not worth a phase
constexpr int64_t kPadRun = INT64_MIN;  // a run of pad taps

template <class T>
void find_tap_runs(Taps<T>& t, int64_t pad) {
  const int64_t n = t.rows, mid = n / 2;
  if (n < kMinTapRun) return;
  const int64_t s = t.index[mid + 1] - t.index[mid];  // tap 0 in the middle of the row
  if (s < 1 || s > kMaxTapStride) return;
  t.stride = s;
  t.phase_len = (t.span + s - 1) / s;
  t.start.assign(t.K, 0);
  t.from.assign(t.K, 0);
  t.to.assign(t.K, 0);
  for (int64_t k = 0; k < t.K; ++k) {
    const int64_t* ik = t.index.data() + k * n;
    const T* wk = t.weight.data() + k * n;
    if (ik[mid] == pad && wk[mid] == T(0)) {  // a tap only shorter rows have: zeros
      int64_t a = mid, b = mid + 1;
      while (a > 0 && ik[a - 1] == pad && wk[a - 1] == T(0)) --a;
      while (b < n && ik[b] == pad && wk[b] == T(0)) ++b;
      t.start[k] = kPadRun, t.from[k] = a, t.to[k] = b;
      continue;
    }
    const int64_t c = ik[mid] - s * mid;
    int64_t a = mid, b = mid + 1;
    while (a > 0 && ik[a - 1] == s * (a - 1) + c) --a;
    while (b < n && ik[b] == s * b + c) ++b;
    if (b - a < kMinTapRun) continue;  // an empty run: tap k gathers
    t.start[k] = c, t.from[k] = a, t.to[k] = b;
  }
}

template <class T>
Taps<T> dense_taps(const AxisMap<T>& m, int64_t pad) {
  Taps<T> t;
  t.rows = m.rows();
  for (int64_t r = 0; r < t.rows; ++r) t.K = std::max(t.K, m.starts[r + 1] - m.starts[r]);
  t.index.assign(t.K * t.rows, pad);
  t.weight.assign(t.K * t.rows, T(0));
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t k = m.starts[r]; k < m.starts[r + 1]; ++k) {
      t.index[(k - m.starts[r]) * t.rows + r] = m.index[k];
      t.weight[(k - m.starts[r]) * t.rows + r] = m.weight[k];
    }
  for (int64_t i : t.index) t.span = std::max(t.span, i + 1);
  find_tap_runs(t, pad);
  return t;
}

// Shapes of one pass src -> dst, both logical (N, C, D, H, W), and how it is cut into
// work items: a batch, a channel (all channels, channels last: a voxel is then a vector
// of `inner` channels), a chunk of dst planes and a band of dst rows. Items own disjoint
// parts of dst.
//
// The forward cuts dst planes into bands of H rows, so that a band's two plane slots, and
// the source rows it maps along W, stay in L2 while every dst plane of the item reads
// them (whole planes at C = 32 channels last, 1 MB, would not). Bands, not plane chunks,
// then share the work out: a band recomputes only a halo row or two of the W map, a chunk
// whole source planes. The backward keeps whole planes (band_rows = Hd): its scratch is
// source sized, and bands measured no faster (their halo rows of the large grad_output
// are read twice).
struct UpsampleGeometry {
  int64_t src[5], dst[5];
  int64_t inner, groups, band_rows, n_bands, chunk, n_chunks, items, threads;

  UpsampleGeometry(const int64_t* src_shape, const int64_t* dst_shape, bool channels_last,
                   int threads_wanted, bool transposed) {
    for (int k = 0; k < 5; ++k) {
      src[k] = src_shape[k];
      dst[k] = dst_shape[k];
    }
    const int64_t C = dst[1], planes = dst[2], Hd = dst[3], row = dst[4];
    inner = channels_last ? C : 1;
    groups = dst[0] * (channels_last ? 1 : C);
    constexpr int64_t band_elements = 32 << 10;  // 128 KB of float32 per slot
    const int64_t fit = band_elements / std::max<int64_t>(1, row * inner);
    band_rows = transposed ? Hd : std::min(Hd, std::max<int64_t>(1, fit));
    n_bands = Hd > 0 ? (Hd + band_rows - 1) / band_rows : 0;
    // The largest chunks that still give every thread a few items (items differ in
    // cost, and cores may be shared).
    constexpr int64_t items_per_thread = 4;
    const int64_t t = std::max<int64_t>(1, threads_wanted);
    const int64_t across = groups * n_bands;
    const int64_t wanted = across > 0 ? (items_per_thread * t + across - 1) / across : 1;
    const int64_t chunks = std::max<int64_t>(1, std::min(planes, wanted));
    chunk = planes > 0 ? (planes + chunks - 1) / chunks : 1;
    n_chunks = planes > 0 ? (planes + chunk - 1) / chunk : 0;
    items = groups * n_chunks * n_bands;
    threads = std::max<int64_t>(1, std::min(t, items));
  }
};

// The source rows [lo, hi) that map rows [r0, r1) read (lo == hi where they read none).
template <class T>
inline void source_span(const AxisMap<T>& m, int64_t r0, int64_t r1, int64_t& lo, int64_t& hi) {
  lo = INT64_MAX, hi = INT64_MIN;
  for (int64_t k = m.starts[r0]; k < m.starts[r1]; ++k)
    lo = std::min(lo, m.index[k]), hi = std::max(hi, m.index[k] + 1);
  if (lo >= hi) lo = hi = 0;
}

// The maps one pass applies: W as dense taps, H and D in CSR form.
template <class T>
struct UpsampleTables {
  Taps<T> w;
  AxisMap<T> h, d;
  int64_t band_span;  // the most source rows one band of dst rows reads along H
  bool h_kept;        // H keeps its size: dst row r is source row r (no H map applied)

  // src/dst as in UpsampleGeometry; `forward_in` / `forward_out` are the forward's sizes
  // (dst/src of the backward). scales are the forward's (D, H, W); the window's first
  // rows and full sizes (UpsampleArgs) are optional.
  UpsampleTables(const UpsampleGeometry& g, bool align_corners, const double* scales,
                 bool transposed, const int64_t* first = nullptr,
                 const int64_t* full = nullptr) {
    const int64_t* fin = transposed ? g.dst : g.src;
    const int64_t* fout = transposed ? g.src : g.dst;
    const int64_t none[3] = {0, 0, 0};
    if (!first || !full) first = full = none;
    // Backward pad taps read the zero voxel that ends each scratch row (index Ws).
    w = dense_taps(axis_map<T>(fin[4], fout[4], align_corners, scales[2], transposed, first[2],
                               full[2]),
                   transposed ? g.src[4] : 0);
    h = axis_map<T>(fin[3], fout[3], align_corners, scales[1], transposed, first[1], full[1]);
    d = axis_map<T>(fin[2], fout[2], align_corners, scales[0], transposed, first[0], full[0]);
    h_kept = fin[3] == fout[3] && (full[1] <= 0 || (first[1] == 0 && full[1] == fout[3]));
    band_span = 0;
    for (int64_t r0 = 0; r0 < g.dst[3]; r0 += g.band_rows) {
      int64_t lo, hi;
      source_span(h, r0, std::min(r0 + g.band_rows, g.dst[3]), lo, hi);
      band_span = std::max(band_span, hi - lo);
    }
  }
  int64_t nbytes() const { return w.nbytes() + h.nbytes() + d.nbytes(); }
};

// Scratch elements (of the compute type) one running thread holds.
//  forward:  a staged source row (Ws channel vectors), a band's source rows mapped along
//            W (unless H keeps its size) and two slots of a band mapped along H too;
//  backward: a band's source rows combined along D and its rows mapped along H too
//            (unless H keeps its size), each row ending in a zero voxel that the padded
//            W taps read.
template <class T>
inline int64_t upsample_scratch_elements(const UpsampleGeometry& g, const UpsampleTables<T>& t,
                                         bool transposed) {
  const int64_t Ws = g.src[4], Wd = g.dst[4];
  if (transposed) return (t.band_span + (t.h_kept ? 0 : g.band_rows)) * (Ws + 1) * g.inner;
  return (Ws + (t.h_kept ? 0 : t.band_span * Wd) + 2 * g.band_rows * Wd) * g.inner;
}

// Bytes a pass allocates beyond its result: the tables and each running thread's
// scratch. A pass that changes no spatial size is a copy made by the caller.
template <class T>
int64_t upsample_workspace_nbytes(const UpsampleGeometry& g, bool align_corners,
                                  const double* scales, bool transposed) {
  if (g.items == 0) return 0;
  const UpsampleTables<T> tables(g, align_corners, scales, transposed);
  return tables.nbytes() +
         g.threads * upsample_scratch_elements(g, tables, transposed) * int64_t(sizeof(T));
}

}  // namespace VS_ISA
}  // namespace vs
