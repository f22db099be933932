"""A grid sampling call as the torch ops make it, shared by the forward and backward ops
(``_grid_sample``) and their derivatives along a grid direction (``_grid_jvp``): its
checked description (forward and backward, cached per call), its gradients' tensors and
the batching rule of the ops that sample a volume at a grid.
"""
from __future__ import annotations

import torch

from .. import _calls
from .._tables import MODES, PADDINGS
from . import _dispatch, _memory, _operands, _wording


@_operands.cached_description
@_wording.raises_torch_errors(_wording.GRID_SAMPLER)
def describe(input, grid, interpolation_mode, padding_mode, align_corners) -> _calls.GridSample:
    """The forward's checked description (every device, and the fake): of tensors, as the
    dispatcher hands them (``grid_sample`` checked its arguments' types)."""
    operands = _operands.tensor_operand("input", input), _operands.tensor_operand("grid", grid)
    _operands.same_device(input=input, grid=grid)
    mode = MODES.check_code(interpolation_mode, "interpolation_mode")
    padding = PADDINGS.check_code(padding_mode)
    return _calls.grid_sample(*operands, mode, padding, align_corners, _operands.layout(input),
                              shape_order="NCDHW", dialect=_operands.TORCH)


@_operands.cached_description
@_wording.raises_torch_errors(_wording.GRID_SAMPLER)
def describe_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                       align_corners, output_mask) -> _calls.GridSample:
    operands = (_operands.tensor_operand("grad_output", grad_output),
                _operands.tensor_operand("input", input), _operands.tensor_operand("grid", grid))
    _operands.same_device(grad_output=grad_output, input=input, grid=grid)
    mode = MODES.check_code(interpolation_mode, "interpolation_mode")
    padding = PADDINGS.check_code(padding_mode)
    return _calls.grid_sample_backward(*operands, mode, padding, align_corners, output_mask,
                                       _operands.layout(input), shape_order="NCDHW",
                                       dialect=_operands.TORCH)


def gradients(call, input, grid):
    """Uninitialised (grad_input, grad_grid) of a backward call, None where not asked for:
    grad_input in the input's memory format, grad_grid contiguous."""
    want_input, want_grid = call.output_mask
    return (_memory.empty_volume(input.shape, input) if want_input else None,
            _memory.empty_contiguous(grid) if want_grid else None)


def returned(gradients, input, grid):
    """An op cannot return None: a gradient not asked for comes back as an empty tensor."""
    grad_input, grad_grid = gradients
    return (unasked(input) if grad_input is None else grad_input,
            unasked(grid) if grad_grid is None else grad_grid)


def unasked(like: torch.Tensor) -> torch.Tensor:
    """What stands for a gradient that was not asked for."""
    return like.new_empty((0,))


def empty_gradients(grad_output, input, grid, interpolation_mode, padding_mode,
                    align_corners, output_mask):
    """The backward's results, uninitialised, as the op returns them (the fakes')."""
    call = describe_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                             align_corners, output_mask)
    return returned(gradients(call, input, grid), input, grid)


def sample_batched(op, info, in_dims, tensors, modes):
    """A vmapped call of a forward op (input, grid[, grid_tangent], *modes): one volume
    (an unbatched input) is sampled at every grid in one call, the batch folded into the
    grid's Do (the volume never copied); else the batch folds into N."""
    B = info.batch_size
    input, *grids = tensors
    if in_dims[0] is None:
        grid, dim = grids[0], in_dims[1]
        Do = grid.shape[1] if dim is None else grid.movedim(dim, 0).shape[2]
        folded = [_dispatch.fold_points(g, d, B) for g, d in zip(grids, in_dims[1:])]
        out = op(input, *folded, *modes)  # (N, C, B * Do, Ho, Wo)
        return out.unflatten(2, (B, Do)), 2
    return _dispatch.unfold_n(op(*_dispatch.fold_into_n(B, in_dims, tensors), *modes), B)
