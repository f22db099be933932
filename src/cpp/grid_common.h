// What every grid-sampling kernel shares, whatever its footprint (the 2x2x2 corners of
// bilinear and nearest today, 4x4x4 taps for bicubic and B-splines): the storage and
// compute types and the dispatch over them, the operands' geometry, where a row's sample
// coordinates come from, where a point's grid gradient goes, and lanes to and from
// strided memory.
//
// Kernels work an output row (fixed n, d, h) at a time: the row's coordinates become three
// arrays (x, y, z) in the compute type, read L points (the ISA's vector lanes) at a time.
// Compiled once per ISA, like the kernels that include it (namespace VS_ISA).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtypes.h"
#include "grid_sample.h"
#include "simd.h"

// Every call inlined into the function so marked, its callees' callees too. The kernels'
// per-row functions are: their code then no longer depends on GCC's inlining budget, which
// changes with whatever else a source file holds (the previous single-file kernels, merely
// split into a forward and a backward file, ran the forward 20% slower on AVX2 and 35%
// slower on AVX-512, the backward 10% faster).
#if defined(__GNUC__) || defined(__clang__)
#define VS_FLATTEN __attribute__((flatten))
#else
#define VS_FLATTEN
#endif

// Never inlined, not even into a VS_FLATTEN function: for the bicubic and B-spline blocks'
// large per-block steps (64 taps), which flattened into every caller made the backward's
// sources take many times longer to compile, for no speed (each call does 64 taps' work).
#if defined(__GNUC__) || defined(__clang__)
#define VS_NOINLINE __attribute__((noinline))
#else
#define VS_NOINLINE
#endif

