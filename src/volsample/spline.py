"""Cubic B-spline prefiltering: ``spline_coefficients`` and its adjoint.

``grid_sample_3d(..., mode="bspline")`` takes its input as the coefficients of a cubic
B-spline: a sample at voxel centre i along an axis is (c[i-1] + 4 c[i] + c[i+1]) / 6, each
neighbour padded on its own (zeros: 0 outside; border: the end voxel; reflection: mirrored
about the end voxels' centres with ``align_corners``, about their outer edges without). The
prefilter solves that tridiagonal system along each axis in turn, so that the spline's
samples at the voxel centres give the volume back. It is linear; its adjoint (the transposed
solves, in reverse axis order) is what carries a gradient of the coefficients back to the
volume. Computed in float64 and rounded once to the volume's dtype.
"""
from __future__ import annotations

import numpy as np

from . import _checks, _layout
from ._tables import PADDINGS, ZEROS, BORDER

# The B-spline's values at the taps -1, 0, +1 of a voxel centre, times 6.
_CENTRE_TAPS = ((-1, 1.0), (0, 4.0), (1, 1.0))


def _padded(tap: int, size: int, padding: int, align_corners: bool) -> int | None:
    """The voxel a whole-number tap reads under ``padding`` (None: zeros outside)."""
    if 0 <= tap < size:
        return tap
    if padding == ZEROS:
        return None
    if padding == BORDER or size == 1:
        return min(max(tap, 0), size - 1)
    if align_corners:  # mirrored about the end voxels' centres
        return -tap if tap < 0 else 2 * (size - 1) - tap
    return -1 - tap if tap < 0 else 2 * size - 1 - tap  # about their outer edges


def _system(size: int, padding: int, align_corners: bool):
    """The three diagonals (below, on, above; times 6) of the map from coefficients to the
    spline's samples at the voxel centres along an axis of ``size`` voxels. Every tap of a
    centre lands within one voxel of it, so the map is tridiagonal."""
    bands = np.zeros((3, size))
    for i in range(size):
        for offset, weight in _CENTRE_TAPS:
            j = _padded(i + offset, size, padding, align_corners)
            if j is not None:
                bands[j - i + 1, i] += weight
    return bands[0], bands[1], bands[2]


def _solve(values: np.ndarray, below, on, above) -> np.ndarray:
    """Solve the tridiagonal system (rows i: below[i] x[i-1] + on[i] x[i] + above[i]
    x[i+1]) along axis 0 of ``values`` (Thomas' algorithm: the matrix is diagonally
    dominant, so no pivoting)."""
    size = values.shape[0]
    ratio = np.empty(size)
    x = np.empty_like(values)
    pivot = on[0]
    ratio[0] = above[0] / pivot
    x[0] = values[0] / pivot
    for i in range(1, size):
        pivot = on[i] - below[i] * ratio[i - 1]
        ratio[i] = above[i] / pivot
        x[i] = (values[i] - below[i] * x[i - 1]) / pivot
    for i in range(size - 2, -1, -1):
        x[i] -= ratio[i] * x[i + 1]
    return x


def _filter(volume, padding_mode, align_corners, layout, adjoint: bool):
    volume = _checks.ndarray("volume", volume)
    padding = PADDINGS.code(padding_mode)
    align_corners = _checks.boolean("align_corners", align_corners)
    layout = _layout.check(layout)
    _checks.volume_dtype("volume", volume.dtype)
    _checks.rank("volume", volume.shape, 5)
    shape = _layout.logical_shape(volume.shape, layout)
    _checks.nonempty_spatial("volume", shape[2:])
    x = np.asarray(_layout.logical(volume, layout), np.float64)
    for axis in ((2, 3, 4) if not adjoint else (4, 3, 2)):
        below, on, above = _system(shape[axis], padding, align_corners)
        if adjoint:  # the transpose: row i holds column i's entries
            below, above = np.roll(above, 1), np.roll(below, -1)
        moved = np.moveaxis(x, axis, 0)
        x = np.moveaxis(_solve(moved, below / 6, on / 6, above / 6), 0, axis)
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
