// volsample._cpu._kernels: the bindings of the C++ CPU core.
//
// Python hands over NumPy arrays (or anything nanobind's ndarray takes: DLPack tensors
// too), already checked and in logical (N, C, D, H, W) order; bfloat16 arrives as its
// uint16 bits. The bindings turn them into plain Strided views, release the GIL and call
// the kernel table of the ISA in use.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels.h"
#include "team.h"

namespace nb = nanobind;

namespace vs {
namespace {

struct IsaEntry {
  const char* name;
  const KernelTable& (*table)();
  bool (*supported)();
};

bool always() { return true; }
#if defined(__x86_64__)
bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
}
bool has_avx512() {
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}
#endif

// Built variants, in order of preference (best last).
const std::vector<IsaEntry>& built_isas() {
  static const std::vector<IsaEntry> isas = {
      {"scalar", scalar::kernel_table, always},
#if defined(__x86_64__)
      {"avx2", avx2::kernel_table, has_avx2},
      {"avx512", avx512::kernel_table, has_avx512},
#endif
  };
  return isas;
}

const KernelTable* active = nullptr;

void select_isa(const std::string& name) {
  for (const auto& entry : built_isas()) {
    if (name != entry.name) continue;
    if (!entry.supported())
      throw std::invalid_argument("VOLSAMPLE_CPU_ISA / set_isa: this CPU lacks '" + name + "'");
    active = &entry.table();
    return;
  }
  std::string known;
  for (const auto& entry : built_isas()) known += std::string(known.empty() ? "" : ", ") + entry.name;
  throw std::invalid_argument("VOLSAMPLE_CPU_ISA / set_isa: expected one of " + known + ", got '" +
                              name + "'");
}

std::string best_isa() {
  std::string best = "scalar";
  for (const auto& entry : built_isas())
    if (entry.supported()) best = entry.name;
  return best;
}

std::vector<std::string> supported_isas() {
  std::vector<std::string> names;
  for (const auto& entry : built_isas())
    if (entry.supported()) names.push_back(entry.name);
  return names;
}

DType dtype_of(const nb::dlpack::dtype& t) {
  using code = nb::dlpack::dtype_code;
  const auto c = static_cast<code>(t.code);
  if (t.lanes == 1) {
    if (c == code::Float && t.bits == 16) return DType::float16;
    if (c == code::Float && t.bits == 32) return DType::float32;
    if (c == code::Float && t.bits == 64) return DType::float64;
    if (c == code::Bfloat && t.bits == 16) return DType::bfloat16;
    if (c == code::UInt && t.bits == 16) return DType::bfloat16;  // NumPy's view of bfloat16
    if (c == code::UInt && t.bits == 8) return DType::uint8;
    if (c == code::Int && t.bits == 16) return DType::int16;
    if (c == code::Int && t.bits == 32) return DType::int32;
  }
  throw std::invalid_argument("volsample._cpu: unsupported array dtype");
}

}  // namespace

const KernelTable& active_kernels() { return *active; }

// A kernel operand: an ndarray's memory as a Strided view (None: an absent operand).
Strided strided(const nb::handle& obj) {
  Strided s;
  if (obj.is_none()) return s;
  // Read-only arrays are taken too: the Python layer only ever passes writable outputs.
  auto arr = nb::cast<nb::ndarray<nb::ro, nb::device::cpu>>(obj);
  if (arr.ndim() > 5) throw std::invalid_argument("volsample._cpu: arrays have at most 5 axes");
  s.data = const_cast<void*>(arr.data());
  s.dtype = dtype_of(arr.dtype());
  s.ndim = int(arr.ndim());
  for (int k = 0; k < s.ndim; ++k) {
    s.shape[k] = int64_t(arr.shape(k));
    s.stride[k] = int64_t(arr.stride(k));
  }
  return s;
}

void bind_grid_sample(nb::module_& m);
void bind_upsample(nb::module_& m);
void bind_warp(nb::module_& m);
void bind_local_ncc(nb::module_& m);
void bind_mutual_information(nb::module_& m);
#ifdef VOLSAMPLE_JAX_FFI
void bind_jax(nb::module_& m);  // bind_jax.cpp: only where the build found XLA's FFI headers
#endif

}  // namespace vs

NB_MODULE(_kernels, m) {
  m.doc() = "volsample's compiled CPU kernels (internal; use the volsample package)";
  const char* forced = std::getenv("VOLSAMPLE_CPU_ISA");
  vs::select_isa(forced && *forced ? forced : vs::best_isa());

  m.def("isa", [] { return std::string(vs::active_kernels().isa); },
        "The instruction set whose kernels run now.");
  m.def("set_isa", &vs::select_isa, nb::arg("name"),
        "Run the kernels of one instruction set (a name from supported_isas()).");
  m.def("supported_isas", &vs::supported_isas,
        "The instruction sets built into this module that this CPU can run.");
  m.def("max_threads", [] { return omp_get_max_threads(); },
        "OpenMP's default thread count (the machine's cores unless OMP_NUM_THREADS).");
  m.def(
      "team_cpus",
      [](int threads) {
        threads = std::max(threads, 1);  // OpenMP takes no team of fewer
        std::vector<int> cpus(size_t(threads), -1);
        vs::TeamCpus team(threads);
#pragma omp parallel num_threads(threads)
        {
          team.settle(omp_get_thread_num());
          cpus[size_t(omp_get_thread_num())] = vs::current_cpu();
        }
        return cpus;
      },
      nb::arg("threads"),
      "The CPU each thread of a parallel region of `threads` runs on once settled (team.h; "
      "-1 where unknown): for the tests and benchmarks/busy_core.py.");
  // The kernels' integer codes of the sampling modes (tensor.h), for Python's tables to be
  // checked against.
  nb::dict modes, paddings;
  modes["bilinear"] = int(vs::BILINEAR);
  modes["nearest"] = int(vs::NEAREST);
  modes["bicubic"] = int(vs::BICUBIC);
  modes["bspline"] = int(vs::BSPLINE);
  paddings["zeros"] = int(vs::ZEROS);
  paddings["border"] = int(vs::BORDER);
  paddings["reflection"] = int(vs::REFLECTION);
  m.attr("MODES") = modes;
  m.attr("PADDINGS") = paddings;
  vs::bind_grid_sample(m);
  vs::bind_upsample(m);
  vs::bind_warp(m);
  vs::bind_local_ncc(m);
  vs::bind_mutual_information(m);
#ifdef VOLSAMPLE_JAX_FFI
  vs::bind_jax(m);
#endif
}