namespace vs {
namespace VS_ISA {
namespace grid {

// ---------------------------------------------------------------------------------------
// Types: what is stored, what is computed in, and the dispatch over the call's dtypes
// ---------------------------------------------------------------------------------------

template <class S> struct is_label : std::false_type {};
template <> struct is_label<uint8_t> : std::true_type {};
template <> struct is_label<int16_t> : std::true_type {};
template <> struct is_label<int32_t> : std::true_type {};

// Loads of grids (float types only) and of label volumes' raw elements.
template <class S, class T> inline T load(const S* p) { return storage<S>::template load<T>(p); }

// The compute type of a (volume, grid) pair: the volume's float type, float32 for 16 bits,
// float64 beside a float64 grid; a label map computes its coordinates in the grid's type.
template <class S, class G> struct compute_of { using type = S; };
template <class G> struct compute_of<float16_bits, G> { using type = float; };
template <class G> struct compute_of<bfloat16_bits, G> { using type = float; };
template <> struct compute_of<float16_bits, double> { using type = double; };
template <> struct compute_of<bfloat16_bits, double> { using type = double; };
template <class G> struct compute_of<uint8_t, G> { using type = G; };
template <class G> struct compute_of<int16_t, G> { using type = G; };
template <class G> struct compute_of<int32_t, G> { using type = G; };

[[noreturn]] inline void unsupported(const char* what) {
  throw std::invalid_argument(std::string("grid_sample: unsupported ") + what);
}

// Calls f(S{}, G{}) for the call's (volume, grid) storage types; integer label maps only
// with `labels`.
template <class F>
void by_dtypes(const GridSampleArgs& a, F&& f, bool labels) {
  const DType grid = a.grid.dtype;
  auto with_grid = [&](auto volume_tag) {  // a 16-bit volume's or a label map's grid
    using S = decltype(volume_tag);
    switch (grid) {
      case DType::float32: return f(S{}, float{});
      case DType::float64: return f(S{}, double{});
      case DType::float16:
        if constexpr (std::is_same_v<S, float16_bits>) return f(S{}, float16_bits{});
        break;
      case DType::bfloat16:
        if constexpr (std::is_same_v<S, bfloat16_bits>) return f(S{}, bfloat16_bits{});
        break;
      default: break;
    }
    unsupported("grid dtype");
  };
  switch (a.input.dtype) {
    case DType::float32:
      if (grid != DType::float32) unsupported("grid dtype");
      return f(float{}, float{});
    case DType::float64:
      if (grid != DType::float64) unsupported("grid dtype");
      return f(double{}, double{});
    case DType::float16: return with_grid(float16_bits{});
    case DType::bfloat16: return with_grid(bfloat16_bits{});
    default: break;
  }
  if (labels) {
    switch (a.input.dtype) {
      case DType::uint8: return with_grid(uint8_t{});
      case DType::int16: return with_grid(int16_t{});
      case DType::int32: return with_grid(int32_t{});
      default: break;
    }
  }
  unsupported("input dtype");
}

// An integer of no padding mode is an error, never zeros padding.
inline void check_padding(const GridSampleArgs& a) {
  if (a.padding != ZEROS && a.padding != BORDER && a.padding != REFLECTION)
    unsupported("padding mode");
}

// Calls f(mode tag) for a call's interpolation mode: the one list of the modes (tensor.h's
// Mode) that the forward's and the backward's dispatchers take. An integer of no mode is
// an error, never some mode's kernel.
template <class F>
void by_mode(const GridSampleArgs& a, F&& f) {
  check_padding(a);
  switch (a.mode) {
    case BILINEAR: return f(std::integral_constant<int, BILINEAR>{});
    case NEAREST: return f(std::integral_constant<int, NEAREST>{});
    case BICUBIC: return f(std::integral_constant<int, BICUBIC>{});
    case BSPLINE: return f(std::integral_constant<int, BSPLINE>{});
    default: unsupported("interpolation mode");
  }
}

// Whether every element offset of the spatial axes of `s` fits the SIMD builds' int32
// index lanes (the scalar build's are int64: always).
inline bool fits_index_lanes(const Strided& s) {
#ifdef VS_ISA_SCALAR
  (void)s;
  return true;
#else
  int64_t extent = 0;
  for (int axis = 2; axis < 5; ++axis) extent += s.shape[axis] * std::abs(s.stride[axis]);
  return extent < (int64_t(1) << 31);
#endif
}

// ---------------------------------------------------------------------------------------
// Geometry and rows
// ---------------------------------------------------------------------------------------

// The operands' geometry, in elements.
struct Geometry {
  int64_t N, C, D, H, W, Do, Ho, Wo, rows;
  const int64_t* stride;  // the input's
  explicit Geometry(const GridSampleArgs& a)
      : N(a.input.shape[0]), C(a.input.shape[1]), D(a.input.shape[2]), H(a.input.shape[3]),
        W(a.input.shape[4]), Do(a.grid.shape[1]), Ho(a.grid.shape[2]), Wo(a.grid.shape[3]),
        rows(N * Do * Ho), stride(a.input.stride) {}
};

// An output row: its number (rows are numbered n, d, h-major) and its position.
struct Row {
  int64_t index = 0, n = 0, d = 0, h = 0;
  Row() = default;
  Row(int64_t row, const Geometry& g)
      : index(row), n(row / (g.Do * g.Ho)), d(row / g.Ho % g.Do), h(row % g.Ho) {}
};

constexpr int64_t kMaxLanes = 16;

// One output row's sample coordinates as three arrays (x, y, z) in the compute type,
// padded to whole vectors with NaN: lanes past the row's end touch nothing.
template <class T>
struct RowCoords {
  int64_t padded;
  std::vector<T> values;
  explicit RowCoords(int64_t Wo)
      : padded((Wo + kMaxLanes - 1) / kMaxLanes * kMaxLanes),
        values(3 * padded, std::numeric_limits<T>::quiet_NaN()) {}
  T* axis(int a) { return values.data() + a * padded; }
  const T* axis(int a) const { return values.data() + a * padded; }
};

// Grids from this size on have each row's coordinates fetched a row ahead; a smaller one
// stays in a core's L2 between the passes over it, where the fetches only cost.
constexpr int64_t kFetchRowsBytes = int64_t(1) << 20;
inline bool fetches_rows(const Geometry& g, int64_t coordinate_bytes) {
  return g.rows * g.Wo * 3 * coordinate_bytes >= kFetchRowsBytes;
}

// A hint to fetch the cache lines of `bytes` bytes from p: what a task reads of its next
// row, asked for a row ahead (the row's work, thousands of cycles, hides the wait, which
// the hardware's prefetchers, tracking the task's many other streams, leave at the row's
// start). Spans beyond kMostPrefetched are left to the hardware.
constexpr int64_t kMostPrefetched = 4096;
inline void prefetch_span(const void* p, int64_t bytes) {
  if (bytes > kMostPrefetched) return;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes);
  for (uintptr_t line = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63); line < end; line += 64)
    prefetch_(reinterpret_cast<const void*>(line));
}

// Where a row's sample coordinates come from: the grid operand (N, Do, Ho, Wo, 3) of
// storage type G. Every kernel, and the backward's plan, takes its source as a template
// parameter and gets its coordinates from fill(); a source that computes them instead (a
// warp's affine map plus displacement, grid_warp.h) offers the same members.
template <class G>
struct GridRows {
  const Strided& grid;

