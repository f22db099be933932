// Grid-sampling kernels, forward and backward (compiled once per ISA).
//
// Every kernel works an output row (fixed n, d, h) at a time, in two steps. First the row's
// grid points are turned into a row table: voxel coordinates through the shared maths of
// coords.h, the lowest corner, six per-axis weights, the derivative of each voxel
// coordinate, and a byte per point whose bit k says whether corner k lies in the volume
// (0: the point touches nothing, because it is outside or not finite). That step runs on
// the ISA's vectors, lanes being consecutive points of the row. Then the volume is read
// (forward: masked gathers of the 8 corners, lanes again = points) or written (backward).
// Corners come in PyTorch's order tnw, tne, tsw, tse, bnw, bne, bsw, bse (x fastest), each
// corner weight is (wx * wy) * wz, and each sum starts at 0 and adds v * w in corner order
// with no fused multiply-add: the float32 and float64 forward match PyTorch bit for bit, and
// every ISA computes the scalar path's bits (a lane computes what the scalar code does).
//
// Modes are template parameters: the mode (1 or 8 corners) of the volume loops, the mode
// and padding of the row preparation, chosen once per call from small tables. 16-bit
// volumes are read from their own memory into float32 (float64 beside a float64 grid),
// and results are rounded once when stored.
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
#include <cstring>
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

// One output row's table (see the top comment), sized for whole vectors: lanes past the
// row's end touch nothing.
template <class T>
struct RowTable {
  int64_t width = 0, padded = 0;
  std::vector<T> values;  // 15 arrays of `padded`: coordinates, weights, slopes, corners
  std::vector<int64_t> corner;  // x0, y0, z0
  std::vector<int64_t> offset;  // element offset of the lowest corner in the input
  std::vector<uint8_t> inside;  // bit k: corner k lies in the volume

