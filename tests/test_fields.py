"""The displacement-field tools (volsample.compose / integrate_velocity /
jacobian_determinant and their volsample.torch twins) against MONAI's DVF2DDF,
SimpleITK's DisplacementFieldJacobianDeterminantFilter, closed forms and the float64
reference; the docstrings' examples run too."""
from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch
from helpers import assert_bitwise_equal, assert_close

import volsample
import volsample.torch as vt
from volsample import _reference as reference

pytestmark = pytest.mark.filterwarnings("ignore:monai.networks.blocks.Warp:UserWarning")


def smooth_field(shape, amplitude, seed=0, N=1):
    """A smooth random displacement (N, D, H, W, 3) in voxels: low-frequency sines."""
    rng = np.random.default_rng(seed)
    D, H, W = shape
    z, y, x = np.meshgrid(*(np.linspace(0, 1, n) for n in shape), indexing="ij")
    field = np.empty((N,) + tuple(shape) + (3,))
    for n in range(N):
        for k in range(3):
            f, p = rng.uniform(1, 3, 3), rng.uniform(0, 2 * np.pi, 3)
            field[n, ..., k] = amplitude * np.sin(f[0] * x + p[0]) * np.sin(f[1] * y + p[1]) \
                * np.cos(f[2] * z + p[2])
    return field


def test_compose_is_v_plus_u_at_the_moved_points():
    """w(x) = v(x) + u(x + v(x)), u read trilinearly with zeros outside: the float64
    reference warp of u (as a 3-channel volume) at the moved points, plus v."""
    u, v = smooth_field((5, 6, 7), 1.5, seed=1), smooth_field((5, 6, 7), 2.0, seed=2)
    for padding_mode in ("zeros", "border", "reflection"):
        expected = v + np.moveaxis(reference.warp_3d(
            np.moveaxis(u, -1, 1), None, v, None, "bilinear", padding_mode, True, "voxels"), 1, -1)
        assert_close(f"compose {padding_mode}", volsample.compose(u, v, padding_mode), expected,
                     1e-12, 1e-12)


def test_compose_of_shifts_adds_them():
    """Constant shifts compose to their sum where the moved points stay inside; with zeros
    padding u is 0 where they leave (the field is 0 outside)."""
    u = np.zeros((1, 4, 5, 6, 3))
    u[..., :] = (1.0, -0.5, 0.25)
    v = np.zeros_like(u)
    v[..., :] = (0.5, 1.0, 0.0)
    w = volsample.compose(u, v)
    assert_close("inside", w[0, :, :3, :4], np.broadcast_to((1.5, 0.5, 0.25), (4, 3, 4, 3)),
                 0, 1e-12)
    assert_close("outside along y", w[0, :, 4, :4], np.broadcast_to((0.5, 1.0, 0.0), (4, 4, 3)),
                 0, 1e-12)


def _monai_dvf2ddf(v, steps):
    from monai.networks.blocks import DVF2DDF

    # MONAI's channels run along the array axes (D, H, W): ours (x, y, z) reversed.
    dvf = torch.from_numpy(np.ascontiguousarray(np.moveaxis(v[..., ::-1], -1, 1)))
    ddf = DVF2DDF(num_steps=steps)(dvf).numpy()
    return np.moveaxis(ddf, 1, -1)[..., ::-1]


