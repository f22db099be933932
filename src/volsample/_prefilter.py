"""The cubic B-spline prefilter's computation (``spline_coefficients`` and its adjoint),
below the front doors that offer it: the NumPy API's ``volsample.spline`` and the torch
door's ``volsample.torch.spline_coefficients``.

``grid_sample_3d(..., mode="bspline")`` takes its input as the coefficients of a cubic
B-spline: a sample at voxel centre i along an axis is (c[i-1] + 4 c[i] + c[i+1]) / 6, each
neighbour padded on its own (zeros: 0 outside; border: the end voxel; reflection: mirrored
about the end voxels' centres with ``align_corners``, about their outer edges without). The
prefilter solves that tridiagonal system along each axis in turn (``filtered``, on the
host in float64), so that the spline's samples at the voxel centres give the volume back;
its adjoint applies the transposed solves in reverse axis order. ``inverse`` gives each
axis' map as a dense matrix, for devices that apply it as a product.
"""
from __future__ import annotations

import functools

import numpy as np

from ._tables import BORDER, ZEROS

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


def system(size: int, padding: int, align_corners: bool):
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


def filtered(volume: np.ndarray, padding: int, align_corners: bool,
             adjoint: bool) -> np.ndarray:
    """The prefilter (or, ``adjoint``, its adjoint) of ``volume``, a logical (N, C, D, H,
    W) array of any float dtype and strides, in float64 (the caller rounds it once into
    its result)."""
    x = np.asarray(volume, np.float64)
    for axis in ((2, 3, 4) if not adjoint else (4, 3, 2)):
        moved = np.moveaxis(x, axis, 0)
        x = np.moveaxis(_solve(moved, *solve_bands(x.shape[axis], padding, align_corners,
                                                   adjoint)), 0, axis)
    return x


def solve_bands(size: int, padding: int, align_corners: bool, adjoint: bool):
    """The (below, on, above) diagonals the solve along an axis of ``size`` voxels takes:
    ``system``'s over 6, transposed for the adjoint (row i holds column i's entries).
    volsample.jax's handler solves with them in the same order, for the same bits."""
    below, on, above = system(size, padding, align_corners)
    if adjoint:
        below, above = np.roll(above, 1), np.roll(below, -1)
    return below / 6, on / 6, above / 6


@functools.lru_cache(maxsize=32)
def inverse(size: int, padding: int, align_corners: bool) -> np.ndarray:
    """The prefilter along an axis of ``size`` voxels as a dense float64 matrix (read-only):
    the inverse of ``system``'s map (its transpose is the adjoint's)."""
    below, on, above = system(size, padding, align_corners)
    samples = np.diag(on) + np.diag(below[1:], -1) + np.diag(above[:-1], 1)
    matrix = np.linalg.inv(samples / 6)
    matrix.flags.writeable = False
    return matrix
