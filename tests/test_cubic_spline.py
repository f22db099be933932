"""spline_coefficients, the cubic B-spline prefilter: its bspline samples at the voxel
centres give the volume back (every padding, layout and dtype), SciPy's spline_filter where
the boundary conditions are shared, and the adjoint's dot-product identity."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_close
from scipy import ndimage

import volsample
from volsample.spline import spline_coefficients_adjoint

PADDINGS = ["zeros", "border", "reflection"]
ALL = list(itertools.product(PADDINGS, [False, True]))
SHAPES = [(2, 3, 5, 6, 7), (1, 2, 1, 2, 3), (1, 1, 4, 1, 9)]


def _centres(shape, align_corners):
    """The normalised grid of every voxel centre of a (D, H, W) volume."""
    axes = []
    for size in shape:
        i = np.arange(size, dtype=np.float64)
        if align_corners:
            axes.append(2 * i / (size - 1) - 1 if size > 1 else 0 * i)
        else:
            axes.append((2 * i + 1) / size - 1)
    z, y, x = np.meshgrid(*axes, indexing="ij")
    return np.stack([x, y, z], -1)


@pytest.mark.parametrize("padding_mode,align_corners", ALL)
@pytest.mark.parametrize("shape", SHAPES)
def test_samples_at_the_voxel_centres_give_the_volume_back(padding_mode, align_corners, shape):
    rng = np.random.default_rng(1)
    volume = rng.standard_normal(shape)
    coeffs = volsample.spline_coefficients(volume, padding_mode, align_corners)
    assert coeffs.shape == volume.shape and coeffs.dtype == volume.dtype
    grid = np.broadcast_to(_centres(shape[2:], align_corners), (shape[0],) + shape[2:] + (3,))
    back = volsample.grid_sample_3d(coeffs, np.ascontiguousarray(grid), "bspline", padding_mode,
                                    align_corners)
    assert_close("samples", back, volume, 1e-12, 1e-12)
    assert not np.allclose(coeffs, volume)  # the filter does something


@pytest.mark.parametrize("padding_mode,align_corners", ALL)
def test_layouts_and_dtypes(padding_mode, align_corners):
    rng = np.random.default_rng(2)
    volume = rng.standard_normal((1, 3, 4, 5, 6))
    expected = volsample.spline_coefficients(volume, padding_mode, align_corners)
    channels_last = np.ascontiguousarray(volume.transpose(0, 2, 3, 4, 1))
    got = volsample.spline_coefficients(channels_last, padding_mode, align_corners,
                                        layout="NDHWC")
    assert got.shape == channels_last.shape
    assert_close("NDHWC", got.transpose(0, 4, 1, 2, 3), expected, 1e-15, 1e-15)
    strided = np.zeros((1, 3, 4, 5, 12))
    strided[..., ::2] = volume
    assert_close("strided", volsample.spline_coefficients(strided[..., ::2], padding_mode,
                                                          align_corners), expected, 1e-15, 1e-15)
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        low = volume.astype(dtype)
        got = volsample.spline_coefficients(low, padding_mode, align_corners)
        assert got.dtype == np.dtype(dtype)
        truth = volsample.spline_coefficients(low.astype(np.float64), padding_mode,
                                              align_corners)
        eps = float(np.finfo(dtype).eps)
        assert_close(np.dtype(dtype).name, got, truth, eps, eps)  # rounded once


SCIPY_MODES = {("border", False): "nearest", ("border", True): "nearest",
               ("reflection", True): "mirror", ("reflection", False): "reflect"}


@pytest.mark.parametrize("padding_mode,align_corners", list(SCIPY_MODES))
def test_scipy_spline_filter(padding_mode, align_corners):
    """SciPy's spline_filter solves the same systems for the boundary conditions it shares
    (border and reflection; its zero padding differs). Its recursive filter starts from a
    truncated series, exact to round-off only on lines of a few tens of voxels (on 6 voxels
    it is off by ~1e-8; ours solves the systems exactly): long axes."""
    rng = np.random.default_rng(3)
    volume = rng.standard_normal((1, 1, 30, 31, 33))
    coeffs = volsample.spline_coefficients(volume, padding_mode, align_corners)
    expected = ndimage.spline_filter(volume[0, 0], order=3,
                                     mode=SCIPY_MODES[padding_mode, align_corners])
    assert_close("coefficients", coeffs[0, 0], expected, 1e-10, 1e-10)


@pytest.mark.parametrize("padding_mode,align_corners", ALL)
@pytest.mark.parametrize("shape", SHAPES)
def test_adjoint_dot_product(padding_mode, align_corners, shape):
    rng = np.random.default_rng(4)
    v, g = rng.standard_normal(shape), rng.standard_normal(shape)
    lhs = float((volsample.spline_coefficients(v, padding_mode, align_corners) * g).sum())
    rhs = float((v * spline_coefficients_adjoint(g, padding_mode, align_corners)).sum())
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))
    # The reflection about the voxel centres is not symmetric: its adjoint differs.
    if padding_mode == "reflection" and align_corners and max(shape[2:]) > 2:
        assert not np.allclose(spline_coefficients_adjoint(g, padding_mode, align_corners),
                               volsample.spline_coefficients(g, padding_mode, align_corners))


def test_errors():
    with pytest.raises(volsample.InvalidArgumentError, match="padding_mode"):
        volsample.spline_coefficients(np.zeros((1, 1, 2, 2, 2)), "wrap")
    with pytest.raises(volsample.InvalidArgumentError, match="volume"):
        volsample.spline_coefficients(np.zeros((2, 2, 2)))
    with pytest.raises(volsample.UnsupportedDTypeError, match="volume"):
        volsample.spline_coefficients(np.zeros((1, 1, 2, 2, 2), np.int32))
    with pytest.raises(volsample.InvalidArgumentError, match="layout"):
        volsample.spline_coefficients(np.zeros((1, 1, 2, 2, 2)), layout="DHW")
