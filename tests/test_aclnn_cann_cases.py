"""CANN's own op_api unit-test calls of both operators, replayed through ``volsample.aclnn``.

hicann/ops-cv tests each operator's phase one with gtest cases that describe tensors
(shape, dtype, format), call ``...GetWorkspaceSize`` and compare its status with an
expected one:

* ``image/grid_sampler3_d_grad/tests/ut/op_host/op_api/test_aclnn_grid_sampler3d_backward.cpp``
  and its earlier version ``test_grid_sampler3d_backward.cpp`` beside it;
* ``image/upsample_trilinear3d_backward/tests/ut/op_host/op_api/test_aclnn_upsample_trilinear_3d_backward.cpp``
  and its earlier version ``test_upsample_trilinear_3d_backward.cpp``.

Every call of those files is one row below (the union of both versions), named after its
gtest case. Each runs through phase one with random data of the stated shape, dtype and
format and must return the status the upstream case expects; a successful one also runs
phase two. Calls that cannot apply are listed beside the data with the reason.
"""
from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np
import pytest

from volsample import aclnn

OK, NULLPTR, INVALID = 0, 161001, 161002
NCDHW, NDHWC = aclnn.ACL_FORMAT_NCDHW, aclnn.ACL_FORMAT_NDHWC

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)


class Tensor(NamedTuple):
    """A gtest ``TensorDesc``: shape, dtype, format."""
    shape: tuple
    dtype: np.dtype
    format: int


def t(dtype, fmt, *shape) -> Tensor:
    return Tensor(shape, dtype, fmt)


def make_tensor(desc, rng, low=-1.0, high=1.0):
    """An aclTensor of random data in [low, high) (gtest's ValueRange), or None for a
    null description."""
    if desc is None:
        return None
    data = rng.uniform(low, high, desc.shape).astype(desc.dtype)
    return aclnn.aclCreateTensor(data, desc.format)


# --- aclnnGridSampler3DBackward ------------------------------------------------------------

class GridCase(NamedTuple):
    gradOutput: Tensor | None
    input: Tensor | None
    grid: Tensor | None
    inputGrad: Tensor | None
    gridGrad: Tensor | None
    interpolationMode: int
    paddingMode: int
    alignCorners: bool
    outputMask: tuple
    expected: int


def grid_case(dtype=F32, gradOutput=(1, 1, 1, 2, 2), input=(1, 1, 1, 3, 3), grid=(1, 1, 2, 2, 3),
              inputGrad=(1, 1, 1, 3, 3), gridGrad=(1, 1, 2, 2, 3), mode=0, padding=0, align=False,
              mask=(True, True), *, expected, null=()):
    """A row in the upstream file's shorthand: every tensor NCDHW of one dtype, the
    shapes of its common call unless given, the tensors named in ``null`` null."""
    shapes = dict(gradOutput=gradOutput, input=input, grid=grid, inputGrad=inputGrad, gridGrad=gridGrad)
    tensors = {name: None if name in null else t(dtype, NCDHW, *shape) for name, shape in shapes.items()}
    return GridCase(**tensors, interpolationMode=mode, paddingMode=padding, alignCorners=align,
                    outputMask=mask, expected=expected)


GRID_CASES = {
    "gradOutput_nullptr": grid_case(null=("gradOutput",), expected=NULLPTR),
    "input_nullptr": grid_case(null=("input",), expected=NULLPTR),
    "grid_nullptr": grid_case(null=("grid",), expected=NULLPTR),
    "inputGrad_nullptr": grid_case(null=("inputGrad",), expected=NULLPTR),
    "gridGrad_nullptr": grid_case(null=("gridGrad",), expected=NULLPTR),
    "dtype_float16": grid_case(F16, expected=OK),
    "dtype_float32": grid_case(F32, expected=OK),
    # active in the earlier file, commented out in the later one (the NPU's AI core has no
    # double); CANN's op_api lists DOUBLE as supported and so does volsample
    "dtype_double": grid_case(F64, expected=OK),
    "dtype_bf16": grid_case(BF16, expected=OK),
    "ascend910B2_case_transpose": grid_case(F32, expected=OK),
    # an NDHWC input: gradOutput and inputGrad are read in input's format, so inputGrad tagged
    # NCDHW but shaped like input is valid (only in the later file)
    "ascend910B2_case_no_transpose": GridCase(
        gradOutput=t(F16, NDHWC, 1, 1, 2, 2, 1), input=t(F16, NDHWC, 1, 1, 3, 3, 1),
        grid=t(F16, NCDHW, 1, 1, 2, 2, 3), inputGrad=t(F16, NCDHW, 1, 1, 3, 3, 1),
        gridGrad=t(F16, NCDHW, 1, 1, 2, 2, 3), interpolationMode=0, paddingMode=0,
        alignCorners=False, outputMask=(True, True), expected=OK),
    "output_mask_false_false": grid_case(mask=(False, False), expected=OK),
    "shape_n_input1_grid2": grid_case(grid=(2, 1, 2, 2, 3), expected=INVALID),
    "shape_c_input1_output2": grid_case(gradOutput=(1, 2, 1, 2, 2), expected=INVALID),
    "shape_h_grid2_output3": grid_case(gradOutput=(1, 1, 1, 3, 2), expected=INVALID),
    "shape_w_grid2_output4": grid_case(gradOutput=(1, 1, 1, 2, 4), expected=INVALID),
    "mode_3": grid_case(mode=3, expected=INVALID),
    "padding_mode_3": grid_case(padding=3, expected=INVALID),
}


