"""Coordinate maths shared by every CPU kernel: the formulas of SPEC §2 and §3.

Grid sampling maps a normalised coordinate c in [-1, 1] to a voxel coordinate along an
axis of size S. align_corners decides what -1 and +1 mean::

    align_corners=True                    align_corners=False
    -1 = centre of voxel 0                -1 = outer edge of voxel 0
    +1 = centre of voxel S-1              +1 = outer edge of voxel S-1

      -1               +1                 -1                    +1
       |                |                  |                     |
      [ 0 ][ 1 ]...[S-1]                 [ 0 ][ 1 ] ... [ S-1 ]

Each helper returns the coordinate together with its derivative with respect to its
input, so forward kernels and gradient kernels use the same code (the compiler drops the
derivative where it is unused).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

# Kernel integers for the modes (equal to the aclnn interpolationMode / paddingMode codes).
BILINEAR, NEAREST = 0, 1
ZEROS, BORDER, REFLECTION = 0, 1, 2


def typed(value, like):
    """``value`` converted to the floating type of ``like``.

    Numba promotes float32 with any integer (literals too) to float64; kernels must compute
    float32 data in float32, so every constant goes through this cast.
    """
    return type(like)(value)


@overload(typed)
def _typed_numba(value, like):
    target = like

    def impl(value, like):
        return target(value)

    return impl


@njit(cache=True, inline="always")
def unnormalize(coord, size, align_corners):
    """Voxel coordinate of a normalised coordinate, and d(voxel)/d(coord)."""
    two = typed(2, coord)
    if align_corners:
        extent = typed(size - 1, coord)
        return (coord + typed(1, coord)) / two * extent, extent / two
    fsize = typed(size, coord)
    return ((coord + typed(1, coord)) * fsize - typed(1, coord)) / two, fsize / two


@njit(cache=True, inline="always")
def clip(x, size):
    """Clamp to [0, size-1]; the derivative is 0 on and beyond the ends."""
    if x <= typed(0, x):
        return typed(0, x), typed(0, x)
    upper = typed(size - 1, x)
    if x >= upper:
        return upper, typed(0, x)
    return x, typed(1, x)


@njit(cache=True, inline="always")
def reflect(x, twice_low, twice_high):
    """Fold x into [low, high] by reflection, and the derivative's sign (+1, -1 or 0).

    Bounds come doubled so that they stay integers for both align_corners choices. The
    parity of the fold count is taken in floating point so that huge coordinates never
    overflow an integer.
    """
    if twice_low == twice_high:
        return typed(0, x), typed(0, x)
    two = typed(2, x)
    low = typed(twice_low, x) / two
    span = typed(twice_high - twice_low, x) / two
    x = x - low
    sign = typed(1, x)
    if x < typed(0, x):
        x = -x
        sign = -sign
    extra = np.fmod(x, span)
    flips = np.floor(x / span)
    if np.fmod(flips, two) == typed(0, x):
        return extra + low, sign
    return span - extra + low, -sign


@njit(cache=True, inline="always")
def source_index(coord, size, padding_mode, align_corners):
    """Voxel coordinate after unnormalising and padding, and its derivative.

    Callers drop non-finite coordinates before calling (SPEC §2).
    """
    x, grad = unnormalize(coord, size, align_corners)
    if padding_mode == BORDER:
        x, g = clip(x, size)
        grad = grad * g
    elif padding_mode == REFLECTION:
        if align_corners:
            x, g = reflect(x, 0, 2 * (size - 1))
        else:
            x, g = reflect(x, -1, 2 * size - 1)
        x, g2 = clip(x, size)
        grad = grad * g * g2
    return x, grad


# ---------------------------------------------------------------------------------------
# Upsampling (SPEC §3): one axis of size ``in_size`` resampled to ``out_size``. Every
# helper computes in the floating type of its float argument, as PyTorch's CPU kernel does
# in its compute type: float32 data gets float32 ratios, coordinates and weights.
# ---------------------------------------------------------------------------------------


def fma(a, b, c):
    """``a * b + c`` rounded once (fused multiply-add) in compiled code.

    This Python body only runs with the JIT disabled, and rounds twice.
    """
    return a * b + c


@intrinsic
def _fma_numba(typingctx, a, b, c):
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        ty = context.get_value_type(a)
        fused = builder.module.declare_intrinsic("llvm.fma", [ty], ir.FunctionType(ty, [ty] * 3))
        return builder.call(fused, args)

    return a(a, b, c), codegen


@overload(fma)
def _fma_overload(a, b, c):
    return lambda a, b, c: _fma_numba(a, b, c)


@njit(cache=True, inline="always")
def upsample_ratio(in_size, out_size, align_corners, scale, like):
    """Source step per output step, in the type of ``like``.

    ``scale`` is the forward's scale factor for this axis as a float64; a value <= 0 means
    none was given, and the ratio then comes from the sizes. ``1 / scale`` is divided in
    float64 and then rounded, like PyTorch's ``compute_scales_value``.
    """
    if align_corners:
        if out_size > 1:
            return typed(in_size - 1, like) / typed(out_size - 1, like)
        return typed(0, like)
    if scale > 0:
        return typed(1.0 / scale, like)
    return typed(in_size, like) / typed(out_size, like)


@njit(cache=True, inline="always")
def upsample_source(ratio, o, align_corners):
    """Source coordinate of output index ``o`` (never below 0)."""
    if align_corners:
        return ratio * typed(o, ratio)
    half = typed(0.5, ratio)
    # Fused, as PyTorch's x86 CPU build evaluates it: one rounding where the plain
    # formula has two, and a coordinate that agrees with PyTorch's bit for bit.
    src = fma(ratio, typed(o, ratio) + half, -half)
    return typed(0, ratio) if src < typed(0, ratio) else src


@njit(cache=True, inline="always")
def upsample_taps(src, in_size):
    """The two source indices of a source coordinate and their weights: (i0, i1, l0, l1).

    i0 is compared with ``in_size - 1`` while still a float, so a huge coordinate (a scale
    inconsistent with the sizes) clamps to the last index instead of overflowing int64.
    """
    last = in_size - 1
    low = np.floor(src)
    i0 = last if low >= typed(last, src) else np.int64(low)
    l1 = min(max(src - typed(i0, src), typed(0, src)), typed(1, src))
    i1 = i0 + 1 if i0 < last else i0
    return i0, i1, typed(1, src) - l1, l1
