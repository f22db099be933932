// The 2x2x2 footprint of bilinear (trilinear) and nearest sampling, L points at a time,
// and the reader of its corner values; the forward and the backward both build on it.
//
// The footprint lives in registers: voxel coordinates through the shared maths of
// coords.h, each axis' lowest tap and two weights, the derivative of each voxel
// coordinate and the mask of each corner lying in the volume. The volume is read with
// plain loads at offsets clamped into it (faster than hardware gathers on the CPUs we
// measured; a corner outside reads some voxel, masked off), each x pair as one 64-bit load
// where the pair is adjacent. A lane computes what the scalar code does, so every ISA
// gives the scalar build's bits. (The 4x4x4 footprint of bicubic and B-spline sampling
// is grid_taps.h's.)
//
// Windows, as grid_taps.h reads the cubic taps, were measured for the corners too: each
// corner row as at most two windows of 2L voxels with the lanes picking their pairs out
// (82% of a smooth grid's blocks). No channel got faster, since these reads wait on the
// caches rather than on the load ports, and planning the windows cost 35-50% more per
// block at C = 1 (AMD EPYC Zen 4).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "coords.h"
#include "grid_common.h"

namespace vs {
namespace VS_ISA {
namespace grid {

// Corner k of the cube: x bit k & 1, y bit k >> 1 & 1, z bit k >> 2, which is PyTorch's
// order tnw, tne, tsw, tse, bnw, bne, bsw, bse (x fastest).
constexpr int x_bit(int k) { return k & 1; }
constexpr int y_bit(int k) { return k >> 1 & 1; }
constexpr int z_bit(int k) { return k >> 2; }

// The footprint of L consecutive points of a row (lanes = points): per axis the lowest tap
// (a whole number; 0 where no tap lies inside) and the two tap weights, the derivative of
// each voxel coordinate, and the mask of each corner lying in the volume (nearest: corner
// 0 alone). A point outside, or with a coordinate that is not finite, has no corner on.
// Range checks run in floating point, so NaN and huge coordinates never reach an integer
// conversion.
template <int MODE, class V>
struct CornerFootprint {
  using T = scalar_of<V>;
  using M = mask_of<V>;
  static constexpr int kCorners = MODE == NEAREST ? 1 : 8;
  V low[3], weight[6], slope[3];  // weight: x0 x1 y0 y1 z0 z1 (axis a, tap t: 2 * a + t)
  M corner[8];

  CornerFootprint() = default;
  CornerFootprint(const RowCoords<T>& r, int64_t w, const Geometry& g, int padding,
                  bool align_corners) {
    const int64_t sizes[3] = {g.W, g.H, g.D};
    const V zero(T(0)), one(T(1));
    M tap_in[3][2];  // per axis: low tap, high tap inside
    for (int axis = 0; axis < 3; ++axis) {
      const V fsize{T(sizes[axis])};
      const V i = source_index(load_<V>(r.axis(axis) + w), sizes[axis], padding, align_corners,
                               slope[axis]);
      if (MODE == NEAREST) {
        const V f = rint_(i);  // half to even, as std::nearbyint
        tap_in[axis][0] = (f >= zero) & (f < fsize);
        low[axis] = select(tap_in[axis][0], f, zero);
        tap_in[axis][1] = tap_in[axis][0];  // unused: one tap
        weight[2 * axis] = one;
        weight[2 * axis + 1] = zero;
      } else {
        const V f = floor_(i);
        tap_in[axis][0] = (f >= zero) & (f < fsize);
        tap_in[axis][1] = (f >= -one) & (f < fsize - one);
        low[axis] = select(tap_in[axis][0] | tap_in[axis][1], f, zero);
        weight[2 * axis] = (f + one) - i;
        weight[2 * axis + 1] = i - f;
      }
    }
    if (padding != ZEROS) {  // clipping, or reflecting on 1 voxel, makes infinities finite
      const M finite = isfinite_(load_<V>(r.axis(0) + w)) & isfinite_(load_<V>(r.axis(1) + w)) &
                       isfinite_(load_<V>(r.axis(2) + w));
      for (int axis = 0; axis < 3; ++axis)
        for (int t = 0; t < 2; ++t) tap_in[axis][t] = tap_in[axis][t] & finite;
    }
    for (int k = 0; k < kCorners; ++k)
      corner[k] = tap_in[0][x_bit(k)] & tap_in[1][y_bit(k)] & tap_in[2][z_bit(k)];
  }

  // Element offset of the lowest corner in an operand of these (z, y, x) strides.
  index_of<V> offset(const int64_t* s) const {
    using I = index_of<V>;
    return to_index(low[0]) * I(s[4]) + to_index(low[1]) * I(s[3]) + to_index(low[2]) * I(s[2]);
  }