@pytest.mark.parametrize("case", GRID_CASES.values(), ids=GRID_CASES.keys())
def test_grid_sampler3d_backward_upstream_case(case):
    rng = np.random.default_rng(3)
    tensors = {name: make_tensor(getattr(case, name), rng)
               for name in ("gradOutput", "input", "grid", "inputGrad", "gridGrad")}
    status, size, executor = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(
        tensors["gradOutput"], tensors["input"], tensors["grid"], case.interpolationMode,
        case.paddingMode, case.alignCorners, aclnn.aclCreateBoolArray(list(case.outputMask)),
        tensors["inputGrad"], tensors["gridGrad"])
    assert status == case.expected, aclnn.aclGetRecentErrMsg()
    if status == OK:
        workspace = aclnn.aclrtMalloc(size) if size else None
        assert aclnn.aclnnGridSampler3DBackward(workspace, size, executor) == OK, aclnn.aclGetRecentErrMsg()


# --- aclnnUpsampleTrilinear3dBackward ----------------------------------------------------

class UpsampleCase(NamedTuple):
    gradOut: Tensor | None
    outputSize: tuple | None
    inputSize: tuple | None
    alignCorners: bool
    scales: tuple
    gradInput: Tensor | None
    expected: int


def upsample_case(dtype=F32, gradOut=(2, 2, 3, 4, 5), outputSize=(3, 4, 5), inputSize=(2, 2, 6, 8, 10),
                  align=False, scales=(0.0, 0.0, 0.0), gradInput=(2, 2, 6, 8, 10), *, expected,
                  grad_input_dtype=None, null=()):
    """A row in the upstream file's shorthand: NCDHW tensors, the common call's sizes unless
    given, the arguments named in ``null`` null."""
    return UpsampleCase(
        gradOut=None if "gradOut" in null else t(dtype, NCDHW, *gradOut),
        outputSize=None if "outputSize" in null else outputSize,
        inputSize=None if "inputSize" in null else inputSize,
        alignCorners=align, scales=scales,
        gradInput=None if "gradInput" in null else t(grad_input_dtype or dtype, NCDHW, *gradInput),
        expected=expected)


# case_invalid_dtype_abnormal loops over these aclDataTypes; ACL_STRING is left out: NumPy
# has no tensor dtype of strings CANN would mean (its 'U'/'S' dtypes are fixed-width text).
INVALID_DTYPES = {"uint8": np.uint8, "int8": np.int8, "int16": np.int16, "int32": np.int32,
                  "int64": np.int64, "bool": np.bool_, "complex64": np.complex64,
                  "complex128": np.complex128}

