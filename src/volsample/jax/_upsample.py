"""``upsample_trilinear`` for JAX: the forward and backward kernels as two primitives, each
the other's transpose (the map is linear), so derivatives of any order and both modes hold."""
from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.typing import ArrayLike

from .. import _calls, _layout
from . import _primitives
from ._operands import checked_arrays, operand

_ATTRIBUTES = ("align_corners", "channels_last", "scale_d", "scale_h", "scale_w")


def _resized(volume, spatial, channels_last):
    layout = "NDHWC" if channels_last else "NCDHW"
    logical = _layout.logical_shape(volume.shape, layout)
    return [(_layout.physical_shape(logical[:2] + tuple(spatial), layout), volume.dtype)]


def _forward_results(input, *, output_spatial, input_spatial, channels_last, **_):
    return _resized(input, output_spatial, channels_last)


def _backward_results(grad_output, *, output_spatial, input_spatial, channels_last, **_):
    return _resized(grad_output, input_spatial, channels_last)


forward_p = _primitives.kernel_primitive("upsample_forward", _ATTRIBUTES, _forward_results)
backward_p = _primitives.kernel_primitive("upsample_backward", _ATTRIBUTES, _backward_results)


_primitives.linear(forward_p, backward_p.bind)
_primitives.linear(backward_p, forward_p.bind)


def upsample_trilinear(input: ArrayLike, size: int | Sequence[int] | None = None,
                       scale_factor: float | Sequence[float] | None = None,
                       align_corners: bool = False, *, layout: str = "NCDHW") -> jax.Array:
    """Resize a volume by trilinear interpolation: ``torch.nn.functional.interpolate`` with
    ``mode="trilinear"``, for JAX; the same bits as ``volsample.upsample_trilinear_3d``.

    Parameters
    ----------
    input : array, shape (N, C, Di, Hi, Wi), or (N, Di, Hi, Wi, C) with ``layout="NDHWC"``
        float16, bfloat16, float32 or float64, on the CPU.
    size : int or (int, int, int), optional
        Output size (Do, Ho, Wo). Exactly one of ``size`` and ``scale_factor`` is given.
    scale_factor : float or (float, float, float), optional
        Per-axis factors: the output size is ``floor(in * scale)`` and the factor itself maps
        output to source coordinates (``recompute_scale_factor=False``).
    align_corners : bool or None
        True: the corner voxels' centres of input and output coincide; False (or None):
        their outer edges do.
    layout : {"NCDHW", "NDHWC"}
        Axis order of ``input`` and of the result.

    Returns
    -------
    array, shape (N, C, Do, Ho, Wo) (or NDHWC), in ``input``'s dtype.

    Examples
    --------
    >>> import jax.numpy as jnp, volsample.jax as vj
    >>> volume = jnp.array([0.0, 1.0], jnp.float32).reshape(1, 1, 1, 1, 2)
    >>> vj.upsample_trilinear(volume, size=(1, 1, 3), align_corners=True).ravel()
    Array([0. , 0.5, 1. ], dtype=float32)
    """
    input, = checked_arrays(input=input)
    call = _calls.upsample(operand("input", input), size, scale_factor,
                           False if align_corners is None else align_corners, layout)
    if call.identity:  # no spatial size changes: the input itself (the NumPy API copies)
        return input
    scales = [0.0 if s is None else float(s) for s in call.scales]
    out, = forward_p.bind(input, align_corners=call.align_corners,
                          channels_last=call.layout == "NDHWC", scale_d=scales[0],
                          scale_h=scales[1], scale_w=scales[2],
                          output_spatial=tuple(call.output_shape[2:]),
                          input_spatial=tuple(call.input_shape[2:]))
    return out
