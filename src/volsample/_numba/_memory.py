"""Hand arrays of any strides to kernels as flat buffers.

Kernels take a 1-D buffer, the element offset of element [0, ..., 0] in it and the element
strides (a tuple). That one signature serves contiguous arrays, channels-last views, slices and
negative strides alike, so each kernel compiles once per dtype.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided


def flat(arr: np.ndarray):
    """``(buffer, offset, strides)`` describing ``arr``; ``buffer[offset + i @ strides] == arr[i]``."""
    itemsize = arr.itemsize
    if arr.size == 0 or any(s % itemsize for s in arr.strides):
        arr = np.ascontiguousarray(arr)
        if arr.size == 0:
            return np.empty(1, arr.dtype), 0, (0,) * arr.ndim
    strides = np.array([s // itemsize for s in arr.strides], np.int64)
    # Flip negative-stride axes: the view then starts at the lowest address in use.
    lowest = arr[tuple(slice(None, None, -1) if s < 0 else slice(None) for s in strides)]
    extent = np.array(arr.shape, np.int64) - 1
    offset = int(-(extent * strides)[strides < 0].sum())
    span = int((extent * np.abs(strides)).sum()) + 1
    buffer = as_strided(lowest, shape=(span,), strides=(itemsize,), writeable=arr.flags.writeable)
    # Strides travel as a tuple: values the compiler keeps in registers, where an array
    # would be reloaded after every store the kernel makes.
    return buffer, offset, tuple(int(s) for s in strides)
