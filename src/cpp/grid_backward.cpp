// Grid sampling's backward (compiled once per ISA): grad_input, a scatter of each point's
// grad_output times its corner weights, and grad_grid, each point's sum over channels of
// its coordinate terms. The per-point formula is grid_formula.h's (PyTorch's operations in
// PyTorch's order: the float32 and float64 bits are PyTorch's); this file is the machinery
// that evaluates it L points (the ISA's vector lanes) and one channel at a time, and
// schedules the scatter so that every grad_input element receives its terms in increasing
// point order, as PyTorch adds them. How the work is split across threads, and why that
// keeps the bits: grid_backward_plan.h.
//
// The mode (1 or 8 corners) is a template parameter, chosen once per call; the padding is
// a per-block branch of the footprint. Where the points' coordinates come from and where
// their grid gradient goes are template parameters too (grid_common.h): the grid
// operands', or a warp's (grid_warp.h). 16-bit volumes are read from their own memory into
// float32 (float64 beside a float64 grid) and grad_input accumulates in that compute type.
#include <algorithm>
#include <bitset>
#include <cstdint>
#include <new>
#include <optional>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "grid_backward_plan.h"
#include "grid_common.h"
#include "grid_corners.h"
#include "grid_formula.h"
#include "grid_taps.h"
#include "grid_warp.h"
#include "team.h"

namespace vs {
namespace VS_ISA {
namespace grid {
namespace {

// Channels last, the scatter goes point by point over all channels at once (below this many
// channels, channel by channel): a corner's channels are adjacent elements, added as vectors
// (measured, benchmarks/scatter_designs.cpp: 3x faster at C = 8, 6x at 32).
constexpr int64_t kMinChannelVectors = 8;

// to[c] += from[c * step] * weight for c < count: each term a product rounded on its own,
// then added (no fused multiply-add), as scatter_term and the channel-by-channel scatter.
template <class S, class T>
inline void add_scaled_channels(T* to, const S* from, int64_t step, T weight, int64_t count) {
  if constexpr (std::is_same_v<S, T>) {
    if (step == 1) {
#pragma omp simd
      for (int64_t c = 0; c < count; ++c) to[c] += from[c] * weight;
      return;
    }
  }
  for (int64_t c = 0; c < count; ++c) to[c] += load<S, T>(from + c * step) * weight;
}

// The backward's operands and loops over points, L at a time; the points' coordinates come
// from `source`, their grid gradient goes to `sink`.
template <class S, class G, int MODE, class Source, class Sink>
struct Backward {
  using T = typename compute_of<S, G>::type;
  using V = typename native<T>::type;
  using Lane = index_lane_of<V>;
  using M = mask_of<V>;
  using F = CornerFootprint<MODE, V>;
  static constexpr int L = lanes<V>::count;
  static constexpr int kCorners = F::kCorners;

  const GridSampleArgs& a;
  Geometry g;
  const Source& source;
  const Sink sink;  // small: a few references and pointers
  const S* gout;
  const S* inp;
  T* gin;
  int64_t gi_offsets[8];
  bool channel_vectors;  // grad_input's channels adjacent: scatter them together (corners)
  bool run_adds;         // runs of points may scatter as vectors (PointBlock::scatter_runs)
  bool fetch_rows;       // each row's coordinates and grad_output fetched a row ahead

  Backward(const GridSampleArgs& args, const Source& points, const Sink& gradient_sink)
      : a(args), g(args), source(points), sink(gradient_sink), gout(args.grad_output.ptr<S>()),
        inp(args.input.ptr<S>()), gin(args.grad_input.ptr<T>()),
        channel_vectors(taps_of<MODE> != kTaps && gin && args.grad_input.stride[1] == 1 &&
                        g.C >= kMinChannelVectors),
        run_adds(has_run_add<V>::value && MODE == BILINEAR && gin &&
                 runs_keep_rows_apart(args.grad_input.stride)),
        fetch_rows(fetches_rows(g, sizeof(G))) {
    if (gin) corner_offsets(a.grad_input, gi_offsets);
  }

