// Trilinear upsampling kernels' arguments (the launcher contract of the C++ backend).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor.h"

namespace vs {

// One resampling pass, src -> dst, both logical (N, C, D, H, W) of one dtype; src has any
// strides, dst is contiguous in its layout (channels_last: NDHWC, else NCDHW). The
// forward maps input to output; the backward maps grad_output to grad_input by the
// forward's adjoint. scales are the forward's per-axis (D, H, W) scale factors, <= 0
// where none was given. A pass that changes no spatial size is the caller's copy.
//
// A window: the forward's output (the backward's grad_output) is then the part
// [window_first, window_first + its size) of each axis (D, H, W) of an output of
// window_full points, whose coordinate map it follows (the same bits as that output's
// part); window_full 0 on an axis: the whole output.
struct UpsampleArgs {
  Strided src;
  Strided dst;
  bool channels_last = false;
  bool align_corners = false;
  double scales[3] = {0.0, 0.0, 0.0};
  int64_t window_first[3] = {0, 0, 0};
  int64_t window_full[3] = {0, 0, 0};
  int threads = 1;
};

// The plan's figures for the bindings, from the portable build (a plan is the same for
// every ISA): the bytes one pass allocates beyond its result (shapes as UpsampleArgs'),
// and one axis's forward map or its transpose in CSR form (upsample_plan.h).
namespace scalar {
int64_t upsample_workspace_nbytes(const int64_t* src_shape, const int64_t* dst_shape,
                                  bool double_precision, bool channels_last, bool align_corners,
                                  const double* scales, int threads, bool transposed);
void upsample_axis_map(int64_t in_size, int64_t out_size, bool align_corners, double scale,
                       bool transposed, std::vector<int64_t>& starts,
                       std::vector<int64_t>& index, std::vector<float>& weight);
void upsample_axis_map(int64_t in_size, int64_t out_size, bool align_corners, double scale,
                       bool transposed, std::vector<int64_t>& starts,
                       std::vector<int64_t>& index, std::vector<double>& weight);
}  // namespace scalar

#ifdef VS_ISA
namespace VS_ISA {
void upsample_forward(const UpsampleArgs& args);
void upsample_backward(const UpsampleArgs& args);
}  // namespace VS_ISA
#endif

}  // namespace vs
