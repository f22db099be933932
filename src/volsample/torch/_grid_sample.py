"""Grid sampling for PyTorch: ``grid_sample`` (5-D ``F.grid_sample``) on the custom ops
``volsample::grid_sampler_3d`` and ``volsample::grid_sampler_3d_backward``.

The ops mirror ``aten::grid_sampler_3d`` and its backward (kernel integers of
``volsample._tables``: interpolation 0 bilinear, 1 nearest, 2 bicubic, 3 bspline; padding
0 zeros, 1 border, 2 reflection). Each builds the call's checked description
(``volsample._calls``, through ``_grid_call``) and hands it to a backend: the C++ kernels
for CPU tensors (through NumPy views of their memory), the Triton kernels for CUDA
tensors; fake implementations give torch.compile the result shapes, dtypes and memory
formats. Their derivatives along a grid direction are ``_grid_jvp``'s ops. Semantics:
docs/semantics.md.
"""
from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch

from .. import _config, _prepared
from .._tables import MODES, PADDINGS
from . import _devices, _dispatch, _grid_call, _grid_jvp, _memory, _operands, _wording
from ._devices import CPU, CUDA

_FORWARD_SCHEMA = ("(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, "
                   "bool align_corners) -> Tensor")
_BACKWARD_SCHEMA = ("(Tensor grad_output, Tensor input, Tensor grid, int interpolation_mode, "
                    "int padding_mode, bool align_corners, bool[] output_mask) -> (Tensor, Tensor)")


class _PreparedForward:
    """A forward's prepared call: a class (not a NamedTuple) so that an eager call's autograd
    context can hold it by weak reference. A graph kept by a global at exit outlives the
    interpreter's teardown, and nanobind then reports every kernel it holds as leaked:
    only the caches hold kernels."""
    __slots__ = ("kernel", "out", "modes", "backwards", "__weakref__")

    def __init__(self, kernel, out, modes: tuple, backwards: dict):
        # the backend's PreparedGridSample (the C++ core's, or the Triton kernels'); None:
        # nothing to compute
        self.kernel = kernel
        self.out = out  # the result's _memory.allocator
        # (interpolation_mode, padding_mode, align_corners): the kernel's integers
        self.modes = modes
        # (grad_output's shape, strides and dtype, needs_input_grad) -> _PreparedBackward:
        # the eager backward's calls of this forward
        self.backwards = backwards


@_dispatch.custom_op("grid_sampler_3d", _FORWARD_SCHEMA)
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    """``aten::grid_sampler_3d`` semantics: ``input`` (N, C, D, H, W) sampled at ``grid``
    (N, Do, Ho, Wo, 3), giving (N, C, Do, Ho, Wo) in the input's dtype and memory format."""
    return _sample(input, grid, *_prepared_forward(input, grid, interpolation_mode,
                                                   padding_mode, align_corners))


def _sample(input, grid, prepared: _PreparedForward, out=None) -> torch.Tensor:
    """A CPU call of ``prepared``'s key on ``input`` and ``grid``, into ``out`` if given
    (the result it was prepared on), else a new result."""
    if out is None:
        out = prepared.out()
    if prepared.kernel is not None:
        prepared.kernel.forward(input.const_data_ptr(), grid.const_data_ptr(), out.data_ptr())
    return out


def _prepared_forward(input, grid, *modes, device: _devices.Device = CPU
                      ) -> tuple[_PreparedForward, torch.Tensor | None]:
    """The prepared kernel of a call on ``device``'s backend: the one of its key, or, the
    first time, one checked, described and prepared on its tensors (views of them, for
    the C++ core) and its result, which comes with it then (None after: no second
    allocation)."""
    key = ("torch.grid_sampler_3d", *device.key(input), *device.key(grid), *modes,
           device.setting())
    prepared = _prepared.find(key)
    if prepared is not None:
        return prepared, None
    call = _grid_call.describe(input, grid, *modes)
    out = _memory.empty_volume(call.output_shape, input)
    kernel = device.backend("grid_sample").prepare_forward(
        call, device.read(input), device.read(grid), device.write(out))
    return _prepared.remember(key,
                              _PreparedForward(kernel, _memory.allocator(out), modes, {})), out


@_dispatch.register_kernel(grid_sampler_3d, "cuda")
def _grid_sampler_3d_cuda(input, grid, interpolation_mode, padding_mode, align_corners):
    """The CPU kernel's way with the Triton backend: its prepared call, run on the tensors."""
    prepared, out = _prepared_forward(input, grid, interpolation_mode, padding_mode,
                                      align_corners, device=CUDA)
    if out is None:
        out = prepared.out()
    if prepared.kernel is not None:
        prepared.kernel.forward_on(input, grid, out)
    return out


