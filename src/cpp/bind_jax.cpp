// XLA FFI handlers of the kernels, for volsample.jax: the kernel table of the ISA in use run
// on XLA's buffers, inside compiled JAX programs, with no copy and no Python.
//
// Compiled only where the build found the XLA FFI headers (jaxlib's, `jax.ffi.include_dir()`;
// VOLSAMPLE_JAX_FFI). The module hands the handlers to Python as capsules
// (`_kernels.ffi_targets()`), which volsample.jax registers with `jax.ffi`.
//
// The Python door checks every call (`_calls`) when JAX traces it; a handler trusts its
// buffers' shapes and dtypes. XLA's buffers are dense and row-major: a volume is physical
// (N, C, D, H, W), or (N, D, H, W, C) when channels_last, and the handlers view it in the
// kernels' logical order. The door folds vmap's batch axes into N before it calls, so every
// buffer has the operator's own rank.
#include <nanobind/nanobind.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "xla/ffi/api/ffi.h"

// The kernels' 16-bit storage conversions, for the spline prefilter's one rounding (in a
// namespace of this file's own: they are inline, and no ISA shares a copy with the module).
#define VS_ISA jax_handlers
#include "dtypes.h"
#undef VS_ISA

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace vs {
namespace {

// The thread count of volsample.set_num_threads and the work per thread below which a
// launch takes fewer threads (volsample._cpu.threads_for), handed over by set_ffi_threads.
std::atomic<int> team_threads{1};
std::atomic<int64_t> min_work_per_thread{1 << 15};

int threads_for(int64_t work) {
  return int(std::max<int64_t>(
      1, std::min<int64_t>(team_threads.load(), work / min_work_per_thread.load())));
}

DType dtype_of(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F16: return DType::float16;
    case ffi::DataType::BF16: return DType::bfloat16;
    case ffi::DataType::F32: return DType::float32;
    case ffi::DataType::F64: return DType::float64;
    default: throw std::invalid_argument("volsample.jax: unsupported buffer dtype");
  }
}

// A dense row-major buffer as a Strided view of its own axes.
Strided dense(void* data, ffi::DataType type, ffi::Span<const int64_t> dims) {
  Strided s;
  s.data = data;
  s.dtype = dtype_of(type);
  s.ndim = int(dims.size());
  int64_t step = 1;
  for (int k = s.ndim - 1; k >= 0; --k) {
    s.shape[k] = dims[k];
    s.stride[k] = step;
    step *= dims[k];
  }
  return s;
}

Strided dense(const ffi::AnyBuffer& b) {
  return dense(b.untyped_data(), b.element_type(), b.dimensions());
}

Strided dense(ffi::Result<ffi::AnyBuffer>& b) {
  return dense(b->untyped_data(), b->element_type(), b->dimensions());
}

// A volume's buffer in the kernels' logical (N, C, D, H, W) order (an absent one as it is).
Strided volume(Strided s, bool channels_last) {
  if (!channels_last || s.ndim != 5) return s;
  const int64_t shape[5] = {s.shape[0], s.shape[4], s.shape[1], s.shape[2], s.shape[3]};
  const int64_t stride[5] = {s.stride[0], s.stride[4], s.stride[1], s.stride[2], s.stride[3]};
  std::copy(shape, shape + 5, s.shape);
  std::copy(stride, stride + 5, s.stride);
  return s;
}

// An absent operand, or a result not asked for (the door declares it of no elements).
Strided present(Strided s) {
  for (int k = 0; k < s.ndim; ++k)
    if (s.shape[k] == 0) return Strided();
  return s;
}

// The input of a backward asked for grad_input alone, which reads none of its values: the
// door passes it absent (of the input's dtype), and the kernel takes its shape and strides
// from grad_input's.
Strided input_or_shape(const ffi::AnyBuffer& input, const Strided& grad_input,
                       bool channels_last) {
  Strided s = present(volume(dense(input), channels_last));
  if (!s.empty() || grad_input.empty()) return s;
  s = grad_input;
  s.dtype = dtype_of(input.element_type());
  return s;
}

int64_t count(const Strided& s) {
  int64_t n = 1;
  for (int k = 0; k < s.ndim; ++k) n *= s.shape[k];
  return n;
}

// Point-shaped views (N, Do, Ho, Wo, ...) whose (Ho, Wo) plane is one row, for a call on
// one thread: each output row costs the kernels a setup and a partly filled last vector
// (volsample._cpu.grid_sample._planes_as_rows; the points keep their order, and so the
// bits). `grid_like` are grids (N, Do, Ho, Wo, 3), `volumes` logical (N, C, Do, Ho, Wo).
void planes_as_rows(std::initializer_list<Strided*> grid_like,
                    std::initializer_list<Strided*> volumes) {
  for (Strided* g : grid_like)
    if (!g->empty() && g->stride[2] != g->stride[3] * g->shape[3]) return;
  for (Strided* v : volumes)
    if (!v->empty() && v->stride[3] != v->stride[4] * v->shape[4]) return;
  for (Strided* g : grid_like) {
    if (g->empty()) continue;
    g->shape[3] *= g->shape[2];
    g->shape[2] = 1;
  }
  for (Strided* v : volumes) {
    if (v->empty()) continue;
    v->shape[4] *= v->shape[3];
    v->shape[3] = 1;
  }
}

// Results of XLA's allocator on huge pages where the kernel is the first to touch them, as
// NumPy's allocator advises its large arrays: 4 KiB pages cost an OASIS volume's forward
// tens of milliseconds of page faults. A hint: its failure changes nothing.
void advise_huge_pages(ffi::Result<ffi::AnyBuffer>& r) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kPage = uintptr_t(1) << 21;
  const auto first = reinterpret_cast<uintptr_t>(r->untyped_data());
  const uintptr_t begin = (first + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = (first + r->size_bytes()) & ~(kPage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)r;
#endif
}

template <class F>
ffi::Error guarded(F&& run) {
  try {
    run();
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error::InvalidArgument(std::string("volsample.jax: ") + e.what());
  }
}

ffi::Error grid_sample_forward(ffi::AnyBuffer input, ffi::AnyBuffer grid,
                               ffi::Result<ffi::AnyBuffer> output, int64_t mode, int64_t padding,
                               bool align_corners, bool channels_last) {
  return guarded([&] {
    GridSampleArgs a;
    a.input = volume(dense(input), channels_last);
    a.grid = dense(grid);
    a.output = volume(dense(output), channels_last);
    if (count(a.output) == 0) return;
    advise_huge_pages(output);
    a.mode = int(mode);
    a.padding = int(padding);
    a.align_corners = align_corners;
    a.threads = threads_for(count(a.output));
    if (a.threads == 1 && a.grid.shape[2] > 1) planes_as_rows({&a.grid}, {&a.output});
    active_kernels().grid_sample_forward(a);
  });
}

// The gradients asked for (the others declared of no elements), written whole; grad_input
// in the compute dtype (the door rounds a 16-bit one once).
ffi::Error grid_sample_backward(ffi::AnyBuffer grad_output, ffi::AnyBuffer input,
                                ffi::AnyBuffer grid, ffi::Result<ffi::AnyBuffer> grad_input,
                                ffi::Result<ffi::AnyBuffer> grad_grid, int64_t mode,
                                int64_t padding, bool align_corners, bool channels_last) {
  return guarded([&] {
    GridSampleArgs a;
    a.grad_output = volume(dense(grad_output), channels_last);
    a.grid = dense(grid);
    a.grad_input = present(volume(dense(grad_input), channels_last));
    a.input = input_or_shape(input, a.grad_input, channels_last);
    a.grad_grid = present(dense(grad_grid));
    a.mode = int(mode);
    a.padding = int(padding);
    a.align_corners = align_corners;
    const int64_t work = count(a.grad_output);
    if (work == 0) {  // no point or no channel: nothing adds into the gradients
      for (auto* r : {&grad_input, &grad_grid})
        std::fill_n(static_cast<char*>((*r)->untyped_data()), (*r)->size_bytes(), 0);
      return;
    }
    advise_huge_pages(grad_input);
    advise_huge_pages(grad_grid);
    a.threads = threads_for(work);
    if (a.threads == 1 && a.grid.shape[2] > 1)
      planes_as_rows({&a.grid, &a.grad_grid}, {&a.grad_output});
    active_kernels().grid_sample_backward(a);
  });
}

// A warp's operands: its virtual grid takes the output's (N, Do, Ho, Wo) and theta's dtype.
WarpArgs warp_args(const ffi::AnyBuffer& input, const ffi::AnyBuffer& theta,
                   const ffi::AnyBuffer& displacement, const Strided& output, int64_t mode,
                   int64_t padding, bool align_corners, bool channels_last, double scale_x,
                   double scale_y, double scale_z) {
  WarpArgs w;
  GridSampleArgs& a = w.sample;
  a.input = volume(dense(input), channels_last);
  w.theta = dense(theta);
  w.displacement = present(dense(displacement));
  a.grid.dtype = w.theta.dtype;
  a.grid.ndim = 5;
  const int64_t shape[5] = {output.shape[0], output.shape[2], output.shape[3], output.shape[4], 3};
  std::copy(shape, shape + 5, a.grid.shape);
  a.mode = int(mode);
  a.padding = int(padding);
  a.align_corners = align_corners;
  w.scale[0] = scale_x;
  w.scale[1] = scale_y;
  w.scale[2] = scale_z;
  return w;
}

ffi::Error warp_forward(ffi::AnyBuffer input, ffi::AnyBuffer theta, ffi::AnyBuffer displacement,
                        ffi::Result<ffi::AnyBuffer> output, int64_t mode, int64_t padding,
                        bool align_corners, bool channels_last, double scale_x, double scale_y,
                        double scale_z) {
  return guarded([&] {
    const Strided out = volume(dense(output), channels_last);
    if (count(out) == 0) return;
    WarpArgs w = warp_args(input, theta, displacement, out, mode, padding, align_corners,
                           channels_last, scale_x, scale_y, scale_z);
    w.sample.output = out;
    advise_huge_pages(output);
    w.sample.threads = threads_for(count(out));
    active_kernels().warp_forward(w);
  });
}

ffi::Error warp_backward(ffi::AnyBuffer grad_output, ffi::AnyBuffer input, ffi::AnyBuffer theta,
                         ffi::AnyBuffer displacement, ffi::Result<ffi::AnyBuffer> grad_input,
                         ffi::Result<ffi::AnyBuffer> grad_theta,
                         ffi::Result<ffi::AnyBuffer> grad_displacement, int64_t mode,
                         int64_t padding, bool align_corners, bool channels_last, double scale_x,
                         double scale_y, double scale_z) {
  return guarded([&] {
    const Strided gout = volume(dense(grad_output), channels_last);
    if (count(gout) == 0) {
      for (auto* r : {&grad_input, &grad_theta, &grad_displacement})
        std::fill_n(static_cast<char*>((*r)->untyped_data()), (*r)->size_bytes(), 0);
      return;
    }
    WarpArgs w = warp_args(input, theta, displacement, gout, mode, padding, align_corners,
                           channels_last, scale_x, scale_y, scale_z);
    w.sample.grad_output = gout;
    w.sample.grad_input = present(volume(dense(grad_input), channels_last));
    w.sample.input = input_or_shape(input, w.sample.grad_input, channels_last);
    w.grad_theta = present(dense(grad_theta));
    w.grad_displacement = present(dense(grad_displacement));
    advise_huge_pages(grad_input);
    advise_huge_pages(grad_displacement);
    w.sample.threads = threads_for(count(gout));
    active_kernels().warp_backward(w);
  });
}

// Upsampling's forward (input -> output) or backward (grad_output -> grad_input).
template <void (*KernelTable::*kernel)(const UpsampleArgs&)>
ffi::Error upsample(ffi::AnyBuffer src, ffi::Result<ffi::AnyBuffer> dst, bool align_corners,
                    bool channels_last, double scale_d, double scale_h, double scale_w) {
  return guarded([&] {
    UpsampleArgs a;
    a.src = volume(dense(src), channels_last);
    a.dst = volume(dense(dst), channels_last);
    if (count(a.dst) == 0) return;
    advise_huge_pages(dst);
    a.channels_last = channels_last;
    a.align_corners = align_corners;
    a.scales[0] = scale_d;
    a.scales[1] = scale_h;
    a.scales[2] = scale_w;
    a.threads = threads_for(std::max(count(a.src), count(a.dst)));
    (active_kernels().*kernel)(a);
  });
}

// The cubic B-spline prefilter (volsample.spline): along D, H and W in turn (the adjoint:
// W, H, D), the tridiagonal solve of Thomas' algorithm on each line, in float64, rounded
// once to the volume's dtype. The bands (below, on, above; divided by 6, the adjoint's
// transposed) come from volsample.spline._system, per axis; every operation is the NumPy
// solve's, in its order, so the bits are its.
void solve_axis(double* x, int64_t outer, int64_t size, int64_t inner,
                ffi::Span<const double> bands) {
  const double* below = bands.begin();
  const double* on = below + size;
  const double* above = on + size;
  std::vector<double> ratio(static_cast<size_t>(size)), pivots(static_cast<size_t>(size));
  pivots[0] = on[0];
  ratio[0] = above[0] / pivots[0];
  for (int64_t i = 1; i < size; ++i) {
    pivots[i] = on[i] - below[i] * ratio[i - 1];
    ratio[i] = above[i] / pivots[i];
  }
  for (int64_t o = 0; o < outer; ++o) {
    double* line = x + o * size * inner;
    for (int64_t k = 0; k < inner; ++k) line[k] = line[k] / pivots[0];
    for (int64_t i = 1; i < size; ++i) {
      double* row = line + i * inner;
      const double* prev = row - inner;
      for (int64_t k = 0; k < inner; ++k) row[k] = (row[k] - below[i] * prev[k]) / pivots[i];
    }
    for (int64_t i = size - 2; i >= 0; --i) {
      double* row = line + i * inner;
      const double* next = row + inner;
      for (int64_t k = 0; k < inner; ++k) row[k] -= ratio[i] * next[k];
    }
  }
}

template <class F>
void visit(const Strided& s, F&& f) {  // every element of a 5-d view, in logical order
  int64_t n = 0;
  for (int64_t a = 0; a < s.shape[0]; ++a)
    for (int64_t b = 0; b < s.shape[1]; ++b)
      for (int64_t c = 0; c < s.shape[2]; ++c)
        for (int64_t d = 0; d < s.shape[3]; ++d)
          for (int64_t e = 0; e < s.shape[4]; ++e)
            f(n++, a * s.stride[0] + b * s.stride[1] + c * s.stride[2] + d * s.stride[3] +
                       e * s.stride[4]);
}

ffi::Error spline_filter(ffi::AnyBuffer values, ffi::Result<ffi::AnyBuffer> out,
                         ffi::Span<const double> bands_d, ffi::Span<const double> bands_h,
                         ffi::Span<const double> bands_w, bool adjoint, bool channels_last) {
  return guarded([&] {
    namespace h = jax_handlers;
    const Strided in = volume(dense(values), channels_last);
    const Strided res = volume(dense(out), channels_last);
    std::vector<double> x(size_t(count(in)));
    switch (in.dtype) {
      case DType::float16:
        visit(in, [&](int64_t n, int64_t at) {
          x[n] = h::half_to_float(static_cast<const uint16_t*>(in.data)[at]);
        });
        break;
      case DType::bfloat16:
        visit(in, [&](int64_t n, int64_t at) {
          x[n] = h::bfloat16_to_float(static_cast<const uint16_t*>(in.data)[at]);
        });
        break;
      case DType::float32:
        visit(in, [&](int64_t n, int64_t at) { x[n] = static_cast<const float*>(in.data)[at]; });
        break;
      default:
        visit(in, [&](int64_t n, int64_t at) { x[n] = static_cast<const double*>(in.data)[at]; });
    }
    const int64_t M = in.shape[0] * in.shape[1], D = in.shape[2], H = in.shape[3],
                  W = in.shape[4];
    const int64_t outer[3] = {M, M * D, M * D * H}, inner[3] = {H * W, W, 1},
                  size[3] = {D, H, W};
    const ffi::Span<const double>* bands[3] = {&bands_d, &bands_h, &bands_w};
    for (int step = 0; step < 3; ++step) {
      const int axis = adjoint ? 2 - step : step;
      solve_axis(x.data(), outer[axis], size[axis], inner[axis], *bands[axis]);
    }
    switch (res.dtype) {
      case DType::float16:
        visit(res, [&](int64_t n, int64_t at) {
          static_cast<uint16_t*>(res.data)[at] = h::double_to_half(x[n]);
        });
        break;
      case DType::bfloat16:  // through float32, as ml_dtypes casts
        visit(res, [&](int64_t n, int64_t at) {
          static_cast<uint16_t*>(res.data)[at] = h::float_to_bfloat16(float(x[n]));
        });
        break;
      case DType::float32:
        visit(res, [&](int64_t n, int64_t at) { static_cast<float*>(res.data)[at] = float(x[n]); });
        break;
      default:
        visit(res, [&](int64_t n, int64_t at) { static_cast<double*>(res.data)[at] = x[n]; });
    }
  });
}

template <class Binding>
auto grid_attrs(Binding b) {
  return std::move(b)
      .template Attr<int64_t>("mode")
      .template Attr<int64_t>("padding")
      .template Attr<bool>("align_corners")
      .template Attr<bool>("channels_last");
}

template <class Binding>
auto scales(Binding b, const char* x, const char* y, const char* z) {
  return std::move(b).template Attr<double>(x).template Attr<double>(y).template Attr<double>(z);
}

XLA_FFI_DEFINE_HANDLER(grid_sample_forward_handler, grid_sample_forward,
                       grid_attrs(ffi::Ffi::Bind()
                                      .Arg<ffi::AnyBuffer>()
                                      .Arg<ffi::AnyBuffer>()
                                      .Ret<ffi::AnyBuffer>()));
XLA_FFI_DEFINE_HANDLER(grid_sample_backward_handler, grid_sample_backward,
                       grid_attrs(ffi::Ffi::Bind()
                                      .Arg<ffi::AnyBuffer>()
                                      .Arg<ffi::AnyBuffer>()
                                      .Arg<ffi::AnyBuffer>()
                                      .Ret<ffi::AnyBuffer>()
                                      .Ret<ffi::AnyBuffer>()));
XLA_FFI_DEFINE_HANDLER(warp_forward_handler, warp_forward,
                       scales(grid_attrs(ffi::Ffi::Bind()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Ret<ffi::AnyBuffer>()),
                              "scale_x", "scale_y", "scale_z"));
XLA_FFI_DEFINE_HANDLER(warp_backward_handler, warp_backward,
                       scales(grid_attrs(ffi::Ffi::Bind()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Ret<ffi::AnyBuffer>()
                                             .Ret<ffi::AnyBuffer>()
                                             .Ret<ffi::AnyBuffer>()),
                              "scale_x", "scale_y", "scale_z"));
// Upsampling's forward and its adjoint take the same binding: one volume in, one out.
auto upsample_binding() {
  return scales(ffi::Ffi::Bind()
                    .Arg<ffi::AnyBuffer>()
                    .Ret<ffi::AnyBuffer>()
                    .Attr<bool>("align_corners")
                    .Attr<bool>("channels_last"),
                "scale_d", "scale_h", "scale_w");
}

XLA_FFI_DEFINE_HANDLER(upsample_forward_handler, upsample<&KernelTable::upsample_forward>,
                       upsample_binding());
XLA_FFI_DEFINE_HANDLER(upsample_backward_handler, upsample<&KernelTable::upsample_backward>,
                       upsample_binding());

XLA_FFI_DEFINE_HANDLER(spline_filter_handler, spline_filter,
                       ffi::Ffi::Bind()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<ffi::Span<const double>>("bands_d")
                           .Attr<ffi::Span<const double>>("bands_h")
                           .Attr<ffi::Span<const double>>("bands_w")
                           .Attr<bool>("adjoint")
                           .Attr<bool>("channels_last"));

}  // namespace

void bind_jax(nb::module_& m) {
  m.def(
      "ffi_targets",
      [] {
        nb::dict targets;
        auto add = [&](const char* name, XLA_FFI_Handler* handler) {
          targets[name] = nb::capsule(reinterpret_cast<void*>(handler), "xla._CUSTOM_CALL_TARGET");
        };
        add("volsample_grid_sample_forward", grid_sample_forward_handler);
        add("volsample_grid_sample_backward", grid_sample_backward_handler);
        add("volsample_warp_forward", warp_forward_handler);
        add("volsample_warp_backward", warp_backward_handler);
        add("volsample_upsample_forward", upsample_forward_handler);
        add("volsample_upsample_backward", upsample_backward_handler);
        add("volsample_spline_filter", spline_filter_handler);
        return targets;
      },
      "The XLA FFI handlers (name -> capsule) volsample.jax registers with jax.ffi.");
  m.def(
      "set_ffi_threads",
      [](int threads, int64_t min_work) {
        team_threads.store(std::max(threads, 1));
        min_work_per_thread.store(std::max<int64_t>(min_work, 1));
      },
      nb::arg("threads"), nb::arg("min_work"),
      "The handlers' thread count and least work per thread (volsample.set_num_threads).");
}

}  // namespace vs
