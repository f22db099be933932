"""volsample's kernels as JAX primitives, lowered to the C++ kernels' XLA FFI handlers.

Each primitive is one kernel call on XLA's buffers (``src/cpp/bind_jax.cpp``): its
parameters are the call's kernel integers and flags, passed to the handler as attributes;
its abstract evaluation gives the results' shapes and dtypes; its batching rule folds
vmap's batch axis into N (one kernel call for the whole batch; ``folded_call`` lets the
door's modules fold it into another axis instead). The door's modules give them their
derivatives (``ad.primitive_jvps``, ``ad.primitive_transposes``): the kernel primitives
here know nothing of differentiation.

Operands absent from a call (a warp without displacement) and results not asked for (a
gradient not wanted) are arrays of shape (0,): the handlers read them as absent.
"""
from __future__ import annotations

import functools

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .. import _backends

_TARGETS = _backends.ffi_targets()
if _TARGETS is None:
    raise ImportError(
        "volsample.jax: this volsample was built without its XLA FFI handlers (the build "
        "found no jaxlib, or no C++ core). Reinstall it with the jax extra, from source: "
        "pip install --force-reinstall --no-binary volsample 'volsample[jax]'")

for _name, _capsule in _TARGETS.items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

SUPPORTED_PLATFORM = "cpu"


class UnsupportedDeviceError(ValueError):
    """An array on a device whose kernels volsample.jax does not have."""


def unsupported_device(platform: str) -> UnsupportedDeviceError:
    return UnsupportedDeviceError(
        f"volsample.jax runs on the CPU only, got arrays on {platform!r}: move them with "
        "jax.device_put(x, jax.devices('cpu')[0]) (volsample.torch runs on CUDA)")


def absent(dtype) -> jax.Array:
    """An operand the call does not have."""
    return jax.numpy.zeros((0,), dtype)


def is_absent(x) -> bool:
    return x.ndim == 1 and x.shape[0] == 0


def kernel_primitive(name: str, attributes: tuple[str, ...], results):
    """A primitive of several results that runs the FFI handler ``volsample_<name>`` with
    the parameters named in ``attributes``; ``results(*operand_avals, **params)`` gives its
    results' (shape, dtype) pairs."""
    primitive = Primitive(f"volsample_{name}")
    primitive.multiple_results = True

    def abstract(*avals, **params):
        return [jax.core.ShapedArray(tuple(shape), np.dtype(dtype))
                for shape, dtype in results(*avals, **params)]

    primitive.def_abstract_eval(abstract)
    primitive.def_impl(functools.partial(_eager, primitive))
    lowering = jax.ffi.ffi_lowering(f"volsample_{name}")

    def lower(ctx, *args, **params):
        # (a tuple parameter is an array attribute: float64 numbers)
        return lowering(ctx, *args, **{k: np.asarray(params[k], np.float64)
                                       if isinstance(params[k], tuple) else params[k]
                                       for k in attributes})

    mlir.register_lowering(primitive, lower, platform=SUPPORTED_PLATFORM)
    _refuse_other_platforms(primitive)
    batching.primitive_batchers[primitive] = functools.partial(fold_batch, primitive)
    return primitive


def composite_primitive(name: str, implementation, results):
    """A primitive computed by ``implementation(*operands, **params)`` (other primitives and
    jax.numpy): a named linear map that the door gives a transpose. Its jvp is the
    implementation's (the door may give it another)."""
    primitive = Primitive(f"volsample_{name}")
    primitive.multiple_results = True
    primitive.def_abstract_eval(lambda *avals, **params: [
        jax.core.ShapedArray(tuple(shape), np.dtype(dtype))
        for shape, dtype in results(*avals, **params)])
    primitive.def_impl(functools.partial(_eager, primitive))
    mlir.register_lowering(primitive, mlir.lower_fun(implementation, multiple_results=True))
    batching.primitive_batchers[primitive] = batch_through(implementation)

    def jvp(primals, tangents, **params):
        return jax.jvp(functools.partial(implementation, **params), primals,
                       [ad.instantiate_zeros(t) for t in tangents])

    ad.primitive_jvps[primitive] = jvp
    return primitive


def _refuse_other_platforms(primitive) -> None:
    for platform in ("cuda", "rocm", "tpu"):
        def refuse(ctx, *args, _platform=platform, **params):
            raise unsupported_device(_platform)
        mlir.register_lowering(primitive, refuse, platform=platform)


def _eager(primitive, *args, **params):
    """An eager bind: the primitive compiled alone, once per parameters and shapes."""
    return _compiled(primitive, tuple(sorted(params.items())))(*args)


@functools.lru_cache(maxsize=512)
def _compiled(primitive, params):
    return jax.jit(functools.partial(primitive.bind, **dict(params)))


