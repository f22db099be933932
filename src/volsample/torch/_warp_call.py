"""A warp call as the torch ops make it, shared by the warp ops (``_warp``) and
``warp_mse_loss`` (``_warp_loss``): its checked description (forward and backward, cached
per call), its gradients' tensors and its operands' read-only arrays.
"""
from __future__ import annotations

from .. import _calls
from .._tables import MODES, PADDINGS, UNITS
from . import _memory, _operands, _wording


def _warp_operands(**tensors):
    """The given tensors (the ops' and the doors' checked ones) as the op layer's operands
    (None stays None), on one device."""
    given = {name: t for name, t in tensors.items() if t is not None}
    _operands.same_device(**given)
    return [None if t is None else _operands.tensor_operand(name, t)
            for name, t in tensors.items()]


def _codes(interpolation_mode, padding_mode, displacement_units):
    return (MODES.check_code(interpolation_mode, "interpolation_mode"),
            PADDINGS.check_code(padding_mode), UNITS.check_code(displacement_units))


@_operands.cached_description
@_wording.raises_torch_errors(_wording.WARP)
def describe(input, theta, displacement, size, interpolation_mode, padding_mode, align_corners,
             displacement_units) -> _calls.Warp:
    """The forward's checked description (every device, and the fake)."""
    ops = _warp_operands(input=input, theta=theta, displacement=displacement)
    mode, padding, units = _codes(interpolation_mode, padding_mode, displacement_units)
    return _calls.warp(ops[0], ops[1], ops[2], list(size), mode, padding, align_corners, units,
                       _operands.layout(input), shape_order="NCDHW", dialect=_operands.TORCH)


@_operands.cached_description
@_wording.raises_torch_errors(_wording.WARP)
def describe_backward(grad_output, input, theta, displacement, interpolation_mode,
                      padding_mode, align_corners, displacement_units,
                      output_mask) -> _calls.Warp:
    ops = _warp_operands(grad_output=grad_output, input=input, theta=theta,
                         displacement=displacement)
    mode, padding, units = _codes(interpolation_mode, padding_mode, displacement_units)
    return _calls.warp_backward(ops[0], ops[1], ops[2], ops[3], mode, padding, align_corners, units, output_mask,
                                _operands.layout(input), shape_order="NCDHW",
                                dialect=_operands.TORCH)


def gradients(output_mask, input, theta, displacement):
    """Uninitialised (grad_input, grad_theta, grad_displacement), None where not asked for
    (a checked mask: none of an absent operand): grad_input in the input's memory format,
    the others contiguous."""
    want_input, want_theta, want_displacement = output_mask
    return (_memory.empty_volume(input.shape, input) if want_input else None,
            _memory.empty_contiguous(theta) if want_theta else None,
            _memory.empty_contiguous(displacement) if want_displacement else None)


def read(t):
    """A tensor's read-only NumPy view, for the CPU kernels (None stays None)."""
    return None if t is None else _memory.read_only_array(t)
