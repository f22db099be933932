"""Triton launchers of warps (a checked ``_calls.Warp``): grid sampling at
``affine_grid(theta, size) + displacement`` with the grid never stored.

They run the grid-sampling kernels of ``grid_sample`` with a warp's coordinate source
(``grid_sample.Coordinates``): each point's coordinates come from theta, the point's
index and its displacement, and the backward's grid gradient goes straight to the
displacement's gradient and to per-block sums for theta's, reduced here in float64 in a
fixed order (bitwise reproducible in both ``deterministic`` modes; the input gradient
follows ``deterministic`` as grid sampling's does).

Operands are torch tensors: volumes logical (N, C, D, H, W) with any strides, theta
(N, 3, 4) or None (the identity), displacement (N, Do, Ho, Wo, 3) or None (0). Results
are the caller's, written whole.
"""
from __future__ import annotations

import torch

from .. import _coords
from .._tables import VOXELS
from . import compute_dtype, on_device_of
from .grid_sample import Coordinates, sample, sample_backward
from .grid_sample import workspace_nbytes as _grid_workspace_nbytes


def coordinates(call, input, theta, displacement) -> Coordinates:
    """The warp's coordinate source: theta in the compute dtype (the identity if None), the
    displacement as the field, and the table of base coordinates and scales."""
    given = theta if theta is not None else displacement
    dtype = given.dtype if given is not None else compute_dtype(input.dtype)
    compute = compute_dtype(input.dtype, dtype)
    device = input.device
    if theta is None:
        theta = torch.eye(3, 4, dtype=compute, device=device).expand(call.input_shape[0], 3, 4)
    Do, Ho, Wo = call.output_spatial
    parts = [_coords.base(torch.arange(n, dtype=torch.float64, device=device), n,
                          call.align_corners) for n in (Wo, Ho, Do)]
    parts.append(torch.tensor(call.displacement_scale, dtype=torch.float64, device=device))
    return Coordinates(call.input_shape[0], call.output_spatial, dtype, field=displacement,
                       theta=theta.to(compute).contiguous(), table=torch.cat(parts).to(compute),
                       scaled=displacement is not None and call.units == VOXELS)


def forward(call, input, theta, displacement, out) -> None:
    """Sample ``input`` at the warp's points into ``out`` ((N, C, Do, Ho, Wo), its dtype)."""
    with on_device_of(input):
        sample(input, coordinates(call, input, theta, displacement), call.mode, call.padding,
               call.align_corners, out)


def backward(call, grad_output, input, theta, displacement, grad_input, grad_theta,
             grad_displacement, deterministic: bool = True) -> None:
    """Write the gradients ``call.output_mask`` asks for (None for one not asked for),
    whole; grad_theta and grad_displacement in the coordinates' dtype."""
    with on_device_of(input):
        sample_backward(grad_output, input, coordinates(call, input, theta, displacement),
                        call.mode, call.padding, call.align_corners, grad_input,
                        grad_displacement, grad_theta, deterministic)


def workspace_nbytes(call, deterministic: bool = True) -> int:
    """Bytes of device memory the backward allocates beyond its results: grid sampling's
    (``grid_sample.workspace_nbytes``, the per-block sums of grad_theta included) and the
    coordinate source's table and theta in the compute dtype."""
    itemsize = call.compute_dtype.itemsize
    table = (sum(call.output_spatial) + 3 + 12 * call.input_shape[0]) * itemsize
    return _grid_workspace_nbytes(call, deterministic) + table
