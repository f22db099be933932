"""Storage dtypes versus compute dtypes.

float16 and bfloat16 volumes are loaded into float32, computed and accumulated there,
and rounded once when stored; float32 and float64 compute in their own precision.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT16 = np.dtype(np.float16)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT32 = np.dtype(np.float32)
FLOAT64 = np.dtype(np.float64)

SUPPORTED = (FLOAT16, BFLOAT16, FLOAT32, FLOAT64)
SIXTEEN_BIT = (FLOAT16, BFLOAT16)
# Integer label maps: nearest grid sampling (forward) copies their values exactly.
LABELS = (np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.int32))


def compute_dtype(volume_dtype, grid_dtype=None) -> np.dtype:
    """The precision a call computes in: the volume's, widened to float32, and to float64
    when a float64 grid accompanies a 16-bit volume."""
    volume_dtype = np.dtype(volume_dtype)
    if volume_dtype in SIXTEEN_BIT:
        if grid_dtype is not None and np.dtype(grid_dtype) == FLOAT64:
            return FLOAT64
        return FLOAT32
    return volume_dtype


def as_compute(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``arr`` in ``dtype``: the array itself when it already is, else a converted copy."""
    return arr if arr.dtype == dtype else arr.astype(dtype)
