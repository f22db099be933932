"""``warp`` for JAX: grid sampling at ``affine_grid(theta) + displacement`` with no grid.

As grid sampling's (``_grid_sample``): the forward (linear in the input), the backward
(grad_input, grad_theta and grad_displacement, each only where asked for), the derivative
along a direction of theta and the displacement (linear in that direction), and the
derivative along the input's direction and theirs (linear in all three). Reverse mode
transposes the derivative into one backward call for every gradient asked for. Second
derivatives are JAX's own of the warp written in jax.numpy (``_taps``).
"""
from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching
from jax.typing import ArrayLike

from .. import _calls, _coords, _dtypes, _layout
from .._tables import MODES, PADDINGS, UNITS
from . import _primitives, _taps
from ._operands import checked_arrays, operand

_ATTRIBUTES = ("mode", "padding", "align_corners", "channels_last", "scale_x", "scale_y",
               "scale_z")


def _layout_of(params) -> str:
    return "NDHWC" if params["channels_last"] else "NCDHW"


def _forward_results(input, theta, displacement, *, output_spatial, **params):
    layout = _layout_of(params)
    logical = _layout.logical_shape(input.shape, layout)
    return [(_layout.physical_shape(logical[:2] + tuple(output_spatial), layout), input.dtype)]


def _backward_results(grad_output, input, theta, displacement, *, want_input, want_theta,
                      want_displacement, input_spatial, output_spatial, **params):
    """As grid sampling's backward (``_grid_sample._backward_results``): an absent input
    is of grad_output's N and C and ``input_spatial``."""
    compute = _dtypes.compute_dtype(np.dtype(input.dtype), np.dtype(theta.dtype))
    layout = _layout_of(params)
    logical = _layout.logical_shape(grad_output.shape, layout)
    input_shape = _layout.physical_shape(logical[:2] + tuple(input_spatial), layout)
    return [(input_shape if want_input else (0,), compute),
            (theta.shape if want_theta else (0,), theta.dtype),
            (displacement.shape if want_displacement else (0,), theta.dtype)]


forward_p = _primitives.kernel_primitive("warp_forward", _ATTRIBUTES, _forward_results)
backward_p = _primitives.kernel_primitive("warp_backward", _ATTRIBUTES, _backward_results)


def _is_zero(t) -> bool:
    return type(t) is ad.Zero


def _base_grid(spatial, align_corners: bool) -> np.ndarray:
    """The homogeneous base grid (D, H, W, 4), channels (x, y, z, 1), in float64."""
    axes = [_coords.base(np.arange(n, dtype=np.float64), n, align_corners) for n in spatial]
    z, y, x = np.meshgrid(*axes, indexing="ij")
    return np.stack([x, y, z, np.ones_like(x)], -1)


def _spatial(shape, params) -> tuple:
    return tuple(shape[1:4] if params["channels_last"] else shape[2:5])


def _scale(params) -> np.ndarray:
    return np.array([params["scale_x"], params["scale_y"], params["scale_z"]])


def _direction_tangent(input, theta, displacement, theta_tangent, displacement_tangent,
                       **params):
    """The derivative along (theta_tangent, displacement_tangent): each channel's gradient in
    the grid's coordinates (the backward's grad_displacement in normalised units of that
    channel alone, the channels folded into N, under a cotangent of ones), dotted with the
    grid's direction ``theta_tangent . base + displacement_tangent * scale``."""
    channels_last = params["channels_last"]
    spatial = params["output_spatial"]
    single, ones, N, C = _primitives.channels_as_batch(input, spatial, channels_last)
    scale = _scale(params)
    offsets = (jnp.zeros((N,) + tuple(spatial) + (3,), theta.dtype) if _primitives.is_absent(
        displacement) else displacement * jnp.asarray(scale, theta.dtype))
    unit = dict(params, scale_x=1.0, scale_y=1.0, scale_z=1.0)
    _, _, slopes = backward_p.bind(ones, single, jnp.repeat(theta, C, axis=0),
                                   jnp.repeat(offsets, C, axis=0), want_input=False,
                                   want_theta=False, want_displacement=True,
                                   input_spatial=_spatial(input.shape, params), **unit)
    compute = _dtypes.compute_dtype(np.dtype(input.dtype), np.dtype(theta.dtype))
    direction = jnp.zeros((N,) + tuple(spatial) + (3,), compute)
    if not _primitives.is_absent(theta_tangent):
        base = jnp.asarray(_base_grid(spatial, params["align_corners"]), compute)
        direction = direction + jnp.einsum("dhwj,nkj->ndhwk", base, theta_tangent.astype(compute))
    if not _primitives.is_absent(displacement_tangent):
        direction = direction + displacement_tangent.astype(compute) * jnp.asarray(scale, compute)
    slopes = slopes.reshape((N, C) + tuple(spatial) + (3,)).astype(compute)
    tangent = jnp.einsum("ncdhwk,ndhwk->ncdhw", slopes, direction)
    if channels_last:
        tangent = jnp.moveaxis(tangent, 1, -1)
    return [tangent.astype(input.dtype)]


