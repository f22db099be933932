"""volsample's kernels as JAX primitives, lowered to the C++ kernels' XLA FFI handlers.

Each primitive is one kernel call on XLA's buffers (``src/cpp/bind_jax.cpp``): its
parameters are the call's kernel integers and flags, passed to the handler as attributes;
its abstract evaluation gives the results' shapes and dtypes; its batching rule folds
vmap's batch axis into N (one kernel call for the whole batch). The door's modules give
them their derivatives (``ad.primitive_jvps``, ``ad.primitive_transposes``): the
primitives here know nothing of differentiation.

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
    batching.primitive_batchers[primitive] = functools.partial(fold_batch, primitive)

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
    """vmap's rule: the batch axis moved first (broadcast where an operand has none) and
    folded into N, one call for the batch; the results unfolded. Absent operands and
    results stay as they are."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    folded = []
    for a, d in zip(args, dims):
        if d is None:  # (vmap's not_mapped)
            if is_absent(a):
                folded.append(a)
                continue
            a = jax.numpy.broadcast_to(a, (size,) + a.shape)
        else:
            a = jax.numpy.moveaxis(a, d, 0)
        folded.append(a.reshape((size * a.shape[1],) + a.shape[2:]))
    outs = primitive.bind(*folded, **params)
    unfolded = [o if is_absent(o) else o.reshape((size, o.shape[0] // size) + o.shape[1:])
                for o in outs]
    return unfolded, [None if is_absent(o) else 0 for o in outs]


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