  // A run's four corner rows (y, z) are L + 1 elements wide: they must not overlap.
  static bool runs_keep_rows_apart(const int64_t* s) {
    return s[4] == 1 && s[3] >= L + 1 && s[2] >= s[3] + L + 1;
  }

  // Whether points [w, w + valid) of a row may touch the task's planes (judged from z
  // alone, a superset): a slab that shares a row with others but does not compute its grid
  // gradient skips the row's blocks that reach none of its planes, unprepared.
  bool reaches(const RowCoords<T>& r, const Row& row, int64_t w, int64_t valid,
               Planes planes) const {
    const T* z = r.axis(2) + w;
    const bool corners = a.align_corners;
    int64_t first, last;
    if (a.padding == ZEROS) points_planes<MODE, ZEROS>(z, valid, g.D, corners, first, last);
    else if (a.padding == BORDER) points_planes<MODE, BORDER>(z, valid, g.D, corners, first, last);
    else points_planes<MODE, REFLECTION>(z, valid, g.D, corners, first, last);
    const int64_t batch = row.n * g.D;
    return first <= last && batch + first < planes.hi && batch + last >= planes.lo;
  }

  const S* gout_row(const Row& row) const {
    const int64_t* s = a.grad_output.stride;
    return gout + row.n * s[0] + row.d * s[2] + row.h * s[3];
  }

  // A hint to fetch row i's coordinates and its first channel's grad_output (all its
  // channels, channels last) while the row before it is worked (prefetch_span).
  void prefetch_row(int64_t i) const {
    if (!fetch_rows || i >= g.rows) return;
    const Row row(i, g);
    source.prefetch(row, g);
    const int64_t* s = a.grad_output.stride;
    if (s[4] == 1 || s[4] == g.C)
      prefetch_span(gout_row(row), (s[4] == 1 ? g.Wo : g.Wo * g.C) * int64_t(sizeof(S)));
  }

  // Points [w, w + L) of a row: with SCATTER, their scatter terms are added into
  // grad_input's corners (those on the task's planes), channel by channel; with GATHER,
  // their coordinate terms are summed over the channels and their grid gradient stored.
  template <bool SCATTER, bool GATHER>
  struct PointBlock {
    static constexpr bool kGradient = GATHER && MODE != NEAREST;
    const Backward* k;
    Row row;
    int64_t w, valid;
    bool touches;
    F f;
    std::optional<CornerReader<MODE, V>> reader;
    V cw[8];                      // corner weights
    V sum[3];                     // coordinate terms, summed over the channels so far
    alignas(64) Lane gi_lanes[L];
    unsigned live;                // the valid lanes
    unsigned corner_lanes[8];     // corner k's lanes that scatter (inside, on the task's planes)
    bool corner_major;            // the scatter may go corner by corner (see scatter_order)
    int flip;                     // ... from corner 7 ^ flip down to corner 0 ^ flip
    unsigned run_next;            // lanes l whose low corner is lane l - 1's next element
    bool by_runs;                 // the scatter goes run by run (scatter_runs)

