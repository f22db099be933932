// Bilinear (trilinear) grid sampling's per-point formula, as PyTorch's CPU kernels
// evaluate it, for L points (lanes) at a time: from a footprint's axis weights
// w[2 * axis + tap] (tap 0: the low voxel, weight x0 + 1 - x; tap 1: the high one, x - x0),
// the 8 corner values of one channel and that channel's grad_output. Operation for
// operation, in PyTorch's order and with no fused multiply-add, so the float32 and float64
// bits are PyTorch's. A corner outside the volume (inside[k] off) contributes nothing, not
// even 0 * inf.
//
// The kernels around these (grid_forward.cpp, grid_backward.cpp) decide which points and
// channels are evaluated in what order, and where the results go.
#pragma once

#include "grid_corners.h"

namespace vs {
namespace VS_ISA {
namespace grid {

// The corner weights: corner k's is (wx * wy) * wz (the four products wx * wy formed once).
template <class V>
inline void corner_weights(const V w[6], V out[8]) {
  const V xy[4] = {w[0] * w[2], w[1] * w[2], w[0] * w[3], w[1] * w[3]};  // (x, y) bits k & 3
  for (int k = 0; k < 8; ++k) out[k] = xy[k & 3] * w[4 + z_bit(k)];
}

// The sampled value: from 0, each corner inside adds value * weight, in corner order.
template <class V, class M>
inline V sample_value(const V value[8], const V weight[8], const M inside[8]) {
  V sum(scalar_of<V>(0));
  for (int k = 0; k < 8; ++k) sum = select(inside[k], sum + value[k] * weight[k], sum);
  return sum;
}

// One channel's terms of d(output)/d(voxel coordinate), added to sum[axis], corner by
// corner: along each axis a corner adds ((value * w_a) * w_b) * grad_output, w_a and w_b
// the other two axes' weights in axis order, with + where the corner is the axis' high
// tap and - where it is the low one.
template <class V, class M>
inline void add_coordinate_terms(const V value[8], const V w[6], const M inside[8],
                                 V grad_output, V sum[3]) {
  for (int k = 0; k < 8; ++k) {
    const V wx = w[x_bit(k)], wy = w[2 + y_bit(k)], wz = w[4 + z_bit(k)];
    const V term[3] = {((value[k] * wy) * wz) * grad_output,
                       ((value[k] * wx) * wz) * grad_output,
                       ((value[k] * wx) * wy) * grad_output};
    const int high[3] = {x_bit(k), y_bit(k), z_bit(k)};
    for (int axis = 0; axis < 3; ++axis)
      sum[axis] = select(inside[k], high[axis] ? sum[axis] + term[axis] : sum[axis] - term[axis],
                         sum[axis]);
  }
}

// A point's grid gradient along one axis: the channels' summed terms times the derivative
// of the voxel coordinate with respect to the grid coordinate (unnormalising and padding,
// coords.h); exactly 0 for a point that touches no voxel (its derivative may be NaN).
template <class V, class M>
inline V grid_gradient(V slope, V sum, M touches) {
  return select(touches, slope * sum, V(scalar_of<V>(0)));
}

// A channel's share of grad_input at a corner: grad_output times the corner's weight
// (nearest: weight 1, grad_output itself).
template <class V>
inline V scatter_term(V grad_output, V corner_weight) {
  return grad_output * corner_weight;
}

}  // namespace grid
}  // namespace VS_ISA
}  // namespace vs
