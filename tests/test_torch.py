"""volsample.torch: autograd, custom ops, torch.compile and the CPU/CUDA dispatch.

Oracles: PyTorch's own operators (``F.grid_sample``, ``F.interpolate``) through autograd,
the same operators in float64 as the ground truth of 16-bit results, and finite
differences (gradcheck, gradgradcheck). ``torch.library.opcheck`` checks every op's
schema, fake implementation and autograd registration. No GPU here: the CUDA dispatch is
checked with a stand-in for the Triton launchers.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from helpers import assert_close, assert_same_bits, numpy_array  # noqa: E402

import volsample  # noqa: E402
import volsample.torch as vt  # noqa: E402
from volsample import InvalidArgumentError, UnsupportedDTypeError, _calls, _prepared  # noqa: E402
from volsample._cpu import grid_sample as cpu_grid_sample  # noqa: E402
from volsample._cpu import upsample as cpu_upsample  # noqa: E402
from volsample.torch import _grid_sample, _memory, _operands, _upsample  # noqa: E402

ops = torch.ops.volsample
MODES = ["bilinear", "nearest"]
PADDINGS = ["zeros", "border", "reflection"]
ALL_MODES = list(itertools.product(MODES, PADDINGS, [False, True]))
CUBIC_MODES = list(itertools.product(["bicubic", "bspline"], PADDINGS, [False, True]))
SIXTEEN_BIT = [torch.float16, torch.bfloat16]
FORMATS = ["contiguous", "channels_last", "strided"]


def check(name, actual, expected, rtol, atol=None):
    """assert_close on tensors (of any dtype, bfloat16 included)."""
    expected = expected.detach().double()
    atol = rtol * max(1.0, expected.abs().max().item()) if atol is None else atol
    assert_close(name, actual.detach().double().numpy(), expected.numpy(), rtol, atol)


def tolerance(dtype):
    """Relative error allowed: float32/float64 round differently from PyTorch's kernels in
    the last bits; 16-bit results are rounded once from float32, so one unit in the last
    place of the truth covers them."""
    return {torch.float64: 1e-10, torch.float32: 2e-5,
            torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]


def in_format(t, fmt):
    """``t``'s values in a memory format: contiguous, channels-last, or a non-dense view
    (every other element along W of a wider tensor)."""
    if fmt == "contiguous":
        return t.contiguous()
    if fmt == "channels_last":
        return t.contiguous(memory_format=torch.channels_last_3d)
    wide = t.new_zeros(t.shape[:4] + (2 * t.shape[4],))
    wide[..., ::2] = t
    return wide[..., ::2]


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def grads_of(fn, tensors, grad_output):
    """fn(*tensors) and the gradients of <fn(...), grad_output> for each tensor."""
    out = fn(*tensors)
    out.backward(grad_output)
    return out, [t.grad for t in tensors]


def kink_free_grid(gen, shape, in_spatial, align_corners, dtype=torch.float64):
    """Grid points whose voxel coordinates sit at fractions 0.15..0.35 or 0.65..0.85 of
    a voxel, inside and up to 2 voxels outside the volume: away from the integers and
    half-integers where trilinear weights, nearest rounding, clipping and reflection have
    kinks or jumps, so finite differences see one smooth piece."""
    points = torch.empty(shape + (3,), dtype=torch.float64)
    for axis, size in enumerate(reversed(in_spatial)):  # x indexes W, y H, z D
        whole = torch.randint(-2, size + 2, shape, generator=gen).double()
        frac = 0.15 + 0.2 * torch.rand(shape, generator=gen, dtype=torch.float64)
        frac = torch.where(torch.rand(shape, generator=gen) < 0.5, frac, 1.0 - frac)
        voxel = whole + frac
        points[..., axis] = (2 * voxel / (size - 1) - 1 if align_corners
                             else (2 * voxel + 1) / size - 1)
    return points.to(dtype)


# ---------------------------------------------------------------------------------------
# Grid sampling: values and gradients against PyTorch
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grid_sample_matches_pytorch(mode, padding_mode, align_corners, dtype):
    gen = torch.Generator().manual_seed(1)
    # Odd sizes (primes, a size-1 axis: align_corners' degenerate (S - 1) / 2 = 0).
    for in_shape, out_shape in [((2, 3, 5, 7, 6), (2, 4, 3, 5)), ((1, 2, 1, 4, 3), (1, 3, 2, 3))]:
        x = torch.randn(in_shape, generator=gen, dtype=dtype)
        grid = (torch.rand(out_shape + (3,), generator=gen, dtype=dtype) * 2.6 - 1.3)
        grad_output = torch.randn(in_shape[:2] + out_shape[1:], generator=gen, dtype=dtype)
        kwargs = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
        out, (gi, gg) = grads_of(lambda a, b: vt.grid_sample(a, b, **kwargs), leaves(x, grid),
                                 grad_output)
        ref, (ref_gi, ref_gg) = grads_of(lambda a, b: F.grid_sample(a, b, **kwargs),
                                         leaves(x, grid), grad_output)
        rtol = tolerance(dtype)
        check("output", out, ref, rtol)
        check("grad_input", gi, ref_gi, rtol)
        check("grad_grid", gg, ref_gg, rtol)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grid_sample_memory_formats(fmt, dtype):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 4, 6, 3, generator=gen, dtype=dtype)
    grid = torch.rand(2, 3, 4, 5, 3, generator=gen, dtype=dtype) * 2.4 - 1.2
    grad_output = torch.randn(2, 5, 3, 4, 5, generator=gen, dtype=dtype)
    kwargs = dict(padding_mode="reflection", align_corners=False)
    xf = in_format(x, fmt)
    out, (gi, gg) = grads_of(lambda a, b: vt.grid_sample(a, b, **kwargs), leaves(xf, grid),
                             in_format(grad_output, fmt))
    ref, (ref_gi, ref_gg) = grads_of(lambda a, b: F.grid_sample(a, b, **kwargs),
                                     leaves(x, grid), grad_output)
    check("output", out, ref, tolerance(dtype))
    check("grad_input", gi, ref_gi, tolerance(dtype))
    check("grad_grid", gg, ref_gg, tolerance(dtype))
    # channels_last_3d in, channels_last_3d out, for the forward and for grad_input.
    channels_last = fmt == "channels_last"
    assert out.is_contiguous(memory_format=torch.channels_last_3d) == channels_last
    assert out.is_contiguous() != channels_last
    grad_input, grad_grid = ops.grid_sampler_3d_backward(
        in_format(grad_output, fmt), xf, grid, 0, 2, False, [True, True])
    assert grad_input.is_contiguous(memory_format=torch.channels_last_3d) == channels_last
    assert grad_grid.is_contiguous()


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
@pytest.mark.parametrize("grid_dtype", ["same", torch.float32])
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_grid_sample_sixteen_bit_against_float64_truth(dtype, grid_dtype, fmt):
    gen = torch.Generator().manual_seed(3)
    grid_dtype = dtype if grid_dtype == "same" else grid_dtype
    x = torch.randn(1, 4, 6, 5, 7, generator=gen).to(dtype)
    grid = (torch.rand(1, 6, 5, 6, 3, generator=gen) * 2.2 - 1.1).to(grid_dtype)
    grad_output = torch.randn(1, 4, 6, 5, 6, generator=gen).to(dtype)
    kwargs = dict(padding_mode="border", align_corners=True)
    out, (gi, gg) = grads_of(lambda a, b: vt.grid_sample(a, b, **kwargs),
                             leaves(in_format(x, fmt), grid), in_format(grad_output, fmt))
    # Ground truth: float64 maths on exactly the 16-bit values.
    truth, (truth_gi, truth_gg) = grads_of(lambda a, b: F.grid_sample(a, b, **kwargs),
                                           leaves(x.double(), grid.double()), grad_output.double())
    assert out.dtype == gi.dtype == dtype and gg.dtype == grid_dtype
    check("output", out, truth, tolerance(dtype))
    check("grad_input", gi, truth_gi, tolerance(dtype))
    check("grad_grid", gg, truth_gg, tolerance(grid_dtype))


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES + CUBIC_MODES)
def test_grid_sample_gradcheck(mode, padding_mode, align_corners):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 2, 3, 4, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    grid = kink_free_grid(gen, (2, 2, 3, 2), (3, 4, 5), align_corners).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b: vt.grid_sample(a, b, mode, padding_mode, align_corners), (x, grid))


@pytest.mark.parametrize("input_grad,grid_grad", [(True, False), (False, True), (True, True)])
def test_only_the_gradients_asked_for_are_computed(monkeypatch, input_grad, grid_grad):
    masks = []
    _prepared.forget_prepared_calls()  # prepared afresh, so that the spies see them
    for name in ("prepare_backward", "backward"):  # the kernel runs what either was asked
        real = getattr(cpu_grid_sample, name)

        def spy(call, *args, real=real, **kwargs):
            masks.append(call.output_mask)
            return real(call, *args, **kwargs)

        monkeypatch.setattr(cpu_grid_sample, name, spy)
    x = torch.randn(1, 2, 3, 4, 5, dtype=torch.float64, requires_grad=input_grad)
    grid = (torch.rand(1, 2, 3, 4, 3, dtype=torch.float64) * 2 - 1).requires_grad_(grid_grad)
    vt.grid_sample(x, grid).square().sum().backward()
    assert masks == [(input_grad, grid_grad)]
    assert (x.grad is not None) == input_grad and (grid.grad is not None) == grid_grad
    ref = [t.detach().requires_grad_() for t in (x, grid)]
    F.grid_sample(*ref, align_corners=False).square().sum().backward()
    for name, ours, theirs in [("grad_input", x, ref[0]), ("grad_grid", grid, ref[1])]:
        if ours.grad is not None:
            check(name, ours.grad, theirs.grad, 1e-10)


# ---------------------------------------------------------------------------------------
# Upsampling: values and gradients against PyTorch
# ---------------------------------------------------------------------------------------

# (size, scale_factor) pairs: integer and fractional factors, one axis shrinking, sizes.
RESIZES = [(None, 2.0), (None, (1.5, 2.0, 0.6)), ((7, 5, 9), None), (4, None)]


@pytest.mark.parametrize("size,scale_factor", RESIZES)
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("fmt", FORMATS)
def test_upsample_matches_pytorch(size, scale_factor, align_corners, dtype, fmt):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 4, 5, 3, generator=gen, dtype=dtype)
    kwargs = dict(size=size, scale_factor=scale_factor, align_corners=align_corners)
    ref = F.interpolate(x, mode="trilinear", **kwargs)
    grad_output = torch.randn(ref.shape, generator=gen, dtype=dtype)
    ref, (ref_gi,) = grads_of(lambda a: F.interpolate(a, mode="trilinear", **kwargs), leaves(x),
                              grad_output)
    out, (gi,) = grads_of(lambda a: vt.upsample_trilinear(a, **kwargs), leaves(in_format(x, fmt)),
                          in_format(grad_output, fmt))
    check("output", out, ref, tolerance(dtype))
    check("grad_input", gi, ref_gi, tolerance(dtype))
    channels_last = fmt == "channels_last"
    assert out.is_contiguous(memory_format=torch.channels_last_3d) == channels_last
    assert out.is_contiguous() != channels_last
    scales = None if scale_factor is None else list(np.broadcast_to(scale_factor, 3))
    grad_input = ops.upsample_trilinear3d_backward(in_format(grad_output, fmt), list(x.shape),
                                                   align_corners, scales)
    assert grad_input.is_contiguous(memory_format=torch.channels_last_3d) == channels_last


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_upsample_sixteen_bit_against_float64_truth(dtype, fmt):
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, 5, 4, 6, 5, generator=gen).to(dtype)
    grad_output = torch.randn(1, 5, 8, 9, 10, generator=gen).to(dtype)
    kwargs = dict(size=(8, 9, 10), align_corners=False)
    out, (gi,) = grads_of(lambda a: vt.upsample_trilinear(a, **kwargs), leaves(in_format(x, fmt)),
                          in_format(grad_output, fmt))
    truth, (truth_gi,) = grads_of(lambda a: F.interpolate(a, mode="trilinear", **kwargs),
                                  leaves(x.double()), grad_output.double())
    assert out.dtype == gi.dtype == dtype
    check("output", out, truth, tolerance(dtype))
    check("grad_input", gi, truth_gi, tolerance(dtype))


@pytest.mark.parametrize("size,scale_factor", RESIZES)
@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_gradcheck(size, scale_factor, align_corners):
    x = torch.randn(1, 2, 3, 2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a: vt.upsample_trilinear(a, size, scale_factor, align_corners), (x,))


@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_double_backward_gradgradcheck(align_corners):
    # Small: finite differences of the backward perturb every grad_output element.
    x = torch.randn(1, 2, 2, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda a: vt.upsample_trilinear(a, scale_factor=(1.5, 2.0, 1.5),
                                        align_corners=align_corners), (x,))


def test_upsample_backward_gradient_is_the_forward():
    """The backward's gradient for grad_output is the forward applied to the incoming
    gradient (both are the same linear map's two sides)."""
    gen = torch.Generator().manual_seed(7)
    grad_output = torch.randn(1, 2, 6, 8, 7, generator=gen, dtype=torch.float64,
                              requires_grad=True)
    v = torch.randn(1, 2, 3, 4, 5, generator=gen, dtype=torch.float64)
    grad_input = ops.upsample_trilinear3d_backward(grad_output, [1, 2, 3, 4, 5], True, None)
    (grad_grad_output,) = torch.autograd.grad(grad_input, grad_output, v)
    check("grad of grad_output", grad_grad_output,
          F.interpolate(v, size=(6, 8, 7), mode="trilinear", align_corners=True), 1e-12)


# ---------------------------------------------------------------------------------------
# Custom ops: opcheck, torch.compile
# ---------------------------------------------------------------------------------------


def _opcheck_samples():
    gen = torch.Generator().manual_seed(8)

    def volume(shape, fmt="contiguous", dtype=torch.float32):
        return in_format(torch.randn(shape, generator=gen).to(dtype), fmt).requires_grad_()

    grid = (torch.rand(2, 4, 3, 5, 3, generator=gen) * 2.2 - 1.1).requires_grad_()
    samples = []
    for fmt in ("contiguous", "channels_last"):
        x = volume((2, 3, 5, 6, 7), fmt)
        # No gradients through the grid sampler's backward (nor has PyTorch's 5-D one).
        go, x_, grid_ = volume((2, 3, 4, 3, 5), fmt).detach(), x.detach(), grid.detach()
        samples += [
            (fmt, ops.grid_sampler_3d, (x, grid, 0, 1, False)),
            (fmt, ops.grid_sampler_3d, (x, grid, 1, 2, True)),
            (fmt, ops.grid_sampler_3d_backward, (go, x_, grid_, 0, 2, False, [True, True])),
            (fmt, ops.grid_sampler_3d_backward, (go, x_, grid_, 0, 0, True, [False, True])),
            (fmt, ops.upsample_trilinear3d, (x, [10, 12, 14], False, [2.0, 2.0, 2.0])),
            (fmt, ops.upsample_trilinear3d, (x, [4, 9, 3], True, None)),
            (fmt, ops.upsample_trilinear3d_backward,
             (volume((2, 3, 10, 12, 14), fmt), [2, 3, 5, 6, 7], False, [2.0, 2.0, 2.0])),
        ]
    bf16 = volume((1, 2, 4, 3, 5), dtype=torch.bfloat16)
    samples += [  # a 16-bit volume with a float32 grid; an empty batch
        ("bf16", ops.grid_sampler_3d, (bf16, grid[:1], 0, 0, False)),
        ("empty", ops.grid_sampler_3d, (volume((0, 3, 5, 6, 7)), grid[:0], 0, 0, False)),
    ]
    return [pytest.param(op, args, id=f"{op.__name__}-{tag}-{i}")
            for i, (tag, op, args) in enumerate(samples)]


@pytest.mark.parametrize("op,args", _opcheck_samples())
def test_opcheck(op, args):
    torch.library.opcheck(op, args)


def spatial_transformer_loss(field, x, target):
    """Upsample a coarse displacement field, add it to the identity grid and warp ``x``."""
    flow = vt.upsample_trilinear(field, size=target.shape[2:], align_corners=True)
    identity = F.affine_grid(torch.eye(3, 4)[None], target.shape, align_corners=True)
    warped = vt.grid_sample(x, identity + flow.permute(0, 2, 3, 4, 1), align_corners=True)
    return ((warped - target) ** 2).mean()


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compile_fullgraph_matches_eager(backend):
    gen = torch.Generator().manual_seed(9)
    field = (0.1 * torch.randn(1, 3, 3, 4, 3, generator=gen)).requires_grad_()
    x = torch.randn(1, 2, 5, 6, 7, generator=gen, requires_grad=True)
    target = torch.randn(1, 2, 6, 7, 5, generator=gen)
    compiled = torch.compile(spatial_transformer_loss, fullgraph=True, backend=backend)
    loss, grads = grads_of(lambda f, v: compiled(f, v, target), leaves(field, x), None)
    ref, ref_grads = grads_of(lambda f, v: spatial_transformer_loss(f, v, target),
                              leaves(field, x), None)
    check("loss", loss, ref, 1e-6)
    check("grad field", grads[0], ref_grads[0], 1e-5)
    check("grad input", grads[1], ref_grads[1], 1e-5)


# ---------------------------------------------------------------------------------------
# No copies on the CPU
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_numpy_views_share_the_tensors_memory(dtype, fmt):
    t = in_format(torch.randn(2, 3, 4, 5, 6).to(dtype), fmt)
    layout = _operands.layout(t)
    assert layout == ("NDHWC" if fmt == "channels_last" else "NCDHW")
    arr = _memory.read_only_array(t)
    assert arr.ctypes.data == t.data_ptr() and arr.shape == t.shape
    assert not arr.flags.writeable  # the torch layer only reads its operands
    assert [s // arr.itemsize for s in arr.strides] == list(t.stride())
    physical = arr.transpose(0, 2, 3, 4, 1) if layout == "NDHWC" else arr
    assert physical.flags.c_contiguous
    np.testing.assert_array_equal(arr.astype(np.float64), t.double().numpy())


class Spy:
    """Wraps a C++ backend launcher, or a function that prepares one (its name starts with
    "prepare"); records each run's call description and the addresses of the memory the
    kernel ran on (operands, then the results it writes): a launcher's arrays', or those a
    prepared kernel was handed."""

    def __init__(self, monkeypatch, module, name):
        self.real, self.calls = getattr(module, name), []
        monkeypatch.setattr(module, name, self)

    def __call__(self, call, *arrays):
        if not self.real.__name__.startswith("prepare"):
            self.calls.append((call, [a.ctypes.data for a in arrays]))
            return self.real(call, *arrays)
        kernel = self.real(call, *arrays)
        return None if kernel is None else _RecordedKernel(kernel, call, self.calls)


class _RecordedKernel:
    """A prepared kernel whose runs a Spy records."""

    def __init__(self, kernel, call, calls):
        self.kernel, self.call, self.calls = kernel, call, calls

    def __getattr__(self, name):
        def run(*addresses):
            self.calls.append((self.call, list(addresses)))
            return getattr(self.kernel, name)(*addresses)
        return run


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_ops_pass_tensor_memory_both_ways(monkeypatch, dtype, fmt):
    x = in_format(torch.randn(1, 4, 5, 6, 7).to(dtype), fmt)
    grid = torch.rand(1, 3, 4, 5, 3).to(dtype) * 2 - 1
    go = in_format(torch.randn(1, 4, 3, 4, 5).to(dtype), fmt)
    go_up = in_format(torch.randn(1, 4, 10, 12, 14).to(dtype), fmt)
    _prepared.forget_prepared_calls()  # prepared afresh, so that the spies see them
    backward = Spy(monkeypatch, cpu_grid_sample, "backward")
    spies = [Spy(monkeypatch, cpu_grid_sample, "prepare_forward"),
             Spy(monkeypatch, cpu_grid_sample, "prepare_backward"),
             Spy(monkeypatch, cpu_upsample, "prepare_forward"),
             Spy(monkeypatch, cpu_upsample, "prepare_backward")]
    results = [vt.grid_sample(x, grid), *ops.grid_sampler_3d_backward(go, x, grid, 0, 0, False,
                                                                      [True, True]),
               vt.upsample_trilinear(x, scale_factor=2),
               ops.upsample_trilinear3d_backward(go_up, list(x.shape), False, None)]
    spies[1].calls += backward.calls  # a 16-bit grad_input: not prepared, summed in float32
    received = [(spies[0], (x, grid)), (spies[1], (go, x, grid)), (spies[2], (x,)),
                (spies[3], (go_up,))]
    for spy, tensors in received:
        (call, addresses), = spy.calls
        for address, t in zip(addresses, tensors):
            assert address == t.data_ptr(), f"{spy.real.__name__} got a copy"
        assert call.layout == ("NDHWC" if fmt == "channels_last" else "NCDHW")
    written = [spies[0].calls[0][1][2], *spies[1].calls[0][1][3:], spies[2].calls[0][1][1],
               spies[3].calls[0][1][1]]
    for tensor, address in zip(results, written):
        assert tensor.data_ptr() == address, "result copied"


@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_first_calls_return_the_results_they_prepared_on(monkeypatch, fmt):
    # The first call of a key prepares its kernel on views of its own results and returns
    # those, allocating no second set (the spy holds the views: their memory stays taken).
    _prepared.forget_prepared_calls()
    prepared_on = []
    for module in (cpu_grid_sample, cpu_upsample):
        for name in ("prepare_forward", "prepare_backward"):
            def spy(call, *arrays, real=getattr(module, name)):
                prepared_on.append(arrays)
                return real(call, *arrays)
            monkeypatch.setattr(module, name, spy)
    x = in_format(torch.randn(2, 3, 4, 5, 6), fmt)
    grid = torch.rand(2, 3, 4, 5, 3) * 2 - 1
    go = in_format(torch.randn(2, 3, 3, 4, 5), fmt)
    go_up = in_format(torch.randn(2, 3, 8, 10, 12), fmt)
    results = [vt.grid_sample(x, grid), *ops.grid_sampler_3d_backward(go, x, grid, 0, 0, False,
                                                                      [True, True]),
               vt.upsample_trilinear(x, scale_factor=2),
               ops.upsample_trilinear3d_backward(go_up, list(x.shape), False, None)]
    assert len(prepared_on) == 4
    written = [prepared_on[0][2], *prepared_on[1][3:], prepared_on[2][1], prepared_on[3][1]]
    for k, (tensor, array) in enumerate(zip(results, written)):
        assert tensor.data_ptr() == array.ctypes.data, f"result {k} allocated twice"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_repeated_calls_run_on_their_own_tensors(dtype, fmt):
    # The second and third calls of a shape run the kernels prepared by the first (grid
    # sampling and upsampling, forward and backward): on their own tensors (another offset into a storage too), with the NumPy API's bits, on any
    # thread count.
    _prepared.forget_prepared_calls()
    storage = torch.randn(3 * 2 * 4 * 5 * 6 * 7 + 3, dtype=torch.float64).to(dtype)
    volumes = [in_format(storage[k * 2 * 4 * 5 * 6 * 7 + k:][:2 * 4 * 5 * 6 * 7]
                         .reshape(2, 4, 5, 6, 7), fmt) for k in range(3)]
    grids = [(torch.rand(2, 3, 4, 5, 3, dtype=torch.float64) * 2.2 - 1.1).to(dtype)
             for _ in range(3)]
    grad_outputs = [in_format(torch.randn(2, 4, 3, 4, 5, dtype=torch.float64).to(dtype), fmt)
                    for _ in range(3)]
    threads = volsample.get_num_threads()
    try:
        for k, (x, grid, go) in enumerate(zip(volumes, grids, grad_outputs)):
            volsample.set_num_threads(1 + k % 2)
            arrays = [numpy_array(t) for t in (x, grid, go)]
            expected = (volsample.grid_sample_3d(*arrays[:2], "bilinear", "border"),
                        *volsample.grid_sample_3d_backward(arrays[2], *arrays[:2], "bilinear",
                                                           "border"))
            expected += (volsample.upsample_trilinear_3d(arrays[0], scale_factor=1.5),
                         volsample.upsample_trilinear_3d_backward(arrays[2], (2, 4, 6, 8, 10),
                                                                  scales=(0.6, 0.5, 0.5)))
            got = (vt.grid_sample(x, grid, "bilinear", "border"),
                   *ops.grid_sampler_3d_backward(go, x, grid, 0, 1, False, [True, True]),
                   vt.upsample_trilinear(x, scale_factor=1.5),
                   ops.upsample_trilinear3d_backward(go, [2, 4, 6, 8, 10], False,
                                                     [0.6, 0.5, 0.5]))
            names = ("output", "grad_input", "grad_grid", "upsampled", "upsampling's gradient")
            for name, ours, theirs in zip(names, got, expected):
                assert_same_bits(f"call {k}: {name}", numpy_array(ours), theirs)
    finally:
        volsample.set_num_threads(threads)


# ---------------------------------------------------------------------------------------
# CUDA dispatch (with a stand-in for the Triton launchers)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["grid_sampler_3d", "grid_sampler_3d_backward",
                                  "upsample_trilinear3d", "upsample_trilinear3d_backward"])