  explicit RowTable(int64_t Wo)
      : width(Wo), padded((Wo + kMaxLanes - 1) / kMaxLanes * kMaxLanes + kMaxLanes),
        values(15 * padded, T(0)), corner(3 * padded, 0), offset(padded, 0),
        inside(padded, 0) {}
  T* coord(int axis) { return values.data() + axis * padded; }         // cx, cy, cz
  T* weight(int k) { return values.data() + (3 + k) * padded; }       // wx0 wx1 wy0 wy1 wz0 wz1
  T* slope(int axis) { return values.data() + (9 + axis) * padded; }  // d(voxel)/d(grid)
  T* low(int axis) { return values.data() + (12 + axis) * padded; }   // lowest corner, as T
  const T* weight(int k) const { return values.data() + (3 + k) * padded; }
  const T* slope(int axis) const { return values.data() + (9 + axis) * padded; }
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

// Lowest tap along one axis (0 where no tap is inside), its weights and whether any tap
// lies inside [0, size). Range checks run in floating point, so NaN and huge coordinates
// never reach an integer conversion.
template <int MODE, class V>
inline mask_of<V> taps(V i, int64_t size, V& first, V& w0, V& w1) {
  using T = scalar_of<V>;
  const V zero(T(0)), one(T(1)), fsize{T(size)};
  if (MODE == NEAREST) {
    const V f = rint_(i);  // half to even, as std::nearbyint
    const auto in = (f >= zero) & (f < fsize);
    first = select(in, f, zero);
    w0 = one;
    w1 = zero;
    return in;
  }
  const V f = floor_(i);
  const auto in = (f >= zero - one) & (f < fsize);
  first = select(in, f, zero);
  w0 = (f + one) - i;
  w1 = i - f;
  return in;
}

// Fill a row table from the coordinates already in it (coord(0..2)). The vector part
// computes coordinates, weights and slopes; a short branch-free pass turns lowest corners
// into integers, input offsets and corner masks.
template <int MODE, int PADDING, class T>
void prepare_row(RowTable<T>& r, const Geometry& g, bool align_corners) {
  using V = typename native<T>::type;
  constexpr int L = lanes<V>::count;
  const int64_t sizes[3] = {g.W, g.H, g.D};
  for (int64_t w = 0; w < r.width; w += L) {
    auto touches = isfinite_(load_<V>(r.coord(0) + w)) & isfinite_(load_<V>(r.coord(1) + w)) &
                   isfinite_(load_<V>(r.coord(2) + w));
    for (int axis = 0; axis < 3; ++axis) {
      V slope, first, w0, w1;
      const V i = source_index(load_<V>(r.coord(axis) + w), sizes[axis], PADDING, align_corners, slope);
      touches = touches & taps<MODE>(i, sizes[axis], first, w0, w1);
      store_(r.slope(axis) + w, slope);
      store_(r.weight(2 * axis) + w, w0);
      store_(r.weight(2 * axis + 1) + w, w1);
      store_(r.low(axis) + w, first);
    }
    store_(r.coord(0) + w, select(touches, V(T(1)), V(T(0))));  // x is read: now 1 = live
  }
  // Corner k = (x bit, y bit, z bit) = (k & 1, k >> 1 & 1, k >> 2): the corners each
  // axis allows when its low tap (bit 0) and high tap (bit 1) are inside, as bytes.
  static constexpr uint8_t allow_x[4] = {0x00, 0x55, 0xaa, 0xff};
  static constexpr uint8_t allow_y[4] = {0x00, 0x33, 0xcc, 0xff};
  static constexpr uint8_t allow_z[4] = {0x00, 0x0f, 0xf0, 0xff};
  const int64_t sz = g.stride[2], sy = g.stride[3], sx = g.stride[4];
  for (int64_t w = 0; w < r.padded; ++w) {  // branch-free: the compiler vectorises it
    const bool live = w < r.width && r.coord(0)[w] != T(0);
    const int64_t x0 = int64_t(r.low(0)[w]), y0 = int64_t(r.low(1)[w]), z0 = int64_t(r.low(2)[w]);
    r.corner[w] = x0;
    r.corner[r.padded + w] = y0;
    r.corner[2 * r.padded + w] = z0;
    r.offset[w] = z0 * sz + y0 * sy + x0 * sx;
    uint8_t bits;
    if (MODE == NEAREST) {
      bits = uint8_t(live);
    } else {
      const unsigned xs = unsigned(x0 >= 0) | unsigned(x0 + 1 < g.W) << 1;
      const unsigned ys = unsigned(y0 >= 0) | unsigned(y0 + 1 < g.H) << 1;
      const unsigned zs = unsigned(z0 >= 0) | unsigned(z0 + 1 < g.D) << 1;
      bits = uint8_t(allow_x[xs] & allow_y[ys] & allow_z[zs] & (live ? 0xffu : 0u));
    }
    r.inside[w] = bits;
  }
}

template <class T>
using Preparer = void (*)(RowTable<T>&, const Geometry&, bool);

template <class T>
Preparer<T> preparer(int mode, int padding) {
  static constexpr Preparer<T> table[2][3] = {
      {prepare_row<BILINEAR, ZEROS, T>, prepare_row<BILINEAR, BORDER, T>,
       prepare_row<BILINEAR, REFLECTION, T>},
      {prepare_row<NEAREST, ZEROS, T>, prepare_row<NEAREST, BORDER, T>,
       prepare_row<NEAREST, REFLECTION, T>}};
  return table[mode][padding];
}

// Row `row`'s grid coordinates into the table (as T); returns the row's (n, d, h).
template <class G, class T>
void load_row(const Strided& grid, int64_t row, const Geometry& g, RowTable<T>& r, int64_t& n,
              int64_t& d, int64_t& h) {
  n = row / (g.Do * g.Ho);
  d = row / g.Ho % g.Do;
  h = row % g.Ho;
  const G* p = grid.ptr<G>() + n * grid.stride[0] + d * grid.stride[1] + h * grid.stride[2];
  const int64_t sw = grid.stride[3], sk = grid.stride[4];
  T* cx = r.coord(0);
  T* cy = r.coord(1);
  T* cz = r.coord(2);
  for (int64_t w = 0; w < g.Wo; ++w) {
    const G* q = p + w * sw;
    cx[w] = load<G, T>(q);
    cy[w] = load<G, T>(q + sk);
    cz[w] = load<G, T>(q + 2 * sk);
  }
}

// Corner k's element offset from the lowest corner.
inline void corner_offsets(const Strided& s, int64_t out[8]) {
  const int64_t sz = s.stride[2], sy = s.stride[3], sx = s.stride[4];
  const int64_t o[8] = {0, sx, sy, sy + sx, sz, sz + sx, sz + sy, sz + sy + sx};
  std::memcpy(out, o, sizeof o);
}

inline int64_t chunks_for(int64_t rows, int threads) {
  return std::max<int64_t>(1, std::min<int64_t>(rows, 4 * int64_t(threads)));
}

// ---------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------

// The 8 corner weights of lanes [w, w+L), each (wx * wy) * wz as PyTorch forms them.
template <class V, class T>
inline void corner_weights(const RowTable<T>& r, int64_t w, V out[8]) {
  const V wx0 = load_<V>(r.weight(0) + w), wx1 = load_<V>(r.weight(1) + w);
  const V wy0 = load_<V>(r.weight(2) + w), wy1 = load_<V>(r.weight(3) + w);
  const V wz0 = load_<V>(r.weight(4) + w), wz1 = load_<V>(r.weight(5) + w);
  const V a00 = wx0 * wy0, a10 = wx1 * wy0, a01 = wx0 * wy1, a11 = wx1 * wy1;
  out[0] = a00 * wz0; out[1] = a10 * wz0; out[2] = a01 * wz0; out[3] = a11 * wz0;
  out[4] = a00 * wz1; out[5] = a10 * wz1; out[6] = a01 * wz1; out[7] = a11 * wz1;
}

// Corner values of lanes [w, w+L) (0 where masked off): gathered straight from float32 or
// float64 volumes, converted lane by lane from 16-bit ones.
template <class V, class S>
inline V corner_values(const S* base, const int64_t* offset, int64_t add, mask_of<V> m,
                       const uint8_t* inside, unsigned bit) {
  using T = scalar_of<V>;
  if constexpr (std::is_same_v<S, T>) {
    return gather_(base, offset, add, m);
  } else {
    constexpr int L = lanes<V>::count;
    alignas(64) T v[L];
    for (int l = 0; l < L; ++l)
      v[l] = (inside[l] & bit) ? load<S, T>(base + offset[l] + add) : T(0);
    return load_<V>(v);
  }
}

template <class S, class G, int MODE>
void forward_kernel(const GridSampleArgs& a) {
  using T = typename compute_of<S, G>::type;
  using V = typename native<T>::type;
  constexpr int L = lanes<V>::count;
  const Geometry g(a);
  const Preparer<T> prepare = preparer<T>(MODE, a.padding);
  const S* inp = a.input.ptr<S>();
  S* out = a.output.ptr<S>();
  const int64_t* is = a.input.stride;
  const int64_t* os = a.output.stride;
  int64_t offsets[8];
  corner_offsets(a.input, offsets);
  const int64_t chunks = chunks_for(g.rows, a.threads);
#pragma omp parallel num_threads(a.threads)
  {
    RowTable<T> r(g.Wo);
    alignas(64) T acc_lanes[kMaxLanes];
#pragma omp for schedule(dynamic, 1)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {  // a chunk writes only its own rows
      for (int64_t row = chunk * g.rows / chunks; row < (chunk + 1) * g.rows / chunks; ++row) {
        int64_t n, d, h;
        load_row<G>(a.grid, row, g, r, n, d, h);
        prepare(r, g, a.align_corners);
        const S* in_n = inp + n * is[0];
        S* out_row = out + n * os[0] + d * os[2] + h * os[3];
        if constexpr (MODE == NEAREST) {  // the single voxel, copied exactly; 0 outside
          for (int64_t w = 0; w < g.Wo; ++w) {
            S* o = out_row + w * os[4];
            const S* src = in_n + r.offset[w];
            if (r.inside[w]) {
              for (int64_t c = 0; c < g.C; ++c) o[c * os[1]] = src[c * is[1]];
            } else {
              S zero;
              std::memset(&zero, 0, sizeof zero);
              for (int64_t c = 0; c < g.C; ++c) o[c * os[1]] = zero;
            }
          }
        } else {
          for (int64_t w = 0; w < g.Wo; w += L) {
            V cw[8];
            corner_weights<V>(r, w, cw);
            mask_of<V> m[8];
            for (int k = 0; k < 8; ++k) m[k] = bit_mask<V>::of(r.inside.data() + w, 1u << k);
            const int64_t valid = std::min<int64_t>(L, g.Wo - w);
            for (int64_t c = 0; c < g.C; ++c) {
              V acc(T(0));
              for (int k = 0; k < 8; ++k) {
                const V v = corner_values<V>(in_n, r.offset.data() + w, c * is[1] + offsets[k],
                                             m[k], r.inside.data() + w, 1u << k);
                acc = select(m[k], acc + v * cw[k], acc);
              }
              S* o = out_row + c * os[1] + w * os[4];
              if constexpr (std::is_same_v<S, T>) {
                if (os[4] == 1 && valid == L) {
                  store_(o, acc);
                  continue;
                }
              }
              store_(acc_lanes, acc);
              for (int64_t l = 0; l < valid; ++l)
                storage<S>::template store<T>(o + l * os[4], acc_lanes[l]);
            }
          }
        }
      }
    }
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
template <class G, class T, int MODE, int PADDING>
void row_planes(const GridSampleArgs& a, const Geometry& g, int64_t* first, int64_t* last) {
  const Strided& grid = a.grid;
#pragma omp parallel for num_threads(a.threads) schedule(static)
  for (int64_t row = 0; row < g.rows; ++row) {  // each row writes its own range
    const int64_t n = row / (g.Do * g.Ho), d = row / g.Ho % g.Do, h = row % g.Ho;
    const G* p = grid.ptr<G>() + n * grid.stride[0] + d * grid.stride[1] + h * grid.stride[2] +
                 2 * grid.stride[4];
    int64_t lowest = g.D, highest = -1;
    if (PADDING == REFLECTION) {  // folding is not monotonic: bound every point
      for (int64_t w = 0; w < g.Wo; ++w) {
        const T cz = load<G, T>(p + w * grid.stride[3]);
        int64_t f, l;
        plane_span<MODE, PADDING>(cz, cz, g.D, a.align_corners, f, l);
        if (f <= l) {
          lowest = std::min(lowest, f);
          highest = std::max(highest, l);
        }
      }
    } else {  // monotonic: the row's extreme coordinates bound its planes
      T low = T(INFINITY), high = T(-INFINITY);
      for (int64_t w = 0; w < g.Wo; ++w) {
        const T cz = load<G, T>(p + w * grid.stride[3]);
        low = cz < low ? cz : low;  // NaN is passed over
        high = cz > high ? cz : high;
      }
      plane_span<MODE, PADDING>(low, high, g.D, a.align_corners, lowest, highest);
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
// (measured with the Numba kernels, one channel or eight, smooth or random grids: 0.6-0.8).
constexpr double kScatterOverGradient = 0.7;

template <class G, class T, int MODE, int PADDING>
Plan make_plan(const GridSampleArgs& a, const Geometry& g) {
  Plan p;
  const bool want_input = !a.grad_input.empty(), want_grid = !a.grad_grid.empty();
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
      row_planes<G, T, MODE, PADDING>(a, g, p.row_first.data(), p.row_last.data());
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

// The backward's operands and loops. Corners of a point are visited in order, channels
// outermost, as PyTorch sums.
template <class S, class G, int MODE>
struct Backward {
  using T = typename compute_of<S, G>::type;
  static constexpr int kCorners = MODE == NEAREST ? 1 : 8;

  const GridSampleArgs& a;
  Geometry g;
  Preparer<T> prepare;
  const S* gout;
  const S* inp;
  T* gin;
  G* ggrid;
  int64_t in_offsets[8], gi_offsets[8];

  explicit Backward(const GridSampleArgs& args)
      : a(args), g(args), prepare(preparer<T>(MODE, args.padding)),
        gout(args.grad_output.ptr<S>()), inp(args.input.ptr<S>()),
        gin(args.grad_input.ptr<T>()), ggrid(args.grad_grid.ptr<G>()) {
    corner_offsets(a.input, in_offsets);
    if (gin) corner_offsets(a.grad_input, gi_offsets);
  }

  const S* gout_row(int64_t n, int64_t d, int64_t h) const {
    const int64_t* s = a.grad_output.stride;
    return gout + n * s[0] + d * s[2] + h * s[3];
  }

  // The 8 corner weights of point w and their derivatives by ix, iy, iz (24: x, y, z).
  static void weights(const RowTable<T>& r, int64_t w, T values[8], T slopes[24]) {
    const T wx0 = r.weight(0)[w], wx1 = r.weight(1)[w], wy0 = r.weight(2)[w];
    const T wy1 = r.weight(3)[w], wz0 = r.weight(4)[w], wz1 = r.weight(5)[w];
    const T a00 = wx0 * wy0, a10 = wx1 * wy0, a01 = wx0 * wy1, a11 = wx1 * wy1;
    const T v[8] = {a00 * wz0, a10 * wz0, a01 * wz0, a11 * wz0,
                    a00 * wz1, a10 * wz1, a01 * wz1, a11 * wz1};
    std::memcpy(values, v, sizeof v);
    const T yz00 = wy0 * wz0, yz10 = wy1 * wz0, yz01 = wy0 * wz1, yz11 = wy1 * wz1;
    const T xz00 = wx0 * wz0, xz10 = wx1 * wz0, xz01 = wx0 * wz1, xz11 = wx1 * wz1;
    const T s[24] = {-yz00, yz00, -yz10, yz10, -yz01, yz01, -yz11, yz11,
                     -xz00, -xz10, xz00, xz10, -xz01, -xz11, xz01, xz11,
                     -a00, -a10, -a01, -a11, a00, a10, a01, a11};
    std::memcpy(slopes, s, sizeof s);
  }

  // Point w's share of the backward: its grad_output scattered into the corners on planes
  // [lo, hi) (every corner when !clip; none when !scatter) and, if `gather`,
  // d(loss)/d(ix, iy, iz) into sx, sy, sz. `plane` is the plane index of the lowest corner.
  template <bool SCATTER, bool GATHER>
  void point(const RowTable<T>& r, int64_t w, int64_t n, const S* go, bool clip, int64_t plane,
             int64_t lo, int64_t hi, T& sx, T& sy, T& sz) const {
    T values[8], slopes[24];
    if (MODE == NEAREST) values[0] = T(1);
    else weights(r, w, values, slopes);
    const int64_t* is = a.input.stride;
    const S* i_at = inp + n * is[0] + r.offset[w];
    T* gi_at = nullptr;
    unsigned scatter_bits = 0;
    if (SCATTER) {
      const int64_t* gs = a.grad_input.stride;
      const int64_t x0 = r.corner[w], y0 = r.corner[r.padded + w], z0 = r.corner[2 * r.padded + w];
      gi_at = gin + n * gs[0] + z0 * gs[2] + y0 * gs[3] + x0 * gs[4];
      scatter_bits = r.inside[w];
      if (clip) {  // only the corners on this slab's planes
        if (plane < lo || plane >= hi) scatter_bits &= 0xf0u;
        if (plane + 1 < lo || plane + 1 >= hi) scatter_bits &= 0x0fu;
      }
    }
    const unsigned bits = r.inside[w];
    const int64_t go_c = a.grad_output.stride[1];
    for (int64_t c = 0; c < g.C; ++c) {
      const T gv = load<S, T>(go + c * go_c);
      const S* ic = i_at + c * is[1];
      for (int k = 0; k < kCorners; ++k) {
        if (!(bits >> k & 1)) continue;
        if (GATHER) {
          const T v = load<S, T>(ic + in_offsets[k]) * gv;
          sx += slopes[k] * v;
          sy += slopes[8 + k] * v;
          sz += slopes[16 + k] * v;
        }
        if (SCATTER && (scatter_bits >> k & 1))
          gi_at[c * a.grad_input.stride[1] + gi_offsets[k]] += gv * values[k];
      }
    }
  }

  void store_grid_gradient(const RowTable<T>& r, int64_t n, int64_t d, int64_t h, int64_t w, T sx,
                           T sy, T sz) const {
    const int64_t* s = a.grad_grid.stride;
    G* p = ggrid + n * s[0] + d * s[1] + h * s[2] + w * s[3];
    const bool zero = MODE == NEAREST || !r.inside[w];  // nearest: exactly 0; its slope may be NaN outside
    storage<G>::template store<T>(p, zero ? T(0) : r.slope(0)[w] * sx);
    storage<G>::template store<T>(p + s[4], zero ? T(0) : r.slope(1)[w] * sy);
    storage<G>::template store<T>(p + 2 * s[4], zero ? T(0) : r.slope(2)[w] * sz);
  }

  void prepare_row(RowTable<T>& r, int64_t row, int64_t& n, int64_t& d, int64_t& h) const {
    load_row<G>(a.grid, row, g, r, n, d, h);
    prepare(r, g, a.align_corners);
  }

  // Slab s: every point's share of grad_input on the slab's planes, in point order, and
  // (if need_grid) the grid gradient of the rows the slab owns.
  void slab(const Plan& p, int64_t s, bool need_grid, RowTable<T>& r) const {
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
      prepare_row(r, row, n, d, h);
      const S* go_row = gout_row(n, d, h);
      const bool gather = need_grid && owner && MODE != NEAREST;
      for (int64_t w = 0; w < g.Wo; ++w) {
        if (!r.inside[w]) continue;
        const int64_t z0 = r.corner[2 * r.padded + w], plane = n * g.D + z0;
        if (straddles && !owner &&
            (n * g.D + std::max<int64_t>(z0, 0) >= hi ||
             n * g.D + std::min<int64_t>(z0 + kCorners / 8, g.D - 1) < lo))
          continue;
        const S* go = go_row + w * a.grad_output.stride[4];
        T sx(0), sy(0), sz(0);
        if (gather) point<true, true>(r, w, n, go, straddles, plane, lo, hi, sx, sy, sz);
        else point<true, false>(r, w, n, go, straddles, plane, lo, hi, sx, sy, sz);
        if (need_grid && owner) store_grid_gradient(r, n, d, h, w, sx, sy, sz);
      }
    }
  }

  // The grid gradient of rows [begin, end) (every point written).
  void gradient_rows(int64_t begin, int64_t end, RowTable<T>& r) const {
    for (int64_t row = begin; row < end; ++row) {
      int64_t n, d, h;
      prepare_row(r, row, n, d, h);
      const S* go_row = gout_row(n, d, h);
      for (int64_t w = 0; w < g.Wo; ++w) {
        T sx(0), sy(0), sz(0);
        if (MODE != NEAREST && r.inside[w])
          point<false, true>(r, w, n, go_row + w * a.grad_output.stride[4], false, 0, 0, 0, sx, sy, sz);
        store_grid_gradient(r, n, d, h, w, sx, sy, sz);
      }
    }
  }

  // Task t runs slab t, if there is one (slab s alone writes grad_input's planes
  // [slabs[s], slabs[s+1])), and then the grid gradient of rows [grad_rows[t],
  // grad_rows[t+1]), if those bounds exist; the two never write the same memory.
  void run(const Plan& p) const {
    const int64_t slabs = p.n_slabs();
    const int64_t chunks = p.grad_rows.empty() ? 0 : int64_t(p.grad_rows.size()) - 1;
    const int64_t tasks = std::max(slabs, chunks);
    const bool slabs_do_grid = !a.grad_grid.empty() && chunks == 0;
#pragma omp parallel num_threads(std::max<int>(1, std::min<int64_t>(a.threads, tasks)))
    {
      RowTable<T> r(g.Wo);
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < tasks; ++t) {
        if (t < slabs) slab(p, t, slabs_do_grid, r);
        if (t < chunks) gradient_rows(p.grad_rows[t], p.grad_rows[t + 1], r);
      }
    }
  }
};

template <class S, class G, int MODE>
void backward_kernel(const GridSampleArgs& a) {
  using T = typename compute_of<S, G>::type;
  static constexpr Plan (*plans[3])(const GridSampleArgs&, const Geometry&) = {
      make_plan<G, T, MODE, ZEROS>, make_plan<G, T, MODE, BORDER>,
      make_plan<G, T, MODE, REFLECTION>};
  const Backward<S, G, MODE> kernel(a);
  kernel.run(plans[a.padding](a, kernel.g));
}

template <class S, class G, int MODE>
void plan_kernel(const GridSampleArgs& a, std::vector<int64_t>& slabs) {
  using T = typename compute_of<S, G>::type;
  static constexpr Plan (*plans[3])(const GridSampleArgs&, const Geometry&) = {
      make_plan<G, T, MODE, ZEROS>, make_plan<G, T, MODE, BORDER>,
      make_plan<G, T, MODE, REFLECTION>};
  slabs = plans[a.padding](a, Geometry(a)).slabs;
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

}  // namespace

void grid_sample_forward(const GridSampleArgs& a) {
  by_dtypes(
      a,
      [&](auto s, auto g) {
        using S = decltype(s);
        using G = decltype(g);
        if (a.mode == NEAREST) return forward_kernel<S, G, NEAREST>(a);
        if constexpr (!is_label<S>::value) return forward_kernel<S, G, BILINEAR>(a);
        unsupported("mode for integer volumes (nearest only)");
      },
      true);
}

void grid_sample_backward(const GridSampleArgs& a) {
  by_dtypes(
      a,
      [&](auto s, auto g) {
        using S = decltype(s);
        using G = decltype(g);
        if constexpr (!is_label<S>::value) {
          if (a.mode == NEAREST) return backward_kernel<S, G, NEAREST>(a);
          return backward_kernel<S, G, BILINEAR>(a);
        } else {
          unsupported("input dtype for the backward");
        }
      },
      false);
}

std::vector<int64_t> grid_sample_backward_slabs(const GridSampleArgs& a) {
  std::vector<int64_t> slabs;
  by_dtypes(
      a,
      [&](auto s, auto g) {
        using S = decltype(s);
        using G = decltype(g);
        if constexpr (!is_label<S>::value) {
          if (a.mode == NEAREST) return plan_kernel<S, G, NEAREST>(a, slabs);
          return plan_kernel<S, G, BILINEAR>(a, slabs);
        } else {
          unsupported("input dtype for the backward");
        }
      },
      false);
  return slabs;
}

}  // namespace VS_ISA
}  // namespace vs
