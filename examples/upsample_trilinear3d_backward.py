"""The aclnnUpsampleTrilinear3dBackward example of the CANN documentation, in Python.

gradOut is a 2x2x2x2x2 tensor holding 1..32 (NCDHW); the forward upsampled a 2x2x1x1x1
input to 2x2x2 (alignCorners false, scales 0: derived from the sizes), so each input voxel
receives the sum of its eight outputs. Run it with
``python examples/upsample_trilinear3d_backward.py``; it prints gradInput:

    36, 100, 164, 228
"""

import sys

import numpy as np

from volsample import aclnn


def run():
    """Run the example; return gradInput as a NumPy array."""
    grad_out_data = np.arange(1, 33, dtype=np.float32).reshape(2, 2, 2, 2, 2)
    grad_input_data = np.full((2, 2, 1, 1, 1), 2.0, np.float32)  # overwritten by the result
    output_size_data = [2, 2, 2]
    input_size_data = [2, 2, 1, 1, 1]
    align_corners = False
    scales_d = scales_h = scales_w = 0.0

    grad_out = aclnn.aclCreateTensor(grad_out_data, aclnn.ACL_FORMAT_NCDHW)
    grad_input = aclnn.aclCreateTensor(grad_input_data, aclnn.ACL_FORMAT_NCDHW)
    output_size = aclnn.aclCreateIntArray(output_size_data)
    input_size = aclnn.aclCreateIntArray(input_size_data)

    status, workspace_size, executor = aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(
        grad_out, output_size, input_size, align_corners, scales_d, scales_h, scales_w, grad_input
    )
    if status != aclnn.ACLNN_SUCCESS:
        raise RuntimeError(
            f"aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize failed. ERROR: {status}\n"
            f"{aclnn.aclGetRecentErrMsg()}"
        )
    workspace = aclnn.aclrtMalloc(workspace_size) if workspace_size > 0 else None
    stream = aclnn.aclrtCreateStream()
    status = aclnn.aclnnUpsampleTrilinear3dBackward(workspace, workspace_size, executor, stream)
    if status != aclnn.ACLNN_SUCCESS:
        raise RuntimeError(
            f"aclnnUpsampleTrilinear3dBackward failed. ERROR: {status}\n"
            f"{aclnn.aclGetRecentErrMsg()}"
        )
    aclnn.aclrtSynchronizeStream(stream)

    aclnn.aclDestroyTensor(grad_out)
    aclnn.aclDestroyTensor(grad_input)
    aclnn.aclDestroyIntArray(output_size)
    aclnn.aclDestroyIntArray(input_size)
    aclnn.aclrtFree(workspace)
    aclnn.aclrtDestroyStream(stream)
    return grad_input_data


def main():
    for i, value in enumerate(run().ravel()):
        print(f"result[{i}] is: {value:f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
