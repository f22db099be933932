"""The memory-format rule for torch volumes, shared by the torch front door and the Triton
launchers (so that compile-time fake results match what every device returns). Needs torch,
not triton."""
from __future__ import annotations

import torch


def is_channels_last(t: torch.Tensor) -> bool:
    """Whether the 5-D volume ``t`` is channels-last: its channel stride is the smallest of
    the strides of its non-trivial dimensions (as ``torch.channels_last_3d`` lays it out)."""
    if t.dim() != 5 or t.shape[1] <= 1:  # not a volume (yet to be refused), or one channel
        return False
    spatial = [t.stride(i) for i in (2, 3, 4) if t.shape[i] > 1]
    return not spatial or t.stride(1) < min(spatial)


def memory_format(t: torch.Tensor) -> torch.memory_format:
    """The memory format of volumes computed from the volume ``t``."""
    return torch.channels_last_3d if is_channels_last(t) else torch.contiguous_format
