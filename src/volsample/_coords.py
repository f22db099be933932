"""Coordinate maths of the Numba grid-sampling kernels: the formulas of SPEC §2.
(Upsampling's, SPEC §3, are the C++ core's: ``src/cpp/coords.h``.)

Grid sampling maps a normalised coordinate c in [-1, 1] to a voxel coordinate along an
axis of size S. align_corners decides what -1 and +1 mean::

    align_corners=True                    align_corners=False
    -1 = centre of voxel 0                -1 = outer edge of voxel 0
    +1 = centre of voxel S-1              +1 = outer edge of voxel S-1

      -1               +1                 -1                    +1
       |                |                  |                     |
      [ 0 ][ 1 ]...[S-1]                 [ 0 ][ 1 ] ... [ S-1 ]

Each helper returns the coordinate together with its derivative with respect to its
input, so forward kernels and gradient kernels use the same code (the compiler drops the
derivative where it is unused).
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

# Kernel integers for the modes (equal to the aclnn interpolationMode / paddingMode codes).
BILINEAR, NEAREST = 0, 1
ZEROS, BORDER, REFLECTION = 0, 1, 2


def typed(value, like):
    """``value`` converted to the floating type of ``like``.

    Numba promotes float32 with any integer (literals too) to float64; kernels must compute
    float32 data in float32, so every constant goes through this cast.
    """
    return type(like)(value)


@overload(typed)
def _typed_numba(value, like):
    target = like

    def impl(value, like):
        return target(value)

    return impl


@njit(cache=True, inline="always")
def unnormalize(coord, size, align_corners):
    """Voxel coordinate of a normalised coordinate, and d(voxel)/d(coord)."""
    two = typed(2, coord)
    if align_corners:
        extent = typed(size - 1, coord)
        return (coord + typed(1, coord)) / two * extent, extent / two
    fsize = typed(size, coord)
    return ((coord + typed(1, coord)) * fsize - typed(1, coord)) / two, fsize / two


@njit(cache=True, inline="always")
def clip(x, size):
    """Clamp to [0, size-1]; the derivative is 0 on and beyond the ends."""
    if x <= typed(0, x):
        return typed(0, x), typed(0, x)
    upper = typed(size - 1, x)
    if x >= upper:
        return upper, typed(0, x)
    return x, typed(1, x)


@njit(cache=True, inline="always")
def reflect(x, twice_low, twice_high):
    """Fold x into [low, high] by reflection, and the derivative's sign (+1, -1 or 0).

    Bounds come doubled so that they stay integers for both align_corners choices. The
    parity of the fold count is taken in floating point so that huge coordinates never
    overflow an integer.
    """
    if twice_low == twice_high:
        return typed(0, x), typed(0, x)
    two = typed(2, x)
    low = typed(twice_low, x) / two
    span = typed(twice_high - twice_low, x) / two
    x = x - low
    sign = typed(1, x)
    if x < typed(0, x):
        x = -x
        sign = -sign
    extra = np.fmod(x, span)
    flips = np.floor(x / span)
    if np.fmod(flips, two) == typed(0, x):
        return extra + low, sign
    return span - extra + low, -sign


@njit(cache=True, inline="always")
def source_index(coord, size, padding_mode, align_corners):
    """Voxel coordinate after unnormalising and padding, and its derivative.

    Callers drop non-finite coordinates before calling (SPEC §2).
    """
    x, grad = unnormalize(coord, size, align_corners)
    if padding_mode == BORDER:
        x, g = clip(x, size)
        grad = grad * g
    elif padding_mode == REFLECTION:
        if align_corners:
            x, g = reflect(x, 0, 2 * (size - 1))
        else:
            x, g = reflect(x, -1, 2 * size - 1)
        x, g2 = clip(x, size)
        grad = grad * g * g2
    return x, grad
