"""Upsampling's per-axis maps (``volsample._upsample_maps``, the GPU backend's tables) are
the C++ core's (``_cpu.upsample.axis_map``, which its kernels use), bit for bit: the same
source indices and weights, in the same order, forward and transposed, in float32 and
float64, for sizes and scale factors that PyTorch's upsampling takes."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from volsample import _upsample_maps
from volsample._cpu import upsample as cpu_upsample

SIZES = st.integers(1, 700) | st.sampled_from([1, 2, 3, 2049, 4096])
SCALES = st.none() | st.just(0.0) | st.floats(1e-3, 1e3) | st.sampled_from(
    [1 / 3, 0.5, 2.0, 3.3333333333, 1e-7, 1e7])


def assert_same_map(*arguments):
    ours = _upsample_maps.axis_map(*arguments)
    theirs = cpu_upsample.axis_map(*arguments)
    for name, a, b in zip(("starts", "index", "weight"), ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape, (name, arguments)
        assert a.tobytes() == b.tobytes(), (name, arguments)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(SIZES, SIZES, st.booleans(), SCALES, st.sampled_from([np.float32, np.float64]),
       st.booleans())
def test_maps_are_the_cpp_cores(in_size, out_size, align_corners, scale, dtype, transposed):
    assert_same_map(in_size, out_size, align_corners, scale, dtype, transposed)


def test_the_fused_source_coordinate_is_rounded_once():
    """2 -> 7 voxels, where the product ratio * (o + 0.5) and then - 0.5, each rounded,
    differ from the fused operation's one rounding (the C++ core's, and PyTorch's, source
    coordinates), in both dtypes."""
    for dtype in (np.float32, np.float64):
        for transposed in (False, True):
            assert_same_map(2, 7, False, None, dtype, transposed)
        ratio = _upsample_maps.ratio(2, 7, False, None, dtype)
        fused = _upsample_maps.sources(ratio, 7, False)
        separate = np.maximum(ratio * (np.arange(7).astype(dtype) + dtype(0.5)) - dtype(0.5),
                              dtype(0))
        assert not np.array_equal(fused, separate)  # the case tested is one that tells
