// Mattes mutual information and its gradient (mutual_information.h).
//
// Two passes over the voxels, planes shared among threads: the first adds every voxel's
// four B-spline weights to its thread's own joint histogram, in 64-bit fixed point, so the
// histograms' sum is exact and the same whichever thread added what (no atomics); the
// second writes each voxel's gradient from the histogram's log-ratios alone. Both walk a
// plane in blocks of voxels, first placing a whole block (its bins, spline offsets and
// weights: branch-free loops over arrays, which the compiler vectorises for the ISA being
// built), then adding or gathering voxel by voxel. Every voxel's arithmetic is in float64,
// element-wise and without contractions, the same bits in every ISA.
#include "mutual_information.h"
#include "team.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace vs {
namespace VS_ISA {
namespace {

constexpr int kBlock = 256;  // voxels placed at once: their arrays stay in L1

// A histogram weight w (at most 1) adds round(w 2^k), k as large as keeps the sum of every
// voxel's weights, n 2^k, within 2^62: 2^-53 of a voxel for a few voxels, 2^-39 for 2^23.
double fixed_point_unit(int64_t voxels) {
  int bits = 0;
  while (bits < 62 && (int64_t(1) << bits) < voxels) ++bits;
  return std::ldexp(1.0, 62 - bits);
}

// The cubic B-spline at the offsets 1 + u, u, u - 1, u - 2 of the four bins (`weights`),
// or its derivative there (`slopes`).
enum class Spline { weights, slopes };

template <Spline S>
inline void spline_at(double u, double s[4]) {
  const double v = 1.0 - u;
  if (S == Spline::weights) {
    s[0] = v * v * v / 6.0;
    s[1] = 2.0 / 3.0 - u * u + 0.5 * u * u * u;
    s[2] = 2.0 / 3.0 - v * v + 0.5 * v * v * v;
    s[3] = u * u * u / 6.0;
  } else {
    s[0] = -0.5 * v * v;
    s[1] = -2.0 * u + 1.5 * u * u;
    s[2] = 2.0 * v - 1.5 * v * v;
    s[3] = 0.5 * u * u;
  }
}

// A block's voxels among the bins: a warped intensity J sits at t = (J - low) / width + 2,
// clamped to [2, bins - 2]; its four bins start at the joint histogram's element `cell`
// (its fixed bin's row, moving bin floor(t) - 1, at most bins - 4), at offset u = t -
// floor(t) in [0, 1] past the second one's centre, where the spline is `spline[0..3]`;
// `inside`: J was not clamped and the voxel counts. A voxel left out (fixed bin >= bins)
// has cell 0 and inside 0.
struct Block {
  int32_t cell[kBlock];
  int32_t inside[kBlock];  // 1 or 0 (int32 like cell: loops of one lane width vectorise)
  double spline[4][kBlock];
};

struct Binning {
  int bins;
  double low, width;

