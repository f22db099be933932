"""Numba CPU kernels for trilinear upsampling, forward and backward.

Trilinear weights are separable: along each axis the forward is a sparse matrix with two
entries per output index (taps i1, i0 with weights l1, l0; one entry (o, 1) where the
axis keeps its size), and the backward applies the transposes. The matrices are built
once per call (``tables``) from the coordinate maths in ``_coords``; the kernels only
combine rows, planes and channel vectors with those weights, in one parallel sweep over
the destination planes:

- ``forward`` maps the (at most two) source planes of each output plane along W and then
  H into scratch, once per plane and work item, and combines them along D: W runs on the
  smallest data, and each voxel is PyTorch's nested evaluation ``fma(lz0, .., lz1 * ..)``
  over ``fma(ly0, .., ..)`` over ``fma(lx0, v0, lx1 * v1)``, operation for operation;
- ``backward`` combines, for each input plane, the gradient planes of its D row into
  scratch, then maps it along H and W (the costly W gather on the smallest data).

Determinism: a work item owns whole destination planes and everything it writes is its
own; each destination value is a sum over matrix rows in a fixed order. No atomics, and
the bits do not depend on the thread count or on which thread runs which item.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .._coords import fma, typed, upsample_ratio, upsample_source, upsample_taps
from ._memory import flat


@njit(cache=True)
def axis_matrix(in_size, out_size, align_corners, scale, like):
    """The forward along one axis as a sparse (out_size x in_size) matrix in CSR form, in
    the floating type of ``like``: row o holds (i1, l1) then (i0, l0), or, where
    in == out, the single entry (o, 1) of the identity.

    In that order the kernels compute ``fma(l0, v0, l1 * v1)``, the very operations of
    PyTorch's compiled lerp.
    """
    per_row = 1 if in_size == out_size else 2
    starts = np.empty(out_size + 1, np.int64)
    index = np.empty(per_row * out_size, np.int64)
    weight = np.empty(per_row * out_size, type(like))
    ratio = upsample_ratio(in_size, out_size, align_corners, scale, like)
    starts[0] = 0
    for o in range(out_size):
        k = per_row * o
        starts[o + 1] = k + per_row
        if per_row == 1:
            index[k], weight[k] = o, typed(1, like)
        else:
            i0, i1, l0, l1 = upsample_taps(upsample_source(ratio, o, align_corners), in_size)
            index[k], index[k + 1] = i1, i0
            weight[k], weight[k + 1] = l1, l0
    return starts, index, weight


@njit(cache=True)
def transpose(starts, index, weight, n_cols):
    """CSR transpose by a stable counting sort: each new row lists its entries in
    increasing old-row order, and within an old row in the old order."""
    t_starts = np.zeros(n_cols + 1, np.int64)
    for k in range(index.shape[0]):
        t_starts[index[k] + 1] += 1
    for col in range(n_cols):
        t_starts[col + 1] += t_starts[col]
    t_index = np.empty_like(index)
    t_weight = np.empty_like(weight)
    for row in range(starts.shape[0] - 1):
        for k in range(starts[row], starts[row + 1]):
            at = t_starts[index[k]]  # next free slot of the new row; advances as it fills
            t_index[at] = row
            t_weight[at] = weight[k]
            t_starts[index[k]] = at + 1
    for col in range(n_cols, 0, -1):  # each row's pointer now sits at the next row's start
        t_starts[col] = t_starts[col - 1]
    t_starts[0] = 0
    return t_starts, t_index, t_weight


@njit(cache=True)
def taps(starts, index, weight, pad):
    """A CSR matrix as dense tap-major tables ``(index, weight)`` of shape (K, rows), K the
    longest row: ``index[k, r]`` is row r's k-th entry. Shorter rows are padded with
    entries (``pad``, 0), which must read a zero."""
    rows = starts.shape[0] - 1
    K = 0
    for r in range(rows):
        K = max(K, starts[r + 1] - starts[r])
    t_index = np.full((K, rows), pad, np.int64)
    t_weight = np.zeros((K, rows), weight.dtype)
    for r in range(rows):
        for k in range(starts[r], starts[r + 1]):
            t_index[k - starts[r], r] = index[k]
            t_weight[k - starts[r], r] = weight[k]
    return t_index, t_weight


# The helpers below write contiguous scratch or dst runs. Positions are cast to unsigned:
# Numba then omits its negative-index wraparound, and without that branch LLVM vectorises
# the inner loops. The first entry of a row is stored as a product and later ones are
# fused in, so a row of entries (i1, l1), (i0, l0) yields fma(l0, v0, l1 * v1).


@njit(cache=True)
def _gather_w(src, base, s_h, s_w, s_c, out, o_base, rows_h, inner, w_taps):
    """``out[o_base + (h, x, i)]`` (contiguous) = the W map applied to the plane of src at
    ``base`` with strides ``s_h``, ``s_w``, ``s_c``: whole channel vectors gathered along
    W. The map comes as ``taps`` tables; one tap at a time over a whole row is what
    LLVM vectorises (with gathers) when a voxel is a single channel."""
    index, weight = w_taps
    K, n_w = index.shape
    for h in range(rows_h):
        row = base + h * s_h
        o_row = o_base + h * n_w * inner
        if inner == 1:
            for x in range(n_w):
                v = src[np.uint64(row + index[0, x] * s_w)]
                out[np.uint64(o_row + x)] = weight[0, x] * v
            for k in range(1, K):
                for x in range(n_w):
                    at = np.uint64(o_row + x)
                    v = src[np.uint64(row + index[k, x] * s_w)]
                    out[at] = fma(weight[k, x], v, out[at])
            continue
        for x in range(n_w):
            o = o_row + x * inner
            col = row + index[0, x] * s_w
            w = weight[0, x]
            for i in range(inner):
                out[np.uint64(o + i)] = w * src[np.uint64(col + i * s_c)]
            for k in range(1, K):
                col = row + index[k, x] * s_w
                w = weight[k, x]
                for i in range(inner):
                    at = np.uint64(o + i)
                    out[at] = fma(w, src[np.uint64(col + i * s_c)], out[at])


@njit(cache=True)
def _combine_rows(src, out, row_len, rows):
    """``out[r, :] = sum_k weight[k] * src[index[k], :]`` over contiguous rows: the H map."""
    starts, index, weight = rows
    for r in range(starts.shape[0] - 1):
        o = r * row_len
        for k in range(starts[r], starts[r + 1]):
            w = weight[k]
            s = index[k] * row_len
            if k == starts[r]:
                for j in range(row_len):
                    out[np.uint64(o + j)] = w * src[np.uint64(s + j)]
            else:
                for j in range(row_len):
                    at = np.uint64(o + j)
                    out[at] = fma(w, src[np.uint64(s + j)], out[at])
        if starts[r] == starts[r + 1]:
            for j in range(row_len):
                out[np.uint64(o + j)] = typed(0, weight[0])


@njit(cache=True)
def _combine_planes(src, base, s_st, out, o_stride, rows_h, cols_w, inner, d_rows, p):
    """``out[h, x, i]`` (rows ``o_stride`` apart) = row ``p`` of the D map applied to the
    planes of src (logical strides ``s_st``) at ``base``: whole rows combined."""
    starts, index, weight = d_rows
    first, stop = starts[p], starts[p + 1]
    for h in range(rows_h):
        o = h * o_stride
        for k in range(first, stop):
            w = weight[k]
            s = base + index[k] * s_st[2] + h * s_st[3]
            if inner == 1:
                if k == first:
                    for x in range(cols_w):
                        out[np.uint64(o + x)] = w * src[np.uint64(s + x * s_st[4])]
                else:
                    for x in range(cols_w):
                        at = np.uint64(o + x)
                        out[at] = fma(w, src[np.uint64(s + x * s_st[4])], out[at])
                continue
            for x in range(cols_w):
                col = s + x * s_st[4]
                at = o + x * inner
                if k == first:
                    for i in range(inner):
                        out[np.uint64(at + i)] = w * src[np.uint64(col + i * s_st[1])]
                else:
                    for i in range(inner):
                        out[np.uint64(at + i)] = fma(w, src[np.uint64(col + i * s_st[1])],
                                                     out[np.uint64(at + i)])
        if first == stop:
            for j in range(cols_w * inner):
                out[np.uint64(o + j)] = typed(0, weight[0])


@njit(cache=True)
def _items(dst_shape, channels_last, chunk):
    """Work-item geometry: channels per voxel vector, channel groups, chunks per group."""
    C, planes = dst_shape[1], dst_shape[2]
    inner = C if channels_last else 1  # channels last: all channels are one vector
    groups = 1 if channels_last else C
    return inner, groups, (planes + chunk - 1) // chunk


@njit(parallel=True, cache=True)
def forward(src, s_off, s_st, dst, d_off, d_st, src_shape, dst_shape, channels_last,
            w_taps, h_rows, d_rows, chunk):
    """``dst = D(H(W(src)))``: W first, on the smallest data.

    Shapes and strides are logical (N, C, D, H, W). ``w_taps`` are ``taps`` tables,
    ``h_rows`` and ``d_rows`` ``axis_matrix`` CSR matrices (dst index -> src entries).
    dst is contiguous in its layout, so each of its planes (H, W and, channels last, C)
    is one run of memory.

    A work item is a batch, a channel (all channels, channels last) and a chunk of dst
    planes. A dst plane reads src planes i1 and i0, equal or adjacent, so two scratch
    slots chosen by parity hold them; each src plane is mapped along W and H once per
    item, and each dst voxel written once, ``fma(l0, v0, l1 * v1)``: PyTorch's nested
    evaluation along W, then H, then D.
    """
    N, Hs = src_shape[0], src_shape[3]
    Dd, Hd, Wd = dst_shape[2], dst_shape[3], dst_shape[4]
    inner, groups, n_chunks = _items(dst_shape, channels_last, chunk)
    row_len = Wd * inner
    plane = Hd * row_len
    d_starts, d_index, d_weight = d_rows
    for item in prange(N * groups * n_chunks):  # items own disjoint dst planes
        it = np.int64(item)  # prange indices may be unsigned; mixed with int64 they turn float
        ng, q = divmod(it, n_chunks)
        n, g = divmod(ng, groups)
        mapped_w = np.empty(0 if Hs == Hd else Hs * row_len, dst.dtype)
        slots = np.empty((2, plane), dst.dtype)
        held = np.full(2, -1, np.int64)  # the src plane in each slot
        s_base = s_off + n * s_st[0] + g * s_st[1]
        d_base = d_off + n * d_st[0] + g * d_st[1]
        for p in range(q * chunk, min(Dd, (q + 1) * chunk)):
            first, stop = d_starts[p], d_starts[p + 1]
            for k in range(first, stop):
                s = d_index[k]
                if held[s % 2] != s:
                    at = s_base + s * s_st[2]
                    if Hs == Hd:  # H keeps its size: W straight into the slot
                        _gather_w(src, at, s_st[3], s_st[4], s_st[1], slots[s % 2], 0, Hs,
                                  inner, w_taps)
                    else:
                        _gather_w(src, at, s_st[3], s_st[4], s_st[1], mapped_w, 0, Hs, inner,
                                  w_taps)
                        _combine_rows(mapped_w, slots[s % 2], row_len, h_rows)
                    held[s % 2] = s
            out = d_base + p * d_st[2]
            v1, w1 = slots[d_index[first] % 2], d_weight[first]
            if stop - first == 1:  # D keeps its size
                for j in range(plane):
                    dst[np.uint64(out + j)] = w1 * v1[np.uint64(j)]
            else:
                v0, w0 = slots[d_index[first + 1] % 2], d_weight[first + 1]
                for j in range(plane):
                    dst[np.uint64(out + j)] = fma(w0, v0[np.uint64(j)], w1 * v1[np.uint64(j)])


@njit(parallel=True, cache=True)
def backward(src, s_off, s_st, dst, d_off, d_st, src_shape, dst_shape, channels_last,
             w_taps, h_rows, d_rows, chunk):
    """``dst = W(H(D(src)))`` by destination planes: W last, on the smallest data.

    Arguments as for ``forward``; ``w_taps`` pad with index ``Ws`` (src's W size). A work
    item is a batch, a channel (all channels, channels last) and a chunk of dst planes;
    for each plane it combines the src planes of its D row into scratch, maps that along
    H, and gathers it along W straight into dst. Consecutive planes of a chunk share src
    planes, which are then still in cache.
    """
    N, Hs, Ws = src_shape[0], src_shape[3], src_shape[4]
    Dd, Hd = dst_shape[2], dst_shape[3]
    inner, groups, n_chunks = _items(dst_shape, channels_last, chunk)
    row_len = (Ws + 1) * inner  # each scratch row ends in a zero voxel, read by pad taps
    for item in prange(N * groups * n_chunks):  # items own disjoint dst planes
        it = np.int64(item)  # prange indices may be unsigned; mixed with int64 they turn float
        ng, q = divmod(it, n_chunks)
        n, g = divmod(ng, groups)
        mapped_d = np.zeros(Hs * row_len, dst.dtype)  # the zero voxels are never written
        mapped = mapped_d if Hs == Hd else np.empty(Hd * row_len, dst.dtype)
        s_base = s_off + n * s_st[0] + g * s_st[1]
        d_base = d_off + n * d_st[0] + g * d_st[1]
        for p in range(q * chunk, min(Dd, (q + 1) * chunk)):
            _combine_planes(src, s_base, s_st, mapped_d, row_len, Hs, Ws, inner, d_rows, p)
            if Hs != Hd:  # rows combined whole, so their zero voxels stay zero
                _combine_rows(mapped_d, mapped, row_len, h_rows)
            _gather_w(mapped, 0, row_len, inner, 1, dst, d_base + p * d_st[2], Hd, inner,
                      w_taps)


def tables(input_shape, output_shape, align_corners, scales, like, transposed):
    """The maps a call applies along W, H and D, as its kernel takes them, and the bytes
    they occupy while it runs.

    Shapes are the forward's (logical); ``scales`` its three scale factors (None or
    <= 0: none). ``transposed`` asks for the backward's maps, the forward's transposed.
    """
    maps = []
    for axis in (4, 3, 2):
        n_in = input_shape[axis]
        matrix = axis_matrix(n_in, output_shape[axis], align_corners,
                             scales[axis - 2] or 0.0, like)
        maps.append(transpose(*matrix, n_in) if transposed else matrix)
    w_map, h_map, d_map = maps
    # Forward W rows all have the same length: no padding. Backward pad taps read the zero
    # voxel that ends each scratch row.
    args = (taps(*w_map, output_shape[4] if transposed else 0), h_map, d_map)
    return args, sum(a.nbytes for a in args[0] + h_map + d_map)


def launch(src, dst, channels_last, args, chunk, transposed):
    """Run ``forward`` (or, ``transposed``, ``backward``) with ``tables``' args on logical
    (N, C, D, H, W) views; dst is contiguous in its layout."""
    s_b, s_o, s_s = flat(src)
    d_b, d_o, d_s = flat(dst)
    shapes = np.array(src.shape, np.int64), np.array(dst.shape, np.int64)
    kernel = backward if transposed else forward
    # Items differ in cost (and cores may be shared): hand them out one at a time.
    with numba.parallel_chunksize(1):
        kernel(s_b, s_o, s_s, d_b, d_o, d_s, *shapes, channels_last, *args, chunk)