    // Made in place (the blocks are reused row after row, and are large to copy).
    void prepare(const Backward& kernel, const RowCoords<T>& r, const Row& row_, int64_t w_,
                 Planes planes) {
      k = &kernel;
      row = row_;
      w = w_;
      valid = std::min<int64_t>(L, kernel.g.Wo - w);
      touches = GATHER || !planes.clip || kernel.reaches(r, row, w, valid, planes);
      if (!touches) return;
      // Built in place: a copy would re-read the corner masks, written 2 bytes at a time, in
      // wider loads that wait for those stores to retire (no store forwarding).
      new (&f) F(r, w, kernel.g, kernel.a.padding, kernel.a.align_corners);
      sum[0] = sum[1] = sum[2] = V(T(0));
      reader.reset();
      const Geometry& g = kernel.g;
      touches = bits_of(f.any()) != 0;
      if (!touches) return;  // nothing to do: finish() writes the grid gradient, 0
      if (kGradient) reader.emplace(f, g, kernel.a.input.stride);
      if (MODE == NEAREST) cw[0] = V(T(1));
      else corner_weights(f.weight, cw);
      if (SCATTER) {  // each corner's lanes, clipped to the task's planes
        const auto offsets = f.offset(kernel.a.grad_input.stride);
        store_(gi_lanes, offsets);
        live = unsigned((uint64_t(1) << valid) - 1);
        unsigned on_planes[2] = {live, live};  // corners of z bit 0, 1
        if (planes.clip) {  // compared in this batch's z, small whole numbers
          const V lo{T(std::clamp<int64_t>(planes.lo - row.n * g.D, -2, g.D + 1))};
          const V hi{T(std::clamp<int64_t>(planes.hi - row.n * g.D, -2, g.D + 1))};
          const V z0 = f.low[2], z1 = f.low[2] + V(T(1));
          on_planes[0] &= bits_of((lo <= z0) & (z0 < hi));
          on_planes[1] &= bits_of((lo <= z1) & (z1 < hi));
        }
        for (int c = 0; c < kCorners; ++c)
          corner_lanes[c] = bits_of(f.corner[c]) & on_planes[z_bit(c)];
        by_runs = false;
        if constexpr (has_run_add<V>::value) {
          if (kernel.run_adds) {
            run_next = run_links_(offsets) & live;  // mostly long runs: by runs
            by_runs = 2 * int64_t(std::bitset<32>(run_next).count()) >= valid;
          }
        }
        if (!by_runs) scatter_order();  // the runs keep point order on their own
      }
    }

    // Every element must receive its terms in point order. Corner by corner (each over
    // the lanes in order) does that when, along the lanes, each axis' low tap never falls
    // (or never rises): two lanes a < b reaching one element then reach it through corners
    // whose bits differ only where a's tap lies below b's, so a's corner comes first when
    // corners are taken from 7 down to 0, each bit of a falling axis flipped. This order
    // has no lane waiting on the previous lane's store, as the point-by-point one has.
    void scatter_order() {
      corner_major = true;
      flip = 0;
      if constexpr (L > 1 && MODE != NEAREST) {  // one corner: the orders are the same
        const unsigned pairs = live >> 1;  // lanes l with lane l + 1 valid
        for (int axis = 0; axis < 3; ++axis) {
          const V now = f.low[axis], next = next_lane_(now);
          if ((bits_of(now <= next) & pairs) == pairs) continue;
          if ((bits_of(next <= now) & pairs) == pairs) flip |= 1 << axis;
          else corner_major = false;
        }
      }
    }

    // Fetch ahead what channel c reads: the volume's corners and grad_input's.
    void prefetch(int64_t c) const {
      if (!touches) return;
      const GridSampleArgs& a = k->a;
      if (kGradient) reader->prefetch(k->inp + row.n * a.input.stride[0] + c * a.input.stride[1]);
      if (SCATTER && !k->channel_vectors) {
        const int64_t* gs = a.grad_input.stride;
        const T* gi_c = k->gin + row.n * gs[0] + c * gs[1];
        for (int64_t corner_row : {int64_t(0), gs[3], gs[2], gs[2] + gs[3]}) {
          prefetch_(gi_c + gi_lanes[0] + corner_row);
          prefetch_(gi_c + gi_lanes[valid - 1] + corner_row + gs[4]);
        }
      }
    }

    // Channel c's share: its coordinate terms summed, its scatter terms scattered (unless
    // scatter_channels does that).
    void channel(int64_t c) {
      if (!touches || (!kGradient && k->channel_vectors)) return;
      const GridSampleArgs& a = k->a;
      const int64_t* gs = a.grad_output.stride;
      const V grad_output =
          load_lanes<V>(k->gout_row(row) + c * gs[1] + w * gs[4], gs[4], valid);
      if (kGradient) {
        V v[8];
        reader->read(k->inp + row.n * a.input.stride[0] + c * a.input.stride[1], v);
        add_coordinate_terms(v, f.weight, f.corner, grad_output, sum);
      }
      if (SCATTER && !k->channel_vectors) scatter(c, grad_output);
    }

