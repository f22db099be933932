// Python bindings of the upsampling kernels, their workspace and their per-axis maps.
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>

#include <tuple>
#include <vector>

#include "bindings.h"

namespace nb = nanobind;

namespace vs {

namespace {
using Scales = std::tuple<double, double, double>;
using Shape = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;
using Window = std::tuple<int64_t, int64_t, int64_t>;

UpsampleArgs upsample_args(nb::handle src, nb::handle dst, bool channels_last,
                           bool align_corners, Scales scales, int threads) {
  UpsampleArgs a;
  a.src = strided(src);
  a.dst = strided(dst);
  if (a.src.ndim != 5 || a.dst.ndim != 5)
    throw std::invalid_argument("upsample: src and dst must be 5-d");
  a.channels_last = channels_last;
  a.align_corners = align_corners;
  a.scales[0] = std::get<0>(scales);
  a.scales[1] = std::get<1>(scales);
  a.scales[2] = std::get<2>(scales);
  a.threads = threads;
  return a;
}

// The kernel table's `kernel` run on a prepared call placed on the memory at src and dst.
void run_prepared(void (*KernelTable::*kernel)(const UpsampleArgs&), const UpsampleArgs& prepared,
                  uintptr_t src, uintptr_t dst) {
  UpsampleArgs a = prepared;
  place(a.src, src);
  place(a.dst, dst);
  nb::gil_scoped_release release;
  (active_kernels().*kernel)(a);
}

void unpack(const Shape& s, int64_t* out) {
  out[0] = std::get<0>(s), out[1] = std::get<1>(s), out[2] = std::get<2>(s);
  out[3] = std::get<3>(s), out[4] = std::get<4>(s);
}

template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(std::vector<T>&& values) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(owned->data(), {owned->size()}, owner);
}

template <class T>
nb::tuple axis_map_arrays(int64_t in_size, int64_t out_size, bool align_corners, double scale,
                          bool transposed) {
  std::vector<int64_t> starts, index;
  std::vector<T> weight;
  scalar::upsample_axis_map(in_size, out_size, align_corners, scale, transposed, starts, index,
                            weight);
  return nb::make_tuple(to_numpy(std::move(starts)), to_numpy(std::move(index)),
                        to_numpy(std::move(weight)));
}
}  // namespace

