"""What ``register`` returns: the transform, the displacement, the warped volume, and
how to warp other volumes the same way."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ... import _dtypes
from ..._checks import InvalidArgumentError
from ...upsample import upsample_trilinear_3d
from ...warp import warp_3d
from .geometry import _SAMPLING, dense_displacement
from .objectives import _moving_linear, interpolant
from .velocity import dense_inverse


@dataclasses.dataclass
class RegistrationResult:
    """What ``register`` found: the fixed world point x maps to the moving world point
    ``T(x + d(x))``.

    Attributes
    ----------
    transform : ndarray, shape (4, 4), float64
        T, world millimetres to world millimetres (fixed to moving).
    displacement : ndarray, shape (D, H, W, 3), float32
        d on the fixed grid, in millimetres along the fixed image's world axes (in Fortran
        order, as NIfTI stores it).
    warped : ndarray, shape (D, H, W), float32
        The (normalised) moving volume on the fixed grid, sampled in ``register``'s
        ``interp``.
    control : ndarray, shape (1, cd, ch, cw, 3)
        The finest control grid, in fixed voxels, channels (x, y, z).
    history : list of (stage, level, objective, similarity)
        One entry per iteration; stage "affine" or "deformable".
    fixed_affine, moving_affine : ndarray, shape (4, 4)
        The images' voxel-to-world affines.
    moving_shape : (int, int, int)
    theta : ndarray, shape (1, 3, 4), float32
        warp_3d's theta of T (align_corners=True).
    fixed_shape : (int, int, int)
    similarity : (float, float)
        The similarity (``register``'s loss, of the full-resolution volumes) before (the
        headers' alignment) and after.
    moved : ndarray, shape (1, D, H, W, 3), float32, or None
        warp_3d's displacement of d (normalised units of the moving grid), which ``warp``
        samples at (None: made from ``control`` by each call; set it to None to release
        its memory).
    velocity : ndarray, shape (1, cd, ch, cw, 3), or None
        The diffeomorphic model's stationary velocity on the control grid (fixed voxels,
        channels (x, y, z)), whose exponential is ``control`` (None: the free-form model).
    inverse_control : ndarray, shape (1, cd, ch, cw, 3), or None
        exp(-velocity): the control grid of the inverse map's displacement (None: the
        free-form model, which has none).
    """

    transform: np.ndarray
    displacement: np.ndarray
    warped: np.ndarray
    control: np.ndarray
    history: list
    fixed_affine: np.ndarray
    moving_affine: np.ndarray
    moving_shape: tuple
    theta: np.ndarray
    fixed_shape: tuple
    similarity: tuple
    moved: np.ndarray | None
    velocity: np.ndarray | None = None
    inverse_control: np.ndarray | None = None

    @property
    def inverse_displacement(self) -> np.ndarray | None:
        """The inverse map's d', (D, H, W, 3) float32 in millimetres along the fixed image's
        world axes on the fixed grid: the moving world point y maps back to the fixed point
        z + d'(z), z = T^-1 y (``velocity.dense_inverse``). None for the free-form model.
        Made when asked for."""
        if self.inverse_control is None:
            return None
        inverse = dense_inverse(self.control, self.inverse_control, self.fixed_shape)[0]
        # channels (x, y, z) are voxel axes (k, j, i): the rows of L^T reversed take them to mm
        return np.matmul(inverse, self.fixed_affine[:3, :3].T[::-1].astype(np.float32))

    @property
    def fixed_displacement(self) -> np.ndarray:
        """d in fixed voxels, channels (x, y, z), shape (1, D, H, W, 3), float32: the control
        grid upsampled (made when asked for)."""
        return dense_displacement(self.control, self.fixed_shape)

    def warp(self, volume: np.ndarray, mode: str = "bilinear") -> np.ndarray:
        """Another volume on the moving grid, warped onto the fixed grid (e.g. labels with
        "nearest": an integer label map keeps its dtype and values; anything else is
        warped as float32; "bspline" interpolates it through its spline coefficients)."""
        volume = np.asarray(volume)
        if volume.shape != tuple(self.moving_shape):
            raise InvalidArgumentError(f"volume: expected the moving volume's shape "
                                       f"{tuple(self.moving_shape)}, got {volume.shape}")
        if not (mode == "nearest" and volume.dtype in _dtypes.LABELS):
            volume = volume.astype(np.float32, copy=False)
        shape = self.fixed_shape
        moved = self.moved if self.moved is not None else dense_displacement(
            self.control @ _moving_linear(self.theta, shape, self.control.dtype).T, shape)
        return warp_3d(interpolant(volume, mode)[None, None], self.theta, moved, shape, mode,
                       **_SAMPLING)[0, 0]

    def voxel_map(self) -> np.ndarray:
        """Where each fixed voxel lands in the moving volume: (D, H, W, 3) moving voxel
        indices (i, j, k), float64. With one grid for both, minus the voxel's own index,
        it is the displacement in voxels along the array axes."""
        shape = self.fixed_shape
        points = np.stack(np.meshgrid(*(np.arange(n) for n in shape), indexing="ij"), -1)
        points = points + self.fixed_displacement[0, ..., ::-1]
        to_moving = np.linalg.inv(self.moving_affine) @ self.transform @ self.fixed_affine
        return points @ to_moving[:3, :3].T + to_moving[:3, 3]


def _millimetres(control: np.ndarray, fixed_affine: np.ndarray, shape: Sequence[int]
                 ) -> np.ndarray:
    """d in mm along the fixed image's world axes, (D, H, W, 3) in Fortran order, of the
    control grid (fixed voxels, channels (x, y, z)).

    The voxels' (i, j, k) map to world axes on the control points (linear); upsampled with
    the axes reversed, (1, 3, W, H, D), so that its transpose (D, H, W, 3) is laid out as
    NIfTI stores it (Fortran order): written with no transposing copy."""
    control_mm = control[0, ..., ::-1] @ fixed_affine[:3, :3].T.astype(np.float32)
    return upsample_trilinear_3d(control_mm.T[None], size=tuple(shape[::-1]),
                                 align_corners=True)[0].T
