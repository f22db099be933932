"""Float64 NumPy reference implementation: the SPEC written as vectorised formulas.

Slow and plain on purpose. Tests and benchmarks import it as an oracle independent of the
kernels; nothing in the library calls it. Arrays are logical NCDHW; results are float64.
"""
from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------------------------------
# Grid sampling (SPEC §2)
# ---------------------------------------------------------------------------------------


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1), np.full_like(coord, (size - 1) / 2)
    return ((coord + 1) * size - 1) / 2, np.full_like(coord, size / 2)


def _clip(x, size):
    inside = (x > 0) & (x < size - 1)
    return np.clip(x, 0, size - 1), inside.astype(np.float64)


def _reflect(x, twice_low, twice_high):
    if twice_low == twice_high:
        return np.zeros_like(x), np.zeros_like(x)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    x = x - low
    sign = np.where(x < 0, -1.0, 1.0)
    x = np.abs(x)
    extra = np.fmod(x, span)
    even = np.fmod(np.floor(x / span), 2) == 0
    return np.where(even, extra + low, span - extra + low), np.where(even, sign, -sign)


def source_index(coord, size, padding_mode, align_corners):
    """Padded voxel coordinate of a normalised coordinate, and its derivative."""
    x, grad = _unnormalize(coord, size, align_corners)
    if padding_mode in ("border", "reflection"):
        if padding_mode == "reflection":
            bounds = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
            x, g = _reflect(x, *bounds)
            grad = grad * g
        x, g = _clip(x, size)
        grad = grad * g
    return x, grad


def _sample_corners(grid, shape, mode, padding_mode, align_corners):
    """For each grid point: the list of (z, y, x, weight, dweight/d(ix, iy, iz), valid)
    corners, and d(ix, iy, iz)/d(grid)."""
    D, H, W = shape
    with np.errstate(invalid="ignore", over="ignore"):
        ix, mx = source_index(grid[..., 0], W, padding_mode, align_corners)
        iy, my = source_index(grid[..., 1], H, padding_mode, align_corners)
        iz, mz = source_index(grid[..., 2], D, padding_mode, align_corners)
    finite = np.isfinite(grid).all(axis=-1)
    ix, iy, iz = (np.where(finite, v, 0.0) for v in (ix, iy, iz))
    corners = []
    if mode == "nearest":
        x, y, z = np.rint(ix), np.rint(iy), np.rint(iz)
        zero = np.zeros_like(ix)
        corners.append((z, y, x, np.ones_like(ix), (zero, zero, zero)))
    else:
        x0, y0, z0 = np.floor(ix), np.floor(iy), np.floor(iz)
        wx = (x0 + 1 - ix, ix - x0)
        wy = (y0 + 1 - iy, iy - y0)
        wz = (z0 + 1 - iz, iz - z0)
        for dz in (0, 1):
            for dy in (0, 1):
                for dx in (0, 1):
                    sx, sy, sz = (2 * dx - 1), (2 * dy - 1), (2 * dz - 1)
                    weight = wx[dx] * wy[dy] * wz[dz]
                    dweight = (sx * wy[dy] * wz[dz], sy * wx[dx] * wz[dz], sz * wx[dx] * wy[dy])
                    corners.append((z0 + dz, y0 + dy, x0 + dx, weight, dweight))
    table = []
    for z, y, x, weight, dweight in corners:
        valid = finite & (x >= 0) & (x < W) & (y >= 0) & (y < H) & (z >= 0) & (z < D)
        zi, yi, xi = (np.where(valid, v, 0).astype(np.int64) for v in (z, y, x))
        table.append((zi, yi, xi, weight, dweight, valid))
    return table, (mx, my, mz), finite


def grid_sample_3d(input, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """Reference forward: float64 (N, C, Do, Ho, Wo)."""
    input = np.asarray(input, np.float64)
    grid = np.asarray(grid, np.float64)
    N, C = input.shape[:2]
    table, _, _ = _sample_corners(grid, input.shape[2:], mode, padding_mode, align_corners)
    out = np.zeros((N, C) + grid.shape[1:4])
    batch = np.arange(N)[:, None, None, None]
    for zi, yi, xi, weight, _, valid in table:
        values = input[batch, :, zi, yi, xi]  # (N, Do, Ho, Wo, C)
        out += np.moveaxis(np.where(valid[..., None], values * weight[..., None], 0.0), -1, 1)
    return out


def grid_sample_3d_backward(grad_output, input, grid, mode="bilinear", padding_mode="zeros",
                            align_corners=False):
    """Reference backward: float64 (grad_input, grad_grid)."""
    grad_output = np.asarray(grad_output, np.float64)
    input = np.asarray(input, np.float64)
    grid = np.asarray(grid, np.float64)
    N, C = input.shape[:2]
    table, multipliers, finite = _sample_corners(grid, input.shape[2:], mode, padding_mode,
                                                 align_corners)
    g = np.moveaxis(grad_output, 1, -1)  # (N, Do, Ho, Wo, C)
    batch = np.broadcast_to(np.arange(N)[:, None, None, None], grid.shape[:4])
    grad_input = np.zeros_like(input)
    grad_ixyz = np.zeros(grid.shape)
    for zi, yi, xi, weight, dweight, valid in table:
        contribution = np.where(valid[..., None], g * weight[..., None], 0.0)
        for c in range(C):
            np.add.at(grad_input[:, c], (batch, zi, yi, xi), contribution[..., c])
        if mode != "nearest":
            values = np.where(valid[..., None], input[batch, :, zi, yi, xi], 0.0)
            dot = (values * g).sum(-1)
            for axis in range(3):
                grad_ixyz[..., axis] += dweight[axis] * dot
    grad_grid = np.zeros(grid.shape)
    for axis in range(3):
        grad_grid[..., axis] = np.where(finite, grad_ixyz[..., axis] * multipliers[axis], 0.0)
    return grad_input, grad_grid
