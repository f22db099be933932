"""warp_3d and warp_3d_backward (NumPy API, C++ backend): sampling at
``affine_grid(theta) + displacement`` without the grid, against sampling the stored grid
(volsample's grid_sample_3d and the float64 reference), PyTorch's affine_grid +
grid_sample through autograd, and bit equality across thread counts and instruction sets.
"""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_bitwise_equal, assert_close

import volsample
from volsample import _calls, _cpu, _prepared
from volsample import _reference as reference
from volsample._cpu import warp as cpu_warp

BF16 = np.dtype(ml_dtypes.bfloat16)
ALL_MODES = list(itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"],
                                   [False, True]))
UNITS = ["normalized", "voxels"]
# theta and displacement each given or None
OPERANDS = [(True, True), (True, False), (False, True), (False, False)]


def make_case(rng, N=2, C=3, in_spatial=(4, 5, 6), out_spatial=(3, 4, 5), dtype=np.float64,
              spread=0.25):
    """A volume, a theta near the identity (some points reach outside) and a displacement
    of about ``spread`` normalised units, and a grad_output."""
    x = rng.standard_normal((N, C) + in_spatial).astype(dtype)
    theta = np.eye(3, 4) + spread * rng.standard_normal((N, 3, 4))
    displacement = spread * rng.standard_normal((N,) + out_spatial + (3,))
    grad_output = rng.standard_normal((N, C) + out_spatial).astype(dtype)
    return x, theta, displacement, grad_output


def given(operands, theta, displacement):
    use_theta, use_displacement = operands
    return theta if use_theta else None, displacement if use_displacement else None


# Odd shapes on purpose: size-1 axes in and out (align_corners' degenerate (S-1)/2 = 0 and
# the single base point at 0), primes, output larger than input.
SHAPES = [((4, 5, 6), (3, 4, 5)), ((1, 3, 1), (2, 1, 3)), ((3, 2, 5), (5, 7, 2))]


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
@pytest.mark.parametrize("units", UNITS)
def test_float64_equals_sampling_the_stored_grid(mode, padding_mode, align_corners, units):
    """float64: warp_3d equals grid_sample_3d on affine_grid(theta) + displacement, and so
    do all three gradients the chain rule gives, to round-off."""
    rng = np.random.default_rng(0)
    for (in_spatial, out_spatial), operands in itertools.product(SHAPES, OPERANDS):
        x, theta, u, go = make_case(rng, in_spatial=in_spatial, out_spatial=out_spatial)
        theta, u = given(operands, theta, u)
        grid = reference.warp_grid(theta if theta is not None else np.broadcast_to(
            np.eye(3, 4), (2, 3, 4)), u, out_spatial, in_spatial, align_corners, units)
        what = f"{in_spatial}->{out_spatial} theta={operands[0]} u={operands[1]}"
        out = volsample.warp_3d(x, theta, u, out_spatial, mode, padding_mode, align_corners,
                                displacement_units=units)
        assert_close(f"output {what}", out,
                     volsample.grid_sample_3d(x, grid, mode, padding_mode, align_corners),
                     1e-12, 1e-12)
        gi, gt, gd = volsample.warp_3d_backward(go, x, theta, u, mode, padding_mode,
                                                align_corners, displacement_units=units)
        ri, rt, rd = reference.warp_3d_backward(go, x, theta, u, mode, padding_mode,
                                                align_corners, units)
        assert_close(f"grad_input {what}", gi, ri, 1e-12, 1e-12)
        assert (gt is None) == (theta is None) and (gd is None) == (u is None)
        if theta is not None:
            assert_close(f"grad_theta {what}", gt, rt, 1e-11, 1e-11)
        if u is not None:
            assert_close(f"grad_displacement {what}", gd, rd, 1e-12, 1e-12)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("units", UNITS)
