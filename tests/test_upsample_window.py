"""Windows of an upsampling's output (``volsample._cpu.upsample.window``): what
registration upsamples its control grid into, part by part.

A window's forward must give the bits of that part of the whole output, and its backward
the bits of the whole backward of a gradient that is zero outside the window, on every ISA
and thread count.
"""
from __future__ import annotations

import numpy as np
import pytest

import volsample
from volsample import _cpu, _layout, upsample_trilinear_3d, upsample_trilinear_3d_backward
from volsample._cpu import upsample as kernels

SHAPE = (9, 11, 13)  # the input: odd sizes, none alike
# (output size, window first, window size) per axis: inner and edge windows, one row, a
# window as large as the input along H (not the identity map), and an axis that keeps
# its size (D: 9 -> 9, the identity map, windowed)
CASES = [
    ((25, 33, 29), (3, 5, 7), (16, 20, 9)),
    ((25, 33, 29), (0, 0, 0), (25, 33, 29)),
    ((25, 33, 29), (24, 32, 0), (1, 1, 29)),
    ((25, 33, 29), (10, 2, 4), (4, 11, 13)),
    ((9, 40, 20), (2, 7, 0), (5, 30, 20)),
]


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("align_corners", [True, False])
@pytest.mark.parametrize("size,first,window", CASES)
def test_window_is_that_part_of_the_whole_output_and_its_adjoint(size, first, window,
                                                                align_corners, dtype, layout,
                                                                monkeypatch):
    monkeypatch.setattr(_cpu, "MIN_WORK_PER_THREAD", 1)  # even these split their work
    rng = np.random.default_rng(5)
    channels = 3
    physical = (1, channels) + SHAPE if layout == "NCDHW" else (1,) + SHAPE + (channels,)
    volume = rng.standard_normal(physical).astype(dtype)
    whole = upsample_trilinear_3d(volume, size=size, align_corners=align_corners, layout=layout)
    part = (slice(None),) * 2 + tuple(slice(f, f + n) for f, n in zip(first, window))
    expected = _layout.logical(whole, layout)[part]
    gradient = np.zeros(whole.shape, dtype)
    _layout.logical(gradient, layout)[part] = rng.standard_normal(expected.shape)
    expected_grad = upsample_trilinear_3d_backward(gradient, (1, channels) + SHAPE,
                                                   align_corners=align_corners, layout=layout)
    window_grad = np.ascontiguousarray(_layout.physical(
        _layout.logical(gradient, layout)[part], layout))
    previous = _cpu.isa(), volsample.get_num_threads()
    try:
        for isa in _cpu.supported_isas():
            _cpu.set_isa(isa)
            for threads in (1, 2):
                volsample.set_num_threads(threads)
                out = np.full(_layout.physical_shape((1, channels) + window, layout), np.nan,
                              dtype)
                kernels.window(_layout.logical(volume, layout), _layout.logical(out, layout),
                               first, size, align_corners, layout=layout)
                np.testing.assert_array_equal(_layout.logical(out, layout), expected,
                                              err_msg=f"{isa}")
                grad = np.full(volume.shape, np.nan, dtype)  # written whole
                kernels.window(_layout.logical(window_grad, layout),
                               _layout.logical(grad, layout), first, size, align_corners,
                               backward=True, layout=layout)
                np.testing.assert_array_equal(grad, expected_grad, err_msg=f"{isa}")
    finally:
        _cpu.set_isa(previous[0])
        volsample.set_num_threads(previous[1])


def test_window_outside_the_output_is_refused():
    volume = np.zeros((1, 1) + SHAPE, np.float32)
    out = np.empty((1, 1, 4, 4, 4), np.float32)
    with pytest.raises(ValueError, match="the window must lie in the output"):
        kernels.window(volume, out, (0, 0, 27), (25, 33, 29), True)
