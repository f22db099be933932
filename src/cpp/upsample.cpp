// Upsampling kernels (compiled once per ISA). Being ported from the Numba kernels.
#include <stdexcept>

#include "coords.h"
#include "dtypes.h"
#include "upsample.h"

namespace vs {
namespace VS_ISA {

void upsample_forward(const UpsampleArgs&) {
  throw std::logic_error("upsample_forward: not yet ported to C++");
}
void upsample_backward(const UpsampleArgs&) {
  throw std::logic_error("upsample_backward: not yet ported to C++");
}

}  // namespace VS_ISA
}  // namespace vs
