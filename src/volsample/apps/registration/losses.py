"""The registration's similarity measures (MSE, local NCC, mutual information) and the
smoothness penalty.

``SIMILARITIES`` is the one registry of losses: a name and a class built on the fixed
volume (``Measure(fixed, window)``) whose instances have ``sign`` (+1 when lower is
better, -1 when higher is), ``box``/``parts``/``full_shape`` (where warped values count),
``fixed`` (the fixed volume in the box), ``value(warped)`` and ``__call__(warped, sign)``
-> (value, gradient with respect to the warped box). A new loss joins by adding its class
there (and its defaults to ``DEFAULT_WEIGHTS`` and ``STALL_SCALES``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ... import _backends
from ..._checks import InvalidArgumentError

_similarity_kernels = _backends.cpu("similarity")

_NCC_EPS = 1e-5  # keeps the local NCC finite (and 0) in flat windows
MI_BINS = 32  # joint histogram bins per axis of the mutual information (ANTs', elastix's)
# the intensities the mutual information bins: normalise_intensity's 0.5th and 99.5th
# percentiles
INTENSITY_RANGE = (0.0, 1.0)
# the mutual information counts the voxels within this many voxels of where the fixed
# volume varies (``MutualInformation``); on the MNI152 pairs of ``volsample bench
# --register`` its Dice is that of every voxel counted (within 0.001), at 0.44 of the
# voxels at the finest level
MI_MARGIN = 4


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
            self.box, self.parts = _varying_parts(fixed, 2 * self.radius)
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


class MutualInformation:
    """Mattes mutual information with ``fixed`` (higher is better): for images of different
    contrasts, it asks only that the warped intensity predict the fixed one, through any
    map (``src/cpp/mutual_information.cpp``; Mattes et al. 2003, as elastix's default).

    Both volumes' intensities are binned over ``INTENSITY_RANGE``, the range
    ``normalise_intensity`` maps the 0.5th to 99.5th percentiles onto (values beyond count
    as its ends): the fixed volume's into ``bins`` bins once, here (a box Parzen window),
    the warped one's through cubic B-spline Parzen windows at each call, in the C++ kernel
    that also gives the gradient. The joint histogram is global (``window`` is unused)
    over the voxels within ``MI_MARGIN`` voxels of where ``fixed`` varies: the ``parts``
    of its ``box`` (``LocalNCC``'s slabs; the box's other voxels are left out). The flat
    background of a skull-stripped image, most of its volume, then costs nothing, while
    its rim, where a moving edge meets it, still counts. The value is that histogram's
    MI times ``share``, the counted voxels' share of ``fixed``'s (1 where it varies
    everywhere): its gradient per voxel is then scaled as every voxel's histogram would
    scale it (1 / their number), which keeps its balance with the smoothness penalty (the
    MI alone weighs 1 / ``share`` times as much against it: on the MNI152 pairs, about
    twice, and a mean Dice 0.004 lower).
    """

    sign = -1

    def __init__(self, fixed: np.ndarray, window: int = 5, *, bins: int = MI_BINS) -> None:
        fixed = fixed if fixed.dtype in (np.float32, np.float64) else fixed.astype(np.float64)
        self.full_shape = fixed.shape
        self.box, self.parts = _varying_parts(fixed, MI_MARGIN)
        self.fixed = np.ascontiguousarray(fixed[self.box])
        self.bins = bins
        low, high = INTENSITY_RANGE
        scaled = (np.clip(self.fixed, low, high) - low) * (bins / (high - low))
        self.fixed_bins = np.full(self.fixed.shape, bins, np.uint8)  # bins: left out
        for part in self.parts:
            self.fixed_bins[part] = np.minimum(scaled[part], bins - 1)
        self.share = int(np.count_nonzero(self.fixed_bins < bins)) / math.prod(self.full_shape)
        self.grad: np.ndarray | None = None

    def _run(self, warped: np.ndarray, grad: np.ndarray | None, sign: int = 1) -> float:
        if warped.shape != self.fixed.shape:
            warped = warped[self.box]
        warped = np.ascontiguousarray(warped, self.fixed.dtype)
        return self.share * _similarity_kernels.mutual_information(
            self.fixed_bins, warped, grad, self.bins, *INTENSITY_RANGE, sign * self.share)

    def value(self, warped: np.ndarray) -> float:
        """The similarity alone."""
        return self._run(warped, None)

    def __call__(self, warped: np.ndarray, sign: int = 1) -> tuple[float, np.ndarray]:
        """(value, the gradient of ``sign`` times the value); the gradient is a buffer of
        this object, which the next call overwrites."""
        if self.grad is None:
            self.grad = np.empty_like(self.fixed)
        return self._run(warped, self.grad, sign), self.grad


Measure = MeanSquares | LocalNCC | MutualInformation  # what ``SIMILARITIES`` builds

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


def _varying_parts(fixed: np.ndarray, margin: int
                   ) -> tuple[tuple[slice, ...], tuple[tuple[slice, ...], ...]]:
    """The box (``_varying_box``) and its parts (``_slabs``, slices of the box) holding
    every voxel of ``fixed`` within ``margin`` voxels of a varying one."""
    rows, columns = _varying(fixed)
    box = _varying_box(rows, columns, margin)
    depth, height, width = box
    return box, _slabs(rows[depth, height], columns[depth, width], margin)


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
SIMILARITIES: dict[str, type[Measure]] = {
    "mse": MeanSquares,
    "ncc": LocalNCC,
    "mi": MutualInformation,
}
# smoothness weight per loss. NCC's: on the MNI152 pairs of ``volsample bench --register``
# (two known maps), 1 gives the lowest error against the map, 0.40-0.44 mm (0.1: 0.74, 3:
# 0.43-0.52) and a mean Dice within 0.003 of the exact map's: weaker penalties fit the noise.
# MI's global gradient is weaker and noisier voxel by voxel than the local NCC's: on the
# pairs at 2 mm (free-form model), 0.1 let the grid wander (Dice 0.81 where the contrast is
# remapped), 2 to 10 gave the best Dice (0.876)
DEFAULT_WEIGHTS = {"mse": 0.001, "ncc": 1.0, "mi": 10.0}
# the size of a meaningful change of the objective per loss, for the early stop: NCC lies
# in [0, 1]; the MSE of intensities normalised to [0, 1] rarely starts above 0.1; the MI of
# two brains in 32 bins, about 0.5 to 1.5 nats
STALL_SCALES = {"mse": 0.1, "ncc": 1.0, "mi": 1.0}


def similarity(metric: str, fixed: np.ndarray, warped: np.ndarray, window: int = 5) -> float:
    """The similarity ``metric`` ("mse", "ncc" or "mi") of two volumes."""
    return _similarity(metric)(fixed, window).value(warped)


def _similarity(metric):
    """The similarity class of ``metric``."""
    if metric not in SIMILARITIES:
        raise InvalidArgumentError(
            f"loss: expected one of {', '.join(map(repr, SIMILARITIES))}, got {metric!r}")
    return SIMILARITIES[metric]



def similarity_measure(loss: str, fixed: np.ndarray, window: int = 5
                       ) -> Measure:
    """The similarity ``loss`` (a name of ``SIMILARITIES``) built on ``fixed``, to be called on warped
    volumes step after step (what depends on ``fixed`` alone is computed once)."""
    return _similarity(loss)(fixed, window)


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

