"""Trilinear 3-D upsampling: ``upsample_trilinear_3d`` and its backward,
``upsample_trilinear_3d_backward``.

The NumPy front door of the operator family of ``torch.nn.functional.interpolate`` with
``mode="trilinear"`` and of CANN's ``aclnnUpsampleTrilinear3dBackward``: arguments become a
checked call description (``_calls``), which the C++ backend runs. Both directions apply
one 1-D map per axis (``src/cpp/upsample.cpp``); a volume whose spatial size does not
change is copied. Semantics: docs/semantics.md.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from . import _backends, _calls, _checks, _config, _layout, _prepared

_backend = _backends.cpu("upsample")


def _shapes_call(input_shape, output_shape, dtype, align_corners, scales, layout):
    """The description of a call between logical shapes (the workspace queries)."""
    return _calls.Upsample(tuple(int(v) for v in input_shape),
                           tuple(int(v) for v in output_shape), np.dtype(dtype),
                           bool(align_corners), tuple(scales), _layout.check(layout))


def forward_workspace_nbytes(input_shape: Sequence[int], output_size: Sequence[int],
                            dtype: npt.DTypeLike, align_corners: bool = False,
                            scale_factor: float | Sequence[float] | None = None, *,
                            layout: str = "NCDHW", threads: int | None = None) -> int:
    """Bytes of scratch memory ``upsample_trilinear_3d`` allocates beyond its result.

    ``input_shape`` is logical (N, C, Di, Hi, Wi) and ``output_size`` (Do, Ho, Wo); the
    other arguments are the call's (``threads``: the threads it runs on, by default as
    many as the call would take now).
    It counts the float32 copies of a 16-bit input and result, the per-axis tables, and
    each running thread's scratch (bands of rows of planes, sized to stay in L2).
    """
    input_shape = tuple(input_shape)
    scales = (None,) * 3 if scale_factor is None else _checks.scale_factors(
        "scale_factor", scale_factor, 3)
    call = _shapes_call(input_shape, input_shape[:2] + tuple(output_size), dtype,
                        align_corners, scales, layout)
    return _backend.workspace_nbytes(call, backward=False, threads=threads)


def backward_workspace_nbytes(grad_output_shape: Sequence[int], input_size: Sequence[int],
                              dtype: npt.DTypeLike, align_corners: bool = False,
                              scales: Sequence[float | None] | None = None, *,
                              layout: str = "NCDHW", threads: int | None = None) -> int:
    """Bytes of scratch memory ``upsample_trilinear_3d_backward`` allocates beyond its result.

    ``grad_output_shape`` is logical (N, C, Do, Ho, Wo) and ``input_size`` (N, C, Di, Hi,
    Wi); the other arguments are the call's (``threads``: the threads it runs on, by
    default as many as the call would take now). It counts the per-axis tables and
    each running thread's scratch planes (16-bit data is read and written in place).
    """
    call = _shapes_call(input_size, grad_output_shape, dtype, align_corners,
                        _checks.optional_scales("scales", scales, 3), layout)
    return _backend.workspace_nbytes(call, backward=True, threads=threads)


def upsample_trilinear_3d(input: np.ndarray, size: int | Sequence[int] | None = None,
                          scale_factor: float | Sequence[float] | None = None,
                          align_corners: bool = False, *, layout: str = "NCDHW",
                          out: np.ndarray | None = None) -> np.ndarray:
    """Resize a volume by trilinear interpolation.

    Parameters
    ----------
    input : ndarray, shape (N, C, Di, Hi, Wi), or (N, Di, Hi, Wi, C) with ``layout="NDHWC"``
        The volume; float16, bfloat16 (``ml_dtypes.bfloat16``), float32 or float64, any strides.
    size : int or (int, int, int), optional
        Output size (Do, Ho, Wo). Exactly one of ``size`` and ``scale_factor`` is given.
    scale_factor : float or (float, float, float), optional
        Per-axis factors; the output size is ``floor(in * scale)`` and the factor itself
        (not the rounded ratio of sizes) maps output to source coordinates.
    align_corners : bool
        True: the corner voxels' centres of input and output coincide (scale factors are
        then ignored for the coordinate map); False: their outer edges do.
    layout : {"NCDHW", "NDHWC"}
        Memory order of ``input`` and of the result.
    out : ndarray, optional
        Where to write the result (C-contiguous in ``layout``, of the result's shape and
        dtype), e.g. the previous step's, so that a loop allocates nothing; it is returned.

    Returns
    -------
    ndarray, shape (N, C, Do, Ho, Wo) (or NDHWC), dtype of ``input``.

    Notes
    -----
    Output index o of an axis reads source coordinate ``ratio * o`` (align_corners) or
    ``max(0, ratio * (o + 0.5) - 0.5)``, with ``ratio = (in - 1) / (out - 1)``,
    ``1 / scale`` or ``in / out`` (docs/semantics.md). Sizes may also shrink. float32 computes in
    float32, evaluating PyTorch's CPU kernel operation for operation; 16-bit inputs are
    computed in float32 and rounded once. float64 coordinates are floored in float64
    (PyTorch floors them in float32, which moves a tap within 2**-24 of an integer).

    Examples
    --------
    >>> import numpy as np, volsample
    >>> volume = np.array([0.0, 1.0]).reshape(1, 1, 1, 1, 2)
    >>> volsample.upsample_trilinear_3d(volume, size=(1, 1, 3), align_corners=True).ravel()
    array([0. , 0.5, 1. ])
    """
    key = None
    if type(input) is np.ndarray:  # a call met before? (as grid_sample_3d's)
        key, prepared = _prepared.lookup(
            "upsample_trilinear_3d", *_prepared.array_key(input), _calls.typed(size),
            _calls.typed(scale_factor), type(align_corners), align_corners, layout,
            _config.get_num_threads())
        if prepared is not None:
            out = prepared.allocate() if out is None else _layout.result(prepared.call, out)[1]
            prepared.kernel.forward_on(input, out)
            return out
    input = _checks.ndarray("input", input)
    call = _calls.upsample(_calls.operand("input", input), size, scale_factor, align_corners,
                           layout)
    written, returned = _layout.result(call, out)
    arrays = _layout.logical(input, call.layout), written
    kernel = _backend.prepare_forward(call, *arrays) if _preparable(key, *arrays) else None
    if kernel is None:  # (a copy, or nothing to compute)
        _backend.forward(call, *arrays)
    else:
        kernel.forward_on(*arrays)
        _prepared.remember(key, _kept(kernel, call, call.output_shape, "output"))
    return returned


def _preparable(key, *arrays) -> bool:
    return key is not None and _backend.preparable(*arrays)


class _Prepared(NamedTuple):
    """A call's prepared kernel (``_cpu.upsample.prepare``), its description (``out``'s
    checks) and its result's allocator (``_layout.allocator``)."""
    kernel: Any
    call: _calls.Upsample
    allocate: Callable[[], np.ndarray]


