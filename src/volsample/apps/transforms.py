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

``read_affine`` reads an affine back, from any of the files the three tools and volsample
write: ITK's text transform files (``.tfm``, ``.txt``: ANTs' and Greedy's ``-o`` affines
converted by ``c3d_affine_tool -oitk`` too), ITK's MATLAB files (``.mat``: ANTs'
registrations write these; SciPy reads them) and volsample's own ``affine.txt``.
"""
from __future__ import annotations

import os
import re

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


# The ITK transforms that are one 3-D affine: 9 matrix entries, row by row, then the
# translation; the fixed parameters are the centre.
_ITK_AFFINES = re.compile(r"(AffineTransform|MatrixOffsetTransformBase)_(double|float)_3_3")


def read_affine(path: str | os.PathLike) -> np.ndarray:
    """The 4x4 world affine (RAS mm to RAS mm, fixed to moving: ``register``'s ``T``) in
    ``path``: an ITK text transform file, an ITK MATLAB transform file (``.mat``, as ANTs
    writes them) or volsample's ``affine.txt``. Raises ValueError naming the file when it
    holds no such affine, or a singular one."""
    path = os.fspath(path)
    try:
        if path.endswith(".mat"):
            transform = _lps_to_ras(*_itk_matlab_parameters(path))
        else:
            with open(path, encoding="utf-8") as file:
                text = file.read()
            transform = (_lps_to_ras(*_itk_text_parameters(text))
                         if text.startswith("#Insight Transform File") else _affine_txt(text))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path}: not an affine transform file ({error})") from error
    if not np.isfinite(transform).all() or abs(np.linalg.det(transform[:3, :3])) < 1e-9:
        raise ValueError(f"{path}: the affine is singular or not finite: {transform.tolist()}")
    return transform


def _itk_text_parameters(text: str) -> tuple[np.ndarray, np.ndarray]:
    kinds = re.findall(r"^Transform: (\S+)", text, re.M)
    if len(kinds) != 1 or not _ITK_AFFINES.fullmatch(kinds[0]):
        raise ValueError(f"expected one 3-D affine transform (AffineTransform_double_3_3), "
                         f"found {', '.join(kinds) or 'none'}")
    parameters, centre = (re.search(rf"^{key}:(.*)$", text, re.M) for key in
                          ("Parameters", "FixedParameters"))
    if parameters is None or centre is None:
        raise ValueError("no Parameters or FixedParameters line")
    return np.array(parameters.group(1).split(), float), np.array(centre.group(1).split(), float)


def _itk_matlab_parameters(path: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        from scipy.io import loadmat
    except ImportError as error:
        raise ValueError("reading ITK's MATLAB transform files needs SciPy "
                         "(pip install scipy)") from error
    variables = loadmat(path)
    names = [name for name in variables if _ITK_AFFINES.fullmatch(name)]
    if len(names) != 1 or "fixed" not in variables:
        raise ValueError("expected the variables AffineTransform_double_3_3 and fixed")
    return variables[names[0]].ravel().astype(float), variables["fixed"].ravel().astype(float)


def _lps_to_ras(parameters: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """ITK's affine p -> M (p - c) + c + t (LPS) as a 4x4 RAS world affine."""
    if parameters.shape != (12,) or centre.shape != (3,):
        raise ValueError(f"expected 12 parameters and a centre of 3, got {parameters.size} and "
                         f"{centre.size}")
    lps = np.eye(4)
    lps[:3, :3] = parameters[:9].reshape(3, 3)
    lps[:3, 3] = parameters[9:] + centre - lps[:3, :3] @ centre
    return lps_affine(lps)  # its own inverse: LPS -> RAS as RAS -> LPS


def _affine_txt(text: str) -> np.ndarray:
    rows = [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    transform = np.array(rows, float) if rows else np.empty(0)
    if transform.shape != (4, 4) or not np.allclose(transform[3], [0, 0, 0, 1]):
        raise ValueError("expected an ITK transform file, or 4 rows of 4 numbers ending in 0 0 0 1")
    return transform