def test_float32_within_the_coordinate_rounding(layout, units):
    """float32 against the float64 reference on the same float32 operands. The point's
    coordinate is formed in float32 (a few ulp of its size, and so a few ulp of the
    voxel coordinate times S/2 voxels away from the stored float64 grid's), so a value moves
    by at most the volume's slope (|v| <= 4 per voxel here) times that: atol 1e-4. The
    gradients are sums of such terms (grad_theta over every point: 1e-3 relative)."""
    rng = np.random.default_rng(1)
    x, theta, u, go = make_case(rng, N=2, C=2, in_spatial=(7, 9, 8), out_spatial=(6, 5, 11),
                                dtype=np.float32)
    theta, u = theta.astype(np.float32), u.astype(np.float32)
    if units == "voxels":
        u = u * 3
    to_layout = (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 4, 1))) \
        if layout == "NDHWC" else (lambda a: a)
    from_layout = (lambda a: a.transpose(0, 4, 1, 2, 3)) if layout == "NDHWC" else (lambda a: a)
    for mode, padding_mode, align_corners in ALL_MODES:
        if mode == "nearest":  # a coordinate rounding may pick the neighbour at a tie
            continue
        out = volsample.warp_3d(to_layout(x), theta, u, None, mode, padding_mode, align_corners,
                                layout=layout, displacement_units=units)
        assert out.dtype == np.float32
        expected = reference.warp_3d(x, theta, u, None, mode, padding_mode, align_corners, units)
        assert_close("output", from_layout(out), expected, 1e-5, 1e-4)
        gi, gt, gd = volsample.warp_3d_backward(to_layout(go), to_layout(x), theta, u, mode,
                                                padding_mode, align_corners, layout=layout,
                                                displacement_units=units)
        ri, rt, rd = reference.warp_3d_backward(go, x, theta, u, mode, padding_mode,
                                                align_corners, units)
        assert gi.dtype == gt.dtype == gd.dtype == np.float32
        assert_close("grad_input", from_layout(gi), ri, 1e-5, 1e-4)
        assert_close("grad_theta", gt, rt, 1e-3, 1e-2)
        assert_close("grad_displacement", gd, rd, 1e-4, 1e-3)


@pytest.mark.parametrize("dtype,coord_dtype", [(np.float16, np.float16), (BF16, BF16),
                                               (np.float16, np.float32), (BF16, np.float64)])
def test_sixteen_bit(dtype, coord_dtype):
    """16-bit volumes compute in float32 (float64 beside float64 coordinates) and round
    once: within half an ulp of the result's own precision of the float64 truth on the
    same rounded operands (plus float32 noise)."""
    rng = np.random.default_rng(2)
    x, theta, u, go = make_case(rng, dtype=dtype)
    theta, u = theta.astype(coord_dtype), u.astype(coord_dtype)
    ulp = 2.0 ** -8 if dtype == BF16 else 2.0 ** -11
    out = volsample.warp_3d(x, theta, u, padding_mode="border")
    assert out.dtype == np.dtype(dtype)
    expected = reference.warp_3d(x, theta, u, padding_mode="border")
    assert_close("output", out, expected, ulp, 1e-3)
    gi, gt, gd = volsample.warp_3d_backward(go, x, theta, u, padding_mode="border")
    assert gi.dtype == np.dtype(dtype) and gt.dtype == gd.dtype == np.dtype(coord_dtype)
    ri, rt, rd = reference.warp_3d_backward(go, x, theta, u, padding_mode="border")
    assert_close("grad_input", gi, ri, ulp, 1e-3)
    coord_ulp = 2.0 ** -8 if coord_dtype == BF16 else 2.0 ** -11 if coord_dtype == np.float16 \
        else 1e-5
    assert_close("grad_theta", gt, rt, coord_ulp, 1e-2)
    assert_close("grad_displacement", gd, rd, coord_ulp, 1e-3)


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_gradients_match_pytorch_autograd(padding_mode, align_corners):
    """The three gradients equal autograd's through PyTorch's own F.affine_grid + the
    displacement (in voxels, converted) + F.grid_sample, in float64."""
    rng = np.random.default_rng(3)
    x, theta, u, go = make_case(rng, in_spatial=(5, 4, 6), out_spatial=(3, 6, 4))
    u = u * 2  # voxels
    tx, ttheta, tu = (torch.tensor(a, requires_grad=True) for a in (x, theta, u))
    D, H, W = x.shape[2:]
    scale = torch.tensor([2 / (n - 1) if align_corners else 2 / n for n in (W, H, D)],
                         dtype=torch.float64)
    grid = F.affine_grid(ttheta, [2, 3, 3, 6, 4], align_corners=align_corners) + tu * scale
    out = F.grid_sample(tx, grid, "bilinear", padding_mode, align_corners)
    expected = torch.autograd.grad(out, (tx, ttheta, tu), torch.tensor(go))
    ours = volsample.warp_3d(x, theta, u, None, "bilinear", padding_mode, align_corners,
                             displacement_units="voxels")
    assert_close("output", ours, out.detach().numpy(), 1e-12, 1e-12)
    actual = volsample.warp_3d_backward(go, x, theta, u, "bilinear", padding_mode,
                                        align_corners, displacement_units="voxels")
    for name, a, e in zip(("grad_input", "grad_theta", "grad_displacement"), actual, expected):
        assert_close(name, a, e.numpy(), 1e-11, 1e-11)


