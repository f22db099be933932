// How the grid backward splits its work across threads (grid_backward.cpp runs the plan).
//
// The forward and the grid gradient write each output point from one task. The input
// gradient is a scatter, made race-free by giving each task a slab of input planes (n, z)
// that only it writes. Every task walks the points in increasing order (skipping rows whose
// plane range misses its slab) and adds the corners on its planes, so each input element
// receives its terms in increasing point order whatever the slabs are. A row's grid
// gradient is computed once, by one of the slabs it touches; the others prepare only the
// row's blocks that reach their planes (judged from z, as the row's planes are). When rows
// reach across the volume (a random grid), one slab does the whole scatter and the other
// tasks compute the grid gradient beside it, in chunks of rows. How the planes are split
// (whole batches when there are enough; otherwise balanced by the rows touching each
// plane) changes the speed, never the bits.
//
// There are more tasks than threads (up to kPiecesPerThread per thread), taken by threads
// as they come free: a thread that shares its core with another process then holds back
// only its current task, and the others take the rest.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "coords.h"
#include "grid_common.h"
#include "grid_taps.h"
#include "team.h"

namespace vs {
namespace VS_ISA {
namespace grid {

// Tasks per thread the plan aims at (fewer where more slabs would prepare too many rows
// twice, grid_backward_plan.cpp).
constexpr int kPiecesPerThread = 4;

// The input planes a task scatters into: all of a row's (clip false), or only [lo, hi).
struct Planes {
  bool clip = false;
  int64_t lo = 0, hi = 0;
};

// What a slab does with a row: nothing (touches false), or scatter its corners on the
// slab's planes; and whether it also computes the row's grid gradient (owner).
struct RowShare {
  bool touches, owner;
  Planes planes;
};

// The split: slabs of input planes [slabs[s], slabs[s+1]) and, where the grid gradient
// runs beside the slabs, the bounds of those tasks' rows.
struct Plan {
  std::vector<int64_t> row_first, row_last;  // each row's planes; read only with several slabs
  std::vector<int64_t> slabs;                // empty: no input gradient
  std::vector<int64_t> grad_rows;            // empty: the slabs compute the grid gradient

  int64_t n_slabs() const { return slabs.empty() ? 0 : int64_t(slabs.size()) - 1; }
  int64_t slab_of(int64_t plane) const {
    return int64_t(std::upper_bound(slabs.begin(), slabs.end(), plane) - slabs.begin()) - 1;
  }

