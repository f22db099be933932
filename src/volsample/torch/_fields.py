"""Displacement fields for PyTorch, differentiable: ``compose``, ``integrate_velocity`` and
``jacobian_determinant``, the conventions of ``volsample.compose`` & co. (fields (N, D, H,
W, 3) in voxels, channels x, y, z), on ``warp`` and plain torch ops."""
from __future__ import annotations


import torch

from .. import _fields
from . import _operands, _wording
from ._warp import warp


def _sample(field, displacement, padding_mode):
    """``field`` sampled at x + displacement(x), as a channels-last volume of 3 channels."""
    out = warp(field.permute(0, 4, 1, 2, 3), displacement=displacement,
               padding_mode=padding_mode, align_corners=True, displacement_units="voxels")
    return out.permute(0, 2, 3, 4, 1)


def _field(name, value):
    with _wording.torch_errors(_wording.WARP):
        _operands.operand(name, value)
        _fields.check_field(name, tuple(value.shape))
    return value


def compose(u: torch.Tensor, v: torch.Tensor, padding_mode: str = "zeros") -> torch.Tensor:
    """The displacement of "v, then u": ``v(x) + u(x + v(x))`` (see ``volsample.compose``),
    differentiable in u and v."""
    _field("u", u)
    _field("v", v)
    with _wording.torch_errors(_wording.WARP):
        _fields.check_pair(tuple(u.shape), tuple(v.shape))
    return _fields.compose(_sample, u, v, padding_mode)


def integrate_velocity(v: torch.Tensor, steps: int = 7, padding_mode: str = "zeros"
                       ) -> torch.Tensor:
    """exp(v) by scaling and squaring (see ``volsample.integrate_velocity``),
    differentiable in v."""
    _field("v", v)
    with _wording.torch_errors(_wording.WARP):
        steps = _fields.check_steps(steps)
    return _fields.integrate_velocity(_sample, v, steps, padding_mode)


def jacobian_determinant(u: torch.Tensor) -> torch.Tensor:
    """det(I + du/dx) at every voxel, (N, D, H, W) (see ``volsample.jacobian_determinant``
    for the stencil), differentiable in u; 16-bit fields are computed in float32."""
    _field("u", u)
    compute = torch.promote_types(u.dtype, torch.float32)
    return _fields.jacobian_determinant(torch, u.to(compute)).to(u.dtype)
