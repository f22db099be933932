"""``grid_sample`` for JAX: the primitives of grid sampling and their derivatives.

The forward (linear in the input), the backward (the forward's transposes: grad_input
and grad_grid, each only where asked for), the derivative along a grid direction (linear
in that direction), and the derivative along both the input's and the grid's directions
(linear in the pair). Forward mode runs the forward on the input's tangent, the
grid-direction derivative, or both as one primitive; reverse mode transposes that into one
backward call for the gradients asked for, so ``jax.grad`` runs one backward kernel call
(one pass over the points), never the grid-direction derivative. The derivatives of the
backward and of the grid-direction derivative (second derivatives) are JAX's own of the
sampler written in jax.numpy (``_taps``).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching
from jax.typing import ArrayLike

from .. import _calls, _dtypes, _layout
from .._tables import MODES, PADDINGS
from . import _primitives, _taps
from ._operands import checked_arrays, operand

_ATTRIBUTES = ("mode", "padding", "align_corners", "channels_last")


def _layout_name(channels_last: bool) -> str:
    return "NDHWC" if channels_last else "NCDHW"


def _forward_results(input, grid, *, mode, padding, align_corners, channels_last):
    layout = _layout_name(channels_last)
    logical = _layout.logical_shape(input.shape, layout)
    shape = _layout.physical_shape(logical[:2] + tuple(grid.shape[1:4]), layout)
    return [(shape, input.dtype)]


def _backward_results(grad_output, input, grid, *, mode, padding, align_corners, channels_last,
                      want_input, want_grid, input_spatial):
    """(grad_input in the compute dtype, grad_grid), each of shape (0,) where not asked
    for. An absent input (grad_input alone reads none of its values; the handler takes
    its shape from grad_input's) is of grad_output's N and C and ``input_spatial``."""
    compute = _dtypes.compute_dtype(np.dtype(input.dtype), np.dtype(grid.dtype))
    layout = _layout_name(channels_last)
    logical = _layout.logical_shape(grad_output.shape, layout)
    input_shape = _layout.physical_shape(logical[:2] + tuple(input_spatial), layout)
    return [(input_shape if want_input else (0,), compute),
            (grid.shape if want_grid else (0,), grid.dtype)]


def _spatial(shape, channels_last) -> tuple:
    return tuple(shape[1:4] if channels_last else shape[2:5])


forward_p = _primitives.kernel_primitive("grid_sample_forward", _ATTRIBUTES, _forward_results)
backward_p = _primitives.kernel_primitive("grid_sample_backward", _ATTRIBUTES,
                                          _backward_results)


def _params(params) -> dict:
    return {k: params[k] for k in _ATTRIBUTES}


def _grid_tangent(input, grid, grid_tangent, **params):
    """The derivative of the forward along ``grid_tangent``: each channel's gradient in the
    grid's coordinates (the backward's grad_grid of that channel alone, all channels in one
    call with the channels folded into N and a cotangent of ones), dotted with the
    direction."""
    channels_last = params["channels_last"]
    single, ones, N, C = _primitives.channels_as_batch(input, grid.shape[1:4], channels_last)
    grids = jnp.repeat(grid, C, axis=0)
    _, slopes = backward_p.bind(ones, single, grids, want_input=False, want_grid=True,
                                input_spatial=_spatial(input.shape, channels_last),
                                **_params(params))
    slopes = slopes.reshape((N, C) + grid.shape[1:])  # (N, C, Do, Ho, Wo, 3)
    compute = _dtypes.compute_dtype(np.dtype(input.dtype), np.dtype(grid.dtype))
    tangent = jnp.einsum("ncdhwk,ndhwk->ncdhw", slopes.astype(compute),
                         grid_tangent.astype(compute))
    if channels_last:
        tangent = jnp.moveaxis(tangent, 1, -1)
    return [tangent.astype(input.dtype)]


def _grid_tangent_results(input, grid, grid_tangent, **params):
    return _forward_results(input, grid, **params)


grid_tangent_p = _primitives.composite_primitive("grid_sample_grid_tangent", _grid_tangent,
                                                 _grid_tangent_results)


def _is_zero(t) -> bool:
    return type(t) is ad.Zero


def _tangent(input_tangent, input, grid, grid_tangent, **params):
    """The derivative along both the input's and the grid's directions, one primitive: its
    transpose computes both gradients in one backward call, one pass over the points."""
    along_input, = forward_p.bind(input_tangent, grid, **params)
    along_grid, = grid_tangent_p.bind(input, grid, grid_tangent, **params)
    return [along_input + along_grid]


def _tangent_results(input_tangent, input, grid, grid_tangent, **params):
    return _forward_results(input, grid, **params)


tangent_p = _primitives.composite_primitive("grid_sample_tangent", _tangent, _tangent_results)


def _forward_jvp(primals, tangents, **params):
    input, grid = primals
    input_tangent, grid_tangent = tangents
    out, = forward_p.bind(input, grid, **params)
    along_input, along_grid = not _is_zero(input_tangent), not _is_zero(grid_tangent)
    along_grid = along_grid and MODES.of(params["mode"]).grid_gradient
    if along_input and along_grid:
        tangent, = tangent_p.bind(input_tangent, input, grid, grid_tangent, **params)
    elif along_input:
        tangent, = forward_p.bind(input_tangent, grid, **params)
    elif along_grid:
        tangent, = grid_tangent_p.bind(input, grid, grid_tangent, **params)
    else:
        tangent = jnp.zeros_like(out)
    return [out], [tangent]


def _gradients(cotangent, input, grid, input_aval, grid_aval, params):
    """The cotangent's gradients of the input and the grid, each where its aval is given
    (None: not wanted), from one backward call; a 16-bit input's rounded once. grad_input
    alone reads no value of the input: the handler takes its shape from grad_input's, its
    dtype from the absent operand's."""
    want_input, want_grid = input_aval is not None, grid_aval is not None
    if _is_zero(cotangent):
        return [None if a is None else ad.Zero(a) for a in (input_aval, grid_aval)]
    shape_of = input_aval if want_input else input
    grad_input, grad_grid = backward_p.bind(
        cotangent, input if want_grid else _primitives.absent(shape_of.dtype), grid,
        want_input=want_input, want_grid=want_grid,
        input_spatial=_spatial(shape_of.shape, params["channels_last"]), **_params(params))
    return [grad_input.astype(input_aval.dtype) if want_input else None,
            grad_grid.astype(grid_aval.dtype) if want_grid else None]


