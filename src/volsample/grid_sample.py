"""3-D grid sampling: ``grid_sample_3d`` and its backward, ``grid_sample_3d_backward``.

The NumPy front door of the operator family of ``torch.nn.functional.grid_sample`` on 5-D
inputs and of CANN's ``aclnnGridSampler3DBackward``: arguments become a checked call
description (``_calls``), which the C++ backend runs. Semantics: docs/semantics.md.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from . import _backends, _calls, _checks, _config, _layout, _prepared
from ._tables import MODES, PADDINGS

_backend = _backends.cpu("grid_sample")


def grid_sample_3d(input: np.ndarray, grid: np.ndarray, mode: str = "bilinear",
                   padding_mode: str = "zeros", align_corners: bool = False, *,
                   layout: str = "NCDHW") -> np.ndarray:
    """Sample a volume at the points of a grid (trilinear, nearest, bicubic or cubic B-spline).

    Parameters
    ----------
    input : ndarray, shape (N, C, Di, Hi, Wi), or (N, Di, Hi, Wi, C) with ``layout="NDHWC"``
        The volume; float16, bfloat16 (``ml_dtypes.bfloat16``), float32 or float64, any
        strides. With ``mode="nearest"`` also an integer label map (uint8, int16, int32):
        its voxel values are copied exactly (0 where zeros padding reads outside).
    grid : ndarray, shape (N, Do, Ho, Wo, 3)
        Normalised sample coordinates (x, y, z) in [-1, 1]; x indexes W, y H and z D.
        Same dtype as ``input``, or float32/float64 beside a 16-bit or integer ``input``.
    mode : {"bilinear", "nearest", "bicubic", "bspline"}
        "bilinear" is trilinear interpolation of the 8 neighbours; "nearest" rounds half to
        even; "bicubic" is PyTorch's bicubic (cubic convolution, A = -0.75) carried to 3-D,
        over the 4x4x4 neighbours; "bspline" weighs the same 64 neighbours with the cubic
        B-spline, taking ``input`` as spline coefficients (``spline_coefficients`` makes
        them from a volume, so that the samples interpolate it). In the two cubic modes the
        padding applies to each neighbour on its own. "trilinear" is accepted as another
        name of "bilinear" (PyTorch's name on volumes).
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
    key = None
    if type(input) is np.ndarray and type(grid) is np.ndarray:  # a call met before?
        key, prepared = _prepared.lookup(
            "grid_sample_3d", *_prepared.array_key(input), *_prepared.array_key(grid), mode,
            padding_mode, type(align_corners), align_corners, layout, _config.get_num_threads())
        if prepared is not None:
            out = prepared.allocate()
            prepared.kernel.forward_on(input, grid, out)
            return out
    mode, padding_mode = MODES.code(mode), PADDINGS.code(padding_mode)
    input, grid = _checks.ndarray("input", input), _checks.ndarray("grid", grid)
    call = _calls.grid_sample(_calls.operand("input", input), _calls.operand("grid", grid), mode,
                              padding_mode, align_corners, layout, labels=True)
    out = _layout.empty(call.output_shape, call.dtype, call.layout, name="output")
    arrays = _layout.logical(input, call.layout), grid, out
    _backend.forward(call, *arrays)
    out = _layout.physical(out, call.layout)
    if key is not None and _backend.preparable(*arrays):
        kernel = _backend.prepare_forward(call, *arrays)
        if kernel is not None:
            _prepared.remember(key, _PreparedForward(
                kernel, _layout.allocator(out.shape, out.dtype, name="output")))
    return out


class _PreparedForward(NamedTuple):
    """A call's prepared kernel (``_cpu.grid_sample.prepare_forward``) and its result's
    allocator (``_layout.allocator``), kept in ``_prepared`` per arrays' shapes, strides and
    dtypes, arguments and thread count: a call that passed its checks before runs it on
    the new arrays' memory, with no check, description or view made again (an 8^3 call's
    door cost more than its kernel)."""
    kernel: Any
    allocate: Callable[[], np.ndarray]


def grid_sample_3d_backward(grad_output: np.ndarray, input: np.ndarray, grid: np.ndarray,
                            mode: str = "bilinear", padding_mode: str = "zeros",
                            align_corners: bool = False,
                            output_mask: Sequence[bool] = (True, True), *,
                            layout: str = "NCDHW"
                            ) -> tuple[np.ndarray | None, np.ndarray | None]:
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
    key = None
    if (type(grad_output) is np.ndarray and type(input) is np.ndarray
            and type(grid) is np.ndarray):  # a call met before? (as grid_sample_3d's)
        key, prepared = _prepared.lookup(
            "grid_sample_3d_backward", *_prepared.array_key(grad_output),
            *_prepared.array_key(input), *_prepared.array_key(grid), mode, padding_mode,
            type(align_corners), align_corners, _calls.typed(output_mask), layout,
            _config.get_num_threads())
        if prepared is not None:
            grad_input = None if prepared.grad_input is None else prepared.grad_input()
            grad_grid = None if prepared.grad_grid is None else prepared.grad_grid()
            prepared.kernel.backward_on(grad_output, input, grid, grad_input, grad_grid)
            return grad_input, grad_grid
    mode, padding_mode = MODES.code(mode), PADDINGS.code(padding_mode)
    grad_output, input, grid = (_checks.ndarray(name, value) for name, value in
                                (("grad_output", grad_output), ("input", input), ("grid", grid)))
    call = _calls.grid_sample_backward(
        _calls.operand("grad_output", grad_output), _calls.operand("input", input),
        _calls.operand("grid", grid), mode, padding_mode, align_corners, output_mask, layout)
    want_input, want_grid = call.output_mask
    grad_input = (_layout.empty(call.input_shape, call.dtype, call.layout, name="grad_input")
                  if want_input else None)
    grad_grid = (_layout.aligned_empty(call.grid_shape, call.grid_dtype, name="grad_grid")
                 if want_grid else None)
    arrays = (_layout.logical(grad_output, call.layout), _layout.logical(input, call.layout),
              grid, grad_input, grad_grid)
    kernel = None
    if key is not None and _backend.preparable(*arrays):
        kernel = _backend.prepare_backward(call, *arrays)
    if kernel is None:  # (a 16-bit grad_input, or nothing to compute)
        _backend.backward(call, *arrays)
    else:
        kernel.backward_on(*arrays)
    if grad_input is not None:
        grad_input = _layout.physical(grad_input, call.layout)
    if kernel is not None:
        _prepared.remember(key, _PreparedBackward(kernel, *(
            None if t is None else _layout.allocator(t.shape, t.dtype, name=name)
            for t, name in ((grad_input, "grad_input"), (grad_grid, "grad_grid")))))
    return grad_input, grad_grid


class _PreparedBackward(NamedTuple):
    """A backward's prepared kernel (``_cpu.grid_sample.prepare_backward``) and the
    allocator of each gradient it writes (None: not asked for)."""
    kernel: Any
    grad_input: Callable[[], np.ndarray] | None
    grad_grid: Callable[[], np.ndarray] | None


def backward_workspace_nbytes(input_shape: Sequence[int], grid_shape: Sequence[int],
                              dtype: npt.DTypeLike, grid_dtype: npt.DTypeLike | None = None,
                              output_mask: Sequence[bool] = (True, True),
                              threads: int | None = None) -> int:
    """Bytes of scratch memory ``grid_sample_3d_backward`` allocates beyond its results.

    ``input_shape`` is logical (N, C, D, H, W); ``grid_shape`` is (N, Do, Ho, Wo, 3);
    ``threads`` defaults to what the call would use. It counts the compute-precision
    accumulator of a 16-bit grad_input and, with several threads, the plan that splits
    grad_input into slabs of input planes (each output row's range of planes, the rows
    touching each plane). The kernels' per-thread row tables, a few KiB, are not counted.
    """
    dtype = np.dtype(dtype)
    grid_dtype = np.dtype(grid_dtype if grid_dtype is not None else dtype)
    call = _calls.GridSample(tuple(input_shape), tuple(grid_shape), dtype, grid_dtype,
                             MODES.code("bilinear"), PADDINGS.code("zeros"), False,
                             output_mask=_checks.output_mask(output_mask))
    return int(_backend.workspace_nbytes(call, threads))
