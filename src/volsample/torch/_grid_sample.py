"""Grid sampling for PyTorch: ``grid_sample`` (5-D ``F.grid_sample``) on the custom ops
``volsample::grid_sampler_3d`` and ``volsample::grid_sampler_3d_backward``.

The ops mirror ``aten::grid_sampler_3d`` and its backward (integer modes: interpolation
0 bilinear, 1 nearest; padding 0 zeros, 1 border, 2 reflection). CPU tensors run the
NumPy API on their own memory, CUDA tensors the Triton launchers; fake implementations
give torch.compile the result shapes, dtypes and memory formats. Semantics: SPEC §2.
"""
from __future__ import annotations

import torch

from .. import _checks, _config
from .. import grid_sample as _numpy_api
from . import _common

_MODE_NAMES = {code: name for name, code in _checks.MODES.items()}
_PADDING_NAMES = {code: name for name, code in _checks.PADDING_MODES.items()}

_FORWARD_SCHEMA = ("(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, "
                   "bool align_corners) -> Tensor")
_BACKWARD_SCHEMA = ("(Tensor grad_output, Tensor input, Tensor grid, int interpolation_mode, "
                    "int padding_mode, bool align_corners, bool[] output_mask) -> (Tensor, Tensor)")


def _check_code(name: str, value, names: dict) -> None:
    """An integer mode of the op (the public function takes the strings)."""
    if isinstance(value, bool) or value not in names:
        choices = ", ".join(f"{code} ({mode})" for code, mode in names.items())
        raise _checks.InvalidArgumentError(f"{name}: expected one of {choices}, got {value!r}")


def _check(input, grid, interpolation_mode, padding_mode, align_corners):
    """Checks every device needs before its kernels run (and the fake before it makes a
    shape): the tensors, their device, the modes, and the shapes and dtypes that fit."""
    _common.tensor("input", input)
    _common.tensor("grid", grid)
    _common.same_device(input=input, grid=grid)
    _check_code("interpolation_mode", interpolation_mode, _MODE_NAMES)
    _check_code("padding_mode", padding_mode, _PADDING_NAMES)
    _checks.boolean("align_corners", align_corners)
    if grid.shape[-1] != 3:
        raise _checks.InvalidArgumentError(
            f"grid: expected last dimension 3 (x, y, z), got shape {tuple(grid.shape)}")
    if grid.shape[0] != input.shape[0]:
        raise _checks.InvalidArgumentError(f"grid: expected batch size {input.shape[0]} "
                                           f"(input's N), got shape {tuple(grid.shape)}")
    _checks.nonempty_spatial("input", tuple(input.shape[2:]))
    sixteen_bit = input.dtype in (torch.float16, torch.bfloat16)
    wide = grid.dtype in (torch.float32, torch.float64)
    if grid.dtype != input.dtype and not (sixteen_bit and wide):
        raise _checks.UnsupportedDTypeError(
            f"grid: expected dtype {input.dtype} (the dtype of input), or torch.float32/float64 "
            f"with a float16/bfloat16 input, got {grid.dtype}")


def _check_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                    output_mask):
    _check(input, grid, interpolation_mode, padding_mode, align_corners)
    _common.tensor("grad_output", grad_output)
    _common.same_device(grad_output=grad_output, input=input)
    _common.same_dtype("grad_output", grad_output, "input", input)
    _checks.shape_equal("grad_output", grad_output.shape,
                        tuple(input.shape[:2]) + tuple(grid.shape[1:4]),
                        "shape (the forward's output shape)")
    return _checks.output_mask(output_mask)


@torch.library.custom_op("volsample::grid_sampler_3d", mutates_args=(), device_types="cpu",
                         schema=_FORWARD_SCHEMA)
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    """``aten::grid_sampler_3d`` semantics: ``input`` (N, C, D, H, W) sampled at ``grid``
    (N, Do, Ho, Wo, 3), giving (N, C, Do, Ho, Wo) in the input's dtype and memory format."""
    _check(input, grid, interpolation_mode, padding_mode, align_corners)
    layout = _common.layout(input)
    out = _numpy_api.grid_sample_3d(
        _common.to_numpy(input, layout), _common.to_numpy(grid), _MODE_NAMES[interpolation_mode],
        _PADDING_NAMES[padding_mode], align_corners, layout=layout)
    return _common.from_numpy(out, layout)


@grid_sampler_3d.register_kernel("cuda")
def _grid_sampler_3d_cuda(input, grid, interpolation_mode, padding_mode, align_corners):
    _check(input, grid, interpolation_mode, padding_mode, align_corners)
    return _common.gpu_backend("grid_sample").forward(input, grid, interpolation_mode,
                                                      padding_mode, align_corners)


@grid_sampler_3d.register_fake
def _grid_sampler_3d_fake(input, grid, interpolation_mode, padding_mode, align_corners):
    _check(input, grid, interpolation_mode, padding_mode, align_corners)
    return _common.empty_volume(tuple(input.shape[:2]) + tuple(grid.shape[1:4]), input)


