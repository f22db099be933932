"""Derivatives of grid sampling along a grid direction, in torch tensor ops (trilinear,
bicubic and B-spline sampling; nearest's are 0 and the callers skip it).

The forward ``out = sum_k W_k(grid) * input[tap_k]`` is linear in the input; its
derivatives in the grid come from the weights ``W_k = wx * wy * wz``, each axis' weight a
function of that axis' voxel coordinate ``x``, whose slope ``s = dx/d(grid)`` is piecewise
constant (``volsample._coords``). Per axis (``_axis_taps``, the one home of the weights and
their derivatives ``w'``, ``w''`` here):

- trilinear: ``x`` unnormalised and padded, 2 taps ``floor(x) + 0, 1``, weights ``1 - f``
  and ``f`` (``f = x - floor(x)``), ``w'`` = -1, +1, ``w''`` = 0;
- bicubic (cubic convolution, A = -0.75) and B-spline: ``x`` unnormalised only, 4 taps
  ``floor(x) - 1 .. floor(x) + 2``, each padded on its own (a whole-number tap's padding
  has no derivative), weights the kernel's cubic pieces at ``f``, and their first and
  second derivatives in closed form.

Along a grid direction ``t``, with ``u_a = t_a * s_a``:

- ``dW_k = sum_a u_a * w'_a * (product of the other two weights)``;
- the derivative of ``dW_k/dg_a`` (the backward's grid gradient is ``sum go * V_k *
  dW_k/dg_a``) is ``s_a * (u_a * w''_a * w_b * w_c + w'_a * (u_b * w'_b * w_c + u_c * w_b *
  w'_c))`` for the other two axes b, c.

These terms run on any device (plain torch ops, no kernel of their own): gathers of the
T^3 taps (8 or 64) of every point, in chunks of points that bound the temporaries, and for
the input term one ``index_add_`` per chunk, which is sequential, hence deterministic, on
the CPU. They compute in float32, or float64 when an operand is float64.
"""
from __future__ import annotations

import math

import torch

from .. import _coords
from .._tables import MODES, REFLECTION, ZEROS

_CHUNK_ELEMENTS = 1 << 21  # (batch x channels x points x taps) per chunk: ~0.4 GB peak in float64

def _compute_dtype(*tensors):
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _padded_taps(taps, size: int, padding: int, align_corners: bool):
    """The voxel each whole-number tap (a float tensor) reads, and whether it reads one
    (zeros padding: inside the volume; border: clamped; reflection: folded as PyTorch's
    ``reflect_coordinates`` folds a coordinate, then clamped)."""
    inside = (taps >= 0) & (taps <= size - 1)
    if padding == ZEROS:
        return taps.clamp(0, size - 1).long(), inside
    if padding == REFLECTION:
        bounds = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        taps = _coords.reflect(torch, taps, *bounds)[0]
    return taps.clamp(0, size - 1).long(), torch.ones_like(inside)


