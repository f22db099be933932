"""Grid sampling's coordinate maths for the Triton kernels, the C++ core's
``src/cpp/coords.h`` written as @triton.jit helpers over blocks of points: ``unnormalize``,
``clip`` and ``reflect`` return coordinates and their derivatives, ``source_indices``
composes them (``reflect`` folds with an exact fmod and division emulated by fmas, so that
no kernel calls a division's or fmod's subroutine), ``grid_point`` makes a point's padded
voxel coordinates, and ``point_coordinates`` reads where a point samples from the call's
coordinate source (a grid, or a warp's theta and displacement), which the launchers hand
the kernels as ``Coordinates``.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .._tables import REFLECTION, ZEROS
from . import split_spatial

_REFLECTION = tl.constexpr(REFLECTION)
_ZEROS = tl.constexpr(ZEROS)
INF = tl.constexpr(float("inf"))


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
    # Selects rather than min/max, which may drop a NaN: a NaN must stay one (see grid_point).
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
def point_coordinates(field, theta, table, n, q, mask, Do, Ho, Wo, sfN, sfD, sfH, sfW, sfK,
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
def grid_point(cx, cy, cz, mask, D, H, W, PADDING: tl.constexpr, ALIGN: tl.constexpr):
    """Padded voxel coordinates (ix, iy, iz) of normalised coordinates (cx, cy, cz), their
    derivatives with respect to them, and whether each point is valid.

    A point is invalid, contributes nothing and computes with coordinate 0 where a grid
    coordinate is not finite, or where its voxel coordinate is not finite in the compute
    precision (a huge float32 overflows: border clips that to an edge, but reflection
    cannot fold it and zeros reads nothing there anyway).
    """
    finite = mask & (tl.abs(cx) < INF) & (tl.abs(cy) < INF) & (tl.abs(cz) < INF)
    ix, iy, iz, mx, my, mz = source_indices(
        tl.where(finite, cx, 0.0), tl.where(finite, cy, 0.0), tl.where(finite, cz, 0.0),
        D, H, W, PADDING, ALIGN)
    valid = finite & (tl.abs(ix) < INF) & (tl.abs(iy) < INF) & (tl.abs(iz) < INF)
    ix = tl.where(valid, ix, 0.0)
    iy = tl.where(valid, iy, 0.0)
    iz = tl.where(valid, iz, 0.0)
    return ix, iy, iz, mx, my, mz, valid


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
        return (or_unused(self.field, unused), or_unused(self.theta, unused), or_unused(self.table, unused),
                *(self.field.stride() if self.field is not None else (0,) * 5))

    def consts(self):
        return dict(AFFINE=self.theta is not None, FIELD=self.field is not None,
                    SCALED=self.scaled)

    def tensors(self):
        return tuple(t for t in (self.field, self.theta, self.table) if t is not None)


def grid_coordinates(grid) -> Coordinates:
    """A grid as the coordinate source: its values are where the points sample."""
    return Coordinates(grid.shape[0], tuple(grid.shape[1:4]), grid.dtype, field=grid)


def or_unused(t, unused):
    """``t``, or where it is absent (None) the tensor that stands for an unused pointer."""
    return unused if t is None else t
