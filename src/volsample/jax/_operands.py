"""JAX arrays as the op layer's operands: taken as JAX arrays (NumPy arrays and scalars
too), refused on a device the door does not serve, described by name, shape and dtype."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _calls
from ._primitives import SUPPORTED_PLATFORM, unsupported_device


def checked_arrays(**arrays):
    """The arrays (None stays None) as JAX arrays, each on the CPU where it is concrete
    (a traced array's device is the compiled program's: its lowering refuses others)."""
    taken = []
    for name, a in arrays.items():
        if a is None:
            taken.append(None)
            continue
        if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
            platforms = {d.platform for d in a.devices()}
            if platforms != {SUPPORTED_PLATFORM}:
                raise unsupported_device(", ".join(sorted(platforms)))
        elif not isinstance(a, jax.Array):
            if not hasattr(a, "shape") or not hasattr(a, "dtype"):
                raise TypeError(f"{name}: expected an array, got {type(a).__name__}")
            a = jnp.asarray(a)
        taken.append(a)
    return taken


def operand(name: str, array) -> _calls.Operand:
    return _calls.Operand(name, tuple(array.shape), np.dtype(array.dtype))
