// Coordinate maths shared by every CPU kernel and every ISA path.
//
// Grid sampling maps a normalised coordinate c in [-1, 1] to a voxel coordinate along an
// axis of size S; align_corners decides what -1 and +1 mean:
//
//     align_corners = true                 align_corners = false
//     -1 = centre of voxel 0               -1 = outer edge of voxel 0
//     +1 = centre of voxel S-1             +1 = outer edge of voxel S-1
//
//       -1               +1                 -1                    +1
//        |                |                  |                     |
//       [ 0 ][ 1 ]...[S-1]                 [ 0 ][ 1 ] ... [ S-1 ]
//
// Each helper returns the coordinate and, through `slope`, its derivative with respect to
// its input; kernels that do not need the derivative let the compiler drop it. Helpers
// are templates over V, a scalar (float, double) or a SIMD vector of them (simd.h): the
// vector lanes compute operation for operation what the scalar code computes.
#pragma once

#include <cstdint>

#include "simd.h"
#include "tensor.h"

namespace vs {
namespace VS_ISA {

// Voxel coordinate of a normalised coordinate.
template <class V>
inline V unnormalize(V coord, int64_t size, bool align_corners, V& slope) {
  using T = scalar_of<V>;
  const V one(T(1)), two(T(2));
  if (align_corners) {
    const V extent = V(T(size - 1));
    slope = extent / two;
    return (coord + one) / two * extent;
  }
  const V fsize = V(T(size));
  slope = fsize / two;
  return ((coord + one) * fsize - one) / two;
}

// Clamp to [0, size-1]; the derivative is 0 on and beyond the ends.
template <class V>
inline V clip(V x, int64_t size, V& slope) {
  using T = scalar_of<V>;
  const V zero = V(T(0)), upper = V(T(size - 1));
  const auto low = x <= zero;
  const auto high = x >= upper;
  slope = select(low | high, zero, V(T(1)));
  return select(low, zero, select(high, upper, x));
}

// Fold x into [low, high] by reflection, the derivative's sign (+1, -1; 0 for an empty
// span) through `slope`. Bounds come doubled so that they are integers for both
// align_corners choices. The fold count's parity is taken in floating point, so huge
// coordinates never overflow an integer; fmod is exact, as PyTorch's.
template <class V>
inline V reflect(V x, int64_t twice_low, int64_t twice_high, V& slope) {
  using T = scalar_of<V>;
  const V zero(T(0)), one(T(1)), two(T(2));
  if (twice_low == twice_high) {
    slope = zero;
    return zero;
  }
  const V low(T(twice_low) / T(2));
  const V span(T(twice_high - twice_low) / T(2));
  x = x - low;
  const auto negative = x < zero;
  x = select(negative, zero - x, x);
  const V sign = select(negative, zero - one, one);
  const V extra = fmod_(x, span);
  const V flips = floor_(x / span);
  // An even fold count: flips is a whole number (x is finite), so halving, flooring and
  // doubling it is exact, and cheaper than fmod.
  const auto even = floor_(flips / two) * two == flips;
  slope = select(even, sign, zero - sign);
  return select(even, extra + low, span - extra + low);
}

// Voxel coordinate after unnormalising and padding, and its derivative. Callers drop
// non-finite coordinates themselves (they contribute nothing in any padding mode).
template <class V>
inline V source_index(V coord, int64_t size, int padding, bool align_corners, V& slope) {
  V x = unnormalize(coord, size, align_corners, slope);
  if (padding == BORDER) {
    V g;
    x = clip(x, size, g);
    slope = slope * g;
  } else if (padding == REFLECTION) {
    V g, g2;
    x = align_corners ? reflect(x, 0, 2 * (size - 1), g) : reflect(x, -1, 2 * size - 1, g);
    x = clip(x, size, g2);
    slope = slope * g * g2;
  }
  return x;
}

// ---------------------------------------------------------------------------------------
// Upsampling: one axis of size in_size resampled to out_size, computed in T, the compute
// type (float32 data gets float32 ratios, coordinates and weights, as in PyTorch's CPU
// kernel).
// ---------------------------------------------------------------------------------------

// Source step per output step. `scale` is the forward's scale factor for this axis; a
// value <= 0 means none was given and the ratio comes from the sizes. 1 / scale is divided
// in double and then rounded, like PyTorch's compute_scales_value.
template <class T>
inline T upsample_ratio(int64_t in_size, int64_t out_size, bool align_corners, double scale) {
  if (align_corners) return out_size > 1 ? T(in_size - 1) / T(out_size - 1) : T(0);
  if (scale > 0) return T(1.0 / scale);
  return T(in_size) / T(out_size);
}

// Source coordinate of output index o (never below 0). Fused, as PyTorch's x86 build
// evaluates ratio * (o + 0.5) - 0.5: one rounding, and PyTorch's bits.
template <class T>
inline T upsample_source(T ratio, int64_t o, bool align_corners) {
  if (align_corners) return ratio * T(o);
  const T half(0.5);
  const T src = std::fma(ratio, T(o) + half, -half);
  return src < T(0) ? T(0) : src;
}

// The two source indices of a source coordinate and their weights. i0 is compared with
// in_size - 1 while still a float, so a huge coordinate (a scale inconsistent with the
// sizes) clamps to the last index instead of overflowing int64.
template <class T>
struct UpsampleTaps {
  int64_t i0, i1;
  T l0, l1;
};

template <class T>
inline UpsampleTaps<T> upsample_taps(T src, int64_t in_size) {
  const int64_t last = in_size - 1;
  const T low = std::floor(src);
  const int64_t i0 = low >= T(last) ? last : static_cast<int64_t>(low);
  T l1 = src - T(i0);
  l1 = l1 < T(0) ? T(0) : (l1 > T(1) ? T(1) : l1);
  return {i0, i0 < last ? i0 + 1 : i0, T(1) - l1, l1};
}

}  // namespace VS_ISA
}  // namespace vs
