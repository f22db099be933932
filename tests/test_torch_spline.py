"""``volsample.torch.spline_coefficients``: the B-spline prefilter, differentiable.

Oracles: the NumPy functions ``volsample.spline_coefficients`` and
``spline_coefficients_adjoint`` (bits on CPU tensors, every dtype and memory format),
finite differences (gradcheck, gradgradcheck, forward AD), and interpolation itself:
bspline samples of the coefficients at the voxel centres give the volume back, so the
composition's gradient is the incoming one.
"""
from __future__ import annotations

import doctest
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import assert_bitwise_equal  # noqa: E402
from test_torch import check, in_format  # noqa: E402

import volsample  # noqa: E402
import volsample.torch as vt  # noqa: E402
from volsample._tables import PADDINGS as PADDING_TABLE  # noqa: E402
from volsample.torch import _memory, _spline  # noqa: E402

PADDINGS = ["zeros", "border", "reflection"]
SETTINGS = list(itertools.product(PADDINGS, [False, True]))
# Odd shapes: a single voxel, two (fewer than the taps), primes.
SHAPES = [(2, 3, 5, 7, 4), (1, 1, 1, 2, 3)]


def _logical(t):
    return np.asarray(_memory.read_only_array(t.detach()))


@pytest.mark.parametrize("padding_mode,align_corners", SETTINGS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last", "strided"])
def test_cpu_tensors_give_the_numpy_functions_bits(padding_mode, align_corners, dtype, fmt):
    gen = torch.Generator().manual_seed(1)
    for shape in SHAPES:
        v = in_format(torch.randn(shape, generator=gen).to(dtype), fmt).requires_grad_()
        g = in_format(torch.randn(shape, generator=gen).to(dtype), fmt)
        c = vt.spline_coefficients(v, padding_mode, align_corners)
        c.backward(g)
        assert c.dtype == v.grad.dtype == dtype
        if fmt == "channels_last":
            assert c.is_contiguous(memory_format=torch.channels_last_3d)
        assert_bitwise_equal("coefficients", np.ascontiguousarray(_logical(c)),
                             volsample.spline_coefficients(_logical(v), padding_mode,
                                                           align_corners))
        assert_bitwise_equal("gradient", np.ascontiguousarray(_logical(v.grad)),
                             volsample.spline.spline_coefficients_adjoint(
                                 _logical(g), padding_mode, align_corners))


@pytest.mark.parametrize("padding_mode,align_corners", SETTINGS)
def test_gradcheck_gradgradcheck_forward_ad(padding_mode, align_corners):
    gen = torch.Generator().manual_seed(2)
    v = torch.randn(1, 2, 4, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)

    def fn(a):
        return vt.spline_coefficients(a, padding_mode, align_corners)
    assert torch.autograd.gradcheck(fn, (v,), check_forward_ad=True,
                                    check_batched_forward_grad=False)
    assert torch.autograd.gradgradcheck(fn, (v,))


@pytest.mark.parametrize("padding_mode,align_corners", SETTINGS)
def test_bspline_samples_at_the_voxel_centres_give_the_volume_and_its_gradient(
        padding_mode, align_corners):
    """grid_sample(spline_coefficients(v), centres, "bspline") == v; so the gradient of
    <that, g> with respect to v is g (the chain through the prefilter's adjoint)."""
    gen = torch.Generator().manual_seed(3)
    N, C, D, H, W = 2, 3, 4, 5, 6
    v = torch.randn(N, C, D, H, W, generator=gen, dtype=torch.float64, requires_grad=True)
    g = torch.randn(N, C, D, H, W, generator=gen, dtype=torch.float64)
    theta = torch.eye(3, 4, dtype=torch.float64).expand(N, 3, 4)
    centres = torch.nn.functional.affine_grid(theta, (N, C, D, H, W), align_corners)
    coefficients = vt.spline_coefficients(v, padding_mode, align_corners)
    out = vt.grid_sample(coefficients, centres, "bspline", padding_mode, align_corners)
    check("interpolated", out, v, 1e-12, 1e-12)
    assert not torch.allclose(coefficients, v)  # the prefilter did something
    out.backward(g)
    check("gradient", v.grad, g, 1e-12, 1e-12)


@pytest.mark.parametrize("padding_mode,align_corners", SETTINGS)
@pytest.mark.parametrize("size", [1, 2, 3, 9])
def test_device_path_is_the_numpy_prefilter_to_round_off(padding_mode, align_corners, size):
    """CUDA tensors' torch-ops prefilter (run here on CPU tensors): the NumPy solve to
    float64 round-off, forward and adjoint."""
    gen = torch.Generator().manual_seed(4)
    v = torch.randn(2, 2, size, 4, 5, generator=gen, dtype=torch.float64)
    padding = PADDING_TABLE.code(padding_mode)
    for adjoint, numpy_function in [(False, volsample.spline_coefficients),
                                    (True, volsample.spline.spline_coefficients_adjoint)]:
        got = _spline._device_filter(v, padding, align_corners, adjoint)
        expected = torch.from_numpy(numpy_function(v.numpy(), padding_mode, align_corners))
        check(f"adjoint={adjoint}", got, expected, 1e-14, 1e-14)


def test_torch_func_transforms():
    """vmap (the vmapped dimension folded into N) is the loop over the batch; the Jacobians
    of both AD modes agree, and the Jacobian applied to v is the prefilter of v (linear)."""
    gen = torch.Generator().manual_seed(5)
    batch = torch.randn(3, 1, 2, 3, 2, 4, generator=gen, dtype=torch.float64)

    def fn(a):
        return vt.spline_coefficients(a, "reflection", False)
    check("vmap", torch.func.vmap(fn)(batch), torch.stack([fn(v) for v in batch]), 0, 0)
    v = batch[0]
    reverse, forward = torch.func.jacrev(fn)(v), torch.func.jacfwd(fn)(v)
    check("jacfwd", forward, reverse, 1e-15, 1e-15)
    matrix = reverse.reshape(v.numel(), v.numel())
    check("J v", (matrix @ v.flatten()).reshape(v.shape), fn(v), 1e-14, 1e-14)


def test_other_devices_take_the_torch_ops_path():
    """A meta tensor (as a CUDA one) never reaches NumPy: shape, dtype, format."""
    v = torch.empty(1, 2, 3, 4, 5, device="meta").contiguous(memory_format=torch.channels_last_3d)
    c = vt.spline_coefficients(v, "reflection", True)
    assert c.device.type == "meta" and c.shape == v.shape and c.dtype == v.dtype
    assert c.is_contiguous(memory_format=torch.channels_last_3d)


@pytest.mark.parametrize("call,error,match", [
    (lambda: vt.spline_coefficients(np.zeros((1, 1, 2, 2, 2))), volsample.UnsupportedDTypeError,
     r"volume: expected a torch.Tensor"),
    (lambda: vt.spline_coefficients(torch.zeros(1, 2, 2, 2)), volsample.InvalidArgumentError,
     r"volume: expected a 5-D tensor"),
    (lambda: vt.spline_coefficients(torch.zeros(1, 1, 2, 2, 2, dtype=torch.int32)),
     volsample.UnsupportedDTypeError, r"volume: expected dtype"),
    (lambda: vt.spline_coefficients(torch.zeros(1, 1, 2, 2, 2), "circular"),
     volsample.InvalidArgumentError, r"padding_mode: expected one of"),
    (lambda: vt.spline_coefficients(torch.zeros(1, 1, 2, 2, 2), "border", "yes"),
     volsample.InvalidArgumentError, r"align_corners: expected a bool"),
    (lambda: vt.spline_coefficients(torch.zeros(1, 1, 0, 2, 2)), volsample.InvalidArgumentError,
     r"volume: expected non-empty spatial"),
])
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_docstring_example():
    result = doctest.testmod(_spline, optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed
