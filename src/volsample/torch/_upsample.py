"""Trilinear upsampling for PyTorch: ``upsample_trilinear`` (``F.interpolate`` with
``mode="trilinear"``) on the custom ops ``volsample::upsample_trilinear3d`` and
``volsample::upsample_trilinear3d_backward``.

The backward is linear in ``grad_output``, and its own gradient is the forward: both ops
are differentiable, so double backward works. CPU tensors run the NumPy API on their own
memory, CUDA tensors the Triton launchers. Semantics: SPEC §3.
"""
from __future__ import annotations

import math

import torch

from .. import _checks, _config
from .. import upsample as _numpy_api
from . import _common

_FORWARD_SCHEMA = ("(Tensor input, SymInt[3] output_size, bool align_corners, "
                   "float[]? scales=None) -> Tensor")
_BACKWARD_SCHEMA = ("(Tensor grad_output, SymInt[5] input_size, bool align_corners, "
                    "float[]? scales=None) -> Tensor")


def _sizes(name: str, values, length: int, minimum: int) -> tuple:
    """``values`` as a tuple of ``length`` integers >= ``minimum``; symbolic sizes (while
    torch.compile traces) are left to torch's own guards."""
    if any(isinstance(v, torch.SymInt) for v in values):
        return tuple(values)
    return _checks.int_sequence(name, values, length, minimum)


@_common.raises_torch_errors(_common.UPSAMPLE)
def _check(input, output_size, align_corners, scales):
    """Checks every device needs: the tensor, sizes, and scales that give ``output_size``
    (a scale maps coordinates, so it must be the one that made the size)."""
    _common.tensor("input", input)
    _common.floating("input", input)
    _checks.boolean("align_corners", align_corners)
    output_size = _sizes("output_size", output_size, 3, 1)
    _checks.nonempty_spatial("input", tuple(input.shape[2:]))
    if scales is not None:
        scales = _checks.scale_factors("scales", tuple(scales), 3)
        implied = [math.floor(n * s) for n, s in zip(input.shape[2:], scales)]
        if any(a != b for a, b in zip(implied, output_size)):
            raise _checks.InvalidArgumentError(
                f"scales: expected the factors of output_size {tuple(output_size)}, got {scales}, "
                f"which give {tuple(implied)} from input size {tuple(input.shape[2:])}",
                argument="scales", kind="mismatch", value=scales)
    return output_size, scales


@_common.raises_torch_errors(_common.UPSAMPLE)
def _check_backward(grad_output, input_size, align_corners, scales):
    _common.tensor("grad_output", grad_output)
    _common.floating("grad_output", grad_output)
    _checks.boolean("align_corners", align_corners)
    input_size = _sizes("input_size", input_size, 5, 0)
    _checks.nonempty_spatial("input_size", input_size[2:])
    _checks.nonempty_spatial("grad_output", tuple(grad_output.shape[2:]))
    if tuple(grad_output.shape[:2]) != input_size[:2]:
        raise _checks.InvalidArgumentError(
            f"grad_output: expected N, C = {input_size[:2]} (those of input_size), got shape "
            f"{tuple(grad_output.shape)}", argument="grad_output", kind="shape",
            value=tuple(grad_output.shape))
    return input_size, _checks.optional_scales("scales", scales, 3)


@torch.library.custom_op("volsample::upsample_trilinear3d", mutates_args=(), device_types="cpu",
                         schema=_FORWARD_SCHEMA)
def upsample_trilinear3d(input, output_size, align_corners, scales=None):
    """Resize ``input`` (N, C, Di, Hi, Wi) to spatial ``output_size`` (Do, Ho, Wo) by
    trilinear interpolation; ``scales`` (D, H, W), if given, are the factors that made
    ``output_size`` and map the coordinates. Returns the input's dtype and memory format."""
    output_size, scales = _check(input, output_size, align_corners, scales)
    layout = _common.layout(input)
    out = _numpy_api.upsample_trilinear_3d(
        _common.read_only_numpy(input, layout), size=None if scales else output_size,
        scale_factor=scales, align_corners=align_corners, layout=layout)
    return _common.from_numpy(out, layout)


@upsample_trilinear3d.register_kernel("cuda")
def _upsample_trilinear3d_cuda(input, output_size, align_corners, scales=None):
    output_size, scales = _check(input, output_size, align_corners, scales)
    return _common.gpu_backend("upsample").forward(input, output_size, align_corners, scales)