void bind_upsample(nb::module_& m) {
  m.def(
      "upsample_forward",
      [](nb::handle src, nb::handle dst, bool channels_last, bool align_corners, Scales scales,
         int threads) {
        const UpsampleArgs a = upsample_args(src, dst, channels_last, align_corners, scales, threads);
        nb::gil_scoped_release release;
        active_kernels().upsample_forward(a);
      },
      nb::arg("src"), nb::arg("dst"), nb::arg("channels_last"), nb::arg("align_corners"),
      nb::arg("scales"), nb::arg("threads"));
  m.def(
      "upsample_backward",
      [](nb::handle src, nb::handle dst, bool channels_last, bool align_corners, Scales scales,
         int threads) {
        const UpsampleArgs a = upsample_args(src, dst, channels_last, align_corners, scales, threads);
        nb::gil_scoped_release release;
        active_kernels().upsample_backward(a);
      },
      nb::arg("src"), nb::arg("dst"), nb::arg("channels_last"), nb::arg("align_corners"),
      nb::arg("scales"), nb::arg("threads"));
  // A window of the forward's output (UpsampleArgs): `forward` into it, or with `backward`
  // from its gradient.
  m.def(
      "upsample_window",
      [](nb::handle src, nb::handle dst, bool channels_last, bool align_corners, Scales scales,
         int threads, Window first, Window full, bool backward) {
        UpsampleArgs a = upsample_args(src, dst, channels_last, align_corners, scales, threads);
        const Strided& window = backward ? a.src : a.dst;
        const int64_t f[3] = {std::get<0>(first), std::get<1>(first), std::get<2>(first)};
        const int64_t n[3] = {std::get<0>(full), std::get<1>(full), std::get<2>(full)};
        for (int k = 0; k < 3; ++k) {
          if (f[k] < 0 || n[k] < 1 || f[k] + window.shape[k + 2] > n[k])
            throw std::invalid_argument("upsample_window: the window must lie in the output");
          a.window_first[k] = f[k];
          a.window_full[k] = n[k];
        }
        nb::gil_scoped_release release;
        if (backward)
          active_kernels().upsample_backward(a);
        else
          active_kernels().upsample_forward(a);
      },
      nb::arg("src"), nb::arg("dst"), nb::arg("channels_last"), nb::arg("align_corners"),
      nb::arg("scales"), nb::arg("threads"), nb::arg("first"), nb::arg("full"),
      nb::arg("backward"));
  // A call's source and destination without their memory (as PreparedGridSample): each
  // run is handed only the addresses.
  nb::class_<UpsampleArgs>(m, "PreparedUpsample")
      .def(
          "__init__",
          [](UpsampleArgs* a, nb::handle src, nb::handle dst, bool channels_last,
             bool align_corners, Scales scales, int threads) {
            new (a) UpsampleArgs(upsample_args(src, dst, channels_last, align_corners, scales,
                                               threads));
          },
          nb::arg("src"), nb::arg("dst"), nb::arg("channels_last"), nb::arg("align_corners"),
          nb::arg("scales"), nb::arg("threads"))
      .def(
          "forward",
          [](const UpsampleArgs& prepared, uintptr_t src, uintptr_t dst) {
            run_prepared(&KernelTable::upsample_forward, prepared, src, dst);
          },
          nb::arg("src"), nb::arg("dst"), "The forward map from src into dst, at these addresses.")
      .def(
          "backward",
          [](const UpsampleArgs& prepared, uintptr_t src, uintptr_t dst) {
            run_prepared(&KernelTable::upsample_backward, prepared, src, dst);
          },
          nb::arg("src"), nb::arg("dst"), "The adjoint map from src into dst, at these addresses.")
      .def(
          "forward_on",
          [](const UpsampleArgs& prepared, nb::handle src, nb::handle dst) {
            run_prepared(&KernelTable::upsample_forward, prepared, address(src), address(dst));
          },
          nb::arg("src"), nb::arg("dst"),
          "The forward map on the memory of these arrays, of the prepared shapes, strides and "
          "dtypes in any axis order (only their addresses are read).")
      .def(
          "backward_on",
          [](const UpsampleArgs& prepared, nb::handle src, nb::handle dst) {
            run_prepared(&KernelTable::upsample_backward, prepared, address(src), address(dst));
          },
          nb::arg("src"), nb::arg("dst"), "The adjoint map on the memory of these arrays.");
  m.def(
      "upsample_workspace_nbytes",
      [](Shape src_shape, Shape dst_shape, bool double_precision, bool channels_last,
         bool align_corners, Scales scales, int threads, bool transposed) {
        int64_t src[5], dst[5];
        unpack(src_shape, src);
        unpack(dst_shape, dst);
        const double s[3] = {std::get<0>(scales), std::get<1>(scales), std::get<2>(scales)};
        return scalar::upsample_workspace_nbytes(src, dst, double_precision, channels_last,
                                                 align_corners, s, threads, transposed);
      },
      nb::arg("src_shape"), nb::arg("dst_shape"), nb::arg("double_precision"),
      nb::arg("channels_last"), nb::arg("align_corners"), nb::arg("scales"), nb::arg("threads"),
      nb::arg("transposed"),
      "Bytes one upsample pass allocates beyond its result (tables and per-thread scratch).");
  m.def(
      "upsample_axis_map",
      [](int64_t in_size, int64_t out_size, bool align_corners, double scale,
         bool double_precision, bool transposed) {
        return double_precision
                   ? axis_map_arrays<double>(in_size, out_size, align_corners, scale, transposed)
                   : axis_map_arrays<float>(in_size, out_size, align_corners, scale, transposed);
      },
      nb::arg("in_size"), nb::arg("out_size"), nb::arg("align_corners"), nb::arg("scale"),
      nb::arg("double_precision"), nb::arg("transposed"),
      "One axis's forward map (or its transpose) in CSR form: (starts, index, weight).");
}

}  // namespace vs
