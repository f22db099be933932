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
  Strided grad_input;   // backward: like input, or absent; written whole (no need to zero)
  Strided grad_grid;    // backward: like grid, or absent; written whole
  int mode = BILINEAR;
  int padding = ZEROS;
  bool align_corners = false;
  int threads = 1;
};

// A warp: grid sampling where the grid affine_grid(theta) + displacement * scale would
// sample, that grid never stored. `sample` holds the volumes, modes and threads; its grid
// is virtual: the shape (N, Do, Ho, Wo, 3) and the coordinates' dtype (theta's), no memory.
struct WarpArgs {
  GridSampleArgs sample;
  Strided theta;              // (N, 3, 4): the output's (x, y, z, 1) -> the input's (x, y, z)
  Strided displacement;       // (N, Do, Ho, Wo, 3), or absent (0)
  Strided grad_theta;         // backward: (N, 3, 4), or absent; written whole
  Strided grad_displacement;  // backward: like displacement, or absent; written whole
  double scale[3] = {1, 1, 1};  // normalised units per displacement unit (x, y, z)
};

// The portable build's kernels, which the SIMD builds hand volumes too large for their
// 32-bit index lanes.
namespace scalar {
void grid_sample_forward(const GridSampleArgs& args);
void grid_sample_backward(const GridSampleArgs& args);
void warp_forward(const WarpArgs& args);
void warp_backward(const WarpArgs& args);
}  // namespace scalar

#ifdef VS_ISA
namespace VS_ISA {
void grid_sample_forward(const GridSampleArgs& args);
void grid_sample_backward(const GridSampleArgs& args);
void warp_forward(const WarpArgs& args);
void warp_backward(const WarpArgs& args);
// The slab bounds of input planes the backward would split grad_input into (tests).
std::vector<int64_t> grid_sample_backward_slabs(const GridSampleArgs& args);
}  // namespace VS_ISA
#endif

}  // namespace vs
