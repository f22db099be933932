"""The torch door's errors: the shared checks' errors re-raised as classes that are also
PyTorch's, with PyTorch's words for the same mistake first and volsample's after."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from .. import _checks
from ._numpy_dtypes import TO_TORCH

# ---------------------------------------------------------------------------------------
# Errors: volsample's classes and messages, said as PyTorch says the same mistake
# ---------------------------------------------------------------------------------------


class ArgumentError(_checks.InvalidArgumentError, RuntimeError):
    """A bad value, shape or mode (PyTorch raises RuntimeError, or ValueError for mode
    strings and for size/scale_factor both or neither: this is both)."""


class DTypeError(_checks.UnsupportedDTypeError, NotImplementedError):
    """A tensor of an unsupported or mismatched dtype (PyTorch: NotImplementedError for
    integer tensors, RuntimeError for mixed ones; NotImplementedError is a RuntimeError),
    or not a tensor (TypeError, as volsample.UnsupportedDTypeError is)."""


class ArgumentTypeError(_checks.InvalidArgumentError, TypeError, RuntimeError):
    """An argument of the wrong Python type: a float size, a non-bool align_corners
    (PyTorch: TypeError)."""


class UnsupportedArgumentError(_checks.InvalidArgumentError, NotImplementedError):
    """A call PyTorch does not implement: trilinear upsampling of a tensor that is not 5-D
    (PyTorch: NotImplementedError, a RuntimeError)."""


_TORCH_CLASSES = (ArgumentError, DTypeError, ArgumentTypeError, UnsupportedArgumentError)
_TORCH_CLASS = {_checks.InvalidArgumentError: ArgumentError,
                _checks.UnsupportedDTypeError: DTypeError}

GRID_SAMPLER, UPSAMPLE = "grid_sampler", "upsample_trilinear3d"  # the operators, in errors
WARP = "warp"  # volsample's own: PyTorch has no words for its mistakes

# PyTorch's words that several mistakes share
_INVALID_UPSAMPLE_ARGUMENTS = ("upsample_trilinear3d() received an invalid combination of "
                               "arguments")
_NO_VOXELS = "Input and output sizes should be greater than 0"
_OVERFLOW = "value cannot be converted to type int64_t without overflow"
_GRID_RANK = "grid_sampler(): expected 5D input and grid with same number of dimensions"


def _scalar_type(dtype) -> str:
    """PyTorch's C++ name of a dtype, torch's or NumPy's (torch.int32: Int), as its
    messages print it."""
    if not isinstance(dtype, torch.dtype):
        dtype = TO_TORCH.get(dtype) or torch.from_numpy(np.empty(0, dtype)).dtype
    return torch.empty(0, dtype=dtype).type()[len("torch."):-len("Tensor")]


def _expected_scalar_type(dtypes) -> str:
    expected, found = dtypes
    return f"expected scalar type {_scalar_type(expected)} but found {_scalar_type(found)}"


def _not_implemented(op: str):
    return lambda dtype: f'"{op}" not implemented for \'{_scalar_type(dtype)}\''


def _trilinear_rank(ndim: int) -> str:
    if ndim in (3, 4):
        return f"Got {ndim}D input, but trilinear mode needs 5D input"
    return (f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {ndim}D) for the "
            f"modes: nearest | linear | bilinear | bicubic | trilinear | lanczos | area | "
            f"nearest-exact (got trilinear)")


def _grid_mode(mode) -> str:
    # PyTorch's sentence without its list of modes, which lacks "bspline": volsample's own
    # message, which follows, lists the modes volsample.torch takes.
    return (f"nn.functional.grid_sample(): expected mode to be one volsample.torch takes, "
            f"but got: '{mode}'")


def _size_types(size) -> str:
    if not isinstance(size, (list, tuple)):  # one size, repeated before the op's parser
        return _INVALID_UPSAMPLE_ARGUMENTS
    return ("expected size to be one of int or Tuple[int] or Tuple[int, int] or "
            f"Tuple[int, int, int], but got size with types {[type(v) for v in size]}")


def _scale_types(scale_factor) -> str:
    if not isinstance(scale_factor, (list, tuple)):
        return _INVALID_UPSAMPLE_ARGUMENTS
    return "upsample_trilinear3d(): argument 'scale_factors' must be tuple of floats"


# What PyTorch 2.13 raises for each mistake (torch.nn.functional.grid_sample / interpolate,
# aten::grid_sampler_3d, aten::upsample_trilinear3d and its backward), keyed by (operator,
# argument, kind of mistake; the kinds are volsample._checks'): the torch layer's class
# that is also PyTorch's, and PyTorch's words, as they are or a function of the value that
# came. They start the message; volsample's own (argument, expected, got) follows in
# parentheses. Mistakes PyTorch has no words for keep volsample's message alone.
_PYTORCH_WORDS: dict[tuple[str, str | None, str | None], tuple[Any, Any]] = {
    (GRID_SAMPLER, "input", "type"): (
        DTypeError, "grid_sampler(): argument 'input' (position 1) must be Tensor"),
    (GRID_SAMPLER, "grid", "type"): (
        DTypeError, "grid_sampler(): argument 'grid' (position 2) must be Tensor"),
    (GRID_SAMPLER, "input", "dtype"): (DTypeError, _not_implemented("grid_sampler_3d")),
    (GRID_SAMPLER, "grid", "dtype_mismatch"): (DTypeError, _expected_scalar_type),
    (GRID_SAMPLER, "grad_output", "dtype_mismatch"): (DTypeError, _expected_scalar_type),
    (GRID_SAMPLER, "input", "rank"): (ArgumentError, _GRID_RANK),
    (GRID_SAMPLER, "grid", "rank"): (ArgumentError, _GRID_RANK),
    (GRID_SAMPLER, "grid", "shape"): (
        ArgumentError, "grid_sampler(): expected grid to have size 3 in last dimension"),
    (GRID_SAMPLER, "grid", "batch"): (
        ArgumentError, "grid_sampler(): expected grid and input to have same batch size"),
    (GRID_SAMPLER, "input", "empty"): (
        ArgumentError, "grid_sampler(): expected input to have non-empty spatial dimensions"),
    (GRID_SAMPLER, "grid", "device"): (
        ArgumentError, "grid_sampler(): expected input and grid to be on same device"),
    (GRID_SAMPLER, "mode", "choice"): (ArgumentError, _grid_mode),
    (GRID_SAMPLER, "padding_mode", "choice"): (
        ArgumentError, lambda padding_mode: (
            "nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or "
            f"'reflection', but got: '{padding_mode}'")),
    (GRID_SAMPLER, "align_corners", "type"): (
        ArgumentTypeError, lambda value: ("grid_sampler(): argument 'align_corners' (position "
                                          f"5) must be bool, not {type(value).__name__}")),
    (UPSAMPLE, "input", "dtype"): (DTypeError, _not_implemented("upsample_trilinear3d")),
    (UPSAMPLE, "input", "rank"): (UnsupportedArgumentError, _trilinear_rank),
    (UPSAMPLE, "input", "empty"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "size", "type"): (ArgumentTypeError, _size_types),
    (UPSAMPLE, "size", "length"): (
        ArgumentError, "Input and output must have the same number of spatial dimensions"),
    (UPSAMPLE, "size", "too_small"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "scale_factor", "type"): (ArgumentTypeError, _scale_types),
    (UPSAMPLE, "scale_factor", "length"): (
        ArgumentError, "Input and scale_factor must have the same number of spatial dimensions"),
    (UPSAMPLE, "scale_factor", "too_small"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "scale_factor", "too_large"): (ArgumentError, _OVERFLOW),
    (UPSAMPLE, "scale_factor", "nonfinite"): (ArgumentError, _OVERFLOW),
    (UPSAMPLE, "size, scale_factor", "exclusive"): (
        ArgumentError, lambda got: ("only one of size or scale_factor should be defined"
                                    if got == "both"
                                    else "either size or scale_factor should be defined")),
    (UPSAMPLE, "align_corners", "type"): (ArgumentTypeError, _INVALID_UPSAMPLE_ARGUMENTS),
    (UPSAMPLE, "output_size", "length"): (
        ArgumentError, lambda size: f"It is expected output_size equals to 3, but got size "
                                    f"{len(size)}"),
    (UPSAMPLE, "output_size", "too_small"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "input_size", "length"): (
        ArgumentError, lambda size: f"It is expected input_size equals to 5, but got size "
                                    f"{len(size)}"),
    (UPSAMPLE, "input_size", "empty"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "grad_output", "empty"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "grad_output", "shape"): (
        ArgumentError, "Expected grad_output to have the same shape as output"),
}


def _torch_error(op: str, error: _checks.VolsampleError) -> _checks.VolsampleError:
    """``error`` of the shared checks as the torch layer raises it for operator ``op``."""
    cls, words = _PYTORCH_WORDS.get((op, error.argument, error.kind), (None, None))
    if cls is None:
        cls, message = _TORCH_CLASS[type(error)], str(error)
    else:
        message = f"{words(error.value) if callable(words) else words} ({error})"
    return cls(message, argument=error.argument, kind=error.kind, value=error.value)


class torch_errors:
    """Context: re-raise the shared checks' errors as the torch layer's classes, in
    PyTorch's words for the operator ``op`` (GRID_SAMPLER or UPSAMPLE) followed by
    volsample's message. (A class, not a generator: entered on every call of a door.)"""

    def __init__(self, op: str):
        self.op = op

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> None:
        if isinstance(error, _checks.VolsampleError) and not isinstance(error, _TORCH_CLASSES):
            raise _torch_error(self.op, error).with_traceback(traceback) from None


def raises_torch_errors(op: str):
    """Decorate a check or entry point of operator ``op`` so that its errors are the torch
    layer's (see ``torch_errors``; a plain try, cheaper per call than the context)."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except _TORCH_CLASSES:
                raise
            except _checks.VolsampleError as error:
                raise _torch_error(op, error).with_traceback(error.__traceback__) from None
        return wrapper
    return decorate