@_dispatch.register_fake(grid_sampler_3d)
def _grid_sampler_3d_fake(input, grid, interpolation_mode, padding_mode, align_corners):
    call = _grid_call.describe(input, grid, interpolation_mode, padding_mode, align_corners)
    return _memory.empty_volume(call.output_shape, input)


class _PreparedBackward(NamedTuple):
    kernel: Any  # the backend's PreparedGridSample; None: the general path (on the C++
    #              core, a 16-bit grad_input, or nothing for the kernel to do)
    grad_input: Any  # the gradients' _memory.allocator, None where not asked for
    grad_grid: Any


@_dispatch.custom_op("grid_sampler_3d_backward", _BACKWARD_SCHEMA)
def grid_sampler_3d_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                             align_corners, output_mask):
    """Gradients (grad_input, grad_grid) of ``grid_sampler_3d``; grad_input has the input's
    memory format, grad_grid is contiguous. ``output_mask`` selects them: one not asked
    for is not computed and comes back as an empty tensor (an op cannot return None)."""
    gradients = _backward(grad_output, input, grid, interpolation_mode, padding_mode,
                          align_corners, output_mask)
    return _grid_call.returned(gradients, input, grid)


def _backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
              output_mask):
    """``grid_sampler_3d_backward``'s CPU work: (grad_input, grad_grid), None where not
    asked for."""
    modes = interpolation_mode, padding_mode, align_corners
    return _run_backward(*_prepared_backward(grad_output, input, grid, modes, output_mask),
                         grad_output, input, grid, modes, output_mask)


def _run_backward(prepared, gradients, grad_output, input, grid, modes, output_mask):
    """A CPU backward of ``prepared``'s key into ``gradients`` if given (those it was
    prepared on), else new ones: (grad_input, grad_grid), None where not asked for."""
    if gradients is None:
        gradients = (None if prepared.grad_input is None else prepared.grad_input(),
                     None if prepared.grad_grid is None else prepared.grad_grid())
    grad_input, grad_grid = gradients
    if prepared.kernel is None:
        _general_backward(grad_output, input, grid, modes, output_mask, gradients, CPU)
    else:
        prepared.kernel.backward(grad_output.const_data_ptr(), input.const_data_ptr(),
                                 grid.const_data_ptr(), _address(grad_input),
                                 _address(grad_grid))
    return grad_input, grad_grid


def _general_backward(grad_output, input, grid, modes, output_mask, gradients, device):
    """The backward of the backend's ``backward`` (no prepared kernel), into ``gradients``."""
    call = _grid_call.describe_backward(grad_output, input, grid, *modes, output_mask)
    device.backend("grid_sample").backward(
        call, *map(device.read, (grad_output, input, grid)), *map(device.write, gradients),
        **device.options(device.setting()))


def _prepared_backward(grad_output, input, grid, modes, output_mask,
                       device: _devices.Device = CPU):
    """The prepared kernel of a backward on ``device``'s backend and, the first time, the
    gradients it was prepared on (``_prepared_forward``'s)."""
    key = ("torch.grid_sampler_3d_backward", *device.key(grad_output), *device.key(input),
           *device.key(grid), *modes, *output_mask, device.setting())
    prepared = _prepared.find(key)
    if prepared is not None:
        return prepared, None
    call = _grid_call.describe_backward(grad_output, input, grid, *modes, output_mask)
    gradients = _grid_call.gradients(call, input, grid)
    kernel = device.backend("grid_sample").prepare_backward(
        call, *map(device.read, (grad_output, input, grid)), *map(device.write, gradients),
        **device.options(key[-1]))
    allocators = (None if t is None else _memory.allocator(t) for t in gradients)
    prepared = _prepared.remember(key, _PreparedBackward(kernel, *allocators))
    return prepared, gradients


