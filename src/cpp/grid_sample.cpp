// Grid-sampling kernels (compiled once per ISA). Being ported from the Numba kernels.
#include <stdexcept>

#include "coords.h"
#include "dtypes.h"
#include "grid_sample.h"

namespace vs {
namespace VS_ISA {

void grid_sample_forward(const GridSampleArgs&) {
  throw std::logic_error("grid_sample_forward: not yet ported to C++");
}
void grid_sample_backward(const GridSampleArgs&) {
  throw std::logic_error("grid_sample_backward: not yet ported to C++");
}

}  // namespace VS_ISA
}  // namespace vs
