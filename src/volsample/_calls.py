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

from . import _checks, _dtypes, _layout
from ._errors import InvalidArgumentError
from ._tables import MODES, NEAREST


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
    output_mask: tuple[bool, bool] = (True, True)  # the backward's (grad_input, grad_grid)

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
