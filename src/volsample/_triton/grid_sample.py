"""Triton kernels for 3-D grid sampling (SPEC §2), forward and backward.

The coordinate maths is that of the C++ core's ``src/cpp/coords.h`` written as @triton.jit helpers over
blocks of points: ``unnormalize``, ``clip`` and ``reflect`` return coordinates and their
derivatives, and ``source_indices`` composes them (``reflect`` folds with an exact fmod and
division emulated by fmas, so that no kernel calls a division's or fmod's subroutine). ``_corner`` describes one of a point's
corners (eight for bilinear, in PyTorch's order tnw, tne, tsw, tse, bnw, bne, bsw, bse;
one for nearest); kernels loop over corners with ``tl.static_range``, so the corner code
is written once. The cubic modes (bicubic, bspline) read a 4 x 4 x 4 footprint instead
(``_cubic_footprint``, the CPU's src/cpp/grid_taps.h): per axis four taps floor(x) - 1
.. floor(x) + 2 of the unpadded coordinate, each padded on its own, with separable
weights; values and grid gradients are summed in the CPU's tap order.

Backward, ``deterministic=False``: one pass over the points computes grad_grid and
scatters grad_output * weight into grad_input with atomic adds (into a float32 buffer for
16-bit data, rounded once at the end). Fast, but the order of the adds varies.

Backward, ``deterministic=True``: the scatter becomes a gather. Each point's key is the
cell it falls in: for bilinear, the unit cube whose low corner is (floor(iz), floor(iy),
floor(ix)), for nearest the voxel itself; points that touch nothing get a key past the
last cell. A stable sort by key lists every cell's points in increasing point order, and
a binary search gives each cell's range. Then one program per block of input voxels sums,
for each voxel, the points of the 8 cells around it (1 for nearest), cell by cell in a
fixed order and in point order within a cell. Every grad_input element is written once,
by one program, from terms in a fixed order: no atomics, the same bits on every run, and
no zero-filling or rounding pass either.

The cubic modes key a point by its window: along each axis its padded taps lie within
four consecutive voxels (taps of consecutive whole numbers, clamped or folded, move by at
most one voxel each), the lowest of which the taps read gives the window's low corner.
The keys pass stores per point and axis the summed weights of its taps on each of those
four voxels (padding can fold several taps onto one), and each voxel gathers the 4 x 4 x 4
windows that contain it, window by window, in point order within a window. (Under
reflection, a coordinate beyond 2**24 voxels in float32 (2**53 in float64), whose taps
round to whole numbers 2 apart, can spread its B-spline taps over five voxels: the
deterministic gather then drops the fifth voxel's term, which the atomic scatter keeps.) grad_grid is per point in both modes, summed
over channels in a fixed order.
"""
from __future__ import annotations

from typing import Any

import dataclasses

import torch
import triton
import triton.language as tl

from .._tables import MODES, NEAREST, REFLECTION, ZEROS
from . import (LAUNCH, block_of_points, compute_dtype, dense_strides, index_dtype,
               is_channels_last, new_volume, on_device_of, programs,
               split_spatial, tile, tl_dtype)

_BICUBIC = tl.constexpr(MODES["bicubic"].code)  # _cubic_weights' choice; the rest: TAPS
_REFLECTION = tl.constexpr(REFLECTION)
_ZEROS = tl.constexpr(ZEROS)
_INF = tl.constexpr(float("inf"))


@triton.jit
def unnormalize(coord, size, ALIGN: tl.constexpr):
    """Voxel coordinate of a normalised coordinate, and d(voxel)/d(coord)."""
    fsize = tl.cast(size, coord.dtype)
    if ALIGN:
        return (coord + 1.0) * 0.5 * (fsize - 1.0), (fsize - 1.0) * 0.5
    return ((coord + 1.0) * fsize - 1.0) * 0.5, fsize * 0.5


@triton.jit
def clip(x, size):
    """Clamp to [0, size-1]; the derivative is 0 on and beyond the ends."""
    upper = tl.cast(size, x.dtype) - 1.0
    inside = (x > 0.0) & (x < upper)
    # Selects rather than min/max, which may drop a NaN: a NaN must stay one (see _grid_point).
    return tl.where(x <= 0.0, 0.0, tl.where(x >= upper, upper, x)), tl.where(inside, 1.0, 0.0)


@triton.jit
def _span(x, size, ALIGN: tl.constexpr):
    """Reflection's bounds along an axis of ``size`` voxels, in x's dtype: the low end, the
    span (1 where it is empty: size 1 with ALIGN), whether it is, and about 1 / span
    (once per program, without a division's slow-path call: a float32 estimate and
    Newton steps)."""
    fsize = tl.cast(size, x.dtype)
    if ALIGN:
        low = 0.0
        span = fsize - 1.0
    else:
        low = -0.5
        span = fsize
    empty = span == 0.0
    span = tl.where(empty, 1.0, span)  # any non-zero span: the result is replaced
    inverse = tl.cast(1.0 / tl.cast(span, tl.float32), x.dtype)
    inverse = tl.fma(inverse, tl.fma(-span, inverse, 1.0), inverse)
    if x.dtype == tl.float64:
        inverse = tl.fma(inverse, tl.fma(-span, inverse, 1.0), inverse)
    return low, span, empty, inverse


@triton.jit
def _huge(x, span):
    """Whether |x| >= 2**p spans (p: the precision's bits): its quotient rounds to an even
    float, and its remainder needs more steps than ``_fold`` takes."""
    if x.dtype == tl.float64:
        return tl.abs(x) >= span * 9007199254740992.0
    return tl.abs(x) >= span * 16777216.0


@triton.jit
def _reduce(r, span, inverse):
    """Where r is huge, r - floor(r * inverse) * span: congruent to r modulo span, about
    2**(p-1) times smaller, and exact (see ``_fold``); elsewhere r."""
    return tl.where(_huge(r, span), tl.fma(-tl.floor(r * inverse), span, r), r)


@triton.jit
def _fold(x, r, span, inverse):
    """(fmod(x, span), whether floor(x / span) is even) for finite x >= 0 and a whole span
    >= 1, given r congruent to x modulo span and not huge (x itself where x is not):
    the bits of an exact fmod and of a correctly rounded division, as the CPU takes them,
    with neither a division nor a libdevice call.

    A step q = floor(r * inverse), r -= q * span (one fma) is exact while r is a multiple
    of a unit that q * span is a multiple of too; two steps and a correction leave the
    exact remainder and quotient. Exact for spans below 2**21 in float32 (axes of fewer
    voxels), any in float64.
    """
    q = tl.floor(r * inverse)
    r = tl.fma(-q, span, r)
    step = tl.floor(r * inverse)
    q += step
    r = tl.fma(-step, span, r)
    q = tl.where(r < 0.0, q - 1.0, tl.where(r >= span, q + 1.0, q))
    r = tl.where(r < 0.0, r + span, tl.where(r >= span, r - span, r))
    # x / span = q + r / span rounds up to q + 1 where span - r is under half a unit of
    # the floats below q + 1, times span; on a tie, to the even one.
    up = q + 1.0
    if up.dtype == tl.float64:
        below = (up.to(tl.int64, bitcast=True) - 1).to(tl.float64, bitcast=True)
    else:
        below = (up.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True)
    half = (up - below) * span * 0.5
    gap = span - r
    even_up = tl.floor(up * 0.5) * 2.0 == up
    rounds_up = (gap < half) | ((gap == half) & (even_up | (up - below < 1.0)))
    flips = tl.where(rounds_up, up, q)
    return r, _huge(x, span) | (tl.floor(flips * 0.5) * 2.0 == flips)