  // Whether any corner is on, per lane.
  M any() const {
    M m = corner[0];
    for (int k = 1; k < kCorners; ++k) m = m | corner[k];
    return m;
  }
};

// Corner k's element offset from the lowest corner, in an operand of strides s.
inline void corner_offsets(const Strided& s, int64_t out[8]) {
  const int64_t sz = s.stride[2], sy = s.stride[3], sx = s.stride[4];
  const int64_t o[8] = {0, sx, sy, sy + sx, sz, sz + sx, sz + sy, sz + sy + sx};
  std::memcpy(out, o, sizeof o);
}

// How many blocks of L points ahead the channel sweeps prefetch (measured: 4 beats 2).
constexpr int64_t kPrefetchBlocks = 4;

// Reads the 8 corner values of a footprint's lanes, channel by channel. Each (y, z) corner
// row's two x neighbours of a lane are read with two plain loads at offsets clamped into
// the volume, so that every read is valid memory: a corner outside gets some voxel's value,
// which the caller masks off. At an x edge the corner inside is the clamped pair's other
// half.
template <int MODE, class V>
struct CornerReader {
  using T = scalar_of<V>;
  using I = index_of<V>;
  static constexpr int L = lanes<V>::count;
  alignas(64) index_lane_of<V> row[4][L];  // pair offsets in corner row j = y bit + 2 * z bit
  int64_t x_step;                          // to a pair's second voxel (0 if W == 1)
  mask_of<V> x_below, x_above;             // x0 = -1, x0 = W - 1: the pair lies beside it

  CornerReader() = default;
  CornerReader(const CornerFootprint<MODE, V>& f, const Geometry& g, const int64_t* s)
      : x_step(g.W > 1 ? s[4] : 0) {
    const V zero(T(0)), one(T(1));
    auto clamp = [&](V x, int64_t top) {
      const V high{T(top)};
      return select(x < zero, zero, select(high < x, high, x));
    };
    const V x = clamp(f.low[0], std::max<int64_t>(g.W - 2, 0));
    x_below = f.low[0] < x;
    x_above = x < f.low[0];
    const I xo = to_index(x) * I(s[4]);
    const I yo[2] = {to_index(clamp(f.low[1], g.H - 1)) * I(s[3]),
                     to_index(clamp(f.low[1] + one, g.H - 1)) * I(s[3])};
    const I zo[2] = {to_index(clamp(f.low[2], g.D - 1)) * I(s[2]),
                     to_index(clamp(f.low[2] + one, g.D - 1)) * I(s[2])};
    for (int j = 0; j < 4; ++j) store_(row[j], xo + yo[j & 1] + zo[j >> 1]);
  }

  // A row's pairs as 64-bit loads, where they are adjacent floats; false: read them apart.
  template <class S>
  bool pairs(const S* base, const index_lane_of<V>* at, V& p0, V& p1) const {
    if constexpr (std::is_same_v<S, T>) {
      if (x_step == 1) {
        load_pairs_(base, at, p0, p1);
        return true;
      }
    }
    return false;
  }

  // Fetch ahead the lines a read at `base` starts and ends each corner row on: along a
  // smooth grid a row's lanes lie on a line or two.
  template <class S>
  void prefetch(const S* base) const {
    for (int j = 0; j < 4; ++j) {
      prefetch_(base + row[j][0]);
      prefetch_(base + row[j][L - 1] + x_step);
    }
  }

  // Fetch ahead, for the corner rows whose lanes cross rows of the volume (a rotation),
  // every fourth lane's line: each crossing starts lines that the hardware does not fetch
  // ahead. (Issued as a row is prepared, this made a rotated warp of a volume past the
  // caches 1.3x faster at 1 thread, AMD EPYC Zen 4.)
  template <class S>
  void prefetch_crossings(const S* base) const {
    for (int j = 0; j < 4; ++j) {
      const int64_t span = int64_t(row[j][L - 1]) - int64_t(row[j][0]);
      if (span >= 0 && span <= 2 * L * x_step) continue;  // one row: prefetch()'s lines
      for (int l = 0; l < L; l += 4) prefetch_(base + row[j][l]);
      prefetch_(base + row[j][L - 1] + x_step);
    }
  }

  // Corner k's values in out[k] (converted from S); `base`: the channel's first voxel.
  template <class S>
  void read(const S* base, V out[8]) const {
    for (int j = 0; j < 4; ++j) {
      V p0, p1;
      if (!pairs(base, row[j], p0, p1)) {
        alignas(64) T first[L], second[L];
        for (int l = 0; l < L; ++l) {
          first[l] = load<S, T>(base + row[j][l]);
          second[l] = load<S, T>(base + row[j][l] + x_step);
        }
        p0 = load_<V>(first);
        p1 = load_<V>(second);
      }
      out[2 * j] = select(x_above, p1, p0);
      out[2 * j + 1] = select(x_below, p0, p1);
    }
  }
};

}  // namespace grid
}  // namespace VS_ISA
}  // namespace vs
