// Python bindings of the upsampling kernels.
#include <nanobind/stl/tuple.h>

#include <tuple>

#include "bindings.h"

namespace nb = nanobind;

namespace vs {

namespace {
UpsampleArgs upsample_args(nb::handle src, nb::handle dst, bool align_corners,
                           std::tuple<double, double, double> scales, int threads) {
  UpsampleArgs a;
  a.src = strided(src);
  a.dst = strided(dst);
  a.align_corners = align_corners;
  a.scales[0] = std::get<0>(scales);
  a.scales[1] = std::get<1>(scales);
  a.scales[2] = std::get<2>(scales);
  a.threads = threads;
  return a;
}
}  // namespace

void bind_upsample(nb::module_& m) {
  m.def(
      "upsample_forward",
      [](nb::handle src, nb::handle dst, bool align_corners,
         std::tuple<double, double, double> scales, int threads) {
        const UpsampleArgs a = upsample_args(src, dst, align_corners, scales, threads);
        nb::gil_scoped_release release;
        active_kernels().upsample_forward(a);
      },
      nb::arg("src"), nb::arg("dst"), nb::arg("align_corners"), nb::arg("scales"),
      nb::arg("threads"));
  m.def(
      "upsample_backward",
      [](nb::handle src, nb::handle dst, bool align_corners,
         std::tuple<double, double, double> scales, int threads) {
        const UpsampleArgs a = upsample_args(src, dst, align_corners, scales, threads);
        nb::gil_scoped_release release;
        active_kernels().upsample_backward(a);
      },
      nb::arg("src"), nb::arg("dst"), nb::arg("align_corners"), nb::arg("scales"),
      nb::arg("threads"));
}

}  // namespace vs
