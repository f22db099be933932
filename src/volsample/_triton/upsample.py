"""Triton kernels for trilinear upsampling (SPEC §3), forward and backward.

Along one axis the forward is a sparse matrix: output index o reads taps i1 and i0 with
weights l1 and l0 (or, where the axis keeps its size, is the identity). The matrices come
from ``volsample._upsample_maps``, whose tables are the C++ core's bit for bit, so both
backends use the same coordinates and weights; its transposed form gives the backward's,
each input index listing its outputs in increasing order.

Forward: one program per block of output points reads the 8 taps and evaluates
PyTorch's nested lerp ``fma(l0, v0, l1 * v1)`` along W, then H, then D.

Backward: separable, as three 1-D adjoint passes (W, H, then D) through float32 scratch
for 16-bit data. In each, every destination element gathers the few source elements of
its row of the transposed matrix, in the row's order: no atomics and no zero-filling,
so the result is bitwise reproducible whatever ``deterministic`` says, and it is the
fast path too.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl

from .._upsample_maps import axis_map
from . import (LAUNCH, block_of_points, compute_dtype, index_dtype, is_channels_last,
               memory_format, new_volume, on_device_of, point_strides, programs,
               split_spatial, tile, tl_dtype, writable_volume, written)

_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def _matrices(sizes_in, sizes_out, align_corners, scales, compute, device, transposed):
    """Per spatial axis (D, H, W) the forward's CSR matrix (or, ``transposed``, its
    transpose) as device tensors (starts, index, weight); None where in == out."""
    host = []
    scales = scales or (None, None, None)
    for n_in, n_out, scale in zip(sizes_in, sizes_out, scales):
        if n_in == n_out:
            host.append(None)
            continue
        host.append(axis_map(n_in, n_out, align_corners, scale, _NUMPY[compute], transposed))
    # One copy to the device for all the integers, one for all the weights.
    present = [m for m in host if m is not None]
    ints = torch.from_numpy(np.concatenate([a for m in present for a in m[:2]])).to(device)
    floats = torch.from_numpy(np.concatenate([m[2] for m in present])).to(device)
    out, i, f = [], 0, 0
    for m in host:
        if m is None:
            out.append(None)
            continue
        starts, index, weight = m
        out.append((ints[i:i + starts.size], ints[i + starts.size:i + starts.size + index.size],
                    floats[f:f + weight.size]))
        i += starts.size + index.size
        f += weight.size
    return out


@triton.jit
def _taps(index, weight, o, mask, IDENTITY: tl.constexpr):
    """Taps (i0, i1) and weights (l0, l1) of output indices o along one axis: row o of a
    forward matrix holds (i1, l1) then (i0, l0). The identity gives (o, o) and no weights."""
    if IDENTITY:
        i0 = o
        i1 = o
        l0 = 0.0
        l1 = 0.0
    else:
        i1 = tl.load(index + 2 * o, mask=mask, other=0)
        i0 = tl.load(index + 2 * o + 1, mask=mask, other=0)
        l1 = tl.load(weight + 2 * o, mask=mask, other=0.0)[:, None]
        l0 = tl.load(weight + 2 * o + 1, mask=mask, other=0.0)[:, None]
    return i0, i1, l0, l1


@triton.jit
def _lerp(v0, v1, l0, l1):
    """One axis of the forward, rounded as PyTorch's compiled lerp rounds it."""
    return tl.fma(l0, v0, l1 * v1)


@triton.jit
def _row(at, x0, x1, lx0, lx1, mask, COMPUTE: tl.constexpr, ID_W: tl.constexpr):
    """Lerp along W of one (z, y) row; ``at`` points at its start, x0/x1 are tap offsets."""
    value = tl.load(at + x0, mask=mask, other=0.0).to(COMPUTE)
    if not ID_W:
        value = _lerp(value, tl.load(at + x1, mask=mask, other=0.0).to(COMPUTE), lx0, lx1)
    return value


