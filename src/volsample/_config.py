"""Process-wide settings: CPU thread count and the deterministic flag.

Numba's thread count is a per-thread setting, so every kernel launch re-applies ours
(``parallel_launch``); that way a call from any Python thread honours
``set_num_threads``.
"""
from __future__ import annotations

import contextlib
import os
import threading

import numba

# OpenMP and TBB let several Python threads launch parallel kernels at once; the
# fallback 'workqueue' layer aborts the process on concurrent launches, so there we
# serialise launches with a lock (see parallel_launch).
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]

_MAX_THREADS = numba.config.NUMBA_NUM_THREADS
_num_threads = _MAX_THREADS
_deterministic = True
_workqueue_lock = threading.Lock()


def set_num_threads(n: int) -> None:
    """Set how many CPU threads volsample kernels use (1 .. the machine's count)."""
    global _num_threads
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__} {n!r}")
    if not 1 <= n <= _MAX_THREADS:
        raise ValueError(f"set_num_threads: n must be in [1, {_MAX_THREADS}], got {n}")
    _num_threads = n


def get_num_threads() -> int:
    """The number of CPU threads volsample kernels use."""
    return _num_threads


def set_deterministic(flag: bool) -> None:
    """Choose bitwise-reproducible GPU reductions (True, the default) or atomics (False).

    The CPU path is always deterministic; this flag only changes GPU backward kernels.
    """
    global _deterministic
    if not isinstance(flag, (bool, int)):
        raise TypeError(f"set_deterministic: flag must be a bool, got {type(flag).__name__} {flag!r}")
    _deterministic = bool(flag)


def get_deterministic() -> bool:
    """Whether GPU backward kernels must be bitwise reproducible."""
    return _deterministic


def _layer_is_threadsafe() -> bool:
    try:
        return numba.threading_layer() != "workqueue"
    except ValueError:  # no parallel kernel has run yet, so the layer is not chosen
        return False


# Below this many elementary items per thread (a sample point in one channel, say),
# waking another thread costs more than it saves.
MIN_WORK_PER_THREAD = 1 << 15


def threads_for(work: int) -> int:
    """How many threads a launch of ``work`` items uses: all of them, unless it is small."""
    return max(1, min(_num_threads, work // MIN_WORK_PER_THREAD))


@contextlib.contextmanager
def parallel_launch(threads: int | None = None):
    """Context for one parallel kernel launch: applies the thread count (``threads``, or
    the configured count), and serialises launches where the threading layer needs it."""
    numba.set_num_threads(threads or _num_threads)
    if _layer_is_threadsafe():
        yield
    else:
        with _workqueue_lock:
            yield