    // Every channel's scatter terms added into grad_input (channel_vectors), point by point:
    // a point's corners are distinct elements, so each element receives its terms in point
    // order, and a corner's channels go as vectors.
    void scatter_channels() const {
      if (!SCATTER || !touches) return;
      const GridSampleArgs& a = k->a;
      const int64_t* os = a.grad_output.stride;
      alignas(64) T weights[8][L];
      for (int i = 0; i < kCorners; ++i) store_(weights[i], cw[i]);
      T* gi_n = k->gin + row.n * a.grad_input.stride[0];
      const S* go = k->gout_row(row) + w * os[4];
      for (int64_t l = 0; l < valid; ++l)
        for (int i = 0; i < kCorners; ++i)
          if (corner_lanes[i] >> l & 1)
            add_scaled_channels(gi_n + gi_lanes[l] + k->gi_offsets[i], go + l * os[4], os[1],
                                weights[i][l], k->g.C);
    }

    // Channel c's scatter terms added into grad_input, in the order scatter_order chose.
    void scatter(int64_t c, V grad_output) const {
      alignas(64) T terms[8][L];
      for (int i = 0; i < kCorners; ++i) store_(terms[i], scatter_term(grad_output, cw[i]));
      const GridSampleArgs& a = k->a;
      T* gi_c = k->gin + row.n * a.grad_input.stride[0] + c * a.grad_input.stride[1];
      int64_t to[8];  // a local copy: the compiler keeps it in registers
      std::copy(k->gi_offsets, k->gi_offsets + 8, to);
      if constexpr (has_run_add<V>::value && MODE == BILINEAR) {
        if (by_runs) return scatter_runs(gi_c, to, terms);
      }
      if (corner_major) {
        for (int key = kCorners - 1; key >= 0; --key) {
          const int i = key ^ flip;
          T* at = gi_c + to[i];
          const T* t = terms[i];
          const unsigned lanes = corner_lanes[i];
          if (lanes == live) {  // every lane, without branches
            for (int64_t l = 0; l < valid; ++l) at[gi_lanes[l]] += t[l];
          } else {
            for (int64_t l = 0; l < valid; ++l)
              if (lanes >> l & 1) at[gi_lanes[l]] += t[l];
          }
        }
      } else {
        for (int64_t l = 0; l < valid; ++l) {
          T* at = gi_c + gi_lanes[l];
          for (int i = 0; i < kCorners; ++i)
            if (corner_lanes[i] >> l & 1) at[to[i]] += terms[i][l];
        }
      }
    }

    // The scatter run by run, in lane order: a run is lanes whose low corners are
    // consecutive elements (lane l's is lane l - 1's next), so each of its four corner rows
    // (y, z) is one stretch of L + 1 elements that it adds to as a vector, the x1 terms
    // before the x0 terms: each element still receives its terms in point order (runs
    // follow each other in lane order; within a run, an element's x1 term comes from the
    // point before its x0 term's). A lone lane adds its corners one by one.
    void scatter_runs(T* gi_c, const int64_t* to, const T (*terms)[L]) const {
      for (int64_t first = 0, end; first < valid; first = end) {
        for (end = first + 1; end < valid && (run_next >> end & 1); ++end) {
        }
        if (end - first == 1) {
          for (int i = 0; i < kCorners; ++i)
            if (corner_lanes[i] >> first & 1) gi_c[gi_lanes[first] + to[i]] += terms[i][first];
          continue;
        }
        const unsigned run = unsigned((uint64_t(1) << end) - (uint64_t(1) << first));
        T* low = gi_c + (int64_t(gi_lanes[first]) - first);  // lane l's low corner: low[l]
        for (int j = 0; j < 4; ++j)  // corner row j: corners 2 j (x0) and 2 j + 1 (x1)
          add_run_pair_(low + to[2 * j], corner_lanes[2 * j] & run, load_<V>(terms[2 * j]),
                        corner_lanes[2 * j + 1] & run, load_<V>(terms[2 * j + 1]));
      }
    }

    // The points' grid gradients handed to the sink (nearest: exactly 0).
    void finish() const {
      if (!GATHER) return;
      if (!touches) return k->sink.template zero<L>(row, w, valid);
      const M any = f.any();
      alignas(64) T gradient[3][L];
      for (int axis = 0; axis < 3; ++axis)
        store_(gradient[axis],
               kGradient ? grid_gradient(f.slope[axis], sum[axis], any) : V(T(0)));
      k->sink.template store<L>(row, w, valid, gradient[0], gradient[1], gradient[2]);
    }
  };