  template <class T>
  void fill(const Row& row, const Geometry& g, RowCoords<T>& r) const {
    const G* p = grid.ptr<G>() + row.n * grid.stride[0] + row.d * grid.stride[1] +
                 row.h * grid.stride[2];
    T* cx = r.axis(0);
    T* cy = r.axis(1);
    T* cz = r.axis(2);
    auto split = [&](int64_t point, int64_t axis) {  // constants let the compiler vectorise
      for (int64_t w = 0; w < g.Wo; ++w) {
        const G* q = p + w * point;
        cx[w] = load<G, T>(q);
        cy[w] = load<G, T>(q + axis);
        cz[w] = load<G, T>(q + 2 * axis);
      }
    };
    if (grid.stride[3] == 3 && grid.stride[4] == 1) split(3, 1);  // a contiguous grid
    else split(grid.stride[3], grid.stride[4]);
  }

  // A hint to fetch the row's coordinates ahead of fill().
  void prefetch(const Row& row, const Geometry& g) const {
    if (grid.stride[3] != 3 || grid.stride[4] != 1) return;  // strided: left to the hardware
    prefetch_span(grid.ptr<G>() + row.n * grid.stride[0] + row.d * grid.stride[1] +
                      row.h * grid.stride[2],
                  3 * g.Wo * int64_t(sizeof(G)));
  }
};

// A grad_grid of this size and more is streamed past the caches. A smaller one fits a
// last-level cache beside its operands, where the next call (the consumer of the
// gradient, or the same backward again) finds its lines: streamed, a 12 MB one at
// 96x112x96 ran the backward 10% slower back to back.
constexpr int64_t kStreamedGradientBytes = int64_t(32) << 20;

// Where a point's grid gradient goes: the grad_grid operand, shaped like the grid, of
// storage type G (rounded once). A warp reduces it into its theta and displacement
// gradients instead, behind the same members (grid_warp.h). The backward takes its sink as
// a template parameter and hands it every block of every row: store() the gradients of a
// block whose points touch the volume, zero() a block whose points do not (their gradient
// is 0); one task hands over a row's blocks, in increasing w, so a sink may sum along the
// row in that order.
template <class G>
struct GridGradientStore {
  const Strided& grad_grid;
  bool streamed = false;  // whole blocks go past the caches (streams_past_caches)

  // Whether a grad_grid's whole aligned blocks are written past the caches: one of
  // kStreamedGradientBytes and more whose points are adjacent (the backward's largest
  // result, written once: reading its lines for ownership would cost as much memory
  // traffic again, and evict the volume's rows that the scatter reuses).
  static bool streams_past_caches(const Strided& grad_grid) {
    const int64_t* s = grad_grid.stride;
    const int64_t* n = grad_grid.shape;
    return !grad_grid.empty() && s[4] == 1 && s[3] == 3 &&
           n[0] * n[1] * n[2] * n[3] * 3 * int64_t(sizeof(G)) >= kStreamedGradientBytes;
  }

  bool wanted() const { return !grad_grid.empty(); }

