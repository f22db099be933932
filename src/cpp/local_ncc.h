// Local normalised cross-correlation, the similarity of `volsample register`, and the box
// sums it is made of (the launcher contract of the C++ backend).
//
// Volumes are C-contiguous (D, H, W), all float32 or all float64. A box sum adds the (2 radius + 1)^3 window
// around every voxel, cut at the volume's border. Over voxel i's window, with n the number
// of voxels it holds, the fixed volume F and the warped one J:
//   cross = sum(F J) - sum(F) sum(J) / n,  J_var = sum(J^2) - sum(J)^2 / n,
//   F_var = sum(F^2) - sum(F)^2 / n,       cc = cross^2 / (F_var J_var + eps),
// and the value is the mean of cc over the voxels.
#pragma once

#include <cstdint>

#include "tensor.h"

namespace vs {

struct BoxSumArgs {
  Strided volume;  // (D, H, W)
  Strided out;     // (D, H, W), not volume
  int radius = 1;
  int threads = 1;
};

struct LocalNccArgs {
  Strided fixed;       // F
  Strided fixed_sum;   // its box sum
  Strided fixed_var;   // F_var
  Strided warped;      // J
  Strided work;        // (3, D, H, W): the three window sums, then their gradients
  Strided grad;        // (D, H, W): grad_scale * d(sum of cc)/dJ; empty: the value alone
  int radius = 1;
  double eps = 1e-5;
  double grad_scale = 1.0;
  int threads = 1;
};

// Where a volume varies: voxel (z, y, x) varies when it differs from a neighbour along
// some axis. rows[z, y] says whether a voxel of row (z, y) varies, columns[z, x] whether
// one of column (z, x) does: all that the similarity's box and slabs need.
struct VaryingArgs {
  Strided volume;   // (D, H, W)
  Strided rows;     // (D, H) uint8
  Strided columns;  // (D, W) uint8
  int threads = 1;
};

#ifdef VS_ISA
namespace VS_ISA {
void box_sum(const BoxSumArgs& args);
double local_ncc(const LocalNccArgs& args);  // the mean of cc
void varying(const VaryingArgs& args);
}  // namespace VS_ISA
#endif

}  // namespace vs
