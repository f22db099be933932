"""Every instruction-set path of the C++ core (scalar, AVX2, AVX-512: those this CPU runs)
gives bitwise the scalar path's results, for every operator (``OPS``: each entry runs one
operator's forward and backward over its modes on one dtype and layout), odd widths (not
multiples of any vector length) and strided views."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_bitwise_equal

import volsample
from volsample import _cpu
from volsample._tables import MODES, PADDINGS

BF16 = np.dtype(ml_dtypes.bfloat16)
# (volume dtype, grid dtype): each dtype, and 16-bit volumes beside float32/float64 grids.
DTYPES = [(np.float32, np.float32), (np.float64, np.float64), (np.float16, np.float16),
          (BF16, BF16), (np.float16, np.float32), (BF16, np.float64)]
OTHER_ISAS = [isa for isa in _cpu.supported_isas() if isa != "scalar"]
WIDTHS = (1, 7, 17, 33)


def _with_isa(isa, call):
    previous = _cpu.isa()
    _cpu.set_isa(isa)
    try:
        return call()
    finally:
        _cpu.set_isa(previous)


def _volume(rng, logical_shape, dtype, layout, strided):
    """A volume in ``layout``; ``strided``: a view with every other W voxel and D reversed."""
    shape = list(logical_shape)
    if strided:
        shape[4] = 2 * shape[4]
    x = rng.standard_normal(shape).astype(dtype)
    if layout == "NDHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 4, 1))
        return x[:, ::-1, :, ::2] if strided else x
    return x[:, :, ::-1, :, ::2] if strided else x


def _grid_sample_results(dtype, grid_dtype, layout, strided, rng):
    """Forward, grad_input and grad_grid of every mode, padding and align_corners, at each
    width: points in and around [-1, 1], some on voxel centres and edges (a cubic tap's
    weight is then exactly 0 or 1), some far outside, one NaN."""
    modes = list(itertools.product(MODES.names(), PADDINGS.names(), [False, True]))
    cases = []
    for width in WIDTHS:
        x = _volume(rng, (2, 3, 5, 4, width), dtype, layout, strided)
        grid = rng.uniform(-1.3, 1.3, (2, 3, 2, 2 * width if strided else width, 3))
        exact = grid.reshape(-1, 3)[::7]
        exact[...] = rng.choice([-1.0, 0.0, 1.0, -3.5, 2.25], size=exact.shape)
        grid[0, 0, 0, 0] = (0.0, np.nan, 0.5)
        grid[1, 2, 1, -1] = (5.0, -7.0, 40.0)
        grid = grid.astype(grid_dtype)[:, :, :, ::2] if strided else grid.astype(grid_dtype)
        grad_out = _volume(rng, (2, 3) + grid.shape[1:4], dtype, layout, False)
        cases.append((x, grid, grad_out))

    def run():
        out = []
        for (x, grid, grad_out), (mode, padding, align) in itertools.product(cases, modes):
            out.append(volsample.grid_sample_3d(x, grid, mode, padding, align, layout=layout))
            out.extend(volsample.grid_sample_3d_backward(grad_out, x, grid, mode, padding, align,
                                                         layout=layout))
        return out
    return run


OPS = {"grid_sample": _grid_sample_results}


@pytest.mark.skipif(not OTHER_ISAS, reason="this CPU runs only the scalar path")
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype,grid_dtype", DTYPES,
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("isa", OTHER_ISAS)
@pytest.mark.parametrize("op", list(OPS))
def test_isa_matches_scalar(op, isa, dtype, grid_dtype, layout, strided):
    run = OPS[op](dtype, grid_dtype, layout, strided, np.random.default_rng(21))
    expected = _with_isa("scalar", run)
    actual = _with_isa(isa, run)
    assert len(actual) == len(expected)
    for i, (a, b) in enumerate(zip(actual, expected)):
        assert_bitwise_equal(f"{op} {isa} result {i}", a, b)


def test_set_isa_rejects_unknown_names():
    with pytest.raises(ValueError, match="expected one of"):
        _cpu.set_isa("sse9")


@pytest.mark.skipif(not OTHER_ISAS, reason="this CPU runs only the scalar path")
@pytest.mark.parametrize("isa", OTHER_ISAS)
def test_offsets_beyond_int32_lanes_match_scalar(isa):
    """The SIMD paths index with int32 lanes; a volume whose offsets pass 2^31 elements
    (2 planes 2^31 + 64 floats apart, in lazily allocated memory) takes the scalar path."""
    import mmap
    plane = (1 << 31) + 64
    no_reserve = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value; Python may not name it
    memory = mmap.mmap(-1, (plane + 8) * 4,  # untouched pages cost nothing
                       flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | no_reserve)
    flat = np.frombuffer(memory, np.float32)
    rng = np.random.default_rng(5)
    x = np.lib.stride_tricks.as_strided(flat, (1, 1, 2, 2, 2), (0, 0, plane * 4, 8, 4))
    for z in range(2):
        flat[z * plane:z * plane + 4] = rng.standard_normal(4)
    grid = rng.uniform(-1.2, 1.2, (1, 2, 3, 5, 3)).astype(np.float32)
    grad_out = rng.standard_normal((1, 1, 2, 3, 5)).astype(np.float32)

    def run():
        return [volsample.grid_sample_3d(x, grid), *volsample.grid_sample_3d_backward(grad_out, x, grid)]
    try:
        for i, (a, b) in enumerate(zip(_with_isa(isa, run), _with_isa("scalar", run))):
            assert_bitwise_equal(f"{isa} result {i}", a, b)
    finally:
        del x, flat
        memory.close()
