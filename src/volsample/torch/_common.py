"""What the operator families share: the torch front door's half of the op layer (tensors
as ``_calls.Operand``s, PyTorch's exception classes), zero-copy NumPy views of CPU tensors
for the C++ backend, memory formats and the GPU backend.

A CPU tensor reaches the C++ kernels as a NumPy view of its own memory in logical (N, C,
D, H, W) order, whatever its strides (a bfloat16 tensor through its int16 bits viewed as
``ml_dtypes.bfloat16``); results are tensors allocated here, which the kernels write
through such views. The torch layer adds no copy in either direction.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import numbers
import warnings

import ml_dtypes
import numpy as np
import torch

from .. import _calls, _checks
from .._torch_formats import is_channels_last, memory_format

_TO_NUMPY = {torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
             torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}

# How the torch front door speaks: tensors, torch dtypes, logical shapes.
TORCH = _calls.Dialect(noun="tensor", spell=lambda name: f"torch.{name}", names_layout=False)


# ---------------------------------------------------------------------------------------
# Memory format
# ---------------------------------------------------------------------------------------


def layout(t: torch.Tensor) -> str:
    """The NumPy API ``layout`` that reads the volume ``t`` in its own memory order."""
    return "NDHWC" if is_channels_last(t) else "NCDHW"


def empty_volume(shape, like: torch.Tensor, dtype=None) -> torch.Tensor:
    """An uninitialised volume of logical ``shape`` on ``like``'s device, in its format."""
    return torch.empty(tuple(shape), dtype=dtype or like.dtype, device=like.device,
                       memory_format=memory_format(like))


# ---------------------------------------------------------------------------------------
# CPU tensors as NumPy arrays, without copies
# ---------------------------------------------------------------------------------------


def cpu_array(t: torch.Tensor | None) -> np.ndarray | None:
    """The memory of the CPU tensor ``t`` as a NumPy array of the same (logical) shape and
    strides: a view, never a copy. None stays None (an output not asked for)."""
    if t is None:
        return None
    t = t.detach()
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: reinterpret the bits
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# ---------------------------------------------------------------------------------------
# Errors: volsample's classes and messages, and also what PyTorch raises for the mistake
# ---------------------------------------------------------------------------------------


class ArgumentError(_checks.InvalidArgumentError, RuntimeError):
    """A bad value, shape or mode (PyTorch raises RuntimeError, or ValueError for mode
    strings and for size/scale_factor both or neither: this is both)."""


class DTypeError(_checks.UnsupportedDTypeError, NotImplementedError):
    """A tensor of an unsupported or mismatched dtype (PyTorch: NotImplementedError for
    integer tensors, RuntimeError for mixed ones; NotImplementedError is a RuntimeError)."""


class ArgumentTypeError(_checks.InvalidArgumentError, TypeError, RuntimeError):
    """An argument of the wrong Python type: a float size, a non-bool align_corners
    (PyTorch: TypeError)."""


_TORCH_CLASS = {_checks.InvalidArgumentError: ArgumentError,
                _checks.UnsupportedDTypeError: DTypeError}


@contextlib.contextmanager
def torch_errors():
    """Re-raise the shared checks' errors as the torch layer's classes (same message)."""
    try:
        yield
    except (ArgumentError, DTypeError, ArgumentTypeError):
        raise
    except _checks.VolsampleError as error:
        raise _TORCH_CLASS[type(error)](str(error)).with_traceback(error.__traceback__) from None


def raises_torch_errors(fn):
    """Decorate a check or entry point so that its errors are the torch layer's classes."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch_errors():
            return fn(*args, **kwargs)
    return wrapper


# ---------------------------------------------------------------------------------------
# Torch-level checks (the NumPy API's own checks run again on CPU tensors)
# ---------------------------------------------------------------------------------------

def operand(name: str, value) -> _calls.Operand:
    """A tensor argument as the op layer takes it (its logical shape and NumPy dtype);
    only a tensor of a dtype volsample has gets that far."""
    if not isinstance(value, torch.Tensor):
        raise DTypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in _TO_NUMPY:
        names = [TORCH.spell(n) for n in ("float16", "bfloat16", "float32", "float64")]
        raise DTypeError(f"{name}: expected dtype {', '.join(names[:-1])} or {names[-1]}, "
                         f"got {value.dtype}")
    return _calls.Operand(name, tuple(value.shape), _TO_NUMPY[value.dtype])


def tensor(name: str, value) -> torch.Tensor:
    """``value`` as a 5-D tensor of a supported dtype (the public functions' early check;
    the ops' builders repeat none of it but the rank)."""
    _checks.rank(name, operand(name, value).shape, 5, TORCH.noun)
    return value


def same_device(**tensors: torch.Tensor) -> None:
    """All ``tensors`` live on one device (kernels read them all from there)."""
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        found = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise ArgumentError(f"expected all tensors on one device, got {found}")


def align_corners(value) -> bool:
    """PyTorch's ``align_corners``: a bool, or None for its default, False (PyTorch warns
    for grid_sample; volsample does not)."""
    if value is None:
        return False
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(
            f"align_corners: expected a bool or None, got {type(value).__name__} {value!r}")
    return bool(value)


def integer_sizes(name: str, value) -> None:
    """Sizes are integers (PyTorch raises TypeError for a float size); their values are
    checked by the shared checks."""
    items = value if isinstance(value, (list, tuple)) else (value,)
    for v in items:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, torch.SymInt)):
            raise ArgumentTypeError(
                f"{name}: expected integers, got {type(v).__name__} {v!r} in {value!r}")


# ---------------------------------------------------------------------------------------
# Autograd entry: a torch.autograd.Function in eager mode (forward- and reverse-mode AD,
# torch.func), the op itself while torch.compile traces (Dynamo cannot trace a Function
# with a custom jvp; the op's own Autograd kernel carries both modes there)
# ---------------------------------------------------------------------------------------


_AUTOGRAD_LIBRARY = torch.library.Library("volsample", "IMPL")


def set_autograd_kernels(functions: dict) -> None:
    """Make each ``torch.autograd.Function`` (by op name) its custom op's Autograd kernel (replacing the
    backward-only one that ``torch.library.custom_op`` makes), so that calling an op
    directly has both AD modes too. torch.func transforms reach Functions only through
    ``Function.apply`` at the top, never from inside an op's kernel: those get a clear error.
    """
    for name, function in functions.items():
        def kernel(*args, _op_name=name, _function=function):
            if torch._C._are_functorch_transforms_active():
                raise RuntimeError(
                    f"torch.ops.volsample.{_op_name}: torch.func transforms are not supported "
                    f"on the op called directly; call volsample.torch.grid_sample / "
                    f"upsample_trilinear, which support them")
            return _function.apply(*args)

        with warnings.catch_warnings():  # "overriding a previously registered kernel"
            warnings.simplefilter("ignore", UserWarning)
            _AUTOGRAD_LIBRARY.impl(name, kernel, "Autograd")


def call(function, op, *args):
    """``function.apply(*args)`` in eager mode, ``op(*args)`` under torch.compile."""
    if torch.compiler.is_compiling():
        return op(*args)
    return function.apply(*args)


# ---------------------------------------------------------------------------------------
# GPU backend
# ---------------------------------------------------------------------------------------


def gpu_backend(family: str):
    """The Triton launchers of an operator family (``volsample._triton.<family>``)."""
    name = f"volsample._triton.{family}"
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise RuntimeError(
            f"volsample.torch: CUDA tensors need the Triton GPU backend ({name}), which could "
            f"not be imported ({error}); install triton, or compute on CPU tensors") from error