def _direction_results(input, theta, displacement, theta_tangent, displacement_tangent,
                       **params):
    return _forward_results(input, theta, displacement, **params)


direction_p = _primitives.composite_primitive("warp_direction_tangent", _direction_tangent,
                                              _direction_results)


def _tangent(input_tangent, input, theta, displacement, theta_tangent, displacement_tangent,
             **params):
    """The derivative along the input's direction and theta's and the displacement's, one
    primitive: its transpose computes every gradient in one backward call."""
    along_input, = forward_p.bind(input_tangent, theta, displacement, **params)
    along_grid, = direction_p.bind(input, theta, displacement, theta_tangent,
                                   displacement_tangent, **params)
    return [along_input + along_grid]


def _tangent_results(input_tangent, input, theta, displacement, *directions, **params):
    return _forward_results(input, theta, displacement, **params)


tangent_p = _primitives.composite_primitive("warp_tangent", _tangent, _tangent_results)


def _forward_jvp(primals, tangents, **params):
    input, theta, displacement = primals
    t_input, t_theta, t_displacement = tangents
    out, = forward_p.bind(input, theta, displacement, **params)
    along_input = not _is_zero(t_input)
    along_grid = MODES.of(params["mode"]).grid_gradient and not (
        _is_zero(t_theta) and _is_zero(t_displacement))
    # (a direction of theta or the displacement that is 0 is absent)
    directions = [_primitives.absent(theta.dtype) if _is_zero(t) else t
                  for t in (t_theta, t_displacement)]
    if along_input and along_grid:
        tangent, = tangent_p.bind(t_input, input, theta, displacement, *directions, **params)
    elif along_input:
        tangent, = forward_p.bind(t_input, theta, displacement, **params)
    elif along_grid:
        tangent, = direction_p.bind(input, theta, displacement, *directions, **params)
    else:
        tangent = jnp.zeros_like(out)
    return [out], [tangent]


def _gradients(cotangent, input, theta, displacement, avals, params):
    """The cotangent's gradients of the input, theta and the displacement, each where its
    aval in ``avals`` is given (None: not wanted), from one backward call. As grid
    sampling's (``_grid_sample._gradients``): grad_input alone reads no value of the input,
    and a 16-bit input's is rounded once."""
    input_aval, theta_aval, displacement_aval = avals
    if _is_zero(cotangent):
        return [None if a is None else ad.Zero(a) for a in avals]
    want_grid = theta_aval is not None or displacement_aval is not None
    shape_of = input if input_aval is None else input_aval
    grad_input, grad_theta, grad_displacement = backward_p.bind(
        cotangent, input if want_grid else _primitives.absent(shape_of.dtype), theta,
        displacement, want_input=input_aval is not None, want_theta=theta_aval is not None,
        want_displacement=displacement_aval is not None,
        input_spatial=_spatial(shape_of.shape, params), **params)
    return [None if input_aval is None else grad_input.astype(input_aval.dtype),
            None if theta_aval is None else grad_theta,
            None if displacement_aval is None else grad_displacement]


def _aval_if_undefined(x):
    return x.aval if ad.is_undefined_primal(x) else None


def _forward_transpose(cotangents, input, theta, displacement, **params):
    if ad.is_undefined_primal(theta) or ad.is_undefined_primal(displacement):
        raise NotImplementedError("volsample.jax: warp is not linear in theta or displacement")
    grad_input, _, _ = _gradients(cotangents[0], None, theta, displacement,
                                  (input.aval, None, None), params)
    return [grad_input, None, None]


def _direction_transpose(cotangents, input, theta, displacement, theta_tangent,
                         displacement_tangent, **params):
    _, grad_theta, grad_displacement = _gradients(
        cotangents[0], input, theta, displacement,
        (None, _aval_if_undefined(theta_tangent), _aval_if_undefined(displacement_tangent)),
        params)
    return [None, None, None, grad_theta, grad_displacement]


