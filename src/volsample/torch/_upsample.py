"""Trilinear upsampling for PyTorch: ``upsample_trilinear`` (``F.interpolate`` with
``mode="trilinear"``) on the custom ops ``volsample::upsample_trilinear3d`` and
``volsample::upsample_trilinear3d_backward``.

Each op builds the call's checked description (``volsample._calls``) and hands it to a
backend: the C++ kernels for CPU tensors (NumPy views of their memory), the Triton kernels
for CUDA tensors. The backward is linear in ``grad_output``, and its own gradient is the
forward: both ops are differentiable, so double backward works. Semantics:
docs/semantics.md.
"""
from __future__ import annotations

from collections.abc import Sequence

from typing import Any, NamedTuple

import torch

from .. import _calls, _prepared
from .._torch_formats import memory_format
from . import _devices, _dispatch, _memory, _operands, _wording
from ._devices import CPU, CUDA

_FORWARD_SCHEMA = ("(Tensor input, SymInt[3] output_size, bool align_corners, "
                   "float[]? scales=None) -> Tensor")
_BACKWARD_SCHEMA = ("(Tensor grad_output, SymInt[5] input_size, bool align_corners, "
                    "float[]? scales=None) -> Tensor")


def _symbolic(sizes) -> bool:
    """Whether sizes are symbolic (torch.compile tracing with dynamic shapes): torch's own
    guards check them then, not the op layer."""
    return any(isinstance(v, torch.SymInt) for v in sizes)


@_operands.cached_description
@_wording.raises_torch_errors(_wording.UPSAMPLE)
def _describe(input, output_size, align_corners, scales) -> _calls.Upsample:
    """The forward's checked description (every device, and the fake): ``scales``, if
    given, must be the factors that made ``output_size`` (a scale maps coordinates)."""
    return _calls.upsample(_operands.tensor_operand("input", input), size=list(output_size),
                           align_corners=align_corners, layout=_operands.layout(input),
                           scales=scales, size_name="output_size", shape_order="NCDHW",
                           dialect=_operands.TORCH)


@_operands.cached_description
@_wording.raises_torch_errors(_wording.UPSAMPLE)
def _describe_backward(grad_output, input_size, align_corners, scales) -> _calls.Upsample:
    return _calls.upsample_backward(_operands.tensor_operand("grad_output", grad_output),
                                    list(input_size), align_corners, scales,
                                    _operands.layout(grad_output), shape_order="NCDHW",
                                    dialect=_operands.TORCH)


class _Prepared(NamedTuple):
    kernel: Any  # the backend's PreparedUpsample; None: the general path (a copy, nothing
    #              to compute, or planes the C++ kernels cannot write)
    result: Any  # the result's _memory.allocator


@_dispatch.custom_op("upsample_trilinear3d", _FORWARD_SCHEMA)
def upsample_trilinear3d(input, output_size, align_corners, scales=None):
    """Resize ``input`` (N, C, Di, Hi, Wi) to spatial ``output_size`` (Do, Ho, Wo) by
    trilinear interpolation; ``scales`` (D, H, W), if given, are the factors that made
    ``output_size`` and map the coordinates. Returns the input's dtype and memory format."""
    return _resample(False, input, output_size, align_corners, scales)


def _resample(backward: bool, src, size, align_corners, scales,
              device: _devices.Device = CPU):
    """The kernel of the forward (``src`` the input, ``size`` the output's) or of the
    backward (``src`` grad_output, ``size`` the input's) on ``device``'s backend, prepared
    once per key (kept in ``_prepared``)."""
    key = ("torch.upsample_trilinear3d_backward" if backward else "torch.upsample_trilinear3d",
           device.key(src), *size, align_corners,
           None if scales is None else tuple(scales), device.setting())
    prepared = _prepared.find(key)
    if prepared is None or prepared.kernel is None:
        call = (_describe_backward if backward else _describe)(src, size, align_corners, scales)
        dst = _memory.empty_volume(call.input_shape if backward else call.output_shape, src)
        operands = device.read(src), device.write(dst)
        backend = device.backend("upsample")
        if prepared is None:
            prepared = _prepared.remember(key, _Prepared(
                (backend.prepare_backward if backward else backend.prepare_forward)(
                    call, *operands), _memory.allocator(dst)))
        if prepared.kernel is None:
            (backend.backward if backward else backend.forward)(call, *operands)
            return dst
    else:
        dst = prepared.result()
    kernel = prepared.kernel
    if device is CPU:  # the C++ core takes the tensors' memory, the Triton kernels them
        (kernel.backward if backward else kernel.forward)(src.const_data_ptr(), dst.data_ptr())
    else:
        (kernel.backward_on if backward else kernel.forward_on)(src, dst)
    return dst


