"""Limits: special coordinates in every dtype, size-1 volumes, extreme upsampling scales,
volumes past 2**31 elements (slow, on demand), bitwise determinism across runs and thread
counts for every operator and dtype, and concurrent calls from several Python threads.

Oracles: the float64 reference (``volsample._reference``), PyTorch's CPU operators, and
for determinism the library's own single-threaded result (bits must not depend on the
thread count or on what other threads do).
"""
from __future__ import annotations

import concurrent.futures
import itertools

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_bitwise_equal, assert_close, numpy_array, torch_tensor

import volsample
import volsample.torch as vt
from volsample import _cpu, aclnn
from volsample import _reference as reference

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
DTYPE_IDS = [d.name for d in DTYPES]
TOL = {np.dtype(np.float16): 3e-3, BF16: 2e-2, np.dtype(np.float32): 2e-5,
       np.dtype(np.float64): 1e-11}
ALL_MODES = list(itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"],
                                   [False, True]))
MODE_IDS = [f"{m}-{p}-{'ac' if a else 'noac'}" for m, p, a in ALL_MODES]


def check(name, actual, expected, dtype):
    """Compare with the float64 truth, tolerance relative to the result's magnitude."""
    tol = TOL[np.dtype(dtype)]
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    assert_close(name, actual, expected, tol, tol * scale)


@pytest.fixture
def all_threads(monkeypatch):
    """Make even tiny calls split their work over every thread (small calls otherwise run
    single-threaded, which would hide an order-dependent sum), and restore the count."""
    monkeypatch.setattr(_cpu, "MIN_WORK_PER_THREAD", 1)
    before = volsample.get_num_threads()
    yield sorted({1, min(2, _cpu._MAX_THREADS), _cpu._MAX_THREADS})
    volsample.set_num_threads(before)


# --- special coordinates, in every dtype --------------------------------------------------

def special_values(dtype):
    """NaN, +-inf, +-1e30 (inf in float16), the smallest subnormal of the dtype, exact
    borders and the centre."""
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    return [np.nan, np.inf, -np.inf, 1e30, -1e30, tiny, -tiny, -1.0, 1.0, -0.0, 0.0]


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES, ids=MODE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("in_dhw", [(4, 3, 5), (1, 1, 1), (1, 3, 1)], ids=["4x3x5", "1x1x1", "1x3x1"])
def test_special_coordinates(mode, padding_mode, align_corners, dtype, in_dhw):
    """Every special value in every coordinate slot, beside ordinary points. Non-finite
    points give exactly 0 (output and grid gradient) and nothing in grad_input; all
    results are finite and agree with the float64 reference.

    One exception: with reflection, a huge coordinate unnormalised in float32 has lost
    every digit that decides where it folds to, so there the result is only checked to be
    a convex combination of the input's values, as every reflected sample is."""
    rng = np.random.default_rng(5)
    specials = special_values(dtype)
    modes = (mode, padding_mode, align_corners)
    # Each row of the grid has one special value in one of its three coordinates.
    rows = [(s, axis) for s in specials for axis in range(3)]
    grid = rng.uniform(-1.1, 1.1, (1, len(rows) + 5, 1, 1, 3))
    for i, (value, axis) in enumerate(rows):
        grid[0, i, 0, 0, axis] = value
    with np.errstate(over="ignore"):  # 1e30 is inf in float16
        grid = grid.astype(dtype)
    x = rng.standard_normal((1, 2) + in_dhw).astype(dtype)
    grad_out = rng.standard_normal((1, 2) + grid.shape[1:4]).astype(dtype)
    point_finite = np.isfinite(grid.astype(np.float64)).all(-1)[0, :, 0, 0]
    # NaN gradients at the non-finite points: scattering anything from them would show.
    grad_out[0, :, ~point_finite] = np.nan

    out = volsample.grid_sample_3d(x, grid, *modes)
    gi, gg = volsample.grid_sample_3d_backward(grad_out, x, grid, *modes)
    ref_out = reference.grid_sample_3d(x, grid, *modes)
    ref_gi, ref_gg = reference.grid_sample_3d_backward(grad_out, x, grid, *modes)

    for name, arr in (("output", out), ("grad_input", gi), ("grad_grid", gg)):
        assert np.isfinite(arr.astype(np.float64)).all(), f"{name} is not finite"
    assert (out[0, :, ~point_finite] == 0).all() and (gg[0, ~point_finite] == 0).all()

    uncertain = np.zeros(point_finite.shape, bool)
    if padding_mode == "reflection" and dtype != np.float64:
        uncertain = (np.abs(grid.astype(np.float64)) > 1e4).any(-1)[0, :, 0, 0] & point_finite
        lo, hi = x.astype(np.float64).min(axis=(2, 3, 4)), x.astype(np.float64).max(axis=(2, 3, 4))
        folded = out[0, :, :, 0, 0][:, uncertain].astype(np.float64)  # (C, points)
        slack = TOL[np.dtype(dtype)] * np.abs(x.astype(np.float64)).max()
        assert ((folded >= lo[0][:, None] - slack) & (folded <= hi[0][:, None] + slack)).all()
    keep = ~uncertain
    check("output", out[0][:, keep], ref_out[0][:, keep], dtype)
    check("grad_grid", gg[0][keep], ref_gg[0][keep], dtype)
    if not uncertain.any():
        check("grad_input", gi, ref_gi, dtype)


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES, ids=MODE_IDS)
def test_single_voxel_volume_against_pytorch(mode, padding_mode, align_corners):
    """A 1x1x1 volume sampled at the borders, the centre and outside: PyTorch agrees
    (float64), forward and both gradients."""
    coords = np.array([-1.0, 1.0, 0.0, -0.5, 0.5, -1.5, 1.5, 3.0])
    grid = np.stack(np.meshgrid(coords, coords, coords, indexing="ij"), -1)[None]
    x = np.array([2.5, -1.0]).reshape(1, 2, 1, 1, 1)
    grad_out = np.random.default_rng(3).standard_normal((1, 2) + grid.shape[1:4])
    out = volsample.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
    gi, gg = volsample.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode, align_corners)
    codes = ({"bilinear": 0, "nearest": 1}[mode], ["zeros", "border", "reflection"].index(padding_mode),
             align_corners)
    t_out = torch.ops.aten.grid_sampler_3d(torch.from_numpy(x), torch.from_numpy(grid), *codes)
    t_gi, t_gg = torch.ops.aten.grid_sampler_3d_backward(
        torch.from_numpy(grad_out), torch.from_numpy(x), torch.from_numpy(grid), *codes, [True, True])
    assert_close("output", out, t_out.numpy(), 1e-12, 1e-12)
    assert_close("grad_input", gi, t_gi.numpy(), 1e-12, 1e-12)
    assert_close("grad_grid", gg, t_gg.numpy(), 1e-12, 1e-12)