def test_every_op_has_a_cuda_kernel(name):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"volsample::{name}", "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"volsample::{name}", "CPU")


def _stand_in(monkeypatch, family, **results):
    """Triton launchers of ``family`` that record their calls: ``prepare_forward`` and
    ``prepare_backward`` return prepared calls whose ``forward_on`` / ``backward_on`` write
    ``results["forward"]`` / ``results["backward"]``'s values into the results they are
    handed (the arguments after the operands, as the contract has it; None where the door
    passed none). The store of prepared calls starts empty."""
    _prepared.forget_prepared_calls()
    calls = []

    def run(name, values):
        def launch(*args):
            calls.append((name, args))
            given = [a for a in args if isinstance(a, torch.Tensor)][-len(values):] \
                if values else []
            for result, value in zip(given, values):
                result.copy_(value)
        return launch

    def prepare(name):
        def prepare_call(*args, **kwargs):
            calls.append((name, args + tuple(kwargs.values())))
            return types.SimpleNamespace(forward_on=run("forward_on", results.get("forward")),
                                         backward_on=run("backward_on", results.get("backward")))
        return prepare_call

    module = types.SimpleNamespace(prepare_forward=prepare("prepare_forward"),
                                   prepare_backward=prepare("prepare_backward"))
    monkeypatch.setitem(sys.modules, f"volsample._triton.{family}", module)
    return calls


