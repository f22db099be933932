"""The registration's resolution pyramid: each level halves the one before (corner voxel
centres kept: align_corners=True, so theta and the normalised coordinates hold at every
level), and the affine stage's steps per level."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ...upsample import upsample_trilinear_3d
from .losses import blur
from .objectives import interpolant

_MIN_LEVEL_SIZE = 8  # coarse pyramid levels keep at least this many voxels per axis


def _voxel_mm(affine, shape, level_shape) -> float:
    """The voxel size (mm, the geometric mean of the three axes') of a volume of ``shape``
    and voxel-to-world ``affine`` resampled to ``level_shape`` over the same field of view."""
    spacing = np.linalg.norm(affine[:3, :3], axis=0) * (np.array(shape) - 1) \
        / np.maximum(np.array(level_shape) - 1, 1)
    return float(np.prod(spacing) ** (1 / 3))


def _half_shape(shape):
    return tuple(max(min(n, _MIN_LEVEL_SIZE), round((n - 1) / 2) + 1) for n in shape)


def _halve(volume):
    """The volume blurred (3^3 box, twice) and resampled to about half its size per axis
    (the same normalised coordinates: align_corners=True): the next pyramid level, made
    from the one before, so that only the first halving reads the full resolution."""
    smooth = blur(volume, 1)
    return upsample_trilinear_3d(smooth[None, None], size=_half_shape(volume.shape),
                                 align_corners=True)[0, 0]


AFFINE_LEVEL_VOXELS = 32 ** 3  # see default_affine_iterations


def default_iterations(levels: int, loss: str) -> list[int]:
    """``volsample register``'s deformable steps per level (coarsest first): 100, halved
    per finer level (at least 10); for "mi", 10 at the finest of several levels.

    The mutual information's finest level costs the most and moves the least: on the
    MNI152 pairs of ``volsample bench --register`` (1 mm), 10 steps there rather than 25
    gave a mean Dice within 0.003 of theirs (contrast pair: 0.922 against 0.925;
    same-contrast pair: 0.932 against 0.932) for 0.65 of the CPU time, as Greedy's
    100x50x10 does."""
    steps = [max(10, 100 // 2 ** k) for k in range(levels)]
    if loss == "mi" and levels > 1:
        steps[-1] = 10
    return steps


def default_affine_iterations(shape: Sequence[int], iterations: Sequence[int]) -> list[int]:
    """``volsample register``'s affine steps per level (coarsest first) for a fixed volume
    of ``shape``: the deformable stage's ``iterations`` at the coarsest level and at each
    finer level up to the first of at least ``AFFINE_LEVEL_VOXELS`` voxels, 0 after it.

    A coarse level of a small volume holds too few voxels to place the affine to within a
    fixed voxel (nibabel's 33x41x25 head of 2 mm voxels: 5 mm off at the corners from its
    17x21x13 level alone, under 2 mm with the full resolution's steps too), while on a large one the
    finer levels' steps change nothing measurable and cost the most (the MNI152 pair of
    ``volsample bench --register``: 50x59x48 voxels at its coarsest)."""
    shapes = [tuple(shape)]
    for _ in range(len(iterations) - 1):
        shapes.append(_half_shape(shapes[-1]))
    steps, placed = [], False  # placed: a level of enough voxels has had its steps
    for level_shape, n in zip(reversed(shapes), iterations):
        steps.append(0 if placed else n)
        placed = placed or math.prod(level_shape) >= AFFINE_LEVEL_VOXELS
    return steps



def build_pyramid(fixed: np.ndarray, moving: np.ndarray, fixed_affine: np.ndarray,
                  moving_affine: np.ndarray, levels: int, interp: str
                  ) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The levels (factor, fixed, moving), coarsest first: the fixed volume halved
    ``log2(factor)`` times, the moving one while its voxels are finer than the fixed
    level's, as ``interpolant(moving, interp)`` gives it."""
    shape = fixed.shape
    pyramid = [(1, fixed, moving)]  # finest first, each level halving the one before
    for _ in range(levels - 1):
        factor, fixed_l, moving_l = pyramid[-1]
        fixed_l = _halve(fixed_l)
        # the moving volume is halved while it is finer than the fixed level, not once per
        # level: a moving volume of coarser voxels would otherwise be blurrier than the
        # fixed one at every coarse level, and the affine stage would fit the blur (on
        # nibabel's 2 mm / 4 mm pair it shrinks the head by 15%); 0.99: sizes equal but
        # for rounding are matched
        while (_voxel_mm(moving_affine, moving.shape, moving_l.shape)
               < 0.99 * _voxel_mm(fixed_affine, shape, fixed_l.shape)):
            halved = _halve(moving_l)
            if halved.shape == moving_l.shape:
                break
            moving_l = halved
        pyramid.append((2 * factor, fixed_l, moving_l))
    return [(factor, fixed_l, interpolant(moving_l, interp))
            for factor, fixed_l, moving_l in reversed(pyramid)]
