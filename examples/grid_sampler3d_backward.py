"""The aclnnGridSampler3DBackward example of the CANN documentation, in Python.

Trilinear sampling (interpolationMode 0) with zero padding (paddingMode 0) and
alignCorners false of a 1x1x1x3x3 volume holding 1..9 at the four points of a 2x2 grid;
gradOutput is all ones. Run it with ``python examples/grid_sampler3d_backward.py``; it
prints the nine values of inputGrad, then the twelve of gridGrad:

    inputGrad: 0.25, 0, 0, 0.5, 0, 0, 0.125, 0.5, 0
    gridGrad:  0.75, 0.75, -0.125, 2.625, -2.625, 0.875, 6, 2.25, -1, 0.75, -12, -2
"""

import sys

import numpy as np

from volsample import aclnn


def run():
    """Run the example; return ``(inputGrad, gridGrad)`` as NumPy arrays."""
    interpolation_mode = 0  # bilinear
    padding_mode = 0  # zeros
    align_corners = False
    grad_output_data = np.ones((1, 1, 1, 2, 2), np.float32)
    input_data = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 1, 3, 3)
    grid_data = np.array([-1, -1, 0, -1, 1, -1, -1, 0, 0, 0, 1, 0], np.float32).reshape(
        1, 1, 2, 2, 3
    )
    input_grad_data = np.zeros((1, 1, 1, 3, 3), np.float32)  # the outputs: caller's memory
    grid_grad_data = np.zeros((1, 1, 2, 2, 3), np.float32)

    grad_output = aclnn.aclCreateTensor(grad_output_data, aclnn.ACL_FORMAT_ND)
    input_tensor = aclnn.aclCreateTensor(input_data, aclnn.ACL_FORMAT_ND)
    grid = aclnn.aclCreateTensor(grid_data, aclnn.ACL_FORMAT_ND)
    input_grad = aclnn.aclCreateTensor(input_grad_data, aclnn.ACL_FORMAT_ND)
    grid_grad = aclnn.aclCreateTensor(grid_grad_data, aclnn.ACL_FORMAT_ND)
    output_mask = aclnn.aclCreateBoolArray([True, True])

    status, workspace_size, executor = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(
        grad_output,
        input_tensor,
        grid,
        interpolation_mode,
        padding_mode,
        align_corners,
        output_mask,
        input_grad,
        grid_grad,
    )
    if status != aclnn.ACLNN_SUCCESS:
        raise RuntimeError(
            f"aclnnGridSampler3DBackwardGetWorkspaceSize failed. ERROR: {status}\n"
            f"{aclnn.aclGetRecentErrMsg()}"
        )
    workspace = aclnn.aclrtMalloc(workspace_size) if workspace_size > 0 else None
    stream = aclnn.aclrtCreateStream()
    status = aclnn.aclnnGridSampler3DBackward(workspace, workspace_size, executor, stream)
    if status != aclnn.ACLNN_SUCCESS:
        raise RuntimeError(
            f"aclnnGridSampler3DBackward failed. ERROR: {status}\n{aclnn.aclGetRecentErrMsg()}"
        )
    aclnn.aclrtSynchronizeStream(stream)

    for obj in (grad_output, input_tensor, grid, input_grad, grid_grad):
        aclnn.aclDestroyTensor(obj)
    aclnn.aclDestroyBoolArray(output_mask)
    aclnn.aclrtFree(workspace)
    aclnn.aclrtDestroyStream(stream)
    return input_grad_data, grid_grad_data


def main():
    input_grad, grid_grad = run()
    for name, values in (("inputGrad", input_grad), ("gridGrad", grid_grad)):
        for i, value in enumerate(values.ravel()):
            print(f"{name} result[{i}] is: {value:f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