@triton.jit
def _reflected(x, r, low, span, empty, inverse):
    """x (already less low) folded by ``_fold``, and the derivative's sign."""
    sign = tl.where(x < 0.0, -1.0, 1.0)
    extra, even = _fold(tl.abs(x), r, span, inverse)
    folded = tl.where(even, extra + low, span - extra + low)
    sign = tl.where(even, sign, -sign)
    return tl.where(empty, 0.0, folded), tl.where(empty, 0.0, sign)


@triton.jit
def reflect(x, y, z, W, H, D, ALIGN: tl.constexpr):
    """Fold a point's voxel coordinates into [0, size-1] (ALIGN) or [-0.5, size-0.5] by
    reflection along each axis, and the derivatives' signs: +1, -1, or 0 where the span is
    empty (size 1 with ALIGN). The fold count's parity is taken in floating point, so that
    huge coordinates never overflow an integer. The axes share one loop, which only
    blocks with a huge coordinate enter (a loop per axis costs spills)."""
    lx, sx, ex, vx = _span(x, W, ALIGN)
    ly, sy, ey, vy = _span(y, H, ALIGN)
    lz, sz, ez, vz = _span(z, D, ALIGN)
    x = x - lx
    y = y - ly
    z = z - lz
    rx = tl.abs(x)
    ry = tl.abs(y)
    rz = tl.abs(z)
    while tl.max(tl.where(_huge(rx, sx) | _huge(ry, sy) | _huge(rz, sz), 1, 0)) > 0:
        rx = _reduce(rx, sx, vx)
        ry = _reduce(ry, sy, vy)
        rz = _reduce(rz, sz, vz)
    fx, gx = _reflected(x, rx, lx, sx, ex, vx)
    fy, gy = _reflected(y, ry, ly, sy, ey, vy)
    fz, gz = _reflected(z, rz, lz, sz, ez, vz)
    return fx, fy, fz, gx, gy, gz


@triton.jit
def source_indices(cx, cy, cz, D, H, W, PADDING: tl.constexpr, ALIGN: tl.constexpr):
    """A point's voxel coordinates after unnormalising and padding, and their derivatives.
    Coordinates must be finite (callers replace the others)."""
    x, mx = unnormalize(cx, W, ALIGN)
    y, my = unnormalize(cy, H, ALIGN)
    z, mz = unnormalize(cz, D, ALIGN)
    if PADDING == _REFLECTION:
        x, y, z, gx, gy, gz = reflect(x, y, z, W, H, D, ALIGN)
        mx = mx * gx
        my = my * gy
        mz = mz * gz
    if PADDING != _ZEROS:
        x, gx = clip(x, W)
        y, gy = clip(y, H)
        z, gz = clip(z, D)
        mx = mx * gx
        my = my * gy
        mz = mz * gz
    return x, y, z, mx, my, mz


@triton.jit
def _round_half_even(x):
    """Nearest integer, ties to even (std::nearbyint); exact for every float."""
    low = tl.floor(x)
    frac = x - low  # exact
    up = (frac > 0.5) | ((frac == 0.5) & (tl.floor(low * 0.5) * 2.0 != low))  # odd low
    return tl.where(up, low + 1.0, low)


@triton.jit
def _axis_tap(i, HIGH: tl.constexpr):
    """Low (HIGH=0) or high (HIGH=1) bilinear tap of coordinate i along one axis: its
    position as a float, its weight, and the weight's derivative with respect to i."""
    low = tl.floor(i)
    if HIGH:
        return low + 1.0, i - low, 1.0
    return low, (low + 1.0) - i, -1.0


@triton.jit
def _corner(K: tl.constexpr, ix, iy, iz, valid, D, H, W, TAPS: tl.constexpr,
            INDEX: tl.constexpr):
    """Corner K (= dx + 2 dy + 4 dz) of each point: its voxel (x, y, z), whether it lies in
    the volume (and the point is ``valid``), and its weight. Nearest has the single corner
    K = 0, of weight 1."""
    if TAPS == 1:
        fx = _round_half_even(ix)
        fy = _round_half_even(iy)
        fz = _round_half_even(iz)
        weight = tl.full(ix.shape, 1.0, ix.dtype)
    else:
        fx, wx, _ = _axis_tap(ix, K & 1)
        fy, wy, _ = _axis_tap(iy, (K >> 1) & 1)
        fz, wz, _ = _axis_tap(iz, K >> 2)
        weight = wx * wy * wz
    inside = valid & _within(fx, W) & _within(fy, H) & _within(fz, D)
    x, y, z = _positions(fx, fy, fz, inside, INDEX)
    return x, y, z, inside, weight


@triton.jit
def _within(f, size):
    """Whether integral floats f lie in [0, size)."""
    return (f >= 0.0) & (f < size)


@triton.jit
def _positions(fx, fy, fz, keep, INDEX: tl.constexpr):
    """Integral floats as integers, 0 where not ``keep`` (such a float may be too big)."""
    x = tl.where(keep, fx, 0.0).to(INDEX)
    y = tl.where(keep, fy, 0.0).to(INDEX)
    z = tl.where(keep, fz, 0.0).to(INDEX)
    return x, y, z


@triton.jit
def _corner_weight_grad(K: tl.constexpr, ix, iy, iz):
    """Derivatives of bilinear corner K's weight with respect to ix, iy and iz."""
    _, wx, sx = _axis_tap(ix, K & 1)
    _, wy, sy = _axis_tap(iy, (K >> 1) & 1)
    _, wz, sz = _axis_tap(iz, K >> 2)
    return sx * (wy * wz), sy * (wx * wz), sz * (wx * wy)


# --------------------------------------------------------------------------------------
# The cubic modes' 4 x 4 x 4 footprint (src/cpp/grid_taps.h): per axis the taps
# floor(x) - 1 .. floor(x) + 2 of the unnormalised (unpadded) coordinate, each tap padded
# on its own, weighted by functions of t = x - floor(x). Per-axis values travel as
# 4-tuples indexed by the tap.
# --------------------------------------------------------------------------------------


@triton.jit
def _sixth(x):
    """x / 6 without a division (whose slow path is a subroutine call on NVIDIA GPUs): the
    product by 1/6, corrected by its exact residual."""
    q = x * 0.16666666666666666
    return tl.fma(tl.fma(-q, 6.0, x), 0.16666666666666666, q)


@triton.jit
def _cubic_near(s):
    """The cubic convolution kernel (A = -0.75) at |s| <= 1, and its slope."""
    return ((1.25 * s - 2.25) * s) * s + 1.0, (3.75 * s - 4.5) * s


@triton.jit
def _cubic_far(s):
    """The kernel at 1 < |s| < 2, and its slope."""
    return ((-0.75 * s + 3.75) * s - 6.0) * s + 3.0, (-2.25 * s + 7.5) * s - 6.0


