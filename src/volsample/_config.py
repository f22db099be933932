"""Process-wide settings: CPU thread count and the deterministic flag.

Every kernel call takes its thread count as an argument (an OpenMP team of that size), so
a call from any Python thread honours ``set_num_threads``, and calls from several Python
threads at once each run a team of their own.
"""
from __future__ import annotations

from . import _cpu

_MAX_THREADS = _cpu.max_threads()
_num_threads = _MAX_THREADS
_deterministic = True


def set_num_threads(n: int) -> None:
    """Set how many CPU threads volsample kernels use, from 1 to the machine's count."""
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


# Below this many elementary items per thread (a sample point in one channel, say),
# waking another thread costs more than it saves.
MIN_WORK_PER_THREAD = 1 << 15


def threads_for(work: int) -> int:
    """How many threads a launch of ``work`` items uses: all of them, unless it is small."""
    return max(1, min(_num_threads, work // MIN_WORK_PER_THREAD))
