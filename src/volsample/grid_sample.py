"""3-D grid sampling: ``grid_sample_3d`` and its backward, ``grid_sample_3d_backward``.

The NumPy front door of the operator family of ``torch.nn.functional.grid_sample`` on 5-D
inputs and of CANN's ``aclnnGridSampler3DBackward``. Semantics: SPEC §2.
"""
from __future__ import annotations

import numpy as np

from . import _checks, _config, _dtypes, _layout
from ._numba.grid_sample import kernels as _kernels
from ._numba._memory import flat


def _validate(input, grid, mode, padding_mode, align_corners, layout):
    """Check the arguments every grid-sampling call shares; return them normalised."""
    layout = _checks.layout_name(layout)
    mode_code = _checks.mode_code(mode)
    padding_code = _checks.padding_code(padding_mode)
    align_corners = _checks.boolean("align_corners", align_corners)
    input = _checks.array("input", input, 5)
    grid = _checks.array("grid", grid, 5)
    _checks.grid_dtype(grid, input)
    volume = _layout.logical(input, layout)
    if grid.shape[-1] != 3:
        raise _checks.InvalidArgumentError(
            f"grid: expected last dimension 3 (x, y, z), got shape {grid.shape}")
    if grid.shape[0] != volume.shape[0]:
        raise _checks.InvalidArgumentError(
            f"grid: expected batch size {volume.shape[0]} (input's N), got shape {grid.shape}")
    _checks.nonempty_spatial("input", volume.shape[2:])
    return volume, grid, mode_code, padding_code, align_corners, layout


def _shapes(volume, grid):
    """Logical input shape and output spatial shape, as tuples (kernel arguments)."""
    return tuple(volume.shape), tuple(grid.shape[1:4])


def grid_sample_3d(input, grid, mode="bilinear", padding_mode="zeros", align_corners=False,
                   *, layout="NCDHW"):
    """Sample a volume at the points of a grid (trilinear or nearest).

    Parameters
    ----------
    input : ndarray, shape (N, C, Di, Hi, Wi), or (N, Di, Hi, Wi, C) with ``layout="NDHWC"``
        The volume; float16, bfloat16 (``ml_dtypes.bfloat16``), float32 or float64, any strides.
    grid : ndarray, shape (N, Do, Ho, Wo, 3)
        Normalised sample coordinates (x, y, z) in [-1, 1]; x indexes W, y H and z D.
        Same dtype as ``input``, or float32/float64 beside a 16-bit ``input``.
    mode : {"bilinear", "nearest"}
        "bilinear" is trilinear interpolation of the 8 neighbours; "nearest" rounds half to even.
    padding_mode : {"zeros", "border", "reflection"}
        What points outside the volume read.
    align_corners : bool
        True: -1 and +1 are the centres of the corner voxels; False: their outer edges.
    layout : {"NCDHW", "NDHWC"}
        Memory order of ``input`` and of the result.

    Returns
    -------
    ndarray, shape (N, C, Do, Ho, Wo) (or NDHWC), dtype of ``input``.

    Notes
    -----
    16-bit inputs are computed in float32 and rounded once. A grid point with a NaN or
    infinite coordinate reads 0 in every padding mode.

    Examples
    --------
    >>> import numpy as np, volsample
    >>> volume = np.arange(8, dtype=np.float32).reshape(1, 1, 2, 2, 2)
    >>> centre = np.zeros((1, 1, 1, 1, 3), np.float32)
    >>> volsample.grid_sample_3d(volume, centre, align_corners=True).ravel()
    array([3.5], dtype=float32)
    """
    volume, grid, mode_code, padding_code, align_corners, layout = _validate(
        input, grid, mode, padding_mode, align_corners, layout)
    N, C = volume.shape[:2]
    out_logical = (N, C) + grid.shape[1:4]
    compute = _dtypes.compute_dtype(input.dtype, grid.dtype)
    out = _layout.empty(out_logical, compute, layout)
    if out.size:
        in_shape, out_shape = _shapes(volume, grid)
        inp_b, inp_o, inp_s = flat(_dtypes.as_compute(volume, compute))
        grid_b = _contiguous_grid(grid, compute)
        out_b, out_o, out_s = flat(out)
        forward = _kernels(mode_code, padding_code).forward
        threads = _config.threads_for(out.size)
        with _config.parallel_launch(threads):
            forward(inp_b, inp_o, inp_s, grid_b, out_b, out_o, out_s,
                    in_shape, out_shape, _n_chunks(N * out_shape[0] * out_shape[1], threads),
                    align_corners)
    return _layout.physical(out, layout).astype(input.dtype, copy=False)


