"""The C++ warp kernels behind a checked ``_calls.Warp``: launch them, and count the
scratch memory they allocate.

They are the grid-sampling kernels (``src/cpp/grid_forward.cpp``, ``grid_backward.cpp``)
with a warp's coordinate source (each point's coordinates from theta, its index and its
displacement) and gradient sink (the displacement's gradient, and per-row sums for
theta's), ``src/cpp/grid_warp.h``. Operands are
NumPy arrays: volumes as logical (N, C, D, H, W) views with any strides, theta (N, 3, 4)
or None (the identity), displacement (N, Do, Ho, Wo, 3) or None (0). Results are written
whole into the caller's arrays.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _layout
from . import _kernels, operand
from . import preparable as preparable  # the family's contract: whether it may prepare
from . import grid_sample as _grid


_THETA_SUMS_PER_ROW = 6 * 4  # WarpGradientStore::kRowSums


def forward(call, input, theta, displacement, out, threads=None) -> None:
    """Sample ``input`` at the warp's points into ``out`` (integer label maps too, nearest
    only: exact copies of voxel values)."""
    if out.size == 0:
        return
    PreparedWarp(call, threads).forward_on(operand(input), operand(theta), operand(displacement),
                                     operand(out))


def backward(call, grad_output, input, theta, displacement, grad_input, grad_theta,
             grad_displacement, threads=None) -> None:
    """Write the gradients ``call.output_mask`` asks for (None for one not asked for),
    whole."""
    if grad_input is None or grad_input.dtype == call.compute_dtype:
        accumulator = grad_input
    else:  # 16 bits: summed in the compute dtype, rounded once below
        accumulator = _layout.empty(call.input_shape, call.compute_dtype, call.layout,
                                    name="grad_input's accumulator")
    PreparedWarp(call, threads).backward_on(*map(operand, (
        grad_output, input, theta, displacement, accumulator, grad_theta, grad_displacement)))
    if accumulator is not None and accumulator is not grad_input:
        np.copyto(grad_input, accumulator, casting="unsafe")


def prepare(call, *arrays, threads=None) -> PreparedWarp | None:
    """The call's ``PreparedWarp``, for a front door to keep and run on new arrays of these
    arrays' shapes, strides and dtypes (the forward's or the backward's, None for an
    absent one) as they are; None where the kernels cannot take them so (``preparable``),
    there is nothing to compute, or a 16-bit ``grad_input`` needs an accumulator
    (``backward`` then)."""
    if not preparable(*arrays) or any(a is not None and a.size == 0 for a in arrays):
        return None
    if len(arrays) == 7 and arrays[4] is not None and arrays[4].dtype != call.compute_dtype:
        return None
    return PreparedWarp(call, threads)


prepare_forward = prepare_backward = prepare  # the forward's arrays, the backward's


class PreparedWarp:
    """As ``_kernels.PreparedGridSample`` for grid sampling: a checked call's kernel arguments beyond its arrays, worked out once: the modes, the
    units' scale, the thread counts and the theta of a call without one (the identity in
    the coordinates' dtype; exact: 1 * b + 0 = b). Its runs take the kernels' operands
    (logical views, ``operand``'s) and write the gradients whole."""

    __slots__ = ("identity", "forward_args", "backward_args", "points")

    def __init__(self, call, threads=None) -> None:
        self.identity = None if call.theta else np.broadcast_to(
            np.eye(3, 4, dtype=call.coord_dtype), call.theta_shape)
        settings = (call.mode, call.padding, call.align_corners, call.displacement_scale)
        out_size = math.prod(call.output_shape)
        self.points = call.points if call.input_shape[1] else 0
        self.forward_args = settings + (_grid._threads(call, out_size, threads),)
        self.backward_args = settings + (_grid._threads(call, self.points * call.input_shape[1],
                                                        threads),)

    def forward_on(self, input, theta, displacement, out) -> None:
        _kernels.warp_forward(input, self.identity if theta is None else theta, displacement,
                              out, *self.forward_args)

    def backward_on(self, grad_output, input, theta, displacement, grad_input, grad_theta,
                    grad_displacement) -> None:
        results = [r for r in (grad_input, grad_theta, grad_displacement) if r is not None]
        if not self.points:  # no kernel to run (the kernel zeroes what it adds into)
            for result in results:
                result[...] = 0
        elif results:
            _kernels.warp_backward(grad_output, input,
                                   self.identity if theta is None else theta, displacement,
                                   grad_input, grad_theta, grad_displacement,
                                   *self.backward_args)


def workspace_nbytes(call, threads=None) -> int:
    """Bytes the backward allocates beyond its results: grid sampling's (the accumulator
    of a 16-bit grad_input, the plan of several threads) and, for grad_theta, the float64
    sums of each output row (grid_warp.h: six sums in four slots)."""
    C = call.input_shape[1]
    if call.points == 0 or C == 0:
        return 0
    total = _grid.workspace_nbytes(call.sample, threads)
    if call.output_mask[1]:
        total += _THETA_SUMS_PER_ROW * 8 * call.points // call.output_spatial[2]
    return total