  // Bicubic and B-spline points [w, w + L) of a row, as PointBlock does for the corners.
  // The scatter goes point by point (lane by lane), each point's 64 taps in (z, y, x)
  // order, so every element receives its terms in point order, and taps that padding
  // folds onto one voxel add in tap order. A point whose four x taps all scatter onto
  // consecutive elements adds each row's four terms without branches (add_run).
  template <bool SCATTER, bool GATHER>
  struct TapBlock {
    const Backward* k;
    Row row;
    int64_t w, valid;
    bool touches;
    TapFootprint<MODE, V> f;
    std::optional<TapReader<MODE, V>> reader;  // of the input, for the grid gradient
    V sum[3];                                    // coordinate terms, summed over the channels
    alignas(64) Lane gi_row[kTaps * kTaps][L];   // grad_input offsets of row j = 4 z + y
    alignas(64) Lane gi_column[kTaps][L];        // and of x tap k within a row
    alignas(64) T weight[3][kTaps][L];
    alignas(64) T x_weight[L][kTaps];  // the x taps' weights, point by point
    unsigned tap_lanes[3][kTaps];  // each tap's lanes that scatter (z: on the task's planes)
    unsigned x_run;                // lanes whose x taps all scatter, onto consecutive elements

    VS_NOINLINE void prepare(const Backward& kernel, const RowCoords<T>& r, const Row& row_,
                             int64_t w_, Planes planes) {
      k = &kernel;
      row = row_;
      w = w_;
      valid = std::min<int64_t>(L, kernel.g.Wo - w);
      touches = GATHER || !planes.clip || kernel.reaches(r, row, w, valid, planes);
      if (!touches) return;
      new (&f) TapFootprint<MODE, V>(r, w, kernel.g, kernel.a.padding, kernel.a.align_corners);
      sum[0] = sum[1] = sum[2] = V(T(0));
      reader.reset();
      touches = bits_of(f.any()) != 0;
      if (!touches) return;  // nothing to do: finish() writes the grid gradient, 0
      if (GATHER) reader.emplace(f, kernel.a.input.stride, kernel.g.W);
      if (SCATTER) {
        f.offsets(kernel.a.grad_input.stride, gi_row, gi_column);
        const unsigned live = unsigned((uint64_t(1) << valid) - 1);
        for (int axis = 0; axis < 3; ++axis)
          for (int t = 0; t < kTaps; ++t) {
            store_(weight[axis][t], f.weight[axis][t]);
            tap_lanes[axis][t] = bits_of(f.reads[axis][t]) & live;
          }
        x_run = tap_lanes[0][0] & tap_lanes[0][1] & tap_lanes[0][2] & tap_lanes[0][3];
        for (int64_t l = 0; l < valid; ++l) {
          for (int t = 0; t < kTaps; ++t) {
            x_weight[l][t] = weight[0][t][l];
            if (gi_column[t][l] != gi_column[0][l] + t) x_run &= ~(1u << l);
          }
        }
        if (planes.clip) {  // the padded z taps are whole numbers in [0, D)
          const V lo{T(std::clamp<int64_t>(planes.lo - row.n * kernel.g.D, -1, kernel.g.D))};
          const V hi{T(std::clamp<int64_t>(planes.hi - row.n * kernel.g.D, -1, kernel.g.D))};
          for (int t = 0; t < kTaps; ++t)
            tap_lanes[2][t] &= bits_of((lo <= f.voxel[2][t]) & (f.voxel[2][t] < hi));
        }
      }
    }

    void prefetch(int64_t) const {}

