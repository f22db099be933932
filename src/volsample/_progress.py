"""A one-line progress bar on stderr, shared by the long-running commands."""
from __future__ import annotations

import os
import sys
import time


class ProgressBar:
    """``step(label)`` after each unit of work; redrawn at most ten times a second."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.enabled = total, enabled and total > 0
        self.done, self._last_draw = 0, 0.0

    def step(self, label: str = "") -> None:
        self.done += 1
        now = time.monotonic()
        if self.enabled and (now - self._last_draw > 0.1 or self.done == self.total):
            self._last_draw = now
            filled = 30 * self.done // self.total
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} "
                             f"{label[:60]:<60}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            sys.stderr.write("\n")


FIRST_RUN_NOTICE = ("volsample: preparing the CPU kernels (first run only: compiled once, "
                    "then cached on disk; a few minutes)")


def kernels_prepared() -> bool:
    """False when the CPU kernels have never been compiled on this machine: Numba compiles
    them on first use, for minutes, and caches them on disk; the grid backward's cache
    index stands for all of them. True for kernels that need no preparation."""
    try:
        from ._coords import BILINEAR, BORDER
        from ._numba.grid_sample import kernels
        index = kernels(BILINEAR, BORDER).backward._cache._cache_file._index_path
    except (ImportError, AttributeError):  # not Numba kernels: nothing slow on first use
        return True
    return os.path.exists(index)


def first_run_notice() -> None:
    """One line on stderr before work that is slow only the first time, if it is ahead."""
    if not kernels_prepared():
        print(FIRST_RUN_NOTICE, file=sys.stderr, flush=True)
