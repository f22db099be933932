"""3-D grid sampling: ``grid_sample_3d`` and its backward, ``grid_sample_3d_backward``.

The NumPy front door of the operator family of ``torch.nn.functional.grid_sample`` on 5-D
inputs and of CANN's ``aclnnGridSampler3DBackward``. Semantics: SPEC §2.
"""
from __future__ import annotations

import numpy as np

from . import _checks, _config, _dtypes, _layout
from ._cpu import grid_sample as _cpu


def _validate(input, grid, mode, padding_mode, align_corners, layout, labels=False):
    """Check the arguments every grid-sampling call shares; return them normalised.
    ``labels``: integer label maps are taken, with mode "nearest"."""
    layout = _checks.layout_name(layout)
    mode_code = _checks.mode_code(mode)
    padding_code = _checks.padding_code(padding_mode)
    align_corners = _checks.boolean("align_corners", align_corners)
    input = _checks.array("input", input, 5, labels=labels and mode_code == _checks.NEAREST)
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


def grid_sample_3d(input, grid, mode="bilinear", padding_mode="zeros", align_corners=False,
                   *, layout="NCDHW"):
    """Sample a volume at the points of a grid (trilinear or nearest).

    Parameters
    ----------
    input : ndarray, shape (N, C, Di, Hi, Wi), or (N, Di, Hi, Wi, C) with ``layout="NDHWC"``
        The volume; float16, bfloat16 (``ml_dtypes.bfloat16``), float32 or float64, any
        strides. With ``mode="nearest"`` also an integer label map (uint8, int16, int32):
        its voxel values are copied exactly (0 where zeros padding reads outside).
    grid : ndarray, shape (N, Do, Ho, Wo, 3)
        Normalised sample coordinates (x, y, z) in [-1, 1]; x indexes W, y H and z D.
        Same dtype as ``input``, or float32/float64 beside a 16-bit or integer ``input``.
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
        input, grid, mode, padding_mode, align_corners, layout, labels=True)
    N, C = volume.shape[:2]
    out = _layout.empty((N, C) + grid.shape[1:4], volume.dtype, layout)
    if out.size:
        _cpu.forward(volume, grid, out, mode_code, padding_code, align_corners,
                     _config.threads_for(out.size))
    return _layout.physical(out, layout)


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

    # The kernel adds into grad_input (a compute-precision accumulator for 16 bits, rounded
    # once at the end) and writes grad_grid where points touch the volume.
    compute = _dtypes.compute_dtype(volume.dtype, grid.dtype)
    grad_input = _layout.empty(volume.shape, compute, layout, zero=True) if want_input else None
    grad_grid = _layout.aligned_empty(grid.shape, grid.dtype, zero=True) if want_grid else None
    points = int(np.prod(grid.shape[:4]))
    if (want_input or want_grid) and points and C:
        _cpu.backward(gout, volume, grid, grad_input, grad_grid, mode_code, padding_code,
                      align_corners, _config.threads_for(points * C))
    if grad_input is not None:
        grad_input = _layout.physical(grad_input, layout).astype(volume.dtype, copy=False)
    return grad_input, grad_grid


def backward_workspace_nbytes(input_shape, grid_shape, dtype, grid_dtype=None,
                              output_mask=(True, True), threads=None):
    """Bytes of scratch memory ``grid_sample_3d_backward`` allocates beyond its results.

    ``input_shape`` is logical (N, C, D, H, W); ``grid_shape`` is (N, Do, Ho, Wo, 3);
    ``threads`` defaults to what the call would use. It counts the compute-precision
    accumulator of a 16-bit grad_input and, with several threads, the plan that splits
    grad_input into slabs of input planes (each output row's range of planes, the rows
    touching each plane). The kernels' per-thread row tables, a few KiB, are not counted.
    """
    dtype = np.dtype(dtype)
    grid_dtype = np.dtype(grid_dtype if grid_dtype is not None else dtype)
    points = int(np.prod(grid_shape[:4]))
    C = int(input_shape[1])
    if not any(output_mask) or points == 0 or C == 0:
        return 0
    threads = _config.threads_for(points * C) if threads is None else threads
    return int(_cpu.workspace_nbytes(input_shape, grid_shape, dtype, grid_dtype,
                                     tuple(output_mask), threads))
