"""grid_sample_3d and grid_sample_3d_backward against PyTorch 2.13 (CPU), the float64
reference, finite differences and exact closed forms."""
from __future__ import annotations

import contextlib
import itertools

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import SIXTEEN_BIT, assert_bitwise_equal, assert_close, numpy_array, torch_tensor

import volsample
from volsample import _cpu
from volsample import _reference as reference
from volsample import _calls, _prepared
from volsample._cpu import grid_sample as cpu_grid

MODES = ["bilinear", "nearest"]
PADDINGS = ["zeros", "border", "reflection"]
ALL_MODES = list(itertools.product(MODES, PADDINGS, [False, True]))
MODE_CODE = {"bilinear": 0, "nearest": 1}
PADDING_CODE = {"zeros": 0, "border": 1, "reflection": 2}
BF16 = np.dtype(ml_dtypes.bfloat16)


def torch_grid_sample(x, grid, mode, padding_mode, align_corners):
    return numpy_array(torch.ops.aten.grid_sampler_3d(
        torch_tensor(x), torch_tensor(grid), MODE_CODE[mode], PADDING_CODE[padding_mode],
        align_corners))


def torch_grid_sample_backward(grad_output, x, grid, mode, padding_mode, align_corners):
    grad_input, grad_grid = torch.ops.aten.grid_sampler_3d_backward(
        torch_tensor(grad_output), torch_tensor(x), torch_tensor(grid), MODE_CODE[mode],
        PADDING_CODE[padding_mode], align_corners, [True, True])
    return numpy_array(grad_input), numpy_array(grad_grid)


def adversarial_grid(rng, shape, in_shape, dtype):
    """Random points in and around [-1, 1], with rows of special points: voxel centres and
    half-way points (both align_corners conventions, so nearest meets exact ties), the
    edges +-1 and points far outside."""
    grid = rng.uniform(-1.4, 1.4, shape)
    flat = grid.reshape(-1, 3)
    D, H, W = in_shape
    sizes = np.array([W, H, D])
    k = flat.shape[0]
    picks = rng.integers(0, 1 << 30, size=(k, 3))
    voxel = picks % sizes
    half = (picks % (2 * sizes)) / 2.0  # integer and half-integer voxel coordinates
    centres_ac = 2 * voxel / np.maximum(sizes - 1, 1) - 1
    halves_nac = (2 * half + 1) / sizes - 1
    edges = rng.choice([-1.0, 1.0, -3.0, 3.0], size=(k, 3))
    rows = np.arange(k)
    flat[rows % 5 == 1] = centres_ac[rows % 5 == 1]
    flat[rows % 5 == 2] = halves_nac[rows % 5 == 2]
    flat[rows % 5 == 3] = edges[rows % 5 == 3]
    return grid.astype(dtype)


