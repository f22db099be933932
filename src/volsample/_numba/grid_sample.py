"""Numba CPU kernels for 3-D grid sampling, forward and backward.

Volumes arrive as flat buffers with an element offset and strides in logical
(N, C, D, H, W) order (see ``_memory.flat``); grids as contiguous flat (N, D, H, W, 3).

Every kernel works a row of output points (fixed n, d, h) at a time, in two short loops:
``_prepare_row`` turns the row's grid points into voxel coordinates, lowest corners, the
six per-axis weights and a kind (outside / interior / partly outside), and then a second
loop reads or writes the volume. Split this way each loop stays small enough for the
compiler to keep in registers; fused, the same work ran 4x slower. Corners come in
PyTorch's order tnw, tne, tsw, tse, bnw, bne, bsw, bse (x fastest), and weights are
formed as PyTorch forms them, so the float32 and float64 forward match PyTorch bit for bit.

Determinism. The forward and the grid gradient write each output point from one iteration.
The input gradient is a scatter, made race-free by giving each parallel iteration a slab of
input planes (n, z) that only it writes. Every iteration walks the points in increasing
order (skipping rows that cannot reach its slab) and adds the corners that fall in its
slab, so each input element receives its terms in increasing point order whatever the slabs
are: the result is bitwise the same for every thread count. A row's grid gradient is
computed once, by one of the slabs it touches; when rows reach across the volume (a random
grid), one slab does the whole scatter and other iterations compute the grid gradient
beside it. How the planes are split (whole batches when there are enough; otherwise by the
row plane ranges of ``row_planes``) changes the speed, never the bits.
"""
from __future__ import annotations

import functools
import types

import numpy as np
from numba import njit, prange

from .._coords import NEAREST, REFLECTION, source_index, typed

OUTSIDE, INTERIOR, PARTIAL = 0, 1, 2  # how a point's corners meet the volume


@njit(cache=True, inline="always")
def _u(index):
    """An index known to be in bounds, as unsigned: Numba then skips the wraparound
    handling of negative indices, which costs a third of the inner loops' time."""
    return np.uint64(index)


@njit(cache=True, inline="always")
def _taps(i, size, nearest):
    """Lowest tap along one axis, the weights of the low and high taps, and whether any
    tap lies inside [0, size). Range checks run in floating point, so NaN and huge
    coordinates never reach an integer conversion."""
    one, zero = typed(1, i), typed(0, i)
    if nearest:
        f = np.rint(i)  # half to even, as std::nearbyint
        inside = (f >= 0) & (f < size)
        return inside, np.int64(f) if inside else np.int64(0), one, zero
    f = np.floor(i)
    inside = (f >= -1) & (f < size)
    return inside, np.int64(f) if inside else np.int64(0), (f + one) - i, i - f


@njit(cache=True, inline="always")
def _scratch(Wo, dtype):
    """Row tables: kind, lowest corner (x0, y0, z0), weights (wx0, wx1, wy0, wy1, wz0,
    wz1) and d(voxel)/d(grid) per axis."""
    return (np.empty(Wo, np.int8), np.empty((3, Wo), np.int64), np.empty((6, Wo), dtype),
            np.empty((3, Wo), dtype))


@njit(cache=True, inline="always")
def _prepare_row(grid, row, Do, Ho, Wo, D, H, W, nearest, padding_mode, align_corners,
                 kind, corner, weight, slope):
    """Fill the tables of output row ``row`` (its Wo grid points lie contiguous, x, y, z,
    in ``grid``: with these strides known, the compiler vectorises this loop); return the
    row's (n, d, h)."""
    for w in range(Wo):
        p = 3 * (Wo * row + w)
        cx, cy, cz = grid[_u(p)], grid[_u(p + 1)], grid[_u(p + 2)]
        finite = np.isfinite(cx) & np.isfinite(cy) & np.isfinite(cz)
        ix, mx = source_index(cx, W, padding_mode, align_corners)
        iy, my = source_index(cy, H, padding_mode, align_corners)
        iz, mz = source_index(cz, D, padding_mode, align_corners)
        in_x, x0, wx0, wx1 = _taps(ix, W, nearest)
        in_y, y0, wy0, wy1 = _taps(iy, H, nearest)
        in_z, z0, wz0, wz1 = _taps(iz, D, nearest)
        touches = finite & in_x & in_y & in_z  # a non-finite point touches nothing
        interior = nearest | ((x0 >= 0) & (x0 < W - 1) & (y0 >= 0) & (y0 < H - 1)
                              & (z0 >= 0) & (z0 < D - 1))
        kind[w] = OUTSIDE if not touches else (INTERIOR if interior else PARTIAL)
        corner[0, w], corner[1, w], corner[2, w] = x0, y0, z0
        weight[0, w], weight[1, w], weight[2, w] = wx0, wx1, wy0
        weight[3, w], weight[4, w], weight[5, w] = wy1, wz0, wz1
        slope[0, w], slope[1, w], slope[2, w] = mx, my, mz
    n, dh = divmod(row, Do * Ho)
    d, h = divmod(dh, Ho)
    return n, d, h


