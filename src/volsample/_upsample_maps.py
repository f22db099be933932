"""Trilinear upsampling's per-axis maps: which input indices each output index reads, with
which weights (SPEC §3), as NumPy arrays, for any backend.

Along one axis the forward is a sparse matrix: output index o reads taps i1 and i0 with
weights l1 and l0 (the kernels compute ``fma(l0, v0, l1 * v1)``, PyTorch's compiled
lerp), or, where the axis keeps its size, the identity. The Triton kernels take their
tables from here, so they need no C++ extension; the C++ kernels compute the same tables
in ``src/cpp/coords.h`` and ``upsample_plan.h`` (``upsample_ratio``, ``upsample_source``,
``upsample_taps``), and ``tests/test_upsample_maps.py`` holds the two equal, bit for bit.

Each value is rounded as the C++ one is. The one fused operation, the source coordinate
``fma(ratio, o + 0.5, -0.5)``, is exact here too: in float32 through float64, where the
product (at most 48 significant bits) and, for products of 0.5 or more, the sum (at most
49) are exact, so the float32 rounding is the only one (a product below 0.5 gives a
negative sum either way, which the clamp to 0 takes); in float64 from the operands'
exact ratios of integers, whose quotient Python rounds correctly.
"""
from __future__ import annotations

import functools

import numpy as np


def ratio(in_size: int, out_size: int, align_corners: bool, scale, dtype) -> np.floating:
    """Input units per output unit along an axis (``upsample_ratio``): a scale factor
    (None or <= 0: none) gives 1 / scale, divided in float64 and then rounded."""
    t = np.dtype(dtype).type
    if align_corners:
        return t(in_size - 1) / t(out_size - 1) if out_size > 1 else t(0)
    if scale is not None and scale > 0:
        return t(1.0 / scale)
    return t(in_size) / t(out_size)


def sources(ratio: np.floating, out_size: int, align_corners: bool) -> np.ndarray:
    """The source coordinate of each output index (``upsample_source``), in ratio's dtype:
    ``ratio * o`` with ``align_corners``, else ``fma(ratio, o + 0.5, -0.5)`` clamped to 0."""
    t = type(ratio)
    o = np.arange(out_size).astype(t)
    if align_corners:
        return ratio * o
    centres = o + t(0.5)  # rounded in the map's dtype, as the C++ T(o) + half
    if t is np.float32:
        with np.errstate(over="ignore"):  # beyond float32: inf, as the fma gives
            src = (np.float64(ratio) * centres.astype(np.float64) - 0.5).astype(np.float32)
    else:
        r, s = float(ratio).as_integer_ratio()
        src = np.array([_fused(r, s, *float(c).as_integer_ratio()) for c in centres],
                       dtype=np.float64)
    return np.where(src < 0, t(0), src)


def _fused(r: int, s: int, a: int, b: int) -> float:
    """(r / s) * (a / b) - 0.5, rounded once (Python's int division is correctly rounded)."""
    return (2 * r * a - s * b) / (2 * s * b)


def taps(src: np.ndarray, in_size: int):
    """(i0, i1, l0, l1) of source coordinates (``upsample_taps``): the low index, clamped
    to the last while still a float, its neighbour, and their weights."""
    t = src.dtype.type
    last = in_size - 1
    low = np.floor(src)
    beyond = low >= t(last)
    i0 = np.where(beyond, last, np.where(beyond, 0, low).astype(np.int64))
    l1 = np.clip(src - i0.astype(t), t(0), t(1))
    return i0, np.where(i0 < last, i0 + 1, i0), t(1) - l1, l1


@functools.lru_cache(maxsize=64)
def axis_map(in_size: int, out_size: int, align_corners: bool, scale, dtype,
             transposed: bool = False):
    """One axis's forward map (``transposed``: the backward's) as CSR arrays ``(starts,
    index, weight)``, read-only, weights in ``dtype`` (float32 or float64): row o of the
    forward holds (i1, l1) then (i0, l0), or the single entry (o, 1) where in == out; rows
    of the transpose list their entries in increasing forward-row order."""
    dtype = np.dtype(dtype)
    if in_size == out_size:
        index = np.arange(out_size, dtype=np.int64)
        starts = np.arange(out_size + 1, dtype=np.int64)
        weight = np.ones(out_size, dtype)
    else:
        i0, i1, l0, l1 = taps(sources(ratio(in_size, out_size, align_corners, scale, dtype),
                                      out_size, align_corners), in_size)
        index = np.stack([i1, i0], axis=1).ravel()
        weight = np.stack([l1, l0], axis=1).ravel().astype(dtype)
        starts = np.arange(0, 2 * out_size + 1, 2, dtype=np.int64)
    if transposed:  # a stable sort by column keeps each column's rows in increasing order
        order = np.argsort(index, kind="stable")
        counts = np.bincount(index, minlength=in_size)
        rows = np.repeat(np.arange(out_size, dtype=np.int64), np.diff(starts))
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        index, weight = rows[order], weight[order]
    for array in (starts, index, weight):
        array.flags.writeable = False
    return starts, index, weight

