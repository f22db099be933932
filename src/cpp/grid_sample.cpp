// Grid-sampling kernels, forward and backward (compiled once per ISA).
//
// Every kernel works an output row (fixed n, d, h) at a time. The row's grid coordinates are
// split into x, y, z arrays; then L consecutive points (the ISA's vector lanes) at a time
// become a footprint in registers: voxel coordinates through the shared maths of coords.h,
// each axis' lowest tap and weights, the derivative of each voxel coordinate and the mask of
// each corner lying in the volume. The volume is read with plain loads at offsets clamped
// into it (faster than hardware gathers on the CPUs we measured; a corner outside reads
// some voxel, masked off), each x pair as one 64-bit load where the pair is adjacent.
// Corners come in PyTorch's order tnw, tne, tsw, tse, bnw, bne, bsw, bse (x fastest), each
// corner weight is (wx * wy) * wz, and each sum starts at 0 and adds v * w in corner order
// with no fused multiply-add: the float32 and float64 forward match PyTorch bit for bit, and
// every ISA computes the scalar path's bits (a lane computes what the scalar code does).
// The SIMD builds index with int32 lanes and hand volumes too large for them to the
// scalar build.
//
// The mode (1 or 8 corners) is a template parameter, chosen once per call; the padding is
// a per-block branch of the footprint. 16-bit volumes are read from their own memory into
// float32 (float64 beside a float64 grid), and results are rounded once when stored.
//
// Determinism (no atomics; the same bits for every thread count). The forward and the grid
// gradient write each output point from one task. The input gradient is a scatter, made
// race-free by giving each task a slab of input planes (n, z) that only it writes. Every
// task walks the points in increasing order (skipping rows whose plane range misses its
// slab) and adds the corners on its planes, so each input element receives its terms in
// increasing point order whatever the slabs are. A row's grid gradient is computed once,
// by one of the slabs it touches; when rows reach across the volume (a random grid), one
// slab does the whole scatter and the other tasks compute the grid gradient beside it.
// How the planes are split (whole batches when there are enough; otherwise balanced by
// the rows touching each plane) changes the speed, never the bits.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "coords.h"
#include "dtypes.h"
#include "grid_sample.h"

namespace vs {
namespace VS_ISA {
namespace {

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

constexpr int64_t kMaxLanes = 16;

// One output row's grid coordinates as three arrays (x, y, z) in the compute type, padded
// to whole vectors with NaN: lanes past the row's end touch nothing.
template <class T>
struct RowCoords {
  int64_t padded;
  std::vector<T> values;
  explicit RowCoords(int64_t Wo)
      : padded(padded_size(Wo)), values(3 * padded, std::numeric_limits<T>::quiet_NaN()) {}
  static int64_t padded_size(int64_t Wo) { return (Wo + kMaxLanes - 1) / kMaxLanes * kMaxLanes; }
  T* axis(int a) { return values.data() + a * padded; }
  const T* axis(int a) const { return values.data() + a * padded; }
};

// The operands' geometry, in elements.
struct Geometry {
  int64_t N, C, D, H, W, Do, Ho, Wo, rows;
  const int64_t* stride;  // the input's
  explicit Geometry(const GridSampleArgs& a)
      : N(a.input.shape[0]), C(a.input.shape[1]), D(a.input.shape[2]), H(a.input.shape[3]),
        W(a.input.shape[4]), Do(a.grid.shape[1]), Ho(a.grid.shape[2]), Wo(a.grid.shape[3]),
        rows(N * Do * Ho), stride(a.input.stride) {}
};

// The footprint of L consecutive points of a row (lanes = points), computed in registers:
// per axis the lowest tap (a whole number; 0 where no tap lies inside) and the two tap
// weights, the derivative of each voxel coordinate, and the mask of each corner k
// (x bit k & 1, y bit k >> 1 & 1, z bit k >> 2; nearest: corner 0 alone) lying in the
// volume. A point outside, or with a coordinate that is not finite, has no corner on.
// Range checks run in floating point, so NaN and huge coordinates never reach an integer
// conversion.
template <int MODE, class V>
struct Footprint {
  using T = scalar_of<V>;
  using M = mask_of<V>;
  static constexpr int kCorners = MODE == NEAREST ? 1 : 8;
  V low[3], weight[6], slope[3];  // weight: x0 x1 y0 y1 z0 z1
  M corner[8];

  Footprint() = default;
  Footprint(const RowCoords<T>& r, int64_t w, const Geometry& g, int padding, bool align_corners) {
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
      corner[k] = tap_in[0][k & 1] & tap_in[1][k >> 1 & 1] & tap_in[2][k >> 2];
  }

  // Element offset of the lowest corner in an operand of these (z, y, x) strides.
  index_of<V> offset(const int64_t* s) const {
    using I = index_of<V>;
    return to_index(low[0]) * I(s[4]) + to_index(low[1]) * I(s[3]) + to_index(low[2]) * I(s[2]);
  }

  // The 8 corner weights, each (wx * wy) * wz as PyTorch forms them.
  void corner_weights(V out[8]) const {
    const V xy[4] = {weight[0] * weight[2], weight[1] * weight[2], weight[0] * weight[3],
                     weight[1] * weight[3]};
    for (int k = 0; k < 8; ++k) out[k] = xy[k & 3] * weight[4 + (k >> 2)];
  }

  // Whether any corner is on, per lane.
  M any() const {
    M m = corner[0];
    for (int k = 1; k < kCorners; ++k) m = m | corner[k];
    return m;
  }
};

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

// (n, d, h) of output row `row`.
inline void split_row(const Geometry& g, int64_t row, int64_t& n, int64_t& d, int64_t& h) {
  n = row / (g.Do * g.Ho);
  d = row / g.Ho % g.Do;
  h = row % g.Ho;
}

// ---------------------------------------------------------------------------------------
// Coordinate sources: where each point samples, as normalised (x, y, z) in the compute
// type T. The kernels take one as a template parameter: a grid's (read from its memory)
// or a warp's (computed from theta, the point's index and its displacement; the grid is
// never stored). Each gives row(row, coords, n, d, h): a row's coordinates into
// RowCoords and its (n, d, h); and z(row): the row's z coordinates point by point, with
// the same bits (the backward's plan bounds the planes a row touches by them).
// ---------------------------------------------------------------------------------------

template <class G, class T>
struct GridPoints {
  using storage = G;
  using compute = T;
  const Strided& grid;
  const Geometry& g;

