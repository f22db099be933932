"""Grid sampling's coordinate maths in Python, written once for any array namespace ``xp``
(``numpy`` for the float64 reference, ``torch`` and ``jax.numpy`` for the
second-derivative terms of ``volsample.torch`` and ``volsample.jax``); the kernels' twins are ``src/cpp/coords.h`` and
``_triton/grid_coords.py``.

An axis of size S maps a normalised coordinate c in [-1, 1] to a voxel coordinate;
``align_corners`` decides whether -1 and +1 are the centres (True) or the outer edges
(False) of the corner voxels. Every helper returns the coordinate and its derivative with
respect to its input ("slope").
"""
from __future__ import annotations

import numpy as np

from ._tables import BORDER, REFLECTION


def unnormalize(xp, coord, size: int, align_corners: bool):
    """Voxel coordinate of a normalised coordinate, and d(voxel)/d(coord)."""
    if align_corners:
        return (coord + 1) / 2 * (size - 1), xp.full_like(coord, (size - 1) / 2)
    return ((coord + 1) * size - 1) / 2, xp.full_like(coord, size / 2)


def clip(xp, x, size: int):
    """Clamp to [0, size-1]; the derivative is 0 on and beyond the ends."""
    inside = (x > 0) & (x < size - 1)
    return xp.clip(x, 0, size - 1), xp.where(inside, 1.0, 0.0)


def reflect(xp, x, twice_low: int, twice_high: int):
    """Fold x into [low, high] by reflection (PyTorch's ``reflect_coordinates``: an exact
    fmod over the span, a flip on odd fold counts), and the derivative's sign (+1, -1; 0 for
    an empty span). Bounds come doubled, so that they are integers for both align_corners."""
    if twice_low == twice_high:
        return xp.zeros_like(x), xp.zeros_like(x)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    x = x - low
    sign = xp.where(x < 0, -1.0, 1.0)
    x = xp.abs(x)
    extra = xp.fmod(x, span)
    even = xp.fmod(xp.floor(x / span), 2) == 0
    return xp.where(even, extra + low, span - extra + low), xp.where(even, sign, -sign)


def source_index(xp, coord, size: int, padding: int, align_corners: bool):
    """Voxel coordinate after unnormalising and padding (a kernel integer), and its
    derivative: the chain of the slopes above."""
    x, slope = unnormalize(xp, coord, size, align_corners)
    if padding in (BORDER, REFLECTION):
        if padding == REFLECTION:
            bounds = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
            x, g = reflect(xp, x, *bounds)
            slope = slope * g
        x, g = clip(xp, x, size)
        slope = slope * g
    return x, slope


# ---------------------------------------------------------------------------------------
# Warps: the grid affine_grid(theta, size) + displacement, point by point
# ---------------------------------------------------------------------------------------


def base(index, size: int, align_corners: bool):
    """Normalised coordinate of output index ``index`` along an axis of ``size`` points, as
    PyTorch's ``affine_grid`` lays them out (the identity grid): voxel centres, from -1 to
    +1 (align_corners) or from -1 + 1/size to 1 - 1/size; a single point sits at 0.
    ``index`` is an array of float64 indices (any namespace)."""
    if size == 1:
        return index * 0
    if align_corners:
        return 2 * index / (size - 1) - 1
    return (2 * index + 1) / size - 1


def voxel_step(size: int, align_corners: bool) -> float:
    """Normalised units per voxel along an axis of ``size`` voxels: 1 / d(unnormalize)/dc.
    A single voxel under align_corners maps every coordinate to itself, so a displacement
    along that axis moves nothing: 0."""
    if align_corners:
        return 2 / (size - 1) if size > 1 else 0.0
    return 2 / size


def box_map(box, shape, align_corners: bool):
    """The 4x4 map from a box's normalised coordinates (x, y, z, 1) to those of the volume
    it lies in, or None for the whole volume: ``theta @ box_map(...)[:3]`` warps the box
    alone, and theta's gradient is the box's times the map's transpose. ``box`` holds
    slices of ``shape`` (D, H, W) with explicit bounds; a float64 NumPy array."""
    if all(b.start == 0 and b.stop == n for b, n in zip(box, shape)):
        return None
    m = np.eye(4)
    for row, axis in ((0, 2), (1, 1), (2, 0)):  # x spans W, y H, z D
        n, low, size = shape[axis], box[axis].start, box[axis].stop - box[axis].start
        if size == n:
            continue
        # base(k, n) = scale * base(k - low, size) + offset, the box's points k
        if align_corners:
            m[row, row] = (size - 1) / (n - 1)
            m[row, 3] = (2 * low + size - 1) / (n - 1) - 1
        else:
            m[row, row] = size / n
            m[row, 3] = (2 * low + size) / n - 1
    return m