def test_affine_map_of_a_linear_volume_is_exact():
    """A volume linear in the voxel coordinates is interpolated exactly, so the warp of an
    affine map is that function at the mapped points, and its theta gradient is known in
    closed form: d/dtheta[k, j] sum(out) = sum over points of slope_k * (S_k / 2) * b_j."""
    D, H, W = 6, 7, 8
    z, y, x = np.meshgrid(np.arange(D), np.arange(H), np.arange(W), indexing="ij")
    slopes = np.array([0.5, -1.0, 2.0])  # per voxel along x, y, z
    volume = (slopes[0] * x + slopes[1] * y + slopes[2] * z + 3.0)[None, None].astype(np.float64)
    theta = np.array([[[0.9, 0.05, 0.0, 0.02], [0.0, 0.8, 0.1, -0.03], [0.05, 0.0, 0.85, 0.01]]])
    out = volsample.warp_3d(volume, theta, align_corners=False)
    base = reference.base_grid((D, H, W), False)
    coords = base @ theta[0].T  # normalised (x, y, z) where each point samples (all inside)
    voxel = ((coords + 1) * np.array([W, H, D]) - 1) / 2
    assert_close("output", out[0, 0], voxel @ slopes + 3.0, 1e-12, 1e-12)
    _, grad_theta, _ = volsample.warp_3d_backward(np.ones_like(out), volume, theta)
    per_axis = slopes * np.array([W, H, D]) / 2  # d value / d normalised coordinate
    expected = per_axis[:, None] * base.reshape(-1, 4).sum(0)[None, :]
    assert_close("grad_theta", grad_theta[0], expected, 1e-12, 1e-10)


def test_nearest_has_no_coordinate_gradient_and_labels_copy_exactly():
    rng = np.random.default_rng(4)
    x, theta, u, go = make_case(rng)
    _, gt, gd = volsample.warp_3d_backward(go, x, theta, u, "nearest")
    assert not gt.any() and not gd.any()
    labels = rng.integers(0, 50, (2, 1, 4, 5, 6)).astype(np.int16)
    out = volsample.warp_3d(labels, theta.astype(np.float32), u.astype(np.float32), None,
                            "nearest", "border")
    assert out.dtype == np.int16
    grid = reference.warp_grid(theta.astype(np.float32), u.astype(np.float32), (3, 4, 5),
                               (4, 5, 6)).astype(np.float32)
    as_float = volsample.grid_sample_3d(labels.astype(np.float32), grid, "nearest", "border")
    # the same voxels wherever the float32 coordinate is not within rounding of a tie
    assert (out == as_float).mean() > 0.99


def test_size_forms_and_defaults():
    rng = np.random.default_rng(5)
    x, theta, u, _ = make_case(rng)
    a = volsample.warp_3d(x, theta, size=(3, 4, 5))
    b = volsample.warp_3d(x, theta, size=(2, 3, 3, 4, 5))  # as affine_grid takes it
    assert_bitwise_equal("size forms", a, b)
    assert volsample.warp_3d(x, theta).shape == x.shape  # the input's size
    assert volsample.warp_3d(x, None, u).shape == (2, 3, 3, 4, 5)  # the displacement's
    assert_bitwise_equal("identity", volsample.warp_3d(x), volsample.warp_3d(x, np.broadcast_to(
        np.eye(3, 4), (2, 3, 4))))
    # the identity warp at the input's size and align_corners reads every voxel centre
    assert_close("identity samples the voxels", volsample.warp_3d(x, align_corners=True), x,
                 0, 1e-15)