def _tangent_transpose(cotangents, input_tangent, input, theta, displacement, theta_tangent,
                       displacement_tangent, **params):
    grad_input, grad_theta, grad_displacement = _gradients(
        cotangents[0], input, theta, displacement,
        tuple(map(_aval_if_undefined, (input_tangent, theta_tangent, displacement_tangent))),
        params)
    return [grad_input, None, None, None, grad_theta, grad_displacement]


def _sampler(params):
    """A warp in jax.numpy (``_taps``), ``sample(input, theta, displacement)`` (an absent
    displacement: none): what JAX differentiates for the derivatives of the kernels'
    derivatives."""
    base = _base_grid(params["output_spatial"], params["align_corners"])
    scale = _scale(params)
    attributes = {k: params[k] for k in ("mode", "padding", "align_corners", "channels_last")}

    def sample(input, theta, displacement):
        grid = _taps.warp_grid(theta, None if _primitives.is_absent(displacement)
                               else displacement, base, scale)
        return _taps.sample(input, grid, **attributes)

    return sample


def _direction_jvp(primals, tangents, **params):
    """Linear in the direction: itself along the direction's tangent. Along the input's,
    theta's or the displacement's (second derivatives), JAX's derivative of the same
    derivative of the warp in jax.numpy."""
    input, theta, displacement, theta_direction, displacement_direction = primals
    out = direction_p.bind(*primals, **params)
    parts = []
    if not all(_is_zero(t) for t in tangents[3:]):
        directions = [_primitives.absent(theta.dtype) if _is_zero(t) else t
                      for t in tangents[3:]]
        parts.append(direction_p.bind(input, theta, displacement, *directions, **params)[0])
    if not all(_is_zero(t) for t in tangents[:3]):
        sample = _sampler(params)
        moved = [None if _primitives.is_absent(d) else d
                 for d in (theta_direction, displacement_direction)]

        def along_direction(input, theta, displacement):
            return _primitives.jvp_along(lambda t, d: sample(input, t, d),
                                         (theta, displacement), moved)

        parts.append(_primitives.jvp_along(along_direction, primals[:3],
                                           tangents[:3]).astype(input.dtype))
    return out, [sum(parts[1:], parts[0]) if parts else jnp.zeros_like(out[0])]


def _backward_jvp(primals, tangents, *, want_input, want_theta, want_displacement,
                  input_spatial, **params):
    """The derivative of the gradients: JAX's derivative of the warp's in jax.numpy (an
    absent input, unread by grad_input, taken as zeros of its shape)."""
    grad_output, input, theta, displacement = primals
    wants = dict(want_input=want_input, want_theta=want_theta,
                 want_displacement=want_displacement, input_spatial=input_spatial)
    outs = backward_p.bind(*primals, **wants, **params)
    if all(_is_zero(t) for t in tangents):
        return outs, [jnp.zeros_like(o) for o in outs]
    compute = _taps.compute_dtype(input, theta)
    if _primitives.is_absent(input):
        logical = _layout.logical_shape(grad_output.shape, _layout_of(params))
        input = jnp.zeros(_layout.physical_shape(logical[:2] + tuple(input_spatial),
                                                 _layout_of(params)), input.dtype)
    sample = _sampler(params)

    def gradients(grad_output, input, theta, displacement):
        _, vjp = jax.vjp(sample, input.astype(compute), theta, displacement)
        grads = vjp(grad_output.astype(compute))
        return [g if want else _primitives.absent(o.dtype)
                for g, want, o in zip(grads, (want_input, want_theta, want_displacement),
                                      outs)]

    primals = (grad_output, input, theta, displacement)
    return outs, _primitives.jvp_along(gradients, primals, tangents)


ad.primitive_jvps[backward_p] = _backward_jvp
ad.primitive_jvps[forward_p] = _forward_jvp
ad.primitive_transposes[forward_p] = _forward_transpose
ad.primitive_jvps[direction_p] = _direction_jvp
ad.primitive_transposes[direction_p] = _direction_transpose
ad.primitive_transposes[tangent_p] = _tangent_transpose


def _channels(params) -> int:
    """Where the batch axis folds into C (a volume's channel axis)."""
    return 4 if params["channels_last"] else 1


def _forward_batch(args, dims, **params):
    """The input mapped alone folds into C (one virtual grid serves every batch member's
    channels), unless moving its batch axis beside C copies more than broadcasting theta
    and the displacement would; the rest into N. (A displacement mapped alone cannot fold
    into the points as a grid's can: the affine part depends on each point's place.)"""
    input, theta, displacement = args
    if dims[1] is None and dims[2] is None:
        size = _primitives.batch_size(args, dims)
        if (_primitives.moves_free(input.shape, dims[0], _channels(params))
                or input.size <= size * (theta.size + displacement.size)):
            at = _channels(params)
            return _primitives.folded_call(forward_p, args, dims, (at, None, None), at,
                                           **params)
    return _primitives.folded_call(forward_p, args, dims, (0, 0, 0), 0, **params)