@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_grid_sampler_prepares_its_calls_on_the_triton_backend(monkeypatch, deterministic):
    """The CUDA kernels take the CPU kernels' way (``_prepared``, one key, one lookup): the
    first call of a key allocates the results (the input's memory format; grad_grid
    contiguous), prepares the Triton call on the operands and results and runs it; a second
    call of that key runs the prepared call, on new results."""
    x, grid, go = torch.randn(1, 2, 3, 4, 5), torch.zeros(1, 2, 2, 2, 3), torch.randn(1, 2, 2, 2, 2)
    out, grad_input = torch.randn(1, 2, 2, 2, 2), torch.randn(1, 2, 3, 4, 5)
    calls = _stand_in(monkeypatch, "grid_sample", forward=(out,), backward=(grad_input,))
    monkeypatch.setattr(volsample._config, "_deterministic", deterministic)
    for _ in range(2):
        assert torch.equal(_grid_sample._grid_sampler_3d_cuda(x, grid, 1, 2, True), out)
        gi, gg = _grid_sample._grid_sampler_3d_backward_cuda(go, x, grid, 0, 1, False,
                                                             [True, False])
        assert torch.equal(gi, grad_input) and gg.numel() == 0  # not asked for: empty
    names = [name for name, _ in calls]
    assert names == ["prepare_forward", "forward_on", "prepare_backward", "backward_on",
                     "forward_on", "backward_on"]
    (_, f_prep), (_, f_run), (_, b_prep), (_, b_run) = calls[:4]
    call = f_prep[0]
    assert isinstance(call, _calls.GridSample)
    assert (call.mode, call.padding, call.align_corners) == (1, 2, True)
    assert f_prep[1:3] == (x, grid) and f_prep[3].shape == out.shape
    assert f_run[:2] == (x, grid) and f_run[2] is f_prep[3]  # the first run: its results
    assert calls[4][1][2] is not f_prep[3]  # later runs: new results
    call = b_prep[0]
    assert isinstance(call, _calls.GridSample)
    assert (call.mode, call.padding, call.align_corners, call.output_mask) == (0, 1, False,
                                                                            (True, False))
    assert b_prep[1] is go and b_prep[2:4] == (x, grid) and b_prep[4].shape == x.shape
    assert b_prep[5] is None and b_prep[6] == deterministic
    assert b_run[0] is go and b_run[1:3] == (x, grid) and b_run[4] is None