    // Channel c's share: its coordinate terms summed, its scatter terms scattered.
    VS_NOINLINE void channel(int64_t c) {
      if (!touches) return;
      const GridSampleArgs& a = k->a;
      const int64_t* gs = a.grad_output.stride;
      const V grad_output =
          load_lanes<V>(k->gout_row(row) + c * gs[1] + w * gs[4], gs[4], valid);
      if (GATHER)
        add_tap_coordinate_terms(f, *reader,
                                 k->inp + row.n * a.input.stride[0] + c * a.input.stride[1],
                                 grad_output, sum);
      if (SCATTER) scatter(c, grad_output);
    }

    void scatter(int64_t c, V grad_output) const {
      alignas(64) T go[L];
      store_(go, grad_output);
      const GridSampleArgs& a = k->a;
      T* gi_c = k->gin + row.n * a.grad_input.stride[0] + c * a.grad_input.stride[1];
      for (int64_t l = 0; l < valid; ++l) {
        const bool run = x_run >> l & 1;
        for (int z = 0; z < kTaps; ++z) {
          if (!(tap_lanes[2][z] >> l & 1)) continue;
          for (int y = 0; y < kTaps; ++y) {
            if (!(tap_lanes[1][y] >> l & 1)) continue;
            T* at = gi_c + gi_row[kTaps * z + y][l];
            const T wyz = weight[1][y][l] * weight[2][z][l];
            if (run) {
              add_run(at + gi_column[0][l], go[l], x_weight[l], wyz);
              continue;
            }
            for (int x = 0; x < kTaps; ++x)
              if (tap_lanes[0][x] >> l & 1)
                at[gi_column[x][l]] += go[l] * (weight[0][x][l] * wyz);
          }
        }
      }
    }

    // at[x] += go * (w[x] * wyz) for the four x taps of a row, at consecutive elements:
    // element-wise, so the compiler may add the four at once (the same bits).
    static void add_run(T* at, T go, const T w[kTaps], T wyz) {
      T term[kTaps];
      for (int x = 0; x < kTaps; ++x) term[x] = go * (w[x] * wyz);
      for (int x = 0; x < kTaps; ++x) at[x] += term[x];
    }

    // The points' grid gradients handed to the sink.
    VS_NOINLINE void finish() const {
      if (!GATHER) return;
      if (!touches) return k->sink.template zero<L>(row, w, valid);
      alignas(64) T gradient[3][L];
      for (int axis = 0; axis < 3; ++axis)
        store_(gradient[axis], grid_gradient(f.slope[axis], sum[axis], f.finite));
      k->sink.template store<L>(row, w, valid, gradient[0], gradient[1], gradient[2]);
    }
  };

  // The block type of this mode.
  template <bool SCATTER, bool GATHER>
  using Block = std::conditional_t<taps_of<MODE> == kTaps, TapBlock<SCATTER, GATHER>,
                                   PointBlock<SCATTER, GATHER>>;

  // Per-thread blocks of a row. With several channels the row's blocks are prepared
  // together and then swept channel by channel, so that the reads and writes stay on a few
  // rows of one channel at a time, which the caches keep; one channel takes a block at a time.
  struct RowWork {
    RowCoords<T> coords;
    std::vector<Block<true, true>> both;
    std::vector<Block<true, false>> scatter;
    std::vector<Block<false, true>> gradient;
    RowWork(int64_t Wo, int64_t C) : coords(Wo) {
      const size_t blocks = C > 1 ? size_t((Wo + L - 1) / L) : 0;
      both.resize(blocks);
      scatter.resize(blocks);
      gradient.resize(blocks);
    }
  };

  // One row's points, block by block (one channel) or channel by channel (several).
  template <class Block>
  VS_FLATTEN void sweep(std::vector<Block>& blocks, const RowCoords<T>& r, const Row& row,
                        Planes planes) const {
    if (g.C == 1) {  // a local block, which the compiler keeps in registers
      Block block;
      for (int64_t w = 0; w < g.Wo; w += L) {
        block.prepare(*this, r, row, w, planes);
        block.channel(0);
        block.finish();
      }
      return;
    }
    const int64_t group = int64_t(blocks.size());
    for (int64_t first = 0; first < g.Wo; first += group * L) {
      const int64_t count = std::min<int64_t>(group, (g.Wo - first + L - 1) / L);
      for (int64_t b = 0; b < count; ++b) blocks[b].prepare(*this, r, row, first + b * L, planes);
      for (int64_t c = 0; c < g.C; ++c)
        for (int64_t b = 0; b < count; ++b) {
          const int64_t ahead = c * count + b + kPrefetchBlocks;  // in (channel, block) order
          if (ahead < g.C * count) blocks[ahead % count].prefetch(ahead / count);
          blocks[b].channel(c);
        }
      if constexpr (taps_of<MODE> != kTaps)
        if (channel_vectors)
          for (int64_t b = 0; b < count; ++b) blocks[b].scatter_channels();
      for (int64_t b = 0; b < count; ++b) blocks[b].finish();
    }
  }

