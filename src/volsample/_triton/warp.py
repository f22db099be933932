"""Triton launchers of warps (a checked ``_calls.Warp``): grid sampling at
``affine_grid(theta, size) + displacement`` with the grid never stored.

They run the grid-sampling kernels of ``grid_sample`` with a warp's coordinate source
(``grid_coords.Coordinates``): each point's coordinates come from theta, the point's
index and its displacement, and the backward's grid gradient goes straight to the
displacement's gradient and to per-block sums for theta's, reduced here in float64 in a
fixed order (bitwise reproducible in both ``deterministic`` modes; the input gradient
follows ``deterministic`` as grid sampling's does).

Operands are torch tensors: volumes logical (N, C, D, H, W) with any strides, theta
(N, 3, 4) or None (the identity), displacement (N, Do, Ho, Wo, 3) or None (0). Results
are the caller's, written whole.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import _coords
from .._tables import VOXELS
from . import compute_dtype, on_device_of
from . import grid_sample as _grid
from .grid_coords import Coordinates
from .grid_sample import BackwardLaunch, ForwardLaunch
from .grid_sample import workspace_nbytes as _grid_workspace_nbytes


class PreparedWarp:
    """A warp call prepared (``prepare_forward``, ``prepare_backward``) for operands of the
    same shapes, strides, dtypes and device, as the C++ core's ``PreparedWarp``: its
    launches (``grid_sample.ForwardLaunch`` or ``BackwardLaunch``) and its coordinate
    source's table of base coordinates and scales on the device, worked out once;
    ``forward_on`` and ``backward_on`` run them on new operands."""

    __slots__ = ("call", "dtype", "table", "identity", "launch")
    launch: Any  # a ForwardLaunch, or a BackwardLaunch

    def __init__(self, call, input, theta, displacement, results: tuple,
                 deterministic: bool | None = None) -> None:
        """``results``: the forward's (out,), or the backward's (grad_output, grad_input,
        grad_displacement, grad_theta), whose ``deterministic`` is a bool."""
        self.call = call
        N = call.input_shape[0]
        Do, Ho, Wo = call.output_spatial
        device = input.device
        given = theta if theta is not None else displacement
        self.dtype = given.dtype if given is not None else compute_dtype(input.dtype)
        compute = compute_dtype(input.dtype, self.dtype)
        parts = [_coords.base(torch.arange(n, dtype=torch.float64, device=device), n,
                              call.align_corners) for n in (Wo, Ho, Do)]
        parts.append(torch.tensor(call.displacement_scale, dtype=torch.float64, device=device))
        self.table = torch.cat(parts).to(compute)
        self.identity = None if theta is not None else torch.eye(
            3, 4, dtype=compute, device=device).expand(N, 3, 4).contiguous()
        coords = self.coordinates(theta, displacement)
        settings = (call.mode, call.padding, call.align_corners)
        if deterministic is None:
            self.launch = ForwardLaunch(input, coords, *settings, *results)
        else:
            grad_output, grad_input, grad_displacement, grad_theta = results
            self.launch = BackwardLaunch(grad_output, input, coords, *settings, grad_input,
                                         grad_displacement, grad_theta, deterministic)

    def coordinates(self, theta, displacement) -> Coordinates:
        """The warp's coordinate source: theta in the compute dtype (the identity if None),
        the displacement as the field, and the table."""
        return Coordinates(self.call.input_shape[0], self.call.output_spatial, self.dtype,
                           field=displacement, table=self.table,
                           theta=(self.identity if theta is None
                                  else theta.to(self.table.dtype).contiguous()),
                           scaled=displacement is not None and self.call.units == VOXELS)

    def forward_on(self, input, theta, displacement, out) -> None:
        with on_device_of(input):
            self.launch.run(input, self.coordinates(theta, displacement), out)

    def backward_on(self, grad_output, input, theta, displacement, grad_input, grad_theta,
                    grad_displacement) -> None:
        with on_device_of(input):
            self.launch.run(grad_output, input, self.coordinates(theta, displacement),
                            grad_input, grad_displacement, grad_theta)


preparable = _grid.preparable


def prepare_forward(call, input, theta, displacement, out) -> PreparedWarp | None:
    """``forward(...)`` prepared for operands of these tensors' shapes, strides, dtypes and
    device; None for a call with nothing to compute."""
    if out.numel() == 0:
        return None
    return PreparedWarp(call, input, theta, displacement, (out,))


def forward(call, input, theta, displacement, out) -> None:
    """Sample ``input`` at the warp's points into ``out`` ((N, C, Do, Ho, Wo), its dtype)."""
    prepared = prepare_forward(call, input, theta, displacement, out)
    if prepared is not None:
        prepared.forward_on(input, theta, displacement, out)


def prepare_backward(call, grad_output, input, theta, displacement, grad_input, grad_theta,
                     grad_displacement, deterministic: bool = True) -> PreparedWarp:
    """``backward(...)`` prepared for operands and gradients (None: not asked for) of these
    tensors' shapes, strides, dtypes and device."""
    return PreparedWarp(call, input, theta, displacement,
                        (grad_output, grad_input, grad_displacement, grad_theta),
                        bool(deterministic))


def backward(call, grad_output, input, theta, displacement, grad_input, grad_theta,
             grad_displacement, deterministic: bool = True) -> None:
    """Write the gradients ``call.output_mask`` asks for (None for one not asked for),
    whole; grad_theta and grad_displacement in the coordinates' dtype."""
    prepare_backward(call, grad_output, input, theta, displacement, grad_input, grad_theta,
                     grad_displacement, deterministic).backward_on(
        grad_output, input, theta, displacement, grad_input, grad_theta, grad_displacement)


def workspace_nbytes(call, deterministic: bool = True) -> int:
    """Bytes of device memory the backward allocates beyond its results: grid sampling's
    (``grid_sample.workspace_nbytes``, the per-block sums of grad_theta included) and the
    coordinate source's table and theta in the compute dtype."""
    itemsize = call.compute_dtype.itemsize
    table = (sum(call.output_spatial) + 3 + 12 * call.input_shape[0]) * itemsize
    return _grid_workspace_nbytes(call, deterministic) + table
