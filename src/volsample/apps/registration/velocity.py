"""The diffeomorphic model: the control grid holds a stationary velocity v, and the
displacement is its exponential exp(v), integrated on the control grid by scaling and
squaring (``u = v / 2**K``, then K times ``u = u + u(x + u(x))``, the field read
trilinearly, its border extended); the inverse map's displacement is exp(-v).

Fields here are control grids as the deformable stage holds them: (1, cd, ch, cw, 3),
channels (x, y, z) in voxels of the full-resolution fixed volume; the integration runs in
control-grid voxels (each channel over its axis's control spacing), where warp_3d samples.
K is chosen per call so that each squaring starts from a field under ``MAX_STEP`` control
voxels: the composition is then a small, smooth deformation of the grid, so exp(v) folds
nowhere on it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...warp import warp_3d, warp_3d_backward
from .geometry import dense_displacement

MODELS = ("diffeomorphic", "free-form")  # the deformable stage's models (``register``'s model)
DEFAULT_MODEL = "diffeomorphic"
INVERSE_ITERATIONS = 3  # fixed-point steps of the dense inverse (``dense_inverse``)
MAX_STEP = 0.25  # control voxels: the largest displacement a squaring starts from
_FIELD_SAMPLING: dict[str, Any] = dict(mode="bilinear", padding_mode="border", align_corners=True,
                       layout="NDHWC", displacement_units="voxels")


def control_spacing(full_shape: Sequence[int], control_shape: Sequence[int]) -> np.ndarray:
    """The control points' spacing in fixed voxels per channel (x, y, z), i.e. along
    (W, H, D), of a control grid of (cd, ch, cw) points over a volume of ``full_shape``."""
    return np.array([(n - 1) / (c - 1) for n, c in zip(full_shape[::-1], control_shape[::-1])])


def squarings(v: np.ndarray, spacing: np.ndarray) -> int:
    """K: the squarings that bring v (fixed voxels) under ``MAX_STEP`` control voxels."""
    largest = float(np.max(np.abs(v) / spacing.astype(v.dtype))) if v.size else 0.0
    return max(0, math.ceil(math.log2(largest / MAX_STEP))) if largest > MAX_STEP else 0


class Exponential:
    """exp(v) of a control-grid velocity, and the gradient back through it.

    ``forward(v)`` keeps the K + 1 fields of the squarings (each the control grid's size:
    small) for ``backward``, which takes d loss / d exp(v) to d loss / d v."""

    def __init__(self, full_shape: Sequence[int]) -> None:
        self.full_shape = tuple(full_shape)
        self.fields: list[np.ndarray] = []
        self.scale = np.ones(3)

    def forward(self, v: np.ndarray) -> np.ndarray:
        """exp(v), v's shape and dtype."""
        spacing = control_spacing(self.full_shape, v.shape[1:4])
        steps = squarings(v, spacing)
        self.scale = (1 / spacing).astype(v.dtype)
        u = v * (self.scale * v.dtype.type(0.5 ** steps))
        self.fields = [u]
        for _ in range(steps):
            u = u + warp_3d(u, displacement=u, **_FIELD_SAMPLING)
            self.fields.append(u)
        self.steps = steps
        return u / self.scale

    def backward(self, grad: np.ndarray) -> np.ndarray:
        """d loss / d v of d loss / d exp(v) (the last ``forward``'s)."""
        grad = grad / self.scale  # to the control-grid units the squarings ran in
        for u in reversed(self.fields[:-1]):
            grad_field, _, grad_displacement = warp_3d_backward(
                grad, u, None, u, output_mask=(True, False, True), **_FIELD_SAMPLING)
            assert grad_field is not None and grad_displacement is not None
            grad = grad + grad_field + grad_displacement
        return grad * (self.scale * grad.dtype.type(0.5 ** self.steps))


def exponential(v: np.ndarray, full_shape: Sequence[int]) -> np.ndarray:
    """exp(v) of a control-grid velocity (fixed voxels) over a volume of ``full_shape``."""
    return Exponential(full_shape).forward(v)


def dense_inverse(control: np.ndarray, inverse_control: np.ndarray,
                  shape: Sequence[int]) -> np.ndarray:
    """The inverse map's dense displacement w, (1, D, H, W, 3) in fixed voxels: ``x + d(x) =
    z`` goes back to ``z + w(z) = x``.

    exp(-v) upsampled (``inverse_control``) starts it; between the control points the two
    upsampled maps are inverse only to about 0.15 voxel, so ``INVERSE_ITERATIONS``
    fixed-point steps ``w <- -d(x + w(x))`` on the dense grid (d: ``control`` upsampled)
    bring that to about 0.03."""
    forward = dense_displacement(control, shape)
    inverse = dense_displacement(inverse_control, shape)
    scratch = np.empty_like(inverse)
    for _ in range(INVERSE_ITERATIONS):
        warp_3d(forward, displacement=inverse, **_FIELD_SAMPLING, out=scratch)
        np.negative(scratch, out=inverse)
    return inverse