  const G* row_start(int64_t n, int64_t d, int64_t h) const {
    return grid.ptr<G>() + n * grid.stride[0] + d * grid.stride[1] + h * grid.stride[2];
  }

  void row(int64_t row, RowCoords<T>& r, int64_t& n, int64_t& d, int64_t& h) const {
    split_row(g, row, n, d, h);
    const G* p = row_start(n, d, h);
    const int64_t sw = grid.stride[3], sk = grid.stride[4];
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
    if (sw == 3 && sk == 1) split(3, 1);  // a contiguous grid
    else split(sw, sk);
  }

  struct Z {
    const G* p;
    int64_t step;
    T operator[](int64_t w) const { return load<G, T>(p + w * step); }
  };
  Z z(int64_t row) const {
    int64_t n, d, h;
    split_row(g, row, n, d, h);
    return {row_start(n, d, h) + 2 * grid.stride[4], grid.stride[3]};
  }
};

// A warp's: c_k = t_k0 * bx + ((t_k1 * by + t_k2 * bz) + t_k3), plus u_k * s_k where a
// displacement is given, in T (theta = t, the base grid b as affine_grid lays it out).
template <class G, class T>
struct WarpPoints {
  using storage = G;
  using compute = T;
  const Geometry& g;
  const Strided& displacement;  // absent: 0
  std::vector<T> theta;         // N x 3 x 4
  std::vector<T> bx, by, bz;    // base coordinates; bx padded with 0 to whole vectors
  T scale[3];

  // Normalised coordinate of index i of an axis of `size` points (_coords.base): float64
  // operations in that order, then rounded to T.
  static T base(int64_t i, int64_t size, bool align_corners) {
    if (size == 1) return T(0);
    if (align_corners) return T(2.0 * double(i) / double(size - 1) - 1.0);
    return T((2.0 * double(i) + 1.0) / double(size) - 1.0);
  }

  WarpPoints(const WarpArgs& w, const Geometry& geometry)
      : g(geometry), displacement(w.displacement), theta(size_t(12 * geometry.N)),
        bx(size_t(RowCoords<T>::padded_size(geometry.Wo)), T(0)), by(size_t(geometry.Ho)),
        bz(size_t(geometry.Do)) {
    const bool align = w.sample.align_corners;
    const int64_t* st = w.theta.stride;
    for (int64_t n = 0; n < g.N; ++n)
      for (int k = 0; k < 3; ++k)
        for (int j = 0; j < 4; ++j)
          theta[size_t(12 * n + 4 * k + j)] =
              load<G, T>(w.theta.ptr<G>() + n * st[0] + k * st[1] + j * st[2]);
    for (int64_t i = 0; i < g.Wo; ++i) bx[size_t(i)] = base(i, g.Wo, align);
    for (int64_t i = 0; i < g.Ho; ++i) by[size_t(i)] = base(i, g.Ho, align);
    for (int64_t i = 0; i < g.Do; ++i) bz[size_t(i)] = base(i, g.Do, align);
    for (int k = 0; k < 3; ++k) scale[k] = T(w.scale[k]);
  }

  // Axis k's slope along the row and its constant part on row (n, d, h).
  T slope(int64_t n, int k) const { return theta[size_t(12 * n + 4 * k)]; }
  T offset(int64_t n, int k, int64_t d, int64_t h) const {
    const T* t = theta.data() + 12 * n + 4 * k;
    return (t[1] * by[size_t(h)] + t[2] * bz[size_t(d)]) + t[3];
  }
  const G* displacement_row(int64_t n, int64_t d, int64_t h) const {
    const int64_t* s = displacement.stride;
    return displacement.ptr<G>() + n * s[0] + d * s[1] + h * s[2];
  }

  void row(int64_t row, RowCoords<T>& r, int64_t& n, int64_t& d, int64_t& h) const {
    split_row(g, row, n, d, h);
    for (int k = 0; k < 3; ++k) {
      const T a = slope(n, k), o = offset(n, k, d, h);
      T* c = r.axis(k);
      for (int64_t w = 0; w < g.Wo; ++w) c[w] = a * bx[size_t(w)] + o;
    }
    if (displacement.empty()) return;
    const G* p = displacement_row(n, d, h);
    T* cx = r.axis(0);
    T* cy = r.axis(1);
    T* cz = r.axis(2);
    const T sx = scale[0], sy = scale[1], sz = scale[2];
    auto add = [&](int64_t point, int64_t axis) {  // constants let the compiler vectorise
      for (int64_t w = 0; w < g.Wo; ++w) {
        const G* q = p + w * point;
        cx[w] = cx[w] + load<G, T>(q) * sx;
        cy[w] = cy[w] + load<G, T>(q + axis) * sy;
        cz[w] = cz[w] + load<G, T>(q + 2 * axis) * sz;
      }
    };
    if (displacement.stride[3] == 3 && displacement.stride[4] == 1) add(3, 1);
    else add(displacement.stride[3], displacement.stride[4]);
  }

