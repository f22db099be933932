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

import numpy as np

from .. import _config, _layout
from . import _kernels, operand


def _threads(call, work: int, threads) -> int:
    return _config.threads_for(work) if threads is None else threads


def forward(call, input, grid, out, threads=None) -> None:
    """Sample ``input`` at ``grid`` into ``out`` (integer label maps too, nearest only:
    exact copies of voxel values)."""
    if out.size == 0:
        return
    threads = _threads(call, out.size, threads)
    if threads == 1:
        grid, out = _planes_as_rows(grid, out)
    _kernels.grid_sample_forward(operand(input), operand(grid), operand(out), call.mode,
                                 call.padding, call.align_corners, threads)


def _planes_as_rows(grid, out):
    """Views of ``grid`` and ``out`` whose (H, W) planes of points are single rows, where
    both arrays' strides allow it; else the arrays themselves. Each output row costs the
    kernel its setup and a partly filled last vector: on 8^3 points in 64 rows, that was
    40% of the kernel's time. (Rows are also how threads share the work, hence only on
    one thread.)"""
    N, Do, Ho, Wo, _ = grid.shape
    if Ho == 1 or grid.strides[2] != grid.strides[3] * Wo or \
            out.strides[3] != out.strides[4] * Wo:
        return grid, out
    return (grid.reshape(N, Do, 1, Ho * Wo, 3),
            out.reshape(N, out.shape[1], Do, 1, Ho * Wo))


def backward(call, grad_output, input, grid, grad_input, grad_grid, threads=None) -> None:
    """Write the gradients ``call.output_mask`` asks for into ``grad_input`` and
    ``grad_grid`` (None for one not asked for)."""
    C = call.input_shape[1]
    if grad_grid is not None:
        grad_grid[...] = 0  # the kernel writes the points that touch the volume
    if grad_input is None:
        accumulator = None
    elif grad_input.dtype == call.compute_dtype:
        accumulator = grad_input
        accumulator[...] = 0
    else:  # 16 bits: summed in the compute dtype, rounded once below
        accumulator = _layout.empty(call.input_shape, call.compute_dtype, call.layout, zero=True,
                                    name="grad_input's accumulator")
    if (accumulator is not None or grad_grid is not None) and call.points and C:
        _kernels.grid_sample_backward(
            operand(grad_output), operand(input), operand(grid), operand(accumulator),
            operand(grad_grid), call.mode, call.padding, call.align_corners,
            _threads(call, call.points * C, threads))
    if accumulator is not None and accumulator is not grad_input:
        np.copyto(grad_input, accumulator, casting="unsafe")


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