def _address(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


@_dispatch.register_kernel(grid_sampler_3d_backward, "cuda")
def _grid_sampler_3d_backward_cuda(grad_output, input, grid, interpolation_mode, padding_mode,
                                   align_corners, output_mask):
    """The CPU kernel's way with the Triton backend: its prepared call, run on the tensors."""
    modes = interpolation_mode, padding_mode, align_corners
    prepared, gradients = _prepared_backward(grad_output, input, grid, modes, output_mask,
                                             device=CUDA)
    if gradients is None:
        gradients = tuple(None if new is None else new()
                          for new in (prepared.grad_input, prepared.grad_grid))
    if prepared.kernel is None:
        _general_backward(grad_output, input, grid, modes, output_mask, gradients, CUDA)
    else:
        prepared.kernel.backward_on(grad_output, input, grid, *gradients)
    return _grid_call.returned(gradients, input, grid)


@_dispatch.register_fake(grid_sampler_3d_backward)
def _grid_sampler_3d_backward_fake(grad_output, input, grid, interpolation_mode, padding_mode,
                                   align_corners, output_mask):
    return _grid_call.empty_gradients(grad_output, input, grid, interpolation_mode,
                                      padding_mode, align_corners, output_mask)


# ---------------------------------------------------------------------------------------
# Batching rules (torch.func.vmap): one op call per vmapped call
# ---------------------------------------------------------------------------------------


@_dispatch.register_vmap(grid_sampler_3d)
def _grid_sampler_3d_vmap(info, in_dims, input, grid, *modes):
    return _grid_call.sample_batched(grid_sampler_3d, info, in_dims, (input, grid), modes)


@_dispatch.register_vmap(grid_sampler_3d_backward)
def _grid_sampler_3d_backward_vmap(info, in_dims, grad_output, input, grid, *modes_and_mask):
    tensors = _dispatch.fold_into_n(info.batch_size, in_dims, (grad_output, input, grid))
    return _dispatch.unfold_n(grid_sampler_3d_backward(*tensors, *modes_and_mask),
                              info.batch_size)


# ---------------------------------------------------------------------------------------
# Autograd: one torch.autograd.Function per op, with backward and jvp, that only calls
# the other Functions (so that derivatives of derivatives, and torch.func's nested
# transforms, stay inside them). Each also is its op's Autograd kernel.
# ---------------------------------------------------------------------------------------

def _given(t):
    """Whether an incoming gradient or tangent carries something (an unasked output's
    gradient arrives as None or as an empty tensor)."""
    return t is not None and t.numel() > 0


def _add(a, b):
    return b if a is None else a if b is None else a + b


def _forward(input, grid, *modes):
    return _dispatch.call(_GridSampler3d, grid_sampler_3d, input, grid, *modes)


_cpu_backward = _dispatch.cpu_kernel(grid_sampler_3d_backward)


def _backward_op(grad_output, input, grid, *modes_and_mask):
    if not torch.is_grad_enabled() and _dispatch.eager(grad_output, input, grid):
        return _cpu_backward(grad_output, input, grid, *modes_and_mask)  # a plain backward
    return _dispatch.call(_GridSampler3dBackward, grid_sampler_3d_backward, grad_output, input,
                          grid, *modes_and_mask)


class _GridSampler3d(_dispatch.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(input, grid, interpolation_mode, padding_mode, align_corners):
        return _dispatch.below_autograd(grid_sampler_3d, input, grid, interpolation_mode,
                                        padding_mode, align_corners)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:2])
        if _dispatch.forward_ad_active():
            ctx.save_for_forward(*inputs[:2])
        ctx.modes = inputs[2:]  # interpolation_mode, padding_mode, align_corners

    @staticmethod
    def backward(ctx, grad_output):
        input, grid = ctx.saved_tensors
        mask = list(ctx.needs_input_grad[:2])  # an ungrad'ed operand costs nothing
        grad_input, grad_grid = _backward_op(grad_output, input, grid, *ctx.modes, mask)
        return grad_input if mask[0] else None, grad_grid if mask[1] else None, None, None, None

    @staticmethod
    def jvp(ctx, input_tangent, grid_tangent, *_):
        # Linear in the input; along the grid, the derivative of the weights.
        input, grid = ctx.saved_tensors
        out = None
        if input_tangent is not None:
            out = _forward(input_tangent, grid, *ctx.modes)
        if grid_tangent is not None:
            out = _add(out, _grid_jvp.grid_jvp(input, grid, grid_tangent, *ctx.modes))
        return out


