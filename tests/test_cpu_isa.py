"""Every instruction-set path of the C++ core (scalar, AVX2, AVX-512; those this CPU runs)
gives bitwise the scalar path's results: grid sampling forward and both gradients, every
mode, padding and align_corners, each dtype, both layouts, odd widths."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_bitwise_equal

import volsample
from volsample import _cpu

MODES = list(itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"],
                               [False, True]))
DTYPES = [np.float32, np.float64, np.float16, np.dtype(ml_dtypes.bfloat16)]
OTHER_ISAS = [isa for isa in _cpu.supported_isas() if isa != "scalar"]


def _with_isa(isa, call):
    previous = _cpu.isa()
    _cpu.set_isa(isa)
    try:
        return call()
    finally:
        _cpu.set_isa(previous)


def _grid_case(dtype, layout, width, rng):
    """A small volume, a grid of points in and around [-1, 1] (some far outside, one NaN)
    and a grad_output, all ``dtype``; ``width`` is both the volume's and the output's W."""
    shape = (2, 3, 5, 4, width)
    x = rng.standard_normal(shape).astype(dtype)
    grid = rng.uniform(-1.3, 1.3, (2, 3, 2, width, 3))
    grid[0, 0, 0, 0] = (0.0, np.nan, 0.5)
    grid[1, 2, 1, -1] = (5.0, -7.0, 40.0)
    grid = grid.astype(dtype)
    grad_out = rng.standard_normal((2, 3, 3, 2, width)).astype(dtype)
    if layout == "NDHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 4, 1))
        grad_out = np.ascontiguousarray(grad_out.transpose(0, 2, 3, 4, 1))
    return x, grid, grad_out


@pytest.mark.skipif(not OTHER_ISAS, reason="this CPU runs only the scalar path")
@pytest.mark.parametrize("isa", OTHER_ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_grid_sample_isa_matches_scalar(isa, dtype, layout):
    rng = np.random.default_rng(21)
    for width in (1, 7, 17, 33):
        x, grid, grad_out = _grid_case(dtype, layout, width, rng)
        for mode, padding, align in MODES:
            def run():
                out = volsample.grid_sample_3d(x, grid, mode, padding, align, layout=layout)
                gi, gg = volsample.grid_sample_3d_backward(grad_out, x, grid, mode, padding,
                                                           align, layout=layout)
                return out, gi, gg
            expected = _with_isa("scalar", run)
            actual = _with_isa(isa, run)
            for name, a, b in zip(("output", "grad_input", "grad_grid"), actual, expected):
                assert_bitwise_equal(f"{isa} {name} W={width} {mode} {padding} {align}", a, b)


def test_set_isa_rejects_unknown_names():
    with pytest.raises(ValueError, match="expected one of"):
        _cpu.set_isa("sse9")