@_dispatch.register_kernel(upsample_trilinear3d, "cuda")
def _upsample_trilinear3d_cuda(input, output_size, align_corners, scales=None):
    return _resample(False, input, output_size, align_corners, scales, CUDA)


@_dispatch.register_fake(upsample_trilinear3d)
def _upsample_trilinear3d_fake(input, output_size, align_corners, scales=None):
    if _symbolic(output_size) or _symbolic(input.shape):
        return _memory.empty_volume(tuple(input.shape[:2]) + tuple(output_size), input)
    return _memory.empty_volume(_describe(input, output_size, align_corners, scales).output_shape,
                                input)


@_dispatch.custom_op("upsample_trilinear3d_backward", _BACKWARD_SCHEMA)
def upsample_trilinear3d_backward(grad_output, input_size, align_corners, scales=None):
    """Gradient of ``upsample_trilinear3d`` for its input, of logical shape ``input_size``
    (N, C, Di, Hi, Wi), in grad_output's dtype and memory format. ``scales`` are the
    forward's; one <= 0 means that axis maps by its sizes."""
    return _resample(True, grad_output, input_size, align_corners, scales)


@_dispatch.register_kernel(upsample_trilinear3d_backward, "cuda")
def _upsample_trilinear3d_backward_cuda(grad_output, input_size, align_corners, scales=None):
    return _resample(True, grad_output, input_size, align_corners, scales, CUDA)


@_dispatch.register_fake(upsample_trilinear3d_backward)
def _upsample_trilinear3d_backward_fake(grad_output, input_size, align_corners, scales=None):
    if _symbolic(input_size) or _symbolic(grad_output.shape):
        return _memory.empty_volume(tuple(input_size), grad_output)
    return _memory.empty_volume(
        _describe_backward(grad_output, input_size, align_corners, scales).input_shape,
        grad_output)


@_dispatch.register_vmap(upsample_trilinear3d)
def _upsample_trilinear3d_vmap(info, in_dims, input, output_size, align_corners, scales=None):
    """vmap: one call, the batch folded into N."""
    (input,) = _dispatch.fold_into_n(info.batch_size, in_dims[:1], (input,))
    return _dispatch.unfold_n(upsample_trilinear3d(input, output_size, align_corners, scales),
                              info.batch_size)


@_dispatch.register_vmap(upsample_trilinear3d_backward)
def _upsample_trilinear3d_backward_vmap(info, in_dims, grad_output, input_size, align_corners,
                                        scales=None):
    (grad_output,) = _dispatch.fold_into_n(info.batch_size, in_dims[:1], (grad_output,))
    input_size = [info.batch_size * input_size[0], *input_size[1:]]
    return _dispatch.unfold_n(upsample_trilinear3d_backward(grad_output, input_size,
                                                            align_corners, scales),
                              info.batch_size)


def _forward(input, output_size, align_corners, scales):
    return _dispatch.call(_UpsampleTrilinear3d, upsample_trilinear3d, input, output_size,
                          align_corners, scales)


def _backward(grad_output, input_size, align_corners, scales):
    if not torch.is_grad_enabled() and _dispatch.eager(grad_output):  # a plain backward
        return _resample(True, grad_output, input_size, align_corners, scales)
    return _dispatch.call(_UpsampleTrilinear3dBackward, upsample_trilinear3d_backward,
                          grad_output, input_size, align_corners, scales)


class _UpsampleTrilinear3d(_dispatch.Function):
    """Linear: its jvp is itself on the tangent, its adjoint the backward op."""
    generate_vmap_rule = True

    @staticmethod
    def forward(input, output_size, align_corners, scales=None):
        return _dispatch.below_autograd(upsample_trilinear3d, input, output_size, align_corners,
                                        scales)

    @staticmethod
    def setup_context(ctx, inputs, output):
        input, ctx.output_size, ctx.align_corners, ctx.scales = inputs
        ctx.input_size = list(input.shape)
        ctx.memory_format = memory_format(input)

    @staticmethod
    def backward(ctx, grad_output):
        grad_input = _backward(grad_output, ctx.input_size, ctx.align_corners, ctx.scales)
        # The gradient has the input's memory format, whatever grad_output's.
        return grad_input.contiguous(memory_format=ctx.memory_format), None, None, None

    @staticmethod
    def jvp(ctx, input_tangent, *_):
        return _forward(input_tangent, ctx.output_size, ctx.align_corners, ctx.scales)


