"""Triton GPU kernels, one module per operator family (``grid_sample``, ``upsample``).

Launchers take the backends' contract (the C++ backend's, ``volsample._cpu``): a checked
description from ``volsample._calls`` and torch tensors in logical (N, C, D, H, W) order
with any strides; kernels address every operand through its strides, so views cost no
copy. Results are the caller's tensors (the front doors allocate them in the input's
memory format: NCDHW, or channels_last_3d), written whole; ``workspace_nbytes`` counts the
scratch a call allocates beyond them. Nothing here needs the C++ extension.

Tiling, shared by every kernel: one program per block of BLOCK_P spatial points of one
batch item; channels go in chunks of BLOCK_C. In NCDHW the points are the contiguous
direction, so chunks are small; in channels_last_3d the channels are, so one chunk spans
many channels and a load reads a point's channels together, while the per-point work
(coordinates, weights, offsets) is done once for the whole chunk.

Index width: offsets are formed in int32 unless some tensor or count a kernel touches
reaches 2**31 elements; then kernels get ``INDEX=tl.int64`` and form them in int64.

This module holds what the families share: those host-side choices, the compute dtype,
and two small @triton.jit addressing helpers.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .._torch_formats import is_channels_last, memory_format

_INT32_LIMIT = 2**31

# Options of every launch. No fused multiply-adds beyond those written as tl.fma: each
# operation rounds as it does in the CPU kernels (built with -ffp-contract=off).
LAUNCH = dict(enable_fp_fusion=False)

_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16,
              torch.float32: tl.float32, torch.float64: tl.float64}


def on_device_of(t: torch.Tensor):
    """A context with the CUDA device of ``t`` current (none for a CPU tensor): Triton and
    torch launch their kernels on the current device."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def new_volume(shape, dtype, like: torch.Tensor, zero: bool = False) -> torch.Tensor:
    """A dense 5-D tensor of logical ``shape`` in the memory format of ``like``."""
    t = torch.empty(tuple(shape), dtype=dtype, device=like.device,
                    memory_format=memory_format(like))
    return t.zero_() if zero else t


def point_strides(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(batch, channel, point) strides of a volume whose (D, H, W) points lie at one
    stride in their flat order (a dense volume of either memory format, or a view like
    one): the element offset of (n, c, flat spatial index q) is n * sN + c * sC + q * sQ,
    as the kernels write their results. None for a volume whose points do not."""
    _, _, D, H, W = t.shape
    sN, sC, sD, sH, sW = t.stride()
    sQ = sW if W > 1 else sH if H > 1 else sD
    if (H > 1 and sH != W * sQ) or (D > 1 and sD != H * W * sQ):
        return None
    return sN, sC, sQ


def writable_volume(out: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``out``, a caller's result, if the kernels can write it as it is
    (``point_strides``), else a dense volume in its memory format (for ``written``), and
    the (batch, channel, point) strides the kernels write it at."""
    strides = point_strides(out)
    if strides is None:
        out = new_volume(out.shape, out.dtype, out)
        strides = point_strides(out)
        assert strides is not None  # a dense volume's points lie at one stride
    return out, strides


def written(computed: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` holds the result ``computed`` into it or into a stand-in for it (a dense
    copy, a higher-precision accumulator): copied in, rounded where its dtype is narrower."""
    if computed is not out:
        out.copy_(computed)


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 if any operand is float64, else float32 (16-bit data computes in float32)."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def tl_dtype(dtype: torch.dtype):
    return _TL_DTYPES[dtype]


def _max_offset(t: torch.Tensor) -> int:
    """One past the largest element offset ``t`` reaches from its first element."""
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))


def index_dtype(*tensors: torch.Tensor, counts=()):
    """tl.int64 if any offset within ``tensors``, or any of ``counts``, reaches 2**31."""
    largest = max([_max_offset(t) for t in tensors if t.numel()] + [int(c) for c in counts] + [0])
    return tl.int64 if largest >= _INT32_LIMIT else tl.int32


def tile(channels: int, max_block_c: int, elements: int) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_C) for a tile of about ``elements`` values, with up to
    ``max_block_c`` channels (launchers allow many for channels_last_3d, few for NCDHW)."""
    block_c = min(triton.next_power_of_2(max(channels, 1)), max_block_c)
    return max(4, elements // block_c), block_c


@triton.jit
def divmod_index(x, d):
    """(x // d, x % d) of non-negative integers x and a positive d. In int32, the GPU's
    inline division. In int64, no 64-bit division (a subroutine call on NVIDIA GPUs): a
    float64 quotient from a refined reciprocal, corrected by one; exact for x < 2**50."""
    if x.dtype == tl.int64:
        fd = tl.cast(d, tl.float64)
        inverse = tl.cast(1.0 / tl.cast(d, tl.float32), tl.float64)  # about 2**-22 off
        inverse = tl.fma(inverse, tl.fma(-fd, inverse, 1.0), inverse)  # Newton: 2**-44
        inverse = tl.fma(inverse, tl.fma(-fd, inverse, 1.0), inverse)  # to rounding
        q = tl.cast(tl.cast(x, tl.float64) * inverse, tl.int64)  # off by at most 1
        r = x - q * d
        q = tl.where(r < 0, q - 1, tl.where(r >= d, q + 1, q))
        # the remainder of the corrected quotient, not corrected alike: the comparisons
        # would live on until the remainder is used, and ptxas spills them
        return q, x - q * d
    return x // d, x % d


@triton.jit
def split_spatial(q, H, W):
    """(d, h, w) of flat spatial indices ``q`` of a (D, H, W) volume."""
    t, w = divmod_index(q, W)
    d, h = divmod_index(t, H)
    return d, h, w


@triton.jit
def block_of_points(block, S, BLOCK_P: tl.constexpr, INDEX: tl.constexpr):
    """Batch item n, flat spatial indices q and their mask of the ``block``-th block of
    points (an int32 program number): the S points of each batch item are cut in blocks
    of BLOCK_P. A launch has fewer than 2**31 blocks, so n and the block's place divide
    in int32."""
    blocks = tl.cdiv(S, BLOCK_P).to(tl.int32)
    n = (block // blocks).to(INDEX)
    q = (block % blocks).to(INDEX) * BLOCK_P + tl.arange(0, BLOCK_P).to(INDEX)
    return n, q, q < S


def programs(batch: int, points: int, block_p: int, chunks: int = 1) -> tuple[int]:
    """The launch grid of one program per block of points (and channel chunk)."""
    return (batch * triton.cdiv(points, block_p) * chunks,)
