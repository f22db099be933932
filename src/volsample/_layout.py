"""NCDHW / NDHWC: kernels index volumes in logical (N, C, D, H, W) order; a channels-last
array is the same data seen through a transposed view, never a copy."""
from __future__ import annotations

import numpy as np

_TO_LOGICAL = {"NCDHW": (0, 1, 2, 3, 4), "NDHWC": (0, 4, 1, 2, 3)}
_TO_PHYSICAL = {"NCDHW": (0, 1, 2, 3, 4), "NDHWC": (0, 2, 3, 4, 1)}


def logical(arr: np.ndarray, layout: str) -> np.ndarray:
    """View of a volume stored in ``layout`` with axes in (N, C, D, H, W) order."""
    return arr.transpose(_TO_LOGICAL[layout])


def physical(arr: np.ndarray, layout: str) -> np.ndarray:
    """Inverse of ``logical``: the (N, C, D, H, W) view back in ``layout`` order."""
    return arr.transpose(_TO_PHYSICAL[layout])


def physical_shape(logical_shape, layout: str) -> tuple[int, ...]:
    return tuple(logical_shape[i] for i in _TO_PHYSICAL[layout])


def logical_shape(physical_shape_, layout: str) -> tuple[int, ...]:
    return tuple(physical_shape_[i] for i in _TO_LOGICAL[layout])


def empty(logical_shape_, dtype, layout: str, zero: bool = False) -> np.ndarray:
    """A new volume, contiguous in ``layout``, returned as its logical view."""
    make = np.zeros if zero else np.empty
    return logical(make(physical_shape(logical_shape_, layout), dtype), layout)
