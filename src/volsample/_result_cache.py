"""Memory for large results, kept for the next call that needs the same size.

The C library maps a block of 32 MiB or more anew for every allocation and returns it to
the operating system when it is freed; the operating system then zeroes every new page on
first touch, and the kernels write over those zeros. At 256^3 that zeroing took a third of
the grid sampler's backward. Smaller blocks stay in the C library's heap and are reused
without it. So every result (and scratch array) of 32 MiB or more is taken from here: a
block no array or tensor uses any more is handed out again; a new one is kept for later.

A block is in use while anything refers to it: every NumPy view of it has it as its base,
and a tensor made from it holds such a view. Blocks nothing uses stay cached up to a limit
(``set_result_cache``; a training loop's steps ask for the same sizes again), the least
recently handed out dropped first. Where reference counts cannot tell (a free-threaded
Python), nothing is cached.
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np

MIN_BYTES = 32 << 20  # below this the C library's heap keeps freed memory itself


def _default_limit() -> int:
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        memory = 8 << 30
    return min(memory // 8, 4 << 30)


_lock = threading.Lock()
_blocks: list[np.ndarray] = []  # least recently handed out first
_limit = _default_limit()


def _references(blocks: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(blocks[i])


# What _references counts for a block that only the cache holds (measured, not assumed:
# how many references a call's own argument passing adds differs between Pythons).
_UNUSED = _references([np.empty(0, np.uint8)], 0)
_COUNTS_REFERENCES = getattr(sys, "_is_gil_enabled", lambda: True)()


def take(nbytes: int) -> np.ndarray | None:
    """A C-contiguous uint8 array of ``nbytes``, uninitialised: a cached block nothing
    uses any more, or a new one that the cache keeps; None for a size the cache does not
    serve (under ``MIN_BYTES``, or caching off). A new block the allocator refuses raises
    ``MemoryError`` once the unused blocks are dropped and it is refused again."""
    if nbytes < MIN_BYTES or _limit == 0 or not _COUNTS_REFERENCES:
        return None
    with _lock:
        for i in range(len(_blocks)):
            if _blocks[i].nbytes == nbytes and _references(_blocks, i) == _UNUSED:
                block = _blocks.pop(i)
                _blocks.append(block)
                return block
        try:
            block = np.empty(nbytes, np.uint8)
        except MemoryError:
            _drop_unused(0)
            block = np.empty(nbytes, np.uint8)
        _blocks.append(block)
        _drop_unused(_limit)
        return block


def _drop_unused(keep_nbytes: int) -> None:
    """Forget the least recently handed out unused blocks until those left hold at most
    ``keep_nbytes`` (the caller holds the lock)."""
    unused = [i for i in range(len(_blocks)) if _references(_blocks, i) == _UNUSED]
    held = sum(_blocks[i].nbytes for i in unused)
    dropped = set()
    for i in unused:
        if held <= keep_nbytes:
            break
        held -= _blocks[i].nbytes
        dropped.add(i)
    _blocks[:] = [b for i, b in enumerate(_blocks) if i not in dropped]


def set_result_cache(max_bytes: int) -> None:
    """Keep at most ``max_bytes`` of result memory that no array or tensor uses any more,
    for later calls of the same sizes (0 turns caching off and frees what is kept). Only
    results of 32 MiB or more are cached; the default is an eighth of the machine's
    memory, at most 4 GiB."""
    global _limit
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"set_result_cache: max_bytes must be an int, got "
                        f"{type(max_bytes).__name__} {max_bytes!r}")
    if max_bytes < 0:
        raise ValueError(f"set_result_cache: max_bytes must be >= 0, got {max_bytes}")
    with _lock:
        _limit = max_bytes
        _drop_unused(max_bytes)


def get_result_cache() -> tuple[int, int]:
    """The cache's limit and the bytes of unused result memory it keeps now."""
    with _lock:
        return _limit, sum(_blocks[i].nbytes for i in range(len(_blocks))
                           if _references(_blocks, i) == _UNUSED)