@njit(cache=True, inline="always")
def _corner_weights(weight, w):
    """The 8 corner weights of point w, each (wx * wy) * wz as PyTorch forms it."""
    wx0, wx1, wy0, wy1, wz0, wz1 = (weight[0, w], weight[1, w], weight[2, w], weight[3, w],
                                    weight[4, w], weight[5, w])
    a00, a10, a01, a11 = wx0 * wy0, wx1 * wy0, wx0 * wy1, wx1 * wy1
    return (a00 * wz0, a10 * wz0, a01 * wz0, a11 * wz0,
            a00 * wz1, a10 * wz1, a01 * wz1, a11 * wz1)


@njit(cache=True, inline="always")
def _corner_slopes(weight, w):
    """Derivatives of the 8 corner weights of point w with respect to ix, iy and iz, as
    one flat 24-tuple (x slopes, then y, then z)."""
    wx0, wx1, wy0, wy1, wz0, wz1 = (weight[0, w], weight[1, w], weight[2, w], weight[3, w],
                                    weight[4, w], weight[5, w])
    yz00, yz10, yz01, yz11 = wy0 * wz0, wy1 * wz0, wy0 * wz1, wy1 * wz1
    xz00, xz10, xz01, xz11 = wx0 * wz0, wx1 * wz0, wx0 * wz1, wx1 * wz1
    xy00, xy10, xy01, xy11 = wx0 * wy0, wx1 * wy0, wx0 * wy1, wx1 * wy1
    return (-yz00, yz00, -yz10, yz10, -yz01, yz01, -yz11, yz11,
            -xz00, -xz10, xz00, xz10, -xz01, -xz11, xz01, xz11,
            -xy00, -xy10, -xy01, -xy11, xy00, xy10, xy01, xy11)


@njit(cache=True, inline="always")
def _corner_offsets(sz, sy, sx):
    """Element offsets of the 8 corners from the lowest one."""
    return (0, sx, sy, sy + sx, sz, sz + sx, sz + sy, sz + sy + sx)


@njit(cache=True, inline="always")
def _inside(k, x0, y0, z0, D, H, W):
    """Whether corner k of the cell at (x0, y0, z0) lies in the volume."""
    x, y, z = x0 + (k & 1), y0 + ((k >> 1) & 1), z0 + (k >> 2)
    return (x >= 0) & (x < W) & (y >= 0) & (y < H) & (z >= 0) & (z < D)


@njit(cache=True, inline="always")
def _backward_corner(k, g, inp, i_at, i_offsets, gin, gi_at, gi_offsets, slopes, value,
                     plane, lo, hi, clip, scatter, gather, sx, sy, sz):
    """Corner k's share of one channel's backward: its gradient-of-weight terms added to
    (sx, sy, sz) if ``gather``, and g * weight added to grad_input if ``scatter`` (and, if
    ``clip``, the corner lies on planes [lo, hi))."""
    if gather:
        v = inp[_u(i_at + i_offsets[k])] * g
        sx += slopes[k] * v
        sy += slopes[8 + k] * v
        sz += slopes[16 + k] * v
    if scatter and (not clip or (plane + (k >> 2) >= lo and plane + (k >> 2) < hi)):
        gin[_u(gi_at + gi_offsets[k])] += g * value
    return sx, sy, sz


