// Python binding of the mutual information (mutual_information.h), the cross-contrast
// similarity of registration.
#include <cmath>
#include <stdexcept>
#include <string>

#include "bindings.h"

namespace nb = nanobind;

namespace vs {
namespace {

// A C-contiguous (D, H, W) volume of one of `dtypes` (and of `like`'s shape and dtype, when
// given). The Python layer passes checked arrays; this keeps a slip from reading out of
// bounds.
Strided volume(nb::handle obj, const char* name, bool bins, const Strided* like = nullptr) {
  Strided s = strided(obj);
  bool ok = (bins ? s.dtype == DType::uint8
                  : s.dtype == DType::float32 || s.dtype == DType::float64) &&
            s.ndim == 3 && s.stride[2] == 1 && s.stride[1] == s.shape[2] &&
            s.stride[0] == s.shape[1] * s.shape[2];
  for (int k = 0; ok && like && k < 3; ++k) ok = s.shape[k] == like->shape[k];
  if (ok && like && !bins) ok = s.dtype == like->dtype;
  if (!ok)
    throw std::invalid_argument(std::string("mutual_information: ") + name + " must be a " +
                                (bins ? "C-contiguous uint8 (D, H, W) volume"
                                      : "C-contiguous float32 or float64 (D, H, W) volume") +
                                (like ? ", of warped's shape" : ""));
  return s;
}

}  // namespace

void bind_mutual_information(nb::module_& m) {
  m.def(
      "mutual_information",
      [](nb::handle fixed_bins, nb::handle warped, nb::handle grad, int bins, double low,
         double high, double grad_scale, int threads) {
        MutualInformationArgs a;
        a.warped = volume(warped, "warped", false);
        a.fixed_bins = volume(fixed_bins, "fixed_bins", true, &a.warped);
        if (!grad.is_none()) a.grad = volume(grad, "grad", false, &a.warped);
        if (bins < 5 || bins > 255)
          throw std::invalid_argument("mutual_information: bins must be in [5, 255], got " +
                                      std::to_string(bins));
        if (!(std::isfinite(low) && std::isfinite(high) && low < high))
          throw std::invalid_argument(
              "mutual_information: low and high must be finite, low < high");
        a.bins = bins;
        a.low = low;
        a.high = high;
        a.grad_scale = grad_scale;
        a.threads = threads;
        nb::gil_scoped_release release;
        return active_kernels().mutual_information(a);
      },
      nb::arg("fixed_bins"), nb::arg("warped"), nb::arg("grad").none(), nb::arg("bins"),
      nb::arg("low"), nb::arg("high"), nb::arg("grad_scale"), nb::arg("threads"));
}

}  // namespace vs
