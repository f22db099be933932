"""Numba CPU kernels for 3-D grid sampling, forward and backward.

Volumes arrive as flat buffers with an element offset and strides in logical
(N, C, D, H, W) order (see ``_memory.flat``); grids likewise in (N, D, H, W, 3) order.
Two helpers describe a sample point: ``_taps`` gives, per axis, the lowest tap and the two
interpolation weights, and ``_corner`` gives corner k's offset, weight and the weight's
derivatives. Corners come in PyTorch's order tnw, tne, tsw, tse, bnw, bne, bsw, bse
(x fastest); nearest sampling is the one-corner case of the same loops.

Determinism. The forward writes each output point from one iteration. The backward's input
gradient is a scatter: it is made race-free by giving each parallel iteration a slab of
input planes (n, z) that only it writes. Every iteration walks all points in increasing
order and adds the corners that fall in its slab, so each input element receives its terms
in increasing point order whatever the slabs are: the result is bitwise the same for every
thread count. The grid gradient of a point is computed once, by the slab holding the
point's first plane.
"""
from __future__ import annotations

import functools
import types

import numpy as np
from numba import njit, prange

from .._coords import NEAREST, source_index, typed


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
def _corner(k, x0, y0, z0, wx0, wx1, wy0, wy1, wz0, wz1, D, H, W):
    """Corner k of a point: (in bounds, x, y, z, weight, and the weight's derivatives with
    respect to ix, iy and iz)."""
    dx, dy, dz = k & 1, (k >> 1) & 1, k >> 2
    x, y, z = x0 + dx, y0 + dy, z0 + dz
    inside = (x >= 0) & (x < W) & (y >= 0) & (y < H) & (z >= 0) & (z < D)
    wx = wx1 if dx else wx0
    wy = wy1 if dy else wy0
    wz = wz1 if dz else wz0
    dwx = wy * wz if dx else -(wy * wz)
    dwy = wx * wz if dy else -(wx * wz)
    dwz = wx * wy if dz else -(wx * wy)
    return inside, x, y, z, wx * wy * wz, dwx, dwy, dwz


@njit(cache=True, inline="always")
def _point(grid, g, gs, D, H, W, nearest, padding_mode, align_corners):
    """Everything about the grid point at ``grid[g]`` (channel stride ``gs``): whether it
    touches the volume, its taps, whether all its corners are inside, and the derivatives
    of (ix, iy, iz) with respect to the grid. Non-finite points touch nothing."""
    cx, cy, cz = grid[g], grid[g + gs], grid[g + 2 * gs]
    zero = typed(0, cx)
    if not (np.isfinite(cx) & np.isfinite(cy) & np.isfinite(cz)):
        return False, False, 0, 0, 0, zero, zero, zero, zero, zero, zero, zero, zero, zero
    ix, mx = source_index(cx, W, padding_mode, align_corners)
    iy, my = source_index(cy, H, padding_mode, align_corners)
    iz, mz = source_index(cz, D, padding_mode, align_corners)
    in_x, x0, wx0, wx1 = _taps(ix, W, nearest)
    in_y, y0, wy0, wy1 = _taps(iy, H, nearest)
    in_z, z0, wz0, wz1 = _taps(iz, D, nearest)
    touches = in_x & in_y & in_z
    interior = touches & (nearest | ((x0 >= 0) & (x0 < W - 1) & (y0 >= 0) & (y0 < H - 1)
                                     & (z0 >= 0) & (z0 < D - 1)))
    return touches, interior, x0, y0, z0, wx0, wx1, wy0, wy1, wz0, wz1, mx, my, mz


@njit(cache=True, inline="always")
def _trilinear(inp, base, st, interior, x0, y0, z0, wx0, wx1, wy0, wy1, wz0, wz1, D, H, W):
    """Weighted sum of a point's in-bounds corners in the channel starting at ``inp[base]``."""
    acc = typed(0, wx0)
    if interior:  # the common case, in a loop of its own so that it compiles branch-free
        for k in range(8):
            _, x, y, z, weight, _, _, _ = _corner(k, x0, y0, z0, wx0, wx1, wy0, wy1, wz0, wz1,
                                                  D, H, W)
            acc += inp[base + z * st[2] + y * st[3] + x * st[4]] * weight
    else:
        for k in range(8):
            inside, x, y, z, weight, _, _, _ = _corner(k, x0, y0, z0, wx0, wx1, wy0, wy1, wz0,
                                                       wz1, D, H, W)
            if inside:
                acc += inp[base + z * st[2] + y * st[3] + x * st[4]] * weight
    return acc


