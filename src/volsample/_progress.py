"""A one-line progress bar on stderr, shared by the long-running commands."""
from __future__ import annotations

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
