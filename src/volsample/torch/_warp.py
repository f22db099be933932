"""Warps for PyTorch: ``warp`` (sampling at ``affine_grid(theta) + displacement`` with the
grid never stored) on the custom ops ``volsample::warp_3d`` and
``volsample::warp_3d_backward``.

Each op builds the call's checked description (``volsample._calls.Warp``) and hands it to a
backend: the C++ kernels for CPU tensors (NumPy views of their memory), the Triton kernels
for CUDA tensors; fake implementations give torch.compile the result shapes. Autograd
reaches input, theta and the displacement through the fused backward op, which writes the
displacement's gradient and reduces theta's without a grid-sized gradient. Forward-mode
AD and derivatives of the backward (double backward, torch.func's nested transforms) take
the composition instead: the grid is then formed (``stored_grid``) and grid sampling's own
derivative ops run on it. Semantics: docs/semantics.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .. import _calls, _coords, _prepared
from .._tables import MODES, PADDINGS, UNITS, VOXELS
from . import _devices, _dispatch, _memory, _operands, _wording
from . import _grid_jvp, _grid_sample
from ._devices import CPU, CUDA
from ._warp_call import describe as _describe, describe_backward as _describe_backward
from ._warp_call import gradients as _gradients

_FORWARD_SCHEMA = ("(Tensor input, Tensor? theta, Tensor? displacement, SymInt[3] size, "
                   "int interpolation_mode, int padding_mode, bool align_corners, "
                   "int displacement_units) -> Tensor")
_BACKWARD_SCHEMA = ("(Tensor grad_output, Tensor input, Tensor? theta, Tensor? displacement, "
                    "int interpolation_mode, int padding_mode, bool align_corners, "
                    "int displacement_units, bool[] output_mask) -> (Tensor, Tensor, Tensor)")


def _returned(gradients, input):
    """An op cannot return None: a gradient not asked for comes back as an empty tensor."""
    return tuple(input.new_empty((0,)) if g is None else g for g in gradients)


class _Prepared(NamedTuple):
    """What a call of a key keeps (as grid sampling's prepared calls): its checked
    description, its backend's prepared kernel (``PreparedWarp``, the C++ core's or the
    Triton kernels'; None: the general path, for bfloat16 views, a 16-bit grad_input on
    the C++ core, or nothing to compute) and its results' ``_memory.allocator``s, None for
    one not asked for."""
    call: _calls.Warp
    kernel: Any
    results: tuple


def _key(site, device: _devices.Device, *parts):
    """A call's key in ``_prepared``: its op, its tensors' ``device.key`` (None for an
    absent one), its other arguments and the backend's setting."""
    return (site, *(None if p is None else device.key(p)
                    if isinstance(p, torch.Tensor) else p for p in parts), device.setting())


def _kept(key, call, kernel, results) -> _Prepared:
    """The first call of ``key``, remembered with its kernel (the backend's
    ``prepare_forward`` or ``prepare_backward`` of its operands) and its result tensors
    (None where not asked for)."""
    return _prepared.remember(key, _Prepared(call, kernel, tuple(
        None if t is None else _memory.allocator(t) for t in results)))


def _warp_3d(input, theta, displacement, size, interpolation_mode, padding_mode, align_corners,
             displacement_units, device: _devices.Device = CPU):
    """``input`` (N, C, D, H, W) sampled at ``affine_grid(theta, size) + displacement``
    (theta (N, 3, 4) or None: the identity; displacement (N, *size, 3) or None: 0),
    giving (N, C, *size) in the input's dtype and memory format; the grid is never stored.
    The op's CPU kernel, and with ``device=CUDA`` its CUDA kernel."""
    key = _key("torch.warp_3d", device, input, theta, displacement, *size, interpolation_mode,
               padding_mode, align_corners, displacement_units)
    prepared = _prepared.find(key)
    if prepared is None:
        call = _describe(input, theta, displacement, size, interpolation_mode, padding_mode,
                         align_corners, displacement_units)
        out = _memory.empty_volume(call.output_shape, input)
    else:
        call, out = prepared.call, prepared.results[0]()
    read = device.read
    operands = read(input), read(theta), read(displacement), device.write(out)
    if prepared is None:
        prepared = _kept(key, call, device.backend("warp").prepare_forward(call, *operands),
                         (out,))
    if prepared.kernel is None:
        device.backend("warp").forward(call, *operands)
    else:
        prepared.kernel.forward_on(*operands)
    return out


