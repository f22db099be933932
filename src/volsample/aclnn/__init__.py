"""The CANN two-phase API (``aclnn``) on top of volsample's NumPy functions.

Mirrors, in Python, the C interface of Ascend CANN's ``aclnnGridSampler3DBackward`` and
``aclnnUpsampleTrilinear3dBackward``: tensors are wrapped with ``aclCreateTensor``, phase
one (``...GetWorkspaceSize``) checks every argument and returns
``(status, workspaceSize, executor)``, phase two runs the executor and writes the results
into the caller's output tensors in place. Nothing here raises on bad input: every failure
is a status code, and ``aclGetRecentErrMsg()`` says what was wrong.

Conventions
-----------
* ``None`` stands for a null pointer.
* Phase one makes CANN's checks in CANN's order (each operator module names its op_api
  source), after the kinds of the Python arguments, which C's types would fix.
* Formats are read as CANN's op_api code reads them: a 5-D volume tagged
  ``ACL_FORMAT_NDHWC`` is (N, D, H, W, C), under any other tag (N, C, D, H, W).
  GridSampler3DBackward reads gradOutput and inputGrad in input's format, whatever their
  tags; UpsampleTrilinear3dBackward reads gradOut and gradInput each in its own. A grid is
  always (N, Do, Ho, Wo, 3), whatever its tag.
* Workspace: phase one reports the bytes of scratch memory phase two really allocates (the
  kernels' scratch, as ``backward_workspace_nbytes`` counts it; results are written
  straight into the caller's tensors). Phase two refuses a smaller
  ``workspaceSize`` or buffer with ``ACLNN_ERR_PARAM_INVALID``; the kernels allocate their
  own scratch, so the buffer's contents are never read or written.
* An executor runs once: a second run returns ``ACLNN_ERR_PARAM_INVALID`` (the executor
  argument is no longer valid; nothing is computed). A run refused before it starts (a
  null or too-small workspace, a bad stream) does not use the executor up.
* ``ACLNN_ERR_RUNTIME_ERROR`` is a failure of the computation itself in phase two (or,
  should one slip through, an internal error in phase one), never a bad argument.
* Streams: CPU work runs synchronously, so ``stream=None`` (the default stream) and a
  stream from ``aclrtCreateStream`` both mean "run now"; ``aclrtSynchronizeStream`` is
  a no-op that returns ``ACL_SUCCESS``.

Layout: ``_runtime`` holds the objects, status codes and runtime calls; each operator has
its own module (``_grid_sampler3d_backward``, ``_upsample_trilinear3d_backward``) with its
phase-one checks, the plan, the one function that runs the computation, and phase two.

Examples
--------
>>> import numpy as np
>>> from volsample import aclnn
>>> grad_out = aclnn.aclCreateTensor(np.ones((1, 1, 2, 2, 2), np.float32), aclnn.ACL_FORMAT_NCDHW)
>>> result = np.zeros((1, 1, 1, 1, 1), np.float32)
>>> grad_in = aclnn.aclCreateTensor(result, aclnn.ACL_FORMAT_NCDHW)
>>> status, size, executor = aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(
...     grad_out, aclnn.aclCreateIntArray([2, 2, 2]), aclnn.aclCreateIntArray([1, 1, 1, 1, 1]),
...     False, 0.0, 0.0, 0.0, grad_in)
>>> workspace = aclnn.aclrtMalloc(size) if size > 0 else None
>>> aclnn.aclnnUpsampleTrilinear3dBackward(workspace, size, executor, None), result.item()
(0, 8.0)
"""
from ._grid_sampler3d_backward import (
    aclnnGridSampler3DBackward,
    aclnnGridSampler3DBackwardGetWorkspaceSize,
)
from ._runtime import (
    ACL_BF16,
    ACL_DOUBLE,
    ACL_DT_UNDEFINED,
    ACL_ERROR_INVALID_PARAM,
    ACL_FLOAT,
    ACL_FLOAT16,
    ACL_FORMAT_FRACTAL_NZ,
    ACL_FORMAT_FRACTAL_Z,
    ACL_FORMAT_NC1HWC0,
    ACL_FORMAT_NCDHW,
    ACL_FORMAT_NCHW,
    ACL_FORMAT_ND,
    ACL_FORMAT_NDC1HWC0,
    ACL_FORMAT_NDHWC,
    ACL_FORMAT_NHWC,
    ACL_FORMAT_UNDEFINED,
    ACL_MEM_MALLOC_HUGE_FIRST,
    ACL_OPT_DETERMINISTIC,
    ACL_SUCCESS,
    ACLNN_ERR_PARAM_INVALID,
    ACLNN_ERR_PARAM_NULLPTR,
    ACLNN_ERR_RUNTIME_ERROR,
    ACLNN_SUCCESS,
    aclBoolArray,
    aclCreateBoolArray,
    aclCreateIntArray,
    aclCreateTensor,
    aclDestroyAclOpExecutor,
    aclDestroyBoolArray,
    aclDestroyIntArray,
    aclDestroyTensor,
    aclGetRecentErrMsg,
    aclIntArray,
    aclOpExecutor,
    aclrtCreateStream,
    aclrtCtxGetSysParamOpt,
    aclrtCtxSetSysParamOpt,
    aclrtDestroyStream,
    aclrtFree,
    aclrtMalloc,
    aclrtStream,
    aclrtSynchronizeStream,
    aclTensor,
)
from ._upsample_trilinear3d_backward import (
    aclnnUpsampleTrilinear3dBackward,
    aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize,
)
