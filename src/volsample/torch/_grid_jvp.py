"""Derivatives of grid sampling along a grid direction, as the custom ops
``volsample::grid_sampler_3d_jvp`` and ``volsample::grid_sampler_3d_backward_jvp``: what
forward-mode AD and the double backward need beyond the forward and backward ops
(``_grid_sample``). Plain torch ops (``_grid_derivatives``), on every device; their own
derivatives (third derivatives of grid sampling) raise.
"""
from __future__ import annotations

from .. import _checks
from .._torch_formats import memory_format
from . import _dispatch, _grid_call, _grid_derivatives, _memory, _operands, _wording

_JVP_SCHEMA = ("(Tensor input, Tensor grid, Tensor grid_tangent, int interpolation_mode, "
               "int padding_mode, bool align_corners) -> Tensor")
_BACKWARD_JVP_SCHEMA = ("(Tensor grad_output, Tensor input, Tensor grid, Tensor grid_tangent, "
                        "int interpolation_mode, int padding_mode, bool align_corners, "
                        "bool[] output_mask) -> (Tensor, Tensor)")


@_wording.raises_torch_errors(_wording.GRID_SAMPLER)
def _check_tangent(grid_tangent, grid):
    _operands.tensor("grid_tangent", grid_tangent)
    _checks.volume_dtype("grid_tangent", _operands.operand("grid_tangent", grid_tangent).dtype,
                         _operands.TORCH.spell)
    _operands.same_device(grid_tangent=grid_tangent, grid=grid)
    _checks.shape_equal("grid_tangent", grid_tangent.shape, grid.shape, "grid's shape")


@_dispatch.custom_op("grid_sampler_3d_jvp", _JVP_SCHEMA, devices=("cpu", "cuda"))
@_wording.raises_torch_errors(_wording.GRID_SAMPLER)
def grid_sampler_3d_jvp(input, grid, grid_tangent, interpolation_mode, padding_mode,
                        align_corners):
    """The derivative of ``grid_sampler_3d(input, grid)`` along ``grid_tangent`` (a grid
    of directions); 0 for nearest sampling. The input's shape, dtype and memory format."""
    call = _grid_call.describe(input, grid, interpolation_mode, padding_mode, align_corners)
    _check_tangent(grid_tangent, grid)
    if not call.grid_gradient:
        return _grid_sampler_3d_jvp_fake(input, grid, grid_tangent, interpolation_mode,
                                         padding_mode, align_corners).zero_()
    out = _grid_derivatives.forward_grid_jvp(input, grid, grid_tangent, call.mode,
                                             call.padding, call.align_corners)
    return out.contiguous(memory_format=memory_format(input))


@_dispatch.register_fake(grid_sampler_3d_jvp)
@_wording.raises_torch_errors(_wording.GRID_SAMPLER)
def _grid_sampler_3d_jvp_fake(input, grid, grid_tangent, interpolation_mode, padding_mode,
                              align_corners):
    call = _grid_call.describe(input, grid, interpolation_mode, padding_mode, align_corners)
    _check_tangent(grid_tangent, grid)
    return _memory.empty_volume(call.output_shape, input)


@_dispatch.custom_op("grid_sampler_3d_backward_jvp", _BACKWARD_JVP_SCHEMA,
                     devices=("cpu", "cuda"))
@_wording.raises_torch_errors(_wording.GRID_SAMPLER)
def grid_sampler_3d_backward_jvp(grad_output, input, grid, grid_tangent, interpolation_mode,
                                 padding_mode, align_corners, output_mask):
    """The derivatives of ``grid_sampler_3d_backward``'s (grad_input, grad_grid) along
    ``grid_tangent``, with the backward's shapes, dtypes and memory formats; 0 for nearest
    sampling. The backward's Jacobian in the grid is its Hessian block, symmetric, so these
    also are the double backward's terms of an incoming grad_grid gradient."""
    call = _grid_call.describe_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                              align_corners, output_mask)
    want_input, want_grid = call.output_mask
    _check_tangent(grid_tangent, grid)
    if not call.grid_gradient:
        grad_input, grad_grid = _grid_call.empty_gradients(
            grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
            output_mask)
        return grad_input.zero_(), grad_grid.zero_()
    grad_input, grad_grid = _grid_derivatives.backward_grid_jvp(
        grad_output, input, grid, grid_tangent, call.mode, call.padding, call.align_corners,
        want_input, want_grid)
    return (_grid_call.unasked(input) if grad_input is None
            else grad_input.contiguous(memory_format=memory_format(input)),
            _grid_call.unasked(grid) if grad_grid is None else grad_grid)


@_dispatch.register_fake(grid_sampler_3d_backward_jvp)
@_wording.raises_torch_errors(_wording.GRID_SAMPLER)
def _grid_sampler_3d_backward_jvp_fake(grad_output, input, grid, grid_tangent,
                                       interpolation_mode, padding_mode, align_corners,
                                       output_mask):
    _check_tangent(grid_tangent, grid)
    return _grid_call.empty_gradients(grad_output, input, grid, interpolation_mode,
                                      padding_mode, align_corners, output_mask)


@_dispatch.register_vmap(grid_sampler_3d_jvp)
def _grid_sampler_3d_jvp_vmap(info, in_dims, input, grid, grid_tangent, *modes):
    return _grid_call.sample_batched(grid_sampler_3d_jvp, info, in_dims,
                                     (input, grid, grid_tangent), modes)


@_dispatch.register_vmap(grid_sampler_3d_backward_jvp)
def _grid_sampler_3d_backward_jvp_vmap(info, in_dims, grad_output, input, grid, grid_tangent,
                                       *modes_and_mask):
    tensors = _dispatch.fold_into_n(info.batch_size, in_dims,
                                    (grad_output, input, grid, grid_tangent))
    return _dispatch.unfold_n(grid_sampler_3d_backward_jvp(*tensors, *modes_and_mask),
                              info.batch_size)


def grid_jvp(input, grid, tangent, *modes):
    return _dispatch.call(_GridJvp, grid_sampler_3d_jvp, input, grid, tangent, *modes)


def backward_grid_jvp(grad_output, input, grid, tangent, *modes_and_mask):
    return _dispatch.call(_BackwardJvp, grid_sampler_3d_backward_jvp, grad_output, input, grid,
                          tangent, *modes_and_mask)


class _ThirdOrderUnsupported(_dispatch.Function):
    """Base of the grid-direction derivative ops' Functions: their own derivatives would
    be third derivatives of grid sampling, which volsample does not provide."""
    generate_vmap_rule = True

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("volsample.torch: third derivatives of grid sampling are not "
                                  "supported (first and second derivatives are)")

    @staticmethod
    def jvp(ctx, *tangents):
        _ThirdOrderUnsupported.backward(ctx)


class _GridJvp(_ThirdOrderUnsupported):
    @staticmethod
    def forward(*args):
        return _dispatch.below_autograd(grid_sampler_3d_jvp, *args)


class _BackwardJvp(_ThirdOrderUnsupported):
    @staticmethod
    def forward(*args):
        return _dispatch.below_autograd(grid_sampler_3d_backward_jvp, *args)


_dispatch.set_autograd_kernels({"grid_sampler_3d_jvp": _GridJvp,
                                "grid_sampler_3d_backward_jvp": _BackwardJvp})
