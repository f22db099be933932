"""Storage dtypes versus compute dtypes.

float16 and bfloat16 volumes are loaded into float32, computed and accumulated there,
and rounded once when stored; float32 and float64 compute in their own precision.

bfloat16 is ml_dtypes', imported on first use of ``BFLOAT16``: importing ml_dtypes takes
most of a second, and an array can only be bfloat16 once its maker has imported it, so the
checks (``is_bfloat16`` and the rest) never import it themselves.
"""
from __future__ import annotations

import sys

import numpy as np

FLOAT16 = np.dtype(np.float16)
FLOAT32 = np.dtype(np.float32)
FLOAT64 = np.dtype(np.float64)
# Integer label maps: nearest grid sampling (forward) copies their values exactly.
LABELS = (np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.int32))
SUPPORTED_NAMES = ("float16", "bfloat16", "float32", "float64")


def __getattr__(name):
    if name == "BFLOAT16":
        import ml_dtypes
        bfloat16 = globals()["BFLOAT16"] = np.dtype(ml_dtypes.bfloat16)
        return bfloat16
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_bfloat16(dtype: np.dtype) -> bool:
    ml_dtypes = sys.modules.get("ml_dtypes")
    # (the scalar type's identity: comparing dtypes costs a conversion per call)
    return ml_dtypes is not None and getattr(dtype, "type", dtype) is ml_dtypes.bfloat16


def is_sixteen_bit(dtype: np.dtype) -> bool:
    return dtype == FLOAT16 or is_bfloat16(dtype)


def is_supported(dtype: np.dtype) -> bool:
    """A float dtype the operators take: float16, bfloat16, float32, float64."""
    return dtype in (FLOAT32, FLOAT64) or is_sixteen_bit(dtype)


def grid_dtype_allowed(volume: np.dtype, grid: np.dtype) -> bool:
    """A grid shares the volume's dtype, or is float32/float64 beside a 16-bit volume
    (mixed precision) or an integer label map."""
    if grid == volume and volume not in LABELS:
        return True
    return grid in (FLOAT32, FLOAT64) and (is_sixteen_bit(volume) or volume in LABELS)


def compute_dtype(volume_dtype, grid_dtype=None) -> np.dtype:
    """The precision a call computes in: the volume's, widened to float32, and to float64
    when a float64 grid accompanies a 16-bit volume."""
    volume_dtype = np.dtype(volume_dtype)
    if is_sixteen_bit(volume_dtype):
        if grid_dtype is not None and np.dtype(grid_dtype) == FLOAT64:
            return FLOAT64
        return FLOAT32
    return volume_dtype


def as_compute(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``arr`` in ``dtype``: the array itself when it already is, else a converted copy."""
    return arr if arr.dtype == dtype else arr.astype(dtype)