  struct Z {
    T a, o, s;
    const T* bx;
    const G* u;  // null: no displacement
    int64_t step;
    T operator[](int64_t w) const {
      const T c = a * bx[w] + o;
      return u ? c + load<G, T>(u + w * step) * s : c;
    }
  };
  Z z(int64_t row) const {
    int64_t n, d, h;
    split_row(g, row, n, d, h);
    const G* u = displacement.empty() ? nullptr
                                      : displacement_row(n, d, h) + 2 * displacement.stride[4];
    return {slope(n, 2), offset(n, 2, d, h), scale[2], bx.data(), u, displacement.stride[3]};
  }
};

// Corner k's element offset from the lowest corner.
inline void corner_offsets(const Strided& s, int64_t out[8]) {
  const int64_t sz = s.stride[2], sy = s.stride[3], sx = s.stride[4];
  const int64_t o[8] = {0, sx, sy, sy + sx, sz, sz + sx, sz + sy, sz + sy + sx};
  std::memcpy(out, o, sizeof o);
}

inline int64_t chunks_for(int64_t rows, int threads) {
  return std::max<int64_t>(1, std::min<int64_t>(rows, 4 * int64_t(threads)));
}

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

// Reads the 8 corner values of a footprint's lanes, channel by channel. Each (y, z) corner
// row's two x neighbours of a lane are read with two plain loads (on this project's
// machines faster than hardware gathers) at offsets clamped into the volume, so that every
// read is valid memory: a corner outside gets some voxel's value, which the caller masks
// off. At an x edge the corner inside is the clamped pair's other half.
template <int MODE, class V>
struct CornerReader {
  using T = scalar_of<V>;
  using I = index_of<V>;
  static constexpr int L = lanes<V>::count;
  alignas(64) index_lane_of<V> row[4][L];  // pair offsets in corner row j = y bit + 2 * z bit
  int64_t x_step;                          // to a pair's second voxel (0 if W == 1)
  mask_of<V> x_below, x_above;             // x0 = -1, x0 = W - 1: the pair lies beside it

  CornerReader() = default;
  CornerReader(const Footprint<MODE, V>& f, const Geometry& g, const int64_t* s)
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

// ---------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------

// The forward's trilinear sampler of L points: their corner reader, weights and masks.
template <class V>
struct Trilinear {
  CornerReader<BILINEAR, V> reader;
  V weight[8];
  mask_of<V> corner[8];

  Trilinear() = default;
  Trilinear(const RowCoords<scalar_of<V>>& r, int64_t w, const Geometry& g,
            const GridSampleArgs& a, const int64_t* stride) {
    const Footprint<BILINEAR, V> f(r, w, g, a.padding, a.align_corners);
    reader = CornerReader<BILINEAR, V>(f, g, stride);
    f.corner_weights(weight);
    std::copy(f.corner, f.corner + 8, corner);
  }