# Odd shapes on purpose: primes, and size-1 axes (align_corners' degenerate (S-1)/2 = 0).
CASES = [
    ((2, 3, 5, 7, 6), (2, 4, 3, 5)),
    ((1, 1, 1, 4, 5), (1, 3, 3, 3)),
    ((1, 2, 3, 1, 1), (1, 2, 5, 2)),
]


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_matches_pytorch(mode, padding_mode, align_corners, dtype, layout):
    rng = np.random.default_rng(abs(hash((mode, padding_mode, align_corners, layout))) % 2**32)
    for in_shape, out_shape in CASES:
        x = rng.standard_normal(in_shape).astype(dtype)
        grid = adversarial_grid(rng, out_shape + (3,), in_shape[2:], dtype)
        grad_out = rng.standard_normal(in_shape[:2] + out_shape[1:]).astype(dtype)
        expected = torch_grid_sample(x, grid, mode, padding_mode, align_corners)
        expected_gi, expected_gg = torch_grid_sample_backward(grad_out, x, grid, mode,
                                                              padding_mode, align_corners)
        to_layout = (lambda a: a.transpose(0, 2, 3, 4, 1)) if layout == "NDHWC" else (lambda a: a)
        from_layout = (lambda a: a.transpose(0, 4, 1, 2, 3)) if layout == "NDHWC" else (lambda a: a)
        out = volsample.grid_sample_3d(to_layout(x), grid, mode, padding_mode, align_corners,
                                       layout=layout)
        gi, gg = volsample.grid_sample_3d_backward(to_layout(grad_out), to_layout(x), grid, mode,
                                                   padding_mode, align_corners, layout=layout)
        assert out.dtype == x.dtype and gi.dtype == x.dtype and gg.dtype == grid.dtype
        rtol = 1e-10 if dtype == np.float64 else 2e-5
        scale = max(1.0, np.abs(expected_gg).max())
        assert_close("output", from_layout(out), expected, rtol, rtol)
        assert_close("grad_input", from_layout(gi), expected_gi, rtol, rtol)
        assert_close("grad_grid", gg, expected_gg, rtol, rtol * scale)


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_matches_reference_with_non_finite_and_huge_coordinates(mode, padding_mode,
                                                                  align_corners):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 2, 4, 3, 5))
    grid = rng.uniform(-1.2, 1.2, (2, 3, 4, 5, 3))
    specials = [np.nan, np.inf, -np.inf, 1e30, -1e30, 1e300, 5e-324, -0.0]
    flat = grid.reshape(-1, 3)
    for i, value in enumerate(specials * 3):
        flat[i * 2, i % 3] = value
    grad_out = rng.standard_normal((2, 2, 3, 4, 5))
    out = volsample.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
    gi, gg = volsample.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode, align_corners)
    ref_out = reference.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
    ref_gi, ref_gg = reference.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode,
                                                       align_corners)
    assert np.isfinite(out).all() and np.isfinite(gi).all() and np.isfinite(gg).all()
    non_finite = ~np.isfinite(grid).all(axis=-1)
    assert (out.transpose(0, 2, 3, 4, 1)[non_finite] == 0).all()
    assert (gg[non_finite] == 0).all()
    assert_close("output", out, ref_out, 1e-12, 1e-12)
    assert_close("grad_input", gi, ref_gi, 1e-12, 1e-12)
    assert_close("grad_grid", gg, ref_gg, 1e-12, 1e-12)


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_sixteen_bit_is_at_least_as_accurate_as_pytorch(mode, padding_mode, align_corners, dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 4, 6, 5, 7)).astype(dtype)
    grid = rng.uniform(-1.1, 1.1, (1, 6, 6, 6, 3)).astype(dtype)
    grad_out = rng.standard_normal((1, 4, 6, 6, 6)).astype(dtype)
    # Ground truth: float64 maths on exactly the 16-bit values.
    truth = reference.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
    truth_gi, truth_gg = reference.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode,
                                                           align_corners)
    ours = volsample.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
    ours_gi, ours_gg = volsample.grid_sample_3d_backward(grad_out, x, grid, mode, padding_mode,
                                                         align_corners)
    theirs = torch_grid_sample(x, grid, mode, padding_mode, align_corners)
    theirs_gi, theirs_gg = torch_grid_sample_backward(grad_out, x, grid, mode, padding_mode,
                                                      align_corners)
    assert ours.dtype == dtype and ours_gi.dtype == dtype and ours_gg.dtype == dtype
    for name, o, t, exact in [("output", ours, theirs, truth),
                              ("grad_input", ours_gi, theirs_gi, truth_gi),
                              ("grad_grid", ours_gg, theirs_gg, truth_gg)]:
        ours_err = np.abs(o.astype(np.float64) - exact).max()
        theirs_err = np.abs(t.astype(np.float64) - exact).max()
        # One rounding to the storage dtype is the floor: half an ulp of the largest value.
        ulp = np.abs(exact).max() * (2.0 ** -11 if dtype == np.float16 else 2.0 ** -8)
        assert ours_err <= max(theirs_err, ulp), f"{name}: ours {ours_err} > PyTorch {theirs_err}"


def test_mixed_precision_grid():
    """A float32 or float64 grid with a 16-bit volume: the result keeps the volume's dtype,
    grad_grid the grid's, and both match float64 maths to the storage precision."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 5, 6, 7)).astype(BF16)
    grad_out = rng.standard_normal((1, 2, 3, 4, 5)).astype(BF16)
    for grid_dtype in (np.float32, np.float64):
        grid = rng.uniform(-1, 1, (1, 3, 4, 5, 3)).astype(grid_dtype)
        out = volsample.grid_sample_3d(x, grid)
        gi, gg = volsample.grid_sample_3d_backward(grad_out, x, grid)
        truth = reference.grid_sample_3d(x, grid)
        truth_gi, truth_gg = reference.grid_sample_3d_backward(grad_out, x, grid)
        assert out.dtype == BF16 and gi.dtype == BF16 and gg.dtype == grid_dtype
        assert_close("output", out, truth, 2 ** -7, 2 ** -7)
        assert_close("grad_input", gi, truth_gi, 2 ** -7, 2 ** -7)
        assert_close("grad_grid", gg, truth_gg, 1e-5, 1e-5 * np.abs(truth_gg).max())


@pytest.mark.parametrize("padding_mode", PADDINGS)
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_gradient_matches_finite_differences(padding_mode, align_corners):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 4, 5, 6))
    # Points off the kinks: never on a voxel coordinate and never near the borders, where
    # clip and reflect bend.
    grid = rng.uniform(-0.8, 0.8, (1, 2, 3, 4, 3))
    weights = rng.standard_normal((1, 2, 2, 3, 4))
    _, grad_grid = volsample.grid_sample_3d_backward(weights, x, grid, "bilinear",
                                                     padding_mode, align_corners)
    eps = 1e-6
    numeric = np.zeros_like(grid)
    for index in np.ndindex(grid.shape):
        plus, minus = grid.copy(), grid.copy()
        plus[index] += eps
        minus[index] -= eps
        loss_plus = (volsample.grid_sample_3d(x, plus, "bilinear", padding_mode, align_corners) * weights).sum()
        loss_minus = (volsample.grid_sample_3d(x, minus, "bilinear", padding_mode, align_corners) * weights).sum()
        numeric[index] = (loss_plus - loss_minus) / (2 * eps)
    assert_close("grad_grid", grad_grid, numeric, 1e-6, 1e-6)


def test_input_gradient_is_the_adjoint_of_the_forward():
    """<sample(x), g> = <x, sample^T(g)>: the input gradient is exactly the transpose."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 4, 5, 6))
    grid = rng.uniform(-1.2, 1.2, (2, 5, 4, 3, 3))
    g = rng.standard_normal((2, 3, 5, 4, 3))
    for mode, padding_mode, align_corners in ALL_MODES:
        out = volsample.grid_sample_3d(x, grid, mode, padding_mode, align_corners)
        gi, _ = volsample.grid_sample_3d_backward(g, x, grid, mode, padding_mode, align_corners)
        assert abs((out * g).sum() - (x * gi).sum()) < 1e-10


