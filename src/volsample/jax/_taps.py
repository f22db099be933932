"""Grid sampling and warps written in jax.numpy, from each mode's weights (``_weights``) and
the coordinate maths (``_coords``): what JAX differentiates for the second and higher
derivatives (the kernels give the values and first derivatives, with the NumPy API's
bits). The forward ``out = sum_k W_k(grid) * input[tap_k]`` gathers the T^3 taps of every
point (T: 1 nearest, 2 trilinear, 4 bicubic and B-spline), so it holds N x C x points x T^3
values; nearest's weights are constant, its grid derivatives 0. It computes in the
kernels' compute dtype (float32, or float64 beside a float64 operand).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _coords, _dtypes
from .._tables import MODES, REFLECTION, ZEROS


def compute_dtype(volume, coordinates) -> np.dtype:
    return _dtypes.compute_dtype(np.dtype(volume.dtype), np.dtype(coordinates.dtype))


def _padded_taps(taps, size: int, padding: int, align_corners: bool):
    """The voxel each whole-number tap reads, and whether it reads one (zeros padding:
    inside the volume; border: clamped; reflection: folded as PyTorch folds a coordinate,
    then clamped)."""
    if padding == ZEROS:
        return taps, (taps >= 0) & (taps <= size - 1)
    if padding == REFLECTION:
        bounds = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        taps = _coords.reflect(jnp, taps, *bounds)[0]
    return taps, jnp.ones(taps.shape, bool)


def _axis_taps(coord, size: int, mode: int, padding: int, align_corners: bool):
    """One axis of every point: its taps' voxel indices and weights (..., T), a weight 0
    where the tap reads no voxel or the coordinate is not finite."""
    T = MODES.of(mode).taps
    if T <= 2:  # nearest and trilinear pad the coordinate, not its taps
        x, _ = _coords.source_index(jnp, coord, size, padding, align_corners)
    else:
        x, _ = _coords.unnormalize(jnp, coord, size, align_corners)
    finite = jnp.isfinite(x)
    x = jnp.where(finite, x, 0)
    of_fraction = MODES.of(mode).weights
    if of_fraction is None:  # nearest: one voxel, rounded half to even, of weight 1
        taps, weights = jnp.round(x)[..., None], [jnp.ones_like(x)]
    else:
        low = jnp.floor(x)
        taps = low[..., None] + jnp.arange(1 - T // 2, T // 2 + 1, dtype=x.dtype)
        weights = of_fraction(x - low)[0]
    if T <= 2:
        inside = (taps >= 0) & (taps <= size - 1)
    else:
        taps, inside = _padded_taps(taps, size, padding, align_corners)
    weight = jnp.stack(weights, -1) * (inside & finite[..., None])
    return jnp.clip(taps, 0, size - 1).astype(jnp.int32), weight


def sample(input, grid, *, mode: int, padding: int, align_corners: bool,
           channels_last: bool):
    """``grid_sample`` of ``input`` (NCDHW, or NDHWC when ``channels_last``) at ``grid``
    (N, Do, Ho, Wo, 3), in the operands' compute dtype."""
    compute = compute_dtype(input, grid)
    volume = (jnp.moveaxis(input, -1, 1) if channels_last else input).astype(compute)
    N, C, D, H, W = volume.shape
    points = grid.astype(compute).reshape(N, -1, 3)
    T, P = MODES.of(mode).taps, points.shape[1]
    axes = []
    for axis, size in ((2, D), (1, H), (0, W)):  # z, y, x: x's taps fastest
        i, w = _axis_taps(points[..., axis], size, mode, padding, align_corners)
        shape = (N, P) + tuple(T if a == axis else 1 for a in (2, 1, 0))
        axes.append((i.reshape(shape), w.reshape(shape)))
    (iz, wz), (iy, wy), (ix, wx) = axes
    index, weight = (iz * H + iy) * W + ix, wz * wy * wx
    index = jnp.broadcast_to(index, (N, P, T, T, T)).reshape(N, P * T**3)
    values = jax.vmap(lambda v, i: v[:, i])(volume.reshape(N, C, D * H * W), index)
    out = jnp.sum(values.reshape(N, C, P, T**3) * weight.reshape(N, 1, P, T**3), -1)
    out = out.reshape((N, C) + tuple(grid.shape[1:4]))
    return jnp.moveaxis(out, 1, -1) if channels_last else out


def warp_grid(theta, displacement, base, scale):
    """The warp's grid ``theta . base + displacement * scale`` (N, Do, Ho, Wo, 3), from the
    homogeneous base grid (Do, Ho, Wo, 4); ``displacement`` None: none."""
    grid = jnp.einsum("dhwj,nkj->ndhwk", base.astype(theta.dtype), theta)
    if displacement is not None:
        grid = grid + displacement * jnp.asarray(scale, displacement.dtype)
    return grid