class _GridSampler3dBackward(_dispatch.Function):
    """The backward as a function of (grad_output, input, grid): linear in grad_output and
    in input; its grid derivatives are the second derivatives of the forward."""
    generate_vmap_rule = True

    @staticmethod
    def forward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                output_mask):
        return _dispatch.below_autograd(grid_sampler_3d_backward, grad_output, input, grid,
                                        interpolation_mode, padding_mode, align_corners,
                                        output_mask)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3])
        if _dispatch.forward_ad_active():
            ctx.save_for_forward(*inputs[:3])
        ctx.modes = inputs[3:6]
        ctx.output_mask = list(inputs[6])
        ctx.mark_non_differentiable(*(t for t, m in zip(output, ctx.output_mask) if not m))

    @staticmethod
    def backward(ctx, grad_grad_input, grad_grad_grid):
        grad_output, input, grid = ctx.saved_tensors
        want_go, want_input, want_grid = ctx.needs_input_grad[:3]
        ggi = grad_grad_input if ctx.output_mask[0] and _given(grad_grad_input) else None
        ggg = grad_grad_grid if ctx.output_mask[1] and _given(grad_grad_grid) else None
        smooth = MODES.of(ctx.modes[0]).grid_gradient  # nearest: piecewise constant
        g_go = g_input = g_grid = None
        if want_go:  # the backward is the adjoint: its own adjoint is the forward
            if ggi is not None:
                g_go = _forward(ggi, grid, *ctx.modes)
            if ggg is not None and smooth:
                g_go = _add(g_go, _grid_jvp.grid_jvp(input, grid, ggg, *ctx.modes))
        if ggg is not None and smooth and (want_input or want_grid):
            g_input, g_grid = _grid_jvp.backward_grid_jvp(grad_output, input, grid, ggg,
                                                          *ctx.modes, [want_input, want_grid])
        if want_grid and ggi is not None and smooth:  # grad_input's own grid derivative
            g_grid = _add(g_grid, _backward_op(grad_output, ggi, grid, *ctx.modes,
                                               [False, True])[1])
        return (g_go if want_go else None, g_input if want_input else None,
                g_grid if want_grid else None, None, None, None, None)

    @staticmethod
    def jvp(ctx, go_tangent, input_tangent, grid_tangent, *_):
        grad_output, input, grid = ctx.saved_tensors
        want_input, want_grid = ctx.output_mask
        smooth = MODES.of(ctx.modes[0]).grid_gradient  # nearest: piecewise constant
        grad_input = grad_grid = None
        if go_tangent is not None:
            grad_input, grad_grid = _backward_op(go_tangent, input, grid, *ctx.modes,
                                                 ctx.output_mask)
        if input_tangent is not None and want_grid and smooth:
            grad_grid = _add(grad_grid, _backward_op(grad_output, input_tangent, grid,
                                                     *ctx.modes, [False, True])[1])
        if grid_tangent is not None and smooth:
            gi, gg = _grid_jvp.backward_grid_jvp(grad_output, input, grid, grid_tangent,
                                                 *ctx.modes, ctx.output_mask)
            grad_input, grad_grid = _add(grad_input, gi), _add(grad_grid, gg)
        # A gradient not asked for is a non-differentiable output: its tangent is None.
        zeros = _grid_sampler_3d_backward_fake(grad_output, input, grid, *ctx.modes,
                                               ctx.output_mask)
        return (None if not want_input else _or_zero(grad_input, zeros[0]),
                None if not want_grid else _or_zero(grad_grid, zeros[1]))


def _or_zero(tangent, empty):
    return empty.zero_() if tangent is None else tangent


_dispatch.set_autograd_kernels({"grid_sampler_3d": _GridSampler3d,
                                "grid_sampler_3d_backward": _GridSampler3dBackward})


