"""The C++ upsampling kernels (``src/cpp/upsample.cpp``) behind a checked
``_calls.Upsample``: launch them, and count the scratch they allocate.

Operands are NumPy arrays, volumes as logical (N, C, D, H, W) views of memory in
``call.layout`` (any strides); results are written whole into the caller's arrays, of the
operand's dtype (16-bit data is computed in float32 inside the kernels and rounded once).
The kernels write planes whose rows are dense (``dense_planes``); a result array whose
planes are not is computed into a contiguous copy, then copied in. A call that changes no
spatial size is a copy.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _dtypes, _layout
from . import _kernels, operand, threads_for
from . import preparable as preparable  # the family's contract: whether it may prepare


def _scales(scales) -> tuple[float, ...]:
    return tuple(float(s) if s is not None and s > 0 else 0.0 for s in scales)


def _threads(src_shape, dst_shape, threads) -> int:
    """Voxels of the larger volume are the call's elementary items."""
    if threads is not None:
        return threads
    return threads_for(max(math.prod(src_shape), math.prod(dst_shape)))


def dense_planes(dst: np.ndarray, layout: str) -> bool:
    """Whether the kernels can write ``dst`` (a logical (N, C, D, H, W) view in ``layout``)
    as it is: each plane's rows H, W (and, channels last, C innermost) contiguous in that
    order; the N, C (channels first) and D strides are free."""
    _, C, _, H, W = dst.shape
    step = dst.itemsize
    inner = C if layout == "NDHWC" else 1
    return ((inner == 1 or dst.strides[1] == step) and (W == 1 or dst.strides[4] == inner * step)
            and (H == 1 or dst.strides[3] == W * inner * step))


def _resample(kernel, call, src, dst, threads):
    if dst.size == 0:  # a zero N or C: nothing to compute
        return
    if call.identity:
        np.copyto(dst, src)
        return
    staged = dst if dense_planes(dst, call.layout) else _layout.empty(
        dst.shape, dst.dtype, call.layout, name="the result's contiguous copy")
    kernel(operand(src), operand(staged), call.layout == "NDHWC", call.align_corners,
           _scales(call.scales), _threads(src.shape, dst.shape, threads))
    if staged is not dst:
        np.copyto(dst, staged)


def window(src: np.ndarray, dst: np.ndarray, first, full, align_corners: bool,
           backward: bool = False, layout: str = "NCDHW") -> None:
    """A window of an upsampling's output, the part [first, first + its size) of an
    output of ``full`` points per axis (D, H, W), whose coordinate map it follows: the
    forward ``src`` -> the window ``dst`` (the same bits as that part of the whole
    output), or with ``backward`` the window's gradient ``src`` -> the input's ``dst``
    (the adjoint). Logical (N, C, D, H, W) views of arrays in ``layout``, of one float
    dtype, sizes derived from the sizes (no scales), ``dst`` with dense planes
    (``dense_planes``). Registration's control grids upsample this way over the parts of
    a volume that count."""
    _kernels.upsample_window(operand(src), operand(dst), layout == "NDHWC", align_corners,
                             (0.0, 0.0, 0.0), _threads(src.shape, dst.shape, None),
                             tuple(int(v) for v in first), tuple(int(v) for v in full),
                             backward)


def prepare(call, src, dst, threads=None):
    """A ``_kernels.PreparedUpsample`` of the call from arrays of ``src``'s and ``dst``'s
    shapes, strides and dtypes: ``.forward(src_address, dst_address)`` runs ``forward``'s
    map, ``.backward(...)`` ``backward``'s; None for a call that copies or has nothing to
    compute, or a ``dst`` whose planes the kernels cannot write as they are."""
    if dst.size == 0 or call.identity or not dense_planes(dst, call.layout):
        return None
    return _kernels.PreparedUpsample(operand(src), operand(dst), call.layout == "NDHWC",
                                     call.align_corners, _scales(call.scales),
                                     _threads(src.shape, dst.shape, threads))


prepare_forward = prepare_backward = prepare  # the forward's (input, out), the backward's


def forward(call, input, out, threads=None) -> None:
    """``input`` resampled into ``out`` (the call's output shape)."""
    _resample(_kernels.upsample_forward, call, input, out, threads)


def backward(call, grad_output, grad_input, threads=None) -> None:
    """The forward's adjoint applied to ``grad_output``, into ``grad_input``."""
    _resample(_kernels.upsample_backward, call, grad_output, grad_input, threads)


def workspace_nbytes(call, backward: bool, threads=None, result: np.ndarray | None = None) -> int:
    """Bytes the kernel of the call's forward (or, with ``backward``, of its backward)
    allocates beyond its result: the per-axis tables and each running thread's scratch,
    and the contiguous copy of a ``result`` array (the caller's, when known) whose planes
    are not dense."""
    src, dst = ((call.output_shape, call.input_shape) if backward
                else (call.input_shape, call.output_shape))
    if 0 in dst or call.identity:
        return 0
    double = _dtypes.compute_dtype(call.dtype) == _dtypes.FLOAT64
    staged = 0 if result is None or dense_planes(result, call.layout) else result.nbytes
    return staged + int(_kernels.upsample_workspace_nbytes(
        tuple(src), tuple(dst), double, call.layout == "NDHWC", call.align_corners,
        _scales(call.scales), _threads(src, dst, threads), backward))


def axis_map(in_size, out_size, align_corners, scale, dtype, transposed=False):
    """One axis's forward map (``transposed``: the backward's) as CSR arrays ``(starts,
    index, weight)``, weights in ``dtype`` (float32 or float64): row o of the forward
    holds (i1, l1) then (i0, l0), or the single entry (o, 1) where in == out; rows of the
    transpose list their entries in increasing forward-row order: the tables the C++
    kernels use, which ``tests/test_upsample_maps.py`` holds against the GPU backend's
    (``volsample._upsample_maps``), bit for bit."""
    return _kernels.upsample_axis_map(in_size, out_size, align_corners, float(scale or 0.0),
                                      np.dtype(dtype) == _dtypes.FLOAT64, transposed)
