"""``aclnnGridSampler3DBackward``: phase one's checks, the plan, phase two.

The checks are CANN's, in CANN's order (hicann/ops-cv,
``image/grid_sampler3_d_grad/op_host/op_api/aclnn_grid_sampler3d_backward.cpp``), after the
kinds of the Python arguments (what C's types would guarantee):

1. ``outputMask`` None or all false: success, nothing checked, nothing computed.
2. ``CheckNotNull2In1Out``: gradOutput, input, grid, inputGrad, gridGrad (161001).
3. ``CheckDtypeValid``: each other tensor's dtype is input's, then input's is supported.
4. ``CheckAttrValid``: paddingMode in [0, 2], then interpolationMode in [0, 1].
5. ``CheckShape``: input, grid, gradOutput are 5-D; N of grid and gradOutput; C and
   (D, H, W) of gradOutput; grid's last dimension 3; inputGrad's shape is input's and
   gridGrad's is grid's. gradOutput and inputGrad are read in *input's* format: CANN never
   reads their own format tags (nor any other tag: a tensor is NDHWC when tagged so,
   NCDHW otherwise).
6. An empty gradOutput, input or grid: success with no workspace.

The checks are volsample's shared ones (``_checks``, ``_tables``) run in CANN's order, plus
the rules only aclnn has (``_runtime``); a passing call becomes the op layer's description
(``_calls``), which the C++ backend runs straight into the caller's arrays.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from .. import _backends, _calls, _checks, _prepared
from .._tables import MODES, PADDINGS
from . import _runtime as rt

_backend = _backends.cpu("grid_sample")

OP = "aclnnGridSampler3DBackward"


def _requested(outputMask) -> tuple[bool, bool]:
    return (False, False) if outputMask is None else outputMask.values


def _check(tensors, interpolationMode, paddingMode, alignCorners, outputMask
           ) -> tuple[int, int] | None:
    """Phase one's checks in CANN's order; the kernel integers of the modes, or None when
    the mask asks for nothing (CANN returns before its checks)."""
    # The kinds of the Python arguments.
    rt.kind(tensors, rt.aclTensor)
    rt.integer("interpolationMode", interpolationMode)
    rt.integer("paddingMode", paddingMode)
    rt.boolean("alignCorners", alignCorners)
    rt.kind({"outputMask": outputMask}, rt.aclBoolArray)
    if outputMask is not None:  # CANN reads elements 0 and 1 unchecked
        _checks.shape_equal("outputMask", (len(outputMask),), (2,), "size")
    if not any(_requested(outputMask)):
        return None
    # CheckNotNull2In1Out
    rt.not_null(tensors)
    go, inp, grid = tensors["gradOutput"], tensors["input"], tensors["grid"]
    # CheckDtypeValid
    for name in ("gradOutput", "grid", "inputGrad", "gridGrad"):
        _checks.same_dtype(name, tensors[name].dtype, "input", inp.dtype, rt.ACL.spell)
    _checks.volume_dtype("input", inp.dtype, rt.ACL.spell)
    # CheckAttrValid: CANN's GridSampler3DBackward has no bicubic (interpolationMode 2), even
    # though volsample's own API has one.
    padding = PADDINGS.from_cann(paddingMode, "paddingMode")
    mode = MODES.from_cann(interpolationMode, "interpolationMode")
    # CheckShape
    for name in ("input", "grid", "gradOutput"):
        _checks.rank(name, tensors[name].shape, 5, rt.ACL.noun)
    layout = inp.layout
    N, C = inp.logical_shape()[:2]
    gN, gC, oD, oH, oW = go.logical_shape(layout)
    _checks.shape_equal("grid", grid.shape[:1], (N,), "N (input's N)")
    _checks.shape_equal("gradOutput", (gN,), (N,), "N (input's N)")
    _checks.shape_equal("gradOutput", (gC,), (C,), f"C (input's C; read in input's layout {layout})")
    _checks.shape_equal("grid", grid.shape[1:4], (oD, oH, oW),
                        f"D, H, W (gradOutput's, read in input's layout {layout})")
    _checks.shape_equal("grid", grid.shape[4:], (3,), "last dimension (x, y, z)")
    _checks.shape_equal("inputGrad", tensors["inputGrad"].shape, inp.shape,
                        f"shape (input's, in input's layout {layout})")
    _checks.shape_equal("gridGrad", tensors["gridGrad"].shape, grid.shape, "shape (grid's)")
    # Python's own: the caller's output arrays must take the results.
    for name, wanted in zip(("inputGrad", "gridGrad"), outputMask.values):
        if wanted:
            rt.writable(name, tensors[name])
    return mode, padding


def _is_empty(*tensors) -> bool:
    """No sample points, voxels, channels or batch: every gradient is zero."""
    return any(t.array.size == 0 for t in tensors)


@rt.phase_one(OP + "GetWorkspaceSize")
def aclnnGridSampler3DBackwardGetWorkspaceSize(
        gradOutput: Any, input: Any, grid: Any, interpolationMode: int, paddingMode: int,
        alignCorners: bool, outputMask: Any, inputGrad: Any, gridGrad: Any
        ) -> tuple[int, rt.aclOpExecutor]:
    # Any: a C pointer may be null or of the wrong kind; phase one checks each at run time.
    """Phase one of ``aclnnGridSampler3DBackward``: check the arguments, plan the work.

    Parameters
    ----------
    gradOutput : aclTensor, (N, C, Do, Ho, Wo) in input's format
        Gradient of the forward's output. Read in input's format whatever its own tag.
    input : aclTensor, (N, C, Di, Hi, Wi) in its format
        The forward's volume: ``ACL_FORMAT_NDHWC`` is (N, Di, Hi, Wi, C), any other tag
        (N, C, Di, Hi, Wi). Its dtype is the call's: every tensor must share it (float16,
        bfloat16, float32 or float64).
    grid : aclTensor, (N, Do, Ho, Wo, 3)
        The forward's sample coordinates (x, y, z), whatever its tag.
    interpolationMode : int
        0 bilinear (trilinear), 1 nearest.
    paddingMode : int
        0 zeros, 1 border, 2 reflection.
    alignCorners : bool
    outputMask : aclBoolArray of 2 or None
        Which of inputGrad, gridGrad to compute. None or all false: nothing is checked
        or computed (CANN returns success before its checks).
    inputGrad : aclTensor, input's shape
        Output, in input's format whatever its own tag; written in place by phase two.
    gridGrad : aclTensor, grid's shape
        Output, written in place by phase two.

    Returns
    -------
    (status, workspaceSize, executor)
        ``ACLNN_SUCCESS`` with the bytes of workspace and the executor for phase two;
        on failure ``ACLNN_ERR_PARAM_NULLPTR`` (a None tensor, checked in the order
        gradOutput, input, grid, inputGrad, gridGrad) or ``ACLNN_ERR_PARAM_INVALID``
        (dtypes, modes, ranks, shapes, outputMask's size), with ``0, None``.

    Notes
    -----
    An empty gradOutput, input or grid needs no workspace: phase two fills the requested
    gradients with zeros without running a kernel.
    """
    key, plan = rt.plan(OP, gradOutput, input, grid, interpolationMode, paddingMode,
                        alignCorners, outputMask, inputGrad, gridGrad)
    if plan is None:
        tensors = {"gradOutput": gradOutput, "input": input, "grid": grid,
                   "inputGrad": inputGrad, "gridGrad": gridGrad}
        modes = _check(tensors, interpolationMode, paddingMode, alignCorners, outputMask)
        if modes is None:  # nothing asked for
            return 0, rt.aclOpExecutor(OP, 0, lambda: None)
        mask = _requested(outputMask)
        if _is_empty(gradOutput, input, grid):  # zero gradients, without a kernel
            outputs = (inputGrad.logical(input.layout) if mask[0] else None,
                       gridGrad.array if mask[1] else None)
            return 0, rt.aclOpExecutor(OP, 0, functools.partial(_zero, outputs))
        # The call as every front door describes it; gradOutput and the gradients in
        # input's layout.
        call = _calls.grid_sample_backward(
            rt.operand("gradOutput", gradOutput, input.layout), rt.operand("input", input),
            _calls.operand("grid", grid.array), *modes, bool(alignCorners), mask, input.layout,
            shape_order="NCDHW", dialect=rt.ACL)
        plan = _Plan(call, _backend.workspace_nbytes(call), _prepare(
            call, *_operands(call, gradOutput, input, grid, inputGrad, gridGrad)))
        if key is not None:
            _prepared.remember(key, plan)
    if plan.kernel is None:
        run = functools.partial(_backend.backward, plan.call,
                                *_operands(plan.call, gradOutput, input, grid, inputGrad, gridGrad))
    else:  # (it reads only the arrays' addresses)
        want_input, want_grid = plan.call.output_mask
        run = functools.partial(plan.kernel.backward_on, gradOutput.array, input.array,
                                grid.array, inputGrad.array if want_input else None,
                                gridGrad.array if want_grid else None)
    return plan.workspace_size, rt.aclOpExecutor(OP, plan.workspace_size, run)


class _Plan(NamedTuple):
    """A checked call's description, workspace and prepared kernel (None: the general
    path, ``_cpu.grid_sample.backward``)."""
    call: _calls.GridSample
    workspace_size: int
    kernel: Any



def _operands(call, gradOutput, input, grid, inputGrad, gridGrad) -> tuple:
    """The kernel's operands: (N, C, D, H, W) views, in input's layout, of the tensors'
    arrays; None for a gradient not asked for."""
    want_input, want_grid = call.output_mask
    return (gradOutput.logical(call.layout), input.logical(), grid.array,
            inputGrad.logical(call.layout) if want_input else None,
            gridGrad.array if want_grid else None)


def _prepare(call, *operands):
    """The call's prepared kernel, where it runs on these operands' memory as it is (the
    gradients dense: the kernel zeroes them whole); else None."""
    gradients = [a for a in operands[3:] if a is not None]
    if not _backend.preparable(*operands) or not all(_dense(a) for a in gradients):
        return None
    return _backend.prepare_backward(call, *operands)


def _dense(a: np.ndarray) -> bool:
    """Whether an array's elements fill their span (in some axis order) without gaps."""
    return a.size == 0 or (min(a.strides) >= 0 and sum((n - 1) * s for n, s in zip(
        a.shape, a.strides)) + a.itemsize == a.size * a.itemsize)


def _zero(outputs):
    for out in outputs:
        if out is not None:
            out[...] = 0


def aclnnGridSampler3DBackward(workspace: np.ndarray | None, workspaceSize: int,
                               executor: rt.aclOpExecutor | None,
                               stream: rt.aclrtStream | None = None) -> int:
    """Phase two of ``aclnnGridSampler3DBackward``: run the executor once.

    Parameters
    ----------
    workspace : buffer or None
        At least ``workspaceSize`` bytes (``aclrtMalloc``); None when the size is 0.
    workspaceSize : int
        At least the size phase one returned.
    executor : aclOpExecutor
        From ``aclnnGridSampler3DBackwardGetWorkspaceSize``, not run before.
    stream : aclrtStream or None
        None runs on the default stream; the work is done when this returns.

    Returns
    -------
    int
        ``ACLNN_SUCCESS``; ``ACLNN_ERR_PARAM_NULLPTR`` for a None executor or a None
        workspace that is needed; ``ACLNN_ERR_PARAM_INVALID`` for a too-small workspace, a
        used or foreign executor or a bad stream; ``ACLNN_ERR_RUNTIME_ERROR`` if the
        computation fails.
    """
    return rt.execute(OP, workspace, workspaceSize, executor, stream)
