"""The registration's objectives and their gradients at one resolution: the affine
stage's (``affine_objective``) and the deformable stage's (``objective``), each warping the
moving volume with warp_3d only where the similarity reads it.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ... import _backends, _coords, _layout
from ...spline import spline_coefficients
from ...warp import warp_3d, warp_3d_backward
from .geometry import _SAMPLING, Frame, voxel_to_normalised
from .losses import Measure, _within, similarity_measure, smoothness

_upsample_kernels = _backends.cpu("upsample")


def interpolant(volume: np.ndarray, interp: str = "bilinear") -> np.ndarray:
    """What warp_3d samples in mode ``interp`` to interpolate ``volume`` (D, H, W): the
    volume itself, or for "bspline" its spline coefficients under the warps' padding
    (border, align_corners=True), so that the samples at the voxel centres give the
    volume back. Computed once, sampled step after step."""
    if interp != "bspline":
        return volume
    return spline_coefficients(volume[None, None], **_SAMPLING)[0, 0]


def _sample(moving, theta, displacement, shape, interp="bilinear", out=None):
    """The moving volume (its own grid; ``interpolant(moving, interp)``) sampled at the
    fixed grid's points (``shape``): warp_3d at theta plus a displacement (normalised
    units), borders extended; into ``out`` (D, H, W), when given."""
    return warp_3d(moving[None, None], theta, displacement, shape, interp, **_SAMPLING,
                   out=None if out is None else out[None, None])[0, 0]


class StepBuffers:
    """The volume-sized arrays of one resolution level's steps (the dense displacement, the
    warped volume, the displacement's gradient), allocated by the first step and
    overwritten by the next ones: a step allocates no volume (no page faults)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def __call__(self, name: str, shape: Sequence[int], dtype: npt.DTypeLike,
                 zero: bool = False) -> np.ndarray:
        """The array ``name`` of that shape and dtype (its contents: the last step's; zeros
        when made, with ``zero``)."""
        array = self.arrays.get(name)
        if array is None or array.shape != tuple(shape) or array.dtype != dtype:
            array = self.arrays[name] = _layout.aligned_empty(tuple(shape), dtype, zero,
                                                              name=name)
        return array


def _regions(measure) -> list[tuple[slice, ...]]:
    """The measure's parts (``measure.parts``) as slices of its whole volume."""
    return [_within(measure.box, part, measure.full_shape) for part in measure.parts]


def _warp_parts(measure, moving, theta, displacements, interp, buffers):
    """The moving volume warped into the measure's box, part by part (``measure.parts``):
    theta times the part's map, at the part's displacement (``displacements``: one per
    part, or None); the rest of the box reads 0. Returns the box (a buffer of ``buffers``)
    and each part's (part, map, theta)."""
    # zeros where no part writes
    warped = buffers("warped", measure.fixed.shape, moving.dtype, zero=True)
    pieces = []
    for i, (part, region) in enumerate(zip(measure.parts, _regions(measure))):
        part_map = _coords.box_map(region, measure.full_shape, _SAMPLING["align_corners"])
        part_theta = theta if part_map is None else \
            (theta[0].astype(np.float64) @ part_map)[None].astype(theta.dtype)
        size = tuple(r.stop - r.start for r in region)
        _sample(moving, part_theta, None if displacements is None else displacements[i], size,
                interp, warped[part])
        pieces.append((part, part_map, part_theta))
    return warped, pieces


