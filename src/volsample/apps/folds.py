"""Where a registration's deformation folds: its Jacobian determinant in world millimetres,
and the fixed image's foreground, over which ``volsample register`` counts the folds.

The deformation is x -> x + d(x) with d in millimetres along the fixed image's world axes
(``RegistrationResult.displacement``). Its Jacobian determinant det(I + dd/dx) is taken
with respect to world millimetres, so the voxel spacing and orientation count. A voxel
folds where it is <= 0: the map turns space inside out there and has no inverse. The
registration's affine T multiplies the whole map's determinant by det(T), a constant, and
is left out: it does not fold.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..fields import jacobian_determinant

_SLAB = 16  # planes of the first axis per step: the derivatives' temporaries stay small
_OTSU_BINS = 256


def jacobian_mm(displacement: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """det(I + dd/dx) at every voxel, x in world millimetres, float32 (D, H, W).

    ``displacement`` is d, (D, H, W, 3), millimetres along the world axes of the grid whose
    voxel-to-world ``affine`` (4x4) it lies on. In voxel units, v = L^-1 d (L: the affine's
    3x3), the map's Jacobian is L^-1 (I + dd/dx) L, of the same determinant: it is
    ``volsample.jacobian_determinant`` of v (finite differences, central inside, one-sided
    at the edges), taken a slab of planes at a time with one plane of overlap on either
    side, so that every voxel sees the neighbours the whole volume would give it.
    """
    to_voxels = np.linalg.inv(np.asarray(affine, np.float64)[:3, :3]).astype(np.float32)
    depth = displacement.shape[0]
    det = np.empty(displacement.shape[:3], np.float32)
    for start in range(0, depth, _SLAB):
        stop = min(start + _SLAB, depth)
        low, high = max(start - 1, 0), min(stop + 1, depth)
        # voxel displacement (i, j, k), reversed into jacobian_determinant's (x, y, z)
        voxels = (displacement[low:high].astype(np.float32) @ to_voxels.T)[..., ::-1]
        det[start:stop] = jacobian_determinant(np.ascontiguousarray(voxels)[None])[
            0, start - low:stop - low]
    return det


def otsu_threshold(volume: np.ndarray) -> float:
    """The intensity splitting ``volume`` into two classes of the largest between-class
    variance (Otsu's method, on a 256-bin histogram): in an MRI or CT, the background below
    it and the head or body above."""
    values = np.asarray(volume).ravel()  # no float64 copy: the histogram reads any dtype
    counts, edges = np.histogram(values, _OTSU_BINS)
    centres = (edges[:-1] + edges[1:]) / 2
    # the two classes' sizes and means for a threshold after each bin but the last
    below = np.cumsum(counts)[:-1]
    above = values.size - below
    sums = np.cumsum(counts * centres)[:-1]
    total = float((counts * centres).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        between = below * above * (sums / below - (total - sums) / above) ** 2
    between = np.where((below > 0) & (above > 0), between, -1)
    if not between.max() > 0:  # one value (or one class): nothing above it
        return float(values.max())
    # two well-apart classes leave empty bins between them, all of one score: the middle
    # of that run, not its first bin, which would sit on the lower class's tail
    best = np.flatnonzero(between >= between.max() * (1 - 1e-9))
    run = best[:np.argmax(np.diff(best, append=best[-1] + 2) > 1) + 1]
    return float(edges[run[len(run) // 2] + 1])


def foreground(fixed: np.ndarray, labels: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """The fixed image's foreground and how it was found: the labels > 0 when given, else
    the voxels above FIXED's Otsu threshold (a flat volume: all of it)."""
    if labels is not None:
        return labels > 0, "FIXED_LABELS > 0"
    mask = fixed > otsu_threshold(fixed)
    if not mask.any():
        return np.ones(fixed.shape, bool), "all voxels"
    return mask, "FIXED above its Otsu threshold"


@dataclasses.dataclass(frozen=True)
class Folds:
    """The Jacobian determinant's summary over a foreground."""

    minimum: float  # in the foreground
    folded: int  # foreground voxels of det <= 0
    voxels: int  # in the foreground
    where: str  # how the foreground was found

    @property
    def fraction(self) -> float:
        return self.folded / self.voxels if self.voxels else 0.0

    def line(self) -> str:
        """One line for the summary and the report."""
        return (f"jacobian determinant in the foreground ({self.where}): min "
                f"{self.minimum:.4f}, folded (<= 0) {self.folded} of {self.voxels} voxels "
                f"({100 * self.fraction:.4f}%)")

    def as_dict(self) -> dict:
        return {"foreground": self.where, "voxels": self.voxels, "minimum": self.minimum,
                "folded": self.folded, "folded_fraction": self.fraction}


def folds(det: np.ndarray, mask: np.ndarray, where: str) -> Folds:
    """Summarise the determinant map ``det`` over ``mask`` (found as ``where`` says)."""
    inside = det[mask]
    return Folds(float(inside.min()) if inside.size else float("nan"),
                 int(np.count_nonzero(inside <= 0)), int(inside.size), where)