  // The points' values in the channel at `base`: sums start at 0 and add v * w in corner
  // order with no fused multiply-add, as PyTorch's.
  template <class S>
  V sample(const S* base) const {
    using T = scalar_of<V>;
    V v[8];
    reader.read(base, v);
    V acc(T(0));
    for (int k = 0; k < 8; ++k) acc = select(corner[k], acc + v[k] * weight[k], acc);
    return acc;
  }
};

// How many blocks ahead the channel sweeps prefetch (measured: 4 beats 2).
constexpr int64_t kPrefetchBlocks = 4;

template <class S, int MODE, class Points>
void forward_kernel(const GridSampleArgs& a, const Points& points) {
  using T = typename Points::compute;
  using V = typename native<T>::type;
  constexpr int L = lanes<V>::count;
  const Geometry g(a);
  const S* inp = a.input.ptr<S>();
  S* out = a.output.ptr<S>();
  const int64_t* is = a.input.stride;
  const int64_t* os = a.output.stride;
  const int64_t chunks = chunks_for(g.rows, a.threads);
  const int64_t blocks = (g.Wo + L - 1) / L;
  // A large trilinear result of the compute type, contiguous along x, goes past the caches
  // in whole aligned vectors: no line is read before it is written, and the volume's lines
  // stay cached (measured 1.1x at C = 8 and 16, 33 and 66 MB; no change at 4 and 8 MB).
  const bool streamed = MODE != NEAREST && std::is_same_v<S, T> && os[4] == 1 &&
                        g.N * g.C * g.Do * g.Ho * g.Wo * int64_t(sizeof(S)) >= kStreamedResultBytes;
#pragma omp parallel num_threads(a.threads)
  {
    RowCoords<T> r(g.Wo);
    std::vector<Trilinear<V>> row_samplers(MODE == NEAREST ? 0 : blocks);
#pragma omp for schedule(dynamic, 1)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {  // a chunk writes only its own rows
      for (int64_t row = chunk * g.rows / chunks; row < (chunk + 1) * g.rows / chunks; ++row) {
        int64_t n, d, h;
        points.row(row, r, n, d, h);
        const S* in_n = inp + n * is[0];
        S* out_row = out + n * os[0] + d * os[2] + h * os[3];
        if constexpr (MODE == NEAREST) {  // the single voxel, copied exactly; 0 outside
          for (int64_t w = 0; w < g.Wo; w += L) {
            const Footprint<MODE, V> f(r, w, g, a.padding, a.align_corners);
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
        } else {
          for (int64_t b = 0; b < blocks; ++b) row_samplers[b] = Trilinear<V>(r, b * L, g, a, is);
          // Channel by channel over the whole row: the volume's reads stay on a few rows
          // of one channel at a time, which the caches keep.
          for (int64_t c = 0; c < g.C; ++c) {
            const S* in_c = in_n + c * is[1];
            S* out_c = out_row + c * os[1];
            for (int64_t b = 0; b < blocks; ++b) {
              const int64_t ahead = c * blocks + b + kPrefetchBlocks;  // in (channel, block) order
              if (ahead < g.C * blocks)
                row_samplers[ahead % blocks].reader.prefetch(in_n + ahead / blocks * is[1]);
              S* o = out_c + b * L * os[4];
              const V v = row_samplers[b].sample(in_c);
              if constexpr (std::is_same_v<S, T>) {
                const bool on_line = reinterpret_cast<uintptr_t>(o) % sizeof v == 0;
                if (streamed && b * L + L <= g.Wo && on_line) {
                  stream_(o, v);
                  continue;
                }
              }
              store_lanes(o, os[4], std::min<int64_t>(L, g.Wo - b * L), v);
            }
          }
        }
      }
    }
    if (streamed) stream_fence();
  }
}

// ---------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------

// The planes [first, last] of one batch that points with z coordinates in [low, high] can
// touch, for a padding under which the voxel coordinate grows with the normalised one
// (zeros, border; reflection for a single point); first > last if none. Under zeros and
// border padding coordinates are clipped to [-3, 3] first: points beyond touch the same
// planes (none, or an end one) and infinities never reach the arithmetic. Reflection folds
// any finite point back in, so there only a non-finite point touches nothing. NaN makes an
// empty span.
template <int MODE, int PADDING, class T>
void plane_span(T low, T high, int64_t D, bool align_corners, int64_t& first, int64_t& last) {
  first = 1;
  last = 0;
  if (!(low <= high) || (PADDING == REFLECTION && !std::isfinite(low))) return;
  if (PADDING != REFLECTION) {
    low = std::min(std::max(low, T(-3)), T(3));
    high = std::min(std::max(high, T(-3)), T(3));
  }
  T slope;
  const T i_low = source_index(low, D, PADDING, align_corners, slope);
  const T i_high = source_index(high, D, PADDING, align_corners, slope);
  const T f = MODE == NEAREST ? std::nearbyint(i_low) : std::floor(i_low);
  const T l = MODE == NEAREST ? std::nearbyint(i_high) : std::floor(i_high) + T(1);
  first = int64_t(std::max(f, T(0)));
  last = int64_t(std::min(l, T(D - 1)));
}

// Each row's lowest and highest input plane (n*D + z) judged from z alone (a superset of
// the planes its points touch; first > last if none).
template <int MODE, int PADDING, class Points>
void row_planes(const GridSampleArgs& a, const Geometry& g, const Points& points,
                int64_t* first, int64_t* last) {
  using T = typename Points::compute;
#pragma omp parallel for num_threads(a.threads) schedule(static)
  for (int64_t row = 0; row < g.rows; ++row) {  // each row writes its own range
    const int64_t n = row / (g.Do * g.Ho);
    const auto z = points.z(row);
    int64_t lowest = g.D, highest = -1;
    if (PADDING == REFLECTION) {  // folding is not monotonic: bound every point
      for (int64_t w = 0; w < g.Wo; ++w) {
        const T cz = z[w];
        int64_t f, l;
        plane_span<MODE, PADDING>(cz, cz, g.D, a.align_corners, f, l);
        if (f <= l) {
          lowest = std::min(lowest, f);
          highest = std::max(highest, l);
        }
      }
    } else {  // monotonic: the row's extreme coordinates bound its planes
      // Four independent extremes (no chain of compares from point to point), then theirs.
      constexpr int kWays = 4;
      T low[kWays], high[kWays];
      for (int u = 0; u < kWays; ++u) low[u] = T(INFINITY), high[u] = T(-INFINITY);
      for (int64_t w = 0; w < g.Wo; w += kWays)
        for (int u = 0; u < kWays && w + u < g.Wo; ++u) {
          const T cz = z[w + u];
          low[u] = cz < low[u] ? cz : low[u];  // NaN is passed over
          high[u] = cz > high[u] ? cz : high[u];
        }
      for (int u = 1; u < kWays; ++u) {
        low[0] = std::min(low[0], low[u]);
        high[0] = std::max(high[0], high[u]);
      }
      plane_span<MODE, PADDING>(low[0], high[0], g.D, a.align_corners, lowest, highest);
    }
    if (lowest <= highest) {
      first[row] = n * g.D + lowest;
      last[row] = n * g.D + highest;
    } else {
      first[row] = g.N * g.D;
      last[row] = -1;
    }
  }
}

// How the backward splits its work: slabs of input planes [slabs[s], slabs[s+1]) and,
// where the grid gradient runs beside the slabs, row bounds of those tasks.
struct Plan {
  std::vector<int64_t> row_first, row_last;  // read only with several slabs
  std::vector<int64_t> slabs;                // empty: no input gradient
  std::vector<int64_t> grad_rows;            // empty: the slabs compute the grid gradient
  int64_t n_slabs() const { return slabs.empty() ? 0 : int64_t(slabs.size()) - 1; }
  int64_t slab_of(int64_t plane) const {
    return int64_t(std::upper_bound(slabs.begin(), slabs.end(), plane) - slabs.begin()) - 1;
  }
};

// Time to scatter a point into grad_input over time to compute its grid gradient
// (measured on these kernels at 1 thread: random grids 1.5 at one channel, 1.9 at eight;
// smooth ones 1.2).
constexpr double kScatterOverGradient = 1.5;

template <int MODE, int PADDING, class Points>
Plan make_plan(const GridSampleArgs& a, const Geometry& g, const Points& points, bool want_grid) {
  Plan p;
  const bool want_input = !a.grad_input.empty();
  const int threads = a.threads;
  const int64_t planes = g.N * g.D;
  if (want_input) {
    if (threads == 1) {
      p.slabs = {0, planes};  // one slab holds every plane: the ranges are not read
    } else if (g.N >= threads) {  // whole batches per slab
      const int64_t per_batch = g.Do * g.Ho;
      p.row_first.resize(g.rows);
      p.row_last.resize(g.rows);
      for (int64_t row = 0; row < g.rows; ++row) {
        p.row_first[row] = row / per_batch * g.D;
        p.row_last[row] = p.row_first[row] + g.D - 1;
      }
      for (int t = 0; t <= threads; ++t) p.slabs.push_back(g.D * (t * g.N / threads));
    } else {
      p.row_first.resize(g.rows);
      p.row_last.resize(g.rows);
      row_planes<MODE, PADDING>(a, g, points, p.row_first.data(), p.row_last.data());
      // Rows touching each plane (a difference array, then its running sum), and slabs
      // cut where the running total of that work crosses each thread's share.
      std::vector<int64_t> touching(planes + 1, 0);
      for (int64_t row = 0; row < g.rows; ++row) {
        if (p.row_first[row] > p.row_last[row]) continue;
        ++touching[p.row_first[row]];
        --touching[p.row_last[row] + 1];
      }
      int64_t running = 0, total = 0;
      for (int64_t z = 0; z < planes; ++z) {
        running += touching[z];
        total += running;
        touching[z] = total;  // cumulative work up to and including plane z
      }
      p.slabs.push_back(0);
      for (int t = 1; t < threads; ++t) {
        const double target = double(total) * t / threads;
        const int64_t cut = int64_t(std::upper_bound(touching.begin(), touching.begin() + planes,
                                                     target, [](double v, int64_t c) { return v < double(c); }) -
                                    touching.begin());
        if (cut > p.slabs.back() && cut < planes) p.slabs.push_back(cut);
      }
      p.slabs.push_back(planes);
      // Each slab a row reaches prepares the row again: when rows reach across slabs on
      // average (a random grid), one slab does the whole scatter faster.
      int64_t live = 0, reached = 0;
      for (int64_t row = 0; row < g.rows; ++row) {
        if (p.row_first[row] > p.row_last[row]) continue;
        ++live;
        reached += p.slab_of(p.row_last[row]) - p.slab_of(p.row_first[row]);
      }
      if (live && double(reached) > 0.5 * double(live)) {
        p.slabs = {0, planes};
        p.row_first.clear();
        p.row_last.clear();
      }
    }
  }
  const int64_t slabs = p.n_slabs();
  if (!want_grid || (want_input && (threads == 1 || slabs > 1))) return p;
  if (!want_input) {
    const int64_t chunks = chunks_for(g.rows, threads);
    for (int64_t t = 0; t <= chunks; ++t) p.grad_rows.push_back(t * g.rows / chunks);
    return p;
  }
  // Beside a single slab, task 0 scatters every point, so it takes a smaller share of the
  // grid gradient: the tasks then finish together.
  const double first_share =
      std::max(0.0, (1 + kScatterOverGradient) / threads - kScatterOverGradient);
  const double other_share = (1 - first_share) / (threads - 1);
  p.grad_rows.push_back(0);
  for (int t = 1; t <= threads; ++t)
    p.grad_rows.push_back(
        t == threads ? g.rows
                     : int64_t(std::llround((first_share + (t - 1) * other_share) * double(g.rows))));
  return p;
}

// ---------------------------------------------------------------------------------------
// Grid-gradient sinks: where the backward puts each point's gradient in its normalised
// sample coordinates (x, y, z). A grid's stores it as grad_grid; a warp's stores the
// displacement's gradient and reduces theta's. block() takes the gradient of L points of
// a row (lanes past the row's end hold 0) with the row's RowSums; row_done() ends the row.
// A row's gradient is computed by one task, its blocks in increasing order; finish() runs
// after every row, on one thread.
// ---------------------------------------------------------------------------------------

// Lanes [0, valid) of (x, y, z) stored per point at p, p + s[3], ... (channel step s[4]),
// each rounded once to G.
template <class G, class V>
void store_points(G* p, const int64_t* s, int64_t valid, V x, V y, V z) {
  using T = scalar_of<V>;
  constexpr int L = lanes<V>::count;
  alignas(64) T gx[L], gy[L], gz[L];
  store_(gx, x);
  store_(gy, y);
  store_(gz, z);
  auto interleave = [&](int64_t point, int64_t axis, int64_t count) {
    for (int64_t l = 0; l < count; ++l) {
      storage<G>::template store<T>(p + l * point, gx[l]);
      storage<G>::template store<T>(p + l * point + axis, gy[l]);
      storage<G>::template store<T>(p + l * point + 2 * axis, gz[l]);
    }
  };
  if (s[3] == 3 && s[4] == 1 && valid == L) interleave(3, 1, L);  // constants: vectorised
  else interleave(s[3], s[4], valid);
}

template <class G, class T>
struct GridGradient {
  const Strided& grad_grid;  // absent: not wanted
  struct RowSums {
    void clear() {}
  };
  bool wanted() const { return !grad_grid.empty(); }
  template <class V>
  void block(RowSums&, int64_t n, int64_t d, int64_t h, int64_t w, int64_t valid, V gx, V gy,
             V gz) const {
    const int64_t* s = grad_grid.stride;
    store_points(grad_grid.ptr<G>() + n * s[0] + d * s[1] + h * s[2] + w * s[3], s, valid, gx,
                 gy, gz);
  }
  void row_done(const RowSums&, int64_t) const {}
  void finish() const {}
};

// A warp's. The displacement's gradient is the coordinates' times the scales. Theta's is
// grad_theta[n, k, j] = sum over batch n's points of g_k * b_j, (b_j) = (bx, by, bz, 1);
// along a row by and bz are constant, so a row needs only sum g_k and sum g_k * bx. A row
// sums them in 16 slots (slot s: the points w = s mod 16, in increasing w: the same
// additions for every vector width), then its slots in float64 in order; finish() sums
// each batch's rows in order in float64 and rounds once. The bits depend on neither the
// thread count nor the instruction set.
template <class G, class T>
struct WarpGradient {
  static constexpr int kSlots = 16;  // kMaxLanes: every vector width divides it
  const WarpPoints<G, T>& points;
  const Strided& grad_displacement;  // absent: not wanted
  const Strided& grad_theta;         // absent: not wanted
  double* row_sums;                  // per output row: sum g_k (k = x, y, z), sum g_k * bx
  struct RowSums {
    alignas(64) T slot[6][kSlots];
    void clear() { std::fill(&slot[0][0], &slot[0][0] + 6 * kSlots, T(0)); }
  };
  bool wanted() const { return !grad_displacement.empty() || !grad_theta.empty(); }