def _backward_batch(args, dims, *, want_theta, want_displacement, **params):
    """grad_input alone with theta and the displacement unmapped folds into C; the rest
    into N."""
    wants = dict(want_theta=want_theta, want_displacement=want_displacement)
    if not (want_theta or want_displacement) and dims[2] is None and dims[3] is None:
        at = _channels(params)
        return _primitives.folded_call(backward_p, args, dims, (at, at, None, None),
                                       (at, None, None), **wants, **params)
    return _primitives.folded_call(backward_p, args, dims, (0, 0, 0, 0), 0, **wants,
                                   **params)


batching.primitive_batchers[forward_p] = _forward_batch
batching.primitive_batchers[backward_p] = _backward_batch


def warp(input: ArrayLike, theta: ArrayLike | None = None,
         displacement: ArrayLike | None = None, size: Sequence[int] | None = None,
         mode: str = "bilinear", padding_mode: str = "zeros", align_corners: bool = False, *,
         displacement_units: str = "normalized", layout: str = "NCDHW") -> jax.Array:
    """Sample a volume at an affine map plus a displacement, ``A x + u(x)``, with no grid:
    ``grid_sample(input, affine_grid(theta, size) + displacement, ...)`` without forming
    that grid, for JAX, differentiable in ``input``, ``theta`` and ``displacement``; the same
    bits as ``volsample.warp_3d``.

    Parameters
    ----------
    input : array, shape (N, C, Di, Hi, Wi), or (N, Di, Hi, Wi, C) with ``layout="NDHWC"``
        float16, bfloat16, float32 or float64, on the CPU.
    theta : array, shape (N, 3, 4), optional
        Per batch item, the affine map from the output's normalised coordinates (x, y, z, 1)
        to the input's. None: the identity.
    displacement : array, shape (N, Do, Ho, Wo, 3), optional
        Added to each output point's coordinates, channels (x, y, z). None: 0.
    size : (Do, Ho, Wo) or (N, C, Do, Ho, Wo), optional
        The output's size. Default: the displacement's, else the input's.
    mode, padding_mode, align_corners
        As for ``grid_sample``.
    displacement_units : {"normalized", "voxels"}
        The displacement in the grid's units, or in voxels of ``input``.
    layout : {"NCDHW", "NDHWC"}
        Axis order of ``input`` and of the result.

    Returns
    -------
    array, shape (N, C, Do, Ho, Wo) (or NDHWC), in ``input``'s dtype.

    Notes
    -----
    ``jax.grad`` runs the fused backward kernel (the displacement's gradient written
    directly, theta's summed per row in a fixed order; no grid is formed), once for every
    gradient differentiated. Forward mode (``jax.jvp``/``jacfwd``) works, and second and
    higher derivatives (``jax.hessian``) in every operand.

    Examples
    --------
    >>> import jax, jax.numpy as jnp, volsample.jax as vj
    >>> image = jnp.ones((1, 1, 8, 8, 8))
    >>> flow = jnp.zeros((1, 8, 8, 8, 3))
    >>> g = jax.grad(lambda u: vj.warp(image, displacement=u).sum())(flow)
    >>> g.shape
    (1, 8, 8, 8, 3)
    """
    input, theta, displacement = checked_arrays(input=input, theta=theta,
                                                displacement=displacement)
    units = UNITS.code(displacement_units)
    call = _calls.warp(operand("input", input),
                       None if theta is None else operand("theta", theta),
                       None if displacement is None else operand("displacement", displacement),
                       None if size is None else tuple(size), MODES.code(mode),
                       PADDINGS.code(padding_mode),
                       False if align_corners is None else align_corners, units, layout)
    if theta is None:  # the identity (exact: 1 * b + 0 = b), as the NumPy API passes it
        theta = jnp.broadcast_to(jnp.eye(3, 4, dtype=call.coord_dtype), call.theta_shape)
    if displacement is None:
        displacement = _primitives.absent(call.coord_dtype)
    scale = call.displacement_scale
    out, = forward_p.bind(input, theta, displacement, mode=call.mode, padding=call.padding,
                          align_corners=call.align_corners,
                          channels_last=call.layout == "NDHWC", scale_x=scale[0],
                          scale_y=scale[1], scale_z=scale[2],
                          output_spatial=tuple(call.output_spatial))
    return out
