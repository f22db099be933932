"""Process-wide settings: CPU thread count and the deterministic flag.

The thread count belongs to the C++ backend, whose launchers read it, and is reached
through the backends' seam (``_backends``); this module is where the rest of the package
asks for both settings.
"""
from __future__ import annotations

from ._backends import get_num_threads as get_num_threads
from ._backends import set_num_threads as set_num_threads

_deterministic = True


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