  // Slab s's share of row `row` (of `rows`). A row that touches no plane is owned (its
  // grid gradient, 0, written) by one slab, spread by row number.
  RowShare share(int64_t row, int64_t s, int64_t rows) const {
    const int64_t count = n_slabs(), lo = slabs[s], hi = slabs[s + 1];
    if (count == 1) return {true, true, {false, lo, hi}};
    const int64_t first = row_first[row], last = row_last[row];
    if (first > last) return {false, s == row * count / rows, {}};
    if (last < lo || first >= hi) return {false, false, {}};
    // Spread by row number, so that rows spanning every slab share the grid gradients.
    const bool owner =
        s == std::min(std::max(row * count / rows, slab_of(first)), slab_of(last));
    return {true, owner, {first < lo || last >= hi, lo, hi}};
  }
};

// The planes [first, last] of one batch that points with z coordinates in [low, high] can
// touch, for a padding under which the voxel coordinate grows with the normalised one
// (zeros, border; reflection for a single point); first > last if none. Under zeros and
// border padding coordinates are clipped to [-3, 3] first: points beyond touch the same
// planes (none, or an end one) and infinities never reach the arithmetic. Reflection folds
// any finite point back in, so there only a non-finite point touches nothing. NaN makes an
// empty span.
//
// Bicubic and B-spline points reach the taps floor(z) - 1 .. floor(z) + 2 of their
// unpadded voxel coordinate z, each tap then padded on its own: zeros drops those outside,
// border clamps them onto the end planes, and reflection may fold them anywhere, so there
// a finite point is bounded by every plane.
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
  if constexpr (taps_of<MODE> == kTaps) {
    if (PADDING == REFLECTION) {
      first = 0;
      last = D - 1;
      return;
    }
    T f = std::floor(unnormalize(low, D, align_corners, slope)) - T(1);
    T l = std::floor(unnormalize(high, D, align_corners, slope)) + T(2);
    if (PADDING == BORDER) {  // taps beyond either end read the end plane
      f = std::min(f, T(D - 1));
      l = std::max(l, T(0));
    }
    first = int64_t(std::max(f, T(0)));
    last = int64_t(std::min(l, T(D - 1)));
    return;
  }
  const T i_low = source_index(low, D, PADDING, align_corners, slope);
  const T i_high = source_index(high, D, PADDING, align_corners, slope);
  const T f = MODE == NEAREST ? std::nearbyint(i_low) : std::floor(i_low);
  const T l = MODE == NEAREST ? std::nearbyint(i_high) : std::floor(i_high) + T(1);
  first = int64_t(std::max(f, T(0)));
  last = int64_t(std::min(l, T(D - 1)));
}

// The planes [first, last] of one batch that the points of z coordinates z[0, count) can
// touch (a superset; first > last if none): plane_span of their extremes, or under
// reflection, whose folding is not monotonic, of each point. z is read in whole vectors:
// z[count, ...) up to the next multiple of the ISA's lanes must be readable and NaN (as
// RowCoords pads its rows).
template <int MODE, int PADDING, class T>
void points_planes(const T* z, int64_t count, int64_t D, bool align_corners, int64_t& first,
                   int64_t& last) {
  if (PADDING == REFLECTION) {
    first = D;
    last = -1;
    for (int64_t w = 0; w < count; ++w) {
      int64_t f, l;
      plane_span<MODE, PADDING>(z[w], z[w], D, align_corners, f, l);
      if (f <= l) {
        first = std::min(first, f);
        last = std::max(last, l);
      }
    }
    return;
  }
  // The extremes lane by lane (NaN is passed over: it compares false), then across lanes.
  using V = typename native<T>::type;
  constexpr int L = lanes<V>::count;
  V low{T(INFINITY)}, high{T(-INFINITY)};
  for (int64_t w = 0; w < count; w += L) {
    const V v = load_<V>(z + w);
    low = select(v < low, v, low);
    high = select(high < v, v, high);
  }
  alignas(64) T lows[L], highs[L];
  store_(lows, low);
  store_(highs, high);
  for (int l = 1; l < L; ++l) {
    lows[0] = std::min(lows[0], lows[l]);
    highs[0] = std::max(highs[0], highs[l]);
  }
  plane_span<MODE, PADDING>(lows[0], highs[0], D, align_corners, first, last);
}

// Each row's lowest and highest input plane (n*D + z) judged from z alone (a superset of
// the planes its points touch; first > last if none).
template <class T, int MODE, int PADDING, class Rows>
void row_planes(const Rows& source, const Geometry& g, bool align_corners, int threads,
                int64_t* first, int64_t* last) {
  TeamCpus team(threads);
#pragma omp parallel num_threads(threads)
  {
    team.settle(omp_get_thread_num());
    RowCoords<T> r(g.Wo);
#pragma omp for schedule(dynamic, 64)
    for (int64_t i = 0; i < g.rows; ++i) {  // each row writes its own range
      const Row row(i, g);
      source.fill(row, g, r);
      int64_t lowest, highest;
      points_planes<MODE, PADDING>(r.axis(2), g.Wo, g.D, align_corners, lowest, highest);
      if (lowest <= highest) {
        first[i] = row.n * g.D + lowest;
        last[i] = row.n * g.D + highest;
      } else {
        first[i] = g.N * g.D;
        last[i] = -1;
      }
    }
  }
}

// The steps of a plan that do not look at coordinates (grid_backward_plan.cpp).
// Slabs of whole batches, `pieces` runs of them (N >= pieces).
void split_by_batches(Plan& p, const Geometry& g, int64_t pieces);
// Slabs balanced by the rows touching each plane (row_first, row_last set): as many as
// the rows allow up to kPiecesPerThread per thread; else whole batches (N >= threads), one
// slab per thread, or one slab when rows reach across slabs on average.
void split_by_rows(Plan& p, const Geometry& g, int threads);
// The row bounds of the tasks that compute the grid gradient beside the slabs, if any.
void split_grid_rows(Plan& p, const Geometry& g, int threads, bool want_input);

// The plan of a call whose rows' coordinates come from `source`, with or without the grid
// gradient (want_grid: its sink's).
template <class T, int MODE, int PADDING, class Rows>
Plan make_plan(const GridSampleArgs& a, const Geometry& g, const Rows& source, bool want_grid) {
  Plan p;
  const bool want_input = !a.grad_input.empty();
  if (want_input) {
    if (a.threads == 1) {
      p.slabs = {0, g.N * g.D};  // one slab holds every plane: the ranges are not read
    } else if (g.N >= int64_t(kPiecesPerThread) * a.threads) {
      split_by_batches(p, g, int64_t(kPiecesPerThread) * a.threads);
    } else {
      p.row_first.resize(g.rows);
      p.row_last.resize(g.rows);
      row_planes<T, MODE, PADDING>(source, g, a.align_corners, a.threads, p.row_first.data(),
                                   p.row_last.data());
      split_by_rows(p, g, a.threads);
    }
  }
  if (want_grid) split_grid_rows(p, g, a.threads, want_input);
  return p;
}

}  // namespace grid
}  // namespace VS_ISA
}  // namespace vs
