"""Upsampling on every instruction set of the C++ core gives the scalar path's bits.

The kernels are compiled once per ISA (scalar, AVX2, AVX-512) and must compute the same
operations per element in every lane (explicit fma, no contraction), so forward and
backward results are bitwise equal whichever ISA runs, for every dtype (the 16-bit
loads and rounded stores too), layout and size. Sizes are odd and some rows are longer
than a vector, so that vector bodies and scalar tails both run; one case has more
channels than a conversion tile (512), channels last. Every result is also bitwise
independent of the thread count.
"""
from __future__ import annotations

import numpy as np
import pytest

import volsample
from volsample import _cpu
from helpers import DTYPES, assert_bitwise_equal

# (input logical shape, forward kwargs, layout)
CASES = [
    ((2, 3, 5, 6, 37), {"size": (9, 13, 75)}, "NCDHW"),           # up, rows past a vector
    ((1, 2, 9, 7, 41), {"size": (4, 5, 17)}, "NCDHW"),            # down
    ((1, 2, 4, 5, 19), {"scale_factor": (1.7, 0.6, 2.3)}, "NCDHW"),  # scales, mixed
    ((1, 3, 4, 5, 6), {"size": (4, 9, 6)}, "NCDHW"),              # D and W keep their size
    ((2, 19, 3, 4, 5), {"size": (5, 7, 9)}, "NDHWC"),             # channel vectors + tails
    ((1, 5, 6, 3, 7), {"scale_factor": (0.5, 2.0, 1.5)}, "NDHWC"),
    ((1, 600, 2, 2, 3), {"size": (3, 3, 5)}, "NDHWC"),            # more channels than a tile
]


def volume(shape, dtype, seed):
    """Values over many binades (16-bit subnormals and overflow included), with signed
    zeros, so that every rounding path of the stores runs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 18, shape))
    x.flat[::97] = -0.0
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def results(x, g, kwargs, layout):
    out = []
    for align_corners in (False, True):
        out.append(volsample.upsample_trilinear_3d(x, align_corners=align_corners,
                                                    layout=layout, **kwargs))
        scales = kwargs.get("scale_factor")
        out.append(volsample.upsample_trilinear_3d_backward(g, x_logical_shape(x, layout),
                                                             align_corners, scales,
                                                             layout=layout))
    return out


def x_logical_shape(x, layout):
    return x.shape if layout == "NCDHW" else (x.shape[0], x.shape[4]) + x.shape[1:4]


def operands(shape, kwargs, layout, dtype, seed):
    x = volume(shape, dtype, seed)
    y = volsample.upsample_trilinear_3d(x, **kwargs)  # only for the output's shape
    g = volume(y.shape, dtype, seed + 1)
    if layout == "NDHWC":
        x, g = (np.ascontiguousarray(a.transpose(0, 2, 3, 4, 1)) for a in (x, g))
    return x, g


@pytest.fixture
def restore_isa():
    isa = _cpu.isa()
    threads = volsample.get_num_threads()
    yield
    _cpu.set_isa(isa)
    volsample.set_num_threads(threads)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_isa_gives_the_scalar_bits(case, dtype, restore_isa):
    shape, kwargs, layout = CASES[case]
    x, g = operands(shape, kwargs, layout, dtype, seed=case)
    _cpu.set_isa("scalar")
    expected = results(x, g, kwargs, layout)
    for isa in _cpu.supported_isas():
        _cpu.set_isa(isa)
        for k, (ours, want) in enumerate(zip(results(x, g, kwargs, layout), expected)):
            assert_bitwise_equal(f"{isa} result {k}", ours, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_thread_count_does_not_change_bits(dtype, restore_isa, monkeypatch):
    monkeypatch.setattr(volsample._cpu, "MIN_WORK_PER_THREAD", 1)  # small inputs use all threads
    threads = sorted({1, 2, 3, volsample.get_num_threads()})
    for case in (0, 4):
        shape, kwargs, layout = CASES[case]
        x, g = operands(shape, kwargs, layout, dtype, seed=10 + case)
        per_count = []
        for n in threads:
            monkeypatch.setattr(volsample._cpu, "_num_threads", n)
            per_count.append(results(x, g, kwargs, layout))
        for n, got in zip(threads[1:], per_count[1:]):
            for k, (ours, want) in enumerate(zip(got, per_count[0])):
                assert_bitwise_equal(f"{n} threads, result {k}", ours, want)
