// Grid sampling's forward (compiled once per ISA): each output row's points, L at a time
// (the ISA's vector lanes), sampled channel by channel through their corner footprint
// (grid_corners.h) and PyTorch's formula (grid_formula.h), so the float32 and float64
// results are PyTorch's bits. The mode (1 or 8 corners) is a template parameter, chosen
// once per call; the padding is a per-block branch of the footprint. 16-bit volumes are
// read from their own memory into float32 (float64 beside a float64 grid), and results are
// rounded once when stored. The SIMD builds index with int32 lanes and hand volumes too
// large for them to the scalar build. Where the points sample comes from a coordinate
// source, a template parameter too (grid_common.h): the grid operand's, or a warp's
// (grid_warp.h).
//
// Determinism: each task writes whole output rows of its own; nothing is summed across
// tasks, so the bits do not depend on the thread count.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include <omp.h>

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

// One batch item's volume from this size on has the lines of its crossing rows fetched as
// a row is prepared (CornerReader::prefetch_crossings); a smaller one stays in the caches,
// where the fetches only cost (measured: a 4 MB volume on a smooth grid 7% slower, a
// 6.4 MB one under a rotation 10% faster).
constexpr int64_t kFetchCrossingsBytes = int64_t(5) << 20;

// The trilinear sampler of L points: their corner reader, corner weights and masks.
template <class V>
struct Trilinear {
  CornerReader<BILINEAR, V> reader;
  V weight[8];
  mask_of<V> inside[8];

  // Made in place (a row's samplers are reused row after row, and a copy would re-read
  // the reader's fields in wide loads that wait for their narrow stores to retire).
  void prepare(const RowCoords<scalar_of<V>>& r, int64_t w, const Geometry& g,
               const GridSampleArgs& a, const int64_t* stride) {
    const CornerFootprint<BILINEAR, V> f(r, w, g, a.padding, a.align_corners);
    new (&reader) CornerReader<BILINEAR, V>(f, g, stride);
    corner_weights(f.weight, weight);
    std::copy(f.corner, f.corner + 8, inside);
  }

  // The points' values in the channel at `base`.
  template <class S>
  V sample(const S* base) const {
    V v[8];
    reader.read(base, v);
    return sample_value(v, weight, inside);
  }
};

// The forward's operands and loops; the points' coordinates come from `source`.
template <class S, class G, int MODE, class Source>
struct Forward {
  using T = typename compute_of<S, G>::type;
  using V = typename native<T>::type;
  static constexpr int L = lanes<V>::count;

  const GridSampleArgs& a;
  Geometry g;
  const Source& source;
  const int64_t* is;  // the input's strides
  const int64_t* os;  // the output's
  int64_t blocks;     // of L points per row
  bool streamed;
  bool fetch_crossings;
  bool fetch_rows;  // each row's coordinates fetched while the row before is sampled

  Forward(const GridSampleArgs& args, const Source& points)
      : a(args), g(args), source(points), is(args.input.stride), os(args.output.stride),
        blocks((g.Wo + L - 1) / L) {
    // A large trilinear result of the compute type, contiguous along x, goes past the
    // caches in whole aligned vectors: no line is read before it is written, and the
    // volume's lines stay cached (measured 1.1x at C = 8 and 16, 33 and 66 MB; no change
    // at 4 and 8 MB).
    streamed = MODE == BILINEAR && std::is_same_v<S, T> && os[4] == 1 &&
               g.N * g.C * g.Do * g.Ho * g.Wo * int64_t(sizeof(S)) >= kStreamedResultBytes;
    fetch_crossings = g.C * g.D * g.H * g.W * int64_t(sizeof(S)) >= kFetchCrossingsBytes;
    fetch_rows = fetches_rows(g, sizeof(G));
  }

  // Nearest: each point's voxel copied exactly, every channel; 0 outside.
  VS_FLATTEN void nearest_row(const RowCoords<T>& r, const Row& row) const {
    const S* in_n = a.input.ptr<S>() + row.n * is[0];
    S* out_row = a.output.ptr<S>() + row.n * os[0] + row.d * os[2] + row.h * os[3];
    for (int64_t w = 0; w < g.Wo; w += L) {
      const CornerFootprint<MODE, V> f(r, w, g, a.padding, a.align_corners);
      alignas(64) index_lane_of<V> offset_lanes[L];
      store_(offset_lanes, f.offset(is));
      const unsigned on = bits_of(f.corner[0]);
      for (int64_t l = 0; l < std::min<int64_t>(L, g.Wo - w); ++l) {
        S* o = out_row + (w + l) * os[4];
        const S* src = in_n + offset_lanes[l];
        if (on >> l & 1) {
          for (int64_t c = 0; c < g.C; ++c) o[c * os[1]] = src[c * is[1]];
        } else {
          S zero;
          std::memset(&zero, 0, sizeof zero);
          for (int64_t c = 0; c < g.C; ++c) o[c * os[1]] = zero;
        }
      }
    }
  }

