"""A registration's result in the files ITK, SimpleITK and ANTs read.

volsample's map takes a fixed world point x to the moving world point T(x + d(x)) (NIfTI
world axes, RAS+: x to the right, y to the front, z up). ITK's transforms take a fixed
physical point to the moving one too, which is what resampling the moving image onto the
fixed grid needs, but in ITK's physical frame, LPS+ (x to the left, y to the back, z up):
a point's LPS coordinates are F times its RAS ones, F = diag(-1, -1, 1).

- The affine: T in LPS is F T F, an ``AffineTransform_double_3_3`` in ITK's text format
  (``write_itk_affine``).
- The deformation: d in LPS is F d, on the fixed grid: an ITK displacement field image
  (``itk_displacement``), a NIfTI of shape (X, Y, Z, 1, 3) with the vector intent (1007),
  which ITK's NIfTI reader (SimpleITK's, ANTs') takes as a 3-D image of 3-vectors in LPS
  millimetres. The fixed point x goes to x + F d(F x) first, then through the affine:
  ANTs lists the two as ``-t field -t affine`` (its transforms apply last first, image
  sense), SimpleITK as ``CompositeTransform([affine, field])`` (the last added is applied
  to the point first).
"""
from __future__ import annotations

import numpy as np

# RAS <-> LPS: the first two world axes change sign (its own inverse)
RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])
NIFTI_INTENT_VECTOR = "vector"  # nibabel's name of intent code 1007


def lps_affine(transform: np.ndarray) -> np.ndarray:
    """The 4x4 world affine ``transform`` (RAS mm to RAS mm) in LPS mm to LPS mm."""
    return RAS_TO_LPS @ np.asarray(transform, np.float64) @ RAS_TO_LPS


def itk_affine_text(transform: np.ndarray) -> str:
    """``transform`` (4x4, RAS, fixed to moving) as an ITK text transform file.

    ITK's affine maps a point p to M (p - c) + c + t, parameters the 3x3 M row by row then
    t, fixed parameters the centre c. With c = 0, t is the LPS affine's translation.
    """
    lps = lps_affine(transform)
    if not np.allclose(lps[3], [0, 0, 0, 1]):
        raise ValueError(f"transform: expected an affine (last row 0 0 0 1), got {transform!r}")
    numbers = list(lps[:3, :3].ravel()) + list(lps[:3, 3])
    return ("#Insight Transform File V1.0\n"
            "#Transform 0\n"
            "Transform: AffineTransform_double_3_3\n"
            f"Parameters: {' '.join(f'{v:.17g}' for v in numbers)}\n"
            "FixedParameters: 0 0 0\n")


def write_itk_affine(path: str, transform: np.ndarray) -> None:
    """Write ``transform`` (4x4 RAS world affine, fixed to moving) as an ITK transform
    file (.txt or .tfm) for ``sitk.ReadTransform``, ITK and ``antsApplyTransforms``."""
    with open(path, "w") as file:
        file.write(itk_affine_text(transform))


def itk_displacement(displacement: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """d (D, H, W, 3) in RAS millimetres as ITK's displacement field data: (D, H, W, 1, 3)
    float32 in LPS millimetres (NIfTI's fifth axis holds a voxel's vector; the fourth,
    time, is 1). Written with the fixed image's affine and the vector intent, it is the
    ITK displacement field of d on the fixed grid. ``out``: where the LPS vectors go
    (float32, d's shape; d itself, to make them in place)."""
    lps = np.multiply(np.asarray(displacement, np.float32), np.array([-1, -1, 1], np.float32),
                      out=out)
    return lps[:, :, :, None, :]