warp_3d = _dispatch.custom_op("warp_3d", _FORWARD_SCHEMA)(_warp_3d)


@_dispatch.register_kernel(warp_3d, "cuda")
def _warp_3d_cuda(*args):
    return _warp_3d(*args, device=CUDA)


def _symbolic(*shapes) -> bool:
    """Whether sizes are symbolic (torch.compile tracing with dynamic shapes): torch's own
    guards check them then, not the op layer."""
    return any(isinstance(v, torch.SymInt) for shape in shapes for v in shape)


@_dispatch.register_fake(warp_3d)
def _warp_3d_fake(input, theta, displacement, size, interpolation_mode, padding_mode,
                  align_corners, displacement_units):
    if _symbolic(input.shape, size):
        return _memory.empty_volume(tuple(input.shape[:2]) + tuple(size), input)
    call = _describe(input, theta, displacement, size, interpolation_mode, padding_mode,
                     align_corners, displacement_units)
    return _memory.empty_volume(call.output_shape, input)


def _warp_3d_backward(grad_output, input, theta, displacement, interpolation_mode,
                      padding_mode, align_corners, displacement_units, output_mask,
                      device: _devices.Device = CPU):
    """Gradients (grad_input, grad_theta, grad_displacement) of ``warp_3d``, as
    ``output_mask`` selects them; one not asked for, or of an absent operand, comes back as
    an empty tensor. No grid-sized array is formed for theta's. The op's CPU kernel, and
    with ``device=CUDA`` its CUDA kernel."""
    key = _key("torch.warp_3d_backward", device, grad_output, input, theta, displacement,
               interpolation_mode, padding_mode, align_corners, displacement_units, *output_mask)
    prepared = _prepared.find(key)
    if prepared is None:
        call = _describe_backward(grad_output, input, theta, displacement, interpolation_mode,
                                  padding_mode, align_corners, displacement_units, output_mask)
        gradients = _gradients(call.output_mask, input, theta, displacement)
    else:
        call = prepared.call
        gradients = tuple(None if new is None else new() for new in prepared.results)
    read, write = device.read, device.write
    operands = (read(grad_output), read(input), read(theta), read(displacement),
                *map(write, gradients))
    if prepared is None:
        prepared = _kept(key, call, device.backend("warp").prepare_backward(
            call, *operands, **device.options(key[-1])), gradients)
    if prepared.kernel is None:
        device.backend("warp").backward(call, *operands, **device.options(key[-1]))
    else:
        prepared.kernel.backward_on(*operands)
    return _returned(gradients, input)


warp_3d_backward = _dispatch.custom_op("warp_3d_backward", _BACKWARD_SCHEMA)(_warp_3d_backward)


@_dispatch.register_kernel(warp_3d_backward, "cuda")
def _warp_3d_backward_cuda(*args):
    return _warp_3d_backward(*args, device=CUDA)


@_dispatch.register_fake(warp_3d_backward)
def _warp_3d_backward_fake(grad_output, input, theta, displacement, interpolation_mode,
                           padding_mode, align_corners, displacement_units, output_mask):
    if _symbolic(grad_output.shape, input.shape):
        mask = [bool(m) and t is not None
                for m, t in zip(output_mask, (input, theta, displacement))]
        return _returned(_gradients(mask, input, theta, displacement), input)
    call = _describe_backward(grad_output, input, theta, displacement, interpolation_mode,
                              padding_mode, align_corners, displacement_units, output_mask)
    return _returned(_gradients(call.output_mask, input, theta, displacement), input)


# ---------------------------------------------------------------------------------------
# The grid, formed: what forward-mode AD and derivatives of the backward differentiate
# ---------------------------------------------------------------------------------------