def _kept(kernel, call, result_shape, name: str) -> _Prepared:
    """The ``_Prepared`` of a call whose result, ``name``, has the logical shape
    ``result_shape``."""
    return _Prepared(kernel, call, _layout.allocator(
        _layout.physical_shape(result_shape, call.layout), call.dtype, name=name))


def upsample_trilinear_3d_backward(grad_output: np.ndarray, input_size: Sequence[int],
                                   align_corners: bool = False,
                                   scales: Sequence[float | None] | None = None, *,
                                   layout: str = "NCDHW") -> np.ndarray:
    """Gradient of ``upsample_trilinear_3d`` with respect to its input.

    Parameters
    ----------
    grad_output : ndarray, shape (N, C, Do, Ho, Wo), or (N, Do, Ho, Wo, C) with ``layout="NDHWC"``
        Gradient of the loss with respect to the forward's result; any supported dtype and strides.
    input_size : (int, int, int, int, int)
        The forward input's logical shape (N, C, Di, Hi, Wi).
    align_corners : bool
        As for the forward.
    scales : None or (float or None, float or None, float or None)
        The forward's scale factors (D, H, W); a None or non-positive entry means that axis
        maps by its sizes, ``in / out``.
    layout : {"NCDHW", "NDHWC"}
        Memory order of ``grad_output`` and of the result.

    Returns
    -------
    ndarray, shape ``input_size`` (or NDHWC), dtype of ``grad_output``.

    Notes
    -----
    The exact adjoint of the forward, computed as the transposed 1-D maps along D, H and
    then W, without atomics: bitwise identical for every thread count. Scales
    inconsistent with the sizes are allowed and never read or write out of bounds; 16-bit
    gradients are accumulated in float32 and rounded once.

    Examples
    --------
    >>> import numpy as np, volsample
    >>> grad = np.ones((1, 1, 1, 1, 3))
    >>> volsample.upsample_trilinear_3d_backward(grad, (1, 1, 1, 1, 2), align_corners=True).ravel()
    array([1.5, 1.5])
    """
    key = None
    if type(grad_output) is np.ndarray:  # a call met before? (as grid_sample_3d's)
        key, prepared = _prepared.lookup(
            "upsample_trilinear_3d_backward", *_prepared.array_key(grad_output),
            _calls.typed(input_size),
            type(align_corners), align_corners, _calls.typed(scales), layout,
            _config.get_num_threads())
        if prepared is not None:
            grad_input = prepared.allocate()
            prepared.kernel.backward_on(grad_output, grad_input)
            return grad_input
    grad_output = _checks.ndarray("grad_output", grad_output)
    call = _calls.upsample_backward(_calls.operand("grad_output", grad_output), input_size,
                                    align_corners, scales, layout)
    grad_input = _layout.empty(call.input_shape, call.dtype, call.layout, name="grad_input")
    arrays = _layout.logical(grad_output, call.layout), grad_input
    kernel = _backend.prepare_backward(call, *arrays) if _preparable(key, *arrays) else None
    if kernel is None:
        _backend.backward(call, *arrays)
    else:
        kernel.backward_on(*arrays)
        _prepared.remember(key, _kept(kernel, call, call.input_shape, "grad_input"))
    return _layout.physical(grad_input, call.layout)
