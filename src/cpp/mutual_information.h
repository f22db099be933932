// Mattes mutual information, the cross-contrast similarity of `volsample register`, with
// its gradient with respect to the warped volume's intensities.
//
// The joint histogram has `bins` x `bins` bins. A fixed voxel falls in one bin (a box Parzen
// window: its bin index is given, computed once per fixed volume); a warped intensity J,
// clamped to [low, high], sits at t = (J - low) / width + 2, width = (high - low) /
// (bins - 4), and adds the cubic B-spline beta3(t - m) to the bins m = floor(t) - 1 ..
// floor(t) + 2 of its fixed bin's row (these weights sum to 1). With p the histogram over
// its total and p_m its marginal over the fixed bins:
//   MI = sum over (f, m) of p(f, m) log(p(f, m) / (p_f(f) p_m(m))),
//   d MI / d J_i = 1 / (n width) sum over m of beta3'(t_i - m) log(p(f_i, m) / p_m(m))
// (n voxels counted; 0 where J_i was clamped). The histogram is summed in fixed point
// (each weight rounded to a multiple of 2^-k, in 64-bit integers, k from 39 for 2^23 voxels
// to 53 for a few), so that the same bits come out of any split of the voxels among threads.
#pragma once

#include <cstdint>

#include "tensor.h"

namespace vs {

struct MutualInformationArgs {
  Strided fixed_bins;  // (D, H, W) uint8: each fixed voxel's bin; bins or above: left out
  Strided warped;      // (D, H, W) float32 or float64, J
  Strided grad;        // warped's shape and dtype: grad_scale * d MI / d J; empty: the value alone
  int bins = 32;       // 5 .. 255
  double low = 0.0, high = 1.0;  // the warped intensity range the bins cover, low < high
  double grad_scale = 1.0;
  int threads = 1;
};

#ifdef VS_ISA
namespace VS_ISA {
double mutual_information(const MutualInformationArgs& args);  // MI, in nats
}  // namespace VS_ISA
#endif

}  // namespace vs