UPSAMPLE_CASES = {
    "case_double_normal": upsample_case(F64, expected=OK),  # in the earlier file only
    "case_float_normal": upsample_case(F32, expected=OK),
    "case_float_with_scale_normal": upsample_case(F32, align=True, expected=OK),
    "case_float16_normal": upsample_case(F16, expected=OK),
    **{f"case_invalid_dtype_abnormal[{name}]": upsample_case(np.dtype(dtype), expected=INVALID)
       for name, dtype in INVALID_DTYPES.items()},
    "case_shape_0_2_3_4_5_normal": upsample_case(gradOut=(0, 2, 3, 4, 5), inputSize=(0, 2, 6, 8, 10),
                                                 gradInput=(0, 2, 6, 8, 10), expected=OK),
    "case_shape_2_0_3_4_5_normal": upsample_case(gradOut=(2, 0, 3, 4, 5), inputSize=(2, 0, 6, 8, 10),
                                                 gradInput=(2, 0, 6, 8, 10), expected=OK),
    "case_shape_2_2_0_4_5_abnormal": upsample_case(gradOut=(2, 2, 0, 4, 5), expected=INVALID),
    "case_shape_2_2_3_0_5_abnormal": upsample_case(gradOut=(2, 2, 3, 0, 5), expected=INVALID),
    "case_shape_2_2_3_4_0_abnormal": upsample_case(gradOut=(2, 2, 3, 4, 0), expected=INVALID),
    "case_2d_abnormal": upsample_case(gradOut=(2, 2), expected=INVALID),
    "case_6d_abnormal": upsample_case(gradOut=(2, 2, 3, 4, 5, 6), expected=INVALID),
    "case_grad_out_nullptr_abnormal": upsample_case(null=("gradOut",), expected=NULLPTR),
    "case_output_size_nullptr_abnormal": upsample_case(null=("outputSize",), expected=NULLPTR),
    "case_input_size_nullptr_abnormal": upsample_case(null=("inputSize",), expected=NULLPTR),
    "case_grad_input_nullptr_abnormal": upsample_case(null=("gradInput",), expected=NULLPTR),
    "case_float_double_abnormal": upsample_case(F32, grad_input_dtype=F64, expected=INVALID),
    "case_output_size_3_4_abnormal": upsample_case(outputSize=(3, 4), expected=INVALID),
    "case_output_size_0_4_5_abnormal": upsample_case(outputSize=(0, 4, 5), expected=INVALID),
    "case_input_size_2_2_6_8_abnormal": upsample_case(inputSize=(2, 2, 6, 8), gradInput=(2, 2, 6, 8),
                                                      expected=INVALID),
    "case_input_size_2_2_0_8_10_abnormal": upsample_case(inputSize=(2, 2, 0, 8, 10),
                                                         gradInput=(2, 2, 0, 8, 10), expected=INVALID),
    # The next three assert nothing upstream (their EXPECT_EQ lines are commented out), and
    # despite their names the calls are consistent: CANN's checks pass them, and so do ours.
    "case_nc_diff_abnormal": upsample_case(gradOut=(2, 3, 3, 4, 5), inputSize=(2, 3, 6, 8, 10),
                                           gradInput=(2, 3, 6, 8, 10), expected=OK),
    "case_dhw_diff_abnormal": upsample_case(gradOut=(2, 2, 3, 8, 5), outputSize=(3, 8, 5), expected=OK),
    "case_ndhwc_normal": UpsampleCase(
        gradOut=t(F32, NDHWC, 2, 2, 3, 4, 5), outputSize=(2, 3, 4), inputSize=(2, 5, 4, 6, 8),
        alignCorners=False, scales=(0.0, 0.0, 0.0), gradInput=t(F32, NDHWC, 2, 4, 6, 8, 5), expected=OK),
    "case_scales_normal": upsample_case(gradOut=(2, 2, 4, 8, 12), outputSize=(4, 8, 12),
                                        inputSize=(2, 2, 2, 4, 8), scales=(2.0, 2.0, 1.5),
                                        gradInput=(2, 2, 2, 4, 8), expected=OK),
}


def int_array(values):
    return None if values is None else aclnn.aclCreateIntArray(list(values))


@pytest.mark.parametrize("case", UPSAMPLE_CASES.values(), ids=UPSAMPLE_CASES.keys())
def test_upsample_trilinear3d_backward_upstream_case(case):
    rng = np.random.default_rng(4)
    grad_input = make_tensor(case.gradInput, rng)
    status, size, executor = aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(
        make_tensor(case.gradOut, rng), int_array(case.outputSize), int_array(case.inputSize),
        case.alignCorners, *case.scales, grad_input)
    assert status == case.expected, aclnn.aclGetRecentErrMsg()
    if status == OK:
        workspace = aclnn.aclrtMalloc(size) if size else None
        assert aclnn.aclnnUpsampleTrilinear3dBackward(workspace, size, executor) == OK, \
            aclnn.aclGetRecentErrMsg()