@upsample_trilinear3d.register_fake
def _upsample_trilinear3d_fake(input, output_size, align_corners, scales=None):
    output_size, _ = _check(input, output_size, align_corners, scales)
    return _common.empty_volume(tuple(input.shape[:2]) + tuple(output_size), input)


@torch.library.custom_op("volsample::upsample_trilinear3d_backward", mutates_args=(),
                         device_types="cpu", schema=_BACKWARD_SCHEMA)
def upsample_trilinear3d_backward(grad_output, input_size, align_corners, scales=None):
    """Gradient of ``upsample_trilinear3d`` for its input, of logical shape ``input_size``
    (N, C, Di, Hi, Wi), in grad_output's dtype and memory format. ``scales`` are the
    forward's; one <= 0 means that axis maps by its sizes."""
    input_size, scales = _check_backward(grad_output, input_size, align_corners, scales)
    layout = _common.layout(grad_output)
    grad_input = _numpy_api.upsample_trilinear_3d_backward(
        _common.read_only_numpy(grad_output, layout), input_size, align_corners, scales,
        layout=layout)
    return _common.from_numpy(grad_input, layout)


@upsample_trilinear3d_backward.register_kernel("cuda")
def _upsample_trilinear3d_backward_cuda(grad_output, input_size, align_corners, scales=None):
    input_size, scales = _check_backward(grad_output, input_size, align_corners, scales)
    return _common.gpu_backend("upsample").backward(grad_output, input_size, align_corners, scales,
                                                    _config.get_deterministic())


@upsample_trilinear3d_backward.register_fake
def _upsample_trilinear3d_backward_fake(grad_output, input_size, align_corners, scales=None):
    input_size, _ = _check_backward(grad_output, input_size, align_corners, scales)
    return _common.empty_volume(input_size, grad_output)


def _forward(input, output_size, align_corners, scales):
    return _common.call(_UpsampleTrilinear3d, upsample_trilinear3d, input, output_size,
                        align_corners, scales)


def _backward(grad_output, input_size, align_corners, scales):
    return _common.call(_UpsampleTrilinear3dBackward, upsample_trilinear3d_backward,
                        grad_output, input_size, align_corners, scales)


def _below_autograd(op, *args):
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


class _UpsampleTrilinear3d(torch.autograd.Function):
    """Linear: its jvp is itself on the tangent, its adjoint the backward op."""
    generate_vmap_rule = True

    @staticmethod
    def forward(input, output_size, align_corners, scales=None):
        return _below_autograd(upsample_trilinear3d, input, output_size, align_corners, scales)

    @staticmethod
    def setup_context(ctx, inputs, output):
        input, ctx.output_size, ctx.align_corners, ctx.scales = inputs
        ctx.input_size = list(input.shape)
        ctx.memory_format = _common.memory_format(input)

    @staticmethod
    def backward(ctx, grad_output):
        grad_input = _backward(grad_output, ctx.input_size, ctx.align_corners, ctx.scales)
        # The gradient has the input's memory format, whatever grad_output's.
        return grad_input.contiguous(memory_format=ctx.memory_format), None, None, None

    @staticmethod
    def jvp(ctx, input_tangent, *_):
        return _forward(input_tangent, ctx.output_size, ctx.align_corners, ctx.scales)


class _UpsampleTrilinear3dBackward(torch.autograd.Function):
    """The adjoint map, linear in grad_output: its adjoint is the forward."""
    generate_vmap_rule = True

    @staticmethod
    def forward(grad_output, input_size, align_corners, scales=None):
        return _below_autograd(upsample_trilinear3d_backward, grad_output, input_size,
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


_common.set_autograd_kernels({"upsample_trilinear3d": _UpsampleTrilinear3d,
                              "upsample_trilinear3d_backward": _UpsampleTrilinear3dBackward})


def upsample_trilinear(input, size=None, scale_factor=None, align_corners=False):
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
    with _common.torch_errors(_common.UPSAMPLE):
        _common.tensor("input", input)
        output_size, scales = _checks.upsample_output_size(
            tuple(input.shape[2:]), None if size is None else _common.sizes(size), scale_factor)
        _checks.nonempty_spatial("input", tuple(input.shape[2:]))
        align_corners = _common.align_corners(align_corners)
    return _forward(input, list(output_size), align_corners,
                    None if scales[0] is None else list(scales))
