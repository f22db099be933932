"""The torch door's half of the op layer: tensors as ``_calls.Operand``s, their memory order
as a ``layout``, PyTorch's argument conventions, the torch dialect of the checks'
messages, and checked descriptions kept per call key."""
from __future__ import annotations

import numpy as np
import torch

from .. import _calls, _checks, _prepared
from .._torch_formats import is_channels_last
from ._numpy_dtypes import numpy_dtype

# How the torch front door speaks: tensors, torch dtypes, logical shapes.
TORCH = _calls.Dialect(noun="tensor", spell=lambda name: f"torch.{name}", names_layout=False)

# ---------------------------------------------------------------------------------------
# Torch-level checks: tensors become the op layer's operands
# ---------------------------------------------------------------------------------------

_DTYPE_NAMES = "torch.float16, torch.bfloat16, torch.float32 or torch.float64"


def tensor(name: str, value) -> torch.Tensor:
    """``value`` as a 5-D tensor (every operand here is 5-D); its dtype is the op layer's
    to judge."""
    if not isinstance(value, torch.Tensor):
        raise _checks.UnsupportedDTypeError(
            f"{name}: expected a torch.Tensor, got {type(value).__name__}",
            argument=name, kind="type", value=value)
    if value.dim() != 5:
        raise _checks.InvalidArgumentError(
            f"{name}: expected a 5-D tensor, got {value.dim()}-D with shape {tuple(value.shape)}",
            argument=name, kind="rank", value=value.dim())
    return value


def operand(name: str, value) -> _calls.Operand:
    """An argument a front door was handed, as the op layer takes it (``tensor_operand``),
    once it is a tensor."""
    if not isinstance(value, torch.Tensor):
        raise _checks.UnsupportedDTypeError(
            f"{name}: expected a torch.Tensor, got {type(value).__name__}",
            argument=name, kind="type", value=value)
    # (tensor_operand's lines, not a call of it: the doors' repeated calls pay no frame)
    dtype = numpy_dtype(value.dtype)
    if dtype is None:
        raise _no_numpy_twin(name, value)
    return _calls.Operand(name, tuple(value.shape), dtype)


def tensor_operand(name: str, value: torch.Tensor) -> _calls.Operand:
    """A tensor as the op layer takes it: its logical shape and its dtype as NumPy's (the
    op layer's rules judge both). The ops' descriptions take their tensors so: the
    dispatcher hands an op tensors, and a front door checked its arguments' types."""
    dtype = numpy_dtype(value.dtype)
    if dtype is None:
        raise _no_numpy_twin(name, value)
    return _calls.Operand(name, tuple(value.shape), dtype)


def _no_numpy_twin(name: str, value: torch.Tensor) -> _checks.UnsupportedDTypeError:
    """A dtype without a NumPy twin (complex32, quantized, ...): unsupported anyway."""
    return _checks.UnsupportedDTypeError(f"{name}: expected dtype {_DTYPE_NAMES}, got {value.dtype}",
                                         argument=name, kind="dtype", value=value.dtype)


def same_device(**tensors: torch.Tensor) -> None:
    """All ``tensors`` live on one device (kernels read them all from there)."""
    (_, first), *others = tensors.items()
    for name, t in others:
        if t.device != first.device:
            found = ", ".join(f"{n} on {u.device}" for n, u in tensors.items())
            raise _checks.InvalidArgumentError(
                f"{name}: expected all tensors on one device, got {found}",
                argument=name, kind="device", value=t.device)


def align_corners(value) -> bool:
    """PyTorch's ``align_corners``: a bool, or None for its default, False (PyTorch warns
    for grid_sample; volsample does not)."""
    if value is None:
        return False
    if not isinstance(value, (bool, np.bool_)):
        raise _checks.InvalidArgumentError(
            f"align_corners: expected a bool or None, got {type(value).__name__} {value!r}",
            argument="align_corners", kind="type", value=value)
    return bool(value)


def sizes(value):
    """PyTorch's output size, or sizes, with each 0-d integer tensor as its int (as
    F.interpolate takes them); the shared checks judge the rest (a float is a mistake)."""
    def plain(v):
        integer = (isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype != torch.bool
                   and not v.dtype.is_floating_point and not v.dtype.is_complex)
        return int(v) if integer else v
    return tuple(plain(v) for v in value) if isinstance(value, (list, tuple)) else plain(value)


# ---------------------------------------------------------------------------------------
# Memory order
# ---------------------------------------------------------------------------------------


def layout(t: torch.Tensor) -> str:
    """The NumPy API ``layout`` that reads the volume ``t`` in its own memory order."""
    return "NDHWC" if is_channels_last(t) else "NCDHW"


# ---------------------------------------------------------------------------------------
# Checked descriptions, kept per call
# ---------------------------------------------------------------------------------------


def _call_key(*args):
    """What an op's description depends on: its tensors' shapes, strides, dtypes and
    devices, and its other arguments (of their types; lists as tuples)."""
    return tuple((a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor)
                 else (list, tuple(a)) if isinstance(a, list) else (type(a), a)
                 for a in args)


# Decorate an op's ``describe(*args)`` (its checked ``_calls`` description) to reuse the
# description of an earlier call with the same ``_call_key``: building it costs more than a
# small call's kernel. Failing calls raise every time; calls that torch.compile traces
# (their sizes may be symbolic, and dynamo would guard on the caches) or strideless
# tensors describe afresh.
cached_description = _prepared.memoised(_call_key)
_prepared.tracing = torch.compiler.is_compiling