def test_trilinear_interpolation_of_a_linear_field_is_exact():
    """Trilinear interpolation reproduces a linear function inside the volume, so the
    output and the grid gradient are known in closed form."""
    D, H, W = 5, 6, 7
    a, b, c, offset = 0.5, -1.25, 2.0, 3.0
    z, y, x = np.meshgrid(np.arange(D), np.arange(H), np.arange(W), indexing="ij")
    volume = (a * x + b * y + c * z + offset)[None, None].astype(np.float64)
    rng = np.random.default_rng(8)
    grid = rng.uniform(-1, 1, (1, 4, 4, 4, 3))  # align_corners=True: [-1, 1] spans the centres
    out = volsample.grid_sample_3d(volume, grid, align_corners=True)
    ix, iy, iz = [(grid[..., k] + 1) / 2 * (s - 1) for k, s in enumerate((W, H, D))]
    assert_close("output", out[0, 0], a * ix[0] + b * iy[0] + c * iz[0] + offset, 1e-12, 1e-12)
    _, grad_grid = volsample.grid_sample_3d_backward(np.ones_like(out), volume, grid,
                                                     align_corners=True)
    expected = np.broadcast_to([a * (W - 1) / 2, b * (H - 1) / 2, c * (D - 1) / 2], grid.shape)
    assert_close("grad_grid", grad_grid, expected, 1e-12, 1e-12)


def test_hand_computed_point():
    """The centre of a 2x2x2 cube averages its corners; the x gradient is the mean x step."""
    volume = np.arange(8, dtype=np.float64).reshape(1, 1, 2, 2, 2)  # value = 4z + 2y + x
    centre = np.zeros((1, 1, 1, 1, 3))
    assert volsample.grid_sample_3d(volume, centre, align_corners=True).item() == 3.5
    _, grad_grid = volsample.grid_sample_3d_backward(np.ones((1, 1, 1, 1, 1)), volume, centre,
                                                     align_corners=True)
    np.testing.assert_array_equal(grad_grid.ravel(), [0.5, 1.0, 2.0])


def test_nearest_rounds_half_to_even():
    volume = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 1, 4)
    # align_corners=True on W=4: ix = (x + 1) * 1.5; x = -1/3 gives ix = 1.0, x = 0 gives 1.5.
    xs = np.array([-1 / 3, 0.0, 1 / 3], np.float32)  # ix 1.0, 1.5 (tie -> 2), 2.0
    grid = np.zeros((1, 1, 1, 3, 3), np.float32)
    grid[..., 0] = xs
    out = volsample.grid_sample_3d(volume, grid, "nearest", align_corners=True)
    np.testing.assert_array_equal(out.ravel(), [1.0, 2.0, 2.0])


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_bitwise_identical_for_any_thread_count(mode, padding_mode, align_corners, monkeypatch):
    monkeypatch.setattr(volsample._cpu, "MIN_WORK_PER_THREAD", 1)  # small inputs use all threads
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 6, 5, 4)).astype(np.float32)
    # Many points crowd into few voxels, so the order of the input-gradient sums matters.
    grid = rng.uniform(-0.3, 0.3, (2, 9, 10, 11, 3)).astype(np.float32)
    grad_out = rng.standard_normal((2, 3, 9, 10, 11)).astype(np.float32)
    results = []
    previous = volsample.get_num_threads()
    try:
        for threads in sorted({1, 2, previous}):
            volsample.set_num_threads(threads)
            results.append((volsample.grid_sample_3d(x, grid, mode, padding_mode, align_corners),)
                           + volsample.grid_sample_3d_backward(grad_out, x, grid, mode,
                                                               padding_mode, align_corners))
    finally:
        volsample.set_num_threads(previous)
    for other in results[1:]:
        for name, a, b in zip(("output", "grad_input", "grad_grid"), results[0], other):
            assert_bitwise_equal(name, a, b)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, ml_dtypes.bfloat16])
