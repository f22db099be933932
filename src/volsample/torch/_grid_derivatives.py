"""Derivatives of trilinear grid sampling along a grid direction, in torch tensor ops.

The forward ``out = sum_k W_k(grid) * input[corner_k]`` is linear in the input; its
derivatives in the grid come from the trilinear weights ``W_k = wx * wy * wz`` (per axis
``w = 1 - f`` or ``f``), each axis' voxel coordinate having the piecewise-constant slope
``s`` of unnormalising and padding (``volsample._coords``). Along a grid direction ``t``:

- ``dW_k = sum_a t_a * s_a * (+-1)_a * (product of the other two weights)``;
- the backward's grid gradient ``sum_{c,k} go * V_k * dW_k/dg_a`` has the derivative
  ``sum_{c,k} go * V_k * sum_{b != a} t_b s_b s_a (+-1)_a (+-1)_b * w_(third axis)``
  (the weights are linear in each coordinate, so the pure second derivatives are 0).

Nearest sampling is piecewise constant in the grid: every term here is 0 for it, and the
callers skip it. These terms run on any device (plain torch ops, no kernel of their own):
gathers, and for the input term one ``index_add_``, which is sequential, hence
deterministic, on the CPU. They compute in float32, or float64 when an operand is float64.
"""
from __future__ import annotations

import torch

from .. import _coords

_SIGNS = (-1.0, 1.0)  # d(weight)/d(coordinate) of the low and the high corner


def _compute_dtype(*tensors):
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


class _Corners:
    """The 8 corners of every grid point: flat voxel indices (N, P, 8), a mask of those
    inside the volume, and per axis the weights, slopes and index offsets (N, P, 8)."""

    def __init__(self, grid, in_spatial, padding_mode, align_corners):
        N = grid.shape[0]
        grid = grid.reshape(N, -1, 3)
        finite = torch.isfinite(grid).all(-1, keepdim=True)  # (N, P, 1)
        grid = torch.where(finite, grid, 0)
        D, H, W = in_spatial
        offsets = torch.tensor([[(k >> 2) & 1, (k >> 1) & 1, k & 1] for k in range(8)],
                               device=grid.device)  # (8, 3): z, y, x, tnw ... bse order
        self.weight, self.slope, self.sign = [], [], []
        index, inside = 0, finite
        for axis, size in zip((2, 1, 0), (D, H, W)):  # z (D), y (H), x (W)
            x, slope = _coords.source_index(torch, grid[..., axis], size, padding_mode,
                                            align_corners)
            low = torch.floor(x)
            frac = (x - low)[..., None]
            high = offsets[:, 2 - axis]  # 0 for the low corner, 1 for the high one
            i = low.long()[..., None] + high
            inside = inside & (i >= 0) & (i < size)
            index = index * size + i.clamp(0, size - 1)
            self.weight.append(torch.where(high == 1, frac, 1 - frac))
            self.slope.append(slope[..., None].expand_as(frac))
            self.sign.append(torch.where(high == 1, _SIGNS[1], _SIGNS[0]).to(grid.dtype))
        # Reordered to grid-channel order: axis 0 is x, 1 is y, 2 is z.
        self.weight, self.slope, self.sign = (v[::-1] for v in (self.weight, self.slope, self.sign))
        self.index = index
        self.inside = inside.to(grid.dtype)

    def weight_derivative(self, direction):
        """d(W_k) along ``direction`` (N, P, 3): (N, P, 8), 0 outside the volume."""
        w, s, d = self.weight, self.slope, self.sign
        t = [direction[..., a, None] * s[a] * d[a] for a in range(3)]
        return (t[0] * w[1] * w[2] + t[1] * w[0] * w[2] + t[2] * w[0] * w[1]) * self.inside

    def gradient_derivative(self, direction):
        """Along ``direction``, the derivative of each corner's d(W_k)/d(grid_a):
        (N, P, 8, 3), 0 outside the volume."""
        w, s, d = self.weight, self.slope, self.sign
        t = [direction[..., a, None] * s[a] * d[a] for a in range(3)]
        per_axis = [s[0] * d[0] * (t[1] * w[2] + t[2] * w[1]),
                    s[1] * d[1] * (t[0] * w[2] + t[2] * w[0]),
                    s[2] * d[2] * (t[0] * w[1] + t[1] * w[0])]
        return torch.stack(per_axis, -1) * self.inside[..., None]


def _corner_values(volume, corners):
    """``volume`` (N, C, D, H, W) at every corner: (N, C, P, 8)."""
    N, C = volume.shape[:2]
    flat = volume.reshape(N, C, -1)
    index = corners.index.reshape(N, 1, -1).expand(N, C, -1)
    return flat.gather(2, index).reshape(N, C, -1, 8)


def forward_grid_jvp(input, grid, direction, padding_mode, align_corners):
    """Derivative of trilinear ``grid_sampler_3d(input, grid)`` along the grid direction
    ``direction``: (N, C, Do, Ho, Wo) in the input's dtype and memory format."""
    compute = _compute_dtype(input, grid)
    N, C = input.shape[:2]
    corners = _Corners(grid.to(compute), input.shape[2:], padding_mode, align_corners)
    dw = corners.weight_derivative(direction.to(compute).reshape(N, -1, 3))
    values = _corner_values(input.to(compute), corners)
    out = (values * dw[:, None]).sum(-1).reshape((N, C) + tuple(grid.shape[1:4]))
    return out.to(input.dtype)


def backward_grid_jvp(grad_output, input, grid, direction, padding_mode, align_corners,
                      want_input, want_grid):
    """Derivatives of trilinear ``grid_sampler_3d_backward``'s (grad_input, grad_grid)
    along the grid direction ``direction``; None for one not wanted."""
    compute = _compute_dtype(input, grid)
    N, C = input.shape[:2]
    corners = _Corners(grid.to(compute), input.shape[2:], padding_mode, align_corners)
    t = direction.to(compute).reshape(N, -1, 3)
    go = grad_output.to(compute).reshape(N, C, -1, 1)
    grad_input = grad_grid = None
    if want_input:
        contributions = (go * corners.weight_derivative(t)[:, None]).reshape(N, C, -1)
        volume = input[0, 0].numel()
        flat = (torch.arange(N * C, device=input.device).reshape(N, C, 1) * volume
                + corners.index.reshape(N, 1, -1))
        grad_input = torch.zeros(N * C * volume, dtype=compute, device=input.device)
        grad_input.index_add_(0, flat.reshape(-1), contributions.reshape(-1))
        grad_input = grad_input.reshape(input.shape).to(input.dtype)
    if want_grid:
        weighted = (go * _corner_values(input.to(compute), corners)).sum(1)  # (N, P, 8)
        grad_grid = (weighted[..., None] * corners.gradient_derivative(t)).sum(2)
        grad_grid = grad_grid.reshape(grid.shape).to(grid.dtype)
    return grad_input, grad_grid
