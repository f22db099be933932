// The steps of the grid backward's plan that do not look at coordinates: cutting the input
// planes into slabs, and the rows of the tasks that compute the grid gradient beside them
// (grid_backward_plan.h says why the work is split this way).
#include "grid_backward_plan.h"

#include <algorithm>
#include <cmath>

namespace vs {
namespace VS_ISA {
namespace grid {
namespace {

// The most rows, as a share of the rows that touch the volume, that more slabs than threads
// may prepare again (a row reaching into k slabs is prepared by each): beyond it, fewer
// slabs. Exactly one slab per thread may prepare up to kMostReachedOneSlabEach before
// one slab does the whole scatter instead. (Measured at 2 threads on the smooth grid of
// `volsample bench`, 96x112x96: 0.25 gives 4 slabs, as fast as 2 on a quiet machine
// within the noise; 0.5 gives 8 slabs, 10% slower at C = 8; 0.1 keeps 2.)
constexpr double kMostReachedMorePieces = 0.25;
constexpr double kMostReachedOneSlabEach = 0.5;

// Planes [0, planes) cut into `pieces` slabs where the cumulative work `work` (up to and
// including each plane) crosses each piece's share.
std::vector<int64_t> cut_planes(const std::vector<int64_t>& work, int64_t planes, int64_t pieces) {
  const int64_t total = planes ? work[planes - 1] : 0;
  std::vector<int64_t> slabs = {0};
  for (int64_t t = 1; t < pieces; ++t) {
    const double target = double(total) * double(t) / double(pieces);
    const int64_t cut = int64_t(
        std::upper_bound(work.begin(), work.begin() + planes, target,
                         [](double v, int64_t c) { return v < double(c); }) -
        work.begin());
    if (cut > slabs.back() && cut < planes) slabs.push_back(cut);
  }
  slabs.push_back(planes);
  return slabs;
}

}  // namespace

void split_by_batches(Plan& p, const Geometry& g, int64_t pieces) {
  const int64_t per_batch = g.Do * g.Ho;
  p.slabs.clear();
  p.row_first.resize(g.rows);
  p.row_last.resize(g.rows);
  for (int64_t row = 0; row < g.rows; ++row) {
    p.row_first[row] = row / per_batch * g.D;
    p.row_last[row] = p.row_first[row] + g.D - 1;
  }
  for (int64_t t = 0; t <= pieces; ++t) p.slabs.push_back(g.D * (t * g.N / pieces));
}

void split_by_rows(Plan& p, const Geometry& g, int threads) {
  const int64_t planes = g.N * g.D;
  // Rows touching each plane (a difference array, then its running sum), and its running
  // total: the work up to and including each plane.
  std::vector<int64_t> work(planes + 1, 0);
  int64_t live = 0;
  for (int64_t row = 0; row < g.rows; ++row) {
    if (p.row_first[row] > p.row_last[row]) continue;
    ++live;
    ++work[p.row_first[row]];
    --work[p.row_last[row] + 1];
  }
  int64_t running = 0, total = 0;
  for (int64_t z = 0; z < planes; ++z) {
    running += work[z];
    total += running;
    work[z] = total;
  }
  // The rows prepared again (beyond once each) under a cut into `slabs`.
  auto reached = [&](const std::vector<int64_t>& slabs) {
    p.slabs = slabs;
    int64_t again = 0;
    for (int64_t row = 0; row < g.rows; ++row)
      if (p.row_first[row] <= p.row_last[row])
        again += p.slab_of(p.row_last[row]) - p.slab_of(p.row_first[row]);
    return double(again);
  };
  // The most pieces whose rows prepared again stay few. Else, with a batch per thread,
  // whole batches (no row straddles them); or one slab per thread, which may prepare
  // more; and when rows reach across even those on average (a random grid), one slab
  // does the whole scatter faster.
  for (int64_t pieces = int64_t(kPiecesPerThread) * threads; pieces > threads; pieces /= 2)
    if (reached(cut_planes(work, planes, pieces)) <= kMostReachedMorePieces * double(live))
      return;
  if (g.N >= threads) return split_by_batches(p, g, g.N);
  if (reached(cut_planes(work, planes, threads)) <= kMostReachedOneSlabEach * double(live))
    return;
  p.slabs = {0, planes};
  p.row_first.clear();
  p.row_last.clear();
}

void split_grid_rows(Plan& p, const Geometry& g, int threads, bool want_input) {
  if (want_input && (threads == 1 || p.n_slabs() > 1)) return;  // the slabs compute it
  // Beside a single slab the chunks are taken by whichever threads are free, so the thread
  // that scatters takes fewer of them.
  const int64_t chunks = chunks_for(g.rows, threads);
  for (int64_t t = 0; t <= chunks; ++t) p.grad_rows.push_back(t * g.rows / chunks);
}

}  // namespace grid
}  // namespace VS_ISA
}  // namespace vs
