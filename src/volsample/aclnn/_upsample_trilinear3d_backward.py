"""``aclnnUpsampleTrilinear3dBackward``: phase one's checks, the plan, phase two.

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
The checks are volsample's shared ones (``_checks``) run in CANN's order, plus the rules
only aclnn has (``_runtime``); a passing call becomes the op layer's description
(``_calls``), which the C++ backend runs straight into the caller's gradInput. gradInput
may have any strides: as CANN computes into a contiguous tensor and ``ViewCopy``s it into
gradInput, a gradInput whose planes the kernels cannot write as they are is written
through a contiguous copy, which the workspace counts.
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from .. import _backends, _calls, _checks, _layout, _prepared
from .._errors import InvalidArgumentError
from . import _runtime as rt

_backend = _backends.cpu("upsample")

OP = "aclnnUpsampleTrilinear3dBackward"
SCALE_NAMES = ("scalesD", "scalesH", "scalesW")


def _size(name: str, array: rt.aclIntArray, axes: str) -> None:
    if len(array) != len(axes):
        raise InvalidArgumentError(
            f"{name}: expected {len(axes)} elements ({', '.join(axes)}), got {len(array)}: "
            f"{list(array.values)}")


def _positive_spatial(outputSize: rt.aclIntArray, inputSize: rt.aclIntArray) -> None:
    for name, values in (("inputSize", inputSize.values[2:]), ("outputSize", outputSize.values)):
        if min(values) <= 0:
            raise InvalidArgumentError(
                f"{name}: expected D, H, W > 0, got {list(values)} (inputSize "
                f"{list(inputSize.values)}, outputSize {list(outputSize.values)})")


def _used_scales(scales) -> tuple:
    """The forward's scales as CANN uses them: all three when all are > 0, else none (every
    axis from its sizes, in / out). NaN is not > 0."""
    if all(s > 0 for s in scales):
        return tuple(float(s) for s in scales)
    return (None, None, None)


def _check(go, outputSize, inputSize, alignCorners, scales, gi) -> None:
    """Phase one's checks, in CANN's order."""
    # The kinds of the Python arguments.
    rt.kind({"gradOut": go, "gradInput": gi}, rt.aclTensor)
    rt.kind({"outputSize": outputSize, "inputSize": inputSize}, rt.aclIntArray)
    rt.boolean("alignCorners", alignCorners)
    for name, value in zip(SCALE_NAMES, scales):
        rt.real(name, value)
    # CheckNotNull2In2Out
    rt.not_null({"gradOut": go, "outputSize": outputSize, "inputSize": inputSize, "gradInput": gi})
    # CheckDtypeValid1Out1In
    _checks.volume_dtype("gradOut", go.dtype, rt.ACL.spell)
    _checks.same_dtype("gradInput", gi.dtype, "gradOut", go.dtype, rt.ACL.spell)
    # CheckUpsampleShape
    _checks.rank("gradOut", go.shape, 5, rt.ACL.noun)
    _size("outputSize", outputSize, "DHW")
    _size("inputSize", inputSize, "NCDHW")
    # CheckFormat
    rt.volume_format("gradOut", go)
    # CheckInputElement
    _positive_spatial(outputSize, inputSize)
    N, C = inputSize.values[:2]
    _checks.shape_equal("gradOut", go.shape,
                        _layout.physical_shape((N, C) + outputSize.values, go.layout),
                        f"shape (inputSize's N, C and outputSize, in {go.layout} order)")
    _checks.shape_equal("gradInput", gi.shape, _layout.physical_shape(inputSize.values, gi.layout),
                        f"shape (inputSize, in {gi.layout} order)")
    # volsample's own: an infinite scale that would be used (CANN would divide by it), and
    # the caller's output array must take the result.
    for name, value in zip(SCALE_NAMES, _used_scales(scales)):
        if value is not None and not math.isfinite(value):
            raise InvalidArgumentError(
                f"{name}: expected a finite scale when all three are > 0 (they are used), "
                f"got {value!r}")
    rt.writable("gradInput", gi)


@rt.phase_one(OP + "GetWorkspaceSize")
def aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(
        gradOut: Any, outputSize: Any, inputSize: Any, alignCorners: bool, scalesD: float,
        scalesH: float, scalesW: float, gradInput: Any) -> tuple[int, rt.aclOpExecutor]:
    # Any: a C pointer may be null or of the wrong kind; phase one checks each at run time.
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
    key, plan = rt.plan(OP, gradOut, outputSize, inputSize, alignCorners, scalesD, scalesH,
                        scalesW, gradInput)
    if plan is None:
        scales = (scalesD, scalesH, scalesW)
        _check(gradOut, outputSize, inputSize, alignCorners, scales, gradInput)
        # The call as every front door describes it; the kernels work in gradInput's layout.
        call = _calls.upsample_backward(rt.operand("gradOut", gradOut), inputSize.values,
                                        bool(alignCorners), _used_scales(scales),
                                        gradInput.layout, shape_order="NCDHW", dialect=rt.ACL)
        operands = gradOut.logical(), gradInput.logical()
        plan = _Plan(call, _backend.workspace_nbytes(call, backward=True, result=operands[1]),
                     _backend.prepare_backward(call, *operands) if _backend.preparable(*operands)
                     else None)
        if key is not None:
            _prepared.remember(key, plan)
    if plan.kernel is None:
        run = functools.partial(_backend.backward, plan.call, gradOut.logical(),
                                gradInput.logical())
    else:  # (it reads only the arrays' addresses)
        run = functools.partial(plan.kernel.backward_on, gradOut.array, gradInput.array)
    return plan.workspace_size, rt.aclOpExecutor(OP, plan.workspace_size, run)


class _Plan(NamedTuple):
    """A checked call's description, workspace and prepared kernel (None: the general
    path, ``_cpu.upsample.backward``: a copy, nothing to compute, bfloat16, or a gradInput
    written through a contiguous copy)."""
    call: _calls.Upsample
    workspace_size: int
    kernel: Any



def aclnnUpsampleTrilinear3dBackward(workspace: np.ndarray | None, workspaceSize: int,
                                     executor: rt.aclOpExecutor | None,
                                     stream: rt.aclrtStream | None = None) -> int:
    """Phase two of ``aclnnUpsampleTrilinear3dBackward``: run the executor once.

    Parameters and return values as for ``aclnnGridSampler3DBackward``.
    """
    return rt.execute(OP, workspace, workspaceSize, executor, stream)