def test_repeated_calls_run_on_their_own_arrays(layout, dtype):
    # Calls after the first of the same arrays' shapes, strides and dtypes run its prepared
    # kernel (bfloat16: the general path): each on its own arrays (strided views too), with
    # PyTorch's bits, on any thread count; a wrong argument of a prepared call still raises.
    _prepared.forget_prepared_calls()
    rng = np.random.default_rng(5)
    threads = volsample.get_num_threads()
    try:
        for k in range(4):
            volsample.set_num_threads(1 + k % 2)
            x = rng.standard_normal((2, 3, 5, 6, 7 + 1)).astype(dtype)[..., ::2][..., :4]
            grid = rng.uniform(-1.1, 1.1, (2, 4, 3, 5, 3)).astype(dtype)
            stored = x.transpose(0, 2, 3, 4, 1) if layout == "NDHWC" else x
            got = volsample.grid_sample_3d(stored, grid, "bilinear", "reflection", True,
                                           layout=layout)
            expected = torch_grid_sample(x.astype(np.float32) if dtype == ml_dtypes.bfloat16
                                         else x, grid.astype(np.float32) if
                                         dtype == ml_dtypes.bfloat16 else grid,
                                         "bilinear", "reflection", True)
            if layout == "NDHWC":
                got = got.transpose(0, 4, 1, 2, 3)
            if dtype == ml_dtypes.bfloat16:  # computed in float32, rounded once
                expected = expected.astype(dtype)
            assert_bitwise_equal(f"call {k}", got, expected)
        with pytest.raises(volsample.InvalidArgumentError, match="align_corners"):
            volsample.grid_sample_3d(stored, grid, "bilinear", "reflection", 1, layout=layout)
    finally:
        volsample.set_num_threads(threads)


@pytest.mark.parametrize("mask", [(True, True), (True, False), [False, True]])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
def test_repeated_backward_calls_run_on_their_own_arrays(layout, dtype, mask):
    # As the forward's: calls after the first of a key run its prepared kernel (a 16-bit
    # grad_input: the general path), each on its own arrays (strided views at an offset),
    # with PyTorch's bits on 1 and 2 threads; a wrong argument of a prepared call raises.
    _prepared.forget_prepared_calls()
    rng = np.random.default_rng(6)
    sixteen = np.dtype(dtype).itemsize == 2
    threads = volsample.get_num_threads()
    try:
        for k in range(4):
            volsample.set_num_threads(1 + k % 2)
            x = rng.standard_normal((2, 3, 5, 6, 9)).astype(dtype)[..., 1::2]
            grid = rng.uniform(-1.1, 1.1, (2, 4, 3, 5, 3)).astype(dtype)
            go = rng.standard_normal((2, 3, 4, 3, 6)).astype(dtype)[..., 1:]
            stored = [a.transpose(0, 2, 3, 4, 1) if layout == "NDHWC" else a for a in (go, x)]
            got = volsample.grid_sample_3d_backward(*stored, grid, "bilinear", "reflection",
                                                    True, mask, layout=layout)
            # 16-bit: computed in float32 and rounded once
            exact = [a.astype(np.float32) if sixteen else a for a in (go, x, grid)]
            expected = torch_grid_sample_backward(*exact, "bilinear", "reflection", True)
            for name, ours, theirs, wanted in zip(("grad_input", "grad_grid"), got, expected,
                                                  mask):
                if not wanted:
                    assert ours is None, name
                    continue
                if name == "grad_input" and layout == "NDHWC":
                    ours = ours.transpose(0, 4, 1, 2, 3)
                assert_bitwise_equal(f"call {k}: {name}", ours, theirs.astype(dtype))
        # (bfloat16 arrays are views of other dtypes' bits; float16 needs an accumulator)
        prepared = dtype != ml_dtypes.bfloat16 and not (sixteen and mask[0])
        assert bool(_prepared.kept("grid_sample_3d_backward")) == prepared
        with pytest.raises(volsample.InvalidArgumentError, match="align_corners"):
            volsample.grid_sample_3d_backward(*stored, grid, "bilinear", "reflection", 1, mask,
                                              layout=layout)
        with pytest.raises(volsample.InvalidArgumentError, match="output_mask"):
            volsample.grid_sample_3d_backward(*stored, grid, "bilinear", "reflection", True,
                                              [int(m) for m in mask], layout=layout)
    finally:
        volsample.set_num_threads(threads)


@pytest.mark.parametrize("argument,value", [("mode", ["bilinear"]), ("padding_mode", {}),
                                            ("align_corners", [True]), ("layout", ["NCDHW"]),
                                            ("output_mask", {})])
def test_unhashable_arguments_are_named(argument, value):
    # A call's prepared kernels are found by its arguments: one that cannot be a key (a
    # list, a dict) is still the checks' to name.
    x = np.zeros((1, 1, 2, 2, 2), np.float32)
    grid = np.zeros((1, 1, 1, 2, 3), np.float32)
    for k in range(2):  # the second call's kernel is prepared
        if argument != "output_mask":
            with pytest.raises(volsample.InvalidArgumentError, match=f"^{argument}: "):
                volsample.grid_sample_3d(x, grid, **{argument: value})
        with pytest.raises(volsample.InvalidArgumentError, match=f"^{argument}: "):
            volsample.grid_sample_3d_backward(np.zeros((1, 1, 1, 1, 2), np.float32), x, grid,
                                              **{argument: value})
        volsample.grid_sample_3d(x, grid)
        volsample.grid_sample_3d_backward(np.zeros((1, 1, 1, 1, 2), np.float32), x, grid)


def _off_a_cache_line(shape, dtype):
    """An uninitialised array one element past a 64-byte line: the kernels store its
    vectors plainly where they stream an aligned result's."""
    size = int(np.prod(shape))
    raw = np.empty(size + 17, dtype)
    offset = (-raw.ctypes.data % 64) // raw.itemsize + 1
    return raw[offset:offset + size].reshape(shape)


