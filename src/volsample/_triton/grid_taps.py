"""Grid sampling's taps for the Triton kernels (the C++ core's ``src/cpp/grid_taps.h``):
a point's corners (``corner``: eight for the 2-tap mode, in PyTorch's order tnw, tne, tsw,
tse, bnw, bne, bsw, bse; one for nearest; kernels loop over them with
``tl.static_range``, so the corner code is written once), the 4-tap modes' 4 x 4 x 4
footprint (``cubic_footprint``: per axis four taps floor(x) - 1 .. floor(x) + 2 of the
unpadded coordinate, each padded on its own, with separable weights; values and grid
gradients summed in the CPU's tap order), and what the backward keeps per point: cells'
ids, the window of a footprint, a block's share of theta's gradient.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .._tables import MODES
from . import split_spatial
from .grid_coords import _REFLECTION, _ZEROS, INF, clip, reflect, unnormalize

_BICUBIC = tl.constexpr(MODES["bicubic"].code)  # cubic_weights' choice; the rest: TAPS


@triton.jit
def round_half_even(x):
    """Nearest integer, ties to even (std::nearbyint); exact for every float."""
    low = tl.floor(x)
    frac = x - low  # exact
    up = (frac > 0.5) | ((frac == 0.5) & (tl.floor(low * 0.5) * 2.0 != low))  # odd low
    return tl.where(up, low + 1.0, low)


@triton.jit
def axis_tap(i, HIGH: tl.constexpr):
    """Low (HIGH=0) or high (HIGH=1) bilinear tap of coordinate i along one axis: its
    position as a float, its weight, and the weight's derivative with respect to i."""
    low = tl.floor(i)
    if HIGH:
        return low + 1.0, i - low, 1.0
    return low, (low + 1.0) - i, -1.0


@triton.jit
def corner(K: tl.constexpr, ix, iy, iz, valid, D, H, W, TAPS: tl.constexpr,
            INDEX: tl.constexpr):
    """Corner K (= dx + 2 dy + 4 dz) of each point: its voxel (x, y, z), whether it lies in
    the volume (and the point is ``valid``), and its weight. Nearest has the single corner
    K = 0, of weight 1."""
    if TAPS == 1:
        fx = round_half_even(ix)
        fy = round_half_even(iy)
        fz = round_half_even(iz)
        weight = tl.full(ix.shape, 1.0, ix.dtype)
    else:
        fx, wx, _ = axis_tap(ix, K & 1)
        fy, wy, _ = axis_tap(iy, (K >> 1) & 1)
        fz, wz, _ = axis_tap(iz, K >> 2)
        weight = wx * wy * wz
    inside = valid & within(fx, W) & within(fy, H) & within(fz, D)
    x, y, z = positions(fx, fy, fz, inside, INDEX)
    return x, y, z, inside, weight


@triton.jit
def within(f, size):
    """Whether integral floats f lie in [0, size)."""
    return (f >= 0.0) & (f < size)


@triton.jit
def positions(fx, fy, fz, keep, INDEX: tl.constexpr):
    """Integral floats as integers, 0 where not ``keep`` (such a float may be too big)."""
    x = tl.where(keep, fx, 0.0).to(INDEX)
    y = tl.where(keep, fy, 0.0).to(INDEX)
    z = tl.where(keep, fz, 0.0).to(INDEX)
    return x, y, z


@triton.jit
def corner_weight_grad(K: tl.constexpr, ix, iy, iz):
    """Derivatives of bilinear corner K's weight with respect to ix, iy and iz."""
    _, wx, sx = axis_tap(ix, K & 1)
    _, wy, sy = axis_tap(iy, (K >> 1) & 1)
    _, wz, sz = axis_tap(iz, K >> 2)
    return sx * (wy * wz), sy * (wx * wz), sz * (wx * wy)


# --------------------------------------------------------------------------------------
# The cubic modes' 4 x 4 x 4 footprint (src/cpp/grid_taps.h): per axis the taps
# floor(x) - 1 .. floor(x) + 2 of the unnormalised (unpadded) coordinate, each tap padded
# on its own, weighted by functions of t = x - floor(x). Per-axis values travel as
# 4-tuples indexed by the tap.
# --------------------------------------------------------------------------------------


