"""Float64 NumPy reference implementation: docs/semantics.md written as vectorised formulas.

Slow and plain on purpose. Tests and benchmarks import it as an oracle independent of the
kernels; nothing in the library calls it. It shares the coordinate maths of ``_coords``
(the Python home of those formulas) and writes the rest out. Arrays are logical NCDHW;
results are float64.
"""
from __future__ import annotations

import numpy as np

from . import _coords
from ._tables import MODES, PADDINGS

# ---------------------------------------------------------------------------------------
# Grid sampling (docs/semantics.md, section 2)
# ---------------------------------------------------------------------------------------


def source_index(coord, size, padding_mode, align_corners):
    """Padded voxel coordinate of a normalised coordinate, and its derivative."""
    return _coords.source_index(np, coord, size, PADDINGS.code(padding_mode), align_corners)


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


def _padded_tap(tap, size, padding_mode, align_corners):
    """The voxel a whole-number tap reads, and whether it reads one (zeros: inside)."""
    if padding_mode == "zeros":
        inside = (tap >= 0) & (tap < size)
        return np.where(inside, tap, 0), inside
    if padding_mode == "border":
        return np.clip(tap, 0, size - 1), np.ones(tap.shape, bool)
    if size == 1:
        return np.zeros_like(tap), np.ones(tap.shape, bool)
    if align_corners:  # mirror about the end voxels' centres: period 2 (S - 1)
        folded = np.mod(tap, 2 * (size - 1))
        return np.where(folded < size, folded, 2 * (size - 1) - folded), np.ones(tap.shape, bool)
    folded = np.mod(tap, 2 * size)  # mirror about the outer edges: period 2 S
    return np.where(folded < size, folded, 2 * size - 1 - folded), np.ones(tap.shape, bool)


def _sample_taps(grid, shape, mode, padding_mode, align_corners):
    """``_sample_corners`` for bicubic and B-spline sampling: the 64 taps, each padded on
    its own; the derivative is the unnormalising slope alone."""
    D, H, W = shape
    finite = np.isfinite(grid).all(axis=-1)
    axes = []
    multipliers = []
    for axis, size in enumerate((W, H, D)):
        with np.errstate(invalid="ignore", over="ignore"):
            x, slope = _coords.unnormalize(np, grid[..., axis], size, align_corners)
        x = np.where(finite, x, 0.0)
        low = np.floor(x)
        weights, slopes, _ = MODES[mode].weights(x - low)
        taps = [_padded_tap(low + k - 1, size, padding_mode, align_corners) for k in range(4)]
        axes.append([(index, inside, weights[k], slopes[k])
                     for k, (index, inside) in enumerate(taps)])
        multipliers.append(slope)
    table = []
    for zi, zin, wz, dz in axes[2]:
        for yi, yin, wy, dy in axes[1]:
            for xi, xin, wx, dx in axes[0]:
                valid = finite & xin & yin & zin
                index = (np.where(valid, v, 0).astype(np.int64) for v in (zi, yi, xi))
                table.append((*index, wx * wy * wz, (dx * wy * wz, wx * dy * wz, wx * wy * dz),
                              valid))
    return table, tuple(multipliers), finite


def _sample_table(grid, shape, mode, padding_mode, align_corners):
    if mode in ("bicubic", "bspline"):
        return _sample_taps(grid, shape, mode, padding_mode, align_corners)
    return _sample_corners(grid, shape, mode, padding_mode, align_corners)


