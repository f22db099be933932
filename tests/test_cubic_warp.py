"""warp_3d and warp_3d_backward in the cubic modes (bicubic, bspline), NumPy API, C++
backend: bit for bit grid_sample_3d on the grid the warp computes (affine_grid(theta) +
displacement, formed in the kernel's order and precision), grad_theta that grid's
gradient reduced in float64, the float64 reference, finite differences for theta and the
displacement, the adjoint identity for grad_input. (Bits across thread counts and
instruction sets: test_warp.py, every mode; volsample.torch.warp: test_torch_warp.py.)"""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_bitwise_equal, assert_close

import volsample
from volsample import _coords
from volsample import _reference as reference

CUBIC = ["bicubic", "bspline"]
PADDINGS = ["zeros", "border", "reflection"]
ALL_MODES = list(itertools.product(CUBIC, PADDINGS, [False, True]))
BF16 = np.dtype(ml_dtypes.bfloat16)
# Odd shapes: size-1 axes in and out, fewer voxels than taps, output larger than input.
SHAPES = [((4, 5, 6), (3, 4, 5)), ((1, 3, 2), (2, 1, 3)), ((3, 2, 5), (5, 7, 2))]
OPERANDS = [(True, True), (True, False), (False, True)]  # theta given, displacement given


def kernel_grid(theta, displacement, size, input_spatial, align_corners, units, dtype):
    """The grid a warp samples, each point's coordinate formed as the kernel forms it
    (src/cpp/grid_warp.h): ``c_k = t_k0 bx + ((t_k1 by + t_k2 bz) + t_k3) + u_k s_k``,
    every operation rounded to ``dtype`` (the base grid and s rounded from float64)."""
    dtype = np.dtype(dtype)
    if theta is None:
        theta = np.broadcast_to(np.eye(3, 4), (displacement.shape[0], 3, 4))
    t = np.asarray(theta).astype(dtype)[:, :, None, None, None, :]  # (N, 3, 1, 1, 1, 4)
    D, H, W = size
    bx, by, bz = (_coords.base(np.arange(n, dtype=np.float64), n, align_corners).astype(dtype)
                  for n in (W, H, D))
    c = t[..., 0] * bx + ((t[..., 1] * by[:, None] + t[..., 2] * bz[:, None, None])
                          + t[..., 3])
    grid = np.moveaxis(c, 1, -1)  # (N, D, H, W, 3)
    if displacement is not None:
        scale = reference.displacement_scale(input_spatial, align_corners, units).astype(dtype)
        grid = grid + displacement.astype(dtype) * scale
    return grid, (bx, by, bz)


def _case(rng, in_spatial, out_spatial, dtype, coord_dtype, N=2, C=2, spread=0.3):
    x = rng.standard_normal((N, C) + in_spatial).astype(dtype)
    theta = (np.eye(3, 4) + spread * rng.standard_normal((N, 3, 4))).astype(coord_dtype)
    u = (spread * rng.standard_normal((N,) + out_spatial + (3,))).astype(coord_dtype)
    go = rng.standard_normal((N, C) + out_spatial).astype(dtype)
    return x, theta, u, go


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
@pytest.mark.parametrize("dtype,coord_dtype,layout", [
    (np.float64, np.float64, "NCDHW"), (np.float32, np.float32, "NDHWC"),
    (np.float16, np.float32, "NCDHW"), (BF16, np.float64, "NDHWC")])
