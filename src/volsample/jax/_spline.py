"""``spline_coefficients`` for JAX: the cubic B-spline prefilter of ``mode="bspline"``
(``volsample.spline``), on a C++ handler that runs the solve's operations
(``volsample._prefilter``) in their order (the same bits). It is linear: its transpose is its adjoint, and the adjoint's the
prefilter, so derivatives of any order and both modes hold."""
from __future__ import annotations

import functools

import jax
import numpy as np
from jax.typing import ArrayLike

from .. import _checks, _layout, _prefilter
from .._tables import PADDINGS
from . import _primitives
from ._operands import checked_arrays, operand

_ATTRIBUTES = ("bands_d", "bands_h", "bands_w", "adjoint", "channels_last")


@functools.lru_cache(maxsize=64)
def _bands(size: int, padding: int, align_corners: bool, adjoint: bool) -> np.ndarray:
    """The axis' diagonals as the NumPy solve takes them, end to end."""
    return np.concatenate(_prefilter.solve_bands(size, padding, align_corners, adjoint))


def _results(volume, **params):
    return [(volume.shape, volume.dtype)]


filter_p = _primitives.kernel_primitive("spline_filter", _ATTRIBUTES, _results)


def _params(shape, padding, align_corners, adjoint, channels_last) -> dict:
    spatial = shape[1:4] if channels_last else shape[2:5]
    # (as tuples: a primitive's parameters are hashed; the lowering hands them over as arrays)
    d, h, w = (tuple(_bands(n, padding, align_corners, adjoint).tolist()) for n in spatial)
    return dict(bands_d=d, bands_h=h, bands_w=w, adjoint=adjoint, channels_last=channels_last,
                padding=padding, align_corners=align_corners)


def _bind(volume, padding, align_corners, adjoint, channels_last):
    return filter_p.bind(volume, **_params(volume.shape, padding, align_corners, adjoint,
                                           channels_last))


# the prefilter's transpose is its adjoint (the other bands; the same volume shape)
_primitives.linear(filter_p, lambda cotangent, **params: _bind(
    cotangent, params["padding"], params["align_corners"], not params["adjoint"],
    params["channels_last"]))


def spline_coefficients(volume: ArrayLike, padding_mode: str = "border",
                        align_corners: bool = False, *, layout: str = "NCDHW") -> jax.Array:
    """The cubic B-spline coefficients of a volume: the prefilter of ``mode="bspline"``, for
    JAX, differentiable (its transpose is the exact adjoint); the same bits as
    ``volsample.spline_coefficients``.

    ``grid_sample(spline_coefficients(v, p, a), grid, "bspline", p, a)`` interpolates ``v``.

    Parameters
    ----------
    volume : array, shape (N, C, D, H, W), or (N, D, H, W, C) with ``layout="NDHWC"``
        float16, bfloat16, float32 or float64, on the CPU.
    padding_mode : {"zeros", "border", "reflection"}
        The padding the coefficients will be sampled with.
    align_corners : bool
        As the sampling call's (it decides the reflection's mirror).
    layout : {"NCDHW", "NDHWC"}
        Axis order of ``volume`` and of the result.

    Returns
    -------
    array, the shape and dtype of ``volume``, computed in float64 and rounded once.

    Examples
    --------
    >>> import jax.numpy as jnp, volsample.jax as vj
    >>> v = jnp.ones((1, 1, 2, 3, 4), jnp.float32)
    >>> vj.spline_coefficients(v).round(6).max()
    Array(1., dtype=float32)
    """
    volume, = checked_arrays(volume=volume)
    padding = PADDINGS.code(padding_mode)
    align_corners = _checks.boolean("align_corners", align_corners)
    layout = _layout.check(layout)
    op = operand("volume", volume)
    _checks.volume_dtype("volume", op.dtype)
    _checks.rank("volume", op.shape, 5)
    _checks.nonempty_spatial("volume", _layout.logical_shape(op.shape, layout)[2:])
    out, = _bind(volume, padding, align_corners, False, layout == "NDHWC")
    return out
