"""``warp_mse_loss``: the mean squared difference between a warp (``warp``'s ``A x + u(x)``)
and a target, with neither the warped volume nor its gradient ever held whole (but where
the input's own gradient is wanted).

The output is cut into slabs of planes along z. Each slab is warped alone (theta times the
slab's ``_coords.box_map``, its rows of the displacement), reduced to its sum of squares
and, where gradients will be wanted, at once taken back through ``warp_3d_backward``: the
slab's rows of the displacement's gradient, its share of theta's (mapped back by the box
map's transpose) and of the input's. The backward only scales those gradients by the
loss's own. A registration step then holds the displacement's gradient and a slab beside
it, where ``F.mse_loss`` of ``warp`` holds the warped volume until the loss's backward and
the warped volume's gradient through the warp's; and it warps once, as that does. The
slabs follow the shapes alone, so results do not depend on the thread count.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import _backends, _checks, _coords
from .._errors import InvalidArgumentError
from .._tables import MODES, PADDINGS, UNITS
from . import _dispatch, _memory, _operands, _wording
from . import _warp_call
from ._warp import warp_3d, warp_3d_backward

_cpu = _backends.cpu("warp")

_SLAB_ELEMENTS = 1 << 21  # a slab's warped values and displacement rows, about
_REDUCTIONS = ("mean", "sum")


def _slabs(call) -> list[slice]:
    """The z ranges of the output's slabs: near-equal, each about ``_SLAB_ELEMENTS`` warped
    values and displacement components (of every batch item), at least 2 planes where the
    output has them."""
    (N, C), (D, H, W) = call.input_shape[:2], call.output_spatial
    count = max(1, min(D // 2, math.ceil(N * D * H * W * (C + 3) / _SLAB_ELEMENTS)))
    bounds = [D * i // count for i in range(count + 1)]
    return [slice(low, high) for low, high in zip(bounds, bounds[1:])]


def _run(op, *args):
    """``op(*args)`` below autograd (the CPU kernel directly where nothing watches); the op
    itself under torch.compile."""
    if torch.compiler.is_compiling():
        return op(*args)
    return _dispatch.below_autograd(op, *args)


class _WarpMSELoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, target, theta, displacement, mode, padding, align_corners, units,
                reduction, wanted):
        loss, gradients = _loss_and_gradients(input, target, theta, displacement,
                                              (mode, padding, align_corners, units),
                                              reduction, wanted)
        ctx.save_for_backward(*gradients)
        ctx.spent = False
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        if ctx.spent:  # the gradients were handed out (and maybe scaled in place)
            raise RuntimeError(
                "volsample.torch.warp_mse_loss: its gradients are computed with the loss and "
                "handed out by the first backward through it; call warp_mse_loss again for "
                "another backward (retain_graph=True cannot reuse them)")
        ctx.spent = True
        gradients = ctx.saved_tensors
        if not _is_one(grad_loss):
            # Scaled in place (they are the loss's own), except by a batch of incoming
            # gradients (autograd.grad(..., is_grads_batched=True)): a batch of each then.
            batched = not torch.compiler.is_compiling() and _is_legacy_batched(grad_loss)
            gradients = tuple(None if g is None else g * grad_loss if batched
                              else g.mul_(grad_loss) for g in gradients)
        return gradients + (None,) * 6


_is_legacy_batched = torch._C._functorch.is_legacy_batchedtensor


def _is_one(t: torch.Tensor) -> bool:
    """Whether ``t`` is known to be 1 (``loss.backward()``'s seed): a plain CPU scalar,
    read where nothing traces it."""
    return not torch.compiler.is_compiling() and _dispatch.plain_cpu(t) and t.item() == 1


def _loss_and_gradients(input, target, theta, displacement, sampling, reduction, wanted):
    """The loss, and its gradients for (input, target, theta, displacement) where
    ``wanted`` (None elsewhere), slab by slab."""
    want_input, want_target, want_theta, want_displacement = wanted
    call = _warp_call.describe(input, theta, displacement, list(target.shape[2:]), *sampling)
    scale = 2 / (target.numel() if reduction == "mean" else 1)
    grad_input = None  # the one slab's, where wanted
    grad_target = torch.empty_like(target) if want_target else None
    grad_theta = (torch.zeros(theta.shape, dtype=torch.float64, device=theta.device)
                  if want_theta else None)
    grad_displacement = _memory.empty_contiguous(displacement) if want_displacement else None
    total = torch.zeros((), dtype=torch.float64, device=input.device)
    # The input's gradient scatters over the whole input from every slab: one piece, not
    # an input-sized gradient per slab added up.
    slabs = [slice(0, call.output_spatial[0])] if want_input else _slabs(call)
    for slab in slabs:
        m = _box_map(call, slab, input.device)
        slab_theta = _slab_theta(call, m, theta, displacement, whole=len(slabs) == 1)
        slab_displacement = None if displacement is None else displacement[:, slab]
        size = [slab.stop - slab.start, *target.shape[3:]]
        residual = _run(warp_3d, input, slab_theta, slab_displacement, size,
                        *sampling).sub_(target[:, :, slab])
        total += _sum_of_squares(residual)
        if not any(wanted):
            continue
        residual.mul_(scale)
        if want_target:
            torch.neg(residual, out=grad_target[:, :, slab])
        if not (want_input or want_theta or want_displacement):
            continue
        part_input, part_theta = _slab_backward(
            residual, input, slab_theta, slab_displacement, sampling,
            [want_input, want_theta and slab_theta is not None, want_displacement],
            None if grad_displacement is None else grad_displacement[:, slab])
        if want_input:
            grad_input = part_input
        if want_theta:
            grad_theta += part_theta.double() @ m.T
    loss = (total * (scale / 2)).to(input.dtype)
    if want_theta:
        grad_theta = grad_theta.to(theta.dtype)
    return loss, (grad_input, grad_target, grad_theta, grad_displacement)


def _slab_backward(residual, input, theta, displacement, sampling, mask, grad_displacement):
    """warp_3d_backward of a slab: its (grad_input, grad_theta) as ``mask`` asks, and the
    displacement's gradient written into ``grad_displacement`` (the slab's rows of the
    whole one: by the CPU kernel itself where it runs directly, else copied)."""
    operands = (residual, input, theta, displacement)
    if torch.compiler.is_compiling() or not _dispatch.direct(operands + (grad_displacement,)):
        grad_input, grad_theta, part = _run(warp_3d_backward, *operands, *sampling, mask)
        if mask[2]:
            grad_displacement.copy_(part)
        return grad_input, grad_theta
    call = _warp_call.describe_backward(*operands, *sampling, mask)
    grad_input, grad_theta, _ = _warp_call.gradients(call.output_mask[:2] + (False,), input,
                                                     theta, displacement)
    _cpu.backward(call, *map(_warp_call.read, operands), *map(_memory.writable_array, (
        grad_input, grad_theta, grad_displacement if mask[2] else None)))
    return grad_input, grad_theta


def _sum_of_squares(residual: torch.Tensor) -> torch.Tensor:
    """The slab's sum of squares, float64, in at least float32: on the CPU in one thread
    (NumPy's einsum), so that it does not depend on the thread count."""
    if residual.dtype not in (torch.float32, torch.float64):
        residual = residual.float()
    if residual.device.type != "cpu" or torch.compiler.is_compiling():
        return torch.linalg.vecdot(residual.flatten(), residual.flatten()).double()
    values = residual.numpy().reshape(-1)
    return torch.tensor(float(np.einsum("i,i->", values, values)), dtype=torch.float64)


def _box_map(call, slab: slice, device) -> torch.Tensor:
    """The 4x4 map (float64) of the slab's normalised coordinates to the output's."""
    D, H, W = call.output_spatial
    m = _coords.box_map((slab, slice(0, H), slice(0, W)), (D, H, W), call.align_corners)
    return torch.eye(4, dtype=torch.float64, device=device) if m is None else \
        torch.from_numpy(m).to(device)


def _slab_theta(call, m, theta, displacement, whole: bool):
    """Theta for the slab alone: theta (the identity where None) times the slab's map
    ``m``, in the coordinates' dtype; None where the warp has none and the slab is the
    whole output."""
    if theta is None and whole:
        return None
    if theta is None:
        dtype = (displacement.dtype if displacement is not None else
                 torch.from_numpy(np.empty(0, call.coord_dtype)).dtype)
        theta = torch.eye(3, 4, dtype=torch.float64, device=m.device).expand(
            call.input_shape[0], 3, 4)
    else:
        dtype = theta.dtype
    return (theta.double() @ m).to(dtype)


def warp_mse_loss(input: torch.Tensor, target: torch.Tensor, theta: torch.Tensor | None = None,
                  displacement: torch.Tensor | None = None, mode: str = "bilinear",
                  padding_mode: str = "zeros", align_corners: bool = False, *,
                  displacement_units: str = "normalized",
                  reduction: str = "mean") -> torch.Tensor:
    """``F.mse_loss(warp(input, theta, displacement, target.shape, ...), target,
    reduction=reduction)`` without holding the warped volume or its gradient: a
    registration step's memory is then little more than the displacement's gradient.

    Parameters
    ----------
    input : Tensor, shape (N, C, Di, Hi, Wi)
        The moving volume, as ``warp`` takes it.
    target : Tensor, shape (N, C, Do, Ho, Wo)
        The fixed volume: the output's size, in ``input``'s dtype, on its device.
    theta, displacement, mode, padding_mode, align_corners, displacement_units
        As for ``warp``.
    reduction : {"mean", "sum"}
        The squared differences' mean or sum.

    Returns
    -------
    Tensor, a scalar in ``input``'s dtype, differentiable in ``input``, ``target``,
    ``theta`` and ``displacement`` (first derivatives).

    Notes
    -----
    The output is warped in slabs of planes along z (a few MiB each), each with theta times
    the slab's coordinate map, once. Where autograd records the call and an operand
    requires grad, each slab's gradients are taken right after its loss, and the backward
    scales them by the loss's gradient, in place: the call costs a warp and its backward
    even if no backward follows, the gradients are held from the call on, and a second
    backward through the same call (``retain_graph=True``) raises an error; call it again
    instead. The slabs follow the shapes alone and
    the sums run in float64 (each slab's in one thread on the CPU): on the CPU, results
    are bitwise the same for any thread count. They agree with the composition to
    rounding, not bitwise (the slab's theta is rounded to theta's dtype). First
    derivatives only.

    Examples
    --------
    >>> import torch, volsample.torch as vt
    >>> moving, fixed = torch.rand(1, 1, 32, 32, 32), torch.rand(1, 1, 32, 32, 32)
    >>> theta = torch.eye(3, 4)[None].requires_grad_()
    >>> flow = torch.zeros(1, 32, 32, 32, 3, requires_grad=True)
    >>> vt.warp_mse_loss(moving, fixed, theta, flow).backward()
    >>> theta.grad.shape, flow.grad.shape
    (torch.Size([1, 3, 4]), torch.Size([1, 32, 32, 32, 3]))
    """
    with _wording.torch_errors(_wording.WARP):
        moving, fixed = _operands.operand("input", input), _operands.operand("target", target)
        for name, t in (("theta", theta), ("displacement", displacement)):
            if t is not None:
                _operands.operand(name, t)
        _operands.same_device(input=input, target=target)
        _checks.same_dtype("target", fixed.dtype, "input", moving.dtype, _operands.TORCH.spell)
        if target.dim() != 5 or tuple(target.shape[:2]) != tuple(input.shape[:2]):
            raise InvalidArgumentError(
                f"target: expected shape (N, C, Do, Ho, Wo) with input's N and C "
                f"{tuple(input.shape[:2])}, got {tuple(target.shape)}",
                argument="target", kind="shape", value=tuple(target.shape))
        if reduction not in _REDUCTIONS:
            raise InvalidArgumentError(
                f"reduction: expected one of {_REDUCTIONS}, got {reduction!r}",
                argument="reduction", kind="choice", value=reduction)
        args = (MODES.code(mode), PADDINGS.code(padding_mode),
                _operands.align_corners(align_corners), UNITS.code(displacement_units))
    # every operand checked before any work (the forward finds the description cached)
    _warp_call.describe(input, theta, displacement, list(target.shape[2:]), *args)
    recording = torch.is_grad_enabled()
    wanted = tuple(recording and t is not None and t.requires_grad
                   for t in (input, target, theta, displacement))
    return _WarpMSELoss.apply(input, target, theta, displacement, *args, reduction, wanted)

