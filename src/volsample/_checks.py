"""Argument checks shared by every front door.

One checker per kind of precondition; every message names the argument, says what was
expected and echoes what came, and the error carries the argument, the kind of mistake and
the value (``_errors``). All checks run before any work is done. The checks of a whole
call are assembled in ``_calls`` (the op layer).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import _dtypes
from ._errors import InvalidArgumentError, UnsupportedDTypeError, VolsampleError

__all__ = ["VolsampleError", "InvalidArgumentError", "UnsupportedDTypeError"]


def boolean(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name}: expected a bool, got {type(value).__name__} {value!r}",
                                   argument=name, kind="type", value=value)
    return bool(value)


def output_mask(value, count: int = 2) -> tuple[bool, ...]:
    """``count`` bools, one per gradient a backward may compute."""
    try:
        items = tuple(value)
    except TypeError:
        items = None
    if (items is None or len(items) != count
            or not all(isinstance(v, (bool, np.bool_)) for v in items)):
        what = "a pair of bools" if count == 2 else f"{count} bools"
        raise InvalidArgumentError(f"output_mask: expected {what}, got {value!r}",
                                   argument="output_mask", kind="type", value=value)
    return tuple(bool(v) for v in items)


def ndarray(name: str, value) -> np.ndarray:
    """``value`` as a NumPy array (array-likes are converted; other objects refused)."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__array__") or isinstance(value, (list, tuple)):
        return np.asarray(value)
    raise UnsupportedDTypeError(f"{name}: expected a NumPy array, got {type(value).__name__}",
                                argument=name, kind="type", value=value)


def _plain(dtype_name: str) -> str:
    return dtype_name


def volume_dtype(name: str, dtype: np.dtype, spell=_plain, labels: bool = False) -> None:
    """A float dtype the operators take (or, with ``labels``, an integer label dtype).
    ``spell`` names a dtype (given its NumPy name) as the caller's front door does."""
    if _dtypes.is_supported(dtype) or (labels and dtype in _dtypes.LABELS):
        return
    hint = (" (integer label maps, uint8/int16/int32, are sampled by grid_sample_3d with "
            "mode='nearest' only)" if dtype in _dtypes.LABELS else "")
    names = [spell(n) for n in _dtypes.SUPPORTED_NAMES]
    raise UnsupportedDTypeError(f"{name}: expected dtype {', '.join(names[:-1])} or {names[-1]}, "
                                f"got {spell(dtype.name)}" + hint,
                                argument=name, kind="dtype", value=dtype)


def rank(name: str, shape, ndim: int, noun: str = "array") -> None:
    if len(shape) != ndim:
        raise InvalidArgumentError(
            f"{name}: expected a {ndim}-D {noun}, got {len(shape)}-D with shape {tuple(shape)}",
            argument=name, kind="rank", value=len(shape))


def same_dtype(name: str, dtype: np.dtype, reference_name: str, reference: np.dtype,
               spell=_plain) -> None:
    if dtype != reference:
        raise UnsupportedDTypeError(f"{name}: expected dtype {spell(reference.name)} (the dtype "
                                    f"of {reference_name}), got {spell(dtype.name)}",
                                    argument=name, kind="dtype_mismatch", value=(reference, dtype))


def grid_dtype(name: str, grid: np.dtype, volume_name: str, volume: np.dtype,
               spell=_plain) -> None:
    """A grid shares the volume's dtype, or is float32/float64 beside a 16-bit volume or an
    integer label map (``_dtypes.grid_dtype_allowed``)."""
    if _dtypes.grid_dtype_allowed(volume, grid):
        return
    wide = f"{spell('float32')} or {spell('float64')}"
    if volume in _dtypes.LABELS:
        raise UnsupportedDTypeError(
            f"{name}: expected dtype {wide} with an integer ({spell(volume.name)}) "
            f"{volume_name}, got {spell(grid.name)}",
            argument=name, kind="dtype_mismatch", value=(volume, grid))
    raise UnsupportedDTypeError(
        f"{name}: expected dtype {spell(volume.name)} (the dtype of {volume_name}), or {wide} "
        f"with a float16/bfloat16 {volume_name}, got {spell(grid.name)}",
        argument=name, kind="dtype_mismatch", value=(volume, grid))


def shape_equal(name: str, shape, expected, what: str) -> None:
    if tuple(shape) != tuple(expected):
        raise InvalidArgumentError(f"{name}: expected {what} {tuple(expected)}, got {tuple(shape)}",
                                   argument=name, kind="shape", value=tuple(shape))


