"""Argument checks shared by every front door.

One checker per kind of precondition; every message names the argument, says what was
expected and echoes what came. All checks run before any work is done. Each error also
carries the argument, the kind of mistake and the value that came, so that a front door
can put the mistake in its own terms (the torch layer starts its messages with PyTorch's
words for the same mistake). The kinds:

    type            not of the Python type expected (not an array, a float size, a flag
                    that is not a bool, a scale that is not a number)
    dtype           an unsupported dtype
    dtype_mismatch  dtypes that do not go together (value: the expected dtype, the one that came)
    rank            the wrong number of dimensions (value: the number that came)
    shape           a shape that does not fit (a grid's last dimension, a gradient's shape)
    batch           a batch size that differs from the input's
    empty           an empty spatial dimension
    choice          a value not among those supported (a mode, a layout, an op's code)
    length          a sequence of the wrong length
    too_small       a number below the least allowed (a size or scale that gives no voxels)
    too_large       a number above the most allowed
    nonfinite       NaN or infinity
    mismatch        values that contradict each other (scales and sizes)
    exclusive       both or neither of two arguments that go one at a time (value: "both"
                    or "neither")
    device          tensors on different devices
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import _dtypes
from ._modes import BILINEAR, BORDER, NEAREST, REFLECTION, ZEROS


class VolsampleError(Exception):
    """Base class of every error volsample raises on bad input. ``argument``, ``kind`` (one
    of the kinds above) and ``value`` say what was wrong, where the check knows it."""

    def __init__(self, message, *, argument=None, kind=None, value=None):
        super().__init__(message)
        self.argument, self.kind, self.value = argument, kind, value


class InvalidArgumentError(VolsampleError, ValueError):
    """A value, shape, size or mode that the operator does not accept."""


class UnsupportedDTypeError(VolsampleError, TypeError):
    """An array of a dtype the operator does not accept, or of mixed dtypes."""


MODES = {"bilinear": BILINEAR, "nearest": NEAREST}
PADDING_MODES = {"zeros": ZEROS, "border": BORDER, "reflection": REFLECTION}
LAYOUTS = ("NCDHW", "NDHWC")


def _choice(name: str, value, table: dict):
    if not isinstance(value, str) or value not in table:
        raise InvalidArgumentError(
            f"{name}: expected one of {', '.join(repr(k) for k in table)}, got {value!r}",
            argument=name, kind="choice", value=value)
    return table[value]


def mode_code(mode) -> int:
    """The kernel integer of an interpolation mode string."""
    return _choice("mode", mode, MODES)


def padding_code(padding_mode) -> int:
    """The kernel integer of a padding mode string."""
    return _choice("padding_mode", padding_mode, PADDING_MODES)


def layout_name(layout) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise InvalidArgumentError(f"layout: expected 'NCDHW' or 'NDHWC', got {layout!r}",
                                   argument="layout", kind="choice", value=layout)
    return layout


def boolean(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name}: expected a bool, got {type(value).__name__} {value!r}",
                                   argument=name, kind="type", value=value)
    return bool(value)


def output_mask(value) -> tuple[bool, bool]:
    try:
        items = tuple(value)
    except TypeError:
        items = None
    if items is None or len(items) != 2 or not all(isinstance(v, (bool, np.bool_)) for v in items):
        raise InvalidArgumentError(f"output_mask: expected a pair of bools, got {value!r}",
                                   argument="output_mask", kind="type", value=value)
    return bool(items[0]), bool(items[1])


def array(name: str, value, ndim: int, labels: bool = False) -> np.ndarray:
    """``value`` as a NumPy array of a supported floating dtype (or, with ``labels``, an
    integer label dtype) and rank ``ndim``."""
    if not isinstance(value, np.ndarray):
        if hasattr(value, "__array__") or isinstance(value, (list, tuple)):
            value = np.asarray(value)
        else:
            raise UnsupportedDTypeError(
                f"{name}: expected a NumPy array, got {type(value).__name__}",
                argument=name, kind="type", value=value)
    if not _dtypes.is_supported(value.dtype) and not (labels and value.dtype in _dtypes.LABELS):
        hint = (" (integer label maps, uint8/int16/int32, are sampled by grid_sample_3d with "
                "mode='nearest' only)" if value.dtype in _dtypes.LABELS else "")
        raise UnsupportedDTypeError(
            f"{name}: expected dtype float16, bfloat16, float32 or float64, got {value.dtype}"
            + hint, argument=name, kind="dtype", value=value.dtype)
    if value.ndim != ndim:
        raise InvalidArgumentError(
            f"{name}: expected a {ndim}-D array, got {value.ndim}-D with shape {value.shape}",
            argument=name, kind="rank", value=value.ndim)
    return value


def same_dtype(name: str, arr: np.ndarray, reference_name: str, reference: np.ndarray) -> None:
    if arr.dtype != reference.dtype:
        raise UnsupportedDTypeError(
            f"{name}: expected dtype {reference.dtype} (the dtype of {reference_name}), "
            f"got {arr.dtype}", argument=name, kind="dtype_mismatch", value=(reference.dtype, arr.dtype))


def grid_dtype(grid: np.ndarray, volume: np.ndarray) -> None:
    """A grid shares the volume's dtype, or is float32/float64 beside a 16-bit volume or an
    integer label map."""
    if volume.dtype in _dtypes.LABELS:
        if grid.dtype in (_dtypes.FLOAT32, _dtypes.FLOAT64):
            return
        raise UnsupportedDTypeError(
            f"grid: expected dtype float32 or float64 with an integer ({volume.dtype}) input, "
            f"got {grid.dtype}", argument="grid", kind="dtype_mismatch",
            value=(volume.dtype, grid.dtype))
    if grid.dtype == volume.dtype:
        return
    if _dtypes.is_sixteen_bit(volume.dtype) and grid.dtype in (_dtypes.FLOAT32, _dtypes.FLOAT64):
        return
    raise UnsupportedDTypeError(
        f"grid: expected dtype {volume.dtype} (the dtype of input), or float32/float64 with a "
        f"float16/bfloat16 input, got {grid.dtype}", argument="grid", kind="dtype_mismatch",
        value=(volume.dtype, grid.dtype))


def shape_equal(name: str, shape, expected, what: str) -> None:
    if tuple(shape) != tuple(expected):
        raise InvalidArgumentError(f"{name}: expected {what} {tuple(expected)}, got {tuple(shape)}",
                                   argument=name, kind="shape", value=tuple(shape))


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
    if value <= 0 or value > MAX_SIZE:
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
        if v < minimum or v > MAX_SIZE:
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


def upsample_output_size(in_spatial, size, scale_factor):
    """Upsampling's output spatial size and per-axis forward scales (None where ``size``
    was given), from exactly one of ``size`` and ``scale_factor``."""
    if (size is None) == (scale_factor is None):
        got = "both" if size is not None else "neither"
        raise InvalidArgumentError("size, scale_factor: expected exactly one of them, got " + got,
                                   argument="size, scale_factor", kind="exclusive", value=got)
    if size is not None:
        if isinstance(size, (list, tuple, np.ndarray)):
            return int_sequence("size", size, 3, 1), (None, None, None)
        return (positive_int("size", size),) * 3, (None, None, None)
    scales = scale_factors("scale_factor", scale_factor, 3)
    out = tuple(math.floor(n * s) for n, s in zip(in_spatial, scales))  # float64, as PyTorch
    if max(out) > MAX_SIZE:
        raise InvalidArgumentError(
            f"scale_factor: expected an output of at most 2**40 voxels per axis, got "
            f"{tuple(in_spatial)} * {scale_factor!r} -> {out}",
            argument="scale_factor", kind="too_large", value=scale_factor)
    if min(out) < 1:
        raise InvalidArgumentError(
            f"scale_factor: expected an output of at least 1 voxel per axis, got "
            f"{tuple(in_spatial)} * {scale_factor!r} -> {out}",
            argument="scale_factor", kind="too_small", value=scale_factor)
    return out, scales
