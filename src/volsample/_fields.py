"""The field tools' maths, written once for NumPy and torch: composing displacements,
integrating a stationary velocity by scaling and squaring, and the Jacobian determinant.

A field here is a displacement in voxels of its own grid, shape (N, D, H, W, 3), channels
(x, y, z) along (W, H, D): the point at voxel x moves to x + u(x). ``compose`` and
``integrate_velocity`` take the front door's ``sample(field, displacement, padding_mode)``,
which samples a field at x + displacement(x) (``warp_3d`` on the field as an NDHWC volume
of 3 channels); ``jacobian_determinant`` takes the array namespace (numpy or torch).
"""
from __future__ import annotations

import numbers

from ._errors import InvalidArgumentError


def check_field(name: str, shape) -> None:
    """A displacement field's shape: (N, D, H, W, 3)."""
    if len(shape) != 5 or shape[-1] != 3:
        raise InvalidArgumentError(
            f"{name}: expected a displacement field of shape (N, D, H, W, 3) (channels x, y, z "
            f"in voxels), got shape {tuple(shape)}",
            argument=name, kind="rank" if len(shape) != 5 else "shape", value=tuple(shape))


def check_pair(u_shape, v_shape) -> None:
    check_field("u", u_shape)
    check_field("v", v_shape)
    if tuple(u_shape) != tuple(v_shape):
        raise InvalidArgumentError(
            f"v: expected the shape of u, {tuple(u_shape)}, got {tuple(v_shape)}",
            argument="v", kind="shape", value=tuple(v_shape))


def check_steps(steps) -> int:
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
        raise InvalidArgumentError(f"steps: expected an integer >= 0, got {steps!r}",
                                   argument="steps", kind="type", value=steps)
    return int(steps)


def compose(sample, u, v, padding_mode):
    """The displacement of "v, then u": x -> x + v(x) -> that point moved by u, so
    w(x) = v(x) + u(x + v(x))."""
    return v + sample(u, v, padding_mode)


def integrate_velocity(sample, v, steps, padding_mode):
    """exp(v) by scaling and squaring: v / 2**steps composed with itself ``steps`` times."""
    u = v * (0.5 ** steps)
    for _ in range(steps):
        u = compose(sample, u, u, padding_mode)
    return u


def _derivative(xp, f, axis):
    """d f / d(index along ``axis``): central differences (f[i+1] - f[i-1]) / 2 inside,
    one-sided f[1] - f[0] and f[n-1] - f[n-2] at the two ends (NumPy's ``gradient``), 0
    along an axis of one voxel."""
    n = f.shape[axis]
    if n == 1:
        return f * 0
    def part(start, stop):
        return f[(slice(None),) * axis + (slice(start, stop),)]

    first = part(1, 2) - part(0, 1)
    last = part(n - 1, n) - part(n - 2, n - 1)
    pieces = [first, (part(2, n) - part(0, n - 2)) / 2, last] if n > 2 else [first, last]
    return xp.concatenate(pieces, axis=axis)


def jacobian_determinant(xp, u):
    """det(I + du/dx) at every voxel of a field u (N, D, H, W, 3): (N, D, H, W)."""
    axes = (3, 2, 1)  # array axis of x, y, z
    J = [[_derivative(xp, u[..., a], axes[b]) + (1 if a == b else 0) for b in range(3)]
         for a in range(3)]
    return (J[0][0] * (J[1][1] * J[2][2] - J[1][2] * J[2][1])
            - J[0][1] * (J[1][0] * J[2][2] - J[1][2] * J[2][0])
            + J[0][2] * (J[1][0] * J[2][1] - J[1][1] * J[2][0]))