@njit(cache=True, inline="always")
def _backward_point(gout, go, go_c, inp, i_base, i_c, i_offsets, gin, gi_base, gi_c,
                    gi_offsets, C, corners, interior, x0, y0, z0, D, H, W, weight, w,
                    plane, lo, hi, clip, scatter, gather):
    """One point's share of the backward: scatter grad_output into its corners (if
    ``scatter``; if ``clip`` too, only those on planes [lo, hi), ``plane`` being the plane
    index of z0) and return
    d(loss)/d(ix, iy, iz) (if ``gather``). ``corners`` is a constant, 1 (nearest: weight 1)
    or 8. Channels run outermost, as PyTorch sums."""
    values = _corner_weights(weight, w)
    slopes = _corner_slopes(weight, w)
    sx = sy = sz = typed(0, values[0])
    for c in range(C):
        g = gout[_u(go + c * go_c)]
        i_at, gi_at = i_base + c * i_c, gi_base + c * gi_c
        if interior:  # the common case, in a branch-free loop
            for k in range(corners):
                sx, sy, sz = _backward_corner(k, g, inp, i_at, i_offsets, gin, gi_at, gi_offsets,
                                              slopes, values[k], plane, lo, hi, clip,
                                              scatter, gather, sx, sy, sz)
        else:
            for k in range(corners):
                if _inside(k, x0, y0, z0, D, H, W):
                    sx, sy, sz = _backward_corner(k, g, inp, i_at, i_offsets, gin, gi_at,
                                                  gi_offsets, slopes, values[k], plane, lo,
                                                  hi, clip, scatter, gather, sx, sy, sz)
    return sx, sy, sz


@njit(cache=True, inline="always")
def _plane_span(low, high, D, nearest, padding_mode, align_corners):
    """The planes (lowest, highest) that points with z coordinates in [low, high] can
    touch, for a padding under which the voxel coordinate grows with the normalised one
    (zeros, border; reflection for a single point); first > last if none. Under zeros and
    border padding, coordinates are clipped to [-3, 3] first: points beyond touch the same
    planes (none, or an end one) and infinities never reach the arithmetic. Reflection
    folds any finite point back in, so there only a non-finite point touches nothing.
    NaN makes an empty span."""
    if not low <= high or (padding_mode == REFLECTION and not np.isfinite(low)):
        return np.int64(1), np.int64(0)
    if padding_mode != REFLECTION:
        three = typed(3, low)
        low, high = min(max(low, -three), three), min(max(high, -three), three)
    i_low, _ = source_index(low, D, padding_mode, align_corners)
    i_high, _ = source_index(high, D, padding_mode, align_corners)
    if nearest:
        first, last = np.rint(i_low), np.rint(i_high)
    else:
        first, last = np.floor(i_low), np.floor(i_high) + typed(1, low)
    return (np.int64(max(first, typed(0, first))),
            np.int64(min(last, typed(D - 1, last))))