@triton.jit
def _cubic_weights(t, MODE: tl.constexpr):
    """The four taps' weights at t and their derivatives d/dt, as 4-tuples, in the
    operations (and order) of the CPU kernels."""
    if MODE == _BICUBIC:
        w0, d0 = _cubic_far(t + 1.0)
        w1, d1 = _cubic_near(t)
        w2, d2 = _cubic_near(1.0 - t)
        w3, d3 = _cubic_far(2.0 - t)
        return (w0, w1, w2, w3), (d0, d1, 0.0 - d2, 0.0 - d3)
    s = 1.0 - t
    t2 = t * t
    t3 = t2 * t
    weights = (_sixth(s * s * s), _sixth((3.0 * t3 - 6.0 * t2) + 4.0),
               _sixth(((3.0 * t2 - 3.0 * t3) + 3.0 * t) + 1.0), _sixth(t3))
    slopes = (0.0 - s * s * 0.5, (3.0 * t2 - 4.0 * t) * 0.5, ((2.0 * t - 3.0 * t2) + 1.0) * 0.5,
              t2 * 0.5)
    return weights, slopes


@triton.jit
def _cubic_tap(K: tl.constexpr, fx, fy, fz, valid, D, H, W, PADDING: tl.constexpr,
               ALIGN: tl.constexpr, INDEX: tl.constexpr):
    """Tap K of each axis at floor(x) + K - 1, padded: its voxels (x, y, z) and whether each
    reads (zeros: inside the volume; any padding: the point is ``valid``). The padding
    runs in floating point, so huge taps never reach an integer conversion."""
    tx = fx + (K - 1.0)
    ty = fy + (K - 1.0)
    tz = fz + (K - 1.0)
    if PADDING == _ZEROS:
        rx = valid & _within(tx, W)
        ry = valid & _within(ty, H)
        rz = valid & _within(tz, D)
        x = tl.where(rx, tx, 0.0).to(INDEX)
        y = tl.where(ry, ty, 0.0).to(INDEX)
        z = tl.where(rz, tz, 0.0).to(INDEX)
        return x, y, z, rx, ry, rz
    if PADDING == _REFLECTION:
        tx, ty, tz, _, _, _ = reflect(tx, ty, tz, W, H, D, ALIGN)
    tx, _ = clip(tx, W)
    ty, _ = clip(ty, H)
    tz, _ = clip(tz, D)
    return tx.to(INDEX), ty.to(INDEX), tz.to(INDEX), valid, valid, valid


@triton.jit
def _cubic_footprint(cx, cy, cz, mask, D, H, W, MODE: tl.constexpr, PADDING: tl.constexpr,
                     ALIGN: tl.constexpr, INDEX: tl.constexpr):
    """The footprint of points at normalised (cx, cy, cz): (voxels, reads, weights, slopes)
    as axis (x, y, z) -> tap -> values, d(voxel)/d(coordinate) per axis, and whether each
    point is valid (its voxel coordinates are all finite: the others read nothing and
    compute with coordinate 0)."""
    x, mx = unnormalize(cx, W, ALIGN)
    y, my = unnormalize(cy, H, ALIGN)
    z, mz = unnormalize(cz, D, ALIGN)
    valid = mask & (tl.abs(x) < _INF) & (tl.abs(y) < _INF) & (tl.abs(z) < _INF)
    fx = tl.floor(tl.where(valid, x, 0.0))
    fy = tl.floor(tl.where(valid, y, 0.0))
    fz = tl.floor(tl.where(valid, z, 0.0))
    wx, sx = _cubic_weights(tl.where(valid, x, 0.0) - fx, MODE)
    wy, sy = _cubic_weights(tl.where(valid, y, 0.0) - fy, MODE)
    wz, sz = _cubic_weights(tl.where(valid, z, 0.0) - fz, MODE)
    t0 = _cubic_tap(0, fx, fy, fz, valid, D, H, W, PADDING, ALIGN, INDEX)
    t1 = _cubic_tap(1, fx, fy, fz, valid, D, H, W, PADDING, ALIGN, INDEX)
    t2 = _cubic_tap(2, fx, fy, fz, valid, D, H, W, PADDING, ALIGN, INDEX)
    t3 = _cubic_tap(3, fx, fy, fz, valid, D, H, W, PADDING, ALIGN, INDEX)
    voxels = ((t0[0], t1[0], t2[0], t3[0]), (t0[1], t1[1], t2[1], t3[1]),
              (t0[2], t1[2], t2[2], t3[2]))
    reads = ((t0[3], t1[3], t2[3], t3[3]), (t0[4], t1[4], t2[4], t3[4]),
             (t0[5], t1[5], t2[5], t3[5]))
    return (voxels, reads, (wx, wy, wz), (sx, sy, sz)), mx, my, mz, valid


@triton.jit
def _tap_sum(v, w):
    """sum_k v[k] * w[k] over 4 taps, in tap order: (BLOCK_P, BLOCK_C) values, per-point
    weights."""
    return (((v[0] * w[0][:, None] + v[1] * w[1][:, None]) + v[2] * w[2][:, None])
            + v[3] * w[3][:, None])


@triton.jit
def _tap_row(base, fp, KZ: tl.constexpr, KY: tl.constexpr, c, cmask, sC, sD, sH, sW,
             COMPUTE: tl.constexpr):
    """The four x taps' values of row (KZ, KY) of the footprint ``fp``, channels ``c`` of
    the volume at ``base`` (strides sC, sD, sH, sW); a tap that reads nothing gives 0."""
    voxels, reads = fp[0], fp[1]
    row = voxels[2][KZ] * sD + voxels[1][KY] * sH
    on = reads[2][KZ] & reads[1][KY]
    values = ()
    for kx in tl.static_range(4):
        m = (on & reads[0][kx])[:, None] & cmask[None, :]
        at = base + (row + voxels[0][kx] * sW)[:, None] + c[None, :] * sC
        values = values + (tl.load(at, mask=m, other=0.0).to(COMPUTE),)
    return values


@triton.jit
def _tap_value(base, fp, c, cmask, sC, sD, sH, sW, COMPUTE: tl.constexpr):
    """The points' values: over z taps wz times (over y taps wy times (over x taps wx
    times the voxel)), in tap order."""
    weights = fp[2]
    planes = ()
    for kz in tl.static_range(4):
        rows = ()
        for ky in tl.static_range(4):
            rows = rows + (_tap_sum(_tap_row(base, fp, kz, ky, c, cmask, sC, sD, sH, sW,
                                             COMPUTE), weights[0]),)
        planes = planes + (_tap_sum(rows, weights[1]),)
    return _tap_sum(planes, weights[2])


@triton.jit
def _pick(values, k):
    """values[k] of a 4-tuple, for a k known only at run time."""
    return tl.where(k == 0, values[0], tl.where(k == 1, values[1],
                                                tl.where(k == 2, values[2], values[3])))


