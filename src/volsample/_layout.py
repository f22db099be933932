"""NCDHW / NDHWC, the two memory orders of a volume: the table of their axis permutations.

Kernels index volumes in logical (N, C, D, H, W) order; a channels-last array is the same
data seen through a transposed view, never a copy."""
from __future__ import annotations

import math
import functools
import os
import sys
from collections.abc import Callable

import numpy as np

from . import _checks, _result_cache
from ._errors import InvalidArgumentError, OutputTooLargeError

_TO_LOGICAL = {"NCDHW": (0, 1, 2, 3, 4), "NDHWC": (0, 4, 1, 2, 3)}
_TO_PHYSICAL = {"NCDHW": (0, 1, 2, 3, 4), "NDHWC": (0, 2, 3, 4, 1)}
LAYOUTS = tuple(_TO_LOGICAL)


def check(layout) -> str:
    """``layout`` itself, if it names a layout."""
    if not isinstance(layout, str) or layout not in _TO_LOGICAL:
        raise InvalidArgumentError(f"layout: expected 'NCDHW' or 'NDHWC', got {layout!r}",
                                   argument="layout", kind="choice", value=layout)
    return layout


def logical(arr, layout: str):
    """View of a volume stored in ``layout`` with axes in (N, C, D, H, W) order (NumPy
    arrays and torch tensors alike)."""
    return arr.transpose(_TO_LOGICAL[layout]) if isinstance(arr, np.ndarray) else \
        arr.permute(_TO_LOGICAL[layout])


def physical(arr, layout: str):
    """Inverse of ``logical``: the (N, C, D, H, W) view back in ``layout`` order."""
    return arr.transpose(_TO_PHYSICAL[layout]) if isinstance(arr, np.ndarray) else \
        arr.permute(_TO_PHYSICAL[layout])


def physical_shape(logical_shape, layout: str) -> tuple[int, ...]:
    return tuple(logical_shape[i] for i in _TO_PHYSICAL[layout])


def logical_shape(physical_shape_, layout: str) -> tuple[int, ...]:
    return tuple(physical_shape_[i] for i in _TO_LOGICAL[layout])


# Where new results start: a cache line, so that a kernel's whole-vector rows are whole
# lines (NumPy's own allocations start 16 bytes in), which the C++ kernels may then write
# past the caches. Only results that large are streamed; smaller ones are NumPy's own
# (aligning cost a few microseconds a call, more than an 8^3 sampling's kernel).
ALIGNMENT = 64
_ALIGNED_FROM_BYTES = 1 << 20


def empty(logical_shape_, dtype, layout: str, zero: bool = False, *,
          name: str = "result") -> np.ndarray:
    """A new volume, contiguous in ``layout`` and starting on a cache line, returned as its
    logical view (``aligned_empty``; ``name`` is the result's, for its error)."""
    return logical(aligned_empty(physical_shape(logical_shape_, layout), dtype, zero,
                                 name=name), layout)


def result(call, out, name: str = "out", contiguous: bool = True
           ) -> tuple[np.ndarray, np.ndarray]:
    """Where a call writes its result (in the logical layout) and what it returns: a new
    array, or the caller's ``out``, checked against the result's physical shape and dtype
    (and C-contiguity, where the kernel asks for it) and returned as given."""
    if out is None:
        fresh = empty(call.output_shape, call.dtype, call.layout, name="output")
        return fresh, physical(fresh, call.layout)
    given = _checks.out_array(name, out, physical_shape(call.output_shape, call.layout),
                              call.dtype, contiguous)
    return logical(given, call.layout), given


@functools.cache
def memory_nbytes() -> int:
    """This machine's physical memory in bytes (the address space where the OS does not
    say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        return sys.maxsize


def aligned_empty(shape, dtype, zero: bool = False, *, name: str = "result") -> np.ndarray:
    """``np.empty`` (or ``np.zeros``) of a C-contiguous array, starting on a cache line
    from 1 MiB up, and from 32 MiB up in memory ``_result_cache`` keeps for reuse.

    A result larger than the machine's physical memory is refused before anything is
    allocated (the kernels write every byte, so it could only be written through swap, if
    at all), and so is one the allocator refuses: ``OutputTooLargeError`` names it, its
    shape and its bytes."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(map(int, shape)) * dtype.itemsize  # Python ints: no overflow
    memory = memory_nbytes()
    if nbytes > memory:
        raise _too_large(name, shape, dtype, nbytes, f"more than this machine's memory, "
                                                     f"{_size(memory)}")
    try:
        if nbytes < _ALIGNED_FROM_BYTES:
            return (np.zeros if zero else np.empty)(shape, dtype)
        raw = _result_cache.take(nbytes + ALIGNMENT)
        if raw is None:
            raw = (np.zeros if zero else np.empty)(nbytes + ALIGNMENT, np.uint8)
        elif zero:
            raw.fill(0)
    except MemoryError:
        raise _too_large(name, shape, dtype, nbytes, "more than can be allocated now") from None
    return aligned_part(raw, nbytes).view(dtype).reshape(shape)


def aligned_part(raw: np.ndarray, nbytes: int) -> np.ndarray:
    """The ``nbytes`` of the uint8 array ``raw`` (``ALIGNMENT`` bytes longer) that start on
    a cache line."""
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes]


def allocator(shape, dtype, *, name: str = "result") -> Callable[[], np.ndarray]:
    """``aligned_empty(shape, dtype, name=name)`` as a function of no arguments, for a
    prepared call to allocate its result with: below the aligned size, NumPy's own
    ``np.empty`` (``aligned_empty``'s checks cost more than a small call's kernel)."""
    dtype = np.dtype(dtype)
    if math.prod(map(int, shape)) * dtype.itemsize < _ALIGNED_FROM_BYTES:
        return functools.partial(np.empty, tuple(shape), dtype)
    return functools.partial(aligned_empty, tuple(shape), dtype, name=name)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.3g} MiB"


def _too_large(name, shape, dtype, nbytes: int, why: str) -> OutputTooLargeError:
    shape = tuple(int(n) for n in shape)
    return OutputTooLargeError(
        f"{name}: shape {shape} of {dtype.name} needs {nbytes:,} bytes ({_size(nbytes)}), "
        f"{why}", argument=name, value=shape, nbytes=nbytes)