@triton.jit
def sixth(x):
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
def cubic_weights(t, MODE: tl.constexpr):
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
    weights = (sixth(s * s * s), sixth((3.0 * t3 - 6.0 * t2) + 4.0),
               sixth(((3.0 * t2 - 3.0 * t3) + 3.0 * t) + 1.0), sixth(t3))
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
        rx = valid & within(tx, W)
        ry = valid & within(ty, H)
        rz = valid & within(tz, D)
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
def cubic_footprint(cx, cy, cz, mask, D, H, W, MODE: tl.constexpr, PADDING: tl.constexpr,
                     ALIGN: tl.constexpr, INDEX: tl.constexpr):
    """The footprint of points at normalised (cx, cy, cz): (voxels, reads, weights, slopes)
    as axis (x, y, z) -> tap -> values, d(voxel)/d(coordinate) per axis, and whether each
    point is valid (its voxel coordinates are all finite: the others read nothing and
    compute with coordinate 0)."""
    x, mx = unnormalize(cx, W, ALIGN)
    y, my = unnormalize(cy, H, ALIGN)
    z, mz = unnormalize(cz, D, ALIGN)
    valid = mask & (tl.abs(x) < INF) & (tl.abs(y) < INF) & (tl.abs(z) < INF)
    fx = tl.floor(tl.where(valid, x, 0.0))
    fy = tl.floor(tl.where(valid, y, 0.0))
    fz = tl.floor(tl.where(valid, z, 0.0))
    wx, sx = cubic_weights(tl.where(valid, x, 0.0) - fx, MODE)
    wy, sy = cubic_weights(tl.where(valid, y, 0.0) - fy, MODE)
    wz, sz = cubic_weights(tl.where(valid, z, 0.0) - fz, MODE)
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
def tap_sum(v, w):
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
def tap_value(base, fp, c, cmask, sC, sD, sH, sW, COMPUTE: tl.constexpr):
    """The points' values: over z taps wz times (over y taps wy times (over x taps wx
    times the voxel)), in tap order."""
    weights = fp[2]
    planes = ()
    for kz in tl.static_range(4):
        rows = ()
        for ky in tl.static_range(4):
            rows = rows + (tap_sum(_tap_row(base, fp, kz, ky, c, cmask, sC, sD, sH, sW,
                                             COMPUTE), weights[0]),)
        planes = planes + (tap_sum(rows, weights[1]),)
    return tap_sum(planes, weights[2])


@triton.jit
def _pick(values, k):
    """values[k] of a 4-tuple, for a k known only at run time."""
    return tl.where(k == 0, values[0], tl.where(k == 1, values[1],
                                                tl.where(k == 2, values[2], values[3])))


@triton.jit
def tap_backward(inp, gin, fp, g, c, cmask, siC, siD, siH, siW, giC, giD, giH, giW,
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
                dx = dx + (tap_sum(v, slopes[0]),)
                value = value + (tap_sum(v, weights[0]),)
            if SCATTER:
                row = z_voxel * giD + voxels[1][ky] * giH
                wyz = weights[1][ky][:, None] * wz
                for kx in tl.static_range(4):
                    m = (on & reads[0][kx])[:, None] & cmask[None, :]
                    at = gin + (row + voxels[0][kx] * giW)[:, None] + c[None, :] * giC
                    tl.atomic_add(at, g * (weights[0][kx][:, None] * wyz), mask=m,
                                  sem="relaxed")
        if GRAD:  # the running sums over z add in tap order, as the CPU's tap_sum
            gx += tap_sum(dx, weights[1]) * wz
            gy += tap_sum(value, slopes[1]) * wz
            gz += tap_sum(value, weights[1]) * _pick(slopes[2], kz)[:, None]
    return gx, gy, gz


@triton.jit
def tap_window(voxels, reads, weights, size):
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
def store_theta_terms(out, gx, gy, gz, base, valid, table, q, Ho, Wo):
    """A block's share of grad_theta: at out[4 k + j], the sum over its points of the
    coordinate gradient g_k times the base coordinate b_j, (b_0..b_3) = (bx, by, bz, 1)
    (the affine part is c_k = sum_j theta[k, j] b_j); 0 where a point is not ``valid``,
    which adds g = 0. In float32, ``base``: (bx, by, bz) as ``point_coordinates``
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
def rows_of_item(p, n, S):
    """Whether rows p = n * S + q of the per-point outputs are points of batch item n (q <
    S): the block's mask, formed again where the outputs are stored after the channel loop
    (kept from the start, it lives across the loop, and ptxas spills it)."""
    return p < (n + 1) * S


@triton.jit
def cell_id(n, z, y, x, D, H, W, TAPS: tl.constexpr):
    """Flat id of a cell: for nearest the voxel (n, z, y, x); for bilinear the unit cube
    whose low corner is (z-1, y-1, x-1), ids over (D+1)(H+1)(W+1) cells per batch item;
    for the cubic modes the 4 x 4 x 4 window whose low corner is (z-3, y-3, x-3), ids over
    (D+3)(H+3)(W+3)."""
    if TAPS == 1:
        return ((n * D + z) * H + y) * W + x
    if TAPS == 4:
        return ((n * (D + 3) + z) * (H + 3) + y) * (W + 3) + x
    return ((n * (D + 1) + z) * (H + 1) + y) * (W + 1) + x
