// Python bindings of the grid-sampling kernels.
#include <nanobind/stl/vector.h>

#include <cstdint>

#include "bindings.h"

namespace nb = nanobind;

namespace vs {
namespace {

void run_forward(const GridSampleArgs& prepared, uintptr_t input, uintptr_t grid,
                 uintptr_t output) {
  GridSampleArgs a = prepared;
  place(a.input, input);
  place(a.grid, grid);
  place(a.output, output);
  nb::gil_scoped_release release;
  active_kernels().grid_sample_forward(a);
}

void run_backward(const GridSampleArgs& prepared, uintptr_t grad_output, uintptr_t input,
                  uintptr_t grid, uintptr_t grad_input, uintptr_t grad_grid) {
  GridSampleArgs a = prepared;
  place(a.grad_output, grad_output);
  place(a.input, input);
  place(a.grid, grid);
  place(a.grad_input, grad_input);
  place(a.grad_grid, grad_grid);
  nb::gil_scoped_release release;
  active_kernels().grid_sample_backward(a);
}

}  // namespace

void bind_grid_sample(nb::module_& m) {
  m.def(
      "grid_sample_forward",
      [](nb::handle input, nb::handle grid, nb::handle output, int mode, int padding,
         bool align_corners, int threads) {
        GridSampleArgs a;
        a.input = strided(input);
        a.grid = strided(grid);
        a.output = strided(output);
        a.mode = mode;
        a.padding = padding;
        a.align_corners = align_corners;
        a.threads = threads;
        nb::gil_scoped_release release;
        active_kernels().grid_sample_forward(a);
      },
      nb::arg("input"), nb::arg("grid"), nb::arg("output"), nb::arg("mode"), nb::arg("padding"),
      nb::arg("align_corners"), nb::arg("threads"));
  m.def(
      "grid_sample_backward",
      [](nb::handle grad_output, nb::handle input, nb::handle grid, nb::handle grad_input,
         nb::handle grad_grid, int mode, int padding, bool align_corners, int threads) {
        GridSampleArgs a;
        a.grad_output = strided(grad_output);
        a.input = strided(input);
        a.grid = strided(grid);
        a.grad_input = strided(grad_input);
        a.grad_grid = strided(grad_grid);
        a.mode = mode;
        a.padding = padding;
        a.align_corners = align_corners;
        a.threads = threads;
        nb::gil_scoped_release release;
        active_kernels().grid_sample_backward(a);
      },
      nb::arg("grad_output"), nb::arg("input"), nb::arg("grid"), nb::arg("grad_input").none(),
      nb::arg("grad_grid").none(), nb::arg("mode"), nb::arg("padding"), nb::arg("align_corners"),
      nb::arg("threads"));
  m.def(
      "grid_sample_backward_slabs",
      [](nb::handle input, nb::handle grid, bool want_grid, int mode, int padding,
         bool align_corners, int threads) {
        GridSampleArgs a;
        a.input = strided(input);
        a.grid = strided(grid);
        a.grad_input = a.input;  // only its presence matters: the plan reads no memory of it
        if (want_grid) a.grad_grid = a.grid;
        a.mode = mode;
        a.padding = padding;
        a.align_corners = align_corners;
        a.threads = threads;
        return active_kernels().grid_sample_backward_slabs(a);
      },
      nb::arg("input"), nb::arg("grid"), nb::arg("want_grid"), nb::arg("mode"), nb::arg("padding"),
      nb::arg("align_corners"), nb::arg("threads"),
      "Bounds [0, ..., N*D] of the slabs of input planes the input gradient is split into.");

  // A call's operands without their memory (shapes, strides, dtypes), its modes and
  // threads, taken once from arrays; each run is handed only the operands' addresses. A
  // front door that meets the same call again launches it with no arrays made per call.
  nb::class_<GridSampleArgs>(m, "PreparedGridSample")
      .def(
          "__init__",
          [](GridSampleArgs* a, nb::handle input, nb::handle grid, nb::handle output,
             nb::handle grad_output, nb::handle grad_input, nb::handle grad_grid, int mode,
             int padding, bool align_corners, int threads) {
            new (a) GridSampleArgs();
            a->input = strided(input);
            a->grid = strided(grid);
            a->output = strided(output);
            a->grad_output = strided(grad_output);
            a->grad_input = strided(grad_input);
            a->grad_grid = strided(grad_grid);
            a->mode = mode;
            a->padding = padding;
            a->align_corners = align_corners;
            a->threads = threads;
          },
          nb::arg("input"), nb::arg("grid"), nb::arg("output").none(),
          nb::arg("grad_output").none(), nb::arg("grad_input").none(),
          nb::arg("grad_grid").none(), nb::arg("mode"), nb::arg("padding"),
          nb::arg("align_corners"), nb::arg("threads"))
      .def("forward", &run_forward, nb::arg("input"), nb::arg("grid"), nb::arg("output"),
           "The forward on operands at these addresses (the prepared shapes and strides).")
      .def(
          "forward_on",
          [](const GridSampleArgs& prepared, nb::handle input, nb::handle grid,
             nb::handle output) {
            run_forward(prepared, address(input), address(grid), address(output));
          },
          nb::arg("input"), nb::arg("grid"), nb::arg("output"),
          "The forward on the memory of these arrays, of the prepared shapes, strides and "
          "dtypes in any axis order (only their addresses are read).")
      .def("backward", &run_backward, nb::arg("grad_output"), nb::arg("input"), nb::arg("grid"),
           nb::arg("grad_input"), nb::arg("grad_grid"),
           "The backward into the gradients at these addresses (0: one not prepared), which "
           "it writes whole.")
      .def(
          "backward_on",
          [](const GridSampleArgs& prepared, nb::handle grad_output, nb::handle input,
             nb::handle grid, nb::handle grad_input, nb::handle grad_grid) {
            run_backward(prepared, address(grad_output), address(input), address(grid),
                         address(grad_input), address(grad_grid));
          },
          nb::arg("grad_output"), nb::arg("input"), nb::arg("grid"),
          nb::arg("grad_input").none(), nb::arg("grad_grid").none(),
          "The backward on the memory of these arrays (None: a gradient not prepared), as "
          "forward_on and backward.");
}

}  // namespace vs
