"""The C++ grid-sampling kernels behind a checked ``_calls.GridSample``: launch them, and
count the scratch memory they allocate.

Operands are NumPy arrays, volumes as logical (N, C, D, H, W) views with any strides, in
their own dtypes: the kernels read 16-bit volumes, grads and grids from their memory and
compute in the call's compute dtype (float32, or float64 beside a float64 grid). Results
are written whole into the arrays the caller allocated (the volume's dtype; ``grad_grid``
the grid's); a 16-bit ``grad_input`` is accumulated in a compute-precision buffer and
rounded once.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _layout
from . import _kernels, operand, threads_for
from . import preparable as preparable  # the family's contract: whether it may prepare


def _threads(call, work: int, threads) -> int:
    return threads_for(work) if threads is None else threads


def forward(call, input, grid, out, threads=None) -> None:
    """Sample ``input`` at ``grid`` into ``out`` (integer label maps too, nearest only:
    exact copies of voxel values)."""
    operands = _forward_operands(call, input, grid, out, threads)
    if operands is not None:
        _kernels.grid_sample_forward(*operands[:3], call.mode, call.padding, call.align_corners,
                                     operands.threads)


def prepare_forward(call, input, grid, out, threads=None):
    """``forward(call, input, grid, out, threads)`` as a ``_kernels.PreparedGridSample``
    that runs it on any operands of these arrays' shapes, strides and dtypes
    (``.forward(input_address, grid_address, out_address)``); None for a call with nothing
    to compute."""
    operands = _forward_operands(call, input, grid, out, threads)
    if operands is None:
        return None
    return _kernels.PreparedGridSample(*operands[:3], None, None, None, call.mode, call.padding,
                                       call.align_corners, operands.threads)


class _ForwardOperands(NamedTuple):
    input: np.ndarray
    grid: np.ndarray
    out: np.ndarray
    threads: int


def _forward_operands(call, input, grid, out, threads):
    """The forward kernel's operands and thread count; None where it has nothing to do."""
    if out.size == 0:
        return None
    threads = _threads(call, out.size, threads)
    if threads == 1:
        (grid,), (out,) = _planes_as_rows((grid,), (out,))
    return _ForwardOperands(operand(input), operand(grid), operand(out), threads)


def _planes_as_rows(grids, volumes):
    """Views of the grid-shaped (N, Do, Ho, Wo, 3) arrays ``grids`` and the point-shaped
    (N, C, Do, Ho, Wo) arrays ``volumes`` (None: absent) whose (H, W) planes of points are
    single rows, where all their strides allow it; else the arrays themselves. Each
    output row costs the kernels its setup and a partly filled last vector: on 8^3 points
    in 64 rows, that was 40% of the forward's time and half the backward's. (Rows are
    also how threads share the work, hence only on one thread.) The points keep their
    order, so the bits stay the same."""
    N, Do, Ho, Wo, _ = grids[0].shape
    if Ho == 1 or any(g is not None and g.strides[2] != g.strides[3] * Wo for g in grids) or \
            any(v is not None and v.strides[3] != v.strides[4] * Wo for v in volumes):
        return grids, volumes
    return (tuple(None if g is None else g.reshape(N, Do, 1, Ho * Wo, g.shape[4]) for g in grids),
            tuple(None if v is None else v.reshape(N, v.shape[1], Do, 1, Ho * Wo)
                  for v in volumes))


def backward(call, grad_output, input, grid, grad_input, grad_grid, threads=None) -> None:
    """Write the gradients ``call.output_mask`` asks for into ``grad_input`` and
    ``grad_grid`` (None for one not asked for), whole: the kernel zeroes what it adds into."""
    if grad_input is None or grad_input.dtype == call.compute_dtype:
        accumulator = grad_input
    else:  # 16 bits: summed in the compute dtype, rounded once below
        accumulator = _layout.empty(call.input_shape, call.compute_dtype, call.layout,
                                    name="grad_input's accumulator")
    operands = _backward_operands(call, grad_output, input, grid, accumulator, grad_grid, threads)
    if operands is not None:
        _kernels.grid_sample_backward(*operands[:5], call.mode, call.padding, call.align_corners,
                                      operands.threads)
    else:  # no kernel to run: no point, or no channel
        for result in (accumulator, grad_grid):
            if result is not None:
                result[...] = 0
    if accumulator is not None and accumulator is not grad_input:
        np.copyto(grad_input, accumulator, casting="unsafe")


def prepare_backward(call, grad_output, input, grid, grad_input, grad_grid, threads=None):
    """``backward(...)`` as a ``_kernels.PreparedGridSample`` for operands of these
    arrays' shapes, strides and dtypes (``.backward(grad_output_address, input_address,
    grid_address, grad_input_address, grad_grid_address)``, into gradients it writes
    whole); None
    where the kernel has nothing to do, or a 16-bit ``grad_input`` needs an accumulator
    (``backward`` then)."""
    if grad_input is not None and grad_input.dtype != call.compute_dtype:
        return None
    operands = _backward_operands(call, grad_output, input, grid, grad_input, grad_grid, threads)
    if operands is None:
        return None
    return _kernels.PreparedGridSample(operands.input, operands.grid, None, operands.grad_output,
                                       operands.grad_input, operands.grad_grid, call.mode,
                                       call.padding, call.align_corners, operands.threads)


class _BackwardOperands(NamedTuple):
    grad_output: np.ndarray
    input: np.ndarray
    grid: np.ndarray
    grad_input: np.ndarray | None
    grad_grid: np.ndarray | None
    threads: int


def _backward_operands(call, grad_output, input, grid, grad_input, grad_grid, threads):
    """The backward kernel's operands and thread count; None where it has nothing to do."""
    C = call.input_shape[1]
    if (grad_input is None and grad_grid is None) or not call.points or not C:
        return None
    threads = _threads(call, call.points * C, threads)
    if threads == 1:
        (grid, grad_grid), (grad_output,) = _planes_as_rows((grid, grad_grid), (grad_output,))
    return _BackwardOperands(*map(operand, (grad_output, input, grid, grad_input, grad_grid)),
                             threads)


def backward_slabs(call, input, grid, threads) -> list[int]:
    """Bounds [0, ..., N*D] of the slabs of input planes the backward splits grad_input
    into on ``threads`` threads (one slab: a single task scatters every point)."""
    return _kernels.grid_sample_backward_slabs(operand(input), operand(grid), call.output_mask[1],
                                               call.mode, call.padding, call.align_corners,
                                               threads)


def workspace_nbytes(call, threads=None) -> int:
    """Bytes the backward allocates beyond its results: the compute-precision accumulator
    of a 16-bit grad_input, and with several threads the plan that splits it into slabs
    (each output row's range of input planes, the rows touching each plane, the slab
    bounds: at most one slab per plane). The kernels' per-thread row tables, a few KiB, are
    not counted."""
    want_input, _ = call.output_mask
    C = call.input_shape[1]
    if not want_input or call.points == 0 or C == 0:
        return 0
    threads = _threads(call, call.points * C, threads)
    N, _, D = call.input_shape[:3]
    total = 0
    if call.dtype != call.compute_dtype:
        total += int(np.prod(call.input_shape)) * call.compute_dtype.itemsize
    if threads > 1:
        rows = int(np.prod(call.grid_shape[:3]))
        total += rows * 2 * 8 + 2 * (N * D + 1) * 8
    return total