class _UpsampleTrilinear3dBackward(_dispatch.Function):
    """The adjoint map, linear in grad_output: its adjoint is the forward."""
    generate_vmap_rule = True

    @staticmethod
    def forward(grad_output, input_size, align_corners, scales=None):
        return _dispatch.below_autograd(upsample_trilinear3d_backward, grad_output, input_size,
                                        align_corners, scales)

    @staticmethod
    def setup_context(ctx, inputs, output):
        grad_output, ctx.input_size, ctx.align_corners, ctx.scales = inputs
        ctx.output_size = list(grad_output.shape[2:])

    @staticmethod
    def backward(ctx, grad_grad_input):
        return (_forward(grad_grad_input, ctx.output_size, ctx.align_corners, ctx.scales),
                None, None, None)

    @staticmethod
    def jvp(ctx, grad_output_tangent, *_):
        return _backward(grad_output_tangent, ctx.input_size, ctx.align_corners, ctx.scales)


_dispatch.set_autograd_kernels({"upsample_trilinear3d": _UpsampleTrilinear3d,
                                "upsample_trilinear3d_backward": _UpsampleTrilinear3dBackward})


def upsample_trilinear(input: torch.Tensor, size: int | Sequence[int] | None = None,
                       scale_factor: float | Sequence[float] | None = None,
                       align_corners: bool = False) -> torch.Tensor:
    """Resize a volume by trilinear interpolation: ``torch.nn.functional.interpolate``
    with ``mode="trilinear"``, differentiable (twice: the backward is differentiable too).

    Parameters
    ----------
    input : Tensor, shape (N, C, Di, Hi, Wi)
        float16, bfloat16, float32 or float64; contiguous, ``torch.channels_last_3d`` or
        any strides; on the CPU or a CUDA device.
    size : int or (int, int, int), optional
        Output size (Do, Ho, Wo). Exactly one of ``size`` and ``scale_factor`` is given.
    scale_factor : float or (float, float, float), optional
        Per-axis factors: the output size is ``floor(in * scale)`` and the factor itself
        maps output to source coordinates (``recompute_scale_factor=False``).
    align_corners : bool or None
        True: the corner voxels' centres of input and output coincide; False (or None,
        PyTorch's default): their outer edges do.

    Returns
    -------
    Tensor, shape (N, C, Do, Ho, Wo), in ``input``'s dtype and memory format.

    Notes
    -----
    Runs ``torch.ops.volsample.upsample_trilinear3d``, which works under
    ``torch.compile``. CPU tensors are computed in their own memory (no copies); 16-bit
    data is computed in float32 and rounded once.

    Examples
    --------
    >>> import torch, volsample.torch
    >>> volume = torch.tensor([0.0, 1.0]).reshape(1, 1, 1, 1, 2)
    >>> volsample.torch.upsample_trilinear(volume, size=(1, 1, 3), align_corners=True).flatten()
    tensor([0.0000, 0.5000, 1.0000])
    """
    with _wording.torch_errors(_wording.UPSAMPLE):
        call = _calls.upsample(_operands.operand("input", input),
                               None if size is None else _operands.sizes(size), scale_factor,
                               _operands.align_corners(align_corners), _operands.layout(input),
                               shape_order="NCDHW", dialect=_operands.TORCH)
    args = (list(call.output_shape[2:]), call.align_corners,
            None if call.scales[0] is None else list(call.scales))
    if _dispatch.eager(input):  # the shortest way: what _forward would pick, unchecked
        if torch.is_grad_enabled() and input.requires_grad:
            return _eager_apply(input, *args)
        return _resample(False, input, *args)
    return _forward(input, *args)


class _EagerUpsampleTrilinear3d(_UpsampleTrilinear3d):
    """_UpsampleTrilinear3d for ``upsample_trilinear``'s eager calls on plain CPU tensors:
    its forward runs the CPU kernel without asking again."""

    @staticmethod
    def forward(input, output_size, align_corners, scales=None):
        return _resample(False, input, output_size, align_corners, scales)


_eager_apply = _dispatch.c_apply(_EagerUpsampleTrilinear3d)
