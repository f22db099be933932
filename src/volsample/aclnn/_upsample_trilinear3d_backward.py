"""``aclnnUpsampleTrilinear3dBackward``: phase one's checks, the plan, the run, phase two.

The checks are CANN's, in CANN's order (hicann/ops-cv,
``image/upsample_trilinear3d_backward/op_host/op_api/aclnn_upsample_trilinear_3d_backward.cpp``
and the shared ``common/level2_base.h``), after the kinds of the Python arguments (what
C's types would guarantee):

1. ``CheckNotNull2In2Out``: gradOut, outputSize, inputSize, gradInput (161001).
2. ``CheckDtypeValid1Out1In``: gradOut's dtype is supported, then gradInput's is gradOut's.
3. ``CheckUpsampleShape``: gradOut is 5-D, outputSize has 3 elements, inputSize 5.
4. ``CheckFormat``: gradOut is tagged ND, NCDHW or NDHWC (gradInput's tag is not checked).
5. ``CheckInputElement``: inputSize's D, H, W and outputSize's are > 0; gradOut's shape is
   (N, C, Do, Ho, Wo) and gradInput's (N, C, Di, Hi, Wi), each in its own format.
   (``CheckUplimit``, the NPU's int32 size limits, is not imposed.)
6. An empty gradOut or gradInput: success with no workspace.

The scales are used only when all three are > 0; otherwise every axis maps by its sizes.
"""
from __future__ import annotations

import functools
import math

from .. import _layout
from ..upsample import backward_workspace_nbytes as _upsample_workspace_nbytes
from ..upsample import upsample_trilinear_3d_backward
from . import _runtime as rt

OP = "aclnnUpsampleTrilinear3dBackward"
SCALE_NAMES = ("scalesD", "scalesH", "scalesW")


def _size(name: str, array: rt.aclIntArray, axes: str):
    if len(array) != len(axes):
        return (rt.ACLNN_ERR_PARAM_INVALID,
                f"{name}: expected {len(axes)} elements ({', '.join(axes)}), got {len(array)}: "
                f"{list(array.values)}")
    return rt.OK


def _positive_spatial(outputSize: rt.aclIntArray, inputSize: rt.aclIntArray):
    for name, values in (("inputSize", inputSize.values[2:]), ("outputSize", outputSize.values)):
        if min(values) <= 0:
            return (rt.ACLNN_ERR_PARAM_INVALID,
                    f"{name}: expected D, H, W > 0, got {list(values)} (inputSize "
                    f"{list(inputSize.values)}, outputSize {list(outputSize.values)})")
    return rt.OK


def _used_scales(scales) -> tuple:
    """The forward's scales as CANN uses them: all three when all are > 0, else none (every
    axis from its sizes, in / out). NaN is not > 0."""
    if all(s > 0 for s in scales):
        return tuple(float(s) for s in scales)
    return (None, None, None)


