"""The compiled C++ CPU core, one launcher module per operator family (``grid_sample``,
``upsample``), over the nanobind extension ``_kernels``, and the thread count its launches
take (``set_num_threads``, ``threads_for``).

The kernels are built for several instruction sets (scalar C++, AVX2, AVX-512 on x86-64)
and the best one this CPU runs is chosen when the module loads; the environment variable
``VOLSAMPLE_CPU_ISA=scalar|avx2|avx512`` or ``set_isa`` picks one instead. Every ISA
computes the same bits.
"""
from __future__ import annotations

import os

import numpy as np

from .. import _dtypes

# OpenMP threads waiting for work sleep at once instead of spinning (GCC's libgomp spins
# up to 300,000 rounds first): a spinning thread takes a core that another process, or
# the thread it waits for, needs (measured: a backward at 2 threads beside a busy core,
# and torch and volsample calls taking turns, ran many times slower). libgomp reads the
# policy once, when it loads with the kernels; a policy the user set (OMP_WAIT_POLICY or
# GOMP_SPINCOUNT) is kept, and the variable is removed again after the load, so child
# processes see the user's environment.
WAIT_POLICY = "passive"
_chosen = "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ
if not _chosen:
    os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
try:
    from . import _kernels
finally:
    if not _chosen:
        del os.environ["OMP_WAIT_POLICY"]

isa = _kernels.isa
set_isa = _kernels.set_isa
supported_isas = _kernels.supported_isas
max_threads = _kernels.max_threads
team_cpus = _kernels.team_cpus  # where a region's threads run (team.h): tests, busy_core.py
# The C++ core's integer codes of the modes and paddings, as its kernels take them.
MODES = _kernels.MODES
PADDINGS = _kernels.PADDINGS

# The thread count (volsample.set_num_threads). Every kernel call takes its count as an
# argument (an OpenMP team of that size), so a call from any Python thread honours
# set_num_threads, and calls from several Python threads at once each run a team of their
# own.
_MAX_THREADS = max_threads()
_num_threads = _MAX_THREADS


def set_num_threads(n: int) -> None:
    """Set how many CPU threads volsample kernels use, from 1 to the machine's count."""
    global _num_threads
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__} {n!r}")
    if not 1 <= n <= _MAX_THREADS:
        raise ValueError(f"set_num_threads: n must be in [1, {_MAX_THREADS}], got {n}")
    _num_threads = n
    _share_threads()


def _share_threads() -> None:
    """Hand the thread count to the XLA FFI handlers (volsample.jax), which run inside
    compiled JAX programs with no Python to ask (a module built without them has none)."""
    if hasattr(_kernels, "set_ffi_threads"):
        _kernels.set_ffi_threads(_num_threads, MIN_WORK_PER_THREAD)


def get_num_threads() -> int:
    """The number of CPU threads volsample kernels use."""
    return _num_threads


# Below this many elementary items per thread (a sample point in one channel, say),
# waking another thread costs more than it saves.
MIN_WORK_PER_THREAD = 1 << 15


def threads_for(work: int) -> int:
    """How many threads a launch of ``work`` items uses: all of them, unless it is small."""
    return max(1, min(_num_threads, work // MIN_WORK_PER_THREAD))


_share_threads()


def operand(arr: np.ndarray | None) -> np.ndarray | None:
    """``arr`` as the kernels take it: bfloat16 as its uint16 bits (NumPy's buffer
    protocol has no bfloat16), and strides that are whole elements (else a copy)."""
    if arr is None:
        return None
    # (an aligned array of these dtypes, whose alignment is their size, has whole strides)
    if not arr.flags.aligned and any(s % arr.itemsize for s in arr.strides):
        arr = np.ascontiguousarray(arr)
    return arr.view(np.uint16) if _dtypes.is_bfloat16(arr.dtype) else arr


def preparable(*arrays: np.ndarray | None) -> bool:
    """Whether a prepared kernel may run on the memory of arrays like these as they are
    (``forward_on``, ``backward_on``): no bfloat16 (NumPy hands its bits over as uint16
    views) and strides of whole elements (else ``operand`` copies); None: an absent operand."""
    return not any(a is not None and (_dtypes.is_bfloat16(a.dtype)
                                      or any(s % a.itemsize for s in a.strides))
                   for a in arrays)