def grid_sample(input: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear",
                padding_mode: str = "zeros", align_corners: bool = False) -> torch.Tensor:
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
    mode : {"bilinear", "nearest", "bicubic", "bspline"}
        "bilinear" is trilinear interpolation; "nearest" rounds half to even. "trilinear"
        is accepted as another name of "bilinear" (``F.grid_sample`` under ``patch()``
        keeps PyTorch's names and refuses it, as PyTorch does). "bicubic" is PyTorch's
        4-D bicubic (cubic convolution, A = -0.75) carried to 3-D, over the 4x4x4
        neighbours, each padded on its own; "bspline" weighs the same neighbours with the
        cubic B-spline, ``input`` read as its coefficients (``spline_coefficients``).
    padding_mode : {"zeros", "border", "reflection"}
        What points outside the volume read.
    align_corners : bool or None
        True: -1 and +1 are the centres of the corner voxels; False (or None, PyTorch's
        default): their outer edges.

    Returns
    -------
    Tensor, shape (N, C, Do, Ho, Wo), in ``input``'s dtype and memory format.

    Notes
    -----
    Runs ``torch.ops.volsample.grid_sampler_3d``, which works under ``torch.compile``.
    CPU tensors are computed in place in their own memory (no copies); 16-bit data is
    computed in float32 and rounded once, more accurately than PyTorch's CPU kernel. The
    gradient for ``grid`` is computed only when ``grid`` requires it. Forward-mode AD
    (``torch.autograd.forward_ad``, ``torch.func.jvp``/``jacfwd``) and double backward
    work (second derivatives; third ones raise). ``align_corners=None`` means False.

    Examples
    --------
    >>> import torch, volsample.torch
    >>> volume = torch.arange(8.0).reshape(1, 1, 2, 2, 2)
    >>> centre = torch.zeros(1, 1, 1, 1, 3)
    >>> volsample.torch.grid_sample(volume, centre, align_corners=True).flatten()
    tensor([3.5000])
    """
    key = None
    # (eager first: torch.compile never traces the lookup, nor guards on the cache; asked
    # once, for the lookup and for the first call's way alike)
    eager = _dispatch.eager(input, grid)
    if eager and (align_corners is None or type(align_corners) is bool):
        try:  # a call met before: its prepared kernel, found with no other check
            key = (_EAGER, input.shape, input.stride(), input.dtype, grid.shape, grid.stride(),
                   grid.dtype, mode, padding_mode, align_corners, _config.get_num_threads())
            prepared = _find(key)
        except (AttributeError, TypeError, RuntimeError):  # no tensors, no hashable mode
            key = prepared = None
        if prepared is not None:
            if _grad_enabled() and (input.requires_grad or grid.requires_grad):
                return _eager_apply(input, grid, prepared)
            return _sample(input, grid, prepared)
    with _wording.torch_errors(_wording.GRID_SAMPLER):
        _operands.tensor("input", input)
        _operands.tensor("grid", grid)
        modes = (MODES.code(mode), PADDINGS.code(padding_mode),
                 _operands.align_corners(align_corners))
    if not eager:
        return _forward(input, grid, *modes)
    prepared, out = _prepared_forward(input, grid, *modes)
    if prepared.kernel is None:  # nothing to compute: the general path
        return _forward(input, grid, *modes)
    if key is not None:
        _prepared.remember(key, prepared)
    if torch.is_grad_enabled() and (input.requires_grad or grid.requires_grad):
        return _eager_apply(input, grid, prepared)
    return _sample(input, grid, prepared, out)


# grid_sample's eager calls met before, kept in ``_prepared``: (_EAGER, each tensor's shape,
# strides and dtype, the mode and padding strings, align_corners, the thread count) ->
# their _PreparedForward (the op's, under a second key: the strings not yet made codes). A
# call of a key found there passed the checks before, so only its being eager is asked again.
_EAGER = "torch.grid_sample"
_find = _prepared.find
_grad_enabled = torch.is_grad_enabled  # bound once, as _dispatch.nothing_watches's tests


class _EagerGridSampler3d(torch.autograd.Function):
    """``grid_sample``'s Function for eager calls on plain CPU tensors, handed the call's
    ``_PreparedForward``: its forward runs that kernel; it saves nothing for forward mode
    (an eager call has no forward-AD level and no transform); its backward runs the
    prepared backward kernel when the gradient is a plain CPU tensor too, nothing watches
    (``_dispatch.direct``; the operands were checked by the forward) and the forward's
    prepared call is still cached (the context holds it by weak reference: a change of
    the thread count forgets it), else ``_GridSampler3d``'s. The old-style
    ``forward(ctx, ...)`` is one Python call, where ``setup_context`` would be a second."""

    @staticmethod
    def forward(ctx, input, grid, prepared):
        ctx.save_for_backward(input, grid)
        ctx.modes = prepared.modes
        ctx.prepared = _weak(prepared)
        return _sample(input, grid, prepared)

    @staticmethod
    def backward(ctx, grad_output):
        forward = ctx.prepared()
        if forward is None or _grad_enabled() or not _dispatch.direct((grad_output,)):
            return _GridSampler3d.backward(ctx, grad_output)
        input, grid = ctx.saved_tensors
        # (grad_output's shape and dtype are the result's when the engine calls, but
        # ``grad_fn.apply`` may be handed anything)
        key = grad_output.shape, grad_output.stride(), grad_output.dtype, ctx.needs_input_grad
        prepared = forward.backwards.get(key)
        gradients = None
        mask = key[3][:2]
        modes = ctx.modes
        if prepared is None:
            prepared, gradients = _prepared_backward(grad_output, input, grid, modes, mask)
            _prepared.remember(key, prepared, forward.backwards)
        return *_run_backward(prepared, gradients, grad_output, input, grid, modes, mask), None


_weak = weakref.ref


# The engine calls a backward node's ``apply``, whose default finds the user's backward in
# two more Python calls: this node's is that backward itself.
_EagerGridSampler3d._backward_cls.apply = _EagerGridSampler3d.backward
_eager_apply = _dispatch.c_apply(_EagerGridSampler3d)