def test_output_mask_and_empty():
    rng = np.random.default_rng(6)
    x, theta, u, go = make_case(rng)
    full = volsample.warp_3d_backward(go, x, theta, u)
    for mask in itertools.product([False, True], repeat=3):
        part = volsample.warp_3d_backward(go, x, theta, u, output_mask=mask)
        for want, got, ref in zip(mask, part, full):
            if want:
                assert_bitwise_equal(f"mask {mask}", got, ref)
            else:
                assert got is None
    empty = np.zeros((2, 0, 4, 5, 6))
    gi, gt, gd = volsample.warp_3d_backward(np.zeros((2, 0, 3, 4, 5)), empty, theta, u)
    assert gi.shape == empty.shape and not gt.any() and not gd.any()


def test_non_finite_coordinates_contribute_nothing():
    """A NaN or infinite theta row, or displacement, leaves its points at 0 with no
    gradient, in every padding mode (as a non-finite grid point)."""
    rng = np.random.default_rng(7)
    x, theta, u, go = make_case(rng)
    u[0, 1, 2, 3] = (np.nan, 0, 0)
    u[1, 0, 0, 0] = (0, np.inf, 0)
    theta[1, 2, 3] = np.nan  # every point of batch 1
    for padding_mode in ("zeros", "border", "reflection"):
        out = volsample.warp_3d(x, theta, u, padding_mode=padding_mode)
        assert not out[0, :, 1, 2, 3].any() and not out[1].any()
        gi, gt, gd = volsample.warp_3d_backward(go, x, theta, u, padding_mode=padding_mode)
        assert not gi[1].any() and not gt[1].any() and not gd[1].any()
        assert not gd[0, 1, 2, 3].any() and np.isfinite(gt[0]).all()


def _threads_and_isas(call):
    """``call(threads)`` under every ISA this CPU runs and thread counts 1, 2 and 5."""
    previous = _cpu.isa()
    try:
        for isa in _cpu.supported_isas():
            _cpu.set_isa(isa)
            for threads in (1, 2, 5):
                yield f"{isa} {threads} threads", call(threads)
    finally:
        _cpu.set_isa(previous)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16])
@pytest.mark.parametrize("padding_mode", ["zeros", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "bspline"])
def test_bitwise_across_threads_and_isas(mode, dtype, padding_mode):
    """The same bits for every thread count (1, 2, 5: one slab, balanced slabs, the
    gradient beside the scatter) and every ISA, grad_theta included (its per-row sums
    are width-independent and reduced in row order). Odd widths: no whole vectors."""
    rng = np.random.default_rng(8)
    N, C, spatial = 1, 2, (9, 11, 13)
    x = rng.standard_normal((N, C) + spatial).astype(dtype)
    theta = (np.eye(3, 4) + 0.1 * rng.standard_normal((N, 3, 4))).astype(
        np.float32 if dtype == BF16 else dtype)
    u = (0.05 * rng.standard_normal((N,) + spatial + (3,))).astype(theta.dtype)
    go = rng.standard_normal((N, C) + spatial).astype(dtype)
    call = _calls.warp_backward(*(_calls.operand(n, a) for n, a in (
        ("grad_output", go), ("input", x), ("theta", theta), ("displacement", u))),
        volsample._tables.MODES.code(mode), volsample._tables.PADDINGS.code(padding_mode), True,
        1)

    def run(threads):
        out = np.empty(x.shape, dtype)
        cpu_warp.forward(call, x, theta, u, out, threads=threads)
        grads = (np.empty(x.shape, dtype), np.empty((N, 3, 4), theta.dtype),
                 np.empty(u.shape, u.dtype))
        cpu_warp.backward(call, go, x, theta, u, *grads, threads=threads)
        return (out,) + grads

    results = list(_threads_and_isas(run))
    first_name, first = results[0]
    for name, result in results[1:]:
        for what, a, b in zip(("output", "grad_input", "grad_theta", "grad_displacement"),
                              result, first):
            assert_bitwise_equal(f"{what}: {name} vs {first_name}", a, b)


