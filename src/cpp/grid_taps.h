// The 4x4x4 footprint of bicubic and cubic B-spline sampling, L points at a time, and the
// reader of its tap values; the forward and the backward both build on it (the 2x2x2
// footprint of bilinear and nearest sampling is grid_corners.h's).
//
// Along each axis a point at voxel coordinate x (unnormalised, not padded) reads the four
// whole-number taps floor(x) - 1 .. floor(x) + 2 with weights of t = x - floor(x); each tap
// goes through the padding on its own (zeros: a tap outside reads 0; border: clamped;
// reflection: folded, then clamped). The padding of a whole-number tap has no derivative,
// so the grid gradient comes from the weights' derivatives alone. Separable: a channel's
// value is the sum over z taps of w_z times the sum over y taps of w_y times the sum over
// x taps of w_x times the voxel, in that fixed order. A lane computes what the scalar code
// does, so every ISA gives the scalar build's bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "coords.h"
#include "grid_common.h"

namespace vs {
namespace VS_ISA {
namespace grid {

constexpr int kTaps = 4;  // per axis

// ---------------------------------------------------------------------------------------
// Per-axis weights of the taps floor(x) - 1 .. floor(x) + 2 at t = x - floor(x) in [0, 1),
// each with its derivative twin (d/dt, which is d/dx).
// ---------------------------------------------------------------------------------------

// The cubic convolution kernel (A = -0.75, as PyTorch's bicubic): |s| <= 1 and 1 < |s| < 2.
template <class V> inline V cubic_near(V s) {
  using T = scalar_of<V>;
  const V A(T(-0.75));
  return ((A + V(T(2))) * s - (A + V(T(3)))) * s * s + V(T(1));
}
template <class V> inline V cubic_near_slope(V s) {
  using T = scalar_of<V>;
  const V A(T(-0.75));
  return (V(T(3)) * (A + V(T(2))) * s - V(T(2)) * (A + V(T(3)))) * s;
}
template <class V> inline V cubic_far(V s) {
  using T = scalar_of<V>;
  const V A(T(-0.75));
  return ((A * s - V(T(5)) * A) * s + V(T(8)) * A) * s - V(T(4)) * A;
}
template <class V> inline V cubic_far_slope(V s) {
  using T = scalar_of<V>;
  const V A(T(-0.75));
  return (V(T(3)) * A * s - V(T(10)) * A) * s + V(T(8)) * A;
}

// Bicubic: the kernel at the taps' distances t + 1, t, 1 - t, 2 - t.
template <class V> inline void bicubic_weights(V t, V w[4]) {
  using T = scalar_of<V>;
  const V one(T(1)), two(T(2));
  w[0] = cubic_far(t + one);
  w[1] = cubic_near(t);
  w[2] = cubic_near(one - t);
  w[3] = cubic_far(two - t);
}
template <class V> inline void bicubic_slopes(V t, V d[4]) {
  using T = scalar_of<V>;
  const V zero(T(0)), one(T(1)), two(T(2));
  d[0] = cubic_far_slope(t + one);
  d[1] = cubic_near_slope(t);
  d[2] = zero - cubic_near_slope(one - t);
  d[3] = zero - cubic_far_slope(two - t);
}

// The uniform cubic B-spline: ((1-t)^3, 3t^3 - 6t^2 + 4, -3t^3 + 3t^2 + 3t + 1, t^3) / 6.
template <class V> inline void bspline_weights(V t, V w[4]) {
  using T = scalar_of<V>;
  const V one(T(1)), three(T(3)), six(T(6));
  const V s = one - t, t2 = t * t, t3 = t2 * t;
  w[0] = s * s * s / six;
  w[1] = ((three * t3 - V(T(6)) * t2) + V(T(4))) / six;
  w[2] = (((three * t2 - three * t3) + three * t) + one) / six;
  w[3] = t3 / six;
}
template <class V> inline void bspline_slopes(V t, V d[4]) {
  using T = scalar_of<V>;
  const V one(T(1)), two(T(2)), three(T(3)), zero(T(0));
  const V s = one - t, t2 = t * t;
  d[0] = zero - s * s / two;
  d[1] = (three * t2 - V(T(4)) * t) / two;
  d[2] = ((two * t - three * t2) + one) / two;
  d[3] = t2 / two;
}

// ---------------------------------------------------------------------------------------
// Each mode's mathematics, once: its taps per axis (as volsample._tables.MODES says; the
// kernels branch on that, never on a mode's name) and, for the modes of kTaps taps, their
// weights and slopes. A mode added to tensor.h's Mode and grid_common.h's by_mode needs its
// traits here; one of a new tap count needs its kernels' tap loops too.
// ---------------------------------------------------------------------------------------

template <int MODE> struct ModeTraits;
template <> struct ModeTraits<NEAREST> { static constexpr int taps = 1; };
template <> struct ModeTraits<BILINEAR> { static constexpr int taps = 2; };
template <> struct ModeTraits<BICUBIC> {
  static constexpr int taps = kTaps;
  template <class V> static void weights(V t, V w[kTaps], V slopes[kTaps]) {
    bicubic_weights(t, w);
    bicubic_slopes(t, slopes);
  }
};
template <> struct ModeTraits<BSPLINE> {
  static constexpr int taps = kTaps;
  template <class V> static void weights(V t, V w[kTaps], V slopes[kTaps]) {
    bspline_weights(t, w);
    bspline_slopes(t, slopes);
  }
};

template <int MODE> constexpr int taps_of = ModeTraits<MODE>::taps;

// The voxel a whole-number tap coordinate reads under border or reflection padding, and
// under zeros the voxel a tap inside reads (one outside is clamped: some voxel, which the
// caller masks off). Whole numbers stay whole, and in [0, size - 1].
template <class V>
inline V padded_tap(V x, int64_t size, int padding, bool align_corners) {
  V unused;
  if (padding == REFLECTION)
    x = align_corners ? reflect(x, 0, 2 * (size - 1), unused) : reflect(x, -1, 2 * size - 1, unused);
  return clip(x, size, unused);
}

// ---------------------------------------------------------------------------------------
// The footprint and its reader
// ---------------------------------------------------------------------------------------

// The footprint of L consecutive points of a row (lanes = points): per axis (x, y, z) the
// four taps' voxels (whole numbers in the volume), whether each reads it (zeros: the tap
// lies inside; every tap of a point whose voxel coordinates are not all finite is off),
// their weights and the weights' derivatives, and the derivative of each voxel coordinate
// with respect to the grid coordinate. Range checks and padding run in floating point, so
// NaN and huge coordinates never reach an integer conversion. (A point whose voxel
// coordinate overflows to infinity, |grid| > ~1e38 / size in float32, reads nothing.)
template <int MODE, class V>
struct TapFootprint {
  using T = scalar_of<V>;
  using M = mask_of<V>;
  V voxel[3][kTaps], weight[3][kTaps], weight_slope[3][kTaps], slope[3];
  M reads[3][kTaps];
  M finite;