@functools.cache
def kernels(mode, padding_mode):
    """The kernels for one (mode, padding_mode). Numba sees the two as compile-time
    constants, so each kernel is compiled for its modes alone (a runtime padding switch
    costs 1.7x in the forward); align_corners stays a runtime argument, which costs nothing
    measurable and halves the variants to compile. Each variant is compiled on first use
    and cached on disk."""
    nearest = mode == NEAREST
    corners = 1 if nearest else 8

    @njit(parallel=True, cache=True)
    def forward(inp, i_off, i_st, grid, out, o_off, o_st, in_shape, out_shape,
                n_chunks, align_corners):
        N, C, D, H, W = in_shape
        Do, Ho, Wo = out_shape
        rows = N * Do * Ho
        offsets = _corner_offsets(i_st[2], i_st[3], i_st[4])
        for chunk in prange(n_chunks):  # each chunk of rows writes only its own points
            kind, corner, weight, slope = _scratch(Wo, out.dtype)
            for row in range(chunk * rows // n_chunks, (chunk + 1) * rows // n_chunks):
                n, d, h = _prepare_row(grid, row, Do, Ho, Wo, D, H, W, nearest, padding_mode,
                                       align_corners, kind, corner, weight, slope)
                o_row = o_off + n * o_st[0] + d * o_st[2] + h * o_st[3]
                for w in range(Wo):
                    o = o_row + w * o_st[4]
                    x0, y0, z0 = corner[0, w], corner[1, w], corner[2, w]
                    base = i_off + n * i_st[0] + z0 * i_st[2] + y0 * i_st[3] + x0 * i_st[4]
                    if kind[w] == OUTSIDE:
                        for c in range(C):
                            out[_u(o + c * o_st[1])] = 0
                    elif nearest:  # the single corner, copied exactly
                        for c in range(C):
                            out[_u(o + c * o_st[1])] = inp[_u(base + c * i_st[1])]
                    else:
                        values = _corner_weights(weight, w)
                        if kind[w] == INTERIOR:  # the common case, in a branch-free loop
                            for c in range(C):
                                b = base + c * i_st[1]
                                acc = typed(0, values[0])
                                for k in range(8):
                                    acc += inp[_u(b + offsets[k])] * values[k]
                                out[_u(o + c * o_st[1])] = acc
                        else:
                            for c in range(C):
                                b = base + c * i_st[1]
                                acc = typed(0, values[0])
                                for k in range(8):
                                    if _inside(k, x0, y0, z0, D, H, W):
                                        acc += inp[_u(b + offsets[k])] * values[k]
                                out[_u(o + c * o_st[1])] = acc

    @njit(parallel=True, cache=True)
    def row_planes(grid, row_first, row_last, touching, in_shape, out_shape, align_corners):
        """For every row, the lowest and highest input plane (n*D + z) its points can touch,
        judged from z alone (a superset of the planes; an empty range, first > last, if
        none); per chunk, the rows touching each plane as a difference array, by which the
        slabs are balanced."""
        N, C, D, H, W = in_shape
        Do, Ho, Wo = out_shape
        rows = N * Do * Ho
        n_chunks = touching.shape[0]
        for chunk in prange(n_chunks):  # chunk writes its own rows and its own counts
            for row in range(chunk * rows // n_chunks, (chunk + 1) * rows // n_chunks):
                z = 3 * Wo * row + 2
                if padding_mode == REFLECTION:  # folding is not monotonic: bound every point
                    lowest, highest = N * D, np.int64(-1)
                    for w in range(Wo):
                        cz = grid[_u(z + 3 * w)]
                        first, last = _plane_span(cz, cz, D, nearest, padding_mode,
                                                  align_corners)
                        if first <= last:
                            lowest, highest = min(lowest, first), max(highest, last)
                else:  # monotonic: the row's extreme coordinates bound its planes
                    low, high = typed(np.inf, grid[0]), typed(-np.inf, grid[0])
                    for w in range(Wo):
                        cz = grid[_u(z + 3 * w)]
                        low = cz if cz < low else low  # NaN is passed over
                        high = cz if cz > high else high
                    lowest, highest = _plane_span(low, high, D, nearest, padding_mode,
                                                  align_corners)
                n = row // (Do * Ho)
                if lowest <= highest:
                    first, last = n * D + lowest, n * D + highest
                    touching[chunk, first] += 1
                    touching[chunk, last + 1] -= 1
                else:
                    first, last = N * D, np.int64(-1)
                row_first[row], row_last[row] = first, last

    @njit(cache=True, inline="always")
    def slab_pass(gout, go_off, go_st, inp, i_off, i_st, grid, gin, gi_off, gi_st, grad_grid,
                  row_first, row_last, slab_bounds, plane_slab, s, in_shape, out_shape,
                  need_grid_grad, align_corners):
        """Slab s: every point's share of grad_input on the slab's planes, in point order,
        and (if ``need_grid_grad``) the grid gradient of the rows the slab owns."""
        N, C, D, H, W = in_shape
        Do, Ho, Wo = out_shape
        rows = N * Do * Ho
        slabs = slab_bounds.shape[0] - 1
        i_offsets = _corner_offsets(i_st[2], i_st[3], i_st[4])
        gi_offsets = _corner_offsets(gi_st[2], gi_st[3], gi_st[4])
        lo, hi = slab_bounds[s], slab_bounds[s + 1]
        kind, corner, weight, slope = _scratch(Wo, grad_grid.dtype)
        for row in range(rows):  # every point, in increasing order
            owner, straddles = True, False
            if slabs > 1:
                first, last = row_first[row], row_last[row]
                if last < lo or first >= hi:
                    continue
                straddles = first < lo or last >= hi
                # A row's grid gradient is computed by one of the slabs it touches,
                # spread by row number so that rows spanning every slab share the work.
                owner = s == min(max(row * slabs // rows, plane_slab[first]), plane_slab[last])
            n, d, h = _prepare_row(grid, row, Do, Ho, Wo, D, H, W, nearest, padding_mode,
                                   align_corners, kind, corner, weight, slope)
            go_row = go_off + n * go_st[0] + d * go_st[2] + h * go_st[3]
            gather = need_grid_grad and owner and not nearest
            for w in range(Wo):
                if kind[w] == OUTSIDE:
                    continue
                x0, y0, z0 = corner[0, w], corner[1, w], corner[2, w]
                if straddles and not owner and (
                        n * D + max(z0, 0) >= hi or n * D + min(z0 + corners // 8, D - 1) < lo):
                    continue
                go = go_row + w * go_st[4]
                i_at = i_off + n * i_st[0] + z0 * i_st[2] + y0 * i_st[3] + x0 * i_st[4]
                gi_at = gi_off + n * gi_st[0] + z0 * gi_st[2] + y0 * gi_st[3] + x0 * gi_st[4]
                interior = kind[w] == INTERIOR
                if straddles:  # only the corners on this slab's planes are written
                    sx, sy, sz = _backward_point(
                        gout, go, go_st[1], inp, i_at, i_st[1], i_offsets, gin, gi_at,
                        gi_st[1], gi_offsets, C, corners, interior, x0, y0, z0, D, H, W,
                        weight, w, n * D + z0, lo, hi, True, True, gather)
                else:
                    sx, sy, sz = _backward_point(
                        gout, go, go_st[1], inp, i_at, i_st[1], i_offsets, gin, gi_at,
                        gi_st[1], gi_offsets, C, corners, interior, x0, y0, z0, D, H, W,
                        weight, w, 0, 0, 0, False, True, gather)
                if need_grid_grad and owner:
                    p = row * Wo + w
                    grad_grid[p, 0] = slope[0, w] * sx
                    grad_grid[p, 1] = slope[1, w] * sy
                    grad_grid[p, 2] = slope[2, w] * sz

    @njit(cache=True, inline="always")
    def gradient_rows(gout, go_off, go_st, inp, i_off, i_st, grid, grad_grid, row_begin,
                      row_end, in_shape, out_shape, align_corners):
        """The grid gradient of rows [row_begin, row_end) (every point written)."""
        N, C, D, H, W = in_shape
        Do, Ho, Wo = out_shape
        i_offsets = _corner_offsets(i_st[2], i_st[3], i_st[4])
        kind, corner, weight, slope = _scratch(Wo, grad_grid.dtype)
        for row in range(row_begin, row_end):
            n, d, h = _prepare_row(grid, row, Do, Ho, Wo, D, H, W, nearest, padding_mode,
                                   align_corners, kind, corner, weight, slope)
            go_row = go_off + n * go_st[0] + d * go_st[2] + h * go_st[3]
            for w in range(Wo):
                p = row * Wo + w
                sx = sy = sz = typed(0, weight[0, w])
                if kind[w] == OUTSIDE:  # its slope may be NaN: write the zeros outright
                    grad_grid[p, 0] = grad_grid[p, 1] = grad_grid[p, 2] = sx
                    continue
                if not nearest:
                    x0, y0, z0 = corner[0, w], corner[1, w], corner[2, w]
                    sx, sy, sz = _backward_point(
                        gout, go_row + w * go_st[4], go_st[1],
                        inp, i_off + n * i_st[0] + z0 * i_st[2] + y0 * i_st[3] + x0 * i_st[4],
                        i_st[1], i_offsets, inp, 0, 0, i_offsets, C, corners,
                        kind[w] == INTERIOR, x0, y0, z0, D, H, W, weight, w, 0, 0, 0,
                        False, False, True)
                grad_grid[p, 0] = slope[0, w] * sx
                grad_grid[p, 1] = slope[1, w] * sy
                grad_grid[p, 2] = slope[2, w] * sz

    @njit(parallel=True, cache=True)
    def backward(gout, go_off, go_st, inp, i_off, i_st, grid, gin, gi_off, gi_st, grad_grid,
                 row_first, row_last, slab_bounds, plane_slab, grad_rows, in_shape, out_shape,
                 need_grid_grad, align_corners):
        """Both gradients. Parallel iteration t runs slab t, if there is one (slab s alone
        writes grad_input's planes [slab_bounds[s], slab_bounds[s+1])), and then the grid
        gradient of rows [grad_rows[t], grad_rows[t+1]), if those bounds exist. With no
        grad_rows, the slabs compute the grid gradient (if ``need_grid_grad``); with one
        slab, the row ranges are not read (and may be empty arrays)."""
        slabs = slab_bounds.shape[0] - 1
        chunks = max(grad_rows.shape[0] - 1, 0)
        for t in prange(max(slabs, chunks)):
            if t < slabs:
                slab_pass(gout, go_off, go_st, inp, i_off, i_st, grid, gin, gi_off, gi_st,
                          grad_grid, row_first, row_last, slab_bounds, plane_slab, t,
                          in_shape, out_shape, need_grid_grad and chunks == 0, align_corners)
            if t < chunks:
                gradient_rows(gout, go_off, go_st, inp, i_off, i_st, grid, grad_grid,
                              grad_rows[t], grad_rows[t + 1], in_shape, out_shape,
                              align_corners)

    return types.SimpleNamespace(forward=forward, row_planes=row_planes, backward=backward)