  template <Spline S, class T>
  void place(const uint8_t* fixed, const T* J, int n, Block& b) const {
    const double bottom = 2.0, top = double(bins - 2), last = top - 1.0;
    for (int l = 0; l < n; ++l) {
      const double t0 = (double(J[l]) - low) / width + 2.0;
      const bool counts = fixed[l] < bins;
      const bool inside = counts & (t0 > bottom) & (t0 < top);
      double t = t0 >= bottom ? t0 : bottom;  // NaN too
      t = t > top ? top : t;
      double i = std::floor(t);
      i = i < last ? i : last;
      double spline[4];
      spline_at<S>(t - i, spline);
      for (int k = 0; k < 4; ++k) b.spline[k][l] = spline[k];
      b.inside[l] = inside;
      b.cell[l] = counts ? int32_t(fixed[l]) * bins + int32_t(i) - 1 : 0;
    }
  }
};

// Calls visit(thread, first voxel, count) for blocks of at most kBlock voxels of the
// (D, plane) volume, whole planes to each of `threads` threads (OpenMP's static split).
template <class Visit>
void for_each_block(int64_t D, int64_t plane, int threads, Visit visit) {
  TeamCpus team(threads);
#pragma omp parallel num_threads(threads)
  {
    const int thread = omp_get_thread_num();
    team.settle(thread);
#pragma omp for schedule(static)
    for (int64_t z = 0; z < D; ++z)
      for (int64_t i = z * plane; i < (z + 1) * plane; i += kBlock)
        visit(thread, i, int(std::min<int64_t>(kBlock, (z + 1) * plane - i)));
  }
}

template <class T>
double mutual_information_of(const MutualInformationArgs& a) {
  const int64_t D = a.warped.shape[0], plane = a.warped.shape[1] * a.warped.shape[2];
  const int B = a.bins;
  const uint8_t* fixed = a.fixed_bins.ptr<uint8_t>();
  const T* J = a.warped.ptr<T>();
  T* grad = a.grad.empty() ? nullptr : a.grad.ptr<T>();
  const Binning binning{B, a.low, (a.high - a.low) / double(B - 4)};
  const int threads = std::max(a.threads, 1);
  const double unit = fixed_point_unit(D * plane);
  std::vector<std::vector<int64_t>> partial(size_t(threads), std::vector<int64_t>(size_t(B) * B));
  for_each_block(D, plane, threads, [&](int thread, int64_t i, int n) {
    Block b;
    binning.place<Spline::weights>(fixed + i, J + i, n, b);
    int64_t w[4][kBlock];  // the weights in fixed point
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < n; ++l) w[k][l] = int64_t(b.spline[k][l] * unit + 0.5);
    int64_t* histogram = partial[size_t(thread)].data();
    for (int l = 0; l < n; ++l) {
      if (fixed[i + l] >= B) continue;
      int64_t* row = histogram + b.cell[l];
      for (int k = 0; k < 4; ++k) row[k] += w[k][l];
    }
  });
  // the joint histogram and its marginals, exact integers; MI and the log-ratios in float64
  std::vector<int64_t> joint(size_t(B) * B, 0), of_fixed(size_t(B), 0), of_moving(size_t(B), 0);
  for (const auto& histogram : partial)
    for (size_t k = 0; k < joint.size(); ++k) joint[k] += histogram[k];
  int64_t total = 0;
  for (int f = 0; f < B; ++f)
    for (int m = 0; m < B; ++m) {
      const int64_t h = joint[size_t(f) * B + m];
      of_fixed[size_t(f)] += h;
      of_moving[size_t(m)] += h;
      total += h;
    }
  if (total == 0) {
    if (grad) std::fill(grad, grad + D * plane, T(0));
    return 0.0;
  }
  const double N = double(total);
  double mi = 0.0;
  std::vector<double> log_ratio(size_t(B) * B, 0.0);  // log(p(f, m) / p_m(m))
  for (int f = 0; f < B; ++f)
    for (int m = 0; m < B; ++m) {
      const int64_t h = joint[size_t(f) * B + m];
      if (h == 0) continue;
      const double p = double(h) / N;
      mi += p * std::log(double(h) * N /
                         (double(of_fixed[size_t(f)]) * double(of_moving[size_t(m)])));
      log_ratio[size_t(f) * B + m] = std::log(double(h) / double(of_moving[size_t(m)]));
    }
  if (!grad) return mi;
  const double factor = a.grad_scale * unit / (N * binning.width);
  const double* ratio = log_ratio.data();
  // every voxel written: 0 where left out or clamped
  for_each_block(D, plane, threads, [&](int, int64_t i, int n) {
    Block b;
    binning.place<Spline::slopes>(fixed + i, J + i, n, b);
    for (int l = 0; l < n; ++l) {
      const double* row = ratio + b.cell[l];
      double sum = 0.0;
      for (int k = 0; k < 4; ++k) sum += b.spline[k][l] * row[k];
      grad[i + l] = T(b.inside[l] ? factor * sum : 0.0);
    }
  });
  return mi;
}

}  // namespace

double mutual_information(const MutualInformationArgs& a) {
  return a.warped.dtype == DType::float64 ? mutual_information_of<double>(a)
                                          : mutual_information_of<float>(a);
}

}  // namespace VS_ISA
}  // namespace vs
