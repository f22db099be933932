"""Bicubic and cubic B-spline grid sampling (``mode="bicubic"``, ``"bspline"``) against the
float64 reference, PyTorch 2.13's 4-D bicubic (volumes constant along z), SciPy's
``map_coordinates(order=3, prefilter=False)``, finite differences and the adjoint identity;
bit equality across thread counts and instruction sets; errors."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_bitwise_equal, assert_close
from scipy import ndimage

import volsample
from volsample import _calls, _coords
from volsample import _reference as reference
from volsample._cpu import grid_sample as cpu_grid
from volsample._cpu import isa as cpu_isa
from volsample._cpu import set_isa, supported_isas
from volsample._tables import MODES as MODE_TABLE
from volsample._tables import PADDINGS as PADDING_TABLE

CUBIC = ["bicubic", "bspline"]
PADDINGS = ["zeros", "border", "reflection"]
ALL_MODES = list(itertools.product(CUBIC, PADDINGS, [False, True]))
BF16 = np.dtype(ml_dtypes.bfloat16)
# Odd shapes: primes, size-1 and size-2 axes (fewer voxels than taps).
CASES = [
    ((2, 3, 5, 7, 6), (2, 4, 3, 5)),
    ((1, 1, 1, 4, 5), (1, 3, 3, 3)),
    ((1, 2, 3, 2, 1), (1, 2, 5, 2)),
]


def _grid(rng, shape, spread=1.4):
    """Points in and around [-1, 1], some on voxel centres and edges, a few far outside."""
    grid = rng.uniform(-spread, spread, shape)
    flat = grid.reshape(-1, 3)
    flat[::7] = rng.choice([-1.0, 0.0, 1.0, -3.5, 2.25], size=flat[::7].shape)
    return grid


def _layouts(layout):
    if layout == "NDHWC":
        return (lambda a: a.transpose(0, 2, 3, 4, 1)), (lambda a: a.transpose(0, 4, 1, 2, 3))
    return (lambda a: a), (lambda a: a)


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_matches_reference(mode, padding_mode, align_corners, dtype, layout):
    rng = np.random.default_rng(abs(hash((mode, padding_mode, align_corners, layout))) % 2**32)
    to_layout, from_layout = _layouts(layout)
    for in_shape, out_shape in CASES:
        x = rng.standard_normal(in_shape).astype(dtype)
        grid = _grid(rng, out_shape + (3,)).astype(dtype)
        grad_out = rng.standard_normal(in_shape[:2] + out_shape[1:]).astype(dtype)
        out = volsample.grid_sample_3d(to_layout(x), grid, mode, padding_mode, align_corners,
                                       layout=layout)
        gi, gg = volsample.grid_sample_3d_backward(to_layout(grad_out), to_layout(x), grid, mode,
                                                   padding_mode, align_corners, layout=layout)
        assert out.dtype == x.dtype and gi.dtype == x.dtype and gg.dtype == grid.dtype
        expected = reference.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
        expected_gi, expected_gg = reference.grid_sample_3d_backward(
            grad_out, x, grid, mode, padding_mode, align_corners)
        tol = 1e-12 if dtype == np.float64 else 2e-5
        assert_close("output", from_layout(out), expected, tol, tol)
        assert_close("grad_input", from_layout(gi), expected_gi, tol, tol)
        assert_close("grad_grid", gg, expected_gg, tol, tol * max(1, np.abs(expected_gg).max()))


@pytest.mark.parametrize("mode", CUBIC)
@pytest.mark.parametrize("dtype,grid_dtype", [(np.float16, np.float16), (BF16, BF16),
                                              (np.float16, np.float32), (BF16, np.float64)],
                         ids=lambda d: np.dtype(d).name)
def test_sixteen_bit_rounds_once(mode, dtype, grid_dtype):
    """16-bit volumes are computed in float32 (float64 beside a float64 grid) and rounded
    once: within a unit in the last place or so of float64 maths on the same values."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 5, 6, 7)).astype(dtype)
    grid = _grid(rng, (1, 4, 5, 6, 3), 1.1).astype(grid_dtype)
    grad_out = rng.standard_normal((1, 3, 4, 5, 6)).astype(dtype)
    for padding_mode, align_corners in itertools.product(PADDINGS, [False, True]):
        out = volsample.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
        gi, gg = volsample.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode,
                                                   align_corners)
        assert out.dtype == x.dtype and gi.dtype == x.dtype and gg.dtype == grid.dtype
        truth = reference.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
        truth_gi, truth_gg = reference.grid_sample_3d_backward(grad_out, x, grid, mode,
                                                               padding_mode, align_corners)
        eps = float(np.finfo(dtype).eps)
        assert_close("output", out, truth, eps, 4 * eps)
        assert_close("grad_input", gi, truth_gi, eps, 4 * eps)
        scale = max(1.0, np.abs(truth_gg).max())
        grid_eps = float(np.finfo(grid_dtype).eps)
        assert_close("grad_grid", gg, truth_gg, 4 * grid_eps, 64 * grid_eps * scale)


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_strided_views(mode, padding_mode, align_corners):
    rng = np.random.default_rng(3)
    base = rng.standard_normal((2, 4, 6, 5, 14))
    x = base[:, ::2, ::-1, :, ::2]  # every other channel and W voxel, D reversed
    grid_base = _grid(rng, (2, 3, 4, 10, 3))
    grid = grid_base[:, :, ::-1, ::2]
    grad_out = rng.standard_normal((2, 5, 3, 4, 10))[:, 1::2, :, :, ::2]
    out = volsample.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
    gi, gg = volsample.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode,
                                               align_corners)
    assert_close("output", out, reference.grid_sample_3d(x, grid, mode, padding_mode,
                                                         align_corners), 1e-12, 1e-12)
    expected_gi, expected_gg = reference.grid_sample_3d_backward(grad_out, x, grid, mode,
                                                                 padding_mode, align_corners)
    assert_close("grad_input", gi, expected_gi, 1e-12, 1e-12)
    assert_close("grad_grid", gg, expected_gg, 1e-12, 1e-12)


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_output_mask(mode, padding_mode, align_corners):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 4, 5, 6))
    grid = _grid(rng, (1, 3, 3, 7, 3))
    grad_out = rng.standard_normal((1, 2, 3, 3, 7))
    both = volsample.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode, align_corners)
    gi, none = volsample.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode,
                                                 align_corners, (True, False))
    assert none is None
    assert_bitwise_equal("grad_input", gi, both[0])
    none, gg = volsample.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode,
                                                 align_corners, (False, True))
    assert none is None
    assert_bitwise_equal("grad_grid", gg, both[1])


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_non_finite_points_contribute_nothing(mode, padding_mode, align_corners):
    """NaN and infinite coordinates: output 0, no scatter, grad_grid 0; huge finite ones
    neither crash nor make anything non-finite (zeros: they read nothing)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 2, 4, 3, 5))
    grid = rng.uniform(-1.2, 1.2, (2, 3, 4, 5, 3))
    flat = grid.reshape(-1, 3)
    specials = [np.nan, np.inf, -np.inf, 1e30, -1e30, 1e300]
    for i, value in enumerate(specials * 3):
        flat[i * 2, i % 3] = value
    grad_out = rng.standard_normal((2, 2, 3, 4, 5))
    non_finite = ~np.isfinite(grid).all(axis=-1)
    huge = np.isfinite(grid).all(axis=-1) & (np.abs(grid) > 1e20).any(axis=-1)
    for dtype in (np.float64, np.float32):
        with np.errstate(over="ignore"):  # 1e300 is infinite in float32
            xs, gs, gos = x.astype(dtype), grid.astype(dtype), grad_out.astype(dtype)
        out = volsample.grid_sample_3d(xs, gs, mode, padding_mode, align_corners)
        gi, gg = volsample.grid_sample_3d_backward(gos, xs, gs, mode, padding_mode, align_corners)
        assert np.isfinite(out).all() and np.isfinite(gi).all() and np.isfinite(gg).all()
        assert (out.transpose(0, 2, 3, 4, 1)[non_finite] == 0).all()
        assert (gg[non_finite] == 0).all()
        if padding_mode == "zeros":
            assert (out.transpose(0, 2, 3, 4, 1)[huge] == 0).all()
        # The non-finite points scatter nothing: zeroing their grad_output changes nothing.
        gi_quiet, _ = volsample.grid_sample_3d_backward(
            np.where(non_finite[:, None], 0, gos).astype(dtype), xs, gs, mode, padding_mode,
            align_corners, (True, False))
        assert_bitwise_equal("grad_input", gi, gi_quiet)
    # The finite, moderate points against the reference (float64).
    out = volsample.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
    expected = reference.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
    keep = ~(non_finite | huge)
    keep_c = np.broadcast_to(keep[:, None], out.shape)
    assert_close("output", out[keep_c], expected[keep_c], 1e-12, 1e-12)


# ---------------------------------------------------------------------------------------
# Independent oracles: PyTorch's 4-D bicubic, SciPy's order-3 splines
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding_mode", PADDINGS)
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("hw", [(6, 7), (1, 3), (2, 2)])
def test_bicubic_of_a_z_constant_volume_is_pytorch_4d_bicubic(padding_mode, align_corners, hw):
    """A volume constant along z, sampled with every z tap inside: PyTorch's 2-D bicubic of
    the slice (values, the x and y grid gradients; grad_input summed over z, and a z grid
    gradient of 0, since the z weights sum to 1)."""
    rng = np.random.default_rng(21)
    H, W = hw
    D = 6
    slice_ = rng.standard_normal((2, 3, H, W))
    volume = np.repeat(slice_[:, :, None], D, axis=2)
    grid = _grid(rng, (2, 1, 5, 6, 3), 1.6)
    # z taps floor(iz) - 1 .. floor(iz) + 2 inside [0, D): iz in [1, 3).
    iz = rng.uniform(1.0, 2.999, grid.shape[:4])
    grid[..., 2] = (2 * iz / (D - 1) - 1) if align_corners else ((2 * iz + 1) / D - 1)
    grad_out = rng.standard_normal((2, 3, 1, 5, 6))
    out = volsample.grid_sample_3d(volume, grid, "bicubic", padding_mode, align_corners)
    gi, gg = volsample.grid_sample_3d_backward(grad_out, volume, grid, "bicubic", padding_mode,
                                               align_corners)
    t_slice = torch.tensor(slice_, requires_grad=True)
    t_grid = torch.tensor(grid[:, 0, ..., :2], requires_grad=True)
    expected = F.grid_sample(t_slice, t_grid, mode="bicubic", padding_mode=padding_mode,
                             align_corners=align_corners)
    expected.backward(torch.tensor(grad_out[:, :, 0]))
    assert_close("output", out[:, :, 0], expected.detach().numpy(), 1e-12, 1e-12)
    assert_close("grad_grid xy", gg[:, 0, ..., :2], t_grid.grad.numpy(), 1e-11, 1e-11)
    assert_close("grad_grid z", gg[..., 2], np.zeros(gg.shape[:4]), 0, 1e-12)
    assert_close("grad_input", gi.sum(axis=2), t_slice.grad.numpy(), 1e-12, 1e-12)


SCIPY_MODES = {("zeros", False): "grid-constant", ("zeros", True): "grid-constant",
               ("border", False): "nearest", ("border", True): "nearest",
               ("reflection", True): "mirror", ("reflection", False): "grid-mirror"}


@pytest.mark.parametrize("padding_mode,align_corners", list(SCIPY_MODES))
@pytest.mark.parametrize("shape", [(5, 6, 7), (2, 3, 1), (1, 4, 2)])
def test_bspline_is_scipy_map_coordinates(padding_mode, align_corners, shape):
    """bspline = map_coordinates(coeffs, voxel coordinates, order=3, prefilter=False) in the
    SciPy mode of each padding, points inside and far outside the volume alike."""
    rng = np.random.default_rng(22)
    coeffs = rng.standard_normal((1, 1) + shape)
    grid = _grid(rng, (1, 4, 5, 6, 3), 3.0)
    out = volsample.grid_sample_3d(coeffs, grid, "bspline", padding_mode, align_corners)
    D, H, W = shape
    voxel = [_coords.unnormalize(np, grid[..., axis], size, align_corners)[0].ravel()
             for axis, size in enumerate((W, H, D))]
    expected = ndimage.map_coordinates(coeffs[0, 0], voxel[::-1], order=3, prefilter=False,
                                       mode=SCIPY_MODES[padding_mode, align_corners])
    assert_close("output", out.ravel(), expected, 1e-12, 1e-12)


# ---------------------------------------------------------------------------------------
# Derivatives
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_grad_grid_is_finite_differences(mode, padding_mode, align_corners):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 2, 4, 5, 6))
    grid = rng.uniform(-1.3, 1.3, (1, 2, 3, 4, 3))
    grad_out = rng.standard_normal((1, 2, 2, 3, 4))
    _, gg = volsample.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode,
                                              align_corners, (False, True))
    step = 1e-6
    numeric = np.zeros_like(grid)
    for index in np.ndindex(grid.shape):
        plus, minus = grid.copy(), grid.copy()
        plus[index] += step
        minus[index] -= step
        f = (volsample.grid_sample_3d(x, plus, mode, padding_mode, align_corners) -
             volsample.grid_sample_3d(x, minus, mode, padding_mode, align_corners))
        numeric[index] = (f * grad_out).sum() / (2 * step)
    # bicubic's derivative jumps where a tap crosses an edge under zeros padding; the points
    # are random, so a jump within the step is unlikely: compare everywhere.
    assert_close("grad_grid", gg, numeric, 1e-5, 1e-6)


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_grad_input_is_the_adjoint(mode, padding_mode, align_corners):
    """<grid_sample(x), g> = <x, grad_input(g)>: the forward is linear in the input."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 4, 5, 3))
    grid = _grid(rng, (2, 5, 4, 6, 3), 2.0)
    g = rng.standard_normal((2, 3, 5, 4, 6))
    out = volsample.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
    gi, _ = volsample.grid_sample_3d_backward(g, x, grid, mode, padding_mode, align_corners,
                                              (True, False))
    lhs, rhs = float((out * g).sum()), float((x * gi).sum())
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))


