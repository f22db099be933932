"""``patch()``: route 5-D ``F.grid_sample`` and 5-D trilinear ``F.interpolate`` (and so
``nn.Upsample`` and the libraries that call them) to volsample, without editing the
calling code. Everything volsample does not cover falls through to PyTorch unchanged.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ._grid_sample import grid_sample
from ._upsample import upsample_trilinear

_ORIGINAL: dict[str, Any] = {"grid_sample": F.grid_sample, "interpolate": F.interpolate}
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# F.grid_sample's modes (PyTorch has bicubic for 4-D only: volsample samples it in 5-D);
# "bspline" is volsample's own, not F.grid_sample's.
_PYTORCH_MODES = ("bilinear", "nearest", "bicubic")


def _volume(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 5 and t.dtype in _FLOATS


def _grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    if (_volume(input) and isinstance(grid, torch.Tensor) and grid.dim() == 5
            and mode in _PYTORCH_MODES
            and padding_mode in ("zeros", "border", "reflection")):
        return grid_sample(input, grid, mode, padding_mode, align_corners)
    return _ORIGINAL["grid_sample"](input, grid, mode, padding_mode, align_corners)


def _interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None, antialias=False):
    if (mode == "trilinear" and _volume(input) and not recompute_scale_factor
            and not antialias):
        return upsample_trilinear(input, size, scale_factor, align_corners)
    return _ORIGINAL["interpolate"](input, size, scale_factor, mode, align_corners,
                                    recompute_scale_factor, antialias)


class patch:
    """Route ``torch.nn.functional.grid_sample`` on 5-D input and
    ``torch.nn.functional.interpolate(mode="trilinear")`` to volsample.

    Use it as a function (``volsample.torch.patch()``, undone by ``unpatch()``) or as a
    context manager (``with volsample.torch.patch(): ...``, undone on exit). 5-D
    ``grid_sample`` takes PyTorch's modes, ``bicubic`` included (PyTorch 2.13 has it for
    4-D input only); ``bspline`` is not PyTorch's mode and stays PyTorch's error. Calls fall
    through to PyTorch for 4-D (or other) inputs, other modes (``nearest``/``area``/... for
    interpolate), non-float tensors, and for interpolate's ``recompute_scale_factor=True``
    and ``antialias=True``. ``align_corners=None`` means
    False, as in PyTorch (volsample does not repeat PyTorch's warning).
    """

    def __init__(self) -> None:
        F.grid_sample = _grid_sample
        F.interpolate = _interpolate

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        unpatch()
        return False


def unpatch() -> None:
    """Give ``F.grid_sample`` and ``F.interpolate`` back their PyTorch implementations."""
    F.grid_sample = _ORIGINAL["grid_sample"]
    F.interpolate = _ORIGINAL["interpolate"]
