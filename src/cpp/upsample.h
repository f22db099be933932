// Trilinear upsampling kernels' arguments (the launcher contract of the C++ backend).
#pragma once

#include "tensor.h"

namespace vs {

// One resampling pass, src -> dst, both logical (N, C, D, H, W) of one dtype; src has any
// strides, dst is contiguous in its layout (channels_last: NDHWC, else NCDHW). The
// forward maps input to output; the backward maps grad_output to grad_input by the
// forward's adjoint. scales are the forward's per-axis (D, H, W) scale factors, <= 0
// where none was given. A pass that changes no spatial size is the caller's copy.
struct UpsampleArgs {
  Strided src;
  Strided dst;
  bool channels_last = false;
  bool align_corners = false;
  double scales[3] = {0.0, 0.0, 0.0};
  int threads = 1;
};

#ifdef VS_ISA
namespace VS_ISA {
void upsample_forward(const UpsampleArgs& args);
void upsample_backward(const UpsampleArgs& args);
}  // namespace VS_ISA
#endif

}  // namespace vs