# ---------------------------------------------------------------------------------------
# Bits: thread counts, instruction sets
# ---------------------------------------------------------------------------------------


def _smooth_grid(rng, n, shape, noise):
    axes = [np.linspace(-1, 1, size) for size in shape]
    z, y, x = np.meshgrid(*axes, indexing="ij")
    return np.stack([x, y, z], -1)[None] + rng.normal(0, noise, (n,) + shape + (3,))


@pytest.mark.parametrize("strategy", ["slabs", "tilted", "random", "batches"])
@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_thread_counts_give_the_same_bits(strategy, mode, padding_mode, align_corners,
                                          monkeypatch):
    """Every way the backward splits its work across threads gives the one-thread bits; the
    inputs do reach the strategy they are named after (reflection bounds every row by
    every plane, so it keeps one slab). "tilted" rows climb a few planes along x, so that
    rows reach two slabs, and the slab that does not compute a row's grid gradient skips
    the row's blocks that reach none of its planes."""
    monkeypatch.setattr(volsample._cpu, "MIN_WORK_PER_THREAD", 1)
    rng = np.random.default_rng(14)
    n = 3 if strategy == "batches" else 1
    shape = (40, 5, 70) if strategy == "tilted" else (40, 5, 7)
    x = rng.standard_normal((n, 2, 40, 5, 7)).astype(np.float32)
    if strategy == "random":
        grid = rng.uniform(-1.2, 1.2, (n,) + shape + (3,))
    else:
        grid = _smooth_grid(rng, n, shape, 0.01)
    if strategy == "tilted":
        grid[..., 2] += 0.15 * grid[..., 0]  # z climbs 6 planes along each row
    grid = grid.astype(np.float32)
    grad_out = rng.standard_normal((n, 2) + shape).astype(np.float32)
    call = _calls.grid_sample(_calls.operand("input", x), _calls.operand("grid", grid),
                              MODE_TABLE.code(mode), PADDING_TABLE.code(padding_mode),
                              align_corners)
    slabs = cpu_grid.backward_slabs(call, x, grid, 2)
    several = strategy == "batches" or (strategy in ("slabs", "tilted")
                                         and padding_mode != "reflection")
    assert (len(slabs) - 1 > 1) == several, slabs
    if several and strategy == "tilted":  # some row reaches below and above a cut
        z = grid[..., 2].reshape(-1, shape[-1])
        iz = (z + 1) / 2 * (40 - 1) if align_corners else ((z + 1) * 40 - 1) / 2
        low, high = np.floor(iz).min(axis=1), np.floor(iz).max(axis=1) + 1
        assert any(((low < cut) & (high >= cut)).any() for cut in slabs[1:-1])
    results = {}
    previous = volsample.get_num_threads()
    try:
        for threads in (1, 2):
            volsample.set_num_threads(threads)
            results[threads] = [volsample.grid_sample_3d(x, grid, mode, padding_mode,
                                                         align_corners)]
            for mask in ((True, True), (True, False), (False, True)):
                results[threads].extend(r for r in volsample.grid_sample_3d_backward(
                    grad_out, x, grid, mode, padding_mode, align_corners, mask) if r is not None)
    finally:
        volsample.set_num_threads(previous)
    for i, (a, b) in enumerate(zip(results[1], results[2])):
        assert_bitwise_equal(f"result {i}", a, b)
    expected = reference.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode,
                                                 align_corners)
    # (tilted rows pile more float32 terms, of both signs, onto each element)
    tolerance = 1e-4 if strategy == "tilted" else 2e-5
    assert_close("grad_input", results[2][1], expected[0], tolerance, tolerance)


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_points_sharing_their_rows_give_the_same_bits(mode, padding_mode, align_corners):
    """A smooth grid's points share their 16 tap rows a whole vector at a time, which the
    SIMD paths read as one window per row where the x taps lie close (not so for a grid
    stretched along x, NDHWC volumes or 16-bit ones, read tap by tap): every ISA gives
    the scalar path's bits, and float64 the reference's values."""
    rng = np.random.default_rng(16)
    grid = _smooth_grid(rng, 1, (3, 4, 67), 0.002)
    stretched = grid * np.array([3.0, 1.0, 1.0])
    cases = [(dtype, layout, g) for dtype in (np.float32, np.float64, np.float16)
             for layout in ("NCDHW", "NDHWC") for g in (grid, stretched)]

    def run():
        out = []
        for dtype, layout, g in cases:
            to_layout, _ = _layouts(layout)
            x = to_layout(np.random.default_rng(17).standard_normal((1, 2, 7, 6, 70))
                          .astype(dtype))
            go = to_layout(np.random.default_rng(18).standard_normal((1, 2, 3, 4, 67))
                           .astype(dtype))
            g = g.astype(np.float32 if dtype == np.float16 else dtype)
            sampling = (mode, padding_mode, align_corners)
            out.append(volsample.grid_sample_3d(x, g, *sampling, layout=layout))
            out.extend(volsample.grid_sample_3d_backward(go, x, g, *sampling, layout=layout))
        return out

    previous = cpu_isa()
    try:
        results = {}
        for isa in supported_isas():
            set_isa(isa)
            results[isa] = run()
    finally:
        set_isa(previous)
    for isa, result in results.items():
        for i, (a, b) in enumerate(zip(result, results["scalar"])):
            assert_bitwise_equal(f"{isa} result {i}", a, b)
    for (dtype, layout, g), i in zip(cases, range(0, 3 * len(cases), 3)):
        if dtype == np.float64 and layout == "NCDHW":
            x = np.random.default_rng(17).standard_normal((1, 2, 7, 6, 70))
            go = np.random.default_rng(18).standard_normal((1, 2, 3, 4, 67))
            assert_close("output", results["scalar"][i],
                         reference.grid_sample_3d(x, g, mode, padding_mode, align_corners),
                         1e-12, 1e-12)
            expected = reference.grid_sample_3d_backward(go, x, g, mode, padding_mode,
                                                         align_corners)
            assert_close("grad_input", results["scalar"][i + 1], expected[0], 1e-12, 1e-12)
            assert_close("grad_grid", results["scalar"][i + 2], expected[1], 1e-10, 1e-10)


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", CUBIC)
def test_integer_volumes_are_refused(mode):
    labels = np.zeros((1, 1, 3, 3, 3), np.uint8)
    grid = np.zeros((1, 1, 1, 1, 3), np.float32)
    with pytest.raises(volsample.UnsupportedDTypeError, match="input"):
        volsample.grid_sample_3d(labels, grid, mode)


