// Python bindings of the box sums and the local NCC (local_ncc.h), the similarity kernels
// of registration.
#include <stdexcept>
#include <string>

#include "bindings.h"

namespace nb = nanobind;

namespace vs {
namespace {

// A C-contiguous float32 or float64 (D, H, W) volume of `like`'s shape and dtype (any,
// when like is null). The Python layer passes checked arrays; this keeps a slip from
// reading out of bounds.
Strided volume(nb::handle obj, const char* name, const Strided* like = nullptr) {
  Strided s = strided(obj);
  bool ok = (s.dtype == DType::float32 || s.dtype == DType::float64) && s.ndim == 3 &&
            s.stride[2] == 1 && s.stride[1] == s.shape[2] && s.stride[0] == s.shape[1] * s.shape[2];
  for (int k = 0; ok && like && k < 3; ++k) ok = s.shape[k] == like->shape[k];
  if (ok && like) ok = s.dtype == like->dtype;
  if (!ok)
    throw std::invalid_argument(std::string("local_ncc: ") + name +
                                " must be a C-contiguous float32 or float64 (D, H, W) volume, "
                                "of the first volume's shape and dtype");
  return s;
}

}  // namespace

void bind_local_ncc(nb::module_& m) {
  m.def(
      "box_sum",
      [](nb::handle input, nb::handle output, int radius, int threads) {
        BoxSumArgs a;
        a.volume = volume(input, "volume");
        a.out = volume(output, "out", &a.volume);
        a.radius = radius;
        a.threads = threads;
        nb::gil_scoped_release release;
        active_kernels().box_sum(a);
      },
      nb::arg("volume"), nb::arg("out"), nb::arg("radius"), nb::arg("threads"));
  m.def(
      "local_ncc",
      [](nb::handle fixed, nb::handle fixed_sum, nb::handle fixed_var, nb::handle warped,
         nb::handle work, nb::handle grad, int radius, double eps, double grad_scale,
         int threads) {
        LocalNccArgs a;
        a.fixed = volume(fixed, "fixed");
        a.fixed_sum = volume(fixed_sum, "fixed_sum", &a.fixed);
        a.fixed_var = volume(fixed_var, "fixed_var", &a.fixed);
        a.warped = volume(warped, "warped", &a.fixed);
        a.work = strided(work);
        bool work_ok = a.work.dtype == a.fixed.dtype && a.work.ndim == 4 &&
                       a.work.shape[0] == 3 &&
                       a.work.stride[0] == a.fixed.shape[0] * a.fixed.stride[0];
        for (int k = 0; work_ok && k < 3; ++k)
          work_ok = a.work.shape[k + 1] == a.fixed.shape[k] &&
                    a.work.stride[k + 1] == a.fixed.stride[k];
        if (!work_ok)
          throw std::invalid_argument(
              "local_ncc: work must be a C-contiguous (3, D, H, W) of the fixed volume's "
              "dtype and shape");
        if (!grad.is_none()) a.grad = volume(grad, "grad", &a.fixed);
        a.radius = radius;
        a.eps = eps;
        a.grad_scale = grad_scale;
        a.threads = threads;
        nb::gil_scoped_release release;
        return active_kernels().local_ncc(a);
      },
      nb::arg("fixed"), nb::arg("fixed_sum"), nb::arg("fixed_var"), nb::arg("warped"),
      nb::arg("work"), nb::arg("grad").none(), nb::arg("radius"), nb::arg("eps"),
      nb::arg("grad_scale"), nb::arg("threads"));
  m.def(
      "varying",
      [](nb::handle input, nb::handle rows, nb::handle columns, int threads) {
        VaryingArgs a;
        a.volume = volume(input, "volume");
        a.rows = strided(rows);
        a.columns = strided(columns);
        auto plane_of = [&](const Strided& p, int64_t n) {  // C-contiguous (D, n) uint8
          return p.dtype == DType::uint8 && p.ndim == 2 && p.shape[0] == a.volume.shape[0] &&
                 p.shape[1] == n && p.stride[1] == 1 && p.stride[0] == n;
        };
        if (!plane_of(a.rows, a.volume.shape[1]) || !plane_of(a.columns, a.volume.shape[2]))
          throw std::invalid_argument(
              "varying: rows and columns must be C-contiguous uint8 (D, H) and (D, W)");
        a.threads = threads;
        nb::gil_scoped_release release;
        active_kernels().varying(a);
      },
      nb::arg("volume"), nb::arg("rows"), nb::arg("columns"), nb::arg("threads"));
}

}  // namespace vs
