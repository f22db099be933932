"""The Triton warp launchers (``volsample._triton.warp``), run on the CPU by Triton's
interpreter, against the float64 reference (compiled for GPUs: tests/test_triton_aot.py).
Small odd shapes: the interpreter runs every program in Python."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, at import

import itertools  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from volsample import _calls  # noqa: E402
from volsample import _reference as reference  # noqa: E402
from volsample._tables import MODES, PADDINGS, UNITS  # noqa: E402
from volsample._triton import memory_format  # noqa: E402
from volsample._triton import warp as tw  # noqa: E402
from volsample.torch import _operands  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, on NaN lanes


def _call(x, theta, u, grad_output, mode, padding_mode, align_corners, units, mask=None):
    """Forward and backward descriptions of a warp on these tensors."""
    op = lambda name, t: None if t is None else _operands.operand(name, t)
    codes = (MODES.code(mode), PADDINGS.code(padding_mode))
    forward = _calls.warp(op("input", x), op("theta", theta), op("displacement", u),
                          tuple(grad_output.shape[2:]), *codes, align_corners, UNITS.code(units),
                          shape_order="NCDHW", layout=_operands.layout(x))
    backward = _calls.warp_backward(op("grad_output", grad_output), op("input", x),
                                    op("theta", theta), op("displacement", u), *codes,
                                    align_corners, UNITS.code(units), mask or (True,) * 3,
                                    shape_order="NCDHW", layout=_operands.layout(x))
    return forward, backward


def _forward(call, x, theta, u):
    """The warp launcher's forward into a NaN-filled result in the input's memory format."""
    out = torch.full(call.output_shape, float("nan"), dtype=x.dtype).contiguous(
        memory_format=memory_format(x))
    tw.forward(call, x, theta, u, out)
    return out


def _backward(call, go, x, theta, u, deterministic):
    """(grad_input, grad_theta, grad_displacement), None where not asked for, written into
    NaN-filled results."""
    results = [None if not want or like is None else torch.full_like(
        like, float("nan"), dtype=x.dtype if like is x else like.dtype)
        for want, like in zip(call.output_mask, (x, theta, u))]
    tw.backward(call, go, x, theta, u, *results, deterministic)
    return tuple(results)


def _problem(dtype=torch.float64, coord_dtype=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    coord_dtype = coord_dtype or dtype
    x = torch.randn(2, 3, 4, 5, 6, generator=gen).to(dtype)
    theta = (torch.eye(3, 4) + 0.25 * torch.randn(2, 3, 4, generator=gen)).to(coord_dtype)
    u = (0.3 * torch.randn(2, 3, 4, 5, 3, generator=gen)).to(coord_dtype)
    go = torch.randn(2, 3, 3, 4, 5, generator=gen).to(dtype)
    return x, theta, u, go


def _numpy(t):
    return None if t is None else t.double().numpy()


MODE_CASES = list(itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"],
                                   [False, True]))
# (theta given, displacement given, units), two per mode case, in turn (the interpreter
# is slow: each combination runs under a few modes, every mode under a few combinations)
OPERAND_CASES = list(itertools.product([(True, True), (False, True), (True, False)],
                                       ["normalized", "voxels"]))


@pytest.mark.parametrize("case", range(len(MODE_CASES)))
def test_float64_matches_the_reference(case):
    mode, padding_mode, align_corners = MODE_CASES[case]
    deterministic = case % 2 == 0
    x, theta, u, go = _problem()
    for (use_theta, use_u), units in (OPERAND_CASES[(2 * case + k) % len(OPERAND_CASES)]
                                      for k in range(2)):
        t, d = (theta if use_theta else None), (u if use_u else None)
        forward, backward = _call(x, t, d, go, mode, padding_mode, align_corners, units)
        what = f"theta={use_theta} u={use_u} {units} deterministic={deterministic}"
        out = _forward(forward, x, t, d)
        expected = reference.warp_3d(x.numpy(), _numpy(t), _numpy(d), (3, 4, 5), mode,
                                     padding_mode, align_corners, units)
        np.testing.assert_allclose(out.numpy(), expected, 1e-12, 1e-12, err_msg=what)
        grads = _backward(backward, go, x, t, d, deterministic)
        expected = reference.warp_3d_backward(go.numpy(), x.numpy(), _numpy(t), _numpy(d), mode,
                                              padding_mode, align_corners, units)
        for name, a, e in zip(("grad_input", "grad_theta", "grad_displacement"), grads,
                              expected):
            assert (a is None) == (e is None), name
            if a is not None:
                np.testing.assert_allclose(a.numpy(), e, 1e-11, 1e-11, err_msg=f"{name} {what}")


@pytest.mark.parametrize("dtype,coord_dtype", [(torch.float32, torch.float32),
                                               (torch.bfloat16, torch.float32),
                                               (torch.float16, torch.float16)])
def test_lower_precision_and_channels_last(dtype, coord_dtype):
    """float32 within the coordinate rounding; 16-bit results rounded once (a whole ulp
    for bfloat16, which the interpreter truncates)."""
    x, theta, u, go = _problem(dtype, coord_dtype, seed=1)
    x = x.contiguous(memory_format=torch.channels_last_3d)
    forward, backward = _call(x, theta, u, go, "bilinear", "border", False, "normalized")
    out = _forward(forward, x, theta, u)
    assert out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last_3d)
    tolerance = {torch.float32: 1e-4, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}[dtype]
    expected = reference.warp_3d(_numpy(x), _numpy(theta), _numpy(u), None, "bilinear", "border")
    np.testing.assert_allclose(out.double().numpy(), expected, tolerance, 1e-2)
    gi, gt, gd = _backward(backward, go, x, theta, u, True)
    assert gi.dtype == dtype and gt.dtype == gd.dtype == coord_dtype
    ri, rt, rd = reference.warp_3d_backward(_numpy(go), _numpy(x), _numpy(theta), _numpy(u),
                                            "bilinear", "border")
    np.testing.assert_allclose(gi.double().numpy(), ri, tolerance, 1e-2)
    np.testing.assert_allclose(gt.double().numpy(), rt, 1e-2, 1e-1)
    np.testing.assert_allclose(gd.double().numpy(), rd, 1e-2, 1e-2)


def test_output_mask_and_reproducible_theta():
    x, theta, u, go = _problem(torch.float32, seed=2)
    for mask in itertools.product([False, True], repeat=3):
        _, backward = _call(x, theta, u, go, "bilinear", "zeros", True, "voxels", mask)
        grads = _backward(backward, go, x, theta, u, True)
        assert [g is not None for g in grads] == list(mask)
    _, backward = _call(x, theta, u, go, "bilinear", "zeros", True, "voxels")
    first = _backward(backward, go, x, theta, u, False)[1]
    again = _backward(backward, go, x, theta, u, False)[1]
    assert torch.equal(first.view(torch.int32), again.view(torch.int32))