def _aval_if_undefined(x):
    return x.aval if ad.is_undefined_primal(x) else None


def _forward_transpose(cotangents, input, grid, **params):
    """The transpose in the input (the grid is never linear here: forward mode takes its
    direction through ``grid_tangent_p`` or ``tangent_p``)."""
    if ad.is_undefined_primal(grid):
        raise NotImplementedError("volsample.jax: grid_sample is not linear in grid")
    grad_input, _ = _gradients(cotangents[0], None, grid, input.aval, None, params)
    return [grad_input, None]


def _grid_tangent_transpose(cotangents, input, grid, grid_tangent, **params):
    _, grad_grid = _gradients(cotangents[0], input, grid, None, grid_tangent.aval, params)
    return [None, None, grad_grid]


def _tangent_transpose(cotangents, input_tangent, input, grid, grid_tangent, **params):
    grad_input, grad_grid = _gradients(cotangents[0], input, grid,
                                       _aval_if_undefined(input_tangent),
                                       _aval_if_undefined(grid_tangent), params)
    return [grad_input, None, None, grad_grid]


ad.primitive_jvps[forward_p] = _forward_jvp
ad.primitive_transposes[forward_p] = _forward_transpose
ad.primitive_transposes[grid_tangent_p] = _grid_tangent_transpose
ad.primitive_transposes[tangent_p] = _tangent_transpose


def _sampler(params):
    """Grid sampling in jax.numpy (``_taps``): what JAX differentiates for the derivatives
    of the kernels' derivatives."""
    return functools.partial(_taps.sample, **_params(params))