def grid_sample_3d_backward(grad_output, input, grid, mode="bilinear", padding_mode="zeros",
                            align_corners=False, output_mask=(True, True), *, layout="NCDHW"):
    """Gradients of ``grid_sample_3d`` with respect to ``input`` and ``grid``.

    Parameters
    ----------
    grad_output : ndarray, shape (N, C, Do, Ho, Wo) (or NDHWC), dtype of ``input``
        Gradient of the loss with respect to the forward's result.
    input, grid, mode, padding_mode, align_corners, layout
        As for ``grid_sample_3d``.
    output_mask : (bool, bool)
        Which of (grad_input, grad_grid) to compute; one not asked for is returned as None
        and costs nothing.

    Returns
    -------
    (grad_input, grad_grid) : ndarray or None
        ``grad_input`` has ``input``'s shape, dtype and layout; ``grad_grid`` has ``grid``'s.

    Notes
    -----
    Deterministic: the result is bitwise identical for every thread count (the input
    gradient is gathered per input plane, with no atomics). ``grad_grid`` is exactly 0
    for nearest sampling and for non-finite grid points.
    """
    volume, grid, mode_code, padding_code, align_corners, layout = _validate(
        input, grid, mode, padding_mode, align_corners, layout)
    want_input, want_grid = _checks.output_mask(output_mask)
    grad_output = _checks.array("grad_output", grad_output, 5)
    _checks.same_dtype("grad_output", grad_output, "input", input)
    gout = _layout.logical(grad_output, layout)
    N, C = volume.shape[:2]
    _checks.shape_equal("grad_output", grad_output.shape,
                        _layout.physical_shape((N, C) + grid.shape[1:4], layout),
                        f"shape (the forward's output shape, {layout})")

    compute = _dtypes.compute_dtype(input.dtype, grid.dtype)
    grad_input = _layout.empty(volume.shape, compute, layout, zero=True) if want_input else None
    grad_grid = np.zeros(grid.shape, compute) if want_grid else None
    points = int(np.prod(grid.shape[:4]))
    if (want_input or want_grid) and points and C:
        _backward(gout, volume, grid, grad_input, grad_grid, compute, mode_code, padding_code,
                  align_corners)
    if grad_input is not None:
        grad_input = _layout.physical(grad_input, layout).astype(input.dtype, copy=False)
    if grad_grid is not None:
        grad_grid = grad_grid.astype(grid.dtype, copy=False)
    return grad_input, grad_grid


def _backward(gout, volume, grid, grad_input, grad_grid, compute, mode_code, padding_code,
              align_corners):
    want_input, want_grid = grad_input is not None, grad_grid is not None
    N, C = volume.shape[:2]
    points = int(np.prod(grid.shape[:4]))
    in_shape, out_shape = _shapes(volume, grid)
    go_b, go_o, go_s = flat(_dtypes.as_compute(gout, compute))
    in_b, in_o, in_s = flat(_dtypes.as_compute(volume, compute))
    grid_b = _contiguous_grid(grid, compute)
    grad_grid_rows = grad_grid.reshape(points, 3) if want_grid else np.empty((1, 3), compute)
    threads = _config.threads_for(points * C)
    kernels = _kernels(mode_code, padding_code)
    rows = N * out_shape[0] * out_shape[1]
    with _config.parallel_launch(threads):
        if want_input:
            gi_b, gi_o, gi_s = flat(grad_input)
            row_first, row_last, slabs = _row_ranges_and_slabs(
                kernels, grid_b, in_shape, out_shape, threads, align_corners)
        else:  # no slabs: only grid-gradient tasks run
            gi_b, gi_o, gi_s = np.empty(1, compute), 0, (0,) * 5
            row_first = row_last = np.empty(0, np.int64)
            slabs = np.zeros(1, np.int64)
        grad_rows = _gradient_row_bounds(rows, threads, want_input, want_grid, len(slabs) - 1)
        plane_slab = np.repeat(np.arange(len(slabs) - 1), np.diff(slabs))
        kernels.backward(go_b, go_o, go_s, in_b, in_o, in_s, grid_b, gi_b, gi_o, gi_s,
                         grad_grid_rows, row_first, row_last, slabs, plane_slab, grad_rows,
                         in_shape, out_shape, want_grid, align_corners)


# Time to scatter a point into grad_input over time to compute its grid gradient
# (measured, one channel or eight, smooth or random grids: 0.6-0.8).
_SCATTER_OVER_GRADIENT = 0.7


def _gradient_row_bounds(rows, threads, want_input, want_grid, slabs):
    """Row bounds of the grid-gradient work of each parallel iteration of the backward
    kernel; empty when the slabs compute it themselves (several slabs, or one thread).
    Beside a single slab (rows reaching across the volume), iteration 0 scatters every
    point, so it takes a smaller share of the grid gradient: the iterations then finish
    together."""
    if not want_grid or (want_input and (threads == 1 or slabs > 1)):
        return np.empty(0, np.int64)
    if not want_input:
        return np.linspace(0, rows, _n_chunks(rows, threads) + 1).astype(np.int64)
    share = np.empty(threads)  # fractions of the rows
    share[0] = max(0.0, (1 + _SCATTER_OVER_GRADIENT) / threads - _SCATTER_OVER_GRADIENT)
    share[1:] = (1 - share[0]) / (threads - 1)
    return np.round(np.concatenate(([0], np.cumsum(share))) * rows).astype(np.int64)