def grid_sample_3d(input, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """Reference forward: float64 (N, C, Do, Ho, Wo)."""
    input = np.asarray(input, np.float64)
    grid = np.asarray(grid, np.float64)
    N, C = input.shape[:2]
    table, _, _ = _sample_table(grid, input.shape[2:], mode, padding_mode, align_corners)
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
    table, multipliers, finite = _sample_table(grid, input.shape[2:], mode, padding_mode,
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

# ---------------------------------------------------------------------------------------
# Warps (docs/semantics.md, section 2): grid sampling on the composed grid, stored
# ---------------------------------------------------------------------------------------


def base_grid(size, align_corners):
    """The homogeneous identity grid of an output of spatial ``size`` (D, H, W): float64
    (D, H, W, 4), channels (x, y, z, 1), as PyTorch's affine_grid lays it out."""
    axes = [_coords.base(np.arange(n, dtype=np.float64), n, align_corners) for n in size]
    z, y, x = np.meshgrid(*axes, indexing="ij")
    return np.stack([x, y, z, np.ones_like(x)], -1)


def affine_grid(theta, size, align_corners=False):
    """PyTorch's ``F.affine_grid`` on 5-D: theta (N, 3, 4) maps each output point's
    homogeneous normalised coordinates to where it samples. float64 (N, D, H, W, 3)."""
    return np.einsum("dhwj,nkj->ndhwk", base_grid(size, align_corners),
                     np.asarray(theta, np.float64))


def displacement_scale(input_spatial, align_corners, units="normalized"):
    """Normalised units per displacement unit, channels (x, y, z)."""
    if units == "normalized":
        return np.ones(3)
    D, H, W = input_spatial
    return np.array([_coords.voxel_step(n, align_corners) for n in (W, H, D)])


def warp_grid(theta, displacement, size, input_spatial, align_corners=False,
              units="normalized"):
    """The grid a warp samples on: ``affine_grid(theta, size) + displacement`` (theta None:
    the identity; displacement None: 0), the displacement converted from ``units``."""
    if theta is None:
        N = np.shape(displacement)[0]
        theta = np.broadcast_to(np.eye(3, 4), (N, 3, 4))
    grid = affine_grid(theta, size, align_corners)
    if displacement is not None:
        grid = grid + np.asarray(displacement, np.float64) * displacement_scale(
            input_spatial, align_corners, units)
    return grid


def warp_3d(input, theta=None, displacement=None, size=None, mode="bilinear",
            padding_mode="zeros", align_corners=False, units="normalized"):
    """Reference warp: ``grid_sample_3d`` on ``warp_grid``; ``size`` (D, H, W) defaults to
    the displacement's, else the input's. float64 (N, C, Do, Ho, Wo)."""
    input = np.asarray(input, np.float64)
    if size is None:
        size = np.shape(displacement)[1:4] if displacement is not None else input.shape[2:]
    if theta is None and displacement is None:
        theta = np.broadcast_to(np.eye(3, 4), (input.shape[0], 3, 4))
    grid = warp_grid(theta, displacement, size, input.shape[2:], align_corners, units)
    return grid_sample_3d(input, grid, mode, padding_mode, align_corners)


def warp_3d_backward(grad_output, input, theta=None, displacement=None, mode="bilinear",
                     padding_mode="zeros", align_corners=False, units="normalized"):
    """Reference warp backward, the chain rule through the stored grid: float64
    (grad_input, grad_theta, grad_displacement), None for an absent operand."""
    grad_output = np.asarray(grad_output, np.float64)
    input = np.asarray(input, np.float64)
    size = grad_output.shape[2:]
    if theta is None and displacement is None:
        theta = np.broadcast_to(np.eye(3, 4), (input.shape[0], 3, 4))
    grid = warp_grid(theta, displacement, size, input.shape[2:], align_corners, units)
    grad_input, grad_grid = grid_sample_3d_backward(grad_output, input, grid, mode,
                                                    padding_mode, align_corners)
    grad_theta = grad_displacement = None
    if theta is not None:  # grid_k = sum_j theta[k, j] * base_j
        grad_theta = np.einsum("ndhwk,dhwj->nkj", grad_grid, base_grid(size, align_corners))
    if displacement is not None:
        grad_displacement = grad_grid * displacement_scale(input.shape[2:], align_corners, units)
    return grad_input, grad_theta, grad_displacement

# ---------------------------------------------------------------------------------------
# Upsampling (docs/semantics.md, section 3)
# ---------------------------------------------------------------------------------------


def upsample_taps(in_size, out_size, align_corners, scale=None):
    """The taps of one axis: a list of (source index, weight) arrays over the output
    indices; two taps (i0, l0) and (i1, l1), or the identity's one where in == out."""
    if in_size == out_size:
        return [(np.arange(out_size), np.ones(out_size))]
    o = np.arange(out_size, dtype=np.float64)
    if align_corners:
        ratio = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        src = ratio * o
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
        src = np.maximum(0.0, ratio * (o + 0.5) - 0.5)
    i0 = np.minimum(np.floor(src), in_size - 1).astype(np.int64)
    l1 = np.clip(src - i0, 0.0, 1.0)
    i1 = i0 + (i0 < in_size - 1)
    return [(i0, 1.0 - l1), (i1, l1)]


def _upsample_corners(in_spatial, out_spatial, align_corners, scales):
    """The corners as (index tuple for axes D, H, W broadcast over the output, weight)."""
    scales = scales if scales is not None else (None, None, None)
    shapes = [(-1, 1, 1), (1, -1, 1), (1, 1, -1)]
    axes = [[(index.reshape(shape), weight.reshape(shape))
             for index, weight in upsample_taps(i, o, align_corners, s)]
            for i, o, s, shape in zip(in_spatial, out_spatial, scales, shapes)]
    corners = []
    for (iz, wz) in axes[0]:
        for (iy, wy) in axes[1]:
            for (ix, wx) in axes[2]:
                corners.append(((iz, iy, ix), wz * wy * wx))
    return corners


def upsample_trilinear_3d(input, output_size, align_corners=False, scales=None):
    """Reference forward: float64 (N, C, Do, Ho, Wo) from the spatial ``output_size`` and
    the per-axis ``scales`` (None, or 3 floats-or-None)."""
    input = np.asarray(input, np.float64)
    N, C = input.shape[:2]
    out = np.zeros((N, C) + tuple(output_size))
    corners = _upsample_corners(input.shape[2:], output_size, align_corners, scales)
    for (iz, iy, ix), weight in corners:
        out += input[:, :, iz, iy, ix] * weight
    return out


def upsample_trilinear_3d_backward(grad_output, input_size, align_corners=False, scales=None):
    """Reference backward, the explicit adjoint: every output scatters its gradient times
    each corner's weight into that corner. float64 (N, C, Di, Hi, Wi)."""
    grad_output = np.asarray(grad_output, np.float64)
    grad_input = np.zeros(tuple(input_size))
    for (iz, iy, ix), weight in _upsample_corners(input_size[2:], grad_output.shape[2:],
                                                  align_corners, scales):
        iz, iy, ix = np.broadcast_arrays(iz, iy, ix)
        np.add.at(grad_input, (slice(None), slice(None), iz, iy, ix), grad_output * weight)
    return grad_input