  TapFootprint() = default;
  TapFootprint(const RowCoords<T>& r, int64_t w, const Geometry& g, int padding,
               bool align_corners) {
    const int64_t sizes[3] = {g.W, g.H, g.D};
    const V zero(T(0));
    V x[3];
    for (int axis = 0; axis < 3; ++axis)
      x[axis] = unnormalize(load_<V>(r.axis(axis) + w), sizes[axis], align_corners, slope[axis]);
    finite = isfinite_(x[0]) & isfinite_(x[1]) & isfinite_(x[2]);
    for (int axis = 0; axis < 3; ++axis) {
      const V i = select(finite, x[axis], zero);  // no NaN or infinity past this point
      const V f = floor_(i), t = i - f;
      ModeTraits<MODE>::weights(t, weight[axis], weight_slope[axis]);
      const V fsize{T(sizes[axis])};
      for (int k = 0; k < kTaps; ++k) {
        const V tap = f + V(T(k - 1));
        reads[axis][k] = padding == ZEROS ? finite & (tap >= zero) & (tap < fsize) : finite;
        voxel[axis][k] = padded_tap(tap, sizes[axis], padding, align_corners);
      }
    }
  }

  // Element offsets of the taps in an operand of strides s: row[4 z + y] of z tap z and
  // y tap y (its x tap 0), and column[k] of x tap k within a row.
  void offsets(const int64_t* s, index_lane_of<V> (*row)[lanes<V>::count],
               index_lane_of<V> (*column)[lanes<V>::count]) const {
    using I = index_of<V>;
    I yo[kTaps], zo[kTaps];
    for (int k = 0; k < kTaps; ++k) {
      store_(column[k], to_index(voxel[0][k]) * I(s[4]));
      yo[k] = to_index(voxel[1][k]) * I(s[3]);
      zo[k] = to_index(voxel[2][k]) * I(s[2]);
    }
    for (int z = 0; z < kTaps; ++z)
      for (int y = 0; y < kTaps; ++y) store_(row[kTaps * z + y], zo[z] + yo[y]);
  }