@njit(cache=True, inline="always")
def _backward_point(gout, go, go_c, inp, i_n, i_st, gin, gi_n, gi_st, C, corners, interior,
                    x0, y0, z0, wx0, wx1, wy0, wy1, wz0, wz1, D, H, W, plane0, lo, hi,
                    scatter, gather):
    """Scatter one point's grad_output into the corners on planes [lo, hi) (if ``scatter``)
    and return d(loss)/d(ix, iy, iz) (if ``gather``). ``corners`` is a constant 1 or 8.
    Channels run outermost, as in PyTorch's sums; the corner maths does not depend on the
    channel, so the compiler hoists it out of the channel loop."""
    sx = sy = sz = typed(0, wx0)
    for c in range(C):
        g = gout[go + c * go_c]
        i_c = i_n + c * i_st[1]
        gi_c = gi_n + c * gi_st[1]
        for k in range(corners):
            inside, x, y, z, weight, dwx, dwy, dwz = _corner(k, x0, y0, z0, wx0, wx1, wy0, wy1,
                                                             wz0, wz1, D, H, W)
            if not (interior or inside):
                continue
            if gather:
                v = inp[i_c + z * i_st[2] + y * i_st[3] + x * i_st[4]] * g
                sx += dwx * v
                sy += dwy * v
                sz += dwz * v
            if scatter and plane0 + z >= lo and plane0 + z < hi:
                gin[gi_c + z * gi_st[2] + y * gi_st[3] + x * gi_st[4]] += g * weight
    return sx, sy, sz


