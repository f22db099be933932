// The kernel table: one per instruction set the extension was built for. The kernel
// sources are compiled once per ISA with VS_ISA naming the namespace they land in
// (vs::scalar, vs::avx2, vs::avx512); the module picks one table at run time.
#pragma once

#include "grid_sample.h"
#include "local_ncc.h"
#include "mutual_information.h"
#include "upsample.h"

namespace vs {

struct KernelTable {
  const char* isa;
  void (*grid_sample_forward)(const GridSampleArgs&);
  void (*grid_sample_backward)(const GridSampleArgs&);
  void (*upsample_forward)(const UpsampleArgs&);
  void (*upsample_backward)(const UpsampleArgs&);
  std::vector<int64_t> (*grid_sample_backward_slabs)(const GridSampleArgs&);
  void (*warp_forward)(const WarpArgs&);
  void (*warp_backward)(const WarpArgs&);
  void (*box_sum)(const BoxSumArgs&);
  double (*local_ncc)(const LocalNccArgs&);
  void (*varying)(const VaryingArgs&);
  double (*mutual_information)(const MutualInformationArgs&);
};

namespace scalar { const KernelTable& kernel_table(); }
namespace avx2 { const KernelTable& kernel_table(); }
namespace avx512 { const KernelTable& kernel_table(); }

// The table in use (set by the module from the CPU's features or VOLSAMPLE_CPU_ISA).
const KernelTable& active_kernels();

}  // namespace vs