  // Slab s: every point's share of its planes of grad_input added in point order, each
  // plane zeroed just before the first row that may touch it (where the plan has the rows'
  // planes; else all at the start); and (if need_grid) the grid gradient of the rows the
  // slab owns. Zeroed just ahead, a plane is in cache when the scatter reaches it; a slab
  // zeroed whole at the start (8 MB of a 256^3 volume, beyond a core's L2) is not.
  void slab(const Plan& p, int64_t s, bool need_grid, RowWork& work) const {
    const int64_t hi = p.slabs[s + 1];
    int64_t zeroed = p.row_last.empty() ? hi : p.slabs[s];  // [slabs[s], zeroed) zeroed
    zero_planes<T>(a.grad_input, p.slabs[s], zeroed);
    for (int64_t i = 0; i < g.rows; ++i) {  // every point, in increasing order
      const RowShare share = p.share(i, s, g.rows);
      // (passed over before Row's divisions: a slab passes over most rows)
      if (!share.touches && !(need_grid && share.owner)) continue;
      const Row row(i, g);
      if (!share.touches) {  // no plane of any slab, and the slab owns the row: gradient 0
        for (int64_t w = 0; w < g.Wo; w += L)
          sink.template zero<L>(row, w, std::min<int64_t>(L, g.Wo - w));
        continue;
      }
      const int64_t reach = p.row_last.empty() ? hi : std::min(hi, p.row_last[i] + 1);
      if (reach > zeroed) {
        zero_planes<T>(a.grad_input, zeroed, reach);
        zeroed = reach;
      }
      source.fill(row, g, work.coords);
      prefetch_row(i + 1);  // most often this slab's next row
      if (need_grid && share.owner) sweep(work.both, work.coords, row, share.planes);
      else sweep(work.scatter, work.coords, row, share.planes);
    }
    zero_planes<T>(a.grad_input, zeroed, hi);
  }

  // The grid gradient of rows [begin, end).
  void gradient_rows(int64_t begin, int64_t end, RowWork& work) const {
    for (int64_t i = begin; i < end; ++i) {
      const Row row(i, g);
      source.fill(row, g, work.coords);
      prefetch_row(i + 1);
      sweep(work.gradient, work.coords, row, {});
    }
  }