  // Trilinear: the row's samplers made once, then the row swept channel by channel, so
  // that the volume's reads stay on a few rows of one channel at a time, which the caches
  // keep.
  VS_FLATTEN void trilinear_row(const RowCoords<T>& r, const Row& row,
                                std::vector<Trilinear<V>>& samplers) const {
    const int64_t blocks = this->blocks, C = g.C, Wo = g.Wo;  // in registers
    const S* in_n = a.input.ptr<S>() + row.n * is[0];
    S* out_row = a.output.ptr<S>() + row.n * os[0] + row.d * os[2] + row.h * os[3];
    // Where the row crosses the volume's rows, the first channel's lines are fetched as
    // each block is prepared, a row's preparing ahead of their reads.
    for (int64_t b = 0; b < blocks; ++b) {
      samplers[b].prepare(r, b * L, g, a, is);
      if (fetch_crossings) samplers[b].reader.prefetch_crossings(in_n);
    }
    for (int64_t c = 0; c < C; ++c) {
      const S* in_c = in_n + c * is[1];
      S* out_c = out_row + c * os[1];
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t ahead = c * blocks + b + kPrefetchBlocks;  // in (channel, block) order
        if (ahead < C * blocks)
          samplers[ahead % blocks].reader.prefetch(in_n + ahead / blocks * is[1]);
        S* o = out_c + b * L * os[4];
        const V v = samplers[b].sample(in_c);
        if constexpr (std::is_same_v<S, T>) {
          const bool on_line = reinterpret_cast<uintptr_t>(o) % sizeof v == 0;
          if (streamed && b * L + L <= Wo && on_line) {
            stream_(o, v);
            continue;
          }
        }
        store_lanes(o, os[4], std::min<int64_t>(L, Wo - b * L), v);
      }
    }
  }

  // Bicubic and B-spline: each block's footprint made once, then swept channel by channel.
  VS_NOINLINE void cubic_row(const RowCoords<T>& r, const Row& row) const {
    const S* in_n = a.input.ptr<S>() + row.n * is[0];
    S* out_row = a.output.ptr<S>() + row.n * os[0] + row.d * os[2] + row.h * os[3];
    for (int64_t w = 0; w < g.Wo; w += L) {
      const TapFootprint<MODE, V> f(r, w, g, a.padding, a.align_corners);
      const int64_t valid = std::min<int64_t>(L, g.Wo - w);
      S* o = out_row + w * os[4];
      if (bits_of(f.any()) == 0) {  // every point reads nothing: 0
        for (int64_t c = 0; c < g.C; ++c) store_lanes(o + c * os[1], os[4], valid, V(T(0)));
        continue;
      }
      const TapReader<MODE, V> reader(f, is, g.W);
      for (int64_t c = 0; c < g.C; ++c)
        store_lanes(o + c * os[1], os[4], valid, tap_sample(f, reader, in_n + c * is[1]));
    }
  }

  // Output rows [begin, end), on the calling thread's buffers.
  void rows(int64_t begin, int64_t end, RowCoords<T>& r,
            std::vector<Trilinear<V>>& samplers) const {
    for (int64_t i = begin; i < end; ++i) {
      const Row row(i, g);
      source.fill(row, g, r);
      if (fetch_rows && i + 1 < end) source.prefetch(Row(i + 1, g), g);
      if constexpr (MODE == NEAREST) nearest_row(r, row);
      else if constexpr (taps_of<MODE> == kTaps) cubic_row(r, row);
      else trilinear_row(r, row, samplers);
    }
  }

  void run() const {
    const int64_t chunks = chunks_for(g.rows, a.threads);
    if (a.threads == 1) {  // no OpenMP region: its set-up weighs on a small call
      RowCoords<T> r(g.Wo);
      std::vector<Trilinear<V>> samplers(MODE == BILINEAR ? blocks : 0);
      rows(0, g.rows, r, samplers);
      if (streamed) stream_fence();
      return;
    }
    TeamCpus team(a.threads);
#pragma omp parallel num_threads(a.threads)
    {
      team.settle(omp_get_thread_num());
      RowCoords<T> r(g.Wo);
      std::vector<Trilinear<V>> samplers(MODE == BILINEAR ? blocks : 0);
#pragma omp for schedule(dynamic, 1)
      for (int64_t chunk = 0; chunk < chunks; ++chunk)  // a chunk writes only its own rows
        rows(chunk * g.rows / chunks, (chunk + 1) * g.rows / chunks, r, samplers);
      if (streamed) stream_fence();
    }
  }
};

// Calls f(S{}, G{}, mode tag) for a forward call's types and mode (integer label maps:
// nearest only).
template <class F>
void by_forward_types(const GridSampleArgs& a, F&& f) {
  by_dtypes(
      a,
      [&](auto s, auto g) {
        if constexpr (is_label<decltype(s)>::value) {
          if (a.mode != NEAREST) unsupported("mode for integer volumes (nearest only)");
          check_padding(a);
          f(s, g, std::integral_constant<int, NEAREST>{});
        } else {
          by_mode(a, [&](auto mode) { f(s, g, mode); });
        }
      },
      true);
}

}  // namespace
}  // namespace grid

void grid_sample_forward(const GridSampleArgs& a) {
  if (!grid::fits_index_lanes(a.input)) return scalar::grid_sample_forward(a);
  grid::by_forward_types(a, [&](auto s, auto g, auto mode) {
    using Source = grid::GridRows<decltype(g)>;
    const Source source{a.grid};
    grid::Forward<decltype(s), decltype(g), decltype(mode)::value, Source>(a, source).run();
  });
}

void warp_forward(const WarpArgs& w) {
  const GridSampleArgs& a = w.sample;
  if (!grid::fits_index_lanes(a.input)) return scalar::warp_forward(w);
  grid::by_forward_types(a, [&](auto s, auto g, auto mode) {
    using S = decltype(s);
    using G = decltype(g);
    using Source = grid::WarpRows<G, typename grid::compute_of<S, G>::type>;
    const Source source(w, grid::Geometry(a));
    grid::Forward<S, G, decltype(mode)::value, Source>(a, source).run();
  });
}

}  // namespace VS_ISA
}  // namespace vs
