"""``aclnnUpsampleTrilinear3dBackward``: phase one's checks, the plan, the run, phase two."""
from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from .. import _layout
from ..upsample import backward_workspace_nbytes as _upsample_workspace_nbytes
from ..upsample import upsample_trilinear_3d_backward
from . import _runtime as rt

_UPSAMPLE_OP = "aclnnUpsampleTrilinear3dBackward"


def _int_array(name: str, array: rt.aclIntArray, axes: str, positive: str):
    """``array`` has one element per letter of ``axes``; those of ``positive`` are > 0."""
    values = array.values
    if len(values) != len(axes):
        return (rt.ACLNN_ERR_PARAM_INVALID,
                f"{name}: expected {len(axes)} elements ({', '.join(axes)}), got {len(values)}: {list(values)}")
    if any(v <= 0 for axis, v in zip(axes, values) if axis in positive):
        return (rt.ACLNN_ERR_PARAM_INVALID,
                f"{name}: expected {', '.join(positive)} > 0, got {list(values)} ({', '.join(axes)})")
    return rt.OK


def _scale(name: str, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return rt.ACLNN_ERR_PARAM_INVALID, f"{name}: expected a finite number, got {type(value).__name__} {value!r}"
    return rt.OK


def _upsample_checks(go, outputSize, inputSize, alignCorners, scales, gi):
    """SPEC §6's first-phase checks of UpsampleTrilinear3dBackward, in order (then the
    scalar arguments and the output's writability)."""
    yield rt.not_null({"gradOut": go, "outputSize": outputSize, "inputSize": inputSize, "gradInput": gi})
    yield rt.kind({"gradOut": go, "gradInput": gi}, rt.aclTensor)
    yield rt.kind({"outputSize": outputSize, "inputSize": inputSize}, rt.aclIntArray)
    yield rt.supported_dtype("gradOut", go)
    yield rt.volume_format("gradOut", go)
    yield rt.volume_format("gradInput", gi)
    yield rt.same_dtype("gradInput", gi, "gradOut", go)
    yield rt.rank5("gradOut", go)
    yield _int_array("outputSize", outputSize, "DHW", positive="DHW")
    yield _int_array("inputSize", inputSize, "NCDHW", positive="DHW")
    N, C, oD, oH, oW = go.logical_shape()
    yield rt.equal("gradOut", "N, C (inputSize's)", (N, C), inputSize.values[:2])
    yield rt.equal("gradOut", "D, H, W (outputSize)", (oD, oH, oW), outputSize.values)
    yield rt.equal("gradInput", f"shape (inputSize in {gi.layout} order)", gi.shape,
                 _layout.physical_shape(inputSize.values, gi.layout))
    yield rt.boolean("alignCorners", alignCorners)
    for name, value in zip(("scalesD", "scalesH", "scalesW"), scales):
        yield _scale(name, value)
    yield rt.writable("gradInput", gi)


@rt.phase_one(_UPSAMPLE_OP + "GetWorkspaceSize")
def aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(gradOut, outputSize, inputSize, alignCorners,
                                                     scalesD, scalesH, scalesW, gradInput):
    """Phase one of ``aclnnUpsampleTrilinear3dBackward``: check the arguments, plan the work.

    Parameters
    ----------
    gradOut : aclTensor, (N, C, Do, Ho, Wo) in its format
        Gradient of the forward's output; float16, bfloat16, float32 or float64.
    outputSize : aclIntArray of 3
        (Do, Ho, Wo), the forward's output size; each > 0.
    inputSize : aclIntArray of 5
        (N, C, Di, Hi, Wi), the forward's input shape in NCDHW order whatever the formats;
        Di, Hi, Wi > 0.
    alignCorners : bool
    scalesD, scalesH, scalesW : float
        The forward's scale factors; a value <= 0 means "from the sizes" (in / out) on that
        axis. Ignored with alignCorners.
    gradInput : aclTensor, inputSize in its format (N, D, H, W, C for NDHWC)
        Output, gradOut's dtype, written in place by phase two.

    Returns
    -------
    (status, workspaceSize, executor)
        ``ACLNN_SUCCESS`` with the bytes of workspace and the executor for phase two; on
        failure ``ACLNN_ERR_PARAM_NULLPTR`` (a None gradOut, outputSize, inputSize or
        gradInput) or ``ACLNN_ERR_PARAM_INVALID``, with ``0, None``.

    Notes
    -----
    A zero N or C needs no workspace and no work. Unlike the NPU, sizes above 2^20 per
    dimension or 60 GB in all are accepted.
    """
    scales = (scalesD, scalesH, scalesW)
    status, message = rt.first_failure(
        _upsample_checks(gradOut, outputSize, inputSize, alignCorners, scales, gradInput))
    if status != rt.ACLNN_SUCCESS:
        return status, message
    align_corners, scales = bool(alignCorners), tuple(float(s) for s in scales)
    size = 0
    if gradInput.array.size:
        size = _upsample_workspace_nbytes(gradOut.logical_shape(), inputSize.values, gradOut.dtype,
                                          align_corners, scales, layout=gradInput.layout)
        size += gradInput.array.nbytes  # the NumPy API's result, copied into gradInput
    run = functools.partial(_run_upsample, gradOut, inputSize.values, align_corners, scales,
                            gradInput)
    return rt.ACLNN_SUCCESS, size, rt.aclOpExecutor(_UPSAMPLE_OP, size, run)


def _run_upsample(go, input_size, align_corners, scales, gi):
    if gi.array.size == 0:  # a zero N or C: nothing to compute
        return
    layout = gi.layout
    grad_output = _layout.physical(go.logical(), layout)  # a view in gradInput's layout
    result = upsample_trilinear_3d_backward(grad_output, input_size, align_corners, scales,
                                            layout=layout)
    gi.logical()[...] = _layout.logical(result, layout)


def aclnnUpsampleTrilinear3dBackward(workspace, workspaceSize, executor, stream=None) -> int:
    """Phase two of ``aclnnUpsampleTrilinear3dBackward``: run the executor once.

    Parameters and return values as for ``aclnnGridSampler3DBackward``.
    """
    return rt.execute(_UPSAMPLE_OP, workspace, workspaceSize, executor, stream)
