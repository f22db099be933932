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
   values as the whole field's there), and the gradient runs back from them alone.

The objective is an image similarity (MSE or local NCC), plus a smoothness penalty on the
control grid in the deformable stage; Adam takes the steps. Coarse-to-fine: each level
halves the images' resolution (corner voxel centres kept: align_corners=True, so theta
and the normalised coordinates hold at every level) and doubles the control spacing.

Conventions
-----------
Volumes are 3-D arrays indexed (D, H, W) = NIfTI's voxel axes (i, j, k); affines map
(i, j, k, 1) to world millimetres. Inside this module displacements are stored in
grid_sample's channel order (x, y, z), i.e. along (W, H, D), in voxels of the full
resolution fixed volume. ``RegistrationResult.displacement`` is d in world millimetres
instead (the fixed image's world axes), and ``RegistrationResult.transform`` is T.

The demo's synthetic pair (``synthetic_pair``) is a procedural phantom of nested soft
ellipsoids and blobs, with a label map, and a known smooth deformation of it.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _coords, _dtypes, _layout
from .._checks import InvalidArgumentError
from .._cpu import similarity as _similarity_kernels
from .._cpu import upsample as _upsample_kernels
from ..grid_sample import grid_sample_3d
from ..spline import spline_coefficients
from ..upsample import upsample_trilinear_3d
from ..warp import warp_3d, warp_3d_backward

_SAMPLING: dict[str, Any] = dict(padding_mode="border", align_corners=True)  # of every image warp
INTERPOLATIONS = ("bilinear", "bicubic", "bspline")  # the modes the optimisation samples in
_NCC_EPS = 1e-5  # keeps the local NCC finite (and 0) in flat windows
_MIN_LEVEL_SIZE = 8  # coarse pyramid levels keep at least this many voxels per axis


# ---------------------------------------------------------------------------------------
# Coordinates and the free-form deformation
# ---------------------------------------------------------------------------------------


def identity_grid(shape: Sequence[int], dtype: npt.DTypeLike = np.float32) -> np.ndarray:
    """The identity sampling grid of a (D, H, W) volume, shape (1, D, H, W, 3).

    Channels are (x, y, z) in [-1, 1], the centres of the corner voxels at +-1
    (align_corners=True).
    """
    z, y, x = np.meshgrid(*(np.linspace(-1, 1, n, dtype=dtype) for n in shape), indexing="ij")
    return np.stack([x, y, z], axis=-1)[None]


def voxel_to_normalised(shape: Sequence[int], dtype: npt.DTypeLike = np.float32) -> np.ndarray:
    """Per-channel (x, y, z) factors turning voxel displacements of a (D, H, W) volume
    into normalised ones (align_corners=True): ``2 / (size - 1)``."""
    D, H, W = shape
    return np.array([2 / (W - 1), 2 / (H - 1), 2 / (D - 1)], dtype)


def dense_displacement(control: np.ndarray, shape: Sequence[int], *,
                       out: np.ndarray | None = None) -> np.ndarray:
    """The dense displacement of a control grid, shape (1, D, H, W, 3) (into ``out``, when
    given).

    ``control`` has shape (1, cd, ch, cw, 3) (channels last, as the grid): each channel is
    upsampled trilinearly with align_corners=True, so the control points sit on the corner
    voxels and spread evenly between them.
    """
    return upsample_trilinear_3d(control, size=tuple(shape), align_corners=True, layout="NDHWC",
                                 out=out)


def warp(volume: np.ndarray, displacement: np.ndarray, mode: str = "bilinear",
         scale: np.ndarray | None = None) -> np.ndarray:
    """Sample ``volume`` (D, H, W) at ``p + displacement(p)`` for every voxel p.

    ``displacement`` is (1, D, H, W, 3) in voxels, channels (x, y, z); ``scale`` turns it
    into normalised units (default ``voxel_to_normalised(volume.shape)``). Points outside
    the volume read its border. ``mode="nearest"`` suits label maps, integer ones too
    (uint8, int16, int32: their values are copied exactly, on a float32 grid). The grid is
    formed, ``identity_grid + displacement * scale``, as ``volsample.dask.warp`` forms it
    chunk by chunk (bit for bit); ``register`` warps with ``warp_3d`` instead.
    """
    coords = volume.dtype if volume.dtype.kind == "f" else np.dtype(np.float32)
    if scale is None:
        scale = voxel_to_normalised(volume.shape, coords)
    grid = identity_grid(displacement.shape[1:4], coords) + displacement * scale
    return grid_sample_3d(volume[None, None], grid, mode=mode, **_SAMPLING)[0, 0]


def control_shape(shape: Sequence[int], spacing: float) -> tuple[int, ...]:
    """Control-grid size covering a (D, H, W) volume with points ``spacing`` voxels apart
    (at least 2 per axis, so that the corners carry points)."""
    return tuple(max(2, math.ceil((n - 1) / spacing) + 1) for n in shape)


def refine(control: np.ndarray, size: Sequence[int]) -> np.ndarray:
    """A control grid resampled to ``size`` points per axis describing (nearly, exactly
    when each cell is split in two) the same dense displacement."""
    if tuple(size) == control.shape[1:4]:
        return control
    return upsample_trilinear_3d(control, size=tuple(size), align_corners=True, layout="NDHWC")


# ---------------------------------------------------------------------------------------
# Physical space: voxel-to-world affines and warp_3d's theta
# ---------------------------------------------------------------------------------------


def grid_to_voxel(shape: Sequence[int]) -> np.ndarray:
    """The 4x4 map from warp coordinates (x, y, z, 1), normalised with align_corners=True,
    to voxel indices (i, j, k, 1) of a (D, H, W) volume: x spans W (k), y H (j), z D (i)."""
    D, H, W = shape
    m = np.zeros((4, 4))
    for row, column, size in ((0, 2, D), (1, 1, H), (2, 0, W)):
        m[row, column] = m[row, 3] = (size - 1) / 2
    m[3, 3] = 1
    return m


def _homogeneous(matrix) -> np.ndarray:
    """A 3x4 matrix with the row (0, 0, 0, 1) below it."""
    return np.vstack([matrix, [0.0, 0.0, 0.0, 1.0]])


@dataclasses.dataclass(frozen=True)
class Frame:
    """How warp_3d's theta follows a world affine T of two images.

    T maps a fixed world point x to the moving world point T x. It is held as the 3x4
    ``params`` S of the same map about the fixed field of view's centre c,
    ``T = C S C^-1`` (C: translation by c), so that its linear part and translation (mm)
    are about independent. Then ``theta = (P S Q)[:3]`` with ``P = moving grid <- moving
    voxels <- world, times C`` and ``Q = C^-1, times world <- fixed voxels <- fixed grid``,
    and dLoss/dS = P^T G Q^T, G being grad_theta with a row of zeros below it.
    """

    left: np.ndarray    # P, 4x4
    right: np.ndarray   # Q, 4x4
    centre: np.ndarray  # C, 4x4

    @classmethod
    def of(cls, fixed_shape, fixed_affine, moving_shape, moving_affine) -> Frame:
        centre = np.eye(4)
        centre[:3, 3] = (fixed_affine @ np.append((np.array(fixed_shape) - 1) / 2, 1))[:3]
        left = np.linalg.inv(grid_to_voxel(moving_shape)) @ np.linalg.inv(moving_affine) @ centre
        right = np.linalg.inv(centre) @ fixed_affine @ grid_to_voxel(fixed_shape)
        return cls(left, right, centre)

    def theta(self, params: np.ndarray, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """warp_3d's theta (1, 3, 4) of the parameters S, in ``dtype`` (the volumes')."""
        return (self.left @ _homogeneous(params) @ self.right)[None, :3].astype(dtype)

    def gradient(self, grad_theta: np.ndarray) -> np.ndarray:
        """dLoss/dS (3x4) of dLoss/dtheta (1, 3, 4)."""
        return (self.left.T @ np.vstack([grad_theta[0], np.zeros(4)]) @ self.right.T)[:3]

    def transform(self, params: np.ndarray) -> np.ndarray:
        """T (4x4), world to world."""
        return self.centre @ _homogeneous(params) @ np.linalg.inv(self.centre)


IDENTITY_PARAMS = np.eye(3, 4)  # T = I: the headers' alignment


# ---------------------------------------------------------------------------------------
# Box filters, similarity losses and the smoothness penalty
# ---------------------------------------------------------------------------------------


def box_sum(volume: np.ndarray, radius: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """Sum over the (2 radius + 1)^3 window around every voxel of a (D, H, W) volume; the
    window is cut at the border (zero padding). float32 and float64 are summed in their own
    dtype (other dtypes as float64), into ``out`` when given (not ``volume``).

    The C++ core sums along D, then H and W, each window's terms in index order: the same
    bits for any thread count. The operator is symmetric (voxel i's window holds j exactly
    when j's holds i), so it is its own adjoint.
    """
    if volume.dtype not in (np.float32, np.float64):
        volume = volume.astype(np.float64)
    volume = np.ascontiguousarray(volume)
    if out is None:
        out = np.empty_like(volume)
    _similarity_kernels.box_sum(volume, out, radius)
    return out


def blur(volume: np.ndarray, radius: int, passes: int = 2) -> np.ndarray:
    """Local mean over (2 radius + 1)^3 windows, ``passes`` times (close to a Gaussian of
    variance ``passes * radius * (radius + 1) / 3`` per axis); windows cut at the border
    average what they hold."""
    inverse = _inverse_counts(volume.shape, radius, volume.dtype)
    for _ in range(passes):
        volume = box_sum(volume, radius)
        volume *= inverse
    return volume


def _inverse_counts(shape: Sequence[int], radius: int, dtype) -> np.ndarray:
    """1 / (the number of voxels in each voxel's window, cut at the border), broadcast
    from one factor per axis (the counts are separable)."""
    inverse = np.ones((1, 1, 1), dtype)
    for axis, n in enumerate(shape):
        index = np.arange(n)
        count = (np.minimum(index + radius, n - 1) - np.maximum(index - radius, 0) + 1)
        inverse = inverse * (1 / count.astype(dtype)).reshape(
            [-1 if a == axis else 1 for a in range(3)])
    return inverse


class MeanSquares:
    """Mean squared difference to ``fixed``: called with a warped volume, returns the value
    and its gradient with respect to that volume (lower is better)."""

    sign = 1

    def __init__(self, fixed: np.ndarray, window: int = 5) -> None:
        self.fixed = fixed
        self.box = _WHOLE  # every voxel counts
        self.parts = (_WHOLE,)
        self.full_shape = fixed.shape

    def value(self, warped: np.ndarray) -> float:
        """The similarity alone."""
        diff = warped - self.fixed
        return float(np.mean(diff * diff))

    def __call__(self, warped: np.ndarray, sign: int = 1) -> tuple[float, np.ndarray]:
        """(value, the gradient of ``sign`` times the value)."""
        diff = warped - self.fixed
        return float(np.mean(diff * diff)), diff * diff.dtype.type(sign * 2 / diff.size)


class LocalNCC:
    """Mean local normalised cross-correlation with ``fixed`` (higher is better).

    Over every voxel's ``window``^3 box, ``cc = cov(F, J)^2 / (var F var J + eps)``, the
    squared correlation coefficient (0 in flat boxes, 1 for a local linear match), as in
    VoxelMorph; the value is its mean over voxels. What depends on the fixed volume alone
    (its window sums and variances) is computed once, here; each call runs the C++ kernel
    (``src/cpp/local_ncc.cpp``: the window sums of J, J^2 and F J, the value, and back
    through the sums to the gradient) in four volumes kept across calls.

    A box where ``fixed`` is constant has cc = 0 whatever J is, and no gradient: only the
    ``box`` (slices of ``fixed``) around its non-constant part counts (with ``crop``),
    the windows that reach it whole, and the voxels of their windows (a skull-stripped
    brain fills half its bounding volume). ``self.fixed`` is that part; the value is still
    the mean over all of ``fixed``'s voxels (``full_shape``), and the gradient that of the
    part. Within the box, the ``parts`` (slabs along D, each cut to where its windows
    count: ``_slabs``) hold every voxel whose warped value matters; the others are read
    as 0.
    """

    sign = -1

    def __init__(self, fixed: np.ndarray, window: int = 5, *, crop: bool = True) -> None:
        self.radius = window // 2
        fixed = fixed if fixed.dtype in (np.float32, np.float64) else fixed.astype(np.float64)
        self.full_shape = fixed.shape
        self.box: tuple[slice, ...] = _WHOLE
        self.parts: tuple[tuple[slice, ...], ...] = (_WHOLE,)
        if crop:
            rows, columns = _varying(fixed)
            self.box = _varying_box(rows, columns, 2 * self.radius)
            depth, height, width = self.box
            self.parts = _slabs(rows[depth, height], columns[depth, width], 2 * self.radius)
        F = self.fixed = np.ascontiguousarray(fixed[self.box])
        inverse_count = _inverse_counts(F.shape, self.radius, F.dtype)
        self.F_sum = box_sum(F, self.radius)
        square = np.multiply(F, F)
        self.F_var = box_sum(square, self.radius)
        np.multiply(self.F_sum, self.F_sum, out=square)
        square *= inverse_count
        self.F_var -= square
        # the kernel's three window sums, and the gradient: made by the first call that
        # needs them, kept for the next ones
        self.work: np.ndarray | None = None
        self.grad: np.ndarray | None = None

    def _run(self, warped: np.ndarray, grad: np.ndarray | None, sign: int = 1) -> float:
        if self.work is None:
            self.work = np.empty((3,) + self.fixed.shape, self.fixed.dtype)
        if warped.shape != self.fixed.shape:
            warped = warped[self.box]
        warped = np.ascontiguousarray(warped, self.fixed.dtype)
        total = math.prod(self.full_shape)
        mean = _similarity_kernels.local_ncc(self.fixed, self.F_sum, self.F_var, warped,
                                             self.work, grad, self.radius, _NCC_EPS,
                                             sign / total)
        return mean * (self.fixed.size / total)

    def value(self, warped: np.ndarray) -> float:
        """The similarity alone, of a warped volume of ``full_shape`` or of the box's."""
        return self._run(warped, None)

    def __call__(self, warped: np.ndarray, sign: int = 1) -> tuple[float, np.ndarray]:
        """(value, the gradient of ``sign`` times the value) of a warped volume of the box's
        shape (or ``full_shape``); the gradient, of the box's shape, is a buffer of this
        object, which the next call overwrites (the kernel scales it: -1 negates it exactly,
        with no pass of its own)."""
        if self.grad is None:
            self.grad = np.empty_like(self.fixed)
        return self._run(warped, self.grad, sign), self.grad


_WHOLE = (slice(None),) * 3  # a box of a whole volume


def _varying(volume: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where ``volume`` (D, H, W) differs from a neighbour along some axis, as the bool
    projections (rows (D, H): some voxel of row (z, y) varies; columns (D, W): some voxel
    of column (z, x) does), from one pass of the C++ core over the volume."""
    volume = np.ascontiguousarray(volume)
    D, H, W = volume.shape
    rows, columns = np.empty((D, H), np.uint8), np.empty((D, W), np.uint8)
    _similarity_kernels.varying(volume, rows, columns)
    return rows.view(bool), columns.view(bool)


def _varying_box(rows: np.ndarray, columns: np.ndarray, margin: int) -> tuple[slice, ...]:
    """The bounding box of the varying voxels (``_varying``'s ``rows`` and ``columns``),
    grown by ``margin`` voxels per side (at least 2 voxels per axis, within the volume; all
    of it when none varies)."""
    box = []
    for n, along in zip(rows.shape + columns.shape[1:],
                        (rows.any(axis=1), rows.any(axis=0), columns.any(axis=0))):
        index = np.flatnonzero(along)
        if index.size == 0:  # a constant volume
            low, high = 0, n
        else:
            low, high = max(0, int(index[0]) - margin), min(n, int(index[-1]) + 1 + margin)
        if high - low < 2:
            low, high = max(0, min(low, n - 2)), max(2, min(n, low + 2))
        box.append(slice(low, high))
    return tuple(box)


_SLAB_PLANES = 16  # planes per slab of ``_slabs``: fewer, and calls cost more than they save


def _slabs(rows: np.ndarray, columns: np.ndarray, margin: int) -> tuple[tuple[slice, ...], ...]:
    """Boxes of a volume holding every voxel within ``margin`` voxels (along each axis) of
    a varying one (``_varying``'s ``rows`` and ``columns``): slabs of ``_SLAB_PLANES``
    planes along D, each cut in (H, W) to the bounding box of such voxels (slabs with none
    are left out). A brain in its bounding box fills a third of it: the slabs skip a fifth
    of the box."""
    (D, H), W = rows.shape, columns.shape[1]
    if D < 2 * _SLAB_PLANES:
        return (_WHOLE,)
    parts = []
    for low in range(0, D, _SLAB_PLANES):
        high = min(D, low + _SLAB_PLANES)
        near = slice(max(0, low - margin), high + margin)
        row_index = np.flatnonzero(rows[near].any(axis=0))
        column_index = np.flatnonzero(columns[near].any(axis=0))
        if row_index.size:
            parts.append((slice(low, high),
                          slice(max(0, int(row_index[0]) - margin),
                                min(H, int(row_index[-1]) + 1 + margin)),
                          slice(max(0, int(column_index[0]) - margin),
                                min(W, int(column_index[-1]) + 1 + margin))))
    return tuple(parts) if parts else (_WHOLE,)


def _within(box: Sequence[slice], part: Sequence[slice], shape: Sequence[int]
            ) -> tuple[slice, ...]:
    """The slices of a volume of ``shape`` of ``part``, slices of its ``box``."""
    region = []
    for outer, inner, n in zip(box, part, shape):
        low, high, _ = outer.indices(n)
        start, stop, _ = inner.indices(high - low)
        region.append(slice(low + start, low + stop))
    return tuple(region)


def mse(fixed: np.ndarray, warped: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean squared difference and its gradient with respect to ``warped``."""
    return MeanSquares(fixed)(warped)


def local_ncc(fixed: np.ndarray, warped: np.ndarray, window: int = 5) -> tuple[float, np.ndarray]:
    """Mean local normalised cross-correlation (``LocalNCC``) and its gradient with respect
    to ``warped``."""
    return LocalNCC(fixed, window)(warped)


# name -> the similarity's class: built on a fixed volume, called on warped ones
SIMILARITIES: dict[str, type[MeanSquares] | type[LocalNCC]] = {
    "mse": MeanSquares,
    "ncc": LocalNCC,
}


def similarity(metric: str, fixed: np.ndarray, warped: np.ndarray, window: int = 5) -> float:
    """The similarity ``metric`` ("mse" or "ncc") of two volumes."""
    return _similarity(metric)(fixed, window).value(warped)


def _similarity(metric):
    """The similarity class of ``metric``."""
    if metric not in SIMILARITIES:
        raise InvalidArgumentError(
            f"loss: expected one of {', '.join(map(repr, SIMILARITIES))}, got {metric!r}")
    return SIMILARITIES[metric]


def smoothness(control: np.ndarray, spacing: Sequence[float]) -> tuple[float, np.ndarray]:
    """Diffusion penalty of a control grid and its gradient.

    ``sum over axes a of mean((diff_a u / h_a)^2)``: finite differences of the control
    displacements along each axis (D, H, W), over the point spacing ``spacing[a]`` in the
    same voxel units, so about ``|grad u|^2 / 3`` averaged over the volume.
    """
    value, grad = 0.0, np.zeros_like(control)
    for axis, h in zip((1, 2, 3), spacing):
        d = np.diff(control, axis=axis) / control.dtype.type(h)
        value += float(np.mean(d * d))
        t = d * control.dtype.type(2 / (h * d.size))
        grad[_along(axis, slice(1, None))] += t
        grad[_along(axis, slice(None, -1))] -= t
    return value, grad


def _along(axis, index):
    return (slice(None),) * axis + (index,)


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


def similarity_measure(loss: str, fixed: np.ndarray, window: int = 5
                       ) -> MeanSquares | LocalNCC:
    """The similarity ``loss`` ("mse" or "ncc") built on ``fixed``, to be called on warped
    volumes step after step (what depends on ``fixed`` alone is computed once)."""
    return _similarity(loss)(fixed, window)


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
                     measure: MeanSquares | LocalNCC | None = None, interp: str = "bilinear",
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
              measure: MeanSquares | LocalNCC | None = None, interp: str = "bilinear",
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
    loss : {"mse", "ncc"}
        The similarity term (NCC enters negated, so that lower is better).
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


# ---------------------------------------------------------------------------------------
# Optimisation
# ---------------------------------------------------------------------------------------


class Adam:
    """Adam (Kingma & Ba) updating one array in place; ``lr`` is a number or an array of
    steps per parameter (broadcast against it)."""

    def __init__(self, params: np.ndarray, lr: float | np.ndarray,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.t = 0

    def step(self, grad: np.ndarray) -> None:
        b1, b2 = self.betas
        self.t += 1
        self.m += (1 - b1) * (grad - self.m)
        self.v += (1 - b2) * (grad * grad - self.v)
        m_hat = self.m / (1 - b1 ** self.t)
        v_hat = self.v / (1 - b2 ** self.t)
        self.params -= (self.lr * m_hat / (np.sqrt(v_hat) + self.eps)).astype(self.params.dtype)


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


DEFAULT_WEIGHTS = {"mse": 0.001, "ncc": 0.1}  # smoothness weight per loss
# the size of a meaningful change of the objective per loss, for the early stop: NCC lies
# in [0, 1]; the MSE of intensities normalised to [0, 1] rarely starts above 0.1
_SCALES = {"mse": 0.1, "ncc": 1.0}
STALL_STEPS = 10  # steps over which a stalled objective is judged


class _Stall:
    """Fed one objective value per step, says when the best of the last ``STALL_STEPS``
    improves on the best before them by less than ``threshold`` (never when 0)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.values: list[float] = []

    def __call__(self, value: float) -> bool:
        self.values.append(value)
        if not self.threshold or len(self.values) <= STALL_STEPS:
            return False
        recent, before = self.values[-STALL_STEPS:], self.values[:-STALL_STEPS]
        return min(before) - min(recent) < self.threshold


def register(fixed: np.ndarray, moving: np.ndarray, loss: str = "ncc", *,
             fixed_affine: np.ndarray | None = None, moving_affine: np.ndarray | None = None,
             levels: int = 3, iterations: int | Sequence[int] = 100,
             affine_iterations: int | Sequence[int] | None = None,
             grid_spacing: float = 4.0, weight: float | None = None, lr: float = 0.25,
             affine_lr: float = 0.01, window: int = 5, tolerance: float = 1e-3,
             interp: str = "bilinear",
             callback: Callable[[str, int, int, float, float], None] | None = None
             ) -> RegistrationResult:
    """Register ``moving`` to ``fixed``: an affine stage, then a free-form deformation,
    each coarse to fine, in physical space.

    Parameters
    ----------
    fixed, moving : ndarray, shape (D, H, W)
        Volumes, each of any shape (at least 2 voxels per axis), intensities on comparable
        scales (e.g. both in [0, 1]); computed in float32.
    loss : {"mse", "ncc"}
        Similarity: mean squared difference, or local normalised cross-correlation.
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
    weight = DEFAULT_WEIGHTS[loss] if weight is None else weight
    shape = fixed.shape
    frame = Frame.of(shape, fixed_affine, moving.shape, moving_affine)
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
    pyramid = [(factor, fixed_l, interpolant(moving_l, interp))
               for factor, fixed_l, moving_l in reversed(pyramid)]
    history = []

    def record(stage, level, it, value, sim):
        history.append((stage, level, value, sim))
        if callback is not None:
            callback(stage, level, it, value, sim)

    params = IDENTITY_PARAMS.copy()
    voxel_mm = np.linalg.norm(fixed_affine[:3, :3], axis=0).max()
    for level, (factor, fixed_l, moving_l) in enumerate(pyramid):
        step = np.full((3, 4), affine_lr * factor)
        step[:, 3] = lr * factor * voxel_mm
        adam = Adam(params, step)
        measure = similarity_measure(loss, fixed_l, window) if affine_steps[level] else None
        stall = _Stall(tolerance * _SCALES[loss])
        buffers = StepBuffers()
        for it in range(affine_steps[level]):
            value, grad, sim = affine_objective(params, fixed_l, moving_l, frame, measure=measure,
                                                interp=interp, buffers=buffers)
            adam.step(grad)
            record("affine", level, it, value, sim)
            if stall(value):
                break
        del measure, buffers
    theta = frame.theta(params)
    control = np.zeros((1,) + control_shape(shape, grid_spacing * 2 ** (levels - 1)) + (3,),
                       np.float32)
    for level, (factor, fixed_l, moving_l) in enumerate(pyramid):
        control = refine(control, control_shape(shape, grid_spacing * factor))
        adam = Adam(control, lr * factor)
        measure = similarity_measure(loss, fixed_l, window) if steps[level] else None
        stall = _Stall(tolerance * _SCALES[loss])
        buffers = StepBuffers()
        for it in range(steps[level]):
            value, grad, sim = objective(control, fixed_l, moving_l, loss, weight, theta=theta,
                                         full_shape=shape, measure=measure, interp=interp,
                                         buffers=buffers)
            adam.step(grad)
            record("deformable", level, it, value, sim)
            if stall(value):
                break
    # the full resolution's measure (the last level's, made for its steps or now) scores the
    # headers' alignment and the result
    finest = pyramid[-1][2]
    if measure is None:
        measure = similarity_measure(loss, fixed, window)
    del buffers  # the steps' parts
    moved = dense_displacement(control @ _moving_linear(theta, shape, control.dtype).T, shape)
    warped = _sample(finest, theta, moved, shape, interp)
    before, _ = _warp_parts(measure, finest, frame.theta(IDENTITY_PARAMS, finest.dtype), None,
                            interp, StepBuffers())
    similarity = (measure.value(before), measure.value(warped))
    del measure, before
    # d in mm: the voxels' (i, j, k) map to world axes, on the control points (linear);
    # upsampled with the axes reversed, (1, 3, W, H, D), so that its transpose (D, H, W, 3)
    # is laid out as NIfTI stores it (Fortran order): written with no transposing copy
    control_mm = control[0, ..., ::-1] @ fixed_affine[:3, :3].T.astype(np.float32)
    millimetres = upsample_trilinear_3d(control_mm.T[None], size=tuple(shape[::-1]),
                                        align_corners=True)[0].T
    return RegistrationResult(frame.transform(params), millimetres, warped, control, history,
                              fixed_affine, moving_affine, moving.shape, theta, shape,
                              similarity, moved)


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


# ---------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------


_FEW_LABELS = 8  # label ranges compared label by label (three passes each, no index array)
_JOINT_LABELS = 1 << 10  # label ranges counted in one joint histogram (a size^2 table)


def dice(a: np.ndarray, b: np.ndarray) -> float:
    """Mean Dice overlap of two label maps over the labels > 0 present in either."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iub" and b.dtype.kind in "iub" and a.size:
        # integer maps: counted per label (bincount), not compared label by label
        low, high = min(int(a.min()), int(b.min())), max(int(a.max()), int(b.max()))
        if high - max(low, 1) < _FEW_LABELS:  # a few labels > 0 (a brain's tissue classes)
            return _dice_of_labels(a, b, range(max(low, 1), high + 1))
        size = high - low + 1
        if size <= _JOINT_LABELS:  # one pass: the (a, b) pairs' histogram
            index = a.astype(np.intp) * size
            index += b
            index -= low * (size + 1)
            joint = np.bincount(index.ravel(), minlength=size * size).reshape(size, size)
            in_a, in_b, in_both = joint.sum(1), joint.sum(0), np.diagonal(joint)
        elif size <= 1 << 16:  # three passes
            def count(x):
                return np.bincount((x.astype(np.int64) - low).ravel(), minlength=size)
            in_a, in_b, in_both = count(a), count(b), count(a[a == b])
        if size <= 1 << 16:
            labels = np.arange(low, low + size)
            keep = (labels > 0) & (in_a + in_b > 0)
            if not keep.any():
                raise InvalidArgumentError(
                    "dice: expected label maps with some label > 0, got none")
            return float(np.mean(2 * in_both[keep] / (in_a[keep] + in_b[keep])))
    labels = np.union1d(np.unique(a), np.unique(b))
    return _dice_of_labels(a, b, labels[labels > 0])


def _dice_of_labels(a, b, labels) -> float:
    """Mean Dice of two label maps over those of ``labels`` present in either, each label
    compared voxel by voxel."""
    scores = []
    for k in labels:
        in_a, in_b = a == k, b == k
        total = np.count_nonzero(in_a) + np.count_nonzero(in_b)
        if total:
            scores.append(2 * np.count_nonzero(in_a & in_b) / total)
    if not scores:
        raise InvalidArgumentError("dice: expected label maps with some label > 0, got none")
    return float(np.mean(scores))


def deformation_error(displacement: np.ndarray, truth: np.ndarray, mask: np.ndarray) -> float:
    """Mean Euclidean distance (voxels) between two (D, H, W, 3) displacements in ``mask``."""
    return float(np.mean(np.linalg.norm(displacement - truth, axis=-1)[mask]))


# ---------------------------------------------------------------------------------------
# The synthetic pair of the demo
# ---------------------------------------------------------------------------------------

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
