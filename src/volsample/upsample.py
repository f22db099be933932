"""Trilinear 3-D upsampling: ``upsample_trilinear_3d`` and its backward,
``upsample_trilinear_3d_backward``.

The NumPy front door of the operator family of ``torch.nn.functional.interpolate`` with
``mode="trilinear"`` and of CANN's ``aclnnUpsampleTrilinear3dBackward``. Semantics: SPEC §3.
Both directions apply one 1-D map per axis (the C++ kernels, ``src/cpp/upsample.cpp``);
a volume whose spatial size does not change is copied.
"""
from __future__ import annotations

import math

import numpy as np

from . import _checks, _config, _layout
from ._cpu import upsample as _kernels


def _identity(src_shape, dst_shape):
    """Whether no spatial size changes (the call is then a copy)."""
    return tuple(src_shape[2:]) == tuple(dst_shape[2:])


def _work(src_shape, dst_shape):
    """Elementary items of a call, for ``_config.threads_for``: voxels of the larger volume."""
    return max(math.prod(src_shape), math.prod(dst_shape))


def _resample(src, dst_shape, align_corners, scales, layout, transposed):
    """The logical volume ``src`` mapped to a new logical volume of ``dst_shape`` in
    ``layout``, of ``src``'s dtype: by the forward's maps, or with ``transposed`` by their
    adjoints."""
    if 0 in dst_shape:  # a zero N or C: nothing to compute
        return _layout.empty(dst_shape, src.dtype, layout)
    if _identity(src.shape, dst_shape):
        out = _layout.empty(dst_shape, src.dtype, layout)
        np.copyto(out, src)
        return out
    threads = _config.threads_for(_work(src.shape, dst_shape))
    launch = _kernels.backward if transposed else _kernels.forward
    return launch(src, dst_shape, align_corners, scales, layout, threads)


def _workspace_nbytes(input_shape, output_shape, dtype, align_corners, scales, layout,
                      threads, backward):
    """Scratch bytes of the forward from logical ``input_shape`` to ``output_shape``, or
    with ``backward`` of its adjoint; mirrors ``_resample``."""
    src_shape, dst_shape = (output_shape, input_shape) if backward else (input_shape, output_shape)
    if 0 in dst_shape or _identity(src_shape, dst_shape):
        return 0
    threads = threads or _config.threads_for(_work(src_shape, dst_shape))
    return _kernels.workspace_nbytes(src_shape, dst_shape, dtype, align_corners, scales, layout,
                                     threads, backward)


def forward_workspace_nbytes(input_shape, output_size, dtype, align_corners=False,
                            scale_factor=None, *, layout="NCDHW", threads=None):
    """Bytes of scratch memory ``upsample_trilinear_3d`` allocates beyond its result.

    ``input_shape`` is logical (N, C, Di, Hi, Wi) and ``output_size`` (Do, Ho, Wo); the
    other arguments are the call's (``threads``: the threads it runs on, by default as
    many as the call would take now).
    It counts the float32 copies of a 16-bit input and result, the per-axis tables, and
    each running thread's scratch (bands of rows of planes, sized to stay in L2).
    """
    input_shape = tuple(int(v) for v in input_shape)
    output_shape = input_shape[:2] + tuple(int(v) for v in output_size)
    scales = (None,) * 3 if scale_factor is None else _checks.scale_factors(
        "scale_factor", scale_factor, 3)
    return _workspace_nbytes(input_shape, output_shape, dtype, align_corners, scales,
                             _checks.layout_name(layout), threads, backward=False)


def backward_workspace_nbytes(grad_output_shape, input_size, dtype, align_corners=False,
                              scales=None, *, layout="NCDHW", threads=None):
    """Bytes of scratch memory ``upsample_trilinear_3d_backward`` allocates beyond its result.

    ``grad_output_shape`` is logical (N, C, Do, Ho, Wo) and ``input_size`` (N, C, Di, Hi,
    Wi); the other arguments are the call's (``threads``: the threads it runs on, by
    default as many as the call would take now). It counts the per-axis tables and
    each running thread's scratch planes (16-bit data is read and written in place).
    """
    return _workspace_nbytes(tuple(int(v) for v in input_size),
                             tuple(int(v) for v in grad_output_shape), dtype, align_corners,
                             _checks.optional_scales("scales", scales, 3),
                             _checks.layout_name(layout), threads, backward=True)


def upsample_trilinear_3d(input, size=None, scale_factor=None, align_corners=False,
                          *, layout="NCDHW"):
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

    Returns
    -------
    ndarray, shape (N, C, Do, Ho, Wo) (or NDHWC), dtype of ``input``.

    Notes
    -----
    Output index o of an axis reads source coordinate ``ratio * o`` (align_corners) or
    ``max(0, ratio * (o + 0.5) - 0.5)``, with ``ratio = (in - 1) / (out - 1)``,
    ``1 / scale`` or ``in / out`` (SPEC §3). Sizes may also shrink. float32 computes in
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
    layout = _checks.layout_name(layout)
    align_corners = _checks.boolean("align_corners", align_corners)
    input = _checks.array("input", input, 5)
    volume = _layout.logical(input, layout)
    _checks.nonempty_spatial("input", volume.shape[2:])
    out_spatial, scales = _checks.upsample_output_size(volume.shape[2:], size, scale_factor)
    out = _resample(volume, volume.shape[:2] + out_spatial, align_corners, scales, layout,
                    transposed=False)
    return _layout.physical(out, layout)


def upsample_trilinear_3d_backward(grad_output, input_size, align_corners=False, scales=None,
                                   *, layout="NCDHW"):
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
    layout = _checks.layout_name(layout)
    align_corners = _checks.boolean("align_corners", align_corners)
    grad_output = _checks.array("grad_output", grad_output, 5)
    input_size = _checks.int_sequence("input_size", input_size, 5, 0)
    _checks.nonempty_spatial("input_size", input_size[2:])
    scales = _checks.optional_scales("scales", scales, 3)
    gout = _layout.logical(grad_output, layout)
    if gout.shape[:2] != input_size[:2]:
        raise _checks.InvalidArgumentError(
            f"grad_output: expected N, C = {input_size[:2]} (those of input_size), got logical "
            f"shape {gout.shape} ({layout})")
    _checks.nonempty_spatial("grad_output", gout.shape[2:])
    grad_input = _resample(gout, input_size, align_corners, scales, layout, transposed=True)
    return _layout.physical(grad_input, layout)