def test_workspace_counts_theta_sums():
    rng = np.random.default_rng(9)
    x, theta, u, go = make_case(rng)
    ops = [_calls.operand(n, a) for n, a in (("grad_output", go), ("input", x), ("theta", theta),
                                            ("displacement", u))]
    with_theta = _calls.warp_backward(*ops, 0, 0, False, 0, (False, True, False))
    without = _calls.warp_backward(*ops, 0, 0, False, 0, (False, False, True))
    rows = 2 * 3 * 4
    assert cpu_warp.workspace_nbytes(with_theta, 1) - cpu_warp.workspace_nbytes(without, 1) == \
        24 * 8 * rows  # six float64 sums in four slots per output row


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(theta=np.zeros((2, 3, 3))), volsample.InvalidArgumentError,
     r"theta: expected shape \(N, 3, 4\) = \(2, 3, 4\)"),
    (dict(theta=np.zeros((1, 3, 4))), volsample.InvalidArgumentError, r"theta: .*got \(1, 3, 4\)"),
    (dict(theta=np.zeros((3, 4))), volsample.InvalidArgumentError, r"theta: expected a 3-D"),
    (dict(displacement=np.zeros((2, 3, 4, 5, 2))), volsample.InvalidArgumentError,
     r"displacement: expected shape \(N, D, H, W, 3\)"),
    (dict(displacement=np.zeros((2, 3, 4, 5, 3)), size=(3, 4, 6)),
     volsample.InvalidArgumentError, r"size: expected the displacement's spatial size"),
    (dict(size=(1, 3, 3, 4, 5)), volsample.InvalidArgumentError, r"size: expected N, C = \(2, 3\)"),
    (dict(size=(3, 4)), volsample.InvalidArgumentError, r"size: expected None, \(D, H, W\)"),
    (dict(size=(3, 0, 4)), volsample.InvalidArgumentError, r"size: expected integers in \[1"),
    (dict(theta=np.zeros((2, 3, 4), np.float32)), volsample.UnsupportedDTypeError,
     r"theta: expected dtype float64"),
    (dict(theta=np.zeros((2, 3, 4)), displacement=np.zeros((2, 3, 4, 5, 3), np.float32)),
     volsample.UnsupportedDTypeError, r"displacement: expected dtype float64"),
    (dict(displacement_units="mm"), volsample.InvalidArgumentError,
     r"displacement_units: expected one of 'normalized', 'voxels', got 'mm'"),
    (dict(mode="cubic"), volsample.InvalidArgumentError, r"mode: expected one of"),
])
def test_errors_name_the_argument(kwargs, error, match):
    x = np.zeros((2, 3, 4, 5, 6))
    with pytest.raises(error, match=match):
        volsample.warp_3d(x, **kwargs)


def test_backward_errors():
    x, go = np.zeros((2, 3, 4, 5, 6)), np.zeros((2, 3, 3, 4, 5))
    with pytest.raises(volsample.InvalidArgumentError, match=r"output_mask: expected 3 bools"):
        volsample.warp_3d_backward(go, x, output_mask=(True, True))
    with pytest.raises(volsample.InvalidArgumentError, match=r"grad_output: expected shape"):
        volsample.warp_3d_backward(go, x, displacement=np.zeros((2, 3, 4, 4, 3)))
    with pytest.raises(volsample.UnsupportedDTypeError,
                       match=r"grad_output: expected dtype float64"):
        volsample.warp_3d_backward(go.astype(np.float32), x)


# ---------------------------------------------------------------------------------------
# Results written into the caller's arrays (out=, grad_displacement_out=)
# ---------------------------------------------------------------------------------------


def _warp_case():
    rng = np.random.default_rng(40)
    volume = rng.standard_normal((1, 2, 5, 6, 7)).astype(np.float32)
    theta = (np.eye(3, 4) + 0.05 * rng.standard_normal((3, 4)))[None].astype(np.float32)
    displacement = (0.1 * rng.standard_normal((1, 4, 5, 3, 3))).astype(np.float32)
    return volume, theta, displacement


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_warp_into_out_is_the_same_bits_as_a_new_result(layout):
    volume, theta, displacement = _warp_case()
    if layout == "NDHWC":
        volume = np.ascontiguousarray(volume.transpose(0, 2, 3, 4, 1))
    expected = volsample.warp_3d(volume, theta, displacement, layout=layout)
    out = np.full(expected.shape, np.nan, np.float32)
    got = volsample.warp_3d(volume, theta, displacement, layout=layout, out=out)
    assert got is out
    assert_bitwise_equal("warp_3d into out", out, expected)
    # a part of a larger volume (any strides, every mode): written there, the rest untouched
    for mode in ("bilinear", "nearest", "bicubic"):
        expected = volsample.warp_3d(volume, theta, displacement, mode=mode, layout=layout)
        larger = np.full(tuple(n + 3 for n in expected.shape), 7.0, np.float32)
        inside = tuple(slice(1, n + 1) for n in expected.shape)
        part = larger[inside]
        got = volsample.warp_3d(volume, theta, displacement, mode=mode, layout=layout, out=part)
        assert got is part
        assert_bitwise_equal(f"warp_3d {mode} into a part", part, expected)
        outside = np.ones(larger.shape, bool)
        outside[inside] = False
        assert (larger[outside] == 7).all()