def _similarity_gradient(measure, moving, theta, displacements, mask, interp, buffers=None):
    """Similarity (``measure``, built on the fixed volume) of the warped volume, and
    warp_3d_backward's (grad_theta, grad_displacements) of the loss ``sign * similarity``
    as ``mask`` asks for them; volumes in ``buffers`` (``StepBuffers``) when given.

    Only the measure's box is warped, part by part (``measure.parts``): theta times the
    part's map, at the part's displacement (``displacements``: one per part, warp_3d's, or
    None); the rest of the box reads 0. grad_displacements has one gradient per part."""
    buffers = StepBuffers() if buffers is None else buffers
    warped, pieces = _warp_parts(measure, moving, theta, displacements, interp, buffers)
    sim, grad_warped = measure(warped, measure.sign)
    want_displacement = displacements is not None and mask[1]
    grad_displacements = [] if want_displacement else None
    grad_theta = None
    for i, (part, part_map, part_theta) in enumerate(pieces):
        displacement = None if displacements is None else displacements[i]
        _, part_grad, grad_displacement = warp_3d_backward(
            grad_warped[part][None, None], moving[None, None], part_theta, displacement,
            interp, **_SAMPLING, output_mask=(False,) + mask,
            grad_displacement_out=buffers(f"grad_displacement {i}", displacement.shape,
                                          displacement.dtype) if want_displacement else None)
        if grad_displacements is not None:
            grad_displacements.append(grad_displacement)
        if part_grad is not None:
            part_grad = part_grad[0].astype(np.float64)
            part_grad = part_grad if part_map is None else part_grad @ part_map.T
            grad_theta = part_grad if grad_theta is None else grad_theta + part_grad
    if grad_theta is not None:
        grad_theta = grad_theta[None].astype(theta.dtype)
    return sim, grad_theta, grad_displacements


def _dense_parts(control: np.ndarray, regions: Sequence[tuple[slice, ...]],
                 shape: Sequence[int], buffers: StepBuffers) -> list[np.ndarray]:
    """The dense displacement of ``control`` (``dense_displacement`` to ``shape``) over
    each of ``regions``, each the same bits as that part of the whole (buffers of
    ``buffers``, (1, d, h, w, 3) each): the upsampling runs only where the warps read."""
    parts = []
    for i, region in enumerate(regions):
        size = tuple(r.stop - r.start for r in region)
        part = buffers(f"displacement {i}", (1,) + size + (3,), control.dtype)
        _upsample_kernels.window(_layout.logical(control, "NDHWC"),
                                 _layout.logical(part, "NDHWC"), [r.start for r in region],
                                 shape, True, layout="NDHWC")
        parts.append(part)
    return parts


def _dense_parts_adjoint(grads: Sequence[np.ndarray], regions: Sequence[tuple[slice, ...]],
                         shape: Sequence[int], control_shape: Sequence[int],
                         buffers: StepBuffers) -> np.ndarray:
    """The adjoint of ``_dense_parts``: the control grid's gradient (``control_shape``) of
    the parts' gradients, summed part after part."""
    total = np.zeros(control_shape, grads[0].dtype)
    scratch = buffers("control gradient", control_shape, grads[0].dtype)
    for grad, region in zip(grads, regions):
        _upsample_kernels.window(_layout.logical(grad, "NDHWC"),
                                 _layout.logical(scratch, "NDHWC"), [r.start for r in region],
                                 shape, True, backward=True, layout="NDHWC")
        total += scratch
    return total


def moving_displacement(displacement: np.ndarray, theta: np.ndarray,
                        fixed_shape: Sequence[int]) -> np.ndarray:
    """warp_3d's displacement (normalised units of the moving grid) of a dense displacement
    in fixed voxels (1, D, H, W, 3): x maps to T(x + d(x)), so d enters through theta's
    linear part, ``theta[:, :3] @ (d * 2 / (size - 1))``."""
    scale = voxel_to_normalised(fixed_shape, displacement.dtype)
    return (displacement * scale) @ theta[0, :, :3].T.astype(displacement.dtype)


def _moving_linear(theta: np.ndarray, full_shape: Sequence[int], dtype) -> np.ndarray:
    """The 3x3 map of a displacement in fixed voxels (channels x, y, z) to warp_3d's
    (``moving_displacement``). Both it and the upsampling of a control grid are linear, the
    one point by point, the other channel by channel: applied to the few control points
    before the upsampling (and its transpose after the upsampling's backward), it costs
    nothing."""
    return theta[0, :, :3].astype(dtype) * voxel_to_normalised(full_shape, dtype)