def out_array(name: str, out, shape, dtype: np.dtype, contiguous: bool = True) -> np.ndarray:
    """A caller's array for a result: a writeable NumPy array of the result's (physical)
    shape and dtype, C-contiguous where the kernel asks for it."""
    if not isinstance(out, np.ndarray):
        raise UnsupportedDTypeError(f"{name}: expected a NumPy array, got {type(out).__name__}",
                                    argument=name, kind="type", value=out)
    if out.dtype != dtype:
        raise UnsupportedDTypeError(f"{name}: expected dtype {np.dtype(dtype).name}, got "
                                    f"{out.dtype.name}", argument=name, kind="dtype",
                                    value=out.dtype)
    shape_equal(name, out.shape, shape, "the result's shape")
    if not out.flags.writeable or (contiguous and not out.flags.c_contiguous):
        raise InvalidArgumentError(f"{name}: expected a writeable{' C-contiguous' * contiguous}"
                                   f" array, got strides {out.strides}"
                                   f"{'' if out.flags.writeable else ', read-only'}",
                                   argument=name, kind="layout", value=out.strides)
    return out


def nonempty_spatial(name: str, spatial) -> None:
    if min(spatial) <= 0:
        raise InvalidArgumentError(
            f"{name}: expected non-empty spatial dimensions (D, H, W), got {tuple(spatial)}",
            argument=name, kind="empty", value=tuple(spatial))


# Largest size per axis: products of sizes and strides must stay inside int64.
MAX_SIZE = 2 ** 40


def _bound(value, minimum) -> str:
    """The kind of an out-of-range number: below ``minimum`` or above MAX_SIZE."""
    return "too_small" if value < minimum else "too_large"


def positive_int(name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentError(
            f"{name}: expected a positive integer, got {type(value).__name__} {value!r}",
            argument=name, kind="type", value=value)
    if not 0 < int(value) <= MAX_SIZE:  # int(): the numbers ABCs declare no comparisons
        raise InvalidArgumentError(f"{name}: expected a positive integer <= 2**40, got {value}",
                                   argument=name, kind=_bound(value, 1), value=value)
    return int(value)


def int_sequence(name: str, value, length: int, minimum: int) -> tuple[int, ...]:
    """A tuple of ``length`` integers, each >= ``minimum``."""
    try:
        items = tuple(value)
    except TypeError:
        raise InvalidArgumentError(f"{name}: expected {length} integers, got {value!r}",
                                   argument=name, kind="type", value=value) from None
    if len(items) != length:
        raise InvalidArgumentError(
            f"{name}: expected {length} integers, got {len(items)}: {value!r}",
            argument=name, kind="length", value=value)
    for v in items:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
            raise InvalidArgumentError(
                f"{name}: expected integers, got {type(v).__name__} {v!r} in {value!r}",
                argument=name, kind="type", value=value)
        if not minimum <= int(v) <= MAX_SIZE:
            raise InvalidArgumentError(
                f"{name}: expected integers in [{minimum}, 2**40], got {v} in {value!r}",
                argument=name, kind=_bound(v, minimum), value=value)
    return tuple(int(v) for v in items)


def _finite_real(name: str, v, value) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise InvalidArgumentError(
            f"{name}: expected real numbers, got {type(v).__name__} {v!r} in {value!r}",
            argument=name, kind="type", value=value)
    if not math.isfinite(float(v)):  # plain Python: torch.compile traces NumPy calls
        raise InvalidArgumentError(f"{name}: expected finite numbers, got {v!r} in {value!r}",
                                   argument=name, kind="nonfinite", value=value)
    return float(v)


def scale_factors(name: str, value, length: int) -> tuple[float, ...]:
    """A positive finite number, or ``length`` of them (one per spatial axis)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()  # a NumPy scalar array is one number
    items = value if isinstance(value, (list, tuple, np.ndarray)) else (value,) * length
    if len(items) != length:
        raise InvalidArgumentError(
            f"{name}: expected a number or {length} numbers, got {len(items)}: {value!r}",
            argument=name, kind="length", value=value)
    items = tuple(_finite_real(name, v, value) for v in items)
    if min(items) <= 0:
        raise InvalidArgumentError(f"{name}: expected positive numbers, got {value!r}",
                                   argument=name, kind="too_small", value=value)
    return items


def optional_scales(name: str, value, length: int) -> tuple[float | None, ...]:
    """None, or ``length`` entries each None or a finite number (<= 0 counts as None)."""
    if value is None:
        return (None,) * length
    try:
        items = tuple(value)
    except TypeError:
        raise InvalidArgumentError(
            f"{name}: expected None or {length} numbers-or-None, got {value!r}",
            argument=name, kind="type", value=value) from None
    if len(items) != length:
        raise InvalidArgumentError(
            f"{name}: expected None or {length} numbers-or-None, got {len(items)}: {value!r}",
            argument=name, kind="length", value=value)
    return tuple(None if v is None else _finite_real(name, v, value) for v in items)
