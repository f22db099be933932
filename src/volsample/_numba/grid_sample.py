"""Numba CPU kernels for 3-D grid sampling, forward and backward.

Volumes arrive as flat buffers with an element offset and strides in logical
(N, C, D, H, W) order (see ``_memory.flat``); grids likewise in (N, D, H, W, 3) order.
One helper, ``_corners``, turns a sample point into a short table of in-bounds corners;
every kernel loops over that table, so bilinear and nearest share all the code.

Determinism: the forward and the grid gradient are parallel over output rows and write
only their own points. The input gradient is a scatter, so it is computed as a gather
over input planes: points are bucketed (stably) by the first input plane they touch, and
each input plane (n, z) is owned by one loop iteration, which adds the contributions of
its points in increasing point order. No two iterations write the same element, and each
element receives its terms in the same order for every thread count.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .._coords import NEAREST, source_index, typed


@njit(cache=True)
def _corners(mode, ix, iy, iz, D, H, W, sz, sy, sx, off, zc, w, gx, gy, gz):
    """Fill the tables of one sample point's in-bounds corners; return how many there are.

    ``off`` is each corner's element offset for strides (sz, sy, sx), ``zc`` its plane,
    ``w`` its interpolation weight and ``gx``, ``gy``, ``gz`` the weight's derivatives with
    respect to ix, iy, iz. Corners come in PyTorch's order tnw, tne, tsw, tse, bnw, bne,
    bsw, bse (x fastest). Coordinates must be finite.
    """
    zero = typed(0, ix)
    one = typed(1, ix)
    if mode == NEAREST:
        x, y, z = np.rint(ix), np.rint(iy), np.rint(iz)  # half to even, as std::nearbyint
        if not (x >= 0 and x < W and y >= 0 and y < H and z >= 0 and z < D):
            return 0
        xi, yi, zi = np.int64(x), np.int64(y), np.int64(z)
        off[0] = zi * sz + yi * sy + xi * sx
        zc[0] = zi
        w[0] = one
        gx[0] = gy[0] = gz[0] = zero
        return 1
    if not (ix > -1 and ix < W and iy > -1 and iy < H and iz > -1 and iz < D):
        return 0  # all eight corners are outside (this also drops NaN)
    fx, fy, fz = np.floor(ix), np.floor(iy), np.floor(iz)
    x0, y0, z0 = np.int64(fx), np.int64(fy), np.int64(fz)
    # Weights of the low and high corner along each axis, as PyTorch forms them.
    wx = ((fx + one) - ix, ix - fx)
    wy = ((fy + one) - iy, iy - fy)
    wz = ((fz + one) - iz, iz - fz)
    sign = (-one, one)
    count = 0
    for k in range(8):
        dx, dy, dz = k & 1, (k >> 1) & 1, k >> 2
        x, y, z = x0 + dx, y0 + dy, z0 + dz
        if x >= 0 and x < W and y >= 0 and y < H and z >= 0 and z < D:
            off[count] = z * sz + y * sy + x * sx
            zc[count] = z
            w[count] = wx[dx] * wy[dy] * wz[dz]
            gx[count] = sign[dx] * wy[dy] * wz[dz]
            gy[count] = sign[dy] * wx[dx] * wz[dz]
            gz[count] = sign[dz] * wx[dx] * wy[dy]
            count += 1
    return count


@njit(cache=True)
def _source(grid, g, gs4, D, H, W, padding_mode, align_corners):
    """Padded voxel coordinates of the grid point at ``grid[g]``, their derivatives, and
    whether the point is finite (a non-finite point contributes nothing)."""
    cx, cy, cz = grid[g], grid[g + gs4], grid[g + 2 * gs4]
    if not (np.isfinite(cx) and np.isfinite(cy) and np.isfinite(cz)):
        return cx, cy, cz, cx, cy, cz, False
    ix, mx = source_index(cx, W, padding_mode, align_corners)
    iy, my = source_index(cy, H, padding_mode, align_corners)
    iz, mz = source_index(cz, D, padding_mode, align_corners)
    return ix, iy, iz, mx, my, mz, True


@njit(cache=True)
def _scratch(dtype):
    return (np.empty(8, np.int64), np.empty(8, np.int64), np.empty(8, dtype),
            np.empty(8, dtype), np.empty(8, dtype), np.empty(8, dtype))


@njit(parallel=True, cache=True)
def forward(inp, i_off, i_st, grid, g_off, g_st, out, o_off, o_st,
            in_shape, out_shape, mode, padding_mode, align_corners):
    N, C, D, H, W = in_shape[0], in_shape[1], in_shape[2], in_shape[3], in_shape[4]
    Do, Ho, Wo = out_shape[0], out_shape[1], out_shape[2]
    for r in prange(N * Do * Ho):  # each row writes only its own output points
        row = np.int64(r)  # prange indices may be unsigned; mixed with int64 they turn float
        off, zc, w, gx, gy, gz = _scratch(out.dtype)
        n, dh = divmod(row, Do * Ho)
        d, h = divmod(dh, Ho)
        g_row = g_off + n * g_st[0] + d * g_st[1] + h * g_st[2]
        o_row = o_off + n * o_st[0] + d * o_st[2] + h * o_st[3]
        i_n = i_off + n * i_st[0]
        for x_out in range(Wo):
            ix, iy, iz, _, _, _, finite = _source(grid, g_row + x_out * g_st[3], g_st[4],
                                                  D, H, W, padding_mode, align_corners)
            count = 0
            if finite:
                count = _corners(mode, ix, iy, iz, D, H, W, i_st[2], i_st[3], i_st[4],
                                 off, zc, w, gx, gy, gz)
            o = o_row + x_out * o_st[4]
            for c in range(C):
                base = i_n + c * i_st[1]
                acc = typed(0, ix)
                for j in range(count):
                    acc += inp[base + off[j]] * w[j]
                out[o + c * o_st[1]] = acc


@njit(parallel=True, cache=True)
def backward_points(gout, go_off, go_st, inp, i_off, i_st, grid, g_off, g_st,
                    grad_grid, coords, keys, in_shape, out_shape, mode, padding_mode,
                    align_corners, need_input_grad, need_grid_grad):
    """Per-point pass: the grid gradient, and for the input gradient each point's padded
    coordinates and bucket key (first input plane it touches; -1 for none)."""
    N, C, D, H, W = in_shape[0], in_shape[1], in_shape[2], in_shape[3], in_shape[4]
    Do, Ho, Wo = out_shape[0], out_shape[1], out_shape[2]
    for r in prange(N * Do * Ho):  # each row writes only its own points' entries
        row = np.int64(r)
        off, zc, w, gx, gy, gz = _scratch(grad_grid.dtype)
        n, dh = divmod(row, Do * Ho)
        d, h = divmod(dh, Ho)
        g_row = g_off + n * g_st[0] + d * g_st[1] + h * g_st[2]
        go_row = go_off + n * go_st[0] + d * go_st[2] + h * go_st[3]
        i_n = i_off + n * i_st[0]
        for x_out in range(Wo):
            p = row * Wo + x_out
            ix, iy, iz, mx, my, mz, finite = _source(grid, g_row + x_out * g_st[3], g_st[4],
                                                     D, H, W, padding_mode, align_corners)
            count = 0
            if finite:
                count = _corners(mode, ix, iy, iz, D, H, W, i_st[2], i_st[3], i_st[4],
                                 off, zc, w, gx, gy, gz)
            if need_input_grad:
                keys[p] = -1
                if count > 0:
                    coords[p, 0], coords[p, 1], coords[p, 2] = ix, iy, iz
                    first_plane = zc[0] if mode == NEAREST else np.int64(np.floor(iz))
                    keys[p] = n * (D + 1) + first_plane + 1
            if need_grid_grad:
                sx = sy = sz = typed(0, ix)
                if mode != NEAREST:
                    go = go_row + x_out * go_st[4]
                    for c in range(C):
                        base = i_n + c * i_st[1]
                        tx = ty = tz = typed(0, ix)
                        for j in range(count):
                            v = inp[base + off[j]]
                            tx += v * gx[j]
                            ty += v * gy[j]
                            tz += v * gz[j]
                        g = gout[go + c * go_st[1]]
                        sx += tx * g
                        sy += ty * g
                        sz += tz * g
                grad_grid[p, 0] = mx * sx if finite else typed(0, ix)
                grad_grid[p, 1] = my * sy if finite else typed(0, ix)
                grad_grid[p, 2] = mz * sz if finite else typed(0, ix)


@njit(parallel=True, cache=True)
def stable_bucket_order(keys, n_buckets, n_chunks):
    """Counting sort: point indices grouped by key (keys < 0 dropped), stable within a
    bucket, and each bucket's start. The result is unique, so it does not depend on
    ``n_chunks`` or on the thread count."""
    P = keys.shape[0]
    chunk = (P + n_chunks - 1) // n_chunks
    counts = np.zeros((n_chunks, n_buckets), np.int64)
    for k in prange(n_chunks):  # each chunk counts into its own row
        for p in range(k * chunk, min(P, (k + 1) * chunk)):
            if keys[p] >= 0:
                counts[k, keys[p]] += 1
    starts = np.empty(n_buckets + 1, np.int64)
    total = 0
    for b in range(n_buckets):
        starts[b] = total
        for k in range(n_chunks):
            c = counts[k, b]
            counts[k, b] = total  # becomes chunk k's next write position in bucket b
            total += c
    starts[n_buckets] = total
    order = np.empty(total, np.int64)
    for k in prange(n_chunks):  # chunks write disjoint, precomputed positions
        for p in range(k * chunk, min(P, (k + 1) * chunk)):
            b = keys[p]
            if b >= 0:
                order[counts[k, b]] = p
                counts[k, b] += 1
    return order, starts


@njit(parallel=True, cache=True)
def backward_input(gout, go_off, go_st, gin, gi_off, gi_st, coords, order, starts,
                   in_shape, out_shape, mode):
    """Scatter-free input gradient: one iteration per input plane (n, z)."""
    N, C, D, H, W = in_shape[0], in_shape[1], in_shape[2], in_shape[3], in_shape[4]
    Do, Ho, Wo = out_shape[0], out_shape[1], out_shape[2]
    for r in prange(N * D):  # iteration (n, z) alone writes plane z of batch n
        plane = np.int64(r)
        off, zc, w, gx, gy, gz = _scratch(gin.dtype)
        n, z = divmod(plane, D)
        # Points whose first plane is z, and (bilinear) those whose first plane is z - 1.
        a, a_end = starts[n * (D + 1) + z + 1], starts[n * (D + 1) + z + 2]
        b, b_end = starts[n * (D + 1) + z], starts[n * (D + 1) + z + 1]
        if mode == NEAREST:
            b = b_end
        gi_n = gi_off + n * gi_st[0]
        while a < a_end or b < b_end:  # merge the two sorted lists: increasing point order
            if b >= b_end or (a < a_end and order[a] < order[b]):
                p = order[a]
                a += 1
            else:
                p = order[b]
                b += 1
            count = _corners(mode, coords[p, 0], coords[p, 1], coords[p, 2], D, H, W,
                             gi_st[2], gi_st[3], gi_st[4], off, zc, w, gx, gy, gz)
            dhw = p - n * (Do * Ho * Wo)
            d, hw = divmod(dhw, Ho * Wo)
            h, x_out = divmod(hw, Wo)
            go = go_off + n * go_st[0] + d * go_st[2] + h * go_st[3] + x_out * go_st[4]
            for c in range(C):
                g = gout[go + c * go_st[1]]
                base = gi_n + c * gi_st[1]
                for j in range(count):
                    if zc[j] == z:
                        gin[base + off[j]] += g * w[j]
