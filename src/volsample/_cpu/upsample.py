"""Launchers of the C++ upsampling kernels (``src/cpp/upsample.cpp``): allocate the
result, hand the operands over, and count the scratch the kernels allocate.

Arguments come checked, volumes as logical (N, C, D, H, W) views of arrays stored in
``layout``; ``scales`` are the forward's three scale factors (None or <= 0: none). A call
that changes no spatial size is the caller's copy. Results are new arrays contiguous in
``layout``, of the operand's dtype (16-bit data is computed in float32 inside the kernels
and rounded once).
"""
from __future__ import annotations

import numpy as np

from .. import _dtypes, _layout
from . import _kernels, operand


def _scales(scales) -> tuple[float, float, float]:
    return tuple(float(s) if s is not None and s > 0 else 0.0 for s in scales)


def _resample(kernel, src, dst_shape, align_corners, scales, layout, threads):
    dst = _layout.empty(dst_shape, src.dtype, layout)
    kernel(operand(src), operand(dst), layout == "NDHWC", align_corners, _scales(scales),
           threads)
    return dst


def forward(input, output_shape, align_corners, scales, layout, threads):
    """``input`` resampled to logical ``output_shape`` (the same N, C)."""
    return _resample(_kernels.upsample_forward, input, output_shape, align_corners, scales,
                     layout, threads)


def backward(grad_output, input_shape, align_corners, scales, layout, threads):
    """The forward's adjoint applied to ``grad_output``: the gradient of logical shape
    ``input_shape``."""
    return _resample(_kernels.upsample_backward, grad_output, input_shape, align_corners,
                     scales, layout, threads)


def workspace_nbytes(src_shape, dst_shape, dtype, align_corners, scales, layout, threads,
                     backward):
    """Bytes the kernel of one call (``forward`` or, with ``backward``, ``backward``)
    from logical ``src_shape`` to ``dst_shape`` allocates beyond its result: the per-axis
    tables and each running thread's scratch."""
    double = _dtypes.compute_dtype(dtype) == _dtypes.FLOAT64
    return int(_kernels.upsample_workspace_nbytes(
        tuple(src_shape), tuple(dst_shape), double, layout == "NDHWC", align_corners,
        _scales(scales), threads, backward))


def axis_map(in_size, out_size, align_corners, scale, dtype, transposed=False):
    """One axis's forward map (``transposed``: the backward's) as CSR arrays ``(starts,
    index, weight)``, weights in ``dtype`` (float32 or float64): row o of the forward
    holds (i1, l1) then (i0, l0), or the single entry (o, 1) where in == out; rows of the
    transpose list their entries in increasing forward-row order. The GPU backend takes
    its tables from here, so both compute the same coordinates and weights."""
    return _kernels.upsample_axis_map(in_size, out_size, align_corners, float(scale or 0.0),
                                      np.dtype(dtype) == _dtypes.FLOAT64, transposed)
