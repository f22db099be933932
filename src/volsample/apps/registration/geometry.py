"""The registration's coordinates: the free-form deformation's control grid and its
dense displacement, and warp_3d's theta of a world affine (``Frame``).

Displacements are stored in grid_sample's channel order (x, y, z), i.e. along (W, H, D), in
voxels of the full-resolution fixed volume; affines map (i, j, k, 1) to world millimetres.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ...grid_sample import grid_sample_3d
from ...upsample import upsample_trilinear_3d

_SAMPLING: dict[str, Any] = dict(padding_mode="border", align_corners=True)  # of every image warp
INTERPOLATIONS = ("bilinear", "bicubic", "bspline")  # the modes the optimisation samples in


def identity_grid(shape: Sequence[int], dtype: npt.DTypeLike = np.float32) -> np.ndarray:
    """The identity sampling grid of a (D, H, W) volume, shape (1, D, H, W, 3).

    Channels are (x, y, z) in [-1, 1], the centres of the corner voxels at +-1
    (align_corners=True).
    """
    z, y, x = np.meshgrid(*(np.linspace(-1, 1, n, dtype=dtype) for n in shape), indexing="ij")
    return np.stack([x, y, z], axis=-1)[None]


def voxel_to_normalised(shape: Sequence[int], dtype: npt.DTypeLike = np.float32) -> np.ndarray:
    """Per-channel (x, y, z) factors turning voxel displacements of a (D, H, W) volume
    into normalised ones (align_corners=True): ``2 / (size - 1)``."""
    D, H, W = shape
    return np.array([2 / (W - 1), 2 / (H - 1), 2 / (D - 1)], dtype)


def dense_displacement(control: np.ndarray, shape: Sequence[int], *,
                       out: np.ndarray | None = None) -> np.ndarray:
    """The dense displacement of a control grid, shape (1, D, H, W, 3) (into ``out``, when
    given).

    ``control`` has shape (1, cd, ch, cw, 3) (channels last, as the grid): each channel is
    upsampled trilinearly with align_corners=True, so the control points sit on the corner
    voxels and spread evenly between them.
    """
    return upsample_trilinear_3d(control, size=tuple(shape), align_corners=True, layout="NDHWC",
                                 out=out)


def warp(volume: np.ndarray, displacement: np.ndarray, mode: str = "bilinear",
         scale: np.ndarray | None = None) -> np.ndarray:
    """Sample ``volume`` (D, H, W) at ``p + displacement(p)`` for every voxel p.

    ``displacement`` is (1, D, H, W, 3) in voxels, channels (x, y, z); ``scale`` turns it
    into normalised units (default ``voxel_to_normalised(volume.shape)``). Points outside
    the volume read its border. ``mode="nearest"`` suits label maps, integer ones too
    (uint8, int16, int32: their values are copied exactly, on a float32 grid). The grid is
    formed, ``identity_grid + displacement * scale``, as ``volsample.dask.warp`` forms it
    chunk by chunk (bit for bit); ``register`` warps with ``warp_3d`` instead.
    """
    coords = volume.dtype if volume.dtype.kind == "f" else np.dtype(np.float32)
    if scale is None:
        scale = voxel_to_normalised(volume.shape, coords)
    grid = identity_grid(displacement.shape[1:4], coords) + displacement * scale
    return grid_sample_3d(volume[None, None], grid, mode=mode, **_SAMPLING)[0, 0]


def control_shape(shape: Sequence[int], spacing: float) -> tuple[int, ...]:
    """Control-grid size covering a (D, H, W) volume with points ``spacing`` voxels apart
    (at least 2 per axis, so that the corners carry points)."""
    return tuple(max(2, math.ceil((n - 1) / spacing) + 1) for n in shape)


def refine(control: np.ndarray, size: Sequence[int]) -> np.ndarray:
    """A control grid resampled to ``size`` points per axis describing (nearly, exactly
    when each cell is split in two) the same dense displacement."""
    if tuple(size) == control.shape[1:4]:
        return control
    return upsample_trilinear_3d(control, size=tuple(size), align_corners=True, layout="NDHWC")


# ---------------------------------------------------------------------------------------
# Physical space: voxel-to-world affines and warp_3d's theta
# ---------------------------------------------------------------------------------------


def grid_to_voxel(shape: Sequence[int]) -> np.ndarray:
    """The 4x4 map from warp coordinates (x, y, z, 1), normalised with align_corners=True,
    to voxel indices (i, j, k, 1) of a (D, H, W) volume: x spans W (k), y H (j), z D (i)."""
    D, H, W = shape
    m = np.zeros((4, 4))
    for row, column, size in ((0, 2, D), (1, 1, H), (2, 0, W)):
        m[row, column] = m[row, 3] = (size - 1) / 2
    m[3, 3] = 1
    return m


def _homogeneous(matrix) -> np.ndarray:
    """A 3x4 matrix with the row (0, 0, 0, 1) below it."""
    return np.vstack([matrix, [0.0, 0.0, 0.0, 1.0]])


@dataclasses.dataclass(frozen=True)
class Frame:
    """How warp_3d's theta follows a world affine T of two images.

    T maps a fixed world point x to the moving world point T x. It is held as the 3x4
    ``params`` S of the same map about the fixed field of view's centre c,
    ``T = C S C^-1`` (C: translation by c), so that its linear part and translation (mm)
    are about independent. Then ``theta = (P S Q)[:3]`` with ``P = moving grid <- moving
    voxels <- world, times C`` and ``Q = C^-1, times world <- fixed voxels <- fixed grid``,
    and dLoss/dS = P^T G Q^T, G being grad_theta with a row of zeros below it.
    """

    left: np.ndarray    # P, 4x4
    right: np.ndarray   # Q, 4x4
    centre: np.ndarray  # C, 4x4

    @classmethod
    def of(cls, fixed_shape, fixed_affine, moving_shape, moving_affine) -> Frame:
        centre = np.eye(4)
        centre[:3, 3] = (fixed_affine @ np.append((np.array(fixed_shape) - 1) / 2, 1))[:3]
        left = np.linalg.inv(grid_to_voxel(moving_shape)) @ np.linalg.inv(moving_affine) @ centre
        right = np.linalg.inv(centre) @ fixed_affine @ grid_to_voxel(fixed_shape)
        return cls(left, right, centre)

    def theta(self, params: np.ndarray, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """warp_3d's theta (1, 3, 4) of the parameters S, in ``dtype`` (the volumes')."""
        return (self.left @ _homogeneous(params) @ self.right)[None, :3].astype(dtype)

    def gradient(self, grad_theta: np.ndarray) -> np.ndarray:
        """dLoss/dS (3x4) of dLoss/dtheta (1, 3, 4)."""
        return (self.left.T @ np.vstack([grad_theta[0], np.zeros(4)]) @ self.right.T)[:3]

    def transform(self, params: np.ndarray) -> np.ndarray:
        """T (4x4), world to world."""
        return self.centre @ _homogeneous(params) @ np.linalg.inv(self.centre)

    def params(self, transform: np.ndarray) -> np.ndarray:
        """The parameters S (3x4) of the world affine T (4x4): ``transform``'s inverse."""
        return (np.linalg.inv(self.centre) @ transform @ self.centre)[:3]


IDENTITY_PARAMS = np.eye(3, 4)  # T = I: the headers' alignment