def _grid_tangent_jvp(primals, tangents, **params):
    """Linear in the direction: itself along the direction's tangent. Along the input's or
    the grid's (second derivatives), JAX's derivative of the same derivative of the
    sampler in jax.numpy."""
    input, grid, direction = primals
    t_input, t_grid, t_direction = tangents
    out = grid_tangent_p.bind(input, grid, direction, **params)
    parts = []
    if not _is_zero(t_direction):
        parts.append(grid_tangent_p.bind(input, grid, t_direction, **params)[0])
    if not (_is_zero(t_input) and _is_zero(t_grid)):
        sample = _sampler(params)

        def along_direction(input, grid):
            return jax.jvp(lambda g: sample(input, g), (grid,), (direction,))[1]

        parts.append(_primitives.jvp_along(along_direction, (input, grid),
                                           (t_input, t_grid)).astype(input.dtype))
    return out, [sum(parts[1:], parts[0]) if parts else jnp.zeros_like(out[0])]


def _backward_jvp(primals, tangents, *, want_input, want_grid, input_spatial, **params):
    """The derivative of the gradients: JAX's derivative of the sampler's in jax.numpy (an
    absent input, unread by grad_input, taken as zeros of its shape)."""
    grad_output, input, grid = primals
    outs = backward_p.bind(*primals, want_input=want_input, want_grid=want_grid,
                           input_spatial=input_spatial, **params)
    if all(_is_zero(t) for t in tangents):
        return outs, [jnp.zeros_like(o) for o in outs]
    compute = _taps.compute_dtype(input, grid)
    if _primitives.is_absent(input):
        channels_last = params["channels_last"]
        logical = _layout.logical_shape(grad_output.shape, _layout_name(channels_last))
        input = jnp.zeros(_layout.physical_shape(logical[:2] + tuple(input_spatial),
                                                 _layout_name(channels_last)), input.dtype)
    sample = _sampler(params)

    def gradients(grad_output, input, grid):
        _, vjp = jax.vjp(sample, input.astype(compute), grid.astype(compute))
        grad_input, grad_grid = vjp(grad_output.astype(compute))
        return [grad_input if want_input else _primitives.absent(compute),
                grad_grid.astype(grid.dtype) if want_grid else _primitives.absent(grid.dtype)]

    derivatives = _primitives.jvp_along(gradients, (grad_output, input, grid), tangents)
    return outs, derivatives


ad.primitive_jvps[grid_tangent_p] = _grid_tangent_jvp
ad.primitive_jvps[backward_p] = _backward_jvp


def _fold_axes(into: str, channels_last: bool) -> tuple:
    """Where vmap's batch axis folds, as (the input's axis, an output-shaped volume's, the
    grid's): into N; into C (the grid unmapped: one set of weights serves every batch
    member's channels); into the points, the output's D (the input unmapped, unread
    beyond its own size)."""
    channels = 4 if channels_last else 1
    return {"N": (0, 0, 0), "C": (channels, channels, None),
            "points": (None, 1 if channels_last else 2, 1)}[into]


def _forward_batch(args, dims, **params):
    """The input mapped alone folds into C, unless moving its batch axis beside C copies
    more than broadcasting the grid would; the grid mapped alone folds into the points."""
    input, grid = args
    input_dim, grid_dim = dims
    channels_last = params["channels_last"]
    into = "N"
    if grid_dim is None:
        size = _primitives.batch_size(args, dims)
        beside_channels = _fold_axes("C", channels_last)[0]
        if (_primitives.moves_free(input.shape, input_dim, beside_channels)
                or input.size <= size * grid.size):
            into = "C"
    elif input_dim is None:
        into = "points"
    input_at, volume_at, grid_at = _fold_axes(into, channels_last)
    return _primitives.folded_call(forward_p, args, dims, (input_at, grid_at), volume_at,
                                   **params)


