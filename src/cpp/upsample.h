// Trilinear upsampling kernels' arguments (the launcher contract of the C++ backend).
#pragma once

#include "tensor.h"

namespace vs {

// One resampling pass, src -> dst, both logical (N, C, D, H, W) with any strides. The
// forward maps input to output; the backward maps grad_output to grad_input by the
// forward's adjoint. scales are the forward's per-axis (D, H, W) scale factors, <= 0
// where none was given.
struct UpsampleArgs {
  Strided src;
  Strided dst;
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
