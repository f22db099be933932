"""The progress bar of the long-running commands (bench, register, demo): tqdm on stderr."""
from __future__ import annotations

import sys

from tqdm import tqdm


class ProgressBar:
    """``step(label)`` after each unit of work, ``close()`` at the end.

    Drawn only when ``enabled`` (the commands pass ``enabled`` only when stderr is a
    terminal, so logs and pipes stay clean) and there is work to count.
    """

    def __init__(self, total: int, enabled: bool = True):
        self._bar = tqdm(total=total, disable=not (enabled and total > 0), file=sys.stderr,
                         dynamic_ncols=True, mininterval=0.1)

    def step(self, label: str = "") -> None:
        self._bar.set_postfix_str(label, refresh=False)
        self._bar.update()

    def close(self) -> None:
        self._bar.close()