@torch.library.custom_op("volsample::grid_sampler_3d_backward", mutates_args=(),
                         device_types="cpu", schema=_BACKWARD_SCHEMA)
def grid_sampler_3d_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                             align_corners, output_mask):
    """Gradients (grad_input, grad_grid) of ``grid_sampler_3d``; grad_input has the input's
    memory format, grad_grid is contiguous. ``output_mask`` selects them: one not asked
    for is not computed and comes back as an empty tensor (an op cannot return None)."""
    mask = _check_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                           align_corners, output_mask)
    layout = _common.layout(input)
    grad_input, grad_grid = _numpy_api.grid_sample_3d_backward(
        _common.to_numpy(grad_output, layout), _common.to_numpy(input, layout),
        _common.to_numpy(grid), _MODE_NAMES[interpolation_mode], _PADDING_NAMES[padding_mode],
        align_corners, mask, layout=layout)
    return (_unasked(input) if grad_input is None else _common.from_numpy(grad_input, layout),
            _unasked(grid) if grad_grid is None else _common.from_numpy(grad_grid))


@grid_sampler_3d_backward.register_kernel("cuda")
def _grid_sampler_3d_backward_cuda(grad_output, input, grid, interpolation_mode, padding_mode,
                                   align_corners, output_mask):
    mask = _check_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                           align_corners, output_mask)
    grad_input, grad_grid = _common.gpu_backend("grid_sample").backward(
        grad_output, input, grid, interpolation_mode, padding_mode, align_corners, mask,
        _config.get_deterministic())
    return (_unasked(input) if grad_input is None else grad_input,
            _unasked(grid) if grad_grid is None else grad_grid)


@grid_sampler_3d_backward.register_fake
def _grid_sampler_3d_backward_fake(grad_output, input, grid, interpolation_mode, padding_mode,
                                   align_corners, output_mask):
    want_input, want_grid = _check_backward(grad_output, input, grid, interpolation_mode,
                                            padding_mode, align_corners, output_mask)
    return (_common.empty_volume(input.shape, input) if want_input else _unasked(input),
            torch.empty_like(grid, memory_format=torch.contiguous_format) if want_grid
            else _unasked(grid))


def _unasked(like: torch.Tensor) -> torch.Tensor:
    """What stands for a gradient that was not asked for."""
    return like.new_empty((0,))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:2])
    ctx.modes = inputs[2:]  # interpolation_mode, padding_mode, align_corners


def _backward(ctx, grad_output):
    input, grid = ctx.saved_tensors
    mask = list(ctx.needs_input_grad[:2])  # an ungrad'ed operand costs nothing
    grad_input, grad_grid = grid_sampler_3d_backward(grad_output, input, grid, *ctx.modes, mask)
    return grad_input if mask[0] else None, grad_grid if mask[1] else None, None, None, None


grid_sampler_3d.register_autograd(_backward, setup_context=_setup_context)


def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """Sample a volume at the points of a grid: ``torch.nn.functional.grid_sample`` on 5-D
    tensors, differentiable in ``input`` and ``grid``.

    Parameters
    ----------
    input : Tensor, shape (N, C, Di, Hi, Wi)
        float16, bfloat16, float32 or float64; contiguous, ``torch.channels_last_3d`` or
        any strides; on the CPU or a CUDA device.
    grid : Tensor, shape (N, Do, Ho, Wo, 3)
        Normalised sample coordinates (x, y, z) in [-1, 1]; x indexes W, y H and z D.
        ``input``'s dtype, or float32/float64 beside a 16-bit ``input``.
    mode : {"bilinear", "nearest"}
        "bilinear" is trilinear interpolation; "nearest" rounds half to even.
    padding_mode : {"zeros", "border", "reflection"}
        What points outside the volume read.
    align_corners : bool
        True: -1 and +1 are the centres of the corner voxels; False: their outer edges.

    Returns
    -------
    Tensor, shape (N, C, Do, Ho, Wo), in ``input``'s dtype and memory format.

    Notes
    -----
    Runs ``torch.ops.volsample.grid_sampler_3d``, which works under ``torch.compile``.
    CPU tensors are computed in place in their own memory (no copies); 16-bit data is
    computed in float32 and rounded once, more accurately than PyTorch's CPU kernel. The
    gradient for ``grid`` is computed only when ``grid`` requires it. Double backward is
    not supported (nor is it by PyTorch for 5-D grid sampling).

    Examples
    --------
    >>> import torch, volsample.torch
    >>> volume = torch.arange(8.0).reshape(1, 1, 2, 2, 2)
    >>> centre = torch.zeros(1, 1, 1, 1, 3)
    >>> volsample.torch.grid_sample(volume, centre, align_corners=True).flatten()
    tensor([3.5000])
    """
    _common.tensor("input", input)
    _common.tensor("grid", grid)
    return grid_sampler_3d(input, grid, _checks.mode_code(mode), _checks.padding_code(padding_mode),
                           _checks.boolean("align_corners", align_corners))
