"""``spline_coefficients`` for PyTorch: the cubic B-spline prefilter of ``mode="bspline"``
(``volsample.spline``), differentiable.

The prefilter is linear: its backward is its exact adjoint (``spline_coefficients_adjoint``),
and the adjoint's own backward the prefilter again, so derivatives of any order and both AD
modes hold. Plain CPU tensors run the NumPy API's computation (``volsample._prefilter``)
on views of their memory (float64, rounded once to the volume's dtype). Other tensors (on
CUDA, or batched by PyTorch's gradient checks) run the same linear map in torch ops: along
each axis, the inverse of the axis' tridiagonal system (``_prefilter.inverse``, computed
once per size in float64 on the host) applied as a matrix product in float64, which
agrees with the NumPy solve to float64 round-off, rounded once to the volume's dtype.
"""
from __future__ import annotations

import torch

from .. import _checks, _prefilter
from .._tables import PADDINGS
from . import _dispatch, _memory, _operands, _wording

SPLINE = "spline_coefficients"  # the operator, in errors (volsample's own words)


def _filter(volume, padding: int, align_corners: bool, adjoint: bool):
    """The prefilter (or its adjoint) of ``volume``: its shape, dtype and memory format."""
    if not _dispatch.plain_cpu(volume):  # on CUDA, or batched by PyTorch's gradient checks
        out = torch.empty_like(volume)  # the volume's memory format
        return out.copy_(_device_filter(volume, padding, align_corners, adjoint))
    out = _memory.empty_volume(volume.shape, volume)
    if volume.numel() == 0:
        return out
    coefficients = _prefilter.filtered(_memory.read_only_array(volume), padding, align_corners,
                                       adjoint)
    _memory.writable_array(out)[...] = coefficients  # type: ignore[index]  # not None
    return out


def _device_filter(volume, padding: int, align_corners: bool, adjoint: bool):
    """The prefilter in torch ops on ``volume``'s device, in float64: per axis, the inverse
    of the axis' system (its transpose for the adjoint)."""
    x = volume.to(torch.float64)
    for axis in (2, 3, 4):  # the axes' maps commute: they act on different axes
        inverse = torch.tensor(_prefilter.inverse(x.shape[axis], padding, align_corners),
                               device=x.device)
        x = torch.tensordot(inverse.T if adjoint else inverse, x, dims=([1], [axis]))
        x = x.movedim(0, axis)
    return x


class _Prefilter(_dispatch.Function):
    """The prefilter (``adjoint`` False) or its adjoint (True): linear, each the other's
    transpose."""

    @staticmethod
    def forward(volume, padding, align_corners, adjoint):
        return _filter(volume, padding, align_corners, adjoint)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.arguments = inputs[1:]

    @staticmethod
    def backward(ctx, grad):
        padding, align_corners, adjoint = ctx.arguments
        return _Prefilter.apply(grad, padding, align_corners, not adjoint), None, None, None

    @staticmethod
    def jvp(ctx, tangent, *_):
        return _Prefilter.apply(tangent, *ctx.arguments)

    @staticmethod
    def vmap(info, in_dims, volume, padding, align_corners, adjoint):
        # Each (n, c) volume is filtered alone: the vmapped dimension folds into N.
        folded, = _dispatch.fold_into_n(info.batch_size, in_dims[:1], (volume,))
        return _dispatch.unfold_n(_Prefilter.apply(folded, padding, align_corners, adjoint),
                                  info.batch_size)


def spline_coefficients(volume: torch.Tensor, padding_mode: str = "border",
                        align_corners: bool = False) -> torch.Tensor:
    """The cubic B-spline coefficients of a volume: the prefilter of ``mode="bspline"``,
    differentiable (its backward is the exact adjoint).

    ``grid_sample(spline_coefficients(v, p, a), grid, "bspline", p, a)`` interpolates
    ``v``: at the voxel centres it gives ``v`` back (to round-off), and between them the
    cubic spline through the voxels, extended beyond the volume as padding ``p`` says
    (``volsample.spline_coefficients``).

    Parameters
    ----------
    volume : Tensor, shape (N, C, D, H, W)
        float16, bfloat16, float32 or float64; any strides or memory format; on the CPU or
        a CUDA device.
    padding_mode : {"zeros", "border", "reflection"}
        The padding the coefficients will be sampled with.
    align_corners : bool
        As the sampling call's (it decides the reflection's mirror).

    Returns
    -------
    Tensor, the shape, dtype and memory format of ``volume``, computed in float64 and
    rounded once (16-bit volumes too; their gradients likewise).

    Notes
    -----
    CPU tensors run ``volsample.spline_coefficients`` (the same bits); CUDA tensors the
    same linear map as a float64 matrix product per axis on the device (equal to float64
    round-off). Not an op of ``torch.ops.volsample``: ``torch.compile`` runs it eagerly,
    with a graph break. ``torch.func`` transforms (``vmap``, ``jacrev``, ``jacfwd``) work.

    Examples
    --------
    >>> import torch, volsample.torch as vt
    >>> v = torch.arange(24.0, dtype=torch.float64).reshape(1, 1, 2, 3, 4) ** 2
    >>> c = vt.spline_coefficients(v, "border", align_corners=True)
    >>> last = torch.ones(1, 1, 1, 1, 3, dtype=torch.float64)  # the last voxel's centre
    >>> vt.grid_sample(c, last, "bspline", "border", True).flatten().round(decimals=9)
    tensor([529.], dtype=torch.float64)
    """
    with _wording.torch_errors(SPLINE):
        _operands.tensor("volume", volume)
        _checks.volume_dtype("volume", _operands.operand("volume", volume).dtype,
                             _operands.TORCH.spell)
        padding = PADDINGS.code(padding_mode)
        align_corners = _checks.boolean("align_corners", align_corners)
        _checks.nonempty_spatial("volume", volume.shape[2:])
    return _Prefilter.apply(volume, padding, align_corners, False)