@triton.jit
def _tap_backward(inp, gin, fp, g, c, cmask, siC, siD, siH, siW, giC, giD, giH, giW,
                  GRAD: tl.constexpr, SCATTER: tl.constexpr, COMPUTE: tl.constexpr):
    """One chunk of channels' backward over the footprint ``fp``: GRAD returns the value's
    derivatives along x, y and z (before the chain's slopes; zeros without GRAD), as the
    CPU's add_tap_coordinate_terms forms them; SCATTER adds g * wx * (wy * wz) into
    ``gin`` atomically, tap by tap. The z taps go in a loop, not unrolled: unrolled,
    the 64 taps' loads and addresses outgrow the registers."""
    voxels, reads, weights, slopes = fp
    gx = tl.zeros(g.shape, COMPUTE)
    gy = tl.zeros(g.shape, COMPUTE)
    gz = tl.zeros(g.shape, COMPUTE)
    for kz in range(4):
        z_voxel = _pick(voxels[2], kz)
        z_reads = _pick(reads[2], kz)
        wz = _pick(weights[2], kz)[:, None]
        if GRAD:
            dx = ()
            value = ()
        for ky in tl.static_range(4):
            on = z_reads & reads[1][ky]
            if GRAD:
                row = z_voxel * siD + voxels[1][ky] * siH
                v = ()
                for kx in tl.static_range(4):
                    m = (on & reads[0][kx])[:, None] & cmask[None, :]
                    at = inp + (row + voxels[0][kx] * siW)[:, None] + c[None, :] * siC
                    v = v + (tl.load(at, mask=m, other=0.0).to(COMPUTE),)
                dx = dx + (_tap_sum(v, slopes[0]),)
                value = value + (_tap_sum(v, weights[0]),)
            if SCATTER:
                row = z_voxel * giD + voxels[1][ky] * giH
                wyz = weights[1][ky][:, None] * wz
                for kx in tl.static_range(4):
                    m = (on & reads[0][kx])[:, None] & cmask[None, :]
                    at = gin + (row + voxels[0][kx] * giW)[:, None] + c[None, :] * giC
                    tl.atomic_add(at, g * (weights[0][kx][:, None] * wyz), mask=m,
                                  sem="relaxed")
        if GRAD:  # the running sums over z add in tap order, as the CPU's tap_sum
            gx += _tap_sum(dx, weights[1]) * wz
            gy += _tap_sum(value, slopes[1]) * wz
            gz += _tap_sum(value, weights[1]) * _pick(slopes[2], kz)[:, None]
    return gx, gy, gz


@triton.jit
def _tap_window(voxels, reads, weights, size):
    """Along one axis, the lowest voxel a point's taps read (``size`` where none does) and
    the summed weights of the taps on each of the voxels low .. low + 3 (the taps of
    consecutive whole numbers, padded, lie within that window)."""
    low = tl.minimum(tl.minimum(tl.where(reads[0], voxels[0], size),
                                tl.where(reads[1], voxels[1], size)),
                     tl.minimum(tl.where(reads[2], voxels[2], size),
                                tl.where(reads[3], voxels[3], size)))
    merged = ()
    for j in tl.static_range(4):
        on = ()
        for k in tl.static_range(4):
            on = on + (tl.where(reads[k] & (voxels[k] == low + j), weights[k], 0.0),)
        merged = merged + (((on[0] + on[1]) + on[2]) + on[3],)
    return low, merged


@triton.jit
def _point_coordinates(field, theta, table, n, q, mask, Do, Ho, Wo, sfN, sfD, sfH, sfW, sfK,
                       COMPUTE: tl.constexpr, AFFINE: tl.constexpr, FIELD: tl.constexpr,
                       SCALED: tl.constexpr):
    """The normalised coordinates (cx, cy, cz) where points (n, q) sample, from the call's
    coordinate source (``Coordinates``): the affine part theta[n] . (bx, by, bz, 1) of the
    base grid (AFFINE), plus the field's value (FIELD), times the per-channel scales
    (SCALED). A grid is a FIELD alone. ``table`` holds bx (Wo), by (Ho), bz (Do) and the
    three scales, in COMPUTE; theta is COMPUTE, contiguous. Row by row:
    c_k = t_k0 * bx + ((t_k1 * by + t_k2 * bz) + t_k3) [+ u_k * scale_k], as the C++ core.
    Returns them and the base coordinates (bx, by, bz), 0 where not ``mask`` (() without
    AFFINE)."""
    d, h, w = split_spatial(q, Ho, Wo)
    base = ()
    if AFFINE:
        bx = tl.load(table + w, mask=mask, other=0.0)
        by = tl.load(table + Wo + h, mask=mask, other=0.0)
        bz = tl.load(table + Wo + Ho + d, mask=mask, other=0.0)
        base = (bx, by, bz)
        t = theta + 12 * n
        cx = tl.load(t) * bx + ((tl.load(t + 1) * by + tl.load(t + 2) * bz) + tl.load(t + 3))
        cy = tl.load(t + 4) * bx + ((tl.load(t + 5) * by + tl.load(t + 6) * bz) + tl.load(t + 7))
        cz = tl.load(t + 8) * bx + ((tl.load(t + 9) * by + tl.load(t + 10) * bz) + tl.load(t + 11))
    if FIELD:
        at = field + n * sfN + d * sfD + h * sfH + w * sfW
        ux = tl.load(at, mask=mask, other=0.0).to(COMPUTE)
        uy = tl.load(at + sfK, mask=mask, other=0.0).to(COMPUTE)
        uz = tl.load(at + 2 * sfK, mask=mask, other=0.0).to(COMPUTE)
        if SCALED:
            scales = table + Wo + Ho + Do
            ux = ux * tl.load(scales)
            uy = uy * tl.load(scales + 1)
            uz = uz * tl.load(scales + 2)
        if AFFINE:
            cx = cx + ux
            cy = cy + uy
            cz = cz + uz
        else:
            cx = ux
            cy = uy
            cz = uz
    return cx, cy, cz, base


@triton.jit
def _grid_point(cx, cy, cz, mask, D, H, W, PADDING: tl.constexpr, ALIGN: tl.constexpr):
    """Padded voxel coordinates (ix, iy, iz) of normalised coordinates (cx, cy, cz), their
    derivatives with respect to them, and whether each point is valid.

    A point is invalid, contributes nothing and computes with coordinate 0 where a grid
    coordinate is not finite, or where its voxel coordinate is not finite in the compute
    precision (a huge float32 overflows: border clips that to an edge, but reflection
    cannot fold it and zeros reads nothing there anyway).
    """
    finite = mask & (tl.abs(cx) < _INF) & (tl.abs(cy) < _INF) & (tl.abs(cz) < _INF)
    ix, iy, iz, mx, my, mz = source_indices(
        tl.where(finite, cx, 0.0), tl.where(finite, cy, 0.0), tl.where(finite, cz, 0.0),
        D, H, W, PADDING, ALIGN)
    valid = finite & (tl.abs(ix) < _INF) & (tl.abs(iy) < _INF) & (tl.abs(iz) < _INF)
    ix = tl.where(valid, ix, 0.0)
    iy = tl.where(valid, iy, 0.0)
    iz = tl.where(valid, iz, 0.0)
    return ix, iy, iz, mx, my, mz, valid


