"""The op layer: one checked description of each call, per operator family.

Every front door (the NumPy functions, the torch custom ops, ``volsample.aclnn``,
``volsample.dask``) turns its own arguments into ``Operand``s (argument name, shape, NumPy
dtype) and kernel integers (``_tables``), and calls a builder here. The builder runs every
check of the call, in one place and before any work, and returns a frozen description
that every backend (``_cpu``, ``_triton``) takes: shapes logical (N, C, D, H, W), the
volumes' memory ``layout``, dtypes, integer modes, flags and sizes. Front doors translate
the checks' errors (into PyTorch's exception classes, or CANN's status codes); they do not
check again.

A front door hands shapes over in its own order, ``shape_order``: the NumPy API and aclnn
as stored (NCDHW or NDHWC), torch logically (NCDHW, whatever the memory format). Messages
echo shapes in that order and spell dtypes as the front door's ``Dialect`` says.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple
from collections.abc import Callable

import numpy as np

from . import _checks, _coords, _dtypes, _layout, _prepared
from ._errors import InvalidArgumentError
from ._tables import MODES, NEAREST, VOXELS


def _typed_key(*args, **kwargs):
    """The key of arguments that tells types apart (True and 1 are different arguments)."""
    return tuple(map(typed, args)), tuple((k, typed(v)) for k, v in kwargs.items())


_memoised = _prepared.memoised(_typed_key)


def typed(value):
    """``value`` as a cache key that tells types apart, within sequences too (an
    ``Operand``'s fields have fixed types)."""
    if isinstance(value, Operand):
        return value
    if isinstance(value, (tuple, list)):
        return type(value), tuple(map(typed, value))
    return type(value), value


class Operand(NamedTuple):
    """An operand as a front door hands it over."""
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


def operand(name: str, array) -> Operand:
    """The ``Operand`` of an array (anything with ``shape`` and a NumPy ``dtype``)."""
    return Operand(name, tuple(array.shape), np.dtype(array.dtype))


@dataclass(frozen=True)
class Dialect:
    """How a front door speaks in messages: what it calls an operand, and a dtype (given
    its NumPy name)."""
    noun: str = "array"
    spell: Callable[[str], str] = field(default=lambda name: name)
    names_layout: bool = True  # messages say in which layout a shape is read


NUMPY = Dialect()


def _volume(op: Operand, order: str, dialect: Dialect, labels: bool = False) -> tuple:
    """A 5-D volume operand of a supported dtype; its logical shape."""
    _checks.volume_dtype(op.name, op.dtype, dialect.spell, labels)
    _checks.rank(op.name, op.shape, 5, dialect.noun)
    return _layout.logical_shape(op.shape, order)


def _order(layout, shape_order):
    layout = _layout.check(layout)
    return layout, layout if shape_order is None else shape_order


# ---------------------------------------------------------------------------------------
# Grid sampling
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GridSample:
    """A checked grid-sampling call, forward or backward."""
    input_shape: tuple[int, ...]  # (N, C, Di, Hi, Wi)
    grid_shape: tuple[int, ...]   # (N, Do, Ho, Wo, 3)
    dtype: np.dtype               # of input, output, grad_output and grad_input
    grid_dtype: np.dtype          # of grid and grad_grid
    mode: int
    padding: int
    align_corners: bool
    layout: str = "NCDHW"         # memory order of the volumes
    output_mask: tuple[bool, ...] = (True, True)  # the backward's (grad_input, grad_grid)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.input_shape[:2] + self.grid_shape[1:4]

    @property
    def compute_dtype(self) -> np.dtype:
        return _dtypes.compute_dtype(self.dtype, self.grid_dtype)

    @property
    def points(self) -> int:
        return math.prod(self.grid_shape[:4])

    @property
    def grid_gradient(self) -> bool:
        """Whether the mode has a grid gradient (nearest's is exactly 0)."""
        return MODES.of(self.mode).grid_gradient


@_memoised
def grid_sample(input: Operand, grid: Operand, mode: int, padding: int, align_corners,
                layout="NCDHW", *, shape_order=None, dialect=NUMPY,
                labels: bool = False) -> GridSample:
    """The forward's description. ``mode`` and ``padding`` are kernel integers (the front
    door converted them); ``labels``: integer label maps are taken with nearest."""
    layout, order = _order(layout, shape_order)
    align_corners = _checks.boolean("align_corners", align_corners)
    input_shape = _volume(input, order, dialect, labels and mode == NEAREST)
    _checks.rank(grid.name, grid.shape, 5, dialect.noun)
    # (the input's dtype is supported, so a grid that goes with it is too)
    _checks.grid_dtype(grid.name, grid.dtype, input.name, input.dtype, dialect.spell)
    if grid.shape[-1] != 3:
        raise InvalidArgumentError(
            f"{grid.name}: expected last dimension 3 (x, y, z), got shape {tuple(grid.shape)}",
            argument=grid.name, kind="shape", value=tuple(grid.shape))
    if grid.shape[0] != input_shape[0]:
        raise InvalidArgumentError(f"{grid.name}: expected batch size {input_shape[0]} "
                                   f"({input.name}'s N), got shape {tuple(grid.shape)}",
                                   argument=grid.name, kind="batch", value=grid.shape[0])
    _checks.nonempty_spatial(input.name, input_shape[2:])
    return GridSample(input_shape, tuple(grid.shape), input.dtype, grid.dtype, mode, padding,
                      align_corners, layout)


@_memoised
def grid_sample_backward(grad_output: Operand, input: Operand, grid: Operand, mode: int,
                         padding: int, align_corners, output_mask=(True, True),
                         layout="NCDHW", *, shape_order=None, dialect=NUMPY) -> GridSample:
    """The backward's description: the forward's, and grad_output of the forward's output
    shape and the input's dtype."""
    call = grid_sample(input, grid, mode, padding, align_corners, layout,
                       shape_order=shape_order, dialect=dialect)
    mask = _checks.output_mask(output_mask)
    order = call.layout if shape_order is None else shape_order
    _checks.volume_dtype(grad_output.name, grad_output.dtype, dialect.spell)
    _checks.rank(grad_output.name, grad_output.shape, 5, dialect.noun)
    _checks.same_dtype(grad_output.name, grad_output.dtype, input.name, input.dtype,
                       dialect.spell)
    what = "shape (the forward's output shape" + (f", {order})" if dialect.names_layout else ")")
    _checks.shape_equal(grad_output.name, grad_output.shape,
                        _layout.physical_shape(call.output_shape, order), what)
    return GridSample(call.input_shape, call.grid_shape, call.dtype, call.grid_dtype, mode,
                      padding, call.align_corners, call.layout, mask)


# ---------------------------------------------------------------------------------------
# Warps: grid sampling at affine_grid(theta, size) + displacement, the grid never stored
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Warp:
    """A checked warp call, forward or backward: ``input`` sampled where grid sampling
    would sample it with the grid ``affine_grid(theta, size) + displacement``."""
    input_shape: tuple[int, ...]     # (N, C, Di, Hi, Wi)
    output_spatial: tuple[int, ...]  # (Do, Ho, Wo)
    dtype: np.dtype                  # of input, output, grad_output and grad_input
    coord_dtype: np.dtype            # of theta, displacement and their gradients
    theta: bool                      # given (else the identity)
    displacement: bool               # given (else 0)
    units: int                       # of the displacement (_tables.UNITS)
    mode: int
    padding: int
    align_corners: bool
    layout: str = "NCDHW"            # memory order of the volumes
    # The backward's (grad_input, grad_theta, grad_displacement); never one of an absent
    # operand.
    output_mask: tuple[bool, ...] = (True, True, True)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.input_shape[:2] + self.output_spatial

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """The shape of the grid the warp stands for (and of the displacement)."""
        return self.input_shape[:1] + self.output_spatial + (3,)

    @property
    def theta_shape(self) -> tuple[int, ...]:
        return (self.input_shape[0], 3, 4)

    @property
    def compute_dtype(self) -> np.dtype:
        return _dtypes.compute_dtype(self.dtype, self.coord_dtype)

    @property
    def points(self) -> int:
        return math.prod(self.grid_shape[:4])

    @property
    def grid_gradient(self) -> bool:
        """Whether the mode has a grid gradient (nearest's is exactly 0)."""
        return MODES.of(self.mode).grid_gradient

    @property
    def displacement_scale(self) -> tuple[float, float, float]:
        """Normalised units per displacement unit, per channel (x, y, z)."""
        if self.units != VOXELS:
            return (1.0, 1.0, 1.0)
        D, H, W = self.input_shape[2:]
        x, y, z = (_coords.voxel_step(size, self.align_corners) for size in (W, H, D))
        return (x, y, z)

    @property
    def sample(self) -> GridSample:
        """The grid-sampling call this warp equals (its grid in ``coord_dtype``)."""
        return GridSample(self.input_shape, self.grid_shape, self.dtype, self.coord_dtype,
                          self.mode, self.padding, self.align_corners, self.layout,
                          self.output_mask[:1] + (any(self.output_mask[1:]),))


def warp_output_size(size, input_shape, displacement_spatial=None) -> tuple[int, ...]:
    """The output's (D, H, W) from ``size``: None (the displacement's, else the input's),
    (D, H, W), or (N, C, D, H, W) as ``affine_grid`` takes it (N and C the input's)."""
    if size is None:
        return displacement_spatial or tuple(input_shape[2:])
    try:
        length = len(size)
    except TypeError:
        length = None
    if length not in (3, 5):
        raise InvalidArgumentError(
            f"size: expected None, (D, H, W) or (N, C, D, H, W), got {size!r}",
            argument="size", kind="length", value=size)
    size = _checks.int_sequence("size", size, length, 1)
    if length == 5 and size[:2] != tuple(input_shape[:2]):
        raise InvalidArgumentError(f"size: expected N, C = {tuple(input_shape[:2])} (those of "
                                   f"input), got {size}", argument="size", kind="mismatch",
                                   value=size)
    spatial = size[2:] if length == 5 else size
    if displacement_spatial is not None and spatial != displacement_spatial:
        raise InvalidArgumentError(
            f"size: expected the displacement's spatial size {displacement_spatial}, got {size}",
            argument="size", kind="mismatch", value=size)
    return spatial


@_memoised
def warp(input: Operand, theta: Operand | None, displacement: Operand | None, size, mode: int,
         padding: int, align_corners, units: int, layout="NCDHW", *, shape_order=None,
         dialect=NUMPY, labels: bool = False) -> Warp:
    """The forward's description. ``theta`` (N, 3, 4) and ``displacement`` (N, Do, Ho, Wo,
    3) may be None; ``mode``, ``padding`` and ``units`` are kernel integers; ``labels``:
    integer label maps are taken with nearest."""
    layout, order = _order(layout, shape_order)
    align_corners = _checks.boolean("align_corners", align_corners)
    input_shape = _volume(input, order, dialect, labels and mode == NEAREST)
    _checks.nonempty_spatial(input.name, input_shape[2:])
    coords = [op for op in (theta, displacement) if op is not None]
    for op in coords:
        # (the input's dtype is supported, so coordinates that go with it are too)
        _checks.grid_dtype(op.name, op.dtype, input.name, input.dtype, dialect.spell)
        _checks.same_dtype(op.name, op.dtype, coords[0].name, coords[0].dtype, dialect.spell)
    coord_dtype = coords[0].dtype if coords else None
    if coord_dtype is None:  # no coordinates given: computed in the volume's precision
        coord_dtype = (_dtypes.FLOAT32 if input.dtype in _dtypes.LABELS
                       else _dtypes.compute_dtype(input.dtype))
    N = input_shape[0]
    if theta is not None:
        _checks.rank(theta.name, theta.shape, 3, dialect.noun)
        if tuple(theta.shape) != (N, 3, 4):
            raise InvalidArgumentError(f"{theta.name}: expected shape (N, 3, 4) = {(N, 3, 4)} "
                                       f"(N = {input.name}'s N), got {tuple(theta.shape)}",
                                       argument=theta.name, kind="shape",
                                       value=tuple(theta.shape))
    displacement_spatial = None
    if displacement is not None:
        _checks.rank(displacement.name, displacement.shape, 5, dialect.noun)
        if displacement.shape[0] != N or displacement.shape[-1] != 3:
            raise InvalidArgumentError(
                f"{displacement.name}: expected shape (N, D, H, W, 3) with N = {N} "
                f"({input.name}'s N), got {tuple(displacement.shape)}",
                argument=displacement.name, kind="shape", value=tuple(displacement.shape))
        displacement_spatial = tuple(displacement.shape[1:4])
    spatial = warp_output_size(size, input_shape, displacement_spatial)
    return Warp(input_shape, spatial, input.dtype, coord_dtype, theta is not None,
                displacement is not None, units, mode, padding, align_corners, layout)


@_memoised
def warp_backward(grad_output: Operand, input: Operand, theta: Operand | None,
                  displacement: Operand | None, mode: int, padding: int, align_corners,
                  units: int, output_mask=(True, True, True), layout="NCDHW", *,
                  shape_order=None, dialect=NUMPY) -> Warp:
    """The backward's description: the forward's with the output size of ``grad_output``
    (of the input's N, C and dtype). A gradient of an absent operand is not computed."""
    layout, order = _order(layout, shape_order)
    mask = _checks.output_mask(output_mask, 3)
    _checks.volume_dtype(grad_output.name, grad_output.dtype, dialect.spell)
    _checks.rank(grad_output.name, grad_output.shape, 5, dialect.noun)
    gout = _layout.logical_shape(grad_output.shape, order)
    call = warp(input, theta, displacement, None if displacement else gout[2:], mode, padding,
                align_corners, units, layout, shape_order=shape_order, dialect=dialect)
    _checks.same_dtype(grad_output.name, grad_output.dtype, input.name, input.dtype,
                       dialect.spell)
    what = "shape (the forward's output shape" + (f", {order})" if dialect.names_layout else ")")
    _checks.shape_equal(grad_output.name, grad_output.shape,
                        _layout.physical_shape(call.output_shape, order), what)
    mask = (mask[0], mask[1] and call.theta, mask[2] and call.displacement)
    return Warp(call.input_shape, call.output_spatial, call.dtype, call.coord_dtype, call.theta,
                call.displacement, units, mode, padding, call.align_corners, call.layout, mask)


# ---------------------------------------------------------------------------------------
# Trilinear upsampling
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Upsample:
    """A checked upsampling call, forward or backward (the forward's shapes either way)."""
    input_shape: tuple[int, ...]   # the forward's input, (N, C, Di, Hi, Wi)
    output_shape: tuple[int, ...]  # the forward's output, (N, C, Do, Ho, Wo)
    dtype: np.dtype
    align_corners: bool
    scales: tuple                  # per axis (D, H, W) the forward's factor, or None
    layout: str = "NCDHW"

    @property
    def identity(self) -> bool:
        """No spatial size changes: the call is a copy."""
        return self.input_shape[2:] == self.output_shape[2:]


def upsample_output_size(in_spatial, size, scale_factor, size_name="size"):
    """The output spatial size and per-axis scales (None where ``size`` was given) from
    exactly one of ``size`` and ``scale_factor``: ``out = floor(in * scale)``."""
    if (size is None) == (scale_factor is None):
        got = "both" if size is not None else "neither"
        raise InvalidArgumentError(f"{size_name}, scale_factor: expected exactly one of them, "
                                   f"got {got}", argument=f"{size_name}, scale_factor",
                                   kind="exclusive", value=got)
    if size is not None:
        if isinstance(size, (list, tuple, np.ndarray)):
            return _checks.int_sequence(size_name, size, 3, 1), (None, None, None)
        return (_checks.positive_int(size_name, size),) * 3, (None, None, None)
    scales = _checks.scale_factors("scale_factor", scale_factor, 3)
    out = tuple(math.floor(n * s) for n, s in zip(in_spatial, scales))  # float64, as PyTorch
    if max(out) > _checks.MAX_SIZE:
        raise InvalidArgumentError(
            f"scale_factor: expected an output of at most 2**40 voxels per axis, got "
            f"{tuple(in_spatial)} * {scale_factor!r} -> {out}",
            argument="scale_factor", kind="too_large", value=scale_factor)
    if min(out) < 1:
        raise InvalidArgumentError(
            f"scale_factor: expected an output of at least 1 voxel per axis, got "
            f"{tuple(in_spatial)} * {scale_factor!r} -> {out}",
            argument="scale_factor", kind="too_small", value=scale_factor)
    return out, scales


@_memoised
def upsample(input: Operand, size=None, scale_factor=None, align_corners=False,
             layout="NCDHW", *, scales=None, size_name="size", shape_order=None,
             dialect=NUMPY) -> Upsample:
    """The forward's description, from exactly one of ``size`` and ``scale_factor`` (the
    NumPy and torch APIs), or from the output ``size`` and the ``scales`` that made it (the
    custom op's form, whose ``size_name`` is "output_size": each given scale must give
    that size)."""
    layout, order = _order(layout, shape_order)
    align_corners = _checks.boolean("align_corners", align_corners)
    input_shape = _volume(input, order, dialect)
    _checks.nonempty_spatial(input.name, input_shape[2:])
    out, derived = upsample_output_size(input_shape[2:], size, scale_factor, size_name)
    if scales is not None:
        derived = _checks.scale_factors("scales", tuple(scales), 3)
        implied = tuple(math.floor(n * s) for n, s in zip(input_shape[2:], derived))
        if implied != tuple(out):
            raise InvalidArgumentError(
                f"scales: expected the factors of output_size {tuple(out)}, got {derived}, "
                f"which give {implied} from input size {tuple(input_shape[2:])}",
                argument="scales", kind="mismatch", value=derived)
    return Upsample(input_shape, input_shape[:2] + tuple(out), input.dtype, align_corners,
                    derived, layout)


@_memoised
def upsample_backward(grad_output: Operand, input_size, align_corners=False, scales=None,
                      layout="NCDHW", *, shape_order=None, dialect=NUMPY) -> Upsample:
    """The backward's description: ``input_size`` is the forward's logical input shape,
    ``scales`` its factors (None, or three numbers-or-None; <= 0 counts as None)."""
    layout, order = _order(layout, shape_order)
    align_corners = _checks.boolean("align_corners", align_corners)
    _checks.volume_dtype(grad_output.name, grad_output.dtype, dialect.spell)
    _checks.rank(grad_output.name, grad_output.shape, 5, dialect.noun)
    input_size = _checks.int_sequence("input_size", input_size, 5, 0)
    _checks.nonempty_spatial("input_size", input_size[2:])
    scales = tuple(s if s is not None and s > 0 else None
                   for s in _checks.optional_scales("scales", scales, 3))
    gout = _layout.logical_shape(grad_output.shape, order)
    if gout[:2] != input_size[:2]:
        seen = f"logical shape {gout} ({order})" if dialect.names_layout else f"shape {gout}"
        raise InvalidArgumentError(
            f"{grad_output.name}: expected N, C = {input_size[:2]} (those of input_size), got "
            f"{seen}", argument=grad_output.name, kind="shape", value=gout)
    _checks.nonempty_spatial(grad_output.name, gout[2:])
    return Upsample(input_size, gout, grad_output.dtype, align_corners, scales, layout)
