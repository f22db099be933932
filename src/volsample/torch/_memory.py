"""The torch door's memory: results allocated in the operands' memory format, advised
onto huge pages and, from 32 MiB up, in memory the op layer's ``_result_cache`` keeps for
reuse; and CPU tensors as NumPy arrays for the C++ backend, without copies.

A CPU tensor reaches the C++ kernels as a NumPy view of its own memory in logical (N, C,
D, H, W) order, whatever its strides (a bfloat16 tensor through its int16 bits viewed as
``ml_dtypes.bfloat16``); results are tensors allocated here, which the kernels write
through such views. The torch layer adds no copy in either direction.
"""
from __future__ import annotations

import ctypes
import functools
import math
import mmap
import sys

import ml_dtypes
import numpy as np
import torch

from .. import _layout, _result_cache
from .._torch_formats import memory_format
from ._numpy_dtypes import TO_NUMPY

# ---------------------------------------------------------------------------------------
# Results: allocated in the operand's memory format, on huge pages
# ---------------------------------------------------------------------------------------


def empty_volume(shape, like: torch.Tensor, dtype=None) -> torch.Tensor:
    """An uninitialised volume of logical ``shape`` on ``like``'s device, in its format."""
    shape, dtype = tuple(shape), dtype or like.dtype
    if _cacheable(like, shape, dtype):
        stride = torch.empty(shape, device="meta", memory_format=memory_format(like)).stride()
        cached = _cached_empty(shape, stride, dtype)
        if cached is not None:
            return cached
    return huge_pages(torch.empty(shape, dtype=dtype, device=like.device,
                                  memory_format=memory_format(like)))


def empty_contiguous(like: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``like``'s shape, dtype and device."""
    if _cacheable(like, like.shape, like.dtype):
        stride = torch.empty(like.shape, device="meta").stride()
        cached = _cached_empty(tuple(like.shape), stride, like.dtype)
        if cached is not None:
            return cached
    return huge_pages(torch.empty_like(like, memory_format=torch.contiguous_format))


def _cacheable(like: torch.Tensor, shape, dtype: torch.dtype) -> bool:
    """Whether a result for ``like`` is large enough for the result cache and real: a CPU
    kernel's plain tensor (a fake or meta implementation's results stay torch's)."""
    return (type(like) is torch.Tensor and like.device.type == "cpu"
            and math.prod(shape) * dtype.itemsize + _layout.ALIGNMENT >= _result_cache.MIN_BYTES)


def _cached_empty(shape: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor | None:
    """An uninitialised CPU tensor of ``shape`` and dense ``stride`` in a block of the
    result cache, whose reference the tensor's storage holds; None if the cache is off."""
    nbytes = (1 + sum((n - 1) * s for n, s in zip(shape, stride))) * dtype.itemsize \
        if all(shape) else 0
    raw = _result_cache.take(nbytes + _layout.ALIGNMENT)
    if raw is None:
        return None
    storage = torch.from_numpy(_layout.aligned_part(raw, nbytes)).untyped_storage()
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, stride)


def huge_pages(t: torch.Tensor) -> torch.Tensor:
    """``t``, a new result; on Linux, one of 4 MiB or more is advised onto transparent huge
    pages before its first touch, as NumPy advises its own arrays (and so the NumPy API's
    results): under the kernel's "madvise" setting, first touching a large result page by
    4 KiB page took several times as long as the sampling itself."""
    nbytes = t.numel() * t.element_size()
    if _madvise is None or nbytes < _HUGE_PAGE_BYTES or not t.is_cpu:
        return t
    start = t.data_ptr()
    first = -(-start // _PAGE) * _PAGE  # whole pages inside the tensor's memory
    length = (start + nbytes - first) // _PAGE * _PAGE
    if length > 0:
        _madvise(first, length, mmap.MADV_HUGEPAGE)  # a hint: its failure changes nothing
    return t


_HUGE_PAGE_BYTES = 4 << 20  # NumPy's threshold
_PAGE = mmap.PAGESIZE


def _libc_madvise():
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        madvise = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


_madvise = _libc_madvise()


# ---------------------------------------------------------------------------------------
# CPU tensors as NumPy arrays, without copies
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
            "strides": tuple(s * size for s in t.stride()), "data": (t.const_data_ptr(), True)}  # type: ignore[attr-defined]  # not in torch's stubs


_is_cow = torch._C._is_cow_tensor  # type: ignore[attr-defined]  # not in torch's stubs


def read_only_array(t: torch.Tensor) -> np.ndarray:
    """The elements of the CPU tensor ``t`` (an operand the op only reads) as a read-only
    NumPy array of its logical shape and strides: a view of its memory, never a copy, and a
    copy-on-write tensor stays unmaterialised. The raw elements: an op's operands come
    with negative views resolved by the dispatcher."""
    if not _is_cow(t):  # Tensor.numpy(): the cheapest view (no Python object of ours)
        arr = _numpy_view(t.detach())
        arr.flags.writeable = False
        return arr
    # Unsigned words of the element's size, then the element type (NumPy has no bfloat16).
    return np.asarray(_TensorMemory(t.detach())).view(TO_NUMPY[t.dtype])


def writable_array(t: torch.Tensor | None) -> np.ndarray | None:
    """A result tensor the op allocated (never a lazy copy) as a writable NumPy view of the
    same logical shape and strides; None stays None (a gradient not asked for)."""
    return None if t is None else _numpy_view(t)


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: reinterpret the bits
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# Calls a backend ran before, prepared: each op's kernel keeps (in the op layer's
# ``_prepared``), per key of a call's tensors (``tensor_key``; on CUDA their device too,
# ``_devices``), its other arguments and the backend's setting, the prepared kernel of its
# first run (``_kernels.PreparedGridSample`` or the like; the Triton backend's on CUDA)
# and its results' allocators. A repeated call then allocates its results and hands the
# kernel the tensors (on the CPU their addresses, ``const_data_ptr``: copy-on-write inputs
# stay lazy), with no description, NumPy view or check made again: a call with the same
# key passes the same checks.


def tensor_key(t: torch.Tensor):
    """What a prepared CPU call depends on of a tensor: its shape, strides and dtype (the
    op's CPU kernel sees CPU tensors only)."""
    return t.shape, t.stride(), t.dtype


def allocator(t: torch.Tensor):
    """A function of no arguments that allocates an uninitialised tensor of ``t``'s shape,
    strides, dtype and device (a CPU one advised onto huge pages where ``huge_pages``
    would, in the result cache where ``empty_volume`` would): a prepared call's result,
    allocated with nothing worked out again."""
    if not t.is_cpu:  # (a CPU one on the default device: no argument to parse each call)
        return functools.partial(torch.empty_strided, tuple(t.shape), t.stride(),
                                 dtype=t.dtype, device=t.device)
    new = functools.partial(torch.empty_strided, tuple(t.shape), t.stride(), dtype=t.dtype)
    if _cacheable(t, t.shape, t.dtype):
        cached = functools.partial(_cached_empty, tuple(t.shape), t.stride(), t.dtype)
        return lambda: _cached_or_new(cached(), new)
    if t.numel() * t.element_size() < _HUGE_PAGE_BYTES:
        return new
    return lambda: huge_pages(new())


def _cached_or_new(cached: torch.Tensor | None, new) -> torch.Tensor:
    return huge_pages(new()) if cached is None else cached
