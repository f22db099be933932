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

// Time to scatter a point into grad_input over time to compute its grid gradient
// (measured on these kernels at 1 thread: random grids 1.5 at one channel, 1.9 at eight;
// smooth ones 1.2).
constexpr double kScatterOverGradient = 1.5;

}  // namespace

void split_by_batches(Plan& p, const Geometry& g, int threads) {
  const int64_t per_batch = g.Do * g.Ho;
  p.row_first.resize(g.rows);
  p.row_last.resize(g.rows);
  for (int64_t row = 0; row < g.rows; ++row) {
    p.row_first[row] = row / per_batch * g.D;
    p.row_last[row] = p.row_first[row] + g.D - 1;
  }
  for (int t = 0; t <= threads; ++t) p.slabs.push_back(g.D * (t * g.N / threads));
}

void split_by_rows(Plan& p, const Geometry& g, int threads) {
  const int64_t planes = g.N * g.D;
  // Rows touching each plane (a difference array, then its running sum), and slabs cut
  // where the running total of that work crosses each thread's share.
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
    const int64_t cut = int64_t(
        std::upper_bound(touching.begin(), touching.begin() + planes, target,
                         [](double v, int64_t c) { return v < double(c); }) -
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

void split_grid_rows(Plan& p, const Geometry& g, int threads, bool want_input) {
  if (want_input && (threads == 1 || p.n_slabs() > 1)) return;  // the slabs compute it
  if (!want_input) {
    const int64_t chunks = chunks_for(g.rows, threads);
    for (int64_t t = 0; t <= chunks; ++t) p.grad_rows.push_back(t * g.rows / chunks);
    return;
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
}

}  // namespace grid
}  // namespace VS_ISA
}  // namespace vs