  template <class V>
  void block(RowSums& sums, int64_t n, int64_t d, int64_t h, int64_t w, int64_t valid, V gx,
             V gy, V gz) const {
    if (!grad_displacement.empty()) {
      const int64_t* s = grad_displacement.stride;
      const T* k = points.scale;
      store_points(grad_displacement.ptr<G>() + n * s[0] + d * s[1] + h * s[2] + w * s[3], s,
                   valid, gx * V(k[0]), gy * V(k[1]), gz * V(k[2]));
    }
    if (!grad_theta.empty()) {
      const int64_t at = w % kSlots;
      const V bx = load_<V>(points.bx.data() + w);
      const V g[3] = {gx, gy, gz};
      for (int k = 0; k < 3; ++k) {
        store_(sums.slot[k] + at, load_<V>(sums.slot[k] + at) + g[k]);
        store_(sums.slot[3 + k] + at, load_<V>(sums.slot[3 + k] + at) + g[k] * bx);
      }
    }
  }

  void row_done(const RowSums& sums, int64_t row) const {
    if (grad_theta.empty()) return;
    for (int q = 0; q < 6; ++q) {
      double total = 0;
      for (int slot = 0; slot < kSlots; ++slot) total += double(sums.slot[q][slot]);
      row_sums[6 * row + q] = total;
    }
  }

