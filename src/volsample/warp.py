"""Warps without a grid: ``warp_3d`` and its backward, ``warp_3d_backward``.

A registration step samples a volume at ``A x + u(x)``: an affine map and a displacement
field. ``grid_sample_3d`` takes that as a stored grid, ``affine_grid(theta) + u``
(N x Do x Ho x Wo x 3 values, read back by the kernel, and a gradient of the same size
written by the backward for autograd to reduce into theta and u). ``warp_3d`` samples
the same points with the grid never stored: each point's coordinates are computed from
theta, the point's index and its displacement, and the backward writes the
displacement's gradient and reduces theta's directly. The NumPy front door: arguments
become a checked call description (``_calls.Warp``), which the C++ backend runs.
Semantics: docs/semantics.md.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import _backends, _calls, _checks, _config, _layout, _prepared
from ._tables import MODES, PADDINGS, UNITS

_backend = _backends.cpu("warp")


def _arrays(**values):
    """The given arguments as NumPy arrays (None stays None)."""
    return {name: None if v is None else _checks.ndarray(name, v) for name, v in values.items()}


def _operand(name, array):
    return None if array is None else _calls.operand(name, array)


def warp_3d(input: np.ndarray, theta: np.ndarray | None = None,
            displacement: np.ndarray | None = None, size: Sequence[int] | None = None,
            mode: str = "bilinear", padding_mode: str = "zeros", align_corners: bool = False, *,
            layout: str = "NCDHW", displacement_units: str = "normalized",
            out: np.ndarray | None = None) -> np.ndarray:
    """Sample a volume at an affine map plus a displacement, ``A x + u(x)``, with no grid.

    The result is what ``grid_sample_3d(input, grid, mode, padding_mode, align_corners)``
    gives for ``grid = affine_grid(theta, size, align_corners) + displacement``
    (``torch.nn.functional.affine_grid``'s convention), but that grid is never stored.

    Parameters
    ----------
    input : ndarray, shape (N, C, Di, Hi, Wi), or (N, Di, Hi, Wi, C) with ``layout="NDHWC"``
        The volume, as for ``grid_sample_3d`` (integer label maps with nearest too).
    theta : ndarray, shape (N, 3, 4), optional
        Per batch item, the affine map from the output's normalised coordinates
        (x, y, z, 1) to the input's (rows x, y, z). None: the identity.
    displacement : ndarray, shape (N, Do, Ho, Wo, 3), optional
        Added to each output point's coordinates, channels (x, y, z). None: 0.
    size : (Do, Ho, Wo) or (N, C, Do, Ho, Wo), optional
        The output's spatial size (the second form as ``affine_grid`` takes it, N and C
        those of ``input``). Default: the displacement's, else the input's.
    mode, padding_mode, align_corners, layout
        As for ``grid_sample_3d``; ``align_corners`` also places the base grid.
    displacement_units : {"normalized", "voxels"}
        "normalized": the grid's units (2 spans the volume). "voxels": voxels of
        ``input`` (VoxelMorph's and MONAI's fields): ``u`` voxels along x are
        ``u * 2 / (Wi - 1)`` normalised units with align_corners, ``u * 2 / Wi`` without.
    out : ndarray, optional
        Where to write the result (of the result's shape and dtype, any strides: e.g. the
        previous step's, so that a loop allocates nothing, or a part of a larger volume);
        it is returned.

    ``theta`` and ``displacement`` share a dtype: ``input``'s, or float32/float64 beside
    a 16-bit or integer ``input``.

    Returns
    -------
    ndarray, shape (N, C, Do, Ho, Wo) (or NDHWC), dtype of ``input``.

    Notes
    -----
    Each point's coordinate is computed in the compute precision as
    ``c_k = theta[k, 0] bx + ((theta[k, 1] by + theta[k, 2] bz) + theta[k, 3]) + u_k s_k``
    (b the base grid, s the units' scale): float64 agrees with sampling the stored grid
    to round-off, float32 within the rounding of that coordinate.

    Examples
    --------
    >>> import numpy as np, volsample
    >>> volume = np.arange(8, dtype=np.float32).reshape(1, 1, 2, 2, 2)
    >>> theta = np.array([[[1, 0, 0, 0.5], [0, 1, 0, 0], [0, 0, 1, 0]]], np.float32)
    >>> volsample.warp_3d(volume, theta, padding_mode="border")[0, 0, 0]  # x + 1/2 voxel
    array([[0.5, 1. ],
           [2.5, 3. ]], dtype=float32)
    """
    key, prepared = _prepared_call("warp_3d", (input, theta, displacement, out),
                                   _calls.typed(size), mode, padding_mode, type(align_corners),
                                   align_corners, layout, displacement_units)
    if prepared is not None:  # a call met before (as grid_sample_3d's)
        written, returned = (
            (_layout.logical(out := prepared.allocate(), layout), out) if out is None
            else _layout.result(prepared.call, out, contiguous=False))
        prepared.kernel.forward_on(_layout.logical(input, layout), theta, displacement, written)
        return returned
    mode, padding_mode = MODES.code(mode), PADDINGS.code(padding_mode)
    units = UNITS.code(displacement_units)
    a = _arrays(input=input, theta=theta, displacement=displacement)
    ops = [_operand(name, v) for name, v in a.items()]
    call = _calls.warp(ops[0], ops[1], ops[2], size, mode, padding_mode, align_corners, units,
                       layout, labels=True)
    out, returned = _layout.result(call, out, contiguous=False)
    arrays = _layout.logical(a["input"], call.layout), a["theta"], a["displacement"], out
    # (out's strides are in the key: a call met before writes an out of the strides its
    # kernel was prepared for)
    kernel = _backend.prepare_forward(call, *arrays) if key is not None else None
    if kernel is None:
        _backend.forward(call, *arrays)
    else:
        kernel.forward_on(*arrays)
        allocate = _layout.allocator(_layout.physical_shape(call.output_shape, layout),
                                     call.dtype, name="output")
        _prepared.remember(key, _PreparedForward(kernel, call, allocate))
    return returned


def _prepared_call(site, arrays, *arguments):
    """(key, prepared call) of a call met before (as grid_sample_3d's): the key of its
    arrays' ``_prepared.array_key`` (None for an absent one), its other arguments and the
    thread count; (None, None) where one is not a NumPy array where an array goes (the
    checks then convert or name it) or cannot be hashed."""
    if not all(a is None or type(a) is np.ndarray for a in arrays) or arrays[0] is None:
        return None, None
    return _prepared.lookup(site, *(None if a is None else _prepared.array_key(a)
                                    for a in arrays), *arguments, _config.get_num_threads())


class _PreparedForward(NamedTuple):
    """A forward's prepared kernel (``_cpu.warp.prepare_forward``), its description
    (``out``'s checks) and its result's allocator (``_layout.allocator``)."""
    kernel: Any  # the C++ backend's PreparedWarp
    call: _calls.Warp
    allocate: Callable[[], np.ndarray]


class _PreparedBackward(NamedTuple):
    """A backward's prepared kernel (``_cpu.warp.prepare_backward``), its description and
    its gradients' allocators (``_gradient_allocators``)."""
    kernel: Any  # the C++ backend's PreparedWarp
    call: _calls.Warp
    allocators: tuple


def warp_3d_backward(grad_output: np.ndarray, input: np.ndarray, theta: np.ndarray | None = None,
                     displacement: np.ndarray | None = None, mode: str = "bilinear",
                     padding_mode: str = "zeros", align_corners: bool = False,
                     output_mask: Sequence[bool] = (True, True, True), *,
                     layout: str = "NCDHW", displacement_units: str = "normalized",
                     grad_displacement_out: np.ndarray | None = None
                     ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Gradients of ``warp_3d`` with respect to ``input``, ``theta`` and ``displacement``.

    Parameters
    ----------
    grad_output : ndarray, shape (N, C, Do, Ho, Wo) (or NDHWC), dtype of ``input``
        Gradient of the loss with respect to the forward's result; it gives the output
        size (the forward's ``size``).
    input, theta, displacement, mode, padding_mode, align_corners, layout, displacement_units
        As for ``warp_3d``.
    output_mask : (bool, bool, bool)
        Which of (grad_input, grad_theta, grad_displacement) to compute; one not asked for,
        or of an operand that is None, is returned as None and costs nothing.
    grad_displacement_out : ndarray, optional
        Where to write grad_displacement (the displacement's shape and dtype, any strides:
        e.g. a part of a larger field), when it is asked for; it is returned.

    Returns
    -------
    (grad_input, grad_theta, grad_displacement) : ndarray or None
        Of the shapes of ``input`` (its dtype and layout), ``theta`` and ``displacement``
        (their dtype).

    Notes
    -----
    Deterministic: the same bits for every thread count and instruction set. The grid
    gradient of each point goes straight into ``grad_displacement`` (times the units'
    scale) and into per-row sums for ``grad_theta``; those are reduced in float64, row by
    row in a fixed order, and rounded once. No grid-sized array is allocated for theta.
    Both are exactly 0 for nearest sampling.
    """
    key, prepared = _prepared_call(
        "warp_3d_backward", (grad_output, input, theta, displacement, grad_displacement_out),
        mode, padding_mode, type(align_corners), align_corners, _calls.typed(output_mask),
        layout, displacement_units)
    if prepared is not None:  # a call met before (as warp_3d's)
        return _backward_on(prepared, grad_output, input, theta, displacement,
                            grad_displacement_out)
    mode, padding_mode = MODES.code(mode), PADDINGS.code(padding_mode)
    units = UNITS.code(displacement_units)
    a = _arrays(grad_output=grad_output, input=input, theta=theta, displacement=displacement)
    ops = [_operand(name, v) for name, v in a.items()]
    call = _calls.warp_backward(ops[0], ops[1], ops[2], ops[3], mode, padding_mode,
                                align_corners, units, output_mask, layout)
    allocators = _gradient_allocators(call)
    gradients = _gradients(call, grad_displacement_out, allocators)
    arrays = (_layout.logical(a["grad_output"], call.layout),
              _layout.logical(a["input"], call.layout), a["theta"], a["displacement"],
              *gradients)
    kernel = _backend.prepare_backward(call, *arrays) if key is not None else None
    if kernel is None:
        _backend.backward(call, *arrays)
    else:
        kernel.backward_on(*arrays)
        _prepared.remember(key, _PreparedBackward(kernel, call, allocators))
    return _returned(call, *gradients)


def _gradient_allocators(call):
    """The ``_layout.allocator`` of each gradient a backward asks for (grad_input's in its
    physical layout), None for one not asked for: made once per prepared call, whose
    repeated calls allocate with nothing worked out again."""
    want_input, want_theta, want_displacement = call.output_mask
    return (_layout.allocator(_layout.physical_shape(call.input_shape, call.layout), call.dtype,
                              name="grad_input") if want_input else None,
            _layout.allocator(call.theta_shape, call.coord_dtype, name="grad_theta")
            if want_theta else None,
            _layout.allocator(call.grid_shape, call.coord_dtype, name="grad_displacement")
            if want_displacement else None)


def _gradients(call, grad_displacement_out, allocators):
    """The arrays a backward writes its gradients into (None for one not asked for),
    allocated by ``allocators`` (``_gradient_allocators``'s): grad_input a logical view."""
    new_input, new_theta, new_displacement = allocators
    grad_input = None if new_input is None else _layout.logical(new_input(), call.layout)
    grad_theta = None if new_theta is None else new_theta()
    if new_displacement is None:
        grad_displacement = None
    elif grad_displacement_out is None:
        grad_displacement = new_displacement()
    else:
        grad_displacement = _checks.out_array("grad_displacement_out", grad_displacement_out,
                                              call.grid_shape, call.coord_dtype,
                                              contiguous=False)
    return grad_input, grad_theta, grad_displacement


def _returned(call, grad_input, grad_theta, grad_displacement):
    return (None if grad_input is None else _layout.physical(grad_input, call.layout),
            grad_theta, grad_displacement)


def _backward_on(prepared, grad_output, input, theta, displacement, grad_displacement_out):
    """A prepared backward on new arrays: no checks but ``grad_displacement_out``'s."""
    call = prepared.call
    gradients = _gradients(call, grad_displacement_out, prepared.allocators)
    prepared.kernel.backward_on(_layout.logical(grad_output, call.layout),
                                _layout.logical(input, call.layout), theta, displacement,
                                *gradients)
    return _returned(call, *gradients)
