// Mattes mutual information and its gradient (mutual_information.h).
//
// Two passes over the voxels, planes shared among threads: the first adds every voxel's
// four B-spline weights to its thread's own joint histogram, in 64-bit fixed point, so the
// histograms' sum is exact and the same whichever thread added what (no atomics); the
// second writes each voxel's gradient from the histogram's log-ratios alone. Every voxel's
// arithmetic is in float64 and element-wise, the same bits in every ISA.
#include "mutual_information.h"
#include "team.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace vs {
namespace VS_ISA {
namespace {

// A histogram weight w (at most 1) adds round(w 2^k), k as large as keeps the sum of every
// voxel's weights, n 2^k, within 2^62: 2^-53 of a voxel for a few voxels, 2^-39 for 2^23.
double fixed_point_unit(int64_t voxels) {
  int bits = 0;
  while (bits < 62 && (int64_t(1) << bits) < voxels) ++bits;
  return std::ldexp(1.0, 62 - bits);
}

// Where a warped intensity sits among the moving bins: its four bins start at `first`,
// at offset u in [0, 1] past the second one's centre; `inside`: not clamped to the range.
struct Place {
  int64_t first;
  double u;
  bool inside;
};

struct Binning {
  int bins;
  double low, width;

  Place place(double J) const {
    double t = (J - low) / width + 2.0;
    const double top = double(bins - 2);
    const bool inside = t > 2.0 && t < top;
    if (!(t >= 2.0)) t = 2.0;  // NaN too
    if (t > top) t = top;
    const double i = std::min(std::floor(t), top - 1.0);
    return {int64_t(i) - 1, t - i, inside};
  }
};

// The cubic B-spline at the offsets 1 + u, u, u - 1, u - 2 of the four bins, and its
// derivative there.
struct Spline {
  double w[4], d[4];
  explicit Spline(double u) {
    const double v = 1.0 - u;
    w[0] = v * v * v / 6.0;
    w[1] = 2.0 / 3.0 - u * u + 0.5 * u * u * u;
    w[2] = 2.0 / 3.0 - v * v + 0.5 * v * v * v;
    w[3] = u * u * u / 6.0;
    d[0] = -0.5 * v * v;
    d[1] = -2.0 * u + 1.5 * u * u;
    d[2] = 2.0 * v - 1.5 * v * v;
    d[3] = 0.5 * u * u;
  }
};

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
  {
    TeamCpus team(threads);
#pragma omp parallel num_threads(threads)
    {
      const int thread = omp_get_thread_num();
      team.settle(thread);
      int64_t* histogram = partial[size_t(thread)].data();
#pragma omp for schedule(static)
      for (int64_t z = 0; z < D; ++z)
        for (int64_t i = z * plane; i < (z + 1) * plane; ++i) {
          const int f = fixed[i];
          if (f >= B) continue;
          const Place at = binning.place(double(J[i]));
          const Spline spline(at.u);
          int64_t* row = histogram + int64_t(f) * B + at.first;
          for (int k = 0; k < 4; ++k) row[k] += int64_t(spline.w[k] * unit + 0.5);
        }
    }
  }
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
  if (grad) std::fill(grad, grad + D * plane, T(0));
  if (total == 0) return 0.0;
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
  TeamCpus team(threads);
#pragma omp parallel num_threads(threads)
  {
    team.settle(omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t z = 0; z < D; ++z)
      for (int64_t i = z * plane; i < (z + 1) * plane; ++i) {
        const int f = fixed[i];
        if (f >= B) continue;
        const Place at = binning.place(double(J[i]));
        if (!at.inside) continue;
        const Spline spline(at.u);
        const double* row = log_ratio.data() + int64_t(f) * B + at.first;
        double sum = 0.0;
        for (int k = 0; k < 4; ++k) sum += spline.d[k] * row[k];
        grad[i] = T(factor * sum);
      }
  }
  return mi;
}

}  // namespace

double mutual_information(const MutualInformationArgs& a) {
  return a.warped.dtype == DType::float64 ? mutual_information_of<double>(a)
                                          : mutual_information_of<float>(a);
}

}  // namespace VS_ISA
}  // namespace vs
