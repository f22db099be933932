"""``aclnnGridSampler3DBackward``: phase one's checks, the plan, the run, phase two.

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
"""
from __future__ import annotations

import functools

from .. import _layout
from ..grid_sample import backward_workspace_nbytes as _grid_workspace_nbytes
from ..grid_sample import grid_sample_3d_backward
from . import _runtime as rt

OP = "aclnnGridSampler3DBackward"
# index = CANN's integer. CANN's GridSampler3DBackward has no bicubic: 2 stays invalid here
# even though volsample's own API has mode="bicubic".
INTERPOLATION_MODES = ("bilinear", "nearest")
PADDING_MODES = ("zeros", "border", "reflection")


def _requested(outputMask) -> tuple[bool, bool]:
    return (False, False) if outputMask is None else outputMask.values


def _checks(tensors, interpolationMode, paddingMode, alignCorners, outputMask):
    """Phase one's checks in order, lazily: each may rely on the ones before it."""
    # The kinds of the Python arguments.
    yield rt.kind(tensors, rt.aclTensor)
    yield rt.integer("interpolationMode", interpolationMode)
    yield rt.integer("paddingMode", paddingMode)
    yield rt.boolean("alignCorners", alignCorners)
    yield rt.kind({"outputMask": outputMask}, rt.aclBoolArray)
    if outputMask is not None:  # CANN reads elements 0 and 1 unchecked
        yield rt.equal("outputMask", "size", (len(outputMask),), (2,))
    if not any(_requested(outputMask)):  # CANN returns before its checks
        return
    # CheckNotNull2In1Out
    yield rt.not_null(tensors)
    go, inp, grid = tensors["gradOutput"], tensors["input"], tensors["grid"]
    in_grad, grid_grad = tensors["inputGrad"], tensors["gridGrad"]
    # CheckDtypeValid
    for name in ("gradOutput", "grid", "inputGrad", "gridGrad"):
        yield rt.same_dtype(name, tensors[name], "input", inp)
    yield rt.supported_dtype("input", inp)
    # CheckAttrValid
    yield rt.choice("paddingMode", paddingMode, PADDING_MODES)
    yield rt.choice("interpolationMode", interpolationMode, INTERPOLATION_MODES)
    # CheckShape
    for name in ("input", "grid", "gradOutput"):
        yield rt.rank5(name, tensors[name])
    layout = inp.layout
    N, C = inp.logical_shape()[:2]
    gN, gC, oD, oH, oW = _layout.logical_shape(go.shape, layout)
    yield rt.equal("grid", "N (input's N)", grid.shape[:1], (N,))
    yield rt.equal("gradOutput", "N (input's N)", (gN,), (N,))
    yield rt.equal("gradOutput", f"C (input's C; read in input's layout {layout})", (gC,), (C,))
    yield rt.equal("grid", f"D, H, W (gradOutput's, read in input's layout {layout})",
                   grid.shape[1:4], (oD, oH, oW))
    yield rt.equal("grid", "last dimension (x, y, z)", grid.shape[4:], (3,))
    yield rt.equal("inputGrad", f"shape (input's, in input's layout {layout})", in_grad.shape, inp.shape)
    yield rt.equal("gridGrad", "shape (grid's)", grid_grad.shape, grid.shape)
    # Python's own: the caller's output arrays must take the results.
    for name, wanted in zip(("inputGrad", "gridGrad"), outputMask.values):
        if wanted:
            yield rt.writable(name, tensors[name])


def _is_empty(grad_output, input, grid) -> bool:
    """No sample points, voxels, channels or batch: every gradient is zero."""
    return grad_output.size == 0 or input.size == 0 or grid.size == 0


@rt.phase_one(OP + "GetWorkspaceSize")
def aclnnGridSampler3DBackwardGetWorkspaceSize(gradOutput, input, grid, interpolationMode,
                                               paddingMode, alignCorners, outputMask,
                                               inputGrad, gridGrad):
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
    tensors = {"gradOutput": gradOutput, "input": input, "grid": grid,
               "inputGrad": inputGrad, "gridGrad": gridGrad}
    status, message = rt.first_failure(
        _checks(tensors, interpolationMode, paddingMode, alignCorners, outputMask))
    if status != rt.ACLNN_SUCCESS:
        return status, message
    mask = _requested(outputMask)
    if not any(mask):
        return rt.ACLNN_SUCCESS, 0, rt.aclOpExecutor(OP, 0, lambda: None)
    size = 0
    if not _is_empty(gradOutput.array, input.array, grid.array):
        size = _grid_workspace_nbytes(input.logical_shape(), grid.shape, input.dtype,
                                      output_mask=mask)
        # The NumPy API returns new arrays that are copied into the caller's tensors.
        size += (inputGrad.array.nbytes if mask[0] else 0) + (gridGrad.array.nbytes if mask[1] else 0)
    run = functools.partial(_run, gradOutput.array, input.array, grid.array, input.layout,
                            INTERPOLATION_MODES[interpolationMode], PADDING_MODES[paddingMode],
                            bool(alignCorners), mask, inputGrad.array, gridGrad.array)
    return rt.ACLNN_SUCCESS, size, rt.aclOpExecutor(OP, size, run)


def _run(grad_output, input, grid, layout, mode, padding_mode, align_corners, mask,
         input_grad, grid_grad):
    """The computation: the arrays of gradOutput, input and inputGrad are all in ``layout``
    (input's), grid and gridGrad are (N, Do, Ho, Wo, 3); results go into the last two."""
    if _is_empty(grad_output, input, grid):  # zero gradients, without a kernel
        if mask[0]:
            input_grad[...] = 0
        if mask[1]:
            grid_grad[...] = 0
        return
    gi, gg = grid_sample_3d_backward(grad_output, input, grid, mode, padding_mode, align_corners,
                                     mask, layout=layout)
    if mask[0]:
        input_grad[...] = gi
    if mask[1]:
        grid_grad[...] = gg


def aclnnGridSampler3DBackward(workspace, workspaceSize, executor, stream=None) -> int:
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
