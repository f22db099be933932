"""``register``: the two stages over the pyramid, and what the command line reads and
writes around them (``resample``, ``normalise_intensity``)."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from ..._checks import InvalidArgumentError
from ...warp import warp_3d
from ..transforms import read_affine
from .geometry import _SAMPLING, IDENTITY_PARAMS, INTERPOLATIONS, Frame, dense_displacement
from .losses import DEFAULT_WEIGHTS, Measure, _similarity, similarity_measure
from .objectives import StepBuffers, _moving_linear, _sample, _warp_parts, interpolant
from .pyramid import build_pyramid
from .result import RegistrationResult, _millimetres
from .stages import affine_stage, deformable_stage
from .velocity import DEFAULT_MODEL, MODELS, exponential


def register(fixed: np.ndarray, moving: np.ndarray, loss: str = "ncc", *,
             fixed_affine: np.ndarray | None = None, moving_affine: np.ndarray | None = None,
             levels: int = 3, iterations: int | Sequence[int] = 100,
             affine_iterations: int | Sequence[int] | None = None,
             grid_spacing: float = 4.0, weight: float | None = None, lr: float = 0.25,
             affine_lr: float = 0.01, window: int = 5, tolerance: float = 1e-3,
             interp: str = "bilinear", model: str = DEFAULT_MODEL,
             initial_affine: npt.ArrayLike | str | os.PathLike | None = None,
             callback: Callable[[str, int, int, float, float], None] | None = None
             ) -> RegistrationResult:
    """Register ``moving`` to ``fixed``: an affine stage, then a free-form deformation,
    each coarse to fine, in physical space.

    Parameters
    ----------
    fixed, moving : ndarray, shape (D, H, W)
        Volumes, each of any shape (at least 2 voxels per axis), intensities on comparable
        scales (e.g. both in [0, 1]); computed in float32.
    loss : {"mse", "ncc", "mi"}
        Similarity: mean squared difference, local normalised cross-correlation, or
        Mattes mutual information (images of different contrasts).
    fixed_affine, moving_affine : ndarray, shape (4, 4), optional
        Voxel (i, j, k) to world (mm) affines, as in NIfTI headers; they give the starting
        alignment. Default: the identity (voxels are millimetres, the grids coincide).
    levels : int
        Resolution levels; level k (from 0, finest) blurs and halves the fixed volume k
        times (the moving one while its voxels are smaller than the fixed level's) and
        spaces control points ``grid_spacing * 2**k`` voxels apart.
    iterations : int or sequence of int
        Adam steps of the deformable stage per level, one number for all or one per level
        (coarsest first).
    affine_iterations : int or sequence of int, optional
        The same for the affine stage (default ``iterations``; 0 skips it).
    grid_spacing : float
        Control-point spacing at the finest level, in fixed voxels.
    weight : float, optional
        Smoothness weight (default ``DEFAULT_WEIGHTS[loss]``).
    lr : float
        Adam step at the finest level, in fixed voxels: the control points', and the
        affine's translation (in mm of the fixed image's largest voxel); doubled per
        coarser level.
    affine_lr : float
        Adam step of the affine's linear part at the finest level, doubled per coarser
        level.
    window : int
        Box size of the local NCC.
    tolerance : float
        A level ends early when its objective stalls: when the best value of its last
        ``STALL_STEPS`` steps improves on the best before them by less than ``tolerance``
        times the similarity's scale (0: always run every step).
    interp : {"bilinear", "bicubic", "bspline"}
        The mode the moving volume is sampled in, in the optimisation and in the result's
        ``warped``; "bspline" samples the spline coefficients of each level's moving
        volume (``interpolant``), computed once per level.
    model : {"diffeomorphic", "free-form"}
        The deformable stage's map: the exponential of a stationary velocity on the control
        grid ("diffeomorphic", the default: invertible, no folds; the result holds the
        inverse too, ``RegistrationResult.inverse_displacement``), or the control grid's
        displacements upsampled ("free-form").
    initial_affine : ndarray, shape (4, 4), or path, optional
        Where the affine stage starts: a world affine T (mm to mm, a fixed point to the
        moving one, NIfTI's world axes: the result's ``transform``), or a file holding one
        (``volsample.apps.transforms.read_affine``: ITK's and ANTs' affine files,
        ``affine.txt``). Default: the identity, the headers' alignment. With no affine
        steps the result's ``transform`` is this one.
    callback : callable(stage, level, iteration, objective, similarity), optional
        Called after every step (stage "affine" or "deformable"; levels counted from 0,
        coarsest first).

    Returns
    -------
    RegistrationResult
    """
    fixed, moving = _volume("fixed", fixed), _volume("moving", moving)
    fixed_affine = _affine("fixed_affine", fixed_affine)
    moving_affine = _affine("moving_affine", moving_affine)
    if isinstance(initial_affine, (str, os.PathLike)):
        try:
            initial_affine = read_affine(initial_affine)
        except ValueError as error:
            raise InvalidArgumentError(f"initial_affine: {error}") from None
    initial = None if initial_affine is None else _affine("initial_affine", initial_affine)
    steps, affine_steps = _check_arguments(
        loss, levels, iterations, affine_iterations, grid_spacing=grid_spacing, weight=weight,
        lr=lr, affine_lr=affine_lr, window=window, tolerance=tolerance, interp=interp,
        model=model)
    weight = DEFAULT_WEIGHTS[loss] if weight is None else weight
    shape = fixed.shape
    frame = Frame.of(shape, fixed_affine, moving.shape, moving_affine)
    pyramid = build_pyramid(fixed, moving, fixed_affine, moving_affine, levels, interp)
    history = []

    def record(stage, level, it, value, sim):
        history.append((stage, level, value, sim))
        if callback is not None:
            callback(stage, level, it, value, sim)

    voxel_mm = float(np.linalg.norm(fixed_affine[:3, :3], axis=0).max())
    params = affine_stage(pyramid, frame, loss, affine_steps, lr=lr, affine_lr=affine_lr,
                          voxel_mm=voxel_mm, window=window, tolerance=tolerance, interp=interp,
                          record=record,
                          start=IDENTITY_PARAMS if initial is None else frame.params(initial))
    theta = frame.theta(params)
    control, measure = deformable_stage(pyramid, theta, shape, loss, weight, steps,
                                        grid_spacing=grid_spacing, lr=lr, window=window,
                                        tolerance=tolerance, interp=interp, record=record,
                                        diffeomorphic=model == "diffeomorphic")
    velocity = inverse = None
    if model == "diffeomorphic":
        velocity, control = control, exponential(control, shape)
        inverse = exponential(-velocity, shape)
    # the full resolution's measure (the last level's, made for its steps or now) scores the
    # headers' alignment and the result
    if measure is None:
        measure = similarity_measure(loss, fixed, window)
    finest = pyramid[-1][2]
    del pyramid
    moved = dense_displacement(control @ _moving_linear(theta, shape, control.dtype).T, shape)
    warped = _sample(finest, theta, moved, shape, interp)
    similarity = _similarities(measure, finest, frame, warped, interp)
    del measure
    return RegistrationResult(frame.transform(params), _millimetres(control, fixed_affine, shape),
                              warped, control, history, fixed_affine, moving_affine,
                              moving.shape, theta, shape, similarity, moved, velocity, inverse)


def _similarities(measure: Measure, moving: np.ndarray, frame: Frame,
                  warped: np.ndarray, interp: str) -> tuple[float, float]:
    """The similarity of the headers' alignment (``moving`` as the optimisation samples it)
    and of the result (``warped``)."""
    before, _ = _warp_parts(measure, moving, frame.theta(IDENTITY_PARAMS, moving.dtype), None,
                            interp, StepBuffers())
    return measure.value(before), measure.value(warped)


def _check_arguments(loss, levels, iterations, affine_iterations, *, grid_spacing, weight, lr,
                     affine_lr, window, tolerance, interp, model) -> tuple[list[int], list[int]]:
    """``register``'s settings checked (each wrong one named), and its steps per level:
    (deformable, affine)."""
    _similarity(loss)
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 1:
        raise InvalidArgumentError(f"levels: expected an int >= 1, got {levels!r}")
    steps = _per_level("iterations", iterations, levels)
    affine_steps = _per_level("affine_iterations",
                              iterations if affine_iterations is None else affine_iterations,
                              levels)
    for name, value in (("grid_spacing", grid_spacing), ("lr", lr), ("affine_lr", affine_lr)):
        if not value > 0:
            raise InvalidArgumentError(f"{name}: expected a number > 0, got {value!r}")
    if weight is not None and not weight >= 0:
        raise InvalidArgumentError(f"weight: expected a number >= 0, got {weight!r}")
    if not tolerance >= 0:
        raise InvalidArgumentError(f"tolerance: expected a number >= 0, got {tolerance!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1 or window % 2 == 0:
        raise InvalidArgumentError(f"window: expected an odd int >= 1, got {window!r}")
    if interp not in INTERPOLATIONS:
        raise InvalidArgumentError(f"interp: expected one of {', '.join(map(repr, INTERPOLATIONS))}, "
                                   f"got {interp!r}")
    if model not in MODELS:
        raise InvalidArgumentError(f"model: expected one of {', '.join(map(repr, MODELS))}, "
                                   f"got {model!r}")
    return steps, affine_steps


def resample(fixed_shape: Sequence[int], fixed_affine: npt.ArrayLike, moving: np.ndarray,
             moving_affine: npt.ArrayLike,
             mode: str = "bilinear") -> np.ndarray:
    """``moving`` sampled on the fixed grid by the headers alone (T = I, d = 0): where the
    registration starts ("bspline": through its spline coefficients)."""
    frame = Frame.of(tuple(fixed_shape), _affine("fixed_affine", fixed_affine), moving.shape,
                     _affine("moving_affine", moving_affine))
    return warp_3d(interpolant(moving, mode)[None, None], frame.theta(IDENTITY_PARAMS), None,
                   tuple(fixed_shape), mode, **_SAMPLING)[0, 0]


def normalise_intensity(volume: np.ndarray, name: str = "volume") -> np.ndarray:
    """``volume`` as float32, mapped linearly so that its 0.5th and 99.5th percentiles
    (its minimum and maximum if those coincide) become 0 and 1; nothing is clipped."""
    volume = np.asarray(volume, np.float32)
    low, high = np.percentile(volume, (0.5, 99.5))
    if high <= low:
        low, high = volume.min(), volume.max()
    if not high > low:
        raise InvalidArgumentError(f"{name}: expected a volume with some contrast, got the "
                                   f"constant {float(low)!r}")
    return (volume - np.float32(low)) / np.float32(high - low)


def _volume(name, volume):
    volume = np.asarray(volume)
    if volume.ndim != 3 or min(volume.shape) < 2:
        raise InvalidArgumentError(f"{name}: expected a 3-D volume with at least 2 voxels per "
                                   f"axis, got shape {volume.shape}")
    return volume.astype(np.float32, copy=False)  # read, never written


def _affine(name, affine):
    """A voxel-to-world affine: 4x4, finite, invertible, last row (0, 0, 0, 1)."""
    if affine is None:
        return np.eye(4)
    affine = np.asarray(affine, np.float64)
    if (affine.shape != (4, 4) or not np.isfinite(affine).all()
            or not np.array_equal(affine[3], [0, 0, 0, 1])
            or abs(np.linalg.det(affine[:3, :3])) < 1e-12):
        raise InvalidArgumentError(f"{name}: expected an invertible 4x4 affine with last row "
                                   f"(0, 0, 0, 1), got {affine.tolist()!r}")
    return affine


def _per_level(name, value, levels):
    values = [value] * levels if isinstance(value, int) else list(value)
    if len(values) != levels or not all(isinstance(v, int) and v >= 0 for v in values):
        raise InvalidArgumentError(
            f"{name}: expected an int >= 0 or {levels} of them (one per level), got {value!r}")
    return values