def fold_batch(primitive, args, dims, **params):
    """vmap's rule of a primitive that has no other: every batch axis folded into N (an
    operand without one broadcast to it), one call for the batch."""
    return folded_call(primitive, args, dims, [0] * len(args), 0, **params)


def batch_size(args, dims) -> int:
    return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def moves_free(shape, dim, at: int) -> bool:
    """Whether moving axis ``dim`` of ``shape`` to position ``at`` moves no element: every
    axis it passes is of size 1."""
    passed = shape[at:dim] if at < dim else shape[dim + 1:at + 1]
    return all(n == 1 for n in passed) or shape[dim] == 1


def fold(a, dim, at: int, size: int):
    """``a`` with its batch axis ``dim`` (None: none, broadcast to ``size``) folded into
    its axis ``at``, batch-major: moved before it and merged with it."""
    if dim is None:
        a = jax.numpy.broadcast_to(jax.numpy.expand_dims(a, at),
                                   a.shape[:at] + (size,) + a.shape[at:])
    else:
        a = jax.numpy.moveaxis(a, dim, at)
    return a.reshape(a.shape[:at] + (size * a.shape[at + 1],) + a.shape[at + 2:])


def folded_call(primitive, args, dims, operand_axes, result_axes, **params):
    """One call for vmap's batch: each operand's batch axis folded into its axis
    ``operand_axes[i]`` (None: the operand must be unmapped, and is passed as it is; an
    unmapped one with an axis is broadcast), the results' unfolded from
    ``result_axes[j]`` (an int: the same for all). Absent operands and results stay as
    they are."""
    size = batch_size(args, dims)
    folded = []
    for a, d, at in zip(args, dims, operand_axes):
        if is_absent(a) or at is None:
            assert d is None, "a mapped operand the rule does not fold"
            folded.append(a)
        else:
            folded.append(fold(a, d, at, size))
    outs = primitive.bind(*folded, **params)
    if isinstance(result_axes, int):
        result_axes = [result_axes] * len(outs)
    unfolded = [o if is_absent(o) else
                o.reshape(o.shape[:at] + (size, o.shape[at] // size) + o.shape[at + 1:])
                for o, at in zip(outs, result_axes)]
    return unfolded, [None if is_absent(o) else at for o, at in zip(outs, result_axes)]


def batch_through(implementation):
    """vmap's rule of a composite primitive: its implementation mapped, so that each
    primitive inside folds only what its own operands map (the grid-direction derivative
    under ``jax.jacfwd`` runs its kernel once, unmapped)."""
    def rule(args, dims, **params):
        outs = jax.vmap(functools.partial(implementation, **params), in_axes=tuple(dims))(*args)
        return outs, [0] * len(outs)
    return rule


def linear(primitive, transpose) -> None:
    """Register ``primitive`` (one operand, linear in it) with JAX's autodiff: its jvp is
    itself applied to the tangent, its transpose ``transpose(cotangent, **params)``."""
    def jvp(primals, tangents, **params):
        out = primitive.bind(*primals, **params)
        tangent, = tangents
        if type(tangent) is ad.Zero:
            return out, [jax.numpy.zeros_like(out[0])]
        return out, primitive.bind(tangent, **params)

    def transposed(cotangents, operand, **params):
        cotangent, = cotangents
        if type(cotangent) is ad.Zero:
            return [ad.Zero(operand.aval)]
        return transpose(cotangent, **params)

    ad.primitive_jvps[primitive] = jvp
    ad.primitive_transposes[primitive] = transposed


def jvp_along(fn, primals, tangents):
    """``fn``'s derivative at ``primals`` along the tangents that are neither symbolic zeros
    nor None (the others' operands held), by JAX's own differentiation of ``fn``."""
    moving = [k for k, t in enumerate(tangents) if t is not None and type(t) is not ad.Zero]

    def of_moving(*values):
        operands = list(primals)
        for k, v in zip(moving, values):
            operands[k] = v
        return fn(*operands)

    return jax.jvp(of_moving, [primals[k] for k in moving], [tangents[k] for k in moving])[1]


def channels_as_batch(input, points, channels_last: bool):
    """``input``'s channels as a batch of one-channel volumes (N * C of them, in its layout)
    and a cotangent of ones over ``points`` (the output's spatial shape) for each: what a
    backward takes to give every channel's slopes in the grid's coordinates, alone, in one
    call (the forward-mode derivatives along a grid direction). Also (N, C)."""
    volumes = jax.numpy.moveaxis(input, -1, 1) if channels_last else input
    N, C = volumes.shape[:2]
    single = volumes.reshape((N * C, 1) + volumes.shape[2:])
    ones = jax.numpy.ones((N * C, 1) + tuple(points), input.dtype)
    if channels_last:
        single, ones = jax.numpy.moveaxis(single, 1, -1), jax.numpy.moveaxis(ones, 1, -1)
    return single, ones, N, C
