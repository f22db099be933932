"""Launchers of the C++ grid-sampling kernels, and the scratch memory they allocate.

Operands arrive checked, volumes in logical (N, C, D, H, W) order with any strides, in
their own dtypes: the kernels read 16-bit volumes, grads and grids from their memory and
compute in float32 (float64 beside a float64 grid). The forward's result has the volume's
dtype (rounded once); ``grad_grid`` has the grid's. ``grad_input`` is the compute-precision
accumulator the kernel adds into (zeroed by the caller), rounded by the caller.
"""
from __future__ import annotations

import numpy as np

from .. import _dtypes
from . import _kernels, operand


def forward(volume, grid, out, mode_code, padding_code, align_corners, threads):
    """Sample ``volume`` at ``grid`` into ``out`` (``volume``'s dtype; integer label maps
    too, nearest only: exact copies of voxel values)."""
    _kernels.grid_sample_forward(operand(volume), operand(grid), operand(out), mode_code,
                                 padding_code, align_corners, threads)


def backward(grad_output, volume, grid, grad_input, grad_grid, mode_code, padding_code,
             align_corners, threads):
    """Add the input gradient into ``grad_input`` (zeros, compute dtype) and write the
    grid gradient into ``grad_grid`` (zeros, the grid's dtype); either may be None, not
    to be computed."""
    _kernels.grid_sample_backward(operand(grad_output), operand(volume), operand(grid),
                                  operand(grad_input), operand(grad_grid), mode_code,
                                  padding_code, align_corners, threads)


def backward_slabs(volume, grid, want_grid, mode_code, padding_code, align_corners, threads):
    """Bounds [0, ..., N*D] of the slabs of input planes the backward splits grad_input
    into on ``threads`` threads (one slab: a single task scatters every point)."""
    return _kernels.grid_sample_backward_slabs(operand(volume), operand(grid), want_grid,
                                               mode_code, padding_code, align_corners, threads)


def workspace_nbytes(input_shape, grid_shape, dtype, grid_dtype, output_mask, threads):
    """Bytes the backward allocates beyond its results: the compute-precision accumulator
    of a 16-bit grad_input, and with several threads the plan that splits it into slabs
    (each output row's range of input planes, the rows touching each plane, the slab
    bounds). The per-thread row tables (a few KiB) are not counted."""
    want_input, _ = output_mask
    if not want_input:
        return 0
    compute = _dtypes.compute_dtype(dtype, grid_dtype)
    N, _, D = (int(v) for v in input_shape[:3])
    total = 0
    if np.dtype(dtype) != compute:
        total += int(np.prod(input_shape)) * compute.itemsize
    if threads > 1:
        rows = int(np.prod(grid_shape[:3]))
        total += rows * 2 * 8 + (N * D + 1) * 8 + (threads + 1) * 8
    return total
