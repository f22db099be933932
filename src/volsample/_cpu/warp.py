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

import numpy as np

from .. import _layout
from . import _kernels, operand
from . import grid_sample as _grid


_THETA_SUMS_PER_ROW = 6 * 4  # WarpGradientStore::kRowSums


def _theta(call, theta):
    """theta, or the identity in the coordinates' dtype (exact: 1 * b + 0 = b)."""
    if theta is not None:
        return theta
    return np.broadcast_to(np.eye(3, 4, dtype=call.coord_dtype), call.theta_shape)


def forward(call, input, theta, displacement, out, threads=None) -> None:
    """Sample ``input`` at the warp's points into ``out`` (integer label maps too, nearest
    only: exact copies of voxel values)."""
    if out.size == 0:
        return
    _kernels.warp_forward(operand(input), operand(_theta(call, theta)), operand(displacement),
                          operand(out), call.mode, call.padding, call.align_corners,
                          call.displacement_scale, _grid._threads(call, out.size, threads))


def backward(call, grad_output, input, theta, displacement, grad_input, grad_theta,
             grad_displacement, threads=None) -> None:
    """Write the gradients ``call.output_mask`` asks for (None for one not asked for),
    whole: the kernel zeroes what it adds into."""
    C = call.input_shape[1]
    if grad_input is None or grad_input.dtype == call.compute_dtype:
        accumulator = grad_input
    else:  # 16 bits: summed in the compute dtype, rounded once below
        accumulator = _layout.empty(call.input_shape, call.compute_dtype, call.layout,
                                    name="grad_input's accumulator")
    results = [r for r in (accumulator, grad_theta, grad_displacement) if r is not None]
    if not (call.points and C):  # no kernel to run
        for result in results:
            result[...] = 0
    elif results:
        _kernels.warp_backward(
            operand(grad_output), operand(input), operand(_theta(call, theta)),
            operand(displacement), operand(accumulator), operand(grad_theta),
            operand(grad_displacement), call.mode, call.padding, call.align_corners,
            call.displacement_scale, _grid._threads(call, call.points * C, threads))
    if accumulator is not None and accumulator is not grad_input:
        np.copyto(grad_input, accumulator, casting="unsafe")


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