def test_bitwise_grid_sample_of_the_computed_grid(mode, padding_mode, align_corners, dtype,
                                                  coord_dtype, layout):
    """The output, grad_input and grad_displacement are grid_sample_3d's bits on the grid
    the warp computes (grad_displacement: grad_grid times the units' scale, rounded);
    grad_theta is that grad_grid times the base grid, summed in float64 and rounded once."""
    rng = np.random.default_rng(abs(hash((mode, padding_mode, align_corners, layout))) % 2**32)
    to_layout = (lambda a: a.transpose(0, 2, 3, 4, 1)) if layout == "NDHWC" else (lambda a: a)
    for (in_spatial, out_spatial), operands, units in itertools.product(
            SHAPES, OPERANDS, ["normalized", "voxels"]):
        x, theta, u, go = _case(rng, in_spatial, out_spatial, dtype, coord_dtype)
        theta = theta if operands[0] else None
        u = u if operands[1] else None
        what = f"{in_spatial}->{out_spatial} theta={operands[0]} u={operands[1]} {units}"
        grid, (bx, by, bz) = kernel_grid(theta, u, out_spatial, in_spatial, align_corners,
                                         units, coord_dtype)
        sampling = (mode, padding_mode, align_corners)
        out = volsample.warp_3d(to_layout(x), theta, u, out_spatial, *sampling, layout=layout,
                                displacement_units=units)
        assert_bitwise_equal(f"output {what}", out, volsample.grid_sample_3d(
            to_layout(x), grid, *sampling, layout=layout))
        gi, gt, gd = volsample.warp_3d_backward(to_layout(go), to_layout(x), theta, u,
                                                *sampling, layout=layout,
                                                displacement_units=units)
        ri, rg = volsample.grid_sample_3d_backward(to_layout(go), to_layout(x), grid, *sampling,
                                                   layout=layout)
        assert_bitwise_equal(f"grad_input {what}", gi, ri)
        if u is not None:
            scale = reference.displacement_scale(in_spatial, align_corners, units)
            assert_bitwise_equal(f"grad_displacement {what}", gd,
                                 rg * scale.astype(coord_dtype))
        if theta is not None:
            z, y, xx = np.meshgrid(bz, by, bx, indexing="ij")
            base = np.stack([xx, y, z, np.ones_like(z)], -1).astype(np.float64)
            expected = np.einsum("ndhwk,dhwj->nkj", rg.astype(np.float64), base)
            size = np.abs(rg.astype(np.float64)).sum((1, 2, 3))[:, :, None]
            eps = np.finfo(coord_dtype).eps
            assert np.all(np.abs(gt - expected) <= eps * np.abs(expected) + 1e-12 * size), what


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_float64_reference(mode, padding_mode, align_corners):
    """The float64 reference (grid sampling on affine_grid(theta) + displacement, stored
    in float64), to round-off."""
    rng = np.random.default_rng(3)
    x, theta, u, go = _case(rng, (5, 4, 6), (3, 6, 4), np.float64, np.float64)
    sampling = (mode, padding_mode, align_corners)
    out = volsample.warp_3d(x, theta, u, None, *sampling, displacement_units="voxels")
    assert_close("output", out, reference.warp_3d(x, theta, u, None, *sampling, "voxels"),
                 1e-12, 1e-12)
    actual = volsample.warp_3d_backward(go, x, theta, u, *sampling,
                                        displacement_units="voxels")
    expected = reference.warp_3d_backward(go, x, theta, u, *sampling, "voxels")
    for name, a, e in zip(("grad_input", "grad_theta", "grad_displacement"), actual, expected):
        assert_close(name, a, e, 1e-11, 1e-11)


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_gradients_are_finite_differences(mode, padding_mode, align_corners):
    """float64 central differences of <warp_3d(x, theta, u), g> in every entry of theta
    and of the displacement (in voxels), and the adjoint identity <warp(x), g> =
    <x, grad_input(g)> (the warp is linear in x)."""
    rng = np.random.default_rng(4)
    x, theta, u, go = _case(rng, (4, 5, 6), (2, 3, 4), np.float64, np.float64, N=1)
    sampling = (mode, padding_mode, align_corners)

    def loss(t, d):
        return float((volsample.warp_3d(x, t, d, None, *sampling, displacement_units="voxels")
                      * go).sum())

    gi, gt, gd = volsample.warp_3d_backward(go, x, theta, u, *sampling,
                                            displacement_units="voxels")
    step = 1e-6
    for name, operand, analytic in (("theta", theta, gt), ("displacement", u, gd)):
        numeric = np.zeros_like(operand)
        for index in np.ndindex(operand.shape):
            plus, minus = operand.copy(), operand.copy()
            plus[index] += step
            minus[index] -= step
            pair = ((plus, u), (minus, u)) if name == "theta" else ((theta, plus), (theta, minus))
            numeric[index] = (loss(*pair[0]) - loss(*pair[1])) / (2 * step)
        assert_close(f"grad_{name}", analytic, numeric, 1e-5, 1e-6)
    lhs = float((volsample.warp_3d(x, theta, u, None, *sampling, displacement_units="voxels")
                 * go).sum())
    rhs = float((x * gi).sum())
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))
