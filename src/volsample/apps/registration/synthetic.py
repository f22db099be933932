"""The demo's synthetic pair: a procedural phantom of nested soft ellipsoids and blobs,
with a label map, and a known smooth deformation of it."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .geometry import identity_grid, voxel_to_normalised

# (centre (x, y, z), radii (x, y, z), intensity, label), in normalised coordinates, painted
# in order: a body, two organs, a core nested in the second, and darker blobs as texture.
_PHANTOM = (
    ((0.0, 0.0, 0.0), (0.78, 0.62, 0.70), 0.35, 1),
    ((-0.32, 0.12, 0.15), (0.26, 0.22, 0.32), 0.80, 2),
    ((0.30, -0.10, -0.12), (0.24, 0.28, 0.22), 0.60, 3),
    ((0.32, -0.12, -0.10), (0.10, 0.12, 0.09), 1.00, 4),
    ((0.05, 0.38, -0.35), (0.12, 0.10, 0.12), 0.10, 5),
    ((-0.40, -0.30, -0.30), (0.11, 0.13, 0.10), 0.10, 5),
    ((0.45, 0.30, 0.35), (0.10, 0.10, 0.13), 0.10, 5),
    ((-0.05, -0.40, 0.40), (0.12, 0.09, 0.10), 0.10, 5),
)
_TEXTURE = 0.08  # amplitude of the texture inside every shape
_TEXTURE_FREQUENCY = np.array([9.0, 7.0, 8.0])  # radians per normalised unit (x, y, z)


def phantom(points: np.ndarray, edge: float) -> tuple[np.ndarray, np.ndarray]:
    """The phantom's intensity and label at ``points`` (..., 3), normalised (x, y, z).

    Edges are soft: membership rises from 0 to 1 over about ``edge`` normalised units,
    so that the image is smooth at the voxel scale; labels are the hard insides.
    """
    image = np.zeros(points.shape[:-1], np.float32)
    labels = np.zeros(points.shape[:-1], np.int16)
    # A gentle texture, so that uniform regions still show how they move.
    texture = _TEXTURE * np.prod(np.sin(points * _TEXTURE_FREQUENCY), axis=-1)
    for centre, radii, intensity, label in _PHANTOM:
        rho = np.sqrt(np.sum(((points - centre) / radii) ** 2, axis=-1))
        distance = (1 - rho) * min(radii)  # about the distance to the surface, inside > 0
        inside = 1 / (1 + np.exp(-np.clip(distance / (0.25 * edge), -50, 50)))
        image += (inside * (intensity + texture - image)).astype(np.float32)
        labels[rho < 1] = label
    return image, labels


def smooth_deformation(shape: Sequence[int], amplitude: float, seed: int = 0) -> np.ndarray:
    """A smooth random displacement of a (D, H, W) volume, (1, D, H, W, 3) in voxels,
    channels (x, y, z): per channel a product of low-frequency sines, peak ``amplitude``."""
    rng = np.random.default_rng(seed)
    coords = identity_grid(shape, np.float64)[0]
    field = np.empty(coords.shape)
    for channel in range(3):
        frequency = rng.uniform(0.5, 1.0, 3) * np.pi
        phase = rng.uniform(0, 2 * np.pi, 3)
        field[..., channel] = amplitude * np.prod(np.sin(coords * frequency + phase), axis=-1)
    return field[None].astype(np.float32)


@dataclasses.dataclass
class SyntheticPair:
    """The demo's volumes: ``fixed(p) = moving(p + displacement(p))`` exactly.

    displacement is (D, H, W, 3) in voxels, component a along array axis a (as in
    ``RegistrationResult``); labels are int16 maps, 0 outside the phantom.
    """

    fixed: np.ndarray
    moving: np.ndarray
    fixed_labels: np.ndarray
    moving_labels: np.ndarray
    displacement: np.ndarray


def synthetic_pair(shape: Sequence[int] = (64, 64, 64), amplitude: float | None = None, seed: int = 0
                   ) -> SyntheticPair:
    """A phantom (moving) and the same phantom under a known smooth deformation (fixed).

    Both are evaluated analytically (no interpolation): the fixed volume is the phantom
    at ``p + u(p)``. ``amplitude`` is the deformation's peak in voxels (default a
    sixteenth of the smallest side).
    """
    amplitude = min(shape) / 16 if amplitude is None else amplitude
    truth = smooth_deformation(shape, amplitude, seed)
    scale = voxel_to_normalised(shape)
    identity = identity_grid(shape)[0]
    edge = 1.5 * float(scale.max())  # 0.75 voxel of the finest axis
    moving, moving_labels = phantom(identity, edge)
    fixed, fixed_labels = phantom(identity + truth[0] * scale, edge)
    return SyntheticPair(fixed, moving, fixed_labels, moving_labels,
                         np.ascontiguousarray(truth[0, ..., ::-1]))