# --- extreme upsampling scales --------------------------------------------------------------

@pytest.mark.parametrize("in_dhw, scale_factor", [
    ((1, 1, 1), (1.0, 1.0, 1e6)),        # one voxel to a million along W
    ((2, 1, 3), (1.0, 3.0, 20000.0)),    # 60000 outputs from 3 along W
    ((1, 2, 1000), (1.0, 1.0, 1e-3)),    # a thousand voxels to one
    ((3, 1000, 2), (0.5, 0.0011, 1.0)),  # and shrinking two axes at once
], ids=["1-to-1e6", "3-to-60000", "1000-to-1", "shrink-two-axes"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_extreme_scale_factors_match_pytorch(in_dhw, scale_factor, align_corners):
    x = np.random.default_rng(4).standard_normal((1, 2) + in_dhw)
    out = volsample.upsample_trilinear_3d(x, scale_factor=scale_factor, align_corners=align_corners)
    expected = F.interpolate(torch.from_numpy(x), scale_factor=scale_factor, mode="trilinear",
                             align_corners=align_corners).numpy()
    assert_close("output", out, expected, 1e-12, 1e-12)
    grad_out = np.random.default_rng(5).standard_normal(out.shape)
    gi = volsample.upsample_trilinear_3d_backward(grad_out, x.shape, align_corners, scale_factor)
    xt = torch.from_numpy(x).requires_grad_()
    F.interpolate(xt, scale_factor=scale_factor, mode="trilinear",
                  align_corners=align_corners).backward(torch.from_numpy(grad_out))
    assert_close("grad_input", gi, xt.grad.numpy(), 1e-10, 1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("scales", [
    (5e-324, 1e300, 1e-300),   # 1 / 5e-324 is inf: every source coordinate clamps to the end
    (1e-300, 1e-300, 1e-300),  # ratios of 1e300
    (1e300, 1e300, 1e300),     # ratios of 1e-300: every output reads voxel 0
    (-5e-324, -1e300, 1e-9),   # non-positive: from the sizes (aclnn: every axis, as CANN)
], ids=["subnormal-huge-tiny", "tiny", "huge", "negative"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_extreme_backward_scales_stay_in_bounds(dtype, scales, align_corners):
    """Scales wildly inconsistent with the sizes (docs/semantics.md: allowed, never out of bounds):
    the float64 reference's clamped taps, through the NumPy API and the aclnn layer."""
    go = np.random.default_rng(6).standard_normal((2, 3, 4, 5, 6)).astype(dtype)
    size = (2, 3, 7, 2, 3)
    gi = volsample.upsample_trilinear_3d_backward(go, size, align_corners, scales)
    expected = reference.upsample_trilinear_3d_backward(
        go, size, align_corners, tuple(s if s > 0 else None for s in scales))
    check("grad_input", gi, expected, np.dtype(dtype))
    out = np.zeros(size, dtype)
    status, ws, executor = aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(
        aclnn.aclCreateTensor(go), aclnn.aclCreateIntArray([4, 5, 6]), aclnn.aclCreateIntArray(size),
        align_corners, *scales, aclnn.aclCreateTensor(out))
    assert status == 0, aclnn.aclGetRecentErrMsg()
    assert aclnn.aclnnUpsampleTrilinear3dBackward(aclnn.aclrtMalloc(ws), ws, executor) == 0
    if min(scales) <= 0:  # CANN uses the scales only when all three are > 0
        gi = volsample.upsample_trilinear_3d_backward(go, size, align_corners)
    assert_bitwise_equal("aclnn gradInput", out, gi)


@pytest.mark.slow
def test_upsampling_past_two_to_the_31_elements():
    """64-bit indexing in upsampling: a 2x2x2 linear field upsampled (align_corners) to
    2049 x 1024 x 1024 float32 voxels, 2^31 + 2^21 of them (8.6 GB). Trilinear
    interpolation of a linear field is exact, so every voxel is known in closed form;
    the regions checked straddle flat offset 2^31 (the first row of plane 2048) and end
    the volume. Then the backward of a gradient that is zero except at the last voxels
    must scatter exactly their weights into the 8 input voxels."""
    D, H, W = 2049, 1024, 1024
    z, y, x = np.meshgrid([0.0, 1.0], [0.0, 1.0], [0.0, 1.0], indexing="ij")
    field = (1 + 2 * z + 3 * y + 5 * x).astype(np.float32)[None, None]
    out = volsample.upsample_trilinear_3d(field, size=(D, H, W), align_corners=True)
    assert out.shape == (1, 1, D, H, W) and out.size > 2**31

    def expected(d, h, w):
        return 1 + 2 * d / (D - 1) + 3 * h / (H - 1) + 5 * w / (W - 1)
    w = np.arange(W)
    for d, h in [(2047, H - 1), (2048, 0), (2048, 1), (2048, H - 1), (1024, 511)]:
        assert_close(f"plane {d} row {h}", out[0, 0, d, h], expected(d, h, w), 2e-6, 2e-6)

    # Reuse the 8.6 GB as the gradient: zero but for a 2 x 3 x 4 block at the very end.
    grad = out
    grad[...] = 0
    block = np.arange(1, 25, dtype=np.float32).reshape(2, 3, 4)
    grad[0, 0, -2:, -3:, -4:] = block
    gi = volsample.upsample_trilinear_3d_backward(grad, (1, 1, 2, 2, 2), align_corners=True)
    taps = [reference.upsample_taps(2, n, True)[-2:] for n in (D, H, W)]  # (index, weight) x 2

    def weight(axis, i, outputs):
        return sum(np.where(index[outputs] == i, w_[outputs], 0.0) for index, w_ in taps[axis])
    want = np.zeros((2, 2, 2))
    dz, dy, dx = (np.arange(n - k, n) for n, k in ((D, 2), (H, 3), (W, 4)))
    for i, j, k in itertools.product(range(2), repeat=3):
        want[i, j, k] = np.einsum("abc,a,b,c->", block.astype(np.float64), weight(0, i, dz),
                                  weight(1, j, dy), weight(2, k, dx))
    assert_close("grad_input", gi[0, 0], want, 1e-6, 1e-5)


# --- determinism: bits independent of runs and thread counts ----------------------------------

def grid_operands(dtype, grid_dtype, layout, rng):
    # Many points crowd into few voxels, so the order of grad_input's sums matters.
    x = rng.standard_normal((2, 3, 5, 4, 6)).astype(dtype)
    grid = rng.uniform(-0.4, 0.4, (2, 7, 9, 8, 3)).astype(grid_dtype)
    go = rng.standard_normal((2, 3, 7, 9, 8)).astype(dtype)
    if layout == "NDHWC":
        x, go = x.transpose(0, 2, 3, 4, 1).copy(), go.transpose(0, 2, 3, 4, 1).copy()
    return x, grid, go


def every_op(dtype, grid_dtype, layout, mode, padding_mode, align_corners):
    """A function computing every operator's results once (tuple of arrays)."""
    rng = np.random.default_rng(11)
    x, grid, go = grid_operands(dtype, grid_dtype, layout, rng)
    small = rng.standard_normal((2, 3, 5, 6, 7)).astype(dtype)
    big = rng.standard_normal((2, 3, 11, 13, 9)).astype(dtype)
    if layout == "NDHWC":
        small, big = small.transpose(0, 2, 3, 4, 1).copy(), big.transpose(0, 2, 3, 4, 1).copy()
    modes = (mode, padding_mode, align_corners)

    def run():
        return (volsample.grid_sample_3d(x, grid, *modes, layout=layout),
                *volsample.grid_sample_3d_backward(go, x, grid, *modes, layout=layout),
                volsample.upsample_trilinear_3d(small, size=(11, 13, 9), align_corners=align_corners,
                                                layout=layout),
                volsample.upsample_trilinear_3d(big, scale_factor=(0.5, 0.7, 1.5), layout=layout),
                volsample.upsample_trilinear_3d_backward(big, (2, 3, 5, 6, 7), align_corners,
                                                         layout=layout))
    return run


RESULT_NAMES = ("grid forward", "grid grad_input", "grid grad_grid", "upsample forward",
                "downsample forward", "upsample backward")


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mode,padding_mode,align_corners",
                         [("bilinear", "zeros", False), ("bilinear", "reflection", True),
                          ("nearest", "border", False)], ids=["bilinear-zeros", "bilinear-reflection-ac",
                                                               "nearest-border"])
def test_bitwise_identical_across_runs_and_thread_counts(all_threads, dtype, layout, mode,
                                                         padding_mode, align_corners):
    run = every_op(dtype, dtype, layout, mode, padding_mode, align_corners)
    results = []
    for threads in all_threads + all_threads[::-1]:  # each count twice, in both orders
        volsample.set_num_threads(threads)
        results.append(run())
    for other in results[1:]:
        for name, a, b in zip(RESULT_NAMES, results[0], other):
            assert_bitwise_equal(name, a, b)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("grid_dtype", [np.float32, np.float64], ids=["grid-float32", "grid-float64"])
def test_mixed_precision_bitwise_across_thread_counts(all_threads, dtype, grid_dtype):
    run = every_op(dtype, np.dtype(grid_dtype), "NCDHW", "bilinear", "border", False)
    results = []
    for threads in all_threads:
        volsample.set_num_threads(threads)
        results.append(run()[:3])
    for other in results[1:]:
        for name, a, b in zip(RESULT_NAMES, results[0], other):
            assert_bitwise_equal(name, a, b)


# --- thread safety: concurrent calls from Python threads --------------------------------------

def concurrent_tasks():
    """(name, zero-argument callable returning arrays) for a mix of every operator, dtype,
    layout and front door (NumPy, torch, aclnn)."""
    tasks = []
    for dtype, layout, (mode, padding, align) in itertools.product(
            DTYPES, ["NCDHW", "NDHWC"], [("bilinear", "zeros", False), ("nearest", "reflection", True)]):
        run = every_op(dtype, dtype, layout, mode, padding, align)
        tasks.append((f"numpy {dtype.name} {layout} {mode}-{padding}", run))
    rng = np.random.default_rng(12)
    x = torch_tensor(rng.standard_normal((2, 3, 6, 5, 7)).astype(np.float32))
    grid = torch_tensor(rng.uniform(-1.1, 1.1, (2, 5, 6, 4, 3)).astype(np.float32))

    def torch_call():
        xt, gt = x.clone().requires_grad_(), grid.clone().requires_grad_()
        out = vt.grid_sample(xt, gt, "bilinear", "border", True)
        up = vt.upsample_trilinear(out, scale_factor=(1.5, 2.0, 0.5))
        (up * up).sum().backward()
        return tuple(numpy_array(t) for t in (out, up, xt.grad, gt.grad))
    tasks.append(("torch", torch_call))

    go = rng.standard_normal((2, 3, 9, 8, 10)).astype(np.float64)

    def aclnn_call():
        out = np.zeros((2, 3, 4, 5, 6))
        status, ws, executor = aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(
            aclnn.aclCreateTensor(go), aclnn.aclCreateIntArray([9, 8, 10]),
            aclnn.aclCreateIntArray([2, 3, 4, 5, 6]), False, 0.0, 0.0, 0.0, aclnn.aclCreateTensor(out))
        assert status == 0
        assert aclnn.aclnnUpsampleTrilinear3dBackward(aclnn.aclrtMalloc(ws), ws, executor) == 0
        return (out,)
    tasks.append(("aclnn", aclnn_call))
    return tasks


def test_concurrent_calls_from_four_threads_match_serial(all_threads):
    """Four Python threads, each launching parallel kernels (MIN_WORK_PER_THREAD forced
    down), on a shuffled mix of operators: every result is bitwise the serial one."""
    volsample.set_num_threads(all_threads[-1])
    tasks = concurrent_tasks()
    serial = [run() for _, run in tasks]
    order = np.random.default_rng(13).permutation(np.repeat(np.arange(len(tasks)), 3))
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = [(i, pool.submit(tasks[i][1])) for i in order]
        for i, future in futures:
            for k, (a, b) in enumerate(zip(future.result(timeout=300), serial[i])):
                assert_bitwise_equal(f"{tasks[i][0]} result {k}", a, b)