@contextlib.contextmanager
def _streaming_isa(isa, monkeypatch):
    """Run on the SIMD build `isa` with every call split across threads; yields the thread
    counts to try (1, 2 and the current one). Both are restored on the way out."""
    monkeypatch.setattr(volsample._cpu, "MIN_WORK_PER_THREAD", 1)
    threads, previous_isa = volsample.get_num_threads(), _cpu.isa()
    try:
        _cpu.set_isa(isa)
        yield sorted({1, 2, threads})
    finally:
        volsample.set_num_threads(threads)
        _cpu.set_isa(previous_isa)


@pytest.mark.parametrize("isa", _cpu.supported_isas())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("padding_mode", PADDINGS)
def test_large_results_streamed_past_the_caches_keep_the_bits(padding_mode, dtype, isa,
                                                              monkeypatch):
    # An 8 MB float32 (16 MB float64) result, on a cache line (as volsample allocates it):
    # each SIMD build writes its whole vectors with non-temporal stores. PyTorch's bits, for
    # any thread count; and the same bits from a result one element off a line, whose vectors
    # it stores plainly.
    rng = np.random.default_rng(21)
    x = rng.standard_normal((1, 4, 16, 20, 24)).astype(dtype)
    grid = rng.uniform(-1.2, 1.2, (1, 64, 64, 128, 3)).astype(dtype)
    expected = torch_grid_sample(x, grid, "bilinear", padding_mode, False)
    assert expected.nbytes >= 8 << 20
    misaligned = _off_a_cache_line(expected.shape, dtype)
    call = _calls.grid_sample(_calls.operand("input", x), _calls.operand("grid", grid), 0,
                              PADDING_CODE[padding_mode], False)
    with _streaming_isa(isa, monkeypatch) as thread_counts:
        for n in thread_counts:
            volsample.set_num_threads(n)
            out = volsample.grid_sample_3d(x, grid, "bilinear", padding_mode, False)
            assert out.ctypes.data % 64 == 0
            assert_bitwise_equal(f"{n} threads", out, expected)
            misaligned[...] = np.nan
            cpu_grid.forward(call, x, grid, misaligned, n)
            assert_bitwise_equal(f"{n} threads, off a cache line", misaligned, expected)


@pytest.mark.parametrize("isa", _cpu.supported_isas())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("padding_mode", PADDINGS)
def test_large_grid_gradients_streamed_past_the_caches_keep_the_bits(padding_mode, dtype, isa,
                                                                     monkeypatch):
    # A grad_grid of 38 MB (float32; 75 MB float64) on a cache line, as volsample allocates
    # it: each SIMD build writes its whole blocks of points with non-temporal stores.
    # PyTorch's bits, for any thread count, both gradients; and the same bits into a
    # grad_grid one element off a line, whose blocks are stored plainly.
    rng = np.random.default_rng(22)
    x = rng.standard_normal((1, 1, 16, 20, 24)).astype(dtype)
    grid = rng.uniform(-1.2, 1.2, (1, 64, 128, 384, 3)).astype(dtype)
    grad_output = rng.standard_normal((1, 1, 64, 128, 384)).astype(dtype)
    expected = torch_grid_sample_backward(grad_output, x, grid, "bilinear", padding_mode, False)
    assert expected[1].nbytes >= 32 << 20
    misaligned = _off_a_cache_line(grid.shape, dtype)
    call = _calls.grid_sample(_calls.operand("input", x), _calls.operand("grid", grid), 0,
                              PADDING_CODE[padding_mode], False)
    with _streaming_isa(isa, monkeypatch) as thread_counts:
        for n in thread_counts:
            volsample.set_num_threads(n)
            got = volsample.grid_sample_3d_backward(grad_output, x, grid, "bilinear",
                                                    padding_mode, False)
            assert got[1].ctypes.data % 64 == 0
            for name, a, b in zip(("grad_input", "grad_grid"), got, expected):
                assert_bitwise_equal(f"{n} threads, {name}", a, b)
            grad_input = np.full_like(x, np.nan)
            misaligned[...] = np.nan
            cpu_grid.backward(call, grad_output, x, grid, grad_input, misaligned, n)
            assert_bitwise_equal(f"{n} threads, off a cache line", misaligned, expected[1])
            assert_bitwise_equal(f"{n} threads, beside it", grad_input, expected[0])


def _strategy_case(strategy, rng):
    """Inputs that send the backward down each of its parallel strategies on two threads:
    a grid close to the identity (rows in one or two planes: slabs of planes, some rows
    straddling two), random points (rows reach everywhere: one slab beside grid-gradient
    tasks) and eight batches (whole batches per slab: four slabs per thread)."""
    n = 8 if strategy == "batches" else 1
    x = rng.standard_normal((n, 2, 8, 5, 6)).astype(np.float32)
    if strategy == "random":
        grid = rng.uniform(-1.2, 1.2, (n, 8, 5, 6, 3))
    else:
        axes = [np.linspace(-1, 1, size) for size in (8, 5, 6)]
        z, y, x_ = np.meshgrid(*axes, indexing="ij")
        grid = np.stack([x_, y, z], -1)[None] + rng.normal(0, 0.05, (n, 8, 5, 6, 3))
    grid = grid.astype(np.float32)
    grad_out = rng.standard_normal((n, 2, 8, 5, 6)).astype(np.float32)
    return x, grid, grad_out


