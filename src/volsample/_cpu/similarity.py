"""The C++ similarity kernels of registration: box sums and local NCC
(``src/cpp/local_ncc.cpp``), mutual information (``src/cpp/mutual_information.cpp``).

Operands are C-contiguous float32 or float64 (D, H, W) volumes; results are written into
the caller's arrays, which registration keeps from step to step.
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


def mutual_information(fixed_bins: np.ndarray, warped: np.ndarray, grad: np.ndarray | None,
                       bins: int, low: float, high: float, grad_scale: float) -> float:
    """Mattes mutual information (nats) of ``warped`` with the fixed volume given by its
    voxels' bins (uint8; ``bins`` or above leaves a voxel out), the warped intensities'
    cubic B-spline Parzen windows over ``bins`` bins spanning [``low``, ``high``]; with
    ``grad``, also writes there ``grad_scale`` times its gradient."""
    return _kernels.mutual_information(fixed_bins, warped, grad, bins, low, high, grad_scale,
                                       threads_for(warped.size))