def test_warp_backward_into_grad_displacement_out_is_the_same_bits():
    volume, theta, displacement = _warp_case()
    grad_output = np.random.default_rng(41).standard_normal((1, 2, 4, 5, 3)).astype(np.float32)
    _, _, expected = volsample.warp_3d_backward(grad_output, volume, theta, displacement)
    out = np.full(displacement.shape, np.nan, np.float32)
    _, _, got = volsample.warp_3d_backward(grad_output, volume, theta, displacement,
                                           grad_displacement_out=out)
    assert got is out
    assert_bitwise_equal("grad_displacement into out", out, expected)
    # a part of a larger field (any strides): written there, the rest untouched
    field = np.full((1, 6, 7, 5, 3), 7.0, np.float32)
    part = field[:, 1:5, 2:7, 1:4]
    volsample.warp_3d_backward(grad_output, volume, theta, displacement,
                               grad_displacement_out=part)
    assert_bitwise_equal("grad_displacement into a part", part, expected)
    outside = np.ones(field.shape, bool)
    outside[:, 1:5, 2:7, 1:4] = False
    assert (field[outside] == 7).all()


@pytest.mark.parametrize("case,error,match", [
    ("list", TypeError, "out: expected a NumPy array, got list"),
    ("dtype", TypeError, "out: expected dtype float32, got float64"),
    ("shape", ValueError, r"out: expected the result's shape \(1, 2, 4, 5, 3\), got \(1, 2, 4, 5, 4\)"),
    ("read-only", ValueError, "out: expected a writeable array"),
])
def test_warp_rejects_an_out_it_cannot_write(case, error, match):
    volume, theta, displacement = _warp_case()
    out = np.empty((1, 2, 4, 5, 3), np.float32)
    if case == "list":
        out = out.tolist()
    elif case == "dtype":
        out = out.astype(np.float64)
    elif case == "shape":
        out = np.empty((1, 2, 4, 5, 4), np.float32)
    else:
        out.flags.writeable = False
    with pytest.raises(error, match=match):
        volsample.warp_3d(volume, theta, displacement, out=out)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype, coord_dtype", [(np.float32, np.float32), (np.float64, np.float64),
                                                (np.float16, np.float32), (BF16, np.float32)],
                         ids=["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("operands", OPERANDS, ids=str)
def test_repeated_calls_run_on_their_own_arrays(layout, dtype, coord_dtype, operands):
    """Calls after the first of a key (the arrays' shapes, strides and dtypes, the other
    arguments, the thread count) run the kernel with the arguments worked out then
    (bfloat16: the general path; a 16-bit grad_input: the general backward), each on its
    own arrays (strided views at offsets, a grad_displacement_out inside a larger field),
    with the bits of the general path on contiguous copies, on 1 and 2 threads; a wrong
    argument of a prepared call still raises."""
    _prepared.forget_prepared_calls()
    rng = np.random.default_rng(12)
    sixteen = np.dtype(dtype).itemsize == 2
    threads = volsample.get_num_threads()
    arguments = ("bilinear", "reflection", True)
    try:
        for k in range(4):
            volsample.set_num_threads(1 + k % 2)
            x = rng.standard_normal((2, 3, 5, 6, 9)).astype(dtype)[..., 1::2]
            theta = (np.eye(3, 4) + 0.1 * rng.standard_normal((2, 3, 4))).astype(coord_dtype)
            u = (0.1 * rng.standard_normal((2, 4, 3, 6, 3))).astype(coord_dtype)[:, :, :, 1:]
            go = rng.standard_normal((2, 3, 4, 3, 6)).astype(dtype)[..., 1:]
            theta, u = given(operands, theta, u)
            field = np.full((2, 5, 4, 6, 3), np.nan, coord_dtype)
            part = None if u is None else field[:, 1:, 1:, 1:]
            stored_x, stored_go = (a.transpose(0, 2, 3, 4, 1) if layout == "NDHWC" else a
                                   for a in (x, go))
            size = (4, 3, 5) if u is None else None
            out = volsample.warp_3d(stored_x, theta, u, size, *arguments, layout=layout,
                                    displacement_units="voxels")
            grads = volsample.warp_3d_backward(stored_go, stored_x, theta, u, *arguments,
                                               layout=layout, displacement_units="voxels",
                                               grad_displacement_out=part)
            # the general path, on contiguous copies
            copies = [None if a is None else np.ascontiguousarray(a) for a in (go, x, theta, u)]
            call = _calls.warp_backward(*(None if a is None else _calls.operand(n, a) for n, a in
                                          zip(("grad_output", "input", "theta", "displacement"),
                                              copies)),
                                        volsample._tables.MODES.code("bilinear"),
                                        volsample._tables.PADDINGS.code("reflection"), True,
                                        volsample._tables.UNITS.code("voxels"))
            expected = np.empty(call.output_shape, dtype)
            cpu_warp.forward(call, *copies[1:], expected)
            expected_grads = (np.empty(x.shape, dtype),
                              None if theta is None else np.empty(theta.shape, coord_dtype),
                              None if u is None else np.empty(u.shape, coord_dtype))
            cpu_warp.backward(call, *copies, *expected_grads)
            if layout == "NDHWC":
                out = out.transpose(0, 4, 1, 2, 3)
                grads = (grads[0].transpose(0, 4, 1, 2, 3),) + grads[1:]
            assert_bitwise_equal(f"call {k}: output", out, expected)
            for name, ours, theirs in zip(("grad_input", "grad_theta", "grad_displacement"),
                                          grads, expected_grads):
                if theirs is None:
                    assert ours is None, name
                else:
                    assert_bitwise_equal(f"call {k}: {name}", ours, theirs)
            if part is not None:
                assert grads[2] is part
                outside = np.ones(field.shape, bool)
                outside[:, 1:, 1:, 1:] = False
                assert np.isnan(field[outside]).all()
        assert bool(_prepared.kept("warp_3d")) == (dtype != BF16)
        assert bool(_prepared.kept("warp_3d_backward")) == (not sixteen)
        with pytest.raises(volsample.InvalidArgumentError, match="align_corners"):
            volsample.warp_3d(stored_x, theta, u, size, "bilinear", "reflection", 1,
                              layout=layout, displacement_units="voxels")
        if part is not None:
            part.flags.writeable = False
            with pytest.raises(ValueError, match="grad_displacement_out: expected a writeable"):
                volsample.warp_3d_backward(stored_go, stored_x, theta, u, *arguments,
                                           layout=layout, displacement_units="voxels",
                                           grad_displacement_out=part)
    finally:
        volsample.set_num_threads(threads)


@pytest.mark.parametrize("argument,value", [("mode", ["bilinear"]), ("padding_mode", {}),
                                            ("align_corners", [True]), ("layout", ["NCDHW"]),
                                            ("displacement_units", ["voxels"]),
                                            ("output_mask", {})])
def test_unhashable_arguments_are_named(argument, value):
    """A call's prepared kernels are found by its arguments: one that cannot be a key (a
    list, a dict) is still the checks' to name, before and after the call is prepared."""
    volume, theta, displacement = _warp_case()
    grad_output = np.zeros((1, 2, 4, 5, 3), np.float32)
    for _ in range(2):
        if argument != "output_mask":
            with pytest.raises((TypeError, ValueError), match=f"^{argument}: "):
                volsample.warp_3d(volume, theta, displacement, **{argument: value})
        with pytest.raises((TypeError, ValueError), match=f"^{argument}: "):
            volsample.warp_3d_backward(grad_output, volume, theta, displacement,
                                       **{argument: value})
        volsample.warp_3d(volume, theta, displacement)
        volsample.warp_3d_backward(grad_output, volume, theta, displacement)


def test_a_prepared_warp_still_checks_its_out():
    """out's strides are part of a prepared call's key; its writability is checked on
    every call."""
    _prepared.forget_prepared_calls()
    volume, theta, displacement = _warp_case()
    expected = volsample.warp_3d(volume, theta, displacement)
    out = np.full(expected.shape, np.nan, np.float32)
    for _ in range(2):  # the second call runs the prepared kernel
        out[...] = np.nan
        assert volsample.warp_3d(volume, theta, displacement, out=out) is out
        assert_bitwise_equal("warp_3d into out", out, expected)
    assert len(_prepared.kept("warp_3d")) == 2  # with and without out
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: expected a writeable"):
        volsample.warp_3d(volume, theta, displacement, out=out)