@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_upsample_prepares_its_calls_on_the_triton_backend(monkeypatch, deterministic):
    x, go = torch.randn(1, 2, 3, 4, 5), torch.randn(1, 2, 6, 8, 10)
    out, grad_input = torch.empty(1, 2, 6, 8, 10), torch.empty(1, 2, 3, 4, 5)
    out.normal_(), grad_input.normal_()
    calls = _stand_in(monkeypatch, "upsample", forward=(out,), backward=(grad_input,))
    monkeypatch.setattr(volsample._config, "_deterministic", deterministic)
    for _ in range(2):
        assert torch.equal(_upsample._upsample_trilinear3d_cuda(x, [6, 8, 10], True,
                                                                [2.0, 2.0, 2.0]), out)
        assert torch.equal(_upsample._upsample_trilinear3d_backward_cuda(
            go, [1, 2, 3, 4, 5], False, None), grad_input)
    names = [name for name, _ in calls]
    assert names == ["prepare_forward", "forward_on", "prepare_backward", "backward_on",
                     "forward_on", "backward_on"]
    (_, f_prep), (_, f_run), (_, b_prep), (_, b_run) = calls[:4]
    call = f_prep[0]
    assert isinstance(call, _calls.Upsample) and isinstance(b_prep[0], _calls.Upsample)
    assert (call.output_shape, call.align_corners, call.scales) == ((1, 2, 6, 8, 10), True,
                                                                    (2.0, 2.0, 2.0))
    assert f_prep[1] is x and f_prep[2].shape == out.shape and f_run[0] is x
    # always reproducible on the GPU: no deterministic flag
    assert b_prep[1] is go and len(b_prep) == 3 and b_prep[2].shape == grad_input.shape
    assert b_run[0] is go
    call = b_prep[0]
    assert (call.input_shape, call.align_corners, call.scales) == ((1, 2, 3, 4, 5), False,
                                                                   (None, None, None))