def _checks(go, outputSize, inputSize, alignCorners, scales, gi):
    """Phase one's checks in order, lazily: each may rely on the ones before it."""
    # The kinds of the Python arguments.
    yield rt.kind({"gradOut": go, "gradInput": gi}, rt.aclTensor)
    yield rt.kind({"outputSize": outputSize, "inputSize": inputSize}, rt.aclIntArray)
    yield rt.boolean("alignCorners", alignCorners)
    for name, value in zip(SCALE_NAMES, scales):
        yield rt.real(name, value)
    # CheckNotNull2In2Out
    yield rt.not_null({"gradOut": go, "outputSize": outputSize, "inputSize": inputSize, "gradInput": gi})
    # CheckDtypeValid1Out1In
    yield rt.supported_dtype("gradOut", go)
    yield rt.same_dtype("gradInput", gi, "gradOut", go)
    # CheckUpsampleShape
    yield rt.rank5("gradOut", go)
    yield _size("outputSize", outputSize, "DHW")
    yield _size("inputSize", inputSize, "NCDHW")
    # CheckFormat
    yield rt.volume_format("gradOut", go)
    # CheckInputElement
    yield _positive_spatial(outputSize, inputSize)
    N, C = inputSize.values[:2]
    yield rt.equal("gradOut", f"shape (inputSize's N, C and outputSize, in {go.layout} order)",
                   go.shape, _layout.physical_shape((N, C) + outputSize.values, go.layout))
    yield rt.equal("gradInput", f"shape (inputSize, in {gi.layout} order)", gi.shape,
                   _layout.physical_shape(inputSize.values, gi.layout))
    # volsample's own: an infinite scale that would be used (CANN would divide by it), and
    # the caller's output array must take the result.
    for name, value in zip(SCALE_NAMES, _used_scales(scales)):
        if value is not None and not math.isfinite(value):
            yield (rt.ACLNN_ERR_PARAM_INVALID,
                   f"{name}: expected a finite scale when all three are > 0 (they are used), "
                   f"got {value!r}")
    yield rt.writable("gradInput", gi)


@rt.phase_one(OP + "GetWorkspaceSize")
def aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(gradOut, outputSize, inputSize, alignCorners,
                                                     scalesD, scalesH, scalesW, gradInput):
    """Phase one of ``aclnnUpsampleTrilinear3dBackward``: check the arguments, plan the work.

    Parameters
    ----------
    gradOut : aclTensor, (N, C, Do, Ho, Wo) in its format
        Gradient of the forward's output; float16, bfloat16, float32 or float64; tagged
        ND, NCDHW or NDHWC.
    outputSize : aclIntArray of 3
        (Do, Ho, Wo), the forward's output size; each > 0.
    inputSize : aclIntArray of 5
        (N, C, Di, Hi, Wi), the forward's input shape in NCDHW order whatever the formats;
        Di, Hi, Wi > 0.
    alignCorners : bool
    scalesD, scalesH, scalesW : float
        The forward's scale factors, used only when all three are > 0; otherwise every
        axis maps by its sizes (in / out). Ignored with alignCorners.
    gradInput : aclTensor, inputSize in its format (N, D, H, W, C when tagged NDHWC)
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
        _checks(gradOut, outputSize, inputSize, alignCorners, scales, gradInput))
    if status != rt.ACLNN_SUCCESS:
        return status, message
    align_corners, scales = bool(alignCorners), _used_scales(scales)
    size = 0
    if gradOut.array.size and gradInput.array.size:
        size = _upsample_workspace_nbytes(gradOut.logical_shape(), inputSize.values, gradOut.dtype,
                                          align_corners, scales, layout=gradInput.layout)
        size += gradInput.array.nbytes  # the NumPy API's result, copied into gradInput
    run = functools.partial(_run, gradOut.logical(), inputSize.values, align_corners, scales,
                            gradInput.logical(), gradInput.layout)
    return rt.ACLNN_SUCCESS, size, rt.aclOpExecutor(OP, size, run)


def _run(grad_output, input_size, align_corners, scales, grad_input, layout):
    """The computation: ``grad_output`` and ``grad_input`` are (N, C, D, H, W) views of the
    caller's arrays; the kernels work in ``layout`` (gradInput's)."""
    if grad_output.size == 0 or grad_input.size == 0:  # a zero N or C: nothing to compute
        return
    result = upsample_trilinear_3d_backward(_layout.physical(grad_output, layout), input_size,
                                            align_corners, scales, layout=layout)
    grad_input[...] = _layout.logical(result, layout)


def aclnnUpsampleTrilinear3dBackward(workspace, workspaceSize, executor, stream=None) -> int:
    """Phase two of ``aclnnUpsampleTrilinear3dBackward``: run the executor once.

    Parameters and return values as for ``aclnnGridSampler3DBackward``.
    """
    return rt.execute(OP, workspace, workspaceSize, executor, stream)