@functools.cache
def kernels(mode, padding_mode, align_corners):
    """The forward, plane-key and backward kernels for one choice of (mode, padding_mode,
    align_corners). Numba sees the three as compile-time constants, so every kernel is
    compiled branch-free for its modes (runtime mode switches cost ~3x in the inner loop);
    each variant is compiled on first use and cached on disk."""
    nearest = mode == NEAREST
    corners = 1 if nearest else 8

    @njit(parallel=True, cache=True)
    def forward(inp, i_off, i_st, grid, g_off, g_st, out, o_off, o_st,
                in_shape, out_shape):
        N, C, D, H, W = in_shape[0], in_shape[1], in_shape[2], in_shape[3], in_shape[4]
        Do, Ho, Wo = out_shape[0], out_shape[1], out_shape[2]
        for r in prange(N * Do * Ho):  # each row writes only its own output points
            row = np.int64(r)  # prange indices may be unsigned; mixed with int64 they turn float
            n, dh = divmod(row, Do * Ho)
            d, h = divmod(dh, Ho)
            g_row = g_off + n * g_st[0] + d * g_st[1] + h * g_st[2]
            o_row = o_off + n * o_st[0] + d * o_st[2] + h * o_st[3]
            i_n = i_off + n * i_st[0]
            for w in range(Wo):
                (touches, interior, x0, y0, z0, wx0, wx1, wy0, wy1, wz0, wz1, _, _, _) = _point(
                    grid, g_row + w * g_st[3], g_st[4], D, H, W, nearest, padding_mode, align_corners)
                o = o_row + w * o_st[4]
                nearest_offset = z0 * i_st[2] + y0 * i_st[3] + x0 * i_st[4]
                if not touches:
                    for c in range(C):
                        out[o + c * o_st[1]] = 0
                elif nearest:  # the single corner, copied exactly
                    for c in range(C):
                        out[o + c * o_st[1]] = inp[i_n + c * i_st[1] + nearest_offset]
                else:
                    for c in range(C):
                        out[o + c * o_st[1]] = _trilinear(inp, i_n + c * i_st[1], i_st, interior,
                                                          x0, y0, z0, wx0, wx1, wy0, wy1, wz0, wz1,
                                                          D, H, W)


    @njit(parallel=True, cache=True)
    def plane_keys(grid, g_off, g_st, keys, counts, in_shape, out_shape):
        """Key of every point: (first input plane n*D + z it touches) * 2 + (1 if it also
        touches the next plane), or -1; and per row-chunk histograms of first planes."""
        N, D, H, W = in_shape[0], in_shape[2], in_shape[3], in_shape[4]
        Do, Ho, Wo = out_shape[0], out_shape[1], out_shape[2]
        rows = N * Do * Ho
        n_chunks = counts.shape[0]
        for ch in prange(n_chunks):  # chunk ch writes its own rows' keys and its own histogram
            for row in range(ch * rows // n_chunks, (ch + 1) * rows // n_chunks):
                n, dh = divmod(row, Do * Ho)
                d, h = divmod(dh, Ho)
                g_row = g_off + n * g_st[0] + d * g_st[1] + h * g_st[2]
                for w in range(Wo):
                    touches, _, _, _, z0, _, _, _, _, _, _, _, _, _ = _point(
                        grid, g_row + w * g_st[3], g_st[4], D, H, W, nearest, padding_mode,
                        align_corners)
                    key = -1
                    if touches:
                        first = n * D + max(z0, 0)
                        both = (not nearest) & (z0 >= 0) & (z0 + 1 < D)
                        key = 2 * first + both
                        counts[ch, first] += 1
                    keys[row * Wo + w] = key



    @njit(parallel=True, cache=True)
    def backward(gout, go_off, go_st, inp, i_off, i_st, grid, g_off, g_st,
                 gin, gi_off, gi_st, grad_grid, keys, slab_bounds, in_shape, out_shape,
                 need_input_grad, need_grid_grad):
        """Both gradients in one pass; slab s owns input planes [slab_bounds[s], slab_bounds[s+1])."""
        N, C, D, H, W = in_shape[0], in_shape[1], in_shape[2], in_shape[3], in_shape[4]
        Do, Ho, Wo = out_shape[0], out_shape[1], out_shape[2]
        for s in prange(slab_bounds.shape[0] - 1):  # slab s alone writes its planes of gin
            lo, hi = slab_bounds[s], slab_bounds[s + 1]
            p = 0
            for n in range(N):  # walk every point in increasing order
                i_n = i_off + n * i_st[0]
                gi_n = gi_off + n * gi_st[0]
                for d in range(Do):
                    for h in range(Ho):
                        g_row = g_off + n * g_st[0] + d * g_st[1] + h * g_st[2]
                        go_row = go_off + n * go_st[0] + d * go_st[2] + h * go_st[3]
                        for w in range(Wo):
                            key = keys[p]
                            p += 1
                            first = key >> 1
                            if key < 0 or first >= hi or first + (key & 1) < lo:
                                continue
                            (_, interior, x0, y0, z0, wx0, wx1, wy0, wy1, wz0, wz1, mx, my, mz) = _point(
                                grid, g_row + w * g_st[3], g_st[4], D, H, W, nearest, padding_mode,
                                align_corners)
                            owner = first >= lo
                            sx, sy, sz = _backward_point(
                                gout, go_row + w * go_st[4], go_st[1], inp, i_n, i_st, gin,
                                gi_n, gi_st, C, corners, interior, x0, y0, z0, wx0, wx1, wy0,
                                wy1, wz0, wz1, D, H, W, n * D, lo, hi, need_input_grad,
                                need_grid_grad and owner and not nearest)
                            if need_grid_grad and owner:
                                grad_grid[p - 1, 0] = mx * sx
                                grad_grid[p - 1, 1] = my * sy
                                grad_grid[p - 1, 2] = mz * sz

    @njit(parallel=True, cache=True)
    def grid_gradient(gout, go_off, go_st, inp, i_off, i_st, grid, g_off, g_st, grad_grid,
                      in_shape, out_shape):
        """The grid gradient alone: nothing is scattered, so it runs like the forward,
        parallel over output rows."""
        N, C, D, H, W = in_shape[0], in_shape[1], in_shape[2], in_shape[3], in_shape[4]
        Do, Ho, Wo = out_shape[0], out_shape[1], out_shape[2]
        for r in prange(N * Do * Ho):  # each row writes only its own points' gradients
            row = np.int64(r)
            n, dh = divmod(row, Do * Ho)
            d, h = divmod(dh, Ho)
            g_row = g_off + n * g_st[0] + d * g_st[1] + h * g_st[2]
            go_row = go_off + n * go_st[0] + d * go_st[2] + h * go_st[3]
            i_n = i_off + n * i_st[0]
            for w in range(Wo):
                (touches, interior, x0, y0, z0, wx0, wx1, wy0, wy1, wz0, wz1, mx, my, mz) = _point(
                    grid, g_row + w * g_st[3], g_st[4], D, H, W, nearest, padding_mode,
                    align_corners)
                sx = sy = sz = typed(0, wx0)
                if touches and not nearest:
                    sx, sy, sz = _backward_point(
                        gout, go_row + w * go_st[4], go_st[1], inp, i_n, i_st, inp, 0, i_st, C,
                        corners, interior, x0, y0, z0, wx0, wx1, wy0, wy1, wz0, wz1, D, H, W,
                        0, 0, 0, False, True)
                p = row * Wo + w
                grad_grid[p, 0] = mx * sx
                grad_grid[p, 1] = my * sy
                grad_grid[p, 2] = mz * sz

    return types.SimpleNamespace(forward=forward, plane_keys=plane_keys, backward=backward,
                                 grid_gradient=grid_gradient)