@pytest.mark.parametrize("family,call", [
    ("grid_sample", lambda: _grid_sample._grid_sampler_3d_cuda(
        torch.randn(1, 1, 2, 2, 2), torch.zeros(1, 1, 1, 1, 3), 0, 0, False)),
    ("upsample", lambda: _upsample._upsample_trilinear3d_backward_cuda(
        torch.randn(1, 1, 4, 4, 4), [1, 1, 2, 2, 2], False, None)),
])
def test_cuda_without_triton_names_the_missing_backend(monkeypatch, family, call):
    _prepared.forget_prepared_calls()
    monkeypatch.setitem(sys.modules, f"volsample._triton.{family}", None)  # import fails
    with pytest.raises(RuntimeError, match=rf"Triton GPU backend \(volsample\._triton\.{family}\)"):
        call()


def test_cuda_path_checks_arguments_before_the_backend(monkeypatch):
    calls = _stand_in(monkeypatch, "grid_sample", forward=None)
    with pytest.raises(InvalidArgumentError, match="last dimension 3"):
        _grid_sample._grid_sampler_3d_cuda(torch.randn(1, 1, 2, 2, 2), torch.zeros(1, 1, 1, 1, 2),
                                           0, 0, False)
    assert calls == []


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------

X = torch.randn(1, 2, 4, 4, 4)
GRID = torch.zeros(1, 2, 2, 2, 3)


