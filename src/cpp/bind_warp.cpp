// Python bindings of the warp kernels: grid sampling at affine_grid(theta) + displacement,
// the grid never stored.
#include <nanobind/stl/array.h>

#include <array>

#include "bindings.h"

namespace nb = nanobind;

namespace vs {
namespace {

// The call's operands; its virtual grid takes the output's size and theta's dtype.
WarpArgs warp_args(nb::handle input, nb::handle theta, nb::handle displacement,
                   const Strided& output, int mode, int padding, bool align_corners,
                   const std::array<double, 3>& scale, int threads) {
  WarpArgs w;
  GridSampleArgs& a = w.sample;
  a.input = strided(input);
  w.theta = strided(theta);
  w.displacement = strided(displacement);
  a.grid.dtype = w.theta.dtype;
  a.grid.ndim = 5;
  const int64_t shape[5] = {output.shape[0], output.shape[2], output.shape[3], output.shape[4], 3};
  std::copy(shape, shape + 5, a.grid.shape);
  a.mode = mode;
  a.padding = padding;
  a.align_corners = align_corners;
  a.threads = threads;
  std::copy(scale.begin(), scale.end(), w.scale);
  return w;
}

}  // namespace

void bind_warp(nb::module_& m) {
  m.def(
      "warp_forward",
      [](nb::handle input, nb::handle theta, nb::handle displacement, nb::handle output,
         int mode, int padding, bool align_corners, std::array<double, 3> scale, int threads) {
        const Strided out = strided(output);
        WarpArgs w = warp_args(input, theta, displacement, out, mode, padding, align_corners,
                               scale, threads);
        w.sample.output = out;
        nb::gil_scoped_release release;
        active_kernels().warp_forward(w);
      },
      nb::arg("input"), nb::arg("theta"), nb::arg("displacement").none(), nb::arg("output"),
      nb::arg("mode"), nb::arg("padding"), nb::arg("align_corners"), nb::arg("scale"),
      nb::arg("threads"));
  m.def(
      "warp_backward",
      [](nb::handle grad_output, nb::handle input, nb::handle theta, nb::handle displacement,
         nb::handle grad_input, nb::handle grad_theta, nb::handle grad_displacement, int mode,
         int padding, bool align_corners, std::array<double, 3> scale, int threads) {
        const Strided gout = strided(grad_output);
        WarpArgs w = warp_args(input, theta, displacement, gout, mode, padding, align_corners,
                               scale, threads);
        w.sample.grad_output = gout;
        w.sample.grad_input = strided(grad_input);
        w.grad_theta = strided(grad_theta);
        w.grad_displacement = strided(grad_displacement);
        nb::gil_scoped_release release;
        active_kernels().warp_backward(w);
      },
      nb::arg("grad_output"), nb::arg("input"), nb::arg("theta"),
      nb::arg("displacement").none(), nb::arg("grad_input").none(),
      nb::arg("grad_theta").none(), nb::arg("grad_displacement").none(), nb::arg("mode"),
      nb::arg("padding"), nb::arg("align_corners"), nb::arg("scale"), nb::arg("threads"));
}

}  // namespace vs