@pytest.mark.parametrize("dtype,tolerance", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_integrate_velocity_matches_monai(dtype, tolerance):
    """Scaling and squaring, against MONAI's DVF2DDF (trilinear, zeros padding,
    align_corners=True) on the same field: 7 and 3 steps, odd shapes, two batch items."""
    pytest.importorskip("monai")
    v = smooth_field((6, 7, 9), 4.0, seed=3, N=2).astype(dtype)
    for steps in (7, 3):
        expected = _monai_dvf2ddf(v, steps)
        actual = volsample.integrate_velocity(v, steps)
        assert actual.dtype == dtype
        assert_close(f"{steps} steps", actual, expected, tolerance, tolerance)
        assert_close(f"torch, {steps} steps", vt.integrate_velocity(torch.from_numpy(v), steps),
                     expected, tolerance, tolerance)


def test_integrate_velocity_closed_forms():
    """0 steps is v; a constant velocity inside the volume integrates to itself (its flow
    is a translation) wherever the points stay inside."""
    v = smooth_field((4, 5, 6), 1.0)
    assert_bitwise_equal("0 steps", volsample.integrate_velocity(v, 0), v)
    c = np.zeros((1, 9, 9, 9, 3))
    c[..., :] = (0.75, -0.5, 0.25)
    u = volsample.integrate_velocity(c, 5, padding_mode="border")
    assert_close("translation", u, c, 0, 1e-12)


def _sitk_jacobian(u):
    import SimpleITK as sitk

    image = sitk.GetImageFromArray(u, isVector=True)  # components x, y, z: ITK's order
    return sitk.GetArrayFromImage(sitk.DisplacementFieldJacobianDeterminantFilter().Execute(image))


def test_jacobian_determinant_matches_simpleitk_inside():
    """Central differences inside: ITK's filter at unit spacing, to round-off. (At the
    border ITK takes half a one-sided difference; volsample takes a one-sided one.)"""
    pytest.importorskip("SimpleITK")
    u = smooth_field((6, 7, 8), 2.0, seed=4, N=2) + np.random.default_rng(5).normal(
        0, 0.2, (2, 6, 7, 8, 3))
    ours = volsample.jacobian_determinant(u)
    for n in range(2):
        theirs = _sitk_jacobian(u[n])
        assert_close(f"batch {n}", ours[n, 1:-1, 1:-1, 1:-1], theirs[1:-1, 1:-1, 1:-1],
                     1e-12, 1e-12)


def test_jacobian_determinant_stencil_and_closed_form():
    """An affine displacement u(x) = A x has every difference exact, border ones too:
    det(I + A) everywhere. The border uses one-sided differences (NumPy's gradient)."""
    D, H, W = 4, 5, 2
    z, y, x = np.meshgrid(np.arange(D), np.arange(H), np.arange(W), indexing="ij")
    A = np.array([[0.1, 0.2, -0.3], [0.05, -0.2, 0.1], [0.3, 0.0, 0.4]])  # rows u_x, u_y, u_z
    u = (np.stack([x, y, z], -1) @ A.T)[None]
    assert_close("affine", volsample.jacobian_determinant(u), np.full((1, D, H, W),
                 np.linalg.det(np.eye(3) + A)), 0, 1e-12)
    rng = np.random.default_rng(6)
    u = rng.normal(0, 0.3, (1, 3, 4, 5, 3))
    M = np.empty((3, 4, 5, 3, 3))
    for a in range(3):
        for b, axis in enumerate((2, 1, 0)):
            M[..., a, b] = (a == b) + np.gradient(u[0, ..., a], axis=axis)
    assert_close("np.gradient stencil", volsample.jacobian_determinant(u)[0], np.linalg.det(M),
                 1e-12, 1e-12)
    one = rng.normal(0, 0.3, (1, 1, 4, 5, 3))  # a single plane: no derivative along z
    M = np.empty((4, 5, 3, 3))
    for a in range(3):
        for b, axis in enumerate((1, 0)):
            M[..., a, b] = (a == b) + np.gradient(one[0, 0, ..., a], axis=axis)
        M[..., a, 2] = (a == 2)
    assert_close("one plane", volsample.jacobian_determinant(one)[0, 0], np.linalg.det(M),
                 1e-12, 1e-12)


def test_torch_tools_match_numpy_and_are_differentiable():
    u, v = smooth_field((3, 4, 5), 1.0, seed=7), smooth_field((3, 4, 5), 1.0, seed=8)
    tu, tv = torch.tensor(u, requires_grad=True), torch.tensor(v, requires_grad=True)
    assert_close("compose", vt.compose(tu, tv).detach(), volsample.compose(u, v), 0, 1e-14)
    assert_close("jacobian", vt.jacobian_determinant(tu).detach(),
                 volsample.jacobian_determinant(u), 0, 1e-14)
    assert torch.autograd.gradcheck(lambda a, b: vt.compose(a, b, "border"), (tu, tv))
    assert torch.autograd.gradcheck(vt.jacobian_determinant, (tu,))
    assert torch.autograd.gradcheck(lambda a: vt.integrate_velocity(a, 2), (tv,))


def test_sixteen_bit_fields():
    u = smooth_field((3, 4, 5), 1.0).astype(np.float16)
    det = volsample.jacobian_determinant(u)
    assert det.dtype == np.float16
    assert_close("float16", det, volsample.jacobian_determinant(u.astype(np.float64)), 2e-3, 2e-3)
    assert volsample.compose(u, u).dtype == np.float16


@pytest.mark.parametrize("call,error,match", [
    (lambda: volsample.compose(np.zeros((1, 2, 2, 2, 3)), np.zeros((1, 2, 2, 3, 3))),
     volsample.InvalidArgumentError, r"v: expected the shape of u, \(1, 2, 2, 2, 3\)"),
    (lambda: volsample.compose(np.zeros((1, 2, 2, 2, 2)), np.zeros((1, 2, 2, 2, 2))),
     volsample.InvalidArgumentError,
     r"u: expected a displacement field of shape \(N, D, H, W, 3\)"),
    (lambda: volsample.compose(np.zeros((1, 2, 2, 2, 3)), np.zeros((1, 2, 2, 2, 3), np.float32)),
     volsample.UnsupportedDTypeError, r"v: expected dtype float64 \(the dtype of u\)"),
    (lambda: volsample.integrate_velocity(np.zeros((2, 2, 2, 3))), volsample.InvalidArgumentError,
     r"v: expected a displacement field"),
    (lambda: volsample.integrate_velocity(np.zeros((1, 2, 2, 2, 3)), steps=-1),
     volsample.InvalidArgumentError, r"steps: expected an integer >= 0, got -1"),
    (lambda: volsample.jacobian_determinant(np.zeros((1, 2, 2, 2, 3), np.int32)),
     volsample.UnsupportedDTypeError, r"u: expected dtype float16"),
    (lambda: vt.compose(torch.zeros(1, 2, 2, 2, 3), torch.zeros(1, 2, 2, 2)),
     volsample.InvalidArgumentError, r"v: expected a displacement field"),
])
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("module", ["volsample.fields", "volsample.warp", "volsample.torch._warp"])
def test_docstring_examples(module):
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed
