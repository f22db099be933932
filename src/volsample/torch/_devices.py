"""The torch door's backend per device: which backend runs a device's tensors (the C++ core
CPU tensors, the Triton kernels CUDA ones), how it takes them, and what its prepared calls
depend on. Both keep one contract (``volsample._backends``), prepared calls included, so
an op's CPU and CUDA kernels prepare their calls through the same code, handed the
device's ``Device``: one key, one lookup in ``_prepared``, and on a miss the checks and the
backend's ``prepare_forward`` / ``prepare_backward``."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .. import _backends, _config
from . import _memory


class Device(NamedTuple):
    """A device's backend as the torch ops use it."""
    backend: Callable[[str], Any]  # an operator family's launchers (``_backends``)
    key: Callable[[torch.Tensor], tuple]  # what a prepared call depends on of a tensor
    read: Callable[[Any], Any]  # an operand (None stays None) as the backend takes it
    write: Callable[[Any], Any]  # a result the op allocated (None stays None), likewise
    setting: Callable[[], Any]  # the backend's setting (part of each prepared call's key)
    options: Callable[[Any], dict]  # that setting as a backward's keyword arguments


def _read_only(t: torch.Tensor | None):
    return None if t is None else _memory.read_only_array(t)


def _cuda_key(t: torch.Tensor) -> tuple:
    """A CUDA tensor's shape, strides, dtype and device: a prepared call holds tables on
    its device (and a key of four parts never meets a CPU key's three)."""
    return t.shape, t.stride(), t.dtype, t.device


def _same(t):
    return t


# The C++ core (its launchers found once: the general path asks on every call): NumPy views
# of the tensors' memory; its thread count (the kernels take the count ``threads_for``
# gives a call's work, within it).
CPU = Device(functools.cache(_backends.cpu), _memory.tensor_key, _read_only,
             _memory.writable_array, _config.get_num_threads, lambda threads: {})
# The Triton kernels (imported on first use): the tensors themselves; the backward's
# ``deterministic``.
CUDA = Device(_backends.gpu, _cuda_key, _same, _same, _config.get_deterministic,
              lambda deterministic: {"deterministic": deterministic})