  // Tasks [0, slabs) run the slabs (slab s alone writes grad_input's planes [slabs[s],
  // slabs[s+1])), the tasks after them the grid gradient of rows [grad_rows[c],
  // grad_rows[c+1]), if those bounds exist; the two never write the same memory. Threads
  // take the tasks in order as they come free.
  void run(const Plan& p) const {
    const int64_t slabs = p.n_slabs();
    const int64_t chunks = p.grad_rows.empty() ? 0 : int64_t(p.grad_rows.size()) - 1;
    const int64_t tasks = slabs + chunks;
    const bool slabs_do_grid = sink.wanted() && chunks == 0;
    auto task = [&](int64_t t, RowWork& work) {
      if (t < slabs) slab(p, t, slabs_do_grid, work);
      else gradient_rows(p.grad_rows[t - slabs], p.grad_rows[t - slabs + 1], work);
    };
    const int threads = std::max<int>(1, std::min<int64_t>(a.threads, tasks));
    if (threads == 1) {  // no OpenMP region: its set-up weighs on a small call
      RowWork work(g.Wo, g.C);
      for (int64_t t = 0; t < tasks; ++t) task(t, work);
      stream_fence();  // the sink's streamed stores, if any, before the results are read
      return;
    }
    TeamCpus team(threads);
#pragma omp parallel num_threads(threads)
    {
      team.settle(omp_get_thread_num());
      RowWork work(g.Wo, g.C);
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < tasks; ++t) task(t, work);
      stream_fence();
    }
  }
};

// The plan of a call, for its padding.
template <class T, int MODE, class Source>
Plan plan_of(const GridSampleArgs& a, const Geometry& g, const Source& source, bool want_grid) {
  static constexpr Plan (*plans[3])(const GridSampleArgs&, const Geometry&, const Source&,
                                    bool) = {make_plan<T, MODE, ZEROS, Source>,
                                             make_plan<T, MODE, BORDER, Source>,
                                             make_plan<T, MODE, REFLECTION, Source>};
  return plans[a.padding](a, g, source, want_grid);
}

// The backward of a call whose points come from `source`, their grid gradient going to
// `sink`.
template <class S, class G, int MODE, class Source, class Sink>
void run_backward(const GridSampleArgs& a, const Source& source, const Sink& sink) {
  using T = typename compute_of<S, G>::type;
  const Backward<S, G, MODE, Source, Sink> kernel(a, source, sink);
  kernel.run(plan_of<T, MODE>(a, kernel.g, source, sink.wanted()));
}

// Calls f(S{}, G{}, mode tag) for a backward call's types and mode.
template <class F>
void by_backward_types(const GridSampleArgs& a, F&& f) {
  by_dtypes(
      a,
      [&](auto s, auto g) {
        using S = decltype(s);
        if constexpr (!is_label<S>::value) {
          by_mode(a, [&](auto mode) { f(s, g, mode); });
        } else {
          unsupported("input dtype for the backward");
        }
      },
      false);
}

// Whether the SIMD build's index lanes reach every element the backward reads or writes.
bool backward_fits_index_lanes(const GridSampleArgs& a) {
  return fits_index_lanes(a.input) && (a.grad_input.empty() || fits_index_lanes(a.grad_input));
}

}  // namespace
}  // namespace grid

void grid_sample_backward(const GridSampleArgs& a) {
  if (!grid::backward_fits_index_lanes(a)) return scalar::grid_sample_backward(a);
  grid::by_backward_types(a, [&](auto s, auto g, auto mode) {
    using G = decltype(g);
    grid::run_backward<decltype(s), G, decltype(mode)::value>(
        a, grid::GridRows<G>{a.grid},
        grid::GridGradientStore<G>{a.grad_grid,
                                   grid::GridGradientStore<G>::streams_past_caches(a.grad_grid)});
  });
}

std::vector<int64_t> grid_sample_backward_slabs(const GridSampleArgs& a) {
  std::vector<int64_t> slabs;
  grid::by_backward_types(a, [&](auto s, auto g, auto mode) {
    using G = decltype(g);
    using T = typename grid::compute_of<decltype(s), G>::type;
    const grid::GridRows<G> source{a.grid};
    slabs = grid::plan_of<T, decltype(mode)::value>(a, grid::Geometry(a), source,
                                                     !a.grad_grid.empty())
                .slabs;
  });
  return slabs;
}

void warp_backward(const WarpArgs& w) {
  const GridSampleArgs& a = w.sample;
  if (!grid::backward_fits_index_lanes(a)) return scalar::warp_backward(w);
  grid::by_backward_types(a, [&](auto s, auto g, auto mode) {
    using S = decltype(s);
    using G = decltype(g);
    using T = typename grid::compute_of<S, G>::type;
    const grid::Geometry geometry(a);
    const grid::WarpRows<G, T> source(w, geometry);
    using Sink = grid::WarpGradientStore<G, T>;
    const int64_t sums = w.grad_theta.empty() ? 0 : Sink::kRowSums * geometry.rows;
    std::vector<double> row_sums(size_t(sums), 0.0);
    const Sink sink{source, w.grad_displacement, w.grad_theta, row_sums.data()};
    grid::run_backward<S, G, decltype(mode)::value>(a, source, sink);
    sink.finish(geometry);
  });
}

}  // namespace VS_ISA
}  // namespace vs