@pytest.mark.parametrize("call,error,match", [
    (lambda: vt.grid_sample(X[0], GRID), InvalidArgumentError, r"input: expected a 5-D tensor"),
    (lambda: vt.grid_sample(X, GRID[0]), InvalidArgumentError, r"grid: expected a 5-D tensor"),
    (lambda: vt.grid_sample(X.int(), GRID), UnsupportedDTypeError, r"input: expected dtype torch"),
    (lambda: vt.grid_sample(X.numpy(), GRID), UnsupportedDTypeError, r"expected a torch.Tensor"),
    (lambda: vt.grid_sample(X, GRID.to("meta")), InvalidArgumentError,
     r"one device, got input on cpu, grid on meta"),
    (lambda: vt.grid_sample(X, GRID, mode="cubic"), InvalidArgumentError,
     r"mode: expected one of"),
    (lambda: vt.grid_sample(X, GRID, padding_mode="circular"), InvalidArgumentError,
     r"padding_mode: expected one of"),
    (lambda: vt.grid_sample(X, GRID, align_corners="yes"), InvalidArgumentError,
     r"align_corners: expected a bool"),
    (lambda: vt.grid_sample(X, GRID[..., :2]), InvalidArgumentError, r"last dimension 3"),
    (lambda: vt.grid_sample(X, GRID.expand(2, -1, -1, -1, -1)), InvalidArgumentError,
     r"batch size 1"),
    (lambda: vt.grid_sample(X, GRID.double()), UnsupportedDTypeError, r"grid: expected dtype"),
    (lambda: vt.grid_sample(X[:, :, :0], GRID), InvalidArgumentError, r"non-empty spatial"),
    (lambda: ops.grid_sampler_3d(X, GRID, 4, 0, False), InvalidArgumentError,
     r"interpolation_mode: expected one of 0 \(bilinear\), 1 \(nearest\), 2 \(bicubic\), "
     r"3 \(bspline\), got 4"),
    (lambda: ops.grid_sampler_3d(X, GRID, 0, 3, False), InvalidArgumentError, r"padding_mode"),
    (lambda: ops.grid_sampler_3d_backward(X, X, GRID, 0, 0, False, [True, True]),
     InvalidArgumentError, r"grad_output: expected shape"),
    (lambda: ops.grid_sampler_3d_backward(torch.zeros(1, 2, 2, 2, 2).double(), X, GRID, 0, 0,
                                          False, [True, True]),
     UnsupportedDTypeError, r"grad_output: expected dtype torch.float32"),
    (lambda: ops.grid_sampler_3d_backward(torch.zeros(1, 2, 2, 2, 2), X, GRID, 0, 0, False,
                                          [True]), InvalidArgumentError, r"output_mask"),
    (lambda: vt.upsample_trilinear(X[0], size=3), InvalidArgumentError, r"5-D"),
    (lambda: vt.upsample_trilinear(X, size=3, scale_factor=2), InvalidArgumentError,
     r"exactly one of them, got both"),
    (lambda: vt.upsample_trilinear(X), InvalidArgumentError, r"exactly one of them, got neither"),
    (lambda: vt.upsample_trilinear(X, size=(3, 0, 3)), InvalidArgumentError, r"size"),
    (lambda: vt.upsample_trilinear(X, scale_factor=0.0), InvalidArgumentError, r"positive"),
    (lambda: vt.upsample_trilinear(X, size=3, align_corners="yes"), InvalidArgumentError,
     r"align_corners"),
    (lambda: ops.upsample_trilinear3d(X, [8, 8, 8], False, [2.0, 2.0, 2.3]), InvalidArgumentError,
     r"scales: expected the factors of output_size"),
    (lambda: ops.upsample_trilinear3d_backward(X, [1, 3, 2, 2, 2], False, None),
     InvalidArgumentError, r"N, C = \(1, 3\)"),
    (lambda: ops.upsample_trilinear3d_backward(X, [1, 2, 2, 2], False, None),
     InvalidArgumentError, r"input_size: expected 5 integers"),
])
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------------------------------
# Imports
# ---------------------------------------------------------------------------------------


