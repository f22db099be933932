"""The C++ box sums and local NCC of registration (``src/cpp/local_ncc.cpp``).

Operands are C-contiguous float32 (D, H, W) volumes; results are written into the
caller's arrays, which registration keeps from step to step.
"""
from __future__ import annotations

import numpy as np

from . import _kernels, threads_for


def box_sum(volume: np.ndarray, out: np.ndarray, radius: int) -> None:
    """``out`` = the sum over the (2 radius + 1)^3 window of every voxel of ``volume``, the
    windows cut at the border."""
    _kernels.box_sum(volume, out, radius, threads_for(volume.size))


def local_ncc(fixed: np.ndarray, fixed_sum: np.ndarray, fixed_var: np.ndarray,
              warped: np.ndarray, work: np.ndarray, grad: np.ndarray | None, radius: int,
              eps: float, grad_scale: float) -> float:
    """The mean local squared correlation of ``warped`` with ``fixed`` (the box sum of
    ``fixed`` and its windows' variance given); with ``grad``, also writes there
    ``grad_scale`` times the gradient of the sum of the correlations. ``work`` holds
    (3, D, H, W)."""
    return _kernels.local_ncc(fixed, fixed_sum, fixed_var, warped, work, grad, radius, eps,
                              grad_scale, threads_for(fixed.size))


def varying(volume: np.ndarray, rows: np.ndarray, columns: np.ndarray) -> None:
    """``rows`` (D, H) and ``columns`` (D, W), uint8: whether some voxel of each row and
    column of ``volume`` differs from a neighbour along some axis."""
    _kernels.varying(volume, rows, columns, threads_for(volume.size))
