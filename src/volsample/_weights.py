"""Each interpolation mode's weights, the Python home of that mathematics: the float64
reference (``_reference``), the torch derivatives along a grid direction
(``torch/_grid_derivatives``) and volsample.jax's sampler in jax.numpy (``jax/_taps``) take
them from here, through the mode's entry in
``_tables.MODES``. The C++ core's twin is ``src/cpp/grid_taps.h``; the Triton kernels'
is ``cubic_weights`` in ``_triton/grid_taps.py``.

A mode's function takes ``f = x - floor(x)``, the voxel coordinate's fraction (an array of
any namespace: NumPy, torch, jax.numpy), and returns ``(weights, first, second)``: for each of the
mode's taps along the axis, its weight, and that weight's first and second derivatives in
x. A mode of T taps reads the voxels floor(x) - (T/2 - 1) .. floor(x) + T/2: two taps
floor(x), floor(x) + 1; four taps floor(x) - 1 .. floor(x) + 2. Nearest has no weights (it
reads one voxel, rounded, with weight 1 and no gradient).
"""
from __future__ import annotations

CUBIC_CONVOLUTION_A = -0.75  # PyTorch's bicubic (get_cubic_upsample_coefficients)


def linear(f):
    """Trilinear's two taps: 1 - f and f; slopes -1 and 1; no curvature."""
    zero = 0 * f
    return [1 - f, f], [zero - 1, zero + 1], [zero, zero]


def cubic_convolution(f):
    """Bicubic's four taps: the cubic convolution kernel (A = -0.75) at the distances
    f + 1, f, 1 - f and 2 - f."""
    a = CUBIC_CONVOLUTION_A

    def near(s):  # |s| <= 1: the kernel and its first and second derivatives in s
        return (((a + 2) * s - (a + 3)) * s * s + 1, (3 * (a + 2) * s - 2 * (a + 3)) * s,
                6 * (a + 2) * s - 2 * (a + 3))

    def far(s):  # 1 < |s| < 2
        return (((a * s - 5 * a) * s + 8 * a) * s - 4 * a, (3 * a * s - 10 * a) * s + 8 * a,
                6 * a * s - 10 * a)

    # The last two taps' distances fall as x grows: their odd derivatives change sign.
    pieces = [far(f + 1), near(f), near(1 - f), far(2 - f)]
    signs = (1, 1, -1, -1)
    return ([p[0] for p in pieces], [sign * p[1] for sign, p in zip(signs, pieces)],
            [p[2] for p in pieces])


def cubic_bspline(f):
    """B-spline's four taps: the uniform cubic B-spline's pieces
    ((1-f)^3, 3f^3-6f^2+4, -3f^3+3f^2+3f+1, f^3) / 6."""
    g = 1 - f
    weights = [g * g * g / 6, ((3 * f - 6) * f * f + 4) / 6,
               ((-3 * f + 3) * f * f + 3 * f + 1) / 6, f * f * f / 6]
    first = [-g * g / 2, (1.5 * f - 2) * f, (-1.5 * f + 1) * f + 0.5, f * f / 2]
    second = [g, 3 * f - 2, 1 - 3 * f, f]
    return weights, first, second