@pytest.mark.parametrize("strategy", ["slabs", "random", "batches"])
@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_backward_parallel_strategies(strategy, mode, padding_mode, align_corners, monkeypatch):
    """Every way the backward splits work across threads gives the one-thread bits, and
    PyTorch's values; the inputs do reach the strategy they are named after."""
    monkeypatch.setattr(volsample._cpu, "MIN_WORK_PER_THREAD", 1)
    x, grid, grad_out = _strategy_case(strategy, np.random.default_rng(14))
    call = _calls.grid_sample(_calls.operand("input", x), _calls.operand("grid", grid),
                              MODE_CODE[mode], PADDING_CODE[padding_mode], align_corners)
    slabs = cpu_grid.backward_slabs(call, x, grid, 2)
    assert (len(slabs) - 1 == 1) == (strategy == "random"), slabs
    if strategy == "batches":
        assert slabs == [8 * n for n in range(9)], slabs
    results = {}
    previous = volsample.get_num_threads()
    try:
        for threads in (1, 2):
            volsample.set_num_threads(threads)
            results[threads] = [volsample.grid_sample_3d_backward(
                grad_out, x, grid, mode, padding_mode, align_corners, mask)
                for mask in ((True, True), (True, False), (False, True))]
    finally:
        volsample.set_num_threads(previous)
    for one, two in zip(results[1], results[2]):
        for name, a, b in zip(("grad_input", "grad_grid"), one, two):
            if a is not None:
                assert_bitwise_equal(name, a, b)
    expected = torch_grid_sample_backward(grad_out, x, grid, mode, padding_mode, align_corners)
    gi, gg = results[2][0]
    assert_close("grad_input", gi, expected[0], 2e-5, 2e-5)
    assert_close("grad_grid", gg, expected[1], 2e-5, 2e-5 * max(1, np.abs(expected[1]).max()))


@pytest.mark.parametrize("far", [4.6, -7.3, 50.0, 1e6])
@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_backward_slabs_with_points_far_outside(far, mode, padding_mode, align_corners,
                                                monkeypatch):
    """Rows whose points lie far outside [-1, 1] (reflection folds them back in, border
    clips them to an end plane, zeros drops them) are sent to the slabs their points
    really touch: two threads give the one-thread bits and PyTorch's values."""
    monkeypatch.setattr(volsample._cpu, "MIN_WORK_PER_THREAD", 1)
    rng = np.random.default_rng(15)
    x = rng.standard_normal((1, 2, 8, 5, 6)).astype(np.float32)
    axes = [np.linspace(-1, 1, size) for size in (8, 5, 6)]
    z, y, x_ = np.meshgrid(*axes, indexing="ij")
    z = np.where(z > 0, far + 0.1 * x_, z)  # the second half of the rows lies far outside
    grid = np.stack([x_, y, z], -1)[None].astype(np.float32)
    grad_out = rng.standard_normal((1, 2, 8, 5, 6)).astype(np.float32)
    results = {}
    previous = volsample.get_num_threads()
    try:
        for threads in (1, 2):
            volsample.set_num_threads(threads)
            results[threads] = volsample.grid_sample_3d_backward(
                grad_out, x, grid, mode, padding_mode, align_corners)
    finally:
        volsample.set_num_threads(previous)
    for name, a, b in zip(("grad_input", "grad_grid"), results[1], results[2]):
        assert_bitwise_equal(name, a, b)
    expected = torch_grid_sample_backward(grad_out, x, grid, mode, padding_mode, align_corners)
    assert_close("grad_input", results[2][0], expected[0], 2e-5, 2e-5)


def test_any_strides():
    """Slices, negative strides, transposed grids and broadcast volumes give the same
    result as their contiguous copies."""
    rng = np.random.default_rng(10)
    base = rng.standard_normal((3, 4, 9, 8, 10))
    x = base[::2, 1::2, ::-1, 2:, ::-3]
    grid_base = rng.uniform(-1, 1, (2, 3, 4, 5, 3))
    grid = grid_base.transpose(0, 3, 2, 1, 4)[..., ::-1]
    grad_out = rng.standard_normal((2, 2, 5, 4, 3))[:, ::-1]
    out = volsample.grid_sample_3d(x, grid, "bilinear", "border")
    gi, gg = volsample.grid_sample_3d_backward(grad_out, x, grid, "bilinear", "border")
    c = np.ascontiguousarray
    out_c = volsample.grid_sample_3d(c(x), c(grid), "bilinear", "border")
    gi_c, gg_c = volsample.grid_sample_3d_backward(c(grad_out), c(x), c(grid), "bilinear", "border")
    assert_bitwise_equal("output", out, out_c)
    assert_bitwise_equal("grad_input", gi, gi_c)
    assert_bitwise_equal("grad_grid", gg, gg_c)
    broadcast = np.broadcast_to(rng.standard_normal((1, 1, 1, 1, 10)), (2, 2, 9, 8, 10))
    out_b = volsample.grid_sample_3d(broadcast, grid)
    assert_bitwise_equal("broadcast output", out_b, volsample.grid_sample_3d(c(broadcast), grid))


