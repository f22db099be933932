"""Cubic B-spline prefiltering for NumPy arrays: ``spline_coefficients`` and its adjoint.

``grid_sample_3d(..., mode="bspline")`` takes its input as the coefficients of a cubic
B-spline; the prefilter turns a volume into the coefficients whose spline interpolates it
(``volsample._prefilter`` computes it). It is linear; its adjoint (the transposed solves,
in reverse axis order) is what carries a gradient of the coefficients back to the volume.
Computed in float64 and rounded once to the volume's dtype.
"""
from __future__ import annotations

import numpy as np

from . import _checks, _layout, _prefilter
from ._tables import PADDINGS

def _filter(volume, padding_mode, align_corners, layout, adjoint: bool):
    volume = _checks.ndarray("volume", volume)
    padding = PADDINGS.code(padding_mode)
    align_corners = _checks.boolean("align_corners", align_corners)
    layout = _layout.check(layout)
    _checks.volume_dtype("volume", volume.dtype)
    _checks.rank("volume", volume.shape, 5)
    shape = _layout.logical_shape(volume.shape, layout)
    _checks.nonempty_spatial("volume", shape[2:])
    x = _prefilter.filtered(_layout.logical(volume, layout), padding, align_corners, adjoint)
    out = _layout.empty(shape, volume.dtype, layout)
    out[...] = x
    return _layout.physical(out, layout)


def spline_coefficients(volume: np.ndarray, padding_mode: str = "border",
                        align_corners: bool = False, *, layout: str = "NCDHW") -> np.ndarray:
    """The cubic B-spline coefficients of a volume: the prefilter of ``mode="bspline"``.

    ``grid_sample_3d(spline_coefficients(v, p, a), grid, "bspline", p, a)`` interpolates
    ``v``: at the voxel centres it gives ``v`` back (to round-off), and between them the
    cubic spline through the voxels, extended beyond the volume as padding ``p`` says.

    Parameters
    ----------
    volume : ndarray, shape (N, C, D, H, W), or (N, D, H, W, C) with ``layout="NDHWC"``
        float16, bfloat16, float32 or float64, any strides.
    padding_mode : {"zeros", "border", "reflection"}
        The padding the coefficients will be sampled with.
    align_corners : bool
        As the sampling call's (it decides the reflection's mirror: about the end voxels'
        centres when True, about their outer edges when False).
    layout : {"NCDHW", "NDHWC"}
        Memory order of ``volume`` and of the result.

    Returns
    -------
    ndarray, the shape, dtype and layout of ``volume``. Computed in float64 and rounded once.

    Examples
    --------
    >>> import numpy as np, volsample
    >>> v = np.arange(24.0).reshape(1, 1, 2, 3, 4) ** 2
    >>> c = volsample.spline_coefficients(v, "border", align_corners=True)
    >>> last = np.ones((1, 1, 1, 1, 3))  # the centre of the last voxel (align_corners)
    >>> volsample.grid_sample_3d(c, last, "bspline", "border", True).round(9).ravel()
    array([529.])
    """
    return _filter(volume, padding_mode, align_corners, layout, adjoint=False)


def spline_coefficients_adjoint(grad_coefficients: np.ndarray, padding_mode: str = "border",
                                align_corners: bool = False, *,
                                layout: str = "NCDHW") -> np.ndarray:
    """The adjoint (transpose) of ``spline_coefficients``: the gradient of a loss with
    respect to the volume, given its gradient with respect to the coefficients.

    For any arrays ``v`` and ``g`` of one shape,
    ``sum(spline_coefficients(v) * g) == sum(v * spline_coefficients_adjoint(g))`` to
    round-off (same ``padding_mode``, ``align_corners`` and ``layout``; arguments as
    ``spline_coefficients``'s).
    """
    return _filter(grad_coefficients, padding_mode, align_corners, layout, adjoint=True)