@triton.jit
def _plane(at, y0, y1, ly0, ly1, x0, x1, lx0, lx1, mask, COMPUTE: tl.constexpr,
           ID_H: tl.constexpr, ID_W: tl.constexpr):
    """Lerp along W, then H, of one z plane; ``at`` points at its start."""
    value = _row(at + y0, x0, x1, lx0, lx1, mask, COMPUTE, ID_W)
    if not ID_H:
        value = _lerp(value, _row(at + y1, x0, x1, lx0, lx1, mask, COMPUTE, ID_W), ly0, ly1)
    return value


@triton.jit
def _forward_kernel(inp, out, index_d, weight_d, index_h, weight_h, index_w, weight_w,
                    C, S, Ho, Wo, siN, siC, siD, siH, siW, soN, soC, soQ,
                    ID_D: tl.constexpr, ID_H: tl.constexpr, ID_W: tl.constexpr,
                    COMPUTE: tl.constexpr, INDEX: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[n, c, q] from the 8 taps of output point q; one program per BLOCK_P points."""
    n, q, pmask = block_of_points(tl.program_id(0), S, BLOCK_P, INDEX)
    od, oh, ow = split_spatial(q, Ho, Wo)
    z0, z1, lz0, lz1 = _taps(index_d, weight_d, od, pmask, ID_D)
    y0, y1, ly0, ly1 = _taps(index_h, weight_h, oh, pmask, ID_H)
    x0, x1, lx0, lx1 = _taps(index_w, weight_w, ow, pmask, ID_W)
    z0 = (z0.to(INDEX) * siD)[:, None]
    z1 = (z1.to(INDEX) * siD)[:, None]
    y0 = (y0.to(INDEX) * siH)[:, None]
    y1 = (y1.to(INDEX) * siH)[:, None]
    x0 = (x0.to(INDEX) * siW)[:, None]
    x1 = (x1.to(INDEX) * siW)[:, None]
    for c0 in range(0, C, BLOCK_C):
        c = (c0 + tl.arange(0, BLOCK_C)).to(INDEX)
        mask = pmask[:, None] & (c < C)[None, :]
        at = inp + n * siN + c[None, :] * siC
        value = _plane(at + z0, y0, y1, ly0, ly1, x0, x1, lx0, lx1, mask, COMPUTE, ID_H, ID_W)
        if not ID_D:
            p1 = _plane(at + z1, y0, y1, ly0, ly1, x0, x1, lx0, lx1, mask, COMPUTE, ID_H, ID_W)
            value = _lerp(value, p1, lz0, lz1)
        tl.store(out + n * soN + q[:, None] * soQ + c[None, :] * soC,
                 value.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _adjoint_pass_kernel(src, dst, starts, index, weight,
                         C, S, H, W, CHUNKS, ssN, ssC, ssD, ssH, ssW, sdN, sdC, sdQ,
                         AXIS: tl.constexpr, COMPUTE: tl.constexpr, INDEX: tl.constexpr,
                         BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst = M^T src along logical axis AXIS (2, 3 or 4): dst element i of a line gathers
    the src elements of row i of the transposed matrix (starts, index, weight), in order.
    One program per BLOCK_P dst points of (D, H, W) and BLOCK_C channels."""
    pid = tl.program_id(0)
    n, q, pmask = block_of_points(pid // CHUNKS, S, BLOCK_P, INDEX)
    c = (pid % CHUNKS) * BLOCK_C + tl.arange(0, BLOCK_C).to(INDEX)
    mask = pmask[:, None] & (c < C)[None, :]
    d, h, w = split_spatial(q, H, W)
    at = src + n * ssN + c[None, :] * ssC
    if AXIS == 2:
        i = d
        line = h * ssH + w * ssW
        step = ssD
    elif AXIS == 3:
        i = h
        line = d * ssD + w * ssW
        step = ssH
    else:
        i = w
        line = d * ssD + h * ssH
        step = ssW
    first = tl.load(starts + i, mask=pmask, other=0).to(INDEX)
    end = tl.load(starts + i + 1, mask=pmask, other=0).to(INDEX)
    # -0.0 makes the first fma a plain product, as the CPU computes it; a row without
    # entries is written as +0.
    acc = tl.full((BLOCK_P, BLOCK_C), -0.0, COMPUTE)
    for j in range(tl.max(end - first)):
        k = first + j
        m = k < end
        o = tl.load(index + k, mask=m, other=0).to(INDEX)
        wk = tl.load(weight + k, mask=m, other=0.0)
        v = tl.load(at + (line + o * step)[:, None], mask=mask & m[:, None], other=0.0)
        acc = tl.where(m[:, None], tl.fma(wk[:, None], v.to(COMPUTE), acc), acc)
    acc = tl.where((end > first)[:, None], acc, 0.0)
    tl.store(dst + n * sdN + q[:, None] * sdQ + c[None, :] * sdC, acc.to(dst.dtype.element_ty),
             mask=mask)


class PreparedUpsample:
    """An upsampling call prepared (``prepare``) for a source and a destination of the same
    shapes, strides, dtypes and device, as the C++ core's: the per-axis tables on the
    device, and each pass's launch grid, integer arguments, constexprs and tile, worked
    out once. Prepared for one map (``prepare_forward``'s, source the input, or
    ``prepare_backward``'s adjoint, source grad_output), it runs that map, whether asked
    through ``forward_on`` or ``backward_on`` (the C++ core's object runs both)."""

    __slots__ = ("dense", "compute", "passes")

    def __init__(self, call, src, dst, backward: bool) -> None:
        self.compute = compute_dtype(src.dtype)
        target, strides = writable_volume(dst)
        self.dense = target is dst  # else computed into a dense copy
        sizes_in, sizes_out = ((call.input_shape, src.shape) if backward
                               else (src.shape, call.output_shape))
        maps = _matrices(sizes_in[2:], sizes_out[2:], call.align_corners, call.scales,
                         self.compute, src.device, transposed=backward)
        self.passes = (_adjoint_passes(src, target, maps, call.input_shape, self.compute)
                       if backward else [_forward_pass(src, target, strides, maps, self.compute)])

    def forward_on(self, src, dst) -> None:
        target = dst if self.dense else new_volume(dst.shape, dst.dtype, dst)
        first = src
        with on_device_of(src):
            for kernel, launch, tables, ints, consts, scratch in self.passes:
                out = target if scratch is None else new_volume(scratch, self.compute, first)
                kernel[launch](src, out, *tables, *ints, **consts)
                src = out
        written(target, dst)

    backward_on = forward_on  # (the map prepared)


def preparable(*tensors) -> bool:
    """Whether a call on tensors like these may be prepared: always (the launchers take any
    strides, and stage a result they cannot write as it is)."""
    return True


def prepare(call, src, dst) -> PreparedUpsample | None:
    """The call's forward (``src`` the input, ``dst`` the output) prepared for tensors of
    these shapes, strides, dtypes and device; None for a call that copies or has nothing
    to compute."""
    if dst.numel() == 0 or call.identity:
        return None
    return PreparedUpsample(call, src, dst, backward=False)


prepare_forward = prepare


def prepare_backward(call, src, dst) -> PreparedUpsample | None:
    """The call's backward (``src`` grad_output, ``dst`` grad_input), as ``prepare``."""
    if dst.numel() == 0 or call.identity:
        return None
    return PreparedUpsample(call, src, dst, backward=True)


def forward(call, input, out) -> None:
    """Trilinear resize of ``input`` (N, C, Di, Hi, Wi) into ``out`` (N, C, Do, Ho, Wo, the
    input's dtype) as the checked ``call`` (a ``_calls.Upsample``) says: SPEC §3.
    ``call.scales`` holds the per-axis scale factors (D, H, W), None where the sizes
    define the ratio."""
    _run(prepare_forward(call, input, out), input, out)


def backward(call, grad_output, grad_input) -> None:
    """The gradient of ``forward`` with respect to its input, into ``grad_input``
    (``call.input_shape``, grad_output's dtype): SPEC §3. A gather, no atomics: bitwise
    reproducible, whatever ``volsample.set_deterministic`` says."""
    _run(prepare_backward(call, grad_output, grad_input), grad_output, grad_input)


def _run(prepared, src, dst) -> None:
    if prepared is not None:
        prepared.forward_on(src, dst)
    elif dst.numel():  # a call that keeps every size: a copy
        dst.copy_(src)


def _forward_pass(src, target, strides, maps, compute):
    """The forward's launch: (kernel, launch grid, tables, integer arguments, constexprs,
    None: it writes the result)."""
    N, C, Do, Ho, Wo = target.shape
    unused = (src.new_empty(0, dtype=torch.int64), src.new_empty(0, dtype=compute))
    tables = [t for m in maps for t in (unused if m is None else m[1:])]
    S = Do * Ho * Wo
    block_p, block_c = tile(C, 32, 256) if is_channels_last(src) else (256, 1)
    consts = dict(ID_D=maps[0] is None, ID_H=maps[1] is None, ID_W=maps[2] is None,
                  COMPUTE=tl_dtype(compute), INDEX=index_dtype(src, target),
                  BLOCK_P=block_p, BLOCK_C=block_c, **LAUNCH)
    return (_forward_kernel, programs(N, S, block_p), tables,
            (C, S, Ho, Wo, *src.stride(), *strides), consts, None)


def _adjoint_passes(src, target, maps, input_size, compute):
    """The backward's launches, one 1-D adjoint pass per resized axis (W, H, then D), each
    as ``_forward_pass``'s, with the shape of the compute-dtype volume it writes (None: the
    last, into the result). The intermediates' strides are read from stand-ins on the meta
    device (the volumes a run allocates have the same)."""
    axes = [axis for axis in (4, 3, 2) if maps[axis - 2] is not None]
    passes = []
    for axis in axes:
        shape = None if axis == axes[-1] else _pass_shape(src.shape, axis, input_size)
        dst = target if shape is None else torch.empty(
            shape, dtype=compute, device="meta", memory_format=memory_format(src))
        passes.append(_adjoint_pass(src, dst, axis, maps[axis - 2]) + (shape,))
        src = dst
    return passes


def _pass_shape(shape, axis, input_size):
    """The shape after the adjoint pass along ``axis``: that axis at the input's size."""
    shape = list(shape)
    shape[axis] = input_size[axis]
    return tuple(shape)


def workspace_nbytes(call, backward: bool, result=None) -> int:
    """Bytes of device memory the forward of ``call`` (or, with ``backward``, its backward)
    allocates beyond its result: the per-axis tables, the backward's intermediate volumes
    (one per resized axis but the last, in the compute dtype), and the dense copy of a
    ``result`` (the caller's, when known) that the kernels cannot write as it is."""
    src, dst = ((call.output_shape, call.input_shape) if backward
                else (call.input_shape, call.output_shape))
    if 0 in dst or src == dst:
        return 0
    compute = np.dtype(np.float64 if np.dtype(call.dtype) == np.float64 else np.float32)
    total = 0 if result is None or point_strides(result) is not None else (
        result.numel() * result.element_size())
    shape = list(src)
    resized = [axis for axis in (4, 3, 2) if src[axis] != dst[axis]]
    for axis in resized:
        # a row per result index; two entries per output index (of the forward)
        entries = 2 * (src[axis] if backward else dst[axis])
        total += (dst[axis] + 1) * 8 + entries * (8 + compute.itemsize)
        if backward and axis != resized[-1]:
            shape[axis] = dst[axis]
            total += math.prod(shape) * compute.itemsize
    return total


def _adjoint_pass(src, dst, axis, matrix):
    """The launch of ``_adjoint_pass_kernel``, dst = M^T src along ``axis``: (kernel,
    launch grid, tables, integer arguments, constexprs)."""
    N, C, D, H, W = dst.shape
    S = D * H * W
    block_p, block_c = tile(C, 32, 512) if is_channels_last(dst) else (512, 1)
    chunks = triton.cdiv(C, block_c)
    strides = point_strides(dst)  # dst is: the result (as the kernels write it), or dense
    consts = dict(AXIS=axis, COMPUTE=tl_dtype(compute_dtype(src.dtype, dst.dtype)),
                  INDEX=index_dtype(src, dst), BLOCK_P=block_p, BLOCK_C=block_c, **LAUNCH)
    return (_adjoint_pass_kernel, programs(N, S, block_p, chunks), matrix,
            (C, S, H, W, chunks, *src.stride(), *strides), consts)
