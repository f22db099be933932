"""The tables of named choices every front door and backend reads: sampling modes, padding
modes and the units of a warp's displacement.

A choice has one kernel integer, the one the backends and the torch custom ops take
(PyTorch's ``GridSamplerInterpolation`` / ``GridSamplerPadding`` values where PyTorch has
the choice). The NumPy and torch APIs name it by string, the custom ops by that integer,
``volsample.aclnn`` by CANN's integer where CANN has the choice. Each front door turns its
form into the kernel integer here, once; the C++ core's enums (``src/cpp/tensor.h``) hold
the same integers, which a test checks. Adding an interpolation mode is one entry in
``MODES`` (its weights from ``_weights``) and its weights in each backend's language.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from . import _weights
from ._errors import InvalidArgumentError


@dataclass(frozen=True)
class Choice:
    name: str
    code: int               # the kernel integer
    cann: int | None = None  # CANN's integer, None where CANN lacks the choice


@dataclass(frozen=True)
class Mode(Choice):
    taps: int = 2                # taps per axis (1 nearest, 2 linear, 4 cubic)
    grid_gradient: bool = True  # False: piecewise constant, grad_grid is exactly 0
    # The taps' weights and their derivatives along an axis (``_weights``); None: nearest
    weights: Callable | None = None


C = TypeVar("C", bound=Choice)


class Table(Generic[C]):
    """The choices of one argument, found by name, kernel integer or CANN integer."""

    def __init__(self, argument: str, choices: Iterable[C]):
        self.argument = argument
        self.choices = tuple(choices)
        self._by_name = {c.name: c for c in self.choices}
        self._by_code = {c.code: c for c in self.choices}
        self._by_cann = {c.cann: c for c in self.choices if c.cann is not None}
        self._aliases: dict[str, str] = {}  # another name -> the choice's name

    def alias(self, name: str, of: str) -> None:
        """Accept ``name`` wherever the choice ``of`` is named by string (``code``)."""
        if of not in self._by_name or name in self._by_name:
            raise KeyError(f"{self.argument}: {name!r} cannot stand for {of!r}")
        self._aliases[name] = of

    def __getitem__(self, name: str) -> C:
        return self._by_name[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def code(self, name) -> int:
        """The kernel integer of a choice named by string, or by one of its aliases (the
        NumPy and torch APIs)."""
        if isinstance(name, str):
            name = self._aliases.get(name, name)
        if not isinstance(name, str) or name not in self._by_name:
            also = "".join(f" ({alias!r} is another name of {of!r})"
                           for alias, of in self._aliases.items())
            raise InvalidArgumentError(
                f"{self.argument}: expected one of {', '.join(map(repr, self._by_name))}, "
                f"got {name!r}{also}", argument=self.argument, kind="choice", value=name)
        return self._by_name[name].code

    def check_code(self, code, argument: str | None = None) -> int:
        """A kernel integer itself (the custom ops' integer arguments), checked."""
        if not _is_int(code) or code not in self._by_code:
            options = ", ".join(f"{c.code} ({c.name})" for c in self.choices)
            argument = argument or self.argument
            raise InvalidArgumentError(f"{argument}: expected one of {options}, got {code!r}",
                                       argument=argument, kind="choice", value=code)
        return int(code)

    def from_cann(self, value, argument: str) -> int:
        """The kernel integer of CANN's integer ``value`` (volsample.aclnn)."""
        if not _is_int(value) or value not in self._by_cann:
            options = ", ".join(f"{c.cann} ({c.name})" for c in self._by_cann.values())
            raise InvalidArgumentError(f"{argument}: expected one of {options}, got {value!r}",
                                       argument=argument, kind="choice", value=value)
        return self._by_cann[value].code

    def of(self, code: int) -> C:
        """The choice of a (checked) kernel integer."""
        return self._by_code[code]


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


MODES = Table("mode", [
    Mode("bilinear", 0, cann=0, taps=2, weights=_weights.linear),
    Mode("nearest", 1, cann=1, taps=1, grid_gradient=False),
    Mode("bicubic", 2, cann=None, taps=4, weights=_weights.cubic_convolution),
    Mode("bspline", 3, cann=None, taps=4, weights=_weights.cubic_bspline),
])
PADDINGS = Table("padding_mode", [
    Choice("zeros", 0, cann=0),
    Choice("border", 1, cann=1),
    Choice("reflection", 2, cann=2),
])

# What a displacement of 1 moves a warp's sample point by: one normalised unit (the grid's
# own unit, PyTorch's affine_grid + displacement), or one voxel of the sampled volume (as
# VoxelMorph's and MONAI's fields are).
UNITS = Table("displacement_units", [
    Choice("normalized", 0),
    Choice("voxels", 1),
])

BILINEAR, NEAREST = MODES["bilinear"].code, MODES["nearest"].code
ZEROS, BORDER, REFLECTION = (PADDINGS[name].code for name in ("zeros", "border", "reflection"))
NORMALIZED, VOXELS = UNITS["normalized"].code, UNITS["voxels"].code

# PyTorch calls trilinear sampling of a volume "bilinear" (its grid_sample keeps the 2-D
# name); "trilinear", what it is, is accepted too.
MODES.alias("trilinear", "bilinear")