def test_ndhwc_result_is_channels_last():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 4, 5, 6, 3)).astype(np.float32)  # N, D, H, W, C
    grid = rng.uniform(-1, 1, (1, 2, 3, 4, 3)).astype(np.float32)
    out = volsample.grid_sample_3d(x, grid, layout="NDHWC")
    assert out.shape == (1, 2, 3, 4, 3) and out.flags.c_contiguous
    gi, _ = volsample.grid_sample_3d_backward(out, x, grid, layout="NDHWC")
    assert gi.shape == x.shape and gi.flags.c_contiguous


def test_output_mask():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 2, 3, 4, 5))
    grid = rng.uniform(-1, 1, (1, 2, 2, 2, 3))
    g = rng.standard_normal((1, 2, 2, 2, 2))
    both = volsample.grid_sample_3d_backward(g, x, grid)
    gi, gg = volsample.grid_sample_3d_backward(g, x, grid, output_mask=(True, False))
    assert gg is None
    assert_bitwise_equal("grad_input", gi, both[0])
    gi, gg = volsample.grid_sample_3d_backward(g, x, grid, output_mask=(False, True))
    assert gi is None
    assert_bitwise_equal("grad_grid", gg, both[1])
    assert volsample.grid_sample_3d_backward(g, x, grid, output_mask=(False, False)) == (None, None)


@pytest.mark.parametrize("in_shape,grid_shape", [
    ((0, 2, 3, 4, 5), (0, 2, 2, 2, 3)),   # no batch
    ((2, 0, 3, 4, 5), (2, 2, 2, 2, 3)),   # no channels
    ((2, 3, 3, 4, 5), (2, 0, 2, 2, 3)),   # no output points
])
def test_empty_tensors(in_shape, grid_shape):
    x = np.ones(in_shape, np.float32)
    grid = np.zeros(grid_shape, np.float32)
    out = volsample.grid_sample_3d(x, grid)
    assert out.shape == in_shape[:2] + grid_shape[1:4]
    gi, gg = volsample.grid_sample_3d_backward(np.ones(out.shape, np.float32), x, grid)
    assert gi.shape == in_shape and not gi.any()
    assert gg.shape == grid_shape and not gg.any()


ERRORS = [
    (dict(input=np.zeros((1, 1, 2, 2)), grid=np.zeros((1, 1, 1, 1, 3))), ValueError, "input: expected a 5-D array"),
    (dict(grid=np.zeros((1, 1, 1, 3))), ValueError, "grid: expected a 5-D array"),
    (dict(grid=np.zeros((1, 1, 1, 1, 2))), ValueError, "grid: expected last dimension 3"),
    (dict(grid=np.zeros((2, 1, 1, 1, 3))), ValueError, "grid: expected batch size 1"),
    (dict(input=np.zeros((1, 1, 0, 2, 2))), ValueError, "input: expected non-empty spatial"),
    (dict(mode="quintic"), ValueError, r"mode: expected one of 'bilinear', 'nearest'.*, got 'quintic' \('trilinear' is another name of 'bilinear'\)"),
    (dict(padding_mode="wrap"), ValueError, "padding_mode: expected one of .*got 'wrap'"),
    (dict(align_corners="yes"), ValueError, "align_corners: expected a bool"),
    (dict(layout="NHWC"), ValueError, "layout: expected 'NCDHW' or 'NDHWC', got 'NHWC'"),
    (dict(input=np.zeros((1, 1, 2, 2, 2), np.int32)), TypeError, "input: expected dtype float16, bfloat16, float32 or float64, got int32"),
    (dict(grid=np.zeros((1, 1, 1, 1, 3), np.float32)), TypeError, "grid: expected dtype float64"),
    (dict(input="volume"), TypeError, "input: expected a NumPy array, got str"),
]


@pytest.mark.parametrize("overrides,error,message", ERRORS)
def test_errors_name_the_argument(overrides, error, message):
    args = dict(input=np.zeros((1, 1, 2, 2, 2)), grid=np.zeros((1, 1, 1, 1, 3)))
    args.update(overrides)
    with pytest.raises(error, match=message):
        volsample.grid_sample_3d(**args)
    with pytest.raises(error, match=message):
        volsample.grid_sample_3d_backward(np.zeros((1, 1, 1, 1, 1)), **args)
    with pytest.raises(volsample.VolsampleError):
        volsample.grid_sample_3d(**args)


@pytest.mark.parametrize("grad_output,error,message", [
    (np.zeros((1, 1, 1, 1, 2)), ValueError, r"grad_output: expected shape \(the forward's output shape, NCDHW\) \(1, 1, 1, 1, 1\)"),
    (np.zeros((1, 1, 1, 1, 1), np.float32), TypeError, "grad_output: expected dtype float64"),
    (np.zeros((1, 1, 1, 1)), ValueError, "grad_output: expected a 5-D array"),
])
def test_backward_errors(grad_output, error, message):
    with pytest.raises(error, match=message):
        volsample.grid_sample_3d_backward(grad_output, np.zeros((1, 1, 2, 2, 2)),
                                          np.zeros((1, 1, 1, 1, 3)))
    with pytest.raises(ValueError, match="output_mask: expected a pair of bools"):
        volsample.grid_sample_3d_backward(np.zeros((1, 1, 1, 1, 1)), np.zeros((1, 1, 2, 2, 2)),
                                          np.zeros((1, 1, 1, 1, 3)), output_mask=(True,))