  void finish() const {
    if (grad_theta.empty()) return;
    const Geometry& g = points.g;
    const int64_t* s = grad_theta.stride;
    for (int64_t n = 0; n < g.N; ++n) {
      double sum[3][4] = {};
      for (int64_t d = 0; d < g.Do; ++d)
        for (int64_t h = 0; h < g.Ho; ++h) {
          const double* r = row_sums + 6 * ((n * g.Do + d) * g.Ho + h);
          const double by = double(points.by[size_t(h)]), bz = double(points.bz[size_t(d)]);
          for (int k = 0; k < 3; ++k) {
            sum[k][0] += r[3 + k];
            sum[k][1] += by * r[k];
            sum[k][2] += bz * r[k];
            sum[k][3] += r[k];
          }
        }
      for (int k = 0; k < 3; ++k)
        for (int j = 0; j < 4; ++j)
          storage<G>::template store<double>(grad_theta.ptr<G>() + n * s[0] + k * s[1] + j * s[2],
                                             sum[k][j]);
    }
  }
};

// The backward's operands and loops, L points (lanes) at a time. The grid gradient sums,
// per lane, channel by channel the derivative of the channel's sample (a fixed expression
// of the 8 corner values); the scatter into grad_input goes channel by channel, and in a
// channel so that each element receives its terms in increasing point order.
template <class S, int MODE, class Points, class Sink>
struct Backward {
  using T = typename Points::compute;
  using V = typename native<T>::type;
  using Lane = index_lane_of<V>;
  using M = mask_of<V>;
  using F = Footprint<MODE, V>;
  static constexpr int L = lanes<V>::count;
  static constexpr int kCorners = F::kCorners;

  const GridSampleArgs& a;
  const Geometry& g;
  const Points& points;  // where the points sample
  const Sink& sink;      // where their grid gradient goes
  const S* gout;
  const S* inp;
  T* gin;
  int64_t gi_offsets[8];

  Backward(const GridSampleArgs& args, const Geometry& geometry, const Points& p, const Sink& k)
      : a(args), g(geometry), points(p), sink(k), gout(args.grad_output.ptr<S>()),
        inp(args.input.ptr<S>()), gin(args.grad_input.ptr<T>()) {
    if (gin) corner_offsets(a.grad_input, gi_offsets);
  }

  const S* gout_row(int64_t n, int64_t d, int64_t h) const {
    const int64_t* s = a.grad_output.stride;
    return gout + n * s[0] + d * s[2] + h * s[3];
  }

  // Which part of a row's points a task takes: every corner (a slab holding the row's
  // planes whole, or no slabs at all), or only those on the planes [lo, hi).
  struct Planes {
    bool clip;
    int64_t lo, hi;
  };

  // Points [w, w + L) of a row (n, d, h): with SCATTER, their grad_output times each corner
  // weight is added into grad_input's corners (those on the task's planes), channel by
  // channel; with GATHER, their grid gradient is summed over the channels and stored.
  template <bool SCATTER, bool GATHER>
  struct PointBlock {
    static constexpr bool kGather = GATHER;
    static constexpr bool kGradient = GATHER && MODE != NEAREST;
    const Backward* k;
    int64_t w, n, d, h, valid;
    bool touches;
    F f;
    std::optional<CornerReader<MODE, V>> reader;
    V cw[8];
    V sx, sy, sz;
    alignas(64) Lane gi_lanes[L];
    unsigned live;                // the valid lanes
    unsigned corner_lanes[8];     // corner k's lanes that scatter (inside, on the task's planes)
    bool corner_major;            // the scatter may go corner by corner (see scatter_order)
    int flip;                     // ... from corner 7 ^ flip down to corner 0 ^ flip