def _python(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=120)


def test_numpy_api_never_imports_torch_and_torch_api_needs_it():
    run = _python("""
        import sys
        import volsample
        print("torch imported:", "torch" in sys.modules)
        sys.modules["torch"] = None  # as if PyTorch were not installed
        try:
            import volsample.torch
        except ImportError as error:
            print("ImportError:", error)
    """)
    assert run.returncode == 0, run.stderr
    assert "torch imported: False" in run.stdout
    assert "ImportError: volsample.torch needs PyTorch" in run.stdout


def test_memory_format_rule():
    """Channels-last means the channel stride is the smallest non-trivial stride; the torch
    layer and the Triton launchers share this one rule (volsample._torch_formats)."""
    from volsample._torch_formats import is_channels_last

    cl = torch.channels_last_3d
    base = torch.empty(2, 3, 4, 5, 6)
    last = base.contiguous(memory_format=cl)
    cases = [(base, False), (last, True), (last[..., ::2], True), (base[:, :, ::2], False),
             (base.transpose(2, 4), False),
             (torch.empty(2, 1, 4, 5, 6).contiguous(memory_format=cl), False),  # one channel
             (torch.empty(2, 3, 1, 1, 1), True),  # no spatial extent: either reading holds
             (torch.empty(1, 3, 1, 5, 1), False),
             (torch.empty(1, 3, 1, 5, 1).contiguous(memory_format=cl), True)]
    for t, expected in cases:
        assert is_channels_last(t) == expected, (tuple(t.shape), t.stride())