def _backward_batch(args, dims, *, want_input, want_grid, **params):
    """grad_input alone with the grid unmapped folds into C; grad_grid alone with the input
    unmapped into the points; both with the input unmapped are two calls (neither copies
    the input); the rest into N."""
    grad_output, input, grid = args
    _, input_dim, grid_dim = dims
    channels_last = params["channels_last"]
    if want_input and want_grid and input_dim is None and not _primitives.is_absent(input):
        absent = _primitives.absent(input.dtype)
        (grad_input, _), (input_out, _) = _backward_batch(
            [grad_output, absent, grid], [dims[0], None, grid_dim], want_input=True,
            want_grid=False, **params)
        (_, grad_grid), (_, grid_out) = _backward_batch(
            args, dims, want_input=False, want_grid=True, **params)
        return [grad_input, grad_grid], [input_out, grid_out]
    into = "N"
    if not want_grid and grid_dim is None:
        into = "C"
    elif not want_input and input_dim is None:
        into = "points"
    input_at, volume_at, grid_at = _fold_axes(into, channels_last)
    return _primitives.folded_call(
        backward_p, args, dims, (volume_at, input_at, grid_at), (input_at, grid_at),
        want_input=want_input, want_grid=want_grid, **params)


batching.primitive_batchers[forward_p] = _forward_batch
batching.primitive_batchers[backward_p] = _backward_batch


def grid_sample(input: ArrayLike, grid: ArrayLike, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: bool = False, *, layout: str = "NCDHW") -> jax.Array:
    """Sample a volume at the points of a grid: ``torch.nn.functional.grid_sample`` on 5-D
    arrays, for JAX, differentiable in ``input`` and ``grid``; the same bits as
    ``volsample.grid_sample_3d``.

    Parameters
    ----------
    input : array, shape (N, C, Di, Hi, Wi), or (N, Di, Hi, Wi, C) with ``layout="NDHWC"``
        float16, bfloat16, float32 or float64 (float64 needs ``jax_enable_x64``), on the CPU.
    grid : array, shape (N, Do, Ho, Wo, 3)
        Normalised sample coordinates (x, y, z) in [-1, 1]; x indexes W, y H and z D.
        ``input``'s dtype, or float32/float64 beside a 16-bit ``input``.
    mode : {"bilinear", "nearest", "bicubic", "bspline"}
        As ``volsample.torch.grid_sample``'s ("trilinear" is another name of "bilinear").
    padding_mode : {"zeros", "border", "reflection"}
        What points outside the volume read.
    align_corners : bool or None
        True: -1 and +1 are the centres of the corner voxels; False (or None): their outer
        edges.
    layout : {"NCDHW", "NDHWC"}
        Axis order of ``input`` and of the result.

    Returns
    -------
    array, shape (N, C, Do, Ho, Wo) (or (N, Do, Ho, Wo, C)), in ``input``'s dtype.

    Notes
    -----
    Checked when traced; runs the C++ kernels through XLA's FFI inside ``jax.jit``.
    ``jax.grad``/``vjp`` run one backward kernel call for the gradients differentiated;
    ``jax.jvp``/``jacfwd`` work, and second and higher derivatives (``jax.hessian``) in
    every operand (nearest's in the grid are 0); ``jax.vmap`` folds the batch into N, C
    or the points, one kernel call.

    Examples
    --------
    >>> import jax.numpy as jnp, volsample.jax as vj
    >>> volume = jnp.arange(8.0, dtype=jnp.float32).reshape(1, 1, 2, 2, 2)
    >>> centre = jnp.zeros((1, 1, 1, 1, 3), jnp.float32)
    >>> vj.grid_sample(volume, centre, align_corners=True).ravel()
    Array([3.5], dtype=float32)
    """
    input, grid = checked_arrays(input=input, grid=grid)
    mode_code, padding = MODES.code(mode), PADDINGS.code(padding_mode)
    call = _calls.grid_sample(operand("input", input), operand("grid", grid), mode_code, padding,
                              False if align_corners is None else align_corners, layout)
    out, = forward_p.bind(input, grid, mode=call.mode, padding=call.padding,
                          align_corners=call.align_corners,
                          channels_last=call.layout == "NDHWC")
    return out
