"""What the operator families share: zero-copy views between CPU tensors and NumPy
arrays, layouts, torch-level argument checks and the GPU backend.

A CPU tensor reaches the NumPy API as a read-only view of its own memory: a channels-last
tensor as its (N, D, H, W, C) physical view with ``layout="NDHWC"``, a bfloat16 tensor
through its 16-bit words viewed as ``ml_dtypes.bfloat16``. Results come back the same way,
so the torch layer adds no copy in either direction.
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

from .. import _checks
from .._torch_formats import is_channels_last, memory_format

_TO_NUMPY = {torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
             torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
_TO_TORCH = {v: k for k, v in _TO_NUMPY.items()}
_NDHWC = (0, 2, 3, 4, 1)  # logical (N, C, D, H, W) -> physical channels-last
_NCDHW = (0, 4, 1, 2, 3)  # and back


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
# Tensors <-> NumPy arrays, without copies
# ---------------------------------------------------------------------------------------


class _TensorMemory:
    """NumPy's array interface over a CPU tensor's elements, read-only. The address comes
    from ``Tensor.const_data_ptr()``, a read access: ``Tensor.numpy()``, ``data_ptr()``,
    ``__dlpack__()`` and the storage's ``data_ptr()`` all take the writable address, which
    makes a lazily copied (copy-on-write) tensor copy its data first. The array's base is
    this object, which holds the tensor, so the memory lives as long as the array."""

    def __init__(self, t: torch.Tensor):
        self.tensor = t
        size = t.element_size()
        self.__array_interface__ = {
            "version": 3, "shape": tuple(t.shape), "typestr": f"<u{size}",
            "strides": tuple(s * size for s in t.stride()), "data": (t.const_data_ptr(), True)}


def read_only_numpy(t: torch.Tensor, layout: str = "NCDHW") -> np.ndarray:
    """The elements of the CPU tensor ``t`` as a read-only NumPy array in ``layout``'s axis
    order (a volume's physical order): a view of its memory whatever the strides, never a
    copy, and a copy-on-write tensor stays unmaterialised (the torch layer only reads its
    operands; its results are tensors of its own). The raw elements: an op's operands come
    with negative views resolved by the dispatcher."""
    if layout == "NDHWC":
        t = t.permute(_NDHWC)
    # Unsigned words of the element's size, then the element type (NumPy has no bfloat16).
    return np.asarray(_TensorMemory(t)).view(_TO_NUMPY[t.dtype])


def from_numpy(arr: np.ndarray, layout: str = "NCDHW") -> torch.Tensor:
    """The NumPy API's result ``arr`` (physical order of ``layout``) as a tensor in logical
    order that shares its memory."""
    if arr.size == 0:
        # NumPy gives empty arrays all-zero strides; torch's own are what fake results carry.
        shape = arr.shape if layout == "NCDHW" else tuple(arr.shape[i] for i in _NCDHW)
        return torch.empty(shape, dtype=_TO_TORCH[arr.dtype],
                           memory_format=(torch.channels_last_3d if layout == "NDHWC"
                                          else torch.contiguous_format))
    if arr.dtype == _TO_NUMPY[torch.bfloat16]:
        t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(arr)
    return t.permute(_NCDHW) if layout == "NDHWC" else t


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

_DTYPE_NAMES = "torch.float16, torch.bfloat16, torch.float32 or torch.float64"


def tensor(name: str, value) -> torch.Tensor:
    """``value`` as a 5-D tensor of a supported dtype (every operand here is 5-D)."""
    if not isinstance(value, torch.Tensor):
        raise DTypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in _TO_NUMPY:
        raise DTypeError(f"{name}: expected dtype {_DTYPE_NAMES}, got {value.dtype}")
    if value.dim() != 5:
        raise ArgumentError(
            f"{name}: expected a 5-D tensor, got {value.dim()}-D with shape {tuple(value.shape)}")
    return value


def same_device(**tensors: torch.Tensor) -> None:
    """All ``tensors`` live on one device (kernels read them all from there)."""
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        found = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise ArgumentError(f"expected all tensors on one device, got {found}")


def same_dtype(name: str, t: torch.Tensor, reference_name: str, reference: torch.Tensor) -> None:
    if t.dtype != reference.dtype:
        raise DTypeError(f"{name}: expected dtype {reference.dtype} "
                         f"(the dtype of {reference_name}), got {t.dtype}")


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