    // Made in place (the blocks are reused row after row, and are large to copy).
    void prepare(const Backward& kernel, const RowCoords<T>& r, int64_t w_, int64_t n_,
                 int64_t d_, int64_t h_, Planes planes) {
      k = &kernel;
      w = w_, n = n_, d = d_, h = h_;
      valid = std::min<int64_t>(L, kernel.g.Wo - w);
      f = F(r, w, kernel.g, kernel.a.padding, kernel.a.align_corners);
      sx = sy = sz = V(T(0));
      reader.reset();
      const Geometry& g = kernel.g;
      touches = bits_of(f.any()) != 0;
      if (!touches) return;  // nothing to do: the grid gradient is 0, as its caller left it
      if (kGradient) reader.emplace(f, g, kernel.a.input.stride);
      if (MODE == NEAREST) cw[0] = V(T(1));
      else f.corner_weights(cw);
      if (SCATTER) {  // each corner's lanes, clipped to the task's planes
        store_(gi_lanes, f.offset(kernel.a.grad_input.stride));
        live = unsigned((uint64_t(1) << valid) - 1);
        unsigned on_planes[2] = {live, live};  // corners of z bit 0, 1
        if (planes.clip) {  // compared in this batch's z, small whole numbers
          const V lo{T(std::clamp<int64_t>(planes.lo - n * g.D, -2, g.D + 1))};
          const V hi{T(std::clamp<int64_t>(planes.hi - n * g.D, -2, g.D + 1))};
          const V z0 = f.low[2], z1 = f.low[2] + V(T(1));
          on_planes[0] &= bits_of((lo <= z0) & (z0 < hi));
          on_planes[1] &= bits_of((lo <= z1) & (z1 < hi));
        }
        for (int c = 0; c < kCorners; ++c)
          corner_lanes[c] = bits_of(f.corner[c]) & on_planes[c >> 2];
        scatter_order();
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
      if (kGradient) reader->prefetch(k->inp + n * a.input.stride[0] + c * a.input.stride[1]);
      if (SCATTER) {
        const int64_t* gs = a.grad_input.stride;
        const T* gi_c = k->gin + n * gs[0] + c * gs[1];
        for (int64_t corner_row : {int64_t(0), gs[3], gs[2], gs[2] + gs[3]}) {
          prefetch_(gi_c + gi_lanes[0] + corner_row);
          prefetch_(gi_c + gi_lanes[valid - 1] + corner_row + gs[4]);
        }
      }
    }

    // Channel c's share: its grid-gradient terms summed, its grad_input terms scattered.
    void channel(int64_t c) {
      if (!touches) return;
      const GridSampleArgs& a = k->a;
      const int64_t* gs = a.grad_output.stride;
      const V gv = load_lanes<V>(k->gout_row(n, d, h) + c * gs[1] + w * gs[4], gs[4], valid);
      if (kGradient) {
        V v[8];
        reader->read(k->inp + n * a.input.stride[0] + c * a.input.stride[1], v);
        // PyTorch's terms in PyTorch's order: corner by corner, each axis' sum gains
        // +-((value * weight) * weight) * grad_output, the other two axes' weights in axis
        // order, + where the corner is the axis' high tap. A corner outside adds nothing
        // (not even 0 * inf).
        const V* wt = f.weight;
        for (int i = 0; i < 8; ++i) {
          const V wx = wt[i & 1], wy = wt[2 + (i >> 1 & 1)], wz = wt[4 + (i >> 2)];
          const V vx = v[i] * wx, vy = v[i] * wy;
          const V tx = vy * wz * gv, ty = vx * wz * gv, tz = vx * wy * gv;
          const M in = f.corner[i];
          sx = select(in, (i & 1) ? sx + tx : sx - tx, sx);
          sy = select(in, (i >> 1 & 1) ? sy + ty : sy - ty, sy);
          sz = select(in, (i >> 2) ? sz + tz : sz - tz, sz);
        }
      }
      if (SCATTER) {
        alignas(64) T terms[8][L];
        for (int i = 0; i < kCorners; ++i) store_(terms[i], gv * cw[i]);
        T* gi_c = k->gin + n * a.grad_input.stride[0] + c * a.grad_input.stride[1];
        int64_t to[8];  // a local copy: the compiler keeps it in registers
        std::copy(k->gi_offsets, k->gi_offsets + 8, to);
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
    }

    // The grid gradient handed to the sink (nearest: exactly 0; its slope may be NaN
    // outside).
    void finish(typename Sink::RowSums& sums) const {
      if (!GATHER || !touches) return;
      const V zero(T(0));
      const M any = f.any();
      k->sink.block(sums, n, d, h, w, valid,
                    kGradient ? select(any, f.slope[0] * sx, zero) : zero,
                    kGradient ? select(any, f.slope[1] * sy, zero) : zero,
                    kGradient ? select(any, f.slope[2] * sz, zero) : zero);
    }
  };

  // Per-thread blocks of a row. With several channels the row's blocks are prepared
  // together and then swept channel by channel, so that the reads and writes stay on a few
  // rows of one channel at a time, which the caches keep; one channel takes a block at a time.
  struct RowWork {
    RowCoords<T> coords;
    std::vector<PointBlock<true, true>> both;
    std::vector<PointBlock<true, false>> scatter;
    std::vector<PointBlock<false, true>> gradient;
    RowWork(int64_t Wo, int64_t C) : coords(Wo) {
      const size_t blocks = C > 1 ? size_t((Wo + L - 1) / L) : 0;
      both.resize(blocks);
      scatter.resize(blocks);
      gradient.resize(blocks);
    }
  };

  template <class Block>
  void row(std::vector<Block>& blocks, const RowCoords<T>& r, int64_t n, int64_t d, int64_t h,
           Planes planes) const {
    typename Sink::RowSums sums;
    if constexpr (Block::kGather) sums.clear();
    row_blocks(blocks, r, n, d, h, planes, sums);
    if constexpr (Block::kGather) sink.row_done(sums, (n * g.Do + d) * g.Ho + h);
  }

  template <class Block>
  void row_blocks(std::vector<Block>& blocks, const RowCoords<T>& r, int64_t n, int64_t d,
                  int64_t h, Planes planes, typename Sink::RowSums& sums) const {
    if (g.C == 1) {  // a local block, which the compiler keeps in registers
      Block block;
      for (int64_t w = 0; w < g.Wo; w += L) {
        block.prepare(*this, r, w, n, d, h, planes);
        block.channel(0);
        block.finish(sums);
      }
      return;
    }
    const int64_t group = int64_t(blocks.size());
    for (int64_t first = 0; first < g.Wo; first += group * L) {
      const int64_t count = std::min<int64_t>(group, (g.Wo - first + L - 1) / L);
      for (int64_t b = 0; b < count; ++b) blocks[b].prepare(*this, r, first + b * L, n, d, h, planes);
      for (int64_t c = 0; c < g.C; ++c)
        for (int64_t b = 0; b < count; ++b) {
          const int64_t ahead = c * count + b + kPrefetchBlocks;  // in (channel, block) order
          if (ahead < g.C * count) blocks[ahead % count].prefetch(ahead / count);
          blocks[b].channel(c);
        }
      for (int64_t b = 0; b < count; ++b) blocks[b].finish(sums);
    }
  }

  // Slab s: every point's share of grad_input on the slab's planes, in point order, and
  // (if need_grid) the grid gradient of the rows the slab owns.
  void slab(const Plan& p, int64_t s, bool need_grid, RowWork& work) const {
    const int64_t slabs = p.n_slabs(), lo = p.slabs[s], hi = p.slabs[s + 1];
    for (int64_t row = 0; row < g.rows; ++row) {  // every point, in increasing order
      bool owner = true, straddles = false;
      if (slabs > 1) {
        const int64_t first = p.row_first[row], last = p.row_last[row];
        if (last < lo || first >= hi) continue;
        straddles = first < lo || last >= hi;
        // A row's grid gradient is computed by one of the slabs it touches, spread by
        // row number so that rows spanning every slab share the work.
        owner = s == std::min(std::max(row * slabs / g.rows, p.slab_of(first)), p.slab_of(last));
      }
      int64_t n, d, h;
      points.row(row, work.coords, n, d, h);
      const Planes planes{straddles, lo, hi};
      if (need_grid && owner) this->row(work.both, work.coords, n, d, h, planes);
      else this->row(work.scatter, work.coords, n, d, h, planes);
    }
  }

  // The grid gradient of rows [begin, end).
  void gradient_rows(int64_t begin, int64_t end, RowWork& work) const {
    for (int64_t i = begin; i < end; ++i) {
      int64_t n, d, h;
      points.row(i, work.coords, n, d, h);
      row(work.gradient, work.coords, n, d, h, {});
    }
  }

  // Task t runs slab t, if there is one (slab s alone writes grad_input's planes
  // [slabs[s], slabs[s+1])), and then the grid gradient of rows [grad_rows[t],
  // grad_rows[t+1]), if those bounds exist; the two never write the same memory.
  void run(const Plan& p) const {
    const int64_t slabs = p.n_slabs();
    const int64_t chunks = p.grad_rows.empty() ? 0 : int64_t(p.grad_rows.size()) - 1;
    const int64_t tasks = std::max(slabs, chunks);
    const bool slabs_do_grid = sink.wanted() && chunks == 0;
#pragma omp parallel num_threads(std::max<int>(1, std::min<int64_t>(a.threads, tasks)))
    {
      RowWork work(g.Wo, g.C);
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < tasks; ++t) {
        if (t < slabs) slab(p, t, slabs_do_grid, work);
        if (t < chunks) gradient_rows(p.grad_rows[t], p.grad_rows[t + 1], work);
      }
    }
  }
};

// The plan of the call's padding.
template <int MODE, class Points>
Plan plan(const GridSampleArgs& a, const Geometry& g, const Points& points, bool want_grid) {
  static constexpr Plan (*plans[3])(const GridSampleArgs&, const Geometry&, const Points&, bool) =
      {make_plan<MODE, ZEROS, Points>, make_plan<MODE, BORDER, Points>,
       make_plan<MODE, REFLECTION, Points>};
  return plans[a.padding](a, g, points, want_grid);
}

template <class S, int MODE, class Points, class Sink>
void backward_kernel(const GridSampleArgs& a, const Geometry& g, const Points& points,
                     const Sink& sink) {
  const Backward<S, MODE, Points, Sink> kernel(a, g, points, sink);
  kernel.run(plan<MODE>(a, g, points, sink.wanted()));
  sink.finish();
}

// ---------------------------------------------------------------------------------------
// Dispatch: volume and grid dtypes, then the mode, once per call.
// ---------------------------------------------------------------------------------------

[[noreturn]] void unsupported(const char* what) {
  throw std::invalid_argument(std::string("grid_sample: unsupported ") + what);
}

// Calls F::template run<S, G>() for the call's (volume, grid) storage types.
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

// Calls f(S{}, G{}, mode) for the call's (volume, grid) storage types and its mode, an
// std::integral_constant: integer label maps only where LABELS (the forward), nearest only.
template <bool LABELS, class F>
void by_dtypes_and_mode(const GridSampleArgs& a, F&& f) {
  using Bilinear = std::integral_constant<int, BILINEAR>;
  using Nearest = std::integral_constant<int, NEAREST>;
  by_dtypes(
      a,
      [&](auto s, auto g) {
        using S = decltype(s);
        if constexpr (is_label<S>::value) {
          if constexpr (LABELS) {
            if (a.mode == NEAREST) return f(s, g, Nearest{});
            unsupported("mode for integer volumes (nearest only)");
          } else {
            unsupported("input dtype for the backward");
          }
        } else {
          if (a.mode == NEAREST) return f(s, g, Nearest{});
          return f(s, g, Bilinear{});
        }
      },
      LABELS);
}

bool backward_fits_index_lanes(const GridSampleArgs& a) {
  return fits_index_lanes(a.input) && (a.grad_input.empty() || fits_index_lanes(a.grad_input));
}

}  // namespace

void grid_sample_forward(const GridSampleArgs& a) {
  if (!fits_index_lanes(a.input)) return scalar::grid_sample_forward(a);
  by_dtypes_and_mode<true>(a, [&](auto s, auto g, auto mode) {
    using S = decltype(s);
    using G = decltype(g);
    using T = typename compute_of<S, G>::type;
    const Geometry geometry(a);
    forward_kernel<S, decltype(mode)::value>(a, GridPoints<G, T>{a.grid, geometry});
  });
}

void grid_sample_backward(const GridSampleArgs& a) {
  if (!backward_fits_index_lanes(a)) return scalar::grid_sample_backward(a);
  by_dtypes_and_mode<false>(a, [&](auto s, auto g, auto mode) {
    using S = decltype(s);
    using G = decltype(g);
    using T = typename compute_of<S, G>::type;
    const Geometry geometry(a);
    backward_kernel<S, decltype(mode)::value>(a, geometry, GridPoints<G, T>{a.grid, geometry},
                                              GridGradient<G, T>{a.grad_grid});
  });
}

std::vector<int64_t> grid_sample_backward_slabs(const GridSampleArgs& a) {
  std::vector<int64_t> slabs;
  by_dtypes_and_mode<false>(a, [&](auto s, auto g, auto mode) {
    using S = decltype(s);
    using G = decltype(g);
    using T = typename compute_of<S, G>::type;
    const Geometry geometry(a);
    slabs = plan<decltype(mode)::value>(a, geometry, GridPoints<G, T>{a.grid, geometry},
                                        !a.grad_grid.empty())
                .slabs;
  });
  return slabs;
}

void warp_forward(const WarpArgs& w) {
  const GridSampleArgs& a = w.sample;
  if (!fits_index_lanes(a.input)) return scalar::warp_forward(w);
  by_dtypes_and_mode<true>(a, [&](auto s, auto g, auto mode) {
    using S = decltype(s);
    using G = decltype(g);
    using T = typename compute_of<S, G>::type;
    const Geometry geometry(a);
    forward_kernel<S, decltype(mode)::value>(a, WarpPoints<G, T>(w, geometry));
  });
}

void warp_backward(const WarpArgs& w) {
  const GridSampleArgs& a = w.sample;
  if (!backward_fits_index_lanes(a)) return scalar::warp_backward(w);
  by_dtypes_and_mode<false>(a, [&](auto s, auto g, auto mode) {
    using S = decltype(s);
    using G = decltype(g);
    using T = typename compute_of<S, G>::type;
    const Geometry geometry(a);
    const WarpPoints<G, T> points(w, geometry);
    std::vector<double> row_sums(w.grad_theta.empty() ? 0 : size_t(6 * geometry.rows), 0.0);
    backward_kernel<S, decltype(mode)::value>(
        a, geometry, points,
        WarpGradient<G, T>{points, w.grad_displacement, w.grad_theta, row_sums.data()});
  });
}

}  // namespace VS_ISA
}  // namespace vs