def _axis_taps(coord, size: int, mode: int, padding: int, align_corners: bool):
    """One axis of every point: the taps' voxel indices and whether each reads one
    (..., T), the weights and their first and second derivatives in the voxel coordinate
    (..., T; the second None where it is 0), the slope d(voxel)/d(coord) (...) and whether
    the voxel coordinate is finite."""
    T = MODES.of(mode).taps
    if T == 2:
        x, slope = _coords.source_index(torch, coord, size, padding, align_corners)
    else:
        x, slope = _coords.unnormalize(torch, coord, size, align_corners)
    finite = torch.isfinite(x)  # a huge coordinate may overflow in unnormalising
    x = torch.where(finite, x, 0)
    low = torch.floor(x)
    f = x - low
    taps = low[..., None] + torch.arange(1 - T // 2, T // 2 + 1, dtype=x.dtype, device=x.device)
    if T == 2:  # trilinear pads the coordinate, not its taps
        index, inside = taps.clamp(0, size - 1).long(), (taps >= 0) & (taps <= size - 1)
    else:
        index, inside = _padded_taps(taps, size, padding, align_corners)
    weights = MODES.of(mode).weights
    if weights is None:  # nearest: piecewise constant, its callers skip it
        raise ValueError(f"mode {MODES.of(mode).name!r} has no grid derivatives")
    weight, first, second = weights(f)
    weight, first = torch.stack(weight, -1), torch.stack(first, -1)
    second = None if T == 2 else torch.stack(second, -1)  # linear: no curvature
    return index, inside, weight, first, second, slope, finite


class _Taps:
    """The T^3 taps of every grid point (N, P): flat voxel indices (N, P, T^3), a 0/1 mask
    of those that read a voxel, and per axis (x, y, z) the weights and their derivatives,
    shaped to broadcast to (N, P, T, T, T) (z, y, x: x fastest, PyTorch's corner order)."""

    def __init__(self, grid, in_spatial, mode, padding, align_corners):
        N, P = grid.shape[:2]  # grid (N, P, 3)
        finite = torch.isfinite(grid).all(-1)  # (N, P)
        grid = torch.where(finite[..., None], grid, 0)
        D, H, W = in_spatial
        T = MODES.of(mode).taps
        self.weight, self.first, self.second, self.slope = [], [], [], []
        index, inside = 0, None
        for axis, size in ((2, D), (1, H), (0, W)):  # z, y, x: x taps fastest
            i, valid, w, d1, d2, slope, axis_finite = _axis_taps(
                grid[..., axis], size, mode, padding, align_corners)
            shape = (N, P) + tuple(T if a == axis else 1 for a in (2, 1, 0))
            index = index * size + i.reshape(shape)
            inside = valid.reshape(shape) if inside is None else inside & valid.reshape(shape)
            finite = finite & axis_finite
            self.weight.append(w.reshape(shape))
            self.first.append(d1.reshape(shape))
            self.second.append(None if d2 is None else d2.reshape(shape))
            self.slope.append(slope.reshape(N, P, 1, 1, 1))
        # Reordered to grid-channel order: axis 0 is x, 1 is y, 2 is z.
        self.weight, self.first, self.second, self.slope = (
            v[::-1] for v in (self.weight, self.first, self.second, self.slope))
        self.shape = (N, P, T, T, T)
        self.index = index.expand(self.shape).reshape(N, P, T**3)
        self.inside = (inside & finite.reshape(N, P, 1, 1, 1)).reshape(N, P, T**3).to(grid.dtype)

    def _flat(self, t):
        return t.expand(self.shape).reshape(self.index.shape)

    def _along(self, direction):
        """u_a = t_a * s_a of a direction (N, P, 3), shaped as the slopes."""
        return [direction[..., a, None, None, None] * self.slope[a] for a in range(3)]

    def weight_derivative(self, direction):
        """d(W_k) along ``direction`` (N, P, 3): (N, P, T^3), 0 where no voxel is read."""
        w, d = self.weight, self.first
        u = self._along(direction)
        dw = u[0] * d[0] * w[1] * w[2] + u[1] * w[0] * d[1] * w[2] + u[2] * w[0] * w[1] * d[2]
        return self._flat(dw) * self.inside

    def gradient_derivative(self, direction):
        """Along ``direction``, the derivative of each tap's d(W_k)/d(grid_a):
        (N, P, T^3, 3), 0 where no voxel is read."""
        w, d, dd, s = self.weight, self.first, self.second, self.slope
        u = self._along(direction)
        per_axis = []
        for a, b, c in ((0, 1, 2), (1, 0, 2), (2, 0, 1)):
            term = d[a] * (u[b] * d[b] * w[c] + u[c] * w[b] * d[c])
            if dd[a] is not None:
                term = term + u[a] * dd[a] * w[b] * w[c]
            per_axis.append(self._flat(s[a] * term))
        return torch.stack(per_axis, -1) * self.inside[..., None]


def _tap_values(volume, taps):
    """``volume`` (N, C, D, H, W) at every tap: (N, C, P, T^3)."""
    N, C = volume.shape[:2]
    flat = volume.reshape(N, C, -1)
    P, K = taps.index.shape[1:]
    index = taps.index.reshape(N, 1, -1).expand(N, C, -1)
    return flat.gather(2, index).reshape(N, C, P, K)


def _chunks(points: int, per_point: int):
    """Slices of the points, each with at most ``_CHUNK_ELEMENTS`` tap elements."""
    step = max(1, _CHUNK_ELEMENTS // max(1, per_point))
    return [slice(p, min(p + step, points)) for p in range(0, max(points, 1), step)]


def _per_point(input, mode):
    return input.shape[0] * input.shape[1] * MODES.of(mode).taps ** 3


def forward_grid_jvp(input, grid, direction, mode, padding, align_corners):
    """Derivative of ``grid_sampler_3d(input, grid)`` along the grid direction
    ``direction`` (``mode``, ``padding`` kernel integers): (N, C, Do, Ho, Wo), the input's
    dtype (logical shape; the caller sets the memory format)."""
    compute = _compute_dtype(input, grid)
    N, C = input.shape[:2]
    points, t = (g.reshape(N, math.prod(grid.shape[1:4]), 3).to(compute)
                 for g in (grid, direction))
    volume = input.to(compute)
    out = []
    for part in _chunks(points.shape[1], _per_point(input, mode)):
        taps = _Taps(points[:, part], input.shape[2:], mode, padding, align_corners)
        dw = taps.weight_derivative(t[:, part])
        out.append((_tap_values(volume, taps) * dw[:, None]).sum(-1))
    return torch.cat(out, 2).reshape((N, C) + tuple(grid.shape[1:4])).to(input.dtype)


def backward_grid_jvp(grad_output, input, grid, direction, mode, padding, align_corners,
                      want_input, want_grid):
    """Derivatives of ``grid_sampler_3d_backward``'s (grad_input, grad_grid) along the grid
    direction ``direction``; None for one not wanted."""
    compute = _compute_dtype(input, grid)
    N, C = input.shape[:2]
    points, t = (g.reshape(N, math.prod(grid.shape[1:4]), 3).to(compute)
                 for g in (grid, direction))
    go = grad_output.to(compute).reshape(N, C, points.shape[1], 1)
    volume = input.to(compute) if want_grid else None
    voxels = input[0, 0].numel()
    grad_input = (torch.zeros(N * C * voxels, dtype=compute, device=input.device)
                  if want_input else None)
    grad_grid = []
    for part in _chunks(points.shape[1], _per_point(input, mode)):
        taps = _Taps(points[:, part], input.shape[2:], mode, padding, align_corners)
        g = go[:, :, part]
        if grad_input is not None:
            contributions = g * taps.weight_derivative(t[:, part])[:, None]  # (N, C, P, K)
            flat = (torch.arange(N * C, device=input.device).reshape(N, C, 1) * voxels
                    + taps.index.reshape(N, 1, -1))
            grad_input.index_add_(0, flat.reshape(-1), contributions.reshape(-1))
        if volume is not None:
            weighted = (g * _tap_values(volume, taps)).sum(1)  # (N, P, K)
            grad_grid.append((weighted[..., None] * taps.gradient_derivative(t[:, part])).sum(2))
    return (None if grad_input is None else grad_input.reshape(input.shape).to(input.dtype),
            torch.cat(grad_grid, 1).reshape(grid.shape).to(grid.dtype) if want_grid else None)