  // Points [w, w + valid) of `row` (a block of L): their gradients d/dx, d/dy, d/dz, in
  // the compute type T.
  template <int L, class T>
  void store(const Row& row, int64_t w, int64_t valid, const T* gx, const T* gy,
             const T* gz) const {
    const int64_t* s = grad_grid.stride;
    G* p = grad_grid.ptr<G>() + row.n * s[0] + row.d * s[1] + row.h * s[2] + w * s[3];
    auto interleave = [&](int64_t point, int64_t axis, int64_t count) {
      for (int64_t l = 0; l < count; ++l) {
        storage<G>::template store<T>(p + l * point, gx[l]);
        storage<G>::template store<T>(p + l * point + axis, gy[l]);
        storage<G>::template store<T>(p + l * point + 2 * axis, gz[l]);
      }
    };
    using V = typename native<T>::type;
    if constexpr (std::is_same_v<G, T> && lanes<V>::count == L) {
      if (streamed && valid == L && reinterpret_cast<uintptr_t>(p) % sizeof(V) == 0) {
        alignas(64) T points[3 * L];  // the block's 3 L values, interleaved
        for (int64_t l = 0; l < L; ++l) {
          points[3 * l] = gx[l];
          points[3 * l + 1] = gy[l];
          points[3 * l + 2] = gz[l];
        }
        for (int k = 0; k < 3; ++k) stream_(p + k * L, load_<V>(points + k * L));
        return;
      }
    }
    if (s[3] == 3 && s[4] == 1 && valid == L) interleave(3, 1, L);  // constants: vectorised
    else interleave(s[3], s[4], valid);
  }

  // Points [w, w + valid) of `row`, none of which touches the volume: gradient 0.
  template <int L>
  void zero(const Row& row, int64_t w, int64_t valid) const {
    alignas(64) static constexpr float kZeros[L] = {};
    store<L>(row, w, valid, kZeros, kZeros, kZeros);
  }
};

// Zero planes [lo, hi) of a volume operand of element type T (plane n * D + z: every
// channel's (H, W) slice at depth z of batch n): a backward task's share of grad_input,
// zeroed by the task that then adds into it, just ahead of its scatter, so that the zeroing
// is shared out as the scatter is and each plane is in cache when the scatter reaches it.
template <class T>
void zero_planes(const Strided& a, int64_t lo, int64_t hi) {
  const int64_t C = a.shape[1], D = a.shape[2], H = a.shape[3], W = a.shape[4];
  const int64_t* s = a.stride;
  // Whether a plane's C x H x W elements are one block (NCDHW with C = 1, NDHWC): its
  // strides, smallest first, tile it without gaps.
  std::pair<int64_t, int64_t> axes[3] = {{s[1], C}, {s[3], H}, {s[4], W}};
  std::sort(axes, axes + 3);
  int64_t tiled = 1;
  for (const auto& [stride, extent] : axes)
    if (extent > 1) tiled = stride == tiled ? tiled * extent : -1;
  for (int64_t q = lo; q < hi; ++q) {
    T* plane = a.ptr<T>() + q / D * s[0] + q % D * s[2];
    if (tiled == C * H * W) {
      std::fill_n(plane, C * H * W, T(0));
      continue;
    }
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h) {
        T* row = plane + c * s[1] + h * s[3];
        for (int64_t w = 0; w < W; ++w) row[w * s[4]] = T(0);
      }
  }
}

// How many row chunks a parallel loop over the rows takes (a few per thread, for balance).
inline int64_t chunks_for(int64_t rows, int threads) {
  return std::max<int64_t>(1, std::min<int64_t>(rows, 4 * int64_t(threads)));
}

// ---------------------------------------------------------------------------------------
// Lanes to and from strided memory
// ---------------------------------------------------------------------------------------

// Lanes [0, valid) of a vector read from p, p + stride, ... (0 beyond), converted from S.
template <class V, class S>
inline V load_lanes(const S* p, int64_t stride, int64_t valid) {
  using T = scalar_of<V>;
  constexpr int L = lanes<V>::count;
  if constexpr (std::is_same_v<S, T>)
    if (stride == 1 && valid == L) return load_<V>(p);
  alignas(64) T v[L] = {};
  for (int64_t l = 0; l < valid; ++l) v[l] = load<S, T>(p + l * stride);
  return load_<V>(v);
}

// Lanes [0, valid) of x stored to p, p + stride, ... (rounded once to S).
template <class S, class V>
inline void store_lanes(S* p, int64_t stride, int64_t valid, V x) {
  using T = scalar_of<V>;
  constexpr int L = lanes<V>::count;
  if constexpr (std::is_same_v<S, T>) {
    if (stride == 1 && valid == L) {
      store_(p, x);
      return;
    }
  }
  alignas(64) T v[L];
  store_(v, x);
  for (int64_t l = 0; l < valid; ++l) storage<S>::template store<T>(p + l * stride, v[l]);
}

}  // namespace grid
}  // namespace VS_ISA
}  // namespace vs
