"""3-D registration in physical space, built on volsample's NumPy operators (no PyTorch).

Two images, each a volume with its voxel-to-world affine (NIfTI's; identity for arrays
without one), are compared in the fixed image's grid: the moving image is sampled there
by ``warp_3d``, the grid never formed, at ``A x + u(x)``:

1. **Affine stage.** The headers give the starting alignment. A world affine T (fixed
   world point -> moving world point, 12 parameters about the fixed field of view's
   centre) becomes warp_3d's theta (``Frame``); its gradient comes from
   ``warp_3d_backward``'s grad_theta.
2. **Deformable stage.** A free-form deformation: a coarse grid of control-point
   displacements (fixed voxels) is upsampled trilinearly (``upsample_trilinear_3d``,
   align_corners=True) to a dense displacement d, and the fixed point x maps to the
   moving point T(x + d(x)): warp_3d's displacement is d in normalised units through
   theta's linear part. Its gradient runs back through ``warp_3d_backward``'s
   grad_displacement and the upsampling's adjoint. In the steps, d is made only over
   the parts of the volume the similarity reads (windows of the upsampling: the same
   values as the whole field's there), and the gradient runs back from them alone. With
   the diffeomorphic model (the default) the control grid holds a stationary velocity v
   and the displacements upsampled are exp(v), integrated on the control grid by scaling
   and squaring (``velocity``); the inverse is exp(-v).

The objective is an image similarity (MSE or local NCC), plus a smoothness penalty on the
control grid in the deformable stage; Adam takes the steps. Coarse-to-fine: each level
halves the images' resolution (corner voxel centres kept: align_corners=True, so theta
and the normalised coordinates hold at every level) and doubles the control spacing.

Conventions
-----------
Volumes are 3-D arrays indexed (D, H, W) = NIfTI's voxel axes (i, j, k); affines map
(i, j, k, 1) to world millimetres. Inside the package displacements are stored in
grid_sample's channel order (x, y, z), i.e. along (W, H, D), in voxels of the full
resolution fixed volume. ``RegistrationResult.displacement`` is d in world millimetres
instead (the fixed image's world axes), and ``RegistrationResult.transform`` is T.

The demo's synthetic pair (``synthetic_pair``) is a procedural phantom of nested soft
ellipsoids and blobs, with a label map, and a known smooth deformation of it.

Modules, each importing only those above it in this list: ``geometry`` (coordinates, the
control grid, ``Frame``), ``losses`` (the similarity measures, their registry
``SIMILARITIES``, the smoothness penalty), ``objectives`` (the stages' objectives and
gradients), ``velocity`` (the diffeomorphic model: a stationary velocity's exponential and
the inverse), ``pyramid`` (the resolution levels), ``result`` (``RegistrationResult``),
``stages`` (Adam's steps per stage), ``pipeline`` (``register``); ``evaluation`` (Dice, the
error against a known map) and ``synthetic`` (the demo's pair) stand apart. This package
re-exports their public names: one patched here reaches the command line, which calls
``registration.register``; a module's own constants are read from that module.
"""
from __future__ import annotations

from .evaluation import deformation_error, dice
from .geometry import (
    IDENTITY_PARAMS,
    INTERPOLATIONS,
    Frame,
    control_shape,
    dense_displacement,
    grid_to_voxel,
    identity_grid,
    refine,
    voxel_to_normalised,
    warp,
)
from .losses import (
    DEFAULT_WEIGHTS,
    SIMILARITIES,
    LocalNCC,
    MeanSquares,
    blur,
    box_sum,
    local_ncc,
    mse,
    similarity,
    similarity_measure,
    smoothness,
)
from .objectives import (
    StepBuffers,
    affine_objective,
    interpolant,
    moving_displacement,
    objective,
)
from .pipeline import normalise_intensity, register, resample
from .pyramid import AFFINE_LEVEL_VOXELS, default_affine_iterations, default_iterations
from .result import RegistrationResult
from .stages import STALL_STEPS, Adam
from .velocity import DEFAULT_MODEL, MODELS, dense_inverse, exponential
from .synthetic import SyntheticPair, phantom, smooth_deformation, synthetic_pair

__all__ = [
    "identity_grid",
    "voxel_to_normalised",
    "dense_displacement",
    "warp",
    "control_shape",
    "refine",
    "grid_to_voxel",
    "Frame",
    "box_sum",
    "blur",
    "MeanSquares",
    "LocalNCC",
    "mse",
    "local_ncc",
    "similarity",
    "smoothness",
    "interpolant",
    "StepBuffers",
    "similarity_measure",
    "moving_displacement",
    "affine_objective",
    "objective",
    "Adam",
    "RegistrationResult",
    "register",
    "resample",
    "normalise_intensity",
    "default_affine_iterations",
    "default_iterations",
    "dice",
    "deformation_error",
    "phantom",
    "smooth_deformation",
    "SyntheticPair",
    "synthetic_pair",
    "INTERPOLATIONS",
    "IDENTITY_PARAMS",
    "SIMILARITIES",
    "DEFAULT_WEIGHTS",
    "STALL_STEPS",
    "AFFINE_LEVEL_VOXELS",
    "exponential",
    "dense_inverse",
    "MODELS",
    "DEFAULT_MODEL",
]