def _row_ranges_and_slabs(kernels, grid_b, in_shape, out_shape, threads, align_corners):
    """Each output row's range of input planes, and the slabs of input planes that the
    backward's parallel iterations own (boundaries [0, ..., N*D])."""
    N, _, D = in_shape[:3]
    rows_per_batch = out_shape[0] * out_shape[1]
    one_slab = np.empty(0, np.int64), np.empty(0, np.int64), np.array([0, N * D], np.int64)
    if threads == 1:  # one slab holds every plane: the ranges are not read
        return one_slab
    if N >= threads:  # whole batches per slab: a row only touches its own batch's planes
        first = np.repeat(np.arange(N, dtype=np.int64) * D, rows_per_batch)
        slabs = D * (np.arange(threads + 1, dtype=np.int64) * N // threads)
        return first, first + (D - 1), slabs
    rows = N * rows_per_batch
    row_first, row_last = np.empty(rows, np.int64), np.empty(rows, np.int64)
    touching = np.zeros((_n_chunks(rows, threads), N * D + 1), np.int64)
    kernels.row_planes(grid_b, row_first, row_last, touching, in_shape, out_shape, align_corners)
    slabs = _slab_bounds(np.cumsum(touching.sum(axis=0))[:-1], threads)
    # Each slab a row reaches prepares the row again: when rows reach across slabs on
    # average (a random grid), one slab does the whole scatter faster.
    live = row_first <= row_last
    reached = (np.searchsorted(slabs, row_last[live], "right")
               - np.searchsorted(slabs, row_first[live], "right"))
    if reached.size and reached.mean() > 0.5:  # more than 1.5 slabs a row
        return one_slab
    return row_first, row_last, slabs


def _contiguous_grid(grid, compute):
    """The grid as a flat contiguous buffer in the compute dtype (a copy only when it is
    strided or of another dtype): the kernels then know its strides at compile time."""
    return np.ascontiguousarray(grid, dtype=compute).reshape(-1)


def _n_chunks(rows, threads):
    """Work items for a pass over ``rows`` output rows: a few per thread."""
    return max(1, min(rows, 4 * threads))


def _slab_bounds(rows_per_plane, n_slabs):
    """Split the input planes into ``n_slabs`` runs touched by about equal numbers of rows
    (the work), as boundaries [0, ..., planes]. Any split gives the same bits."""
    planes = len(rows_per_plane)
    cumulative = np.cumsum(rows_per_plane)
    targets = cumulative[-1] * np.arange(1, n_slabs) / n_slabs
    inner = np.searchsorted(cumulative, targets, side="right")
    return np.unique(np.concatenate(([0], inner, [planes]))).astype(np.int64)


def backward_workspace_nbytes(input_shape, grid_shape, dtype, grid_dtype=None,
                              output_mask=(True, True), threads=None):
    """Bytes of scratch memory ``grid_sample_3d_backward`` allocates beyond its results.

    ``input_shape`` is logical (N, C, D, H, W); ``grid_shape`` is (N, Do, Ho, Wo, 3). It
    counts the compute-precision copies of 16-bit operands and accumulators, each output
    row's range of input planes and the plane histograms that split the work into slabs
    (the kernels' per-work-item row tables, a few KiB, are not counted).
    """
    dtype = np.dtype(dtype)
    grid_dtype = np.dtype(grid_dtype if grid_dtype is not None else dtype)
    want_input, want_grid = output_mask
    compute = _dtypes.compute_dtype(dtype, grid_dtype)
    N, C, D = (int(v) for v in input_shape[:3])
    volume = int(np.prod(input_shape))
    points = int(np.prod(grid_shape[:4]))
    if not (want_input or want_grid) or points == 0 or C == 0:
        return 0
    total = 0
    if dtype != compute:  # converted grad_output and input, and the input-gradient accumulator
        total += (C * points + volume + (volume if want_input else 0)) * compute.itemsize
    if grid_dtype != compute:  # converted grid and grid-gradient accumulator
        total += (points * 3 * (2 if want_grid else 1)) * compute.itemsize
    if not want_input:
        return int(total)
    threads = threads or _config.get_num_threads()
    if threads == 1:  # one slab: no row ranges
        return int(total)
    rows = int(np.prod(grid_shape[:3]))
    total += rows * 2 * 8  # each row's plane range
    # per-chunk plane counts (difference arrays) and their sums, and each plane's slab
    total += (_n_chunks(rows, threads) + 3) * (N * D + 1) * 8
    total += (threads + 1) * 8  # slab bounds
    return int(total)