def base_grid(size, align_corners, dtype, device) -> torch.Tensor:
    """The homogeneous base grid (D, H, W, 4), channels (x, y, z, 1), as affine_grid lays it
    out (``_coords.base`` in float64, then rounded to ``dtype``, as the kernels take it)."""
    axes = [_coords.base(torch.arange(n, dtype=torch.float64, device=device), n, align_corners)
            for n in size]
    z, y, x = torch.meshgrid(*axes, indexing="ij")
    return torch.stack([x, y, z, torch.ones_like(x)], -1).to(dtype)


def _affine(base: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """theta (N, 3, 4) applied to the homogeneous base grid (D, H, W, 4): (N, D, H, W, 3).
    A matrix product and a reshape (not einsum or unflatten, which have no rule in PyTorch's
    legacy batching, the one ``autograd.grad(..., is_grads_batched=True)`` uses)."""
    grid = base.reshape(-1, 4) @ theta.transpose(-1, -2)
    return grid.reshape(*theta.shape[:-2], *base.shape[:3], 3)


def displacement_scale(input_spatial, align_corners, units, dtype, device) -> torch.Tensor:
    """Normalised units per displacement unit, channels (x, y, z)."""
    D, H, W = input_spatial
    scale = ([_coords.voxel_step(n, align_corners) for n in (W, H, D)] if units == VOXELS
             else [1.0, 1.0, 1.0])
    return torch.tensor(scale, dtype=dtype, device=device)


def stored_grid(input, theta, displacement, size, align_corners, units) -> torch.Tensor:
    """``affine_grid(theta, size) + displacement`` (scaled to normalised units) as a
    tensor, differentiable in theta and the displacement: the grid the warp stands for."""
    given = theta if theta is not None else displacement
    dtype = given.dtype if given is not None else torch.promote_types(input.dtype, torch.float32)
    grid = base_grid(size, align_corners, dtype, input.device)[None, ..., :3]
    if theta is not None:
        grid = _affine(base_grid(size, align_corners, dtype, input.device), theta)
    if displacement is not None:
        grid = grid + displacement * displacement_scale(input.shape[2:], align_corners, units,
                                                        dtype, input.device)
    return grid.expand((input.shape[0],) + tuple(size) + (3,))


def _grid_tangent(theta_tangent, displacement_tangent, size, input, align_corners, units):
    """The grid's derivative along the tangents of theta and the displacement (None: 0)."""
    tangent = None
    if theta_tangent is not None:
        base = base_grid(size, align_corners, theta_tangent.dtype, input.device)
        tangent = _affine(base, theta_tangent)
    if displacement_tangent is not None:
        step = displacement_tangent * displacement_scale(
            input.shape[2:], align_corners, units, displacement_tangent.dtype, input.device)
        tangent = step if tangent is None else tangent + step
    return tangent


# ---------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------


@_dispatch.register_vmap(warp_3d)
def _warp_3d_vmap(info, in_dims, input, theta, displacement, *args):
    """vmap: one call, the batch folded into N (theta's and the displacement's too)."""
    tensors = _dispatch.fold_into_n(info.batch_size, in_dims, (input, theta, displacement))
    return _dispatch.unfold_n(warp_3d(*tensors, *args), info.batch_size)


@_dispatch.register_vmap(warp_3d_backward)
def _warp_3d_backward_vmap(info, in_dims, grad_output, input, theta, displacement, *args):
    tensors = _dispatch.fold_into_n(info.batch_size, in_dims,
                                    (grad_output, input, theta, displacement))
    return _dispatch.unfold_n(warp_3d_backward(*tensors, *args), info.batch_size)


def _forward(input, theta, displacement, *args):
    return _dispatch.call(_Warp3d, warp_3d, input, theta, displacement, *args)


def _backward_op(grad_output, input, theta, displacement, *args):
    return _dispatch.call(_Warp3dBackward, warp_3d_backward, grad_output, input, theta,
                          displacement, *args)


def _save_for_backward(ctx, inputs, output):
    """What warp's backward reads: the operands, the size, the modes and the units."""
    ctx.save_for_backward(*inputs[:3])
    ctx.size = list(inputs[3])
    ctx.modes = inputs[4:7]  # interpolation_mode, padding_mode, align_corners
    ctx.units = inputs[7]


class _Warp3d(_dispatch.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(input, theta, displacement, size, interpolation_mode, padding_mode,
                align_corners, displacement_units):
        return _dispatch.below_autograd(warp_3d, input, theta, displacement, size,
                                        interpolation_mode, padding_mode, align_corners,
                                        displacement_units)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _save_for_backward(ctx, inputs, output)
        ctx.save_for_forward(*inputs[:3])

    @staticmethod
    def backward(ctx, grad_output):
        input, theta, displacement = ctx.saved_tensors
        mask = [bool(m) for m in ctx.needs_input_grad[:3]]
        if not any(mask):
            return (None,) * 8
        differentiated = torch.is_grad_enabled() or torch._C._are_functorch_transforms_active()
        if differentiated:  # the backward's own derivatives are wanted: through the grid
            gradients = _composed_backward(grad_output, input, theta, displacement, ctx, mask)
        else:
            gradients = _backward_op(grad_output, input, theta, displacement, *ctx.modes,
                                     ctx.units, mask)
        return tuple(g if m else None for g, m in zip(gradients, mask)) + (None,) * 5

    @staticmethod
    def jvp(ctx, input_tangent, theta_tangent, displacement_tangent, *_):
        # Linear in the input; along theta and the displacement, the grid's derivative.
        input, theta, displacement = ctx.saved_tensors
        out = None
        if input_tangent is not None:
            out = _forward(input_tangent, theta, displacement, ctx.size, *ctx.modes, ctx.units)
        tangent = _grid_tangent(theta_tangent, displacement_tangent, ctx.size, input,
                                ctx.modes[2], ctx.units)
        if tangent is not None:
            grid = stored_grid(input, theta, displacement, ctx.size, ctx.modes[2], ctx.units)
            along = _grid_jvp.grid_jvp(input, grid, tangent, *ctx.modes)
            out = along if out is None else out + along
        return out


def _composed_backward(grad_output, input, theta, displacement, ctx, mask):
    """The backward as grid sampling's on the formed grid, then the chain rule into theta
    and the displacement: differentiable in every operand."""
    want_input, want_theta, want_displacement = mask
    size, align_corners = ctx.size, ctx.modes[2]
    grid = stored_grid(input, theta, displacement, size, align_corners, ctx.units)
    grad_input, grad_grid = _grid_sample._backward_op(
        grad_output, input, grid, *ctx.modes, [want_input, want_theta or want_displacement])
    grad_theta = grad_displacement = None
    if want_theta:
        base = base_grid(size, align_corners, grad_grid.dtype, input.device)
        grad_theta = grad_grid.flatten(1, 3).transpose(1, 2) @ base.reshape(-1, 4)
    if want_displacement:
        grad_displacement = grad_grid * displacement_scale(
            input.shape[2:], align_corners, ctx.units, grad_grid.dtype, input.device)
    return grad_input, grad_theta, grad_displacement


class _Warp3dBackward(_dispatch.Function):
    """The fused backward op, run where its own derivatives are not wanted (derivatives of
    warp's backward go through ``_composed_backward``)."""
    generate_vmap_rule = True

    @staticmethod
    def forward(*args):
        return _dispatch.below_autograd(warp_3d_backward, *args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(
            "torch.ops.volsample.warp_3d_backward: derivatives of the op called directly are "
            "not supported; differentiate volsample.torch.warp twice (create_graph=True), "
            "which supports them")

    @staticmethod
    def jvp(ctx, *tangents):
        _Warp3dBackward.backward(ctx)


_dispatch.set_autograd_kernels({"warp_3d": _Warp3d, "warp_3d_backward": _Warp3dBackward})


def warp(input: torch.Tensor, theta: torch.Tensor | None = None,
         displacement: torch.Tensor | None = None, size: Sequence[int] | None = None,
         mode: str = "bilinear", padding_mode: str = "zeros", align_corners: bool = False, *,
         displacement_units: str = "normalized") -> torch.Tensor:
    """Sample a volume at an affine map plus a displacement, ``A x + u(x)``, with no grid:
    ``F.grid_sample(input, F.affine_grid(theta, size, align_corners) + displacement, mode,
    padding_mode, align_corners)`` without forming that grid, differentiable in ``input``,
    ``theta`` and ``displacement``.

    Parameters
    ----------
    input : Tensor, shape (N, C, Di, Hi, Wi)
        float16, bfloat16, float32 or float64; any memory format; CPU or CUDA.
    theta : Tensor, shape (N, 3, 4), optional
        Per batch item, the affine map from the output's normalised coordinates (x, y, z, 1)
        to the input's, as ``F.affine_grid`` takes it. None: the identity.
    displacement : Tensor, shape (N, Do, Ho, Wo, 3), optional
        Added to each output point's coordinates, channels (x, y, z). None: 0.
    size : (Do, Ho, Wo) or (N, C, Do, Ho, Wo), optional
        The output's size (the second form as ``F.affine_grid`` takes it). Default: the
        displacement's, else the input's.
    mode, padding_mode, align_corners
        As for ``grid_sample``.
    displacement_units : {"normalized", "voxels"}
        The displacement in the grid's units, or in voxels of ``input`` (VoxelMorph's and
        MONAI's fields).

    Returns
    -------
    Tensor, shape (N, C, Do, Ho, Wo), in ``input``'s dtype and memory format.

    Notes
    -----
    Runs ``torch.ops.volsample.warp_3d`` (works under ``torch.compile``). The backward
    writes the displacement's gradient directly and sums theta's per row in a fixed order
    (bitwise reproducible); neither a grid nor a grid-sized gradient is allocated.
    Forward-mode AD and second derivatives work: they form the grid.

    Examples
    --------
    >>> import torch, volsample.torch as vt
    >>> image = torch.rand(1, 1, 32, 32, 32)
    >>> theta = torch.eye(3, 4)[None].requires_grad_()
    >>> flow = torch.zeros(1, 32, 32, 32, 3, requires_grad=True)
    >>> loss = vt.warp(image, theta, flow, displacement_units="voxels").square().mean()
    >>> loss.backward()
    >>> theta.grad.shape, flow.grad.shape
    (torch.Size([1, 3, 4]), torch.Size([1, 32, 32, 32, 3]))
    """
    with _wording.torch_errors(_wording.WARP):
        _operands.tensor("input", input)
        given = {name: t for name, t in (("theta", theta), ("displacement", displacement))
                 if t is not None}
        for name, t in given.items():
            _operands.operand(name, t)
        spatial = None if displacement is None else tuple(displacement.shape[1:4])
        size = _calls.warp_output_size(_operands.sizes(size) if size is not None else None,
                                       tuple(input.shape), spatial)
        args = (list(size), MODES.code(mode), PADDINGS.code(padding_mode),
                _operands.align_corners(align_corners), UNITS.code(displacement_units))
    tensors = [t for t in (input, theta, displacement) if t is not None]
    if _dispatch.eager(*tensors):  # the shortest way: what _forward would pick, unchecked
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return _eager_apply(input, theta, displacement, *args)
        return _cpu_forward(input, theta, displacement, *args)
    return _forward(input, theta, displacement, *args)


_cpu_forward = _dispatch.cpu_kernel(warp_3d)
_cpu_backward = _dispatch.cpu_kernel(warp_3d_backward)


class _EagerWarp3d(_Warp3d):
    """_Warp3d for ``warp``'s eager calls on plain CPU tensors (as grid_sample's
    ``_EagerGridSampler3d``): its forward is the CPU kernel; it saves nothing for forward
    mode; its backward runs the fused CPU kernel when the gradient is a plain CPU tensor
    and nothing watches the dispatcher and the backward is not differentiated, else
    ``_Warp3d``'s."""

    forward = staticmethod(_cpu_forward)
    setup_context = staticmethod(_save_for_backward)

    @staticmethod
    def backward(ctx, grad_output):
        if torch.is_grad_enabled() or not _dispatch.direct((grad_output,)):
            return _Warp3d.backward(ctx, grad_output)
        mask = list(ctx.needs_input_grad[:3])
        gradients = _cpu_backward(grad_output, *ctx.saved_tensors, *ctx.modes, ctx.units, mask)
        return tuple(g if m else None for g, m in zip(gradients, mask)) + (None,) * 5


_eager_apply = _dispatch.c_apply(_EagerWarp3d)
