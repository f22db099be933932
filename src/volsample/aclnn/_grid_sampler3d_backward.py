"""``aclnnGridSampler3DBackward``: phase one's checks, the plan, the run, phase two."""
from __future__ import annotations

import functools

from .. import _layout
from ..grid_sample import backward_workspace_nbytes as _grid_workspace_nbytes
from ..grid_sample import grid_sample_3d_backward
from . import _runtime as rt

_INTERPOLATION_MODES = ("bilinear", "nearest")  # index = CANN interpolationMode
_PADDING_MODES = ("zeros", "border", "reflection")  # index = CANN paddingMode

_GRID_OP = "aclnnGridSampler3DBackward"


def _grid_sampler_checks(tensors, interpolationMode, paddingMode, alignCorners, outputMask):
    """SPEC §6's first-phase checks of GridSampler3DBackward, in order."""
    yield rt.not_null(tensors)
    yield rt.kind(tensors, rt.aclTensor)
    go, inp, grid = tensors["gradOutput"], tensors["input"], tensors["grid"]
    in_grad, grid_grad = tensors["inputGrad"], tensors["gridGrad"]
    yield rt.supported_dtype("input", inp)
    for name, tensor in tensors.items():
        if name != "input":
            yield rt.same_dtype(name, tensor, "input", inp)
    for name in ("gradOutput", "input", "inputGrad"):  # volumes; a grid's tag is not read
        yield rt.volume_format(name, tensors[name])
    yield rt.choice("interpolationMode", interpolationMode, _INTERPOLATION_MODES)
    yield rt.choice("paddingMode", paddingMode, _PADDING_MODES)
    yield rt.boolean("alignCorners", alignCorners)
    for name, tensor in tensors.items():
        yield rt.rank5(name, tensor)
    N, C, D, H, W = inp.logical_shape()
    gN, gC, oD, oH, oW = go.logical_shape()
    yield rt.equal("gradOutput", "N (input's N)", (gN,), (N,))
    yield rt.equal("gradOutput", "C (input's C)", (gC,), (C,))
    yield rt.equal("grid", "N (input's N)", grid.shape[:1], (N,))
    yield rt.equal("grid", "D, H, W (gradOutput's D, H, W)", grid.shape[1:4], (oD, oH, oW))
    yield rt.equal("grid", "last dimension (x, y, z)", grid.shape[4:], (3,))
    yield rt.equal("inputGrad", "shape (N, C, D, H, W) (input's)", in_grad.logical_shape(), (N, C, D, H, W))
    yield rt.equal("gridGrad", "shape (grid's)", grid_grad.shape, grid.shape)
    if outputMask is not None:
        yield rt.kind({"outputMask": outputMask}, rt.aclBoolArray)
        yield rt.equal("outputMask", "size", (len(outputMask),), (2,))
        if outputMask.values[0]:
            yield rt.writable("inputGrad", in_grad)
        if outputMask.values[1]:
            yield rt.writable("gridGrad", grid_grad)


@rt.phase_one(_GRID_OP + "GetWorkspaceSize")
def aclnnGridSampler3DBackwardGetWorkspaceSize(gradOutput, input, grid, interpolationMode,
                                               paddingMode, alignCorners, outputMask,
                                               inputGrad, gridGrad):
    """Phase one of ``aclnnGridSampler3DBackward``: check the arguments, plan the work.

    Parameters
    ----------
    gradOutput : aclTensor, (N, C, Do, Ho, Wo) in its format
        Gradient of the forward's output.
    input : aclTensor, (N, C, Di, Hi, Wi) in its format
        The forward's volume. Its dtype is the call's: every tensor must share it
        (float16, bfloat16, float32 or float64).
    grid : aclTensor, (N, Do, Ho, Wo, 3)
        The forward's sample coordinates (x, y, z).
    interpolationMode : int
        0 bilinear (trilinear), 1 nearest.
    paddingMode : int
        0 zeros, 1 border, 2 reflection.
    alignCorners : bool
    outputMask : aclBoolArray of 2 or None
        Which of inputGrad, gridGrad to compute. None or all-false: nothing is computed.
    inputGrad : aclTensor, shape of input (in its own format)
        Output, written in place by phase two.
    gridGrad : aclTensor, shape of grid
        Output, written in place by phase two.

    Returns
    -------
    (status, workspaceSize, executor)
        ``ACLNN_SUCCESS`` with the bytes of workspace and the executor for phase two;
        on failure ``ACLNN_ERR_PARAM_NULLPTR`` (a None tensor, checked in the order
        gradOutput, input, grid, inputGrad, gridGrad) or ``ACLNN_ERR_PARAM_INVALID``
        (dtypes, formats, modes, ranks, shapes, outputMask size), with ``0, None``.

    Notes
    -----
    An empty input (a zero N, C, Di, Hi, Wi, Do, Ho or Wo) needs no workspace: phase two
    fills the requested gradients with zeros without running a kernel.
    """
    tensors = {"gradOutput": gradOutput, "input": input, "grid": grid,
               "inputGrad": inputGrad, "gridGrad": gridGrad}
    status, message = rt.first_failure(
        _grid_sampler_checks(tensors, interpolationMode, paddingMode, alignCorners, outputMask))
    if status != rt.ACLNN_SUCCESS:
        return status, message
    mask = outputMask.values if outputMask is not None else (False, False)
    args = (gradOutput, input, grid, _INTERPOLATION_MODES[interpolationMode],
            _PADDING_MODES[paddingMode], bool(alignCorners), mask, inputGrad, gridGrad)
    size = 0
    if any(mask) and not _grid_call_is_empty(input, grid):
        size = _grid_workspace_nbytes(input.logical_shape(), grid.shape, input.dtype,
                                      output_mask=mask)
        # The NumPy API returns new arrays that are copied into the caller's tensors.
        size += (inputGrad.array.nbytes if mask[0] else 0) + (gridGrad.array.nbytes if mask[1] else 0)
    return rt.ACLNN_SUCCESS, size, rt.aclOpExecutor(_GRID_OP, size, functools.partial(_run_grid, *args))


def _grid_call_is_empty(inp, grid) -> bool:
    """No voxels, channels, batch or sample points: every gradient is zero."""
    return inp.array.size == 0 or grid.array.size == 0


def _run_grid(go, inp, grid, mode, padding_mode, align_corners, mask, in_grad, grid_grad):
    if not any(mask):
        return
    if _grid_call_is_empty(inp, grid):  # zero-filled without a kernel (nor workspace)
        if mask[0]:
            in_grad.array[...] = 0
        if mask[1]:
            grid_grad.array[...] = 0
        return
    layout = inp.layout
    grad_output = _layout.physical(go.logical(), layout)  # a view in input's layout
    gi, gg = grid_sample_3d_backward(grad_output, inp.array, grid.array, mode, padding_mode,
                                     align_corners, mask, layout=layout)
    if mask[0]:
        in_grad.logical()[...] = _layout.logical(gi, layout)
    if mask[1]:
        grid_grad.array[...] = gg


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
    return rt.execute(_GRID_OP, workspace, workspaceSize, executor, stream)