  // Whether any tap reads the volume, per lane.
  M any() const {
    M axes[3];
    for (int axis = 0; axis < 3; ++axis)
      axes[axis] = reads[axis][0] | reads[axis][1] | reads[axis][2] | reads[axis][3];
    return axes[0] & axes[1] & axes[2];
  }
};

// Reads a footprint's 64 tap values, channel by channel, as 16 rows (z tap, y tap) of 4 x
// taps; a tap that reads nothing gets 0 (never 0 * a value). A volume of the compute type
// is read a tap of every lane at a time (gather_: no per-tap branch, padding or not); a
// 16-bit one lane by lane, converted. Where every lane reads every tap, the lanes share
// their 16 rows (as the points of a smooth grid mostly do) and their x taps span at most
// 2L voxels of a volume contiguous along x, each row is one window of the ISA (simd.h).
// Only the loads differ: the values, and so the bits, are the same.
template <int MODE, class V>
struct TapReader {
  using T = scalar_of<V>;
  using M = mask_of<V>;
  static constexpr int L = lanes<V>::count;
  alignas(64) index_lane_of<V> row[kTaps * kTaps][L];  // element offset of row j = 4 z + y
  alignas(64) index_lane_of<V> column[kTaps][L];       // and of x tap k within a row
  M on[kTaps * kTaps][kTaps];
  bool windowed = false;  // rows read as windows of `count` voxels from x voxel `first`
  int64_t first = 0, count = 0;
  index_of<V> in_window[kTaps];  // x tap k's index in its row's window

  TapReader() = default;
  // `width`: the volume's size along x.
  TapReader(const TapFootprint<MODE, V>& f, const int64_t* s, int64_t width) {
    f.offsets(s, row, column);
    if constexpr (has_window<V>::value) {
      M all = f.finite;  // the lanes that read every tap
      for (int axis = 0; axis < 3; ++axis)
        for (int k = 0; k < kTaps; ++k) all = all & f.reads[axis][k];
      if (s[4] == 1 && bits_of(all) == (uint64_t(1) << L) - 1) window(f, width);
      if (windowed) return;  // every tap on: `on` unused
    }
    for (int z = 0; z < kTaps; ++z)
      for (int y = 0; y < kTaps; ++y)
        for (int x = 0; x < kTaps; ++x)
          on[kTaps * z + y][x] = f.reads[2][z] & f.reads[1][y] & f.reads[0][x];
  }