@triton.jit
def _store_theta_terms(out, gx, gy, gz, base, valid, table, q, Ho, Wo):
    """A block's share of grad_theta: at out[4 k + j], the sum over its points of the
    coordinate gradient g_k times the base coordinate b_j, (b_0..b_3) = (bx, by, bz, 1)
    (the affine part is c_k = sum_j theta[k, j] b_j); 0 where a point is not ``valid``,
    which adds g = 0. In float32, ``base``: (bx, by, bz) as ``_point_coordinates``
    loaded them, kept across the channel loop (loaded again, their 64-bit addresses
    would live across it instead: ptxas spilled one on sm_90); in float64, whose values
    take as many registers as the addresses, loaded again from ``table`` (kept, ptxas
    spilled on sm_80)."""
    if gx.dtype == tl.float64:
        d, h, w = split_spatial(q, Ho, Wo)
        bx = tl.load(table + w, mask=valid, other=0.0)
        by = tl.load(table + Wo + h, mask=valid, other=0.0)
        bz = tl.load(table + Wo + Ho + d, mask=valid, other=0.0)
    else:
        bx = tl.where(valid, base[0], 0.0)
        by = tl.where(valid, base[1], 0.0)
        bz = tl.where(valid, base[2], 0.0)
    tl.store(out, tl.sum(gx * bx))
    tl.store(out + 1, tl.sum(gx * by))
    tl.store(out + 2, tl.sum(gx * bz))
    tl.store(out + 3, tl.sum(gx))
    tl.store(out + 4, tl.sum(gy * bx))
    tl.store(out + 5, tl.sum(gy * by))
    tl.store(out + 6, tl.sum(gy * bz))
    tl.store(out + 7, tl.sum(gy))
    tl.store(out + 8, tl.sum(gz * bx))
    tl.store(out + 9, tl.sum(gz * by))
    tl.store(out + 10, tl.sum(gz * bz))
    tl.store(out + 11, tl.sum(gz))


@triton.jit
def _rows_of_item(p, n, S):
    """Whether rows p = n * S + q of the per-point outputs are points of batch item n (q <
    S): the block's mask, formed again where the outputs are stored after the channel loop
    (kept from the start, it lives across the loop, and ptxas spills it)."""
    return p < (n + 1) * S


@triton.jit
def _cell_id(n, z, y, x, D, H, W, TAPS: tl.constexpr):
    """Flat id of a cell: for nearest the voxel (n, z, y, x); for bilinear the unit cube
    whose low corner is (z-1, y-1, x-1), ids over (D+1)(H+1)(W+1) cells per batch item;
    for the cubic modes the 4 x 4 x 4 window whose low corner is (z-3, y-3, x-3), ids over
    (D+3)(H+3)(W+3)."""
    if TAPS == 1:
        return ((n * D + z) * H + y) * W + x
    if TAPS == 4:
        return ((n * (D + 3) + z) * (H + 3) + y) * (W + 3) + x
    return ((n * (D + 1) + z) * (H + 1) + y) * (W + 1) + x


