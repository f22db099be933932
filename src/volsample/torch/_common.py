"""What the operator families share: zero-copy views between CPU tensors and NumPy
arrays, layouts, torch-level argument checks and the GPU backend.

A CPU tensor reaches the NumPy API as a view of its own memory: a channels-last tensor
as its (N, D, H, W, C) physical view with ``layout="NDHWC"``, a bfloat16 tensor through
its int16 bits viewed as ``ml_dtypes.bfloat16``. Results come back the same way, so the
torch layer adds no copy in either direction.
"""
from __future__ import annotations

import importlib

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


def to_numpy(t: torch.Tensor, layout: str = "NCDHW") -> np.ndarray:
    """The memory of the CPU tensor ``t`` as a NumPy array, in ``layout``'s axis order
    (a volume's physical order); a view, never a copy, whatever the strides."""
    t = t.detach()
    if layout == "NDHWC":
        t = t.permute(_NDHWC)
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: reinterpret the bits
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


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
# Torch-level checks (the NumPy API's own checks run again on CPU tensors)
# ---------------------------------------------------------------------------------------

_DTYPE_NAMES = "torch.float16, torch.bfloat16, torch.float32 or torch.float64"


def tensor(name: str, value) -> torch.Tensor:
    """``value`` as a 5-D tensor of a supported dtype (every operand here is 5-D)."""
    if not isinstance(value, torch.Tensor):
        raise _checks.UnsupportedDTypeError(
            f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in _TO_NUMPY:
        raise _checks.UnsupportedDTypeError(
            f"{name}: expected dtype {_DTYPE_NAMES}, got {value.dtype}")
    if value.dim() != 5:
        raise _checks.InvalidArgumentError(
            f"{name}: expected a 5-D tensor, got {value.dim()}-D with shape {tuple(value.shape)}")
    return value


def same_device(**tensors: torch.Tensor) -> None:
    """All ``tensors`` live on one device (kernels read them all from there)."""
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        found = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise _checks.InvalidArgumentError(f"expected all tensors on one device, got {found}")


def same_dtype(name: str, t: torch.Tensor, reference_name: str, reference: torch.Tensor) -> None:
    if t.dtype != reference.dtype:
        raise _checks.UnsupportedDTypeError(f"{name}: expected dtype {reference.dtype} "
                                            f"(the dtype of {reference_name}), got {t.dtype}")


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