  // Whether the lanes share their rows and their x taps fit one window; if so, the window.
  void window(const TapFootprint<MODE, V>& f, int64_t width) {
    const unsigned every = unsigned((uint64_t(1) << L) - 1);
    for (int axis = 1; axis < 3; ++axis)
      for (int k = 0; k < kTaps; ++k) {
        alignas(64) T v[L];
        store_(v, f.voxel[axis][k]);
        if (bits_of(f.voxel[axis][k] == V(v[0])) != every) return;
      }
    V lows = f.voxel[0][0], highs = f.voxel[0][0];  // per lane, over the x taps
    for (int k = 1; k < kTaps; ++k) {
      lows = select(f.voxel[0][k] < lows, f.voxel[0][k], lows);
      highs = select(highs < f.voxel[0][k], f.voxel[0][k], highs);
    }
    alignas(64) T x[2][L];
    store_(x[0], lows);
    store_(x[1], highs);
    T low = x[0][0], high = x[1][0];
    for (int l = 1; l < L; ++l) {
      low = std::min(low, x[0][l]);
      high = std::max(high, x[1][l]);
    }
    if (high - low >= T(2 * L)) return;
    first = int64_t(low);
    count = std::min<int64_t>(2 * L, width - first);
    for (int k = 0; k < kTaps; ++k) in_window[k] = to_index(f.voxel[0][k] - V(low));
    windowed = true;
  }

  // Row j's four values (converted from S) in out; `base`: the channel's first voxel.
  template <class S>
  void read_row(const S* base, int j, V out[kTaps]) const {
    if constexpr (std::is_same_v<S, T> && has_window<V>::value) {
      if (windowed) {
        V lo, hi;
        load_window_(base + row[j][0] + first, count, lo, hi);
        for (int x = 0; x < kTaps; ++x) out[x] = pick_(lo, hi, in_window[x]);
        return;
      }
    }
    for (int x = 0; x < kTaps; ++x) {
      if constexpr (std::is_same_v<S, T>) {
        out[x] = gather_<V>(base, row[j], column[x], on[j][x]);
      } else {
        alignas(64) T v[L];
        for (int l = 0; l < L; ++l) v[l] = load<S, T>(base + row[j][l] + column[x][l]);
        out[x] = windowed ? load_<V>(v) : select(on[j][x], load_<V>(v), V(T(0)));
      }
    }
  }
};

// sum_k value[k] * weight[k], in tap order.
template <class V>
inline V tap_sum(const V value[kTaps], const V weight[kTaps]) {
  return ((value[0] * weight[0] + value[1] * weight[1]) + value[2] * weight[2]) +
         value[3] * weight[3];
}

// The points' values in the channel at `base`.
template <int MODE, class V, class S>
inline V tap_sample(const TapFootprint<MODE, V>& f, const TapReader<MODE, V>& reader,
                    const S* base) {
  V z_rows[kTaps];
  for (int z = 0; z < kTaps; ++z) {
    V y_rows[kTaps];
    for (int y = 0; y < kTaps; ++y) {
      V v[kTaps];
      reader.read_row(base, kTaps * z + y, v);
      y_rows[y] = tap_sum(v, f.weight[0]);
    }
    z_rows[z] = tap_sum(y_rows, f.weight[1]);
  }
  return tap_sum(z_rows, f.weight[2]);
}

// One channel's d(value)/d(voxel coordinate) along x, y and z, times grad_output, added to
// sum[axis].
template <int MODE, class V, class S>
inline void add_tap_coordinate_terms(const TapFootprint<MODE, V>& f,
                                     const TapReader<MODE, V>& reader, const S* base,
                                     V grad_output, V sum[3]) {
  V zx[kTaps], zy[kTaps], zz[kTaps];  // per z tap: d/dx, d/dy and the value of its plane
  for (int z = 0; z < kTaps; ++z) {
    V dx[kTaps], value[kTaps];
    for (int y = 0; y < kTaps; ++y) {
      V v[kTaps];
      reader.read_row(base, kTaps * z + y, v);
      dx[y] = tap_sum(v, f.weight_slope[0]);
      value[y] = tap_sum(v, f.weight[0]);
    }
    zx[z] = tap_sum(dx, f.weight[1]);
    zy[z] = tap_sum(value, f.weight_slope[1]);
    zz[z] = tap_sum(value, f.weight[1]);
  }
  sum[0] = sum[0] + tap_sum(zx, f.weight[2]) * grad_output;
  sum[1] = sum[1] + tap_sum(zy, f.weight[2]) * grad_output;
  sum[2] = sum[2] + tap_sum(zz, f.weight_slope[2]) * grad_output;
}

}  // namespace grid
}  // namespace VS_ISA
}  // namespace vs