@triton.jit
def _forward_kernel(inp, field, theta, table, out, C, D, H, W, S, Do, Ho, Wo,
                    siN, siC, siD, siH, siW, sfN, sfD, sfH, sfW, sfK, soN, soC, soQ,
                    MODE: tl.constexpr, TAPS: tl.constexpr, PADDING: tl.constexpr,
                    ALIGN: tl.constexpr,
                    AFFINE: tl.constexpr, FIELD: tl.constexpr, SCALED: tl.constexpr,
                    COMPUTE: tl.constexpr, INDEX: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[n, c, q] = sum over corners (taps) of weight * input; one program per BLOCK_P
    points."""
    n, q, pmask = block_of_points(tl.program_id(0), S, BLOCK_P, INDEX)
    cx, cy, cz, _ = _point_coordinates(field, theta, table, n, q, pmask, Do, Ho, Wo, sfN, sfD,
                                       sfH, sfW, sfK, COMPUTE, AFFINE, FIELD, SCALED)
    if TAPS == 4:
        fp, _, _, _, _ = _cubic_footprint(cx, cy, cz, pmask, D, H, W, MODE, PADDING, ALIGN,
                                          INDEX)
    else:
        ix, iy, iz, _, _, _, valid = _grid_point(cx, cy, cz, pmask, D, H, W, PADDING, ALIGN)
    for c0 in range(0, C, BLOCK_C):
        c = (c0 + tl.arange(0, BLOCK_C)).to(INDEX)
        cmask = c < C
        if TAPS == 4:
            acc = _tap_value(inp + n * siN, fp, c, cmask, siC, siD, siH, siW, COMPUTE)
        else:
            acc = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
            for k in tl.static_range(TAPS * TAPS * TAPS):
                x, y, z, inside, weight = _corner(k, ix, iy, iz, valid, D, H, W, TAPS, INDEX)
                offset = n * siN + z * siD + y * siH + x * siW
                v = tl.load(inp + offset[:, None] + c[None, :] * siC,
                            mask=inside[:, None] & cmask[None, :], other=0.0)
                acc += v.to(COMPUTE) * weight[:, None]
        tl.store(out + n * soN + q[:, None] * soQ + c[None, :] * soC,
                 acc.to(out.dtype.element_ty), mask=pmask[:, None] & cmask[None, :])


@triton.jit
def _backward_points_kernel(
        gout, inp, field, theta, table, grad_field, grad_theta, gin, keys, coords, go_offsets,
        C, D, H, W, S, Do, Ho, Wo, NO_CELL,
        sgoN, sgoC, sgoD, sgoH, sgoW, siN, siC, siD, siH, siW, sfN, sfD, sfH, sfW, sfK,
        giN, giC, giD, giH, giW,
        MODE: tl.constexpr, TAPS: tl.constexpr, PADDING: tl.constexpr,
        ALIGN: tl.constexpr,
        AFFINE: tl.constexpr, FIELD: tl.constexpr, SCALED: tl.constexpr,
        FIELD_GRAD: tl.constexpr, THETA_GRAD: tl.constexpr, SCATTER: tl.constexpr,
        KEYS: tl.constexpr, COMPUTE: tl.constexpr, INDEX: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Per-point backward work, one program per BLOCK_P points, whose grid gradient (the
    derivative in the sample coordinates; bilinear only, nearest's is 0) goes to the
    coordinate source's sinks: FIELD_GRAD stores it into ``grad_field`` (a grid's gradient,
    or a displacement's, times the scales where SCALED); THETA_GRAD stores this program's
    sums of it times (bx, by, bz, 1) into its 12 entries of ``grad_theta``, in a fixed
    order. SCATTER: atomic adds of grad_output * weight into ``gin``. KEYS: each point's
    cell id (NO_CELL if it touches no voxel), the offset of its grad_output elements
    (``go_offsets``) and, for bilinear, its padded coordinates."""
    n, q, pmask = block_of_points(tl.program_id(0), S, BLOCK_P, INDEX)
    cx, cy, cz, base = _point_coordinates(field, theta, table, n, q, pmask, Do, Ho, Wo, sfN,
                                          sfD, sfH, sfW, sfK, COMPUTE, AFFINE, FIELD, SCALED)
    if TAPS == 4:
        fp, mx, my, mz, valid = _cubic_footprint(cx, cy, cz, pmask, D, H, W, MODE, PADDING,
                                                 ALIGN, INDEX)
    else:
        ix, iy, iz, mx, my, mz, valid = _grid_point(cx, cy, cz, pmask, D, H, W, PADDING,
                                                    ALIGN)
    p = n * S + q  # row of grad_grid, keys, coords and go_offsets
    if FIELD_GRAD or THETA_GRAD or SCATTER or KEYS:
        d, h, w = split_spatial(q, Ho, Wo)
        go_at = n * sgoN + d * sgoD + h * sgoH + w * sgoW  # grad_output[n, 0, point]
    if FIELD_GRAD or THETA_GRAD or SCATTER:
        go_q = gout + go_at
        sx = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
        sy = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
        sz = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
        for c0 in range(0, C, BLOCK_C):
            c = (c0 + tl.arange(0, BLOCK_C)).to(INDEX)
            cmask = c < C
            g = tl.load(go_q[:, None] + c[None, :] * sgoC, mask=valid[:, None] & cmask[None, :],
                        other=0.0).to(COMPUTE)
            if TAPS == 4:
                tx, ty, tz = _tap_backward(inp + n * siN, gin + n * giN, fp, g, c, cmask, siC,
                                           siD, siH, siW, giC, giD, giH, giW,
                                           FIELD_GRAD or THETA_GRAD, SCATTER, COMPUTE)
            else:
                tx = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
                ty = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
                tz = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
                for k in tl.static_range(TAPS * TAPS * TAPS):
                    x, y, z, inside, weight = _corner(k, ix, iy, iz, valid, D, H, W, TAPS,
                                                      INDEX)
                    m = inside[:, None] & cmask[None, :]
                    if FIELD_GRAD or THETA_GRAD:
                        dwx, dwy, dwz = _corner_weight_grad(k, ix, iy, iz)
                        offset = n * siN + z * siD + y * siH + x * siW
                        v = tl.load(inp + offset[:, None] + c[None, :] * siC, mask=m,
                                    other=0.0).to(COMPUTE)
                        tx += v * dwx[:, None]
                        ty += v * dwy[:, None]
                        tz += v * dwz[:, None]
                    if SCATTER:
                        offset = n * giN + z * giD + y * giH + x * giW
                        tl.atomic_add(gin + offset[:, None] + c[None, :] * giC,
                                      g * weight[:, None], mask=m, sem="relaxed")
            sx += tx * g
            sy += ty * g
            sz += tz * g
        if FIELD_GRAD or THETA_GRAD:
            gx = tl.where(valid, mx * tl.sum(sx, axis=1), 0.0)
            gy = tl.where(valid, my * tl.sum(sy, axis=1), 0.0)
            gz = tl.where(valid, mz * tl.sum(sz, axis=1), 0.0)
            if FIELD_GRAD:
                fx, fy, fz = gx, gy, gz
                if SCALED:
                    scales = table + Wo + Ho + Do
                    fx = gx * tl.load(scales)
                    fy = gy * tl.load(scales + 1)
                    fz = gz * tl.load(scales + 2)
                row = grad_field + 3 * p
                dtype = grad_field.dtype.element_ty
                mine = _rows_of_item(p, n, S)
                tl.store(row, fx.to(dtype), mask=mine)
                tl.store(row + 1, fy.to(dtype), mask=mine)
                tl.store(row + 2, fz.to(dtype), mask=mine)
            if THETA_GRAD:
                _store_theta_terms(grad_theta + 12 * tl.program_id(0).to(INDEX), gx, gy, gz,
                                   base, valid, table, q, Ho, Wo)
    if KEYS:
        mine = _rows_of_item(p, n, S)
        if TAPS == 4:  # keyed by the low corner of its window
            voxels, reads, weights, _ = fp
            x, wx = _tap_window(voxels[0], reads[0], weights[0], W)
            y, wy = _tap_window(voxels[1], reads[1], weights[1], H)
            z, wz = _tap_window(voxels[2], reads[2], weights[2], D)
            touches = (x < W) & (y < H) & (z < D)
            row = coords + 12 * p
            for j in tl.static_range(4):
                tl.store(row + j, wx[j], mask=mine)
                tl.store(row + 4 + j, wy[j], mask=mine)
                tl.store(row + 8 + j, wz[j], mask=mine)
            x, y, z = x + 3, y + 3, z + 3
        elif TAPS == 1:
            x, y, z, touches, _ = _corner(0, ix, iy, iz, valid, D, H, W, TAPS, INDEX)
        else:  # shifted by one: the cell's low corner may lie at -1
            fx = tl.floor(ix) + 1.0
            fy = tl.floor(iy) + 1.0
            fz = tl.floor(iz) + 1.0
            touches = valid & _within(fx, W + 1) & _within(fy, H + 1) & _within(fz, D + 1)
            x, y, z = _positions(fx, fy, fz, touches, INDEX)
            row = coords + 3 * p
            tl.store(row, ix, mask=mine)
            tl.store(row + 1, iy, mask=mine)
            tl.store(row + 2, iz, mask=mine)
        cell = tl.where(touches, _cell_id(n, z, y, x, D, H, W, TAPS), NO_CELL)
        tl.store(keys + p, cell.to(keys.dtype.element_ty), mask=mine)
        tl.store(go_offsets + p, go_at.to(go_offsets.dtype.element_ty), mask=mine)


@triton.jit
def _gather_cell(acc, ex, ey, ez, n, z, y, x, D, H, W, gout, order, coords, go_offsets,
                 starts, vmask, c, cmask, sgoC, TAPS: tl.constexpr, COMPUTE: tl.constexpr,
                 INDEX: tl.constexpr):
    """``acc`` plus the terms of the points of the cell at offset (ex, ey, ez) from each
    voxel (z, y, x), in point order: grad_output times the voxel's weight, from the
    values the keys pass stored per point in ``coords`` (bilinear: the padded coordinates,
    the cubic modes: per axis the summed weights of the window's voxels)."""
    cell = _cell_id(n, z + ez, y + ey, x + ex, D, H, W, TAPS)
    first = tl.load(starts + cell, mask=vmask, other=0).to(INDEX)
    end = tl.load(starts + cell + 1, mask=vmask, other=0).to(INDEX)
    for j in range(tl.max(end - first)):
        at = first + j
        m = at < end
        p = tl.load(order + at, mask=m, other=0).to(INDEX)
        go = gout + tl.load(go_offsets + p, mask=m, other=0).to(INDEX)
        g = tl.load(go[:, None] + c[None, :] * sgoC, mask=m[:, None] & cmask[None, :],
                    other=0.0).to(COMPUTE)
        if TAPS == 1:
            acc += g
        elif TAPS == 4:
            row = coords + 12 * p
            wx = tl.load(row + (3 - ex), mask=m, other=0.0)
            wy = tl.load(row + (7 - ey), mask=m, other=0.0)
            wz = tl.load(row + (11 - ez), mask=m, other=0.0)
            acc += g * (wx * (wy * wz))[:, None]
        else:
            _, wx, _ = _axis_tap(tl.load(coords + 3 * p, mask=m, other=0.0), 1 - ex)
            _, wy, _ = _axis_tap(tl.load(coords + 3 * p + 1, mask=m, other=0.0), 1 - ey)
            _, wz, _ = _axis_tap(tl.load(coords + 3 * p + 2, mask=m, other=0.0), 1 - ez)
            acc += g * (wx * wy * wz)[:, None]
    return acc


@triton.jit
def _gather_input_grad_kernel(
        gout, gin, order, coords, go_offsets, starts,
        C, D, H, W, S_in, CHUNKS, sgoC, giN, giC, giQ,
        TAPS: tl.constexpr, COMPUTE: tl.constexpr, INDEX: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """grad_input without atomics: one program per BLOCK_P input voxels and BLOCK_C
    channels, each voxel summing the points of the cells around it (``order``/``starts``:
    the points sorted by cell, and each cell's first position), cell by cell, in point
    order within a cell. A point's grad_output elements are read at its offset from the
    points pass: no division per point."""
    pid = tl.program_id(0)
    n, v, vmask = block_of_points(pid // CHUNKS, S_in, BLOCK_P, INDEX)
    c = (pid % CHUNKS) * BLOCK_C + tl.arange(0, BLOCK_C).to(INDEX)
    cmask = c < C
    z, y, x = split_spatial(v, H, W)
    acc = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
    if TAPS == 4:
        # Along each axis the voxel is tap 3 - e of the window whose (shifted) low corner
        # lies at its own position + e, e = 0..3.
        for k in range(64):
            acc = _gather_cell(acc, k % 4, (k // 4) % 4, k // 16, n, z, y, x, D, H, W, gout,
                               order, coords, go_offsets, starts, vmask, c, cmask, sgoC, TAPS,
                               COMPUTE, INDEX)
    else:
        # Bilinear: along each axis the voxel is the high corner of the cell at its own
        # (shifted) position and the low corner of the next cell.
        for k in tl.static_range(TAPS * TAPS * TAPS):
            acc = _gather_cell(acc, k & 1, (k >> 1) & 1, k >> 2, n, z, y, x, D, H, W, gout,
                               order, coords, go_offsets, starts, vmask, c, cmask, sgoC, TAPS,
                               COMPUTE, INDEX)
    # v again, from the (z, y, x) the cells keep live: v's own base would be one more
    # value live across them (ptxas spilled it: sm_80, int64, cubic at (64, 8))
    v = (z * H + y) * W + x
    tl.store(gin + n * giN + v[:, None] * giQ + c[None, :] * giC,
             acc.to(gin.dtype.element_ty), mask=vmask[:, None] & cmask[None, :])


def _points_tile(input):
    """Tile of the kernels over grid points: one point per thread in NCDHW, looping over
    channels; a point's channels side by side in channels_last_3d. (More points per thread
    leave the unrolled corners short of registers.)"""
    if is_channels_last(input):
        return tile(input.shape[1], 32, 128)
    return 128, 1


@dataclasses.dataclass(frozen=True)
class Coordinates:
    """Where a call's points sample, as the kernels take it (their coordinate source): a
    ``field`` (N, Do, Ho, Wo, 3) -- the grid of grid sampling, or a warp's displacement --
    and, for a warp, the affine part ``theta`` (N, 3, 4, the compute dtype, contiguous)
    over the base grid. ``table`` holds the base coordinates bx (Wo), by (Ho), bz (Do) and
    the field's three per-channel scales (``scaled``: a displacement in voxels), in the
    compute dtype. ``dtype`` is that of the coordinates the caller gave, and of their
    gradients."""
    batch: int
    spatial: tuple  # (Do, Ho, Wo)
    dtype: torch.dtype
    field: torch.Tensor | None = None
    theta: torch.Tensor | None = None
    table: torch.Tensor | None = None
    scaled: bool = False

    def args(self, unused):
        """The kernels' pointer arguments (field, theta, table), then the field's strides."""
        return (_or(self.field, unused), _or(self.theta, unused), _or(self.table, unused),
                *(self.field.stride() if self.field is not None else (0,) * 5))

    def consts(self):
        return dict(AFFINE=self.theta is not None, FIELD=self.field is not None,
                    SCALED=self.scaled)

    def tensors(self):
        return tuple(t for t in (self.field, self.theta, self.table) if t is not None)


def grid_coordinates(grid) -> Coordinates:
    """A grid as the coordinate source: its values are where the points sample."""
    return Coordinates(grid.shape[0], tuple(grid.shape[1:4]), grid.dtype, field=grid)


def _setup(input, coords, mode, padding_mode, align_corners, tensors, counts):
    """Sizes (N, C, D, H, W, S = Do*Ho*Wo, Do, Ho, Wo), the compute dtype and the
    constexprs shared by the kernels of one call; INDEX covers ``tensors`` and ``counts``."""
    N, C, D, H, W = input.shape
    Do, Ho, Wo = coords.spatial
    compute = compute_dtype(input.dtype, coords.dtype)
    # The kernels' structure follows the mode's taps per axis; MODE picks its weights.
    consts = dict(MODE=mode, TAPS=MODES.of(mode).taps, PADDING=padding_mode,
                  ALIGN=bool(align_corners),
                  COMPUTE=tl_dtype(compute), **coords.consts(),
                  INDEX=index_dtype(input, *coords.tensors(), *tensors, counts=counts))
    return (N, C, D, H, W, Do * Ho * Wo, Do, Ho, Wo), compute, consts


def _cells(N, D, H, W, mode):
    """Number of cells points are keyed by: voxels (nearest), unit cubes (bilinear) or
    windows of 4 x 4 x 4 voxels (the cubic modes)."""
    if mode == NEAREST:
        return N * D * H * W
    reach = MODES.of(mode).taps - 1
    return N * (D + reach) * (H + reach) * (W + reach)


def _window_values(mode):
    """Values per point the keys pass stores for the gather: none (nearest), the padded
    coordinates (bilinear) or the summed weights of the 4 voxels of each axis (cubic)."""
    return {1: 0, 2: 3, 4: 12}[MODES.of(mode).taps]


def forward(call, input, grid):
    """Sample ``input`` (N, C, D, H, W) at ``grid`` (N, Do, Ho, Wo, 3) as the checked
    ``call`` (a ``_calls.GridSample``) says: SPEC §2. A float32/float64 grid may accompany
    16-bit input (computed in the grid's precision, at least float32). Returns
    (N, C, Do, Ho, Wo) in the input's dtype and memory format.
    """
    with on_device_of(input):
        return sample(input, grid_coordinates(grid), call.mode, call.padding,
                      call.align_corners)


def sample(input, coords: Coordinates, mode: int, padding_mode: int, align_corners: bool):
    """``input`` sampled where ``coords`` says: the forward of grid sampling and of warps."""
    out = new_volume(tuple(input.shape[:2]) + coords.spatial, input.dtype, input)
    if out.numel() == 0:
        return out
    (N, C, D, H, W, S, Do, Ho, Wo), _, consts = _setup(input, coords, mode, padding_mode,
                                                       align_corners, (out,), ())
    block_p, block_c = _points_tile(input)
    _forward_kernel[programs(N, S, block_p)](
        input, *coords.args(out)[:3], out, C, D, H, W, S, Do, Ho, Wo, *input.stride(),
        *coords.args(out)[3:], *dense_strides(out), **consts, BLOCK_P=block_p,
        BLOCK_C=block_c, **LAUNCH)
    return out


def backward(call, grad_output, input, grid, deterministic: bool):
    """Gradients of ``forward`` with respect to input and grid: SPEC §2.

    ``call.output_mask`` (want grad_input, want grad_grid): a gradient not asked for is not
    computed and comes back as None. ``deterministic`` selects the atomic-free gather for
    grad_input (bitwise reproducible) over the atomic scatter. grad_grid has the grid's
    dtype and is exactly 0 for nearest; grad_input has the input's dtype and memory format.
    """
    want_input, want_grid = (bool(m) for m in call.output_mask)
    with on_device_of(input):
        grad_input, grad_grid, _ = sample_backward(
            grad_output, input, grid_coordinates(grid), call.mode, call.padding,
            call.align_corners, want_input, want_grid, False, deterministic)
    return grad_input, grad_grid


def sample_backward(grad_output, input, coords: Coordinates, mode: int, padding_mode: int,
                    align_corners: bool, want_input: bool, want_field: bool, want_theta: bool,
                    deterministic: bool):
    """(grad_input, grad_field, grad_theta) of ``sample``, None where not wanted: the
    field's gradient has its shape and ``coords.dtype`` (scaled as the field is), theta's
    is (N, 3, 4) in ``coords.dtype``, summed per block of points and then over the blocks
    in float64, in a fixed order. Both are exactly 0 for nearest."""
    N, C, D, H, W = input.shape
    Do, Ho, Wo = coords.spatial
    points = N * Do * Ho * Wo
    work = points * C > 0
    smooth = mode != NEAREST and work
    field_shape = (N, Do, Ho, Wo, 3)
    grad_field = grad_theta = None
    device = input.device
    if want_field:
        make = torch.empty if smooth else torch.zeros
        grad_field = make(field_shape, dtype=coords.dtype, device=device)
    if want_theta and not smooth:
        grad_theta = torch.zeros((N, 3, 4), dtype=coords.dtype, device=device)
    if want_input and not work:
        return new_volume(input.shape, input.dtype, input, zero=True), grad_field, grad_theta
    run_field, run_theta = want_field and smooth, want_theta and smooth
    if not (want_input or run_field or run_theta):
        return None, grad_field, grad_theta
    sizes, compute, consts = _setup(input, coords, mode, padding_mode, align_corners,
                                    (grad_output,),
                                    (3 * points, _cells(N, D, H, W, mode) + 1, input.numel()))
    block_p, _ = _points_tile(input)
    sinks: dict[str, Any] = dict(grad_field=grad_field if run_field else None,
                 partials=(torch.empty((programs(N, Do * Ho * Wo, block_p)[0], 12),
                                       dtype=compute, device=device) if run_theta else None))
    if not want_input:
        _points_pass(grad_output, input, coords, sizes, consts, **sinks)
    elif deterministic:
        grad_input = _gathered_input_grad(grad_output, input, coords, sinks, sizes, compute,
                                          consts)
    else:
        grad_input = _scattered_input_grad(grad_output, input, coords, sinks, sizes, compute,
                                           consts)
    if run_theta:  # the blocks' sums, batch by batch, in block order
        partials = sinks["partials"].view(N, -1, 3, 4)
        grad_theta = partials.to(torch.float64).sum(1).to(coords.dtype)
    return (grad_input if want_input else None), grad_field, grad_theta


def _points_pass(grad_output, input, coords, sizes, consts, grad_field=None, partials=None,
                 gin=None, keys=None, coords_out=None, go_offsets=None):
    """Launch ``_backward_points_kernel`` for the outputs given (None: not wanted)."""
    N, C, D, H, W, S, Do, Ho, Wo = sizes
    unused = grad_output.new_empty(0)  # stands for the pointers of outputs not wanted
    block_p, block_c = _points_tile(input)
    _backward_points_kernel[programs(N, S, block_p)](
        grad_output, input, *coords.args(unused)[:3], _or(grad_field, unused),
        _or(partials, unused), _or(gin, unused), _or(keys, unused), _or(coords_out, unused),
        _or(go_offsets, unused), C, D, H, W, S, Do, Ho, Wo, _cells(N, D, H, W, consts["MODE"]),
        *grad_output.stride(), *input.stride(), *coords.args(unused)[3:],
        *(gin.stride() if gin is not None else (0,) * 5), **consts,
        FIELD_GRAD=grad_field is not None, THETA_GRAD=partials is not None,
        SCATTER=gin is not None, KEYS=keys is not None,
        BLOCK_P=block_p, BLOCK_C=block_c, **LAUNCH)


def _or(t, default):
    return default if t is None else t


def _scattered_input_grad(grad_output, input, coords, sinks, sizes, compute, consts):
    """grad_input by atomic adds, into a ``compute``-dtype buffer rounded once at the end."""
    acc = new_volume(input.shape, compute, input, zero=True)
    _points_pass(grad_output, input, coords, sizes, consts, gin=acc, **sinks)
    return acc if acc.dtype == input.dtype else acc.to(input.dtype)


def _gathered_input_grad(grad_output, input, coords, sinks, sizes, compute, consts):
    """grad_input by the deterministic gather (see the module docstring)."""
    N, C, D, H, W, S, Do, Ho, Wo = sizes
    cells = _cells(N, D, H, W, consts["MODE"])
    device = input.device
    key_dtype = torch.int64 if consts["INDEX"] == tl.int64 else torch.int32
    keys = torch.empty(N * S, dtype=key_dtype, device=device)
    go_offsets = torch.empty(N * S, dtype=key_dtype, device=device)
    voxel_coords = torch.empty(_window_values(consts["MODE"]) * N * S, dtype=compute,
                               device=device)
    _points_pass(grad_output, input, coords, sizes, consts, keys=keys, coords_out=voxel_coords,
                 go_offsets=go_offsets, **sinks)
    sorted_keys, order = torch.sort(keys, stable=True)
    cell_ids = torch.arange(cells + 1, dtype=key_dtype, device=device)
    starts = torch.searchsorted(sorted_keys, cell_ids, out_int32=key_dtype == torch.int32)
    grad_input = new_volume(input.shape, input.dtype, input)
    block_p, block_c = tile(C, 32, 512)  # a voxel's channels share its walk over the points
    chunks = triton.cdiv(C, block_c)
    # 8 warps, 2 values a thread: at 4 (4 warps), ptxas spills a value live across the
    # cells (8 bytes, sm_80, at (256, 2) and the cubic modes' (128, 4))
    _gather_input_grad_kernel[programs(N, D * H * W, block_p, chunks)](
        grad_output, grad_input, order, voxel_coords, go_offsets, starts, C, D, H, W, D * H * W,
        chunks, grad_output.stride(1), *dense_strides(grad_input), TAPS=consts["TAPS"],
        COMPUTE=consts["COMPUTE"], INDEX=consts["INDEX"], BLOCK_P=block_p, BLOCK_C=block_c,
        num_warps=8, **LAUNCH)
    return grad_input
