// This ISA's kernel table (compiled once per ISA, like the kernels it lists).
#include "kernels.h"

namespace vs {
namespace VS_ISA {

#define VS_STRINGIFY2(x) #x
#define VS_STRINGIFY(x) VS_STRINGIFY2(x)

const KernelTable& kernel_table() {
  static const KernelTable table{VS_STRINGIFY(VS_ISA), grid_sample_forward,
                                 grid_sample_backward, upsample_forward, upsample_backward,
                                 grid_sample_backward_slabs, warp_forward, warp_backward,
                                 box_sum, local_ncc, varying, mutual_information};
  return table;
}

}  // namespace VS_ISA
}  // namespace vs