def affine_objective(params: np.ndarray, fixed: np.ndarray, moving: np.ndarray, frame: Frame,
                     loss: str = "ncc", *, window: int = 5,
                     measure: Measure | None = None, interp: str = "bilinear",
                     buffers: StepBuffers | None = None) -> tuple[float, np.ndarray, float]:
    """The affine stage's objective at one resolution, and its gradient.

    Parameters
    ----------
    params : ndarray, shape (3, 4)
        The world affine about the fixed field of view's centre (``Frame``).
    fixed, moving : ndarray
        The volumes at this resolution, each on its own grid (``moving`` as ``objective``
        takes it).
    frame : Frame
        The two images' geometry.
    loss, window, measure, interp, buffers
        As for ``objective``.

    Returns
    -------
    (value, grad, similarity) : the loss ``sign * similarity``, d value / d params (3, 4),
    and the similarity as reported.
    """
    measure = measure or similarity_measure(loss, fixed, window)
    sim, grad_theta, _ = _similarity_gradient(measure, moving, frame.theta(params, moving.dtype),
                                              None, (True, False), interp, buffers)
    return measure.sign * sim, frame.gradient(grad_theta.astype(np.float64)), sim


def objective(control: np.ndarray, fixed: np.ndarray, moving: np.ndarray, loss: str = "ncc",
              weight: float = 0.0, *, theta: np.ndarray | None = None,
              full_shape: Sequence[int] | None = None, window: int = 5,
              measure: Measure | None = None, interp: str = "bilinear",
              buffers: StepBuffers | None = None) -> tuple[float, np.ndarray, float]:
    """The deformable stage's objective at one resolution, and its gradient.

    Parameters
    ----------
    control : ndarray, shape (1, cd, ch, cw, 3)
        Control-point displacements, channels (x, y, z), in voxels of ``full_shape``.
    fixed, moving : ndarray
        The volumes at this resolution, each on its own grid, of ``control``'s dtype;
        ``moving`` as ``interpolant(moving, interp)`` gives it (for "bspline", its spline
        coefficients).
    loss : {"mse", "ncc", "mi"}
        The similarity term (NCC and MI enter negated, so that lower is better).
    weight : float
        Weight of the smoothness penalty.
    theta : ndarray, shape (1, 3, 4), optional
        The affine part (``Frame.theta``); default the identity (one grid for both).
    full_shape : (int, int, int), optional
        The fixed volume's full-resolution shape, whose voxels measure displacements
        (default ``fixed.shape``).
    window : int
        Box size of the local NCC.
    measure : optional
        ``similarity_measure(loss, fixed, window)``, built once and reused across steps
        (default: built here).
    interp : {"bilinear", "bicubic", "bspline"}
        The mode ``moving`` is sampled in.
    buffers : StepBuffers, optional
        Where the step's volumes go, kept across the steps of a level (default: new ones).

    Returns
    -------
    value : float
        ``sign * similarity + weight * smoothness``.
    grad : ndarray
        d value / d control, ``control``'s shape and dtype.
    similarity : float
        The similarity term alone, as reported (MSE, or NCC positive).
    """
    measure = measure or similarity_measure(loss, fixed, window)
    full_shape = tuple(full_shape or fixed.shape)
    dtype = control.dtype
    theta = (np.eye(3, 4, dtype=dtype)[None] if theta is None else theta).astype(dtype)
    linear = _moving_linear(theta, full_shape, dtype)
    buffers = StepBuffers() if buffers is None else buffers
    # the dense displacement only where the warps read it: the measure's parts
    regions = _regions(measure)
    moved = _dense_parts(np.ascontiguousarray(control @ linear.T), regions, fixed.shape,
                         buffers)
    sim, _, grad_moved = _similarity_gradient(measure, moving, theta, moved, (False, True),
                                              interp, buffers)
    grad = _dense_parts_adjoint(grad_moved, regions, fixed.shape, control.shape,
                                buffers) @ linear
    spacing = [(n - 1) / (c - 1) for n, c in zip(full_shape, control.shape[1:4])]
    penalty, grad_penalty = smoothness(control, spacing)
    return (measure.sign * sim + weight * penalty, grad + dtype.type(weight) * grad_penalty,
            sim)
