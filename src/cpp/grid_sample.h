// Grid sampling kernels' arguments (the launcher contract of the C++ backend).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor.h"

namespace vs {

// Operands of one grid-sampling call, checked and normalised by the Python layer:
// volumes in logical (N, C, D, H, W) order with any strides, grids (N, Do, Ho, Wo, 3).
// Absent operands (a gradient not asked for) have data == nullptr.
struct GridSampleArgs {
  Strided input;        // (N, C, D, H, W)
  Strided grid;         // (N, Do, Ho, Wo, 3)
  Strided output;       // forward: (N, C, Do, Ho, Wo)
  Strided grad_output;  // backward: (N, C, Do, Ho, Wo)
  Strided grad_input;   // backward: like input, or absent
  Strided grad_grid;    // backward: like grid, or absent
  int mode = BILINEAR;
  int padding = ZEROS;
  bool align_corners = false;
  int threads = 1;
};

// The portable build's kernels, which the SIMD builds hand volumes too large for their
// 32-bit index lanes.
namespace scalar {
void grid_sample_forward(const GridSampleArgs& args);
void grid_sample_backward(const GridSampleArgs& args);
}  // namespace scalar

#ifdef VS_ISA
namespace VS_ISA {
void grid_sample_forward(const GridSampleArgs& args);
void grid_sample_backward(const GridSampleArgs& args);
// The slab bounds of input planes the backward would split grad_input into (tests).
std::vector<int64_t> grid_sample_backward_slabs(const GridSampleArgs& args);
}  // namespace VS_ISA
#endif

}  // namespace vs