def test_sixteen_bit_dtypes_are_the_input_dtypes():
    for dtype in SIXTEEN_BIT:
        x = np.ones((1, 1, 2, 2, 2), dtype)
        out = volsample.grid_sample_3d(x, np.zeros((1, 1, 1, 1, 3), dtype))
        assert out.dtype == dtype and out.item() == 1


@pytest.mark.slow
def test_more_than_two_to_the_31_elements():
    """64-bit indexing: a float32 volume of 2^31 + 2^22 elements (8.6 GB). Sampling the last
    voxels checks that offsets past 2^31 are neither wrapped nor truncated."""
    D, H, W = 2049, 1024, 1024
    x = np.zeros((1, 1, D, H, W), np.float32)
    x[0, 0, -1, -1, -4:] = [1, 2, 3, 4]
    grid = np.zeros((1, 1, 1, 4, 3), np.float32)
    grid[..., 0] = (2 * np.arange(W - 4, W) / (W - 1) - 1)
    grid[..., 1] = 1.0
    grid[..., 2] = 1.0
    out = volsample.grid_sample_3d(x, grid, "nearest", align_corners=True)
    np.testing.assert_array_equal(out.ravel(), [1, 2, 3, 4])
    gi, _ = volsample.grid_sample_3d_backward(out, x, grid, "nearest", align_corners=True,
                                              output_mask=(True, False))
    np.testing.assert_array_equal(gi[0, 0, -1, -1, -4:], [1, 2, 3, 4])


LABEL_DTYPES = [np.uint8, np.int16, np.int32]


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("padding_mode", PADDINGS)
@pytest.mark.parametrize("grid_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dtype", LABEL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_nearest_integer_labels_are_copied_exactly(dtype, grid_dtype, padding_mode, layout):
    """An integer label map sampled with mode="nearest" holds exactly the voxels PyTorch's
    nearest sampling picks (found by sampling a volume of voxel numbers, float, with the same
    grid), 0 where zeros padding reads outside, in its own dtype; labels beyond float32's
    24-bit mantissa survive too."""
    rng = np.random.default_rng(16)
    info = np.iinfo(dtype)
    labels = rng.integers(info.min, info.max, (2, 3, 5, 6, 7), endpoint=True).astype(dtype)
    if dtype == np.int32:
        labels.flat[:4] = [info.max, info.min, (1 << 24) + 1, -(1 << 24) - 1]
    grid = adversarial_grid(rng, (2, 4, 3, 9, 3), labels.shape[2:], grid_dtype)
    # Voxel numbers from 1 (0 stays "outside"), a float copy PyTorch samples exactly.
    numbers = np.arange(1, labels.size + 1, dtype=grid_dtype).reshape(labels.shape)
    padded = np.concatenate([[0], labels.ravel()])
    for align_corners in (False, True):
        picked = torch_grid_sample(numbers, grid, "nearest", padding_mode, align_corners)
        expected = padded[picked.astype(np.int64)]
        x = np.ascontiguousarray(labels.transpose(0, 2, 3, 4, 1)) if layout == "NDHWC" else labels
        out = volsample.grid_sample_3d(x, grid, "nearest", padding_mode, align_corners,
                                       layout=layout)
        assert out.dtype == dtype
        if layout == "NDHWC":
            out = out.transpose(0, 4, 1, 2, 3)
        np.testing.assert_array_equal(out, expected)
    # Voxel centres read every voxel back, the extreme labels included.
    axes = [np.linspace(-1, 1, n) for n in labels.shape[2:]]
    z, y, x_ = np.meshgrid(*axes, indexing="ij")
    centres = np.broadcast_to(np.stack([x_, y, z], -1), (2,) + labels.shape[2:] + (3,))
    out = volsample.grid_sample_3d(labels, centres.astype(grid_dtype), "nearest", padding_mode,
                                   True)
    np.testing.assert_array_equal(out, labels)


def test_integer_labels_are_refused_where_not_nearest_forward():
    labels = np.zeros((1, 1, 2, 2, 2), np.int16)
    grid = np.zeros((1, 1, 1, 1, 3), np.float32)
    with pytest.raises(TypeError, match="input: expected dtype float16.*got int16.*nearest"):
        volsample.grid_sample_3d(labels, grid, "bilinear")
    with pytest.raises(TypeError, match="input: expected dtype float16.*got int16"):
        volsample.grid_sample_3d_backward(np.zeros((1, 1, 1, 1, 1), np.int16), labels, grid,
                                          "nearest")
    with pytest.raises(TypeError, match="grid: expected dtype float32 or float64"):
        volsample.grid_sample_3d(labels, grid.astype(np.float16), "nearest")
    with pytest.raises(TypeError, match="input: expected dtype float16.*got int64"):
        volsample.grid_sample_3d(labels.astype(np.int64), grid, "nearest")