def test_unknown_modes_name_the_cubic_ones():
    x = np.zeros((1, 1, 3, 3, 3), np.float32)
    grid = np.zeros((1, 1, 1, 1, 3), np.float32)
    with pytest.raises(volsample.InvalidArgumentError, match="'bicubic', 'bspline'"):
        volsample.grid_sample_3d(x, grid, "cubic")


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_bench_peers_compute_the_bspline(direction):
    """The cubic benchmarks time the same work: SciPy's map_coordinates(order=3,
    prefilter=False) and torch-interpol's grid_pull(interpolation=3) (if installed) equal
    volsample's bspline on the workload's inputs (border padding, align_corners)."""
    from volsample.apps import bench_workloads

    (workload,) = [w for w in bench_workloads.suite(shrink=16)
                   if w.name.startswith(f"grid.{direction} bspline")]
    impls = workload.build()
    ours = impls["volsample"]()
    if direction == "fwd":
        assert_close("scipy", impls["scipy"](), ours[0, 0], 1e-5, 1e-5)
        if "torch-interpol" in impls:
            assert_close("torch-interpol", impls["torch-interpol"]().numpy()[0], ours[0, 0],
                         1e-5, 1e-5)
    elif "torch-interpol" in impls:
        grad_input, _ = impls["torch-interpol"]()
        assert_close("grad_input", grad_input.numpy()[0], ours[0][0, 0], 1e-5, 1e-5)
