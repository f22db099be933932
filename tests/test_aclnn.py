"""Tests of ``volsample.aclnn``, the CANN two-phase API.

Every first-phase check has its own case (status code, and a message that names the
offending parameter) and the order of the checks is CANN's (its op_api sources; the calls
of its op_api unit tests are replayed in test_aclnn_cann_cases.py); results are compared
with the NumPy API (bitwise: same kernels) and with PyTorch's CPU operators (independent
oracle); the seeds' examples must give the documented numbers exactly.
"""
from __future__ import annotations

import math
import runpy
import threading
import tracemalloc
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import DTYPES, assert_bitwise_equal, assert_close, numpy_array, torch_tensor

import volsample
from volsample import _calls, _prepared, aclnn
from volsample.aclnn import _grid_sampler3d_backward, _upsample_trilinear3d_backward
from volsample.aclnn import _runtime as aclnn_runtime

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GRID_OP = "aclnnGridSampler3DBackward"
UPSAMPLE_OP = "aclnnUpsampleTrilinear3dBackward"
NULLPTR, INVALID, RUNTIME = 161001, 161002, 361001
FORMATS = {"ND": aclnn.ACL_FORMAT_ND, "NCDHW": aclnn.ACL_FORMAT_NCDHW, "NDHWC": aclnn.ACL_FORMAT_NDHWC}
LAYOUT = {"ND": "NCDHW", "NCDHW": "NCDHW", "NDHWC": "NDHWC"}
NDHWC_OF_NCDHW = (0, 2, 3, 4, 1)
# Values of every wrong kind, for the never-raises tests
WEIRD = [None, "x", 1.5, -1, 2**70, object(), [1, 2], np.zeros(0), float("nan")]


def physical(logical_array, fmt):
    """A contiguous array in ``fmt``'s physical order holding an (N, C, D, H, W) volume."""
    if LAYOUT[fmt] == "NDHWC":
        return np.ascontiguousarray(logical_array.transpose(NDHWC_OF_NCDHW))
    return np.ascontiguousarray(logical_array)


def assert_failed(result, status, op, param):
    """A call failed with ``status`` and a message naming ``param``; phase one's result
    is then ``(status, 0, None)``."""
    got = result[0] if isinstance(result, tuple) else result
    message = aclnn.aclGetRecentErrMsg()
    assert got == status, f"status {got}, expected {status}; message: {message}"
    if isinstance(result, tuple):
        assert result[1:] == (0, None)
    assert message is not None and message.startswith(f"{op}: {param}:"), message


# --- GridSampler3DBackward: building valid calls -----------------------------------------

def grid_arrays(rng, dtype=np.float32, N=2, C=3, in_dhw=(4, 5, 6), out_dhw=(3, 2, 4),
                fmt="NCDHW", grid_range=1.2):
    """Random (gradOutput, input, grid) and zeroed (inputGrad, gridGrad) arrays."""
    go = rng.standard_normal((N, C) + tuple(out_dhw)).astype(dtype)
    inp = rng.standard_normal((N, C) + tuple(in_dhw)).astype(dtype)
    grid = rng.uniform(-grid_range, grid_range, (N,) + tuple(out_dhw) + (3,)).astype(dtype)
    go, inp = physical(go, fmt), physical(inp, fmt)
    return {"gradOutput": go, "input": inp, "grid": grid,
            "inputGrad": np.zeros_like(inp), "gridGrad": np.zeros_like(grid)}


def grid_args(arrays, fmt="NCDHW", mode=0, padding=0, align=False, mask=(True, True)):
    """Keyword arguments of a valid GridSampler3DBackward phase one over ``arrays``."""
    args = {name: aclnn.aclCreateTensor(arr, aclnn.ACL_FORMAT_ND if name in ("grid", "gridGrad")
                                        else FORMATS[fmt])
            for name, arr in arrays.items()}
    args.update(interpolationMode=mode, paddingMode=padding, alignCorners=align,
                outputMask=None if mask is None else aclnn.aclCreateBoolArray(list(mask)))
    return args


def run_grid(args):
    """Both phases, which must succeed; return the workspace size."""
    status, size, executor = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**args)
    assert status == 0, aclnn.aclGetRecentErrMsg()
    workspace = aclnn.aclrtMalloc(size) if size > 0 else None
    assert aclnn.aclnnGridSampler3DBackward(workspace, size, executor, None) == 0, aclnn.aclGetRecentErrMsg()
    return size


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)


@pytest.fixture
def valid_grid(rng):
    return grid_args(grid_arrays(rng))


def retag(args, name, array=None, fmt=None):
    """Replace one tensor argument by a new tensor (new array and/or format)."""
    old = args[name]
    args[name] = aclnn.aclCreateTensor(old.array if array is None else array,
                                       old.format if fmt is None else fmt)


def with_dtype(args, name, dtype):
    retag(args, name, args[name].array.astype(dtype))


def with_shape(args, name, shape):
    retag(args, name, np.zeros(shape, args[name].dtype))


# (how to break a valid call, expected status, the parameter the message must name);
# the valid call has N=2, C=3, input 4x5x6, gradOutput/grid 3x2x4, all NCDHW float32.
GRID_FAULTS = {
    # 161001: a null tensor, each of the five
    "null-gradOutput": (lambda a: a.update(gradOutput=None), NULLPTR, "gradOutput"),
    "null-input": (lambda a: a.update(input=None), NULLPTR, "input"),
    "null-grid": (lambda a: a.update(grid=None), NULLPTR, "grid"),
    "null-inputGrad": (lambda a: a.update(inputGrad=None), NULLPTR, "inputGrad"),
    "null-gridGrad": (lambda a: a.update(gridGrad=None), NULLPTR, "gridGrad"),
    # a NumPy array where an aclTensor belongs is not a null pointer but invalid
    "raw-array-grid": (lambda a: a.update(grid=a["grid"].array), INVALID, "grid"),
    # 161002: dtypes (unsupported, or differing from input's)
    "dtype-input-int32": (lambda a: [with_dtype(a, n, np.int32) for n in
                                     ("gradOutput", "input", "grid", "inputGrad", "gridGrad")],
                          INVALID, "input"),
    "dtype-input-complex": (lambda a: [with_dtype(a, n, np.complex64) for n in
                                       ("gradOutput", "input", "grid", "inputGrad", "gridGrad")],
                            INVALID, "input"),
    "dtype-gradOutput": (lambda a: with_dtype(a, "gradOutput", np.float64), INVALID, "gradOutput"),
    "dtype-grid": (lambda a: with_dtype(a, "grid", np.float16), INVALID, "grid"),
    "dtype-inputGrad": (lambda a: with_dtype(a, "inputGrad", ml_dtypes.bfloat16), INVALID, "inputGrad"),
    "dtype-gridGrad": (lambda a: with_dtype(a, "gridGrad", np.float64), INVALID, "gridGrad"),
    # 161002: modes
    "interpolationMode-2": (lambda a: a.update(interpolationMode=2), INVALID, "interpolationMode"),
    "interpolationMode--1": (lambda a: a.update(interpolationMode=-1), INVALID, "interpolationMode"),
    "interpolationMode-str": (lambda a: a.update(interpolationMode="nearest"), INVALID, "interpolationMode"),
    "interpolationMode-float": (lambda a: a.update(interpolationMode=0.0), INVALID, "interpolationMode"),
    "paddingMode-int128": (lambda a: a.update(paddingMode=2**64), INVALID, "paddingMode"),
    "paddingMode-3": (lambda a: a.update(paddingMode=3), INVALID, "paddingMode"),
    "paddingMode--1": (lambda a: a.update(paddingMode=-1), INVALID, "paddingMode"),
    "alignCorners-str": (lambda a: a.update(alignCorners="yes"), INVALID, "alignCorners"),
    # 161002: ranks other than 5
    "rank-gradOutput": (lambda a: with_shape(a, "gradOutput", (2, 3, 3, 2)), INVALID, "gradOutput"),
    "rank-input": (lambda a: with_shape(a, "input", (2, 3, 4, 5, 6, 1)), INVALID, "input"),
    "rank-grid": (lambda a: with_shape(a, "grid", (2, 3, 2, 3)), INVALID, "grid"),
    "rank-inputGrad": (lambda a: with_shape(a, "inputGrad", (2, 3, 4, 30)), INVALID, "inputGrad"),
    "rank-gridGrad": (lambda a: with_shape(a, "gridGrad", (2, 24, 3)), INVALID, "gridGrad"),
    # 161002: N/C/D/H/W relations
    "gradOutput-N": (lambda a: with_shape(a, "gradOutput", (1, 3, 3, 2, 4)), INVALID, "gradOutput"),
    "gradOutput-C": (lambda a: with_shape(a, "gradOutput", (2, 4, 3, 2, 4)), INVALID, "gradOutput"),
    "grid-N": (lambda a: [with_shape(a, "grid", (1, 3, 2, 4, 3)), with_shape(a, "gridGrad", (1, 3, 2, 4, 3))],
               INVALID, "grid"),
    "grid-DHW": (lambda a: [with_shape(a, "grid", (2, 3, 4, 2, 3)), with_shape(a, "gridGrad", (2, 3, 4, 2, 3))],
                 INVALID, "grid"),
    "grid-last-dim": (lambda a: [with_shape(a, "grid", (2, 3, 2, 4, 2)), with_shape(a, "gridGrad", (2, 3, 2, 4, 2))],
                      INVALID, "grid"),
    "inputGrad-shape": (lambda a: with_shape(a, "inputGrad", (2, 3, 4, 5, 7)), INVALID, "inputGrad"),
    "inputGrad-NDHWC-as-NCDHW": (lambda a: with_shape(a, "inputGrad", (2, 4, 5, 6, 3)), INVALID, "inputGrad"),
    "gridGrad-shape": (lambda a: with_shape(a, "gridGrad", (2, 3, 2, 5, 3)), INVALID, "gridGrad"),
    # 161002: outputMask of a size other than 2, or not a bool array
    "outputMask-size-1": (lambda a: a.update(outputMask=aclnn.aclCreateBoolArray([True])), INVALID, "outputMask"),
    "outputMask-size-3": (lambda a: a.update(outputMask=aclnn.aclCreateBoolArray([True] * 3)), INVALID, "outputMask"),
    "outputMask-list": (lambda a: a.update(outputMask=[True, True]), INVALID, "outputMask"),
    # 161002: an output the call cannot write
    "inputGrad-read-only": (lambda a: a["inputGrad"].array.setflags(write=False), INVALID, "inputGrad"),
}


@pytest.mark.parametrize("fault", GRID_FAULTS.values(), ids=GRID_FAULTS.keys())
def test_grid_phase_one_rejects(valid_grid, fault):
    break_call, status, param = fault
    break_call(valid_grid)
    result = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**valid_grid)
    assert_failed(result, status, GRID_OP + "GetWorkspaceSize", param)


@pytest.mark.parametrize("faults, status, param", [
    # several faults at once: the first in CANN's order is the one reported
    # (the Python kinds, C's types, come first)
    (["null-gradOutput", "raw-array-grid"], INVALID, "grid"),
    (["interpolationMode-float", "null-input"], INVALID, "interpolationMode"),
    # outputMask is read before anything else
    (["outputMask-size-3", "null-input"], INVALID, "outputMask"),
    (["outputMask-size-1", "inputGrad-shape"], INVALID, "outputMask"),
    (["inputGrad-read-only", "outputMask-size-1"], INVALID, "outputMask"),
    # CheckNotNull2In1Out: gradOutput, input, grid, inputGrad, gridGrad
    (["null-gridGrad", "null-grid"], NULLPTR, "grid"),
    (["dtype-gradOutput", "null-inputGrad"], NULLPTR, "inputGrad"),
    # CheckDtypeValid: the others against input's dtype first, then input's support
    (["dtype-input-int32", "dtype-gridGrad"], INVALID, "gridGrad"),
    (["dtype-gridGrad", "dtype-grid"], INVALID, "grid"),
    # CheckAttrValid after the dtypes: paddingMode, then interpolationMode
    (["interpolationMode-2", "dtype-grid"], INVALID, "grid"),
    (["interpolationMode-2", "paddingMode-3"], INVALID, "paddingMode"),
    # CheckShape: ranks of input, grid, gradOutput; N (grid's, then gradOutput's), C, D/H/W,
    # grid's last dimension, inputGrad's and gridGrad's shapes
    (["rank-input", "paddingMode-3"], INVALID, "paddingMode"),
    (["rank-gradOutput", "rank-grid"], INVALID, "grid"),
    (["rank-gradOutput", "rank-inputGrad"], INVALID, "gradOutput"),
    (["gradOutput-N", "grid-N"], INVALID, "grid"),
    (["grid-DHW", "gradOutput-C"], INVALID, "gradOutput"),
    (["gridGrad-shape", "grid-last-dim"], INVALID, "grid"),
    (["gridGrad-shape", "inputGrad-shape"], INVALID, "inputGrad"),
    # the writable outputs (Python's own) come last
    (["inputGrad-read-only", "gridGrad-shape"], INVALID, "gridGrad"),
])
def test_grid_phase_one_check_order(valid_grid, faults, status, param):
    for name in faults:
        GRID_FAULTS[name][0](valid_grid)
    result = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**valid_grid)
    assert_failed(result, status, GRID_OP + "GetWorkspaceSize", param)


@pytest.mark.parametrize("mask", [None, (False, False)], ids=["null-mask", "all-false"])
def test_grid_nothing_asked_is_success_without_work(rng, mask):
    arrays = grid_arrays(rng)
    arrays["inputGrad"][...] = 7.0  # sentinels: nothing may be written
    arrays["gridGrad"][...] = -7.0
    assert run_grid(grid_args(arrays, mask=mask)) == 0  # no workspace
    assert (arrays["inputGrad"] == 7.0).all() and (arrays["gridGrad"] == -7.0).all()


@pytest.mark.parametrize("mask", [None, (False, False)], ids=["null-mask", "all-false"])
@pytest.mark.parametrize("fault", ["null-input", "null-gridGrad", "dtype-grid", "interpolationMode-2",
                                   "rank-input", "inputGrad-shape", "inputGrad-read-only"])
def test_grid_nothing_asked_checks_nothing(valid_grid, mask, fault):
    """As in CANN (the outputMask test precedes CheckParams): with nothing asked, the
    tensors, modes and shapes are not checked; only the Python kinds are."""
    GRID_FAULTS[fault][0](valid_grid)
    valid_grid["outputMask"] = None if mask is None else aclnn.aclCreateBoolArray(list(mask))
    assert run_grid(valid_grid) == 0


@pytest.mark.parametrize("N, C, in_dhw, out_dhw", [
    (0, 3, (4, 5, 6), (3, 2, 4)),  # no batch
    (2, 0, (4, 5, 6), (3, 2, 4)),  # no channels: grid gradient is an empty sum, zero
    (2, 3, (0, 5, 6), (3, 2, 4)),  # an empty volume: every point reads padding
    (1, 2, (4, 5, 1), (2, 0, 3)),  # no sample points (empty grid): input gradient zero
])
@pytest.mark.parametrize("fmt", ["NCDHW", "NDHWC"])
def test_grid_empty_inputs(rng, N, C, in_dhw, out_dhw, fmt):
    arrays = grid_arrays(rng, N=N, C=C, in_dhw=in_dhw, out_dhw=out_dhw, fmt=fmt)
    arrays["inputGrad"][...] = 7.0
    arrays["gridGrad"][...] = 7.0
    assert run_grid(grid_args(arrays, fmt=fmt)) == 0  # no workspace
    assert not arrays["inputGrad"].any() and not arrays["gridGrad"].any()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mode, padding, align", [
    (0, 0, False), (0, 1, True), (0, 2, False), (0, 2, True), (1, 0, True), (1, 1, False), (1, 2, False),
])
@pytest.mark.parametrize("fmt", ["ND", "NDHWC"])
def test_grid_matches_numpy_api(rng, dtype, mode, padding, align, fmt):
    arrays = grid_arrays(rng, dtype=dtype, fmt=fmt)
    run_grid(grid_args(arrays, fmt=fmt, mode=mode, padding=padding, align=align))
    expected = volsample.grid_sample_3d_backward(
        arrays["gradOutput"], arrays["input"], arrays["grid"], ("bilinear", "nearest")[mode],
        ("zeros", "border", "reflection")[padding], align, layout=LAYOUT[fmt])
    assert_bitwise_equal("inputGrad", arrays["inputGrad"], expected[0])
    assert_bitwise_equal("gridGrad", arrays["gridGrad"], expected[1])


@pytest.mark.parametrize("grid_format", [aclnn.ACL_FORMAT_NCDHW, aclnn.ACL_FORMAT_NDHWC])
def test_grid_tag_is_not_read(rng, grid_format):
    """A grid is (N, Do, Ho, Wo, 3) whatever its format tag."""
    arrays = grid_arrays(rng, dtype=np.float64)
    args = grid_args(arrays)
    retag(args, "grid", fmt=grid_format)
    retag(args, "gridGrad", fmt=grid_format)
    run_grid(args)
    expected = volsample.grid_sample_3d_backward(arrays["gradOutput"], arrays["input"], arrays["grid"])
    assert_bitwise_equal("gridGrad", arrays["gridGrad"], expected[1])


@pytest.mark.parametrize("mask", [(True, False), (False, True)])
def test_grid_output_mask_leaves_other_output_alone(rng, mask):
    arrays = grid_arrays(rng, dtype=np.float64)
    arrays["inputGrad"][...] = 7.0
    arrays["gridGrad"][...] = 7.0
    run_grid(grid_args(arrays, mask=mask))
    expected = volsample.grid_sample_3d_backward(arrays["gradOutput"], arrays["input"], arrays["grid"])
    for want, name, reference in zip(mask, ("inputGrad", "gridGrad"), expected):
        if want:
            assert_bitwise_equal(name, arrays[name], reference)
        else:
            assert (arrays[name] == 7.0).all(), f"{name} was written though not asked for"


# input's tag decides how gradOutput, input and inputGrad are read (NDHWC when tagged so,
# NCDHW for every other tag); the tags of gradOutput and inputGrad are not read.
TAGGED_FORMATS = [
    # input, gradOutput, inputGrad tags: why
    (aclnn.ACL_FORMAT_NDHWC, aclnn.ACL_FORMAT_NCDHW, aclnn.ACL_FORMAT_NCDHW),  # ops-cv's case_no_transpose
    (aclnn.ACL_FORMAT_NDHWC, aclnn.ACL_FORMAT_NDHWC, aclnn.ACL_FORMAT_ND),
    (aclnn.ACL_FORMAT_NCDHW, aclnn.ACL_FORMAT_NDHWC, aclnn.ACL_FORMAT_NDHWC),  # the others' tags ignored
    (aclnn.ACL_FORMAT_ND, aclnn.ACL_FORMAT_NCHW, aclnn.ACL_FORMAT_FRACTAL_Z),
    (aclnn.ACL_FORMAT_NC1HWC0, aclnn.ACL_FORMAT_NDHWC, aclnn.ACL_FORMAT_NCDHW),  # any other tag reads as NCDHW
]


def tag_layout(tag):
    return "NDHWC" if tag == aclnn.ACL_FORMAT_NDHWC else "NCDHW"


@pytest.mark.parametrize("tags", TAGGED_FORMATS,
                         ids=lambda t: "-".join(aclnn_runtime.FORMAT_NAMES[f][11:] for f in t))
@pytest.mark.parametrize("mode, padding, align", [(0, 0, False), (0, 2, True), (1, 1, False)])
def test_grid_formats_against_torch(rng, tags, mode, padding, align):
    """gradOutput and inputGrad are read and written in input's layout (NDHWC physically
    channels-last), whatever their own tags, and give PyTorch's gradients."""
    layout = tag_layout(tags[0])
    logical = grid_arrays(rng, dtype=np.float64, N=2, C=5, in_dhw=(3, 4, 6), out_dhw=(2, 3, 4))
    arrays = dict(logical, gradOutput=physical(logical["gradOutput"], layout),
                  input=physical(logical["input"], layout))
    arrays["inputGrad"] = np.zeros_like(arrays["input"])
    args = grid_args(arrays, mode=mode, padding=padding, align=align)
    for name, tag in zip(("input", "gradOutput", "inputGrad"), tags):
        retag(args, name, fmt=tag)
    run_grid(args)
    gi, gg = torch.ops.aten.grid_sampler_3d_backward(
        torch_tensor(logical["gradOutput"]), torch_tensor(logical["input"]), torch_tensor(logical["grid"]),
        mode, padding, align, [True, True])
    assert_close("inputGrad", arrays["inputGrad"], physical(numpy_array(gi), layout), 1e-12, 1e-12)
    assert_close("gridGrad", arrays["gridGrad"], numpy_array(gg), 1e-12, 1e-12)


@pytest.mark.parametrize("input_layout, gradOutput_layout, inputGrad_layout, param", [
    # a tensor laid out in its own tag's order, not input's: its C or D/H/W do not match
    ("NDHWC", "NCDHW", "NDHWC", "gradOutput"),
    ("NCDHW", "NDHWC", "NCDHW", "gradOutput"),
    ("NDHWC", "NDHWC", "NCDHW", "inputGrad"),
    ("NCDHW", "NCDHW", "NDHWC", "inputGrad"),
])
def test_grid_shapes_are_read_in_input_layout(rng, input_layout, gradOutput_layout, inputGrad_layout, param):
    logical = grid_arrays(rng, N=2, C=5, in_dhw=(3, 4, 6), out_dhw=(2, 3, 4))
    arrays = dict(logical, gradOutput=physical(logical["gradOutput"], gradOutput_layout),
                  input=physical(logical["input"], input_layout),
                  inputGrad=physical(logical["inputGrad"], inputGrad_layout))
    args = grid_args(arrays, fmt=input_layout)
    retag(args, "gradOutput", fmt=FORMATS[gradOutput_layout])  # its own tag says its order: not read
    retag(args, "inputGrad", fmt=FORMATS[inputGrad_layout])
    assert_failed(aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**args), INVALID,
                  GRID_OP + "GetWorkspaceSize", param)


def test_grid_writes_into_strided_views(rng):
    """Inputs and outputs may be views with any strides; outputs are written in place and
    nothing around them is touched."""
    arrays = grid_arrays(rng, dtype=np.float64)
    expected = volsample.grid_sample_3d_backward(arrays["gradOutput"], arrays["input"], arrays["grid"])
    parent_in = np.full((2, 3, 4, 5, 12), 7.0)
    parent_grid = np.full((2, 3, 2, 4, 6), 7.0)
    views = dict(arrays, input=arrays["input"][..., ::-1].copy()[..., ::-1],  # negative strides
                 inputGrad=parent_in[..., ::2], gridGrad=parent_grid[..., 1::2])
    run_grid(grid_args(views))
    assert_bitwise_equal("inputGrad", np.ascontiguousarray(views["inputGrad"]), expected[0])
    assert_bitwise_equal("gridGrad", np.ascontiguousarray(views["gridGrad"]), expected[1])
    assert (parent_in[..., 1::2] == 7.0).all() and (parent_grid[..., ::2] == 7.0).all()


# --- UpsampleTrilinear3dBackward: building valid calls ----------------------------------


def upsample_arrays(rng, dtype=np.float32, N=2, C=3, in_dhw=(3, 4, 5), out_dhw=(5, 7, 9), fmt="NCDHW"):
    """A random gradOut and a zeroed gradInput, in ``fmt``'s physical order."""
    go = rng.standard_normal((N, C) + tuple(out_dhw)).astype(dtype)
    gi = np.zeros((N, C) + tuple(in_dhw), dtype)
    return {"gradOut": physical(go, fmt), "gradInput": physical(gi, fmt),
            "input_size": (N, C) + tuple(in_dhw), "output_size": tuple(out_dhw)}


def upsample_args(arrays, fmt="NCDHW", align=False, scales=(0.0, 0.0, 0.0)):
    """Keyword arguments of a valid UpsampleTrilinear3dBackward phase one over ``arrays``."""
    return {"gradOut": aclnn.aclCreateTensor(arrays["gradOut"], FORMATS[fmt]),
            "outputSize": aclnn.aclCreateIntArray(arrays["output_size"]),
            "inputSize": aclnn.aclCreateIntArray(arrays["input_size"]),
            "alignCorners": align, "scalesD": scales[0], "scalesH": scales[1], "scalesW": scales[2],
            "gradInput": aclnn.aclCreateTensor(arrays["gradInput"], FORMATS[fmt])}


def run_upsample(args):
    """Both phases, which must succeed; return the workspace size."""
    status, size, executor = aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(**args)
    assert status == 0, aclnn.aclGetRecentErrMsg()
    workspace = aclnn.aclrtMalloc(size) if size > 0 else None
    assert aclnn.aclnnUpsampleTrilinear3dBackward(workspace, size, executor, None) == 0, \
        aclnn.aclGetRecentErrMsg()
    return size


@pytest.fixture
def valid_upsample(rng):
    return upsample_args(upsample_arrays(rng))


def int_array(args, name, values):
    args[name] = aclnn.aclCreateIntArray(values)


# The valid call: gradOut (2, 3, 5, 7, 9) NCDHW float32, outputSize [5, 7, 9],
# inputSize [2, 3, 3, 4, 5], gradInput (2, 3, 3, 4, 5).
UPSAMPLE_FAULTS = {
    # 161001: null pointers
    "null-gradOut": (lambda a: a.update(gradOut=None), NULLPTR, "gradOut"),
    "null-outputSize": (lambda a: a.update(outputSize=None), NULLPTR, "outputSize"),
    "null-inputSize": (lambda a: a.update(inputSize=None), NULLPTR, "inputSize"),
    "null-gradInput": (lambda a: a.update(gradInput=None), NULLPTR, "gradInput"),
    "list-outputSize": (lambda a: a.update(outputSize=[5, 7, 9]), INVALID, "outputSize"),
    "raw-array-gradOut": (lambda a: a.update(gradOut=a["gradOut"].array), INVALID, "gradOut"),
    # 161002: dtype or format unsupported; gradInput's dtype not gradOut's
    "dtype-gradOut-int64": (lambda a: [with_dtype(a, n, np.int64) for n in ("gradOut", "gradInput")],
                            INVALID, "gradOut"),
    "format-gradOut": (lambda a: retag(a, "gradOut", fmt=aclnn.ACL_FORMAT_NCHW), INVALID, "gradOut"),
    "dtype-gradInput": (lambda a: with_dtype(a, "gradInput", np.float64), INVALID, "gradInput"),
    # 161002: gradOut's rank
    "rank-gradOut": (lambda a: with_shape(a, "gradOut", (2, 3, 5, 63)), INVALID, "gradOut"),
    # 161002: outputSize's size or values
    "outputSize-size-2": (lambda a: int_array(a, "outputSize", [7, 9]), INVALID, "outputSize"),
    "outputSize-size-4": (lambda a: int_array(a, "outputSize", [5, 7, 9, 1]), INVALID, "outputSize"),
    "outputSize-zero": (lambda a: int_array(a, "outputSize", [5, 0, 9]), INVALID, "outputSize"),
    "outputSize-negative": (lambda a: int_array(a, "outputSize", [5, 7, -9]), INVALID, "outputSize"),
    # 161002: inputSize's size or spatial values
    "inputSize-size-4": (lambda a: int_array(a, "inputSize", [2, 3, 3, 4]), INVALID, "inputSize"),
    "inputSize-D-zero": (lambda a: int_array(a, "inputSize", [2, 3, 0, 4, 5]), INVALID, "inputSize"),
    "inputSize-W-negative": (lambda a: int_array(a, "inputSize", [2, 3, 3, 4, -5]), INVALID, "inputSize"),
    # 161002: gradOut against inputSize / outputSize
    "gradOut-N": (lambda a: int_array(a, "inputSize", [1, 3, 3, 4, 5]), INVALID, "gradOut"),
    "gradOut-C": (lambda a: int_array(a, "inputSize", [2, 4, 3, 4, 5]), INVALID, "gradOut"),
    "gradOut-negative-N": (lambda a: int_array(a, "inputSize", [-2, 3, 3, 4, 5]), INVALID, "gradOut"),
    "gradOut-DHW": (lambda a: int_array(a, "outputSize", [5, 9, 7]), INVALID, "gradOut"),
    # 161002: gradInput's shape against inputSize
    "gradInput-shape": (lambda a: with_shape(a, "gradInput", (2, 3, 3, 4, 6)), INVALID, "gradInput"),
    "gradInput-rank": (lambda a: with_shape(a, "gradInput", (2, 3, 3, 20)), INVALID, "gradInput"),
    "gradInput-NDHWC-tagged-NCDHW": (lambda a: with_shape(a, "gradInput", (2, 3, 4, 5, 3)), INVALID, "gradInput"),
    # 161002: scalar arguments of the wrong kind
    "alignCorners-str": (lambda a: a.update(alignCorners="false"), INVALID, "alignCorners"),
    "scalesH-str": (lambda a: a.update(scalesH="2.0"), INVALID, "scalesH"),
    "scalesD-bool": (lambda a: a.update(scalesD=True), INVALID, "scalesD"),
    # 161002: an infinite scale that would be used (all three > 0)
    "scalesW-inf-used": (lambda a: a.update(scalesD=2.0, scalesH=2.0, scalesW=float("inf")), INVALID, "scalesW"),
    # 161002: an output the call cannot write
    "gradInput-read-only": (lambda a: a["gradInput"].array.setflags(write=False), INVALID, "gradInput"),
}


@pytest.mark.parametrize("fault", UPSAMPLE_FAULTS.values(), ids=UPSAMPLE_FAULTS.keys())
def test_upsample_phase_one_rejects(valid_upsample, fault):
    break_call, status, param = fault
    break_call(valid_upsample)
    result = aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(**valid_upsample)
    assert_failed(result, status, UPSAMPLE_OP + "GetWorkspaceSize", param)


@pytest.mark.parametrize("faults, status, param", [
    # several faults at once: the first in CANN's order is the one reported
    # (the Python kinds, C's types, come first)
    (["null-gradOut", "list-outputSize"], INVALID, "outputSize"),
    (["gradInput-shape", "scalesH-str"], INVALID, "scalesH"),
    # CheckNotNull2In2Out: gradOut, outputSize, inputSize, gradInput
    (["null-gradInput", "null-inputSize"], NULLPTR, "inputSize"),
    # CheckDtypeValid1Out1In: gradOut's support, then gradInput's against it
    (["dtype-gradOut-int64", "rank-gradOut"], INVALID, "gradOut"),
    (["rank-gradOut", "dtype-gradInput"], INVALID, "gradInput"),
    # CheckUpsampleShape (gradOut's rank, outputSize's and inputSize's sizes), then CheckFormat
    (["dtype-gradInput", "format-gradOut"], INVALID, "gradInput"),
    (["format-gradOut", "rank-gradOut"], INVALID, "gradOut"),
    (["inputSize-size-4", "outputSize-size-2"], INVALID, "outputSize"),
    (["format-gradOut", "inputSize-size-4"], INVALID, "inputSize"),
    # CheckInputElement: D/H/W > 0 (inputSize's, outputSize's), gradOut's shape, gradInput's
    (["outputSize-zero", "format-gradOut"], INVALID, "gradOut"),
    (["inputSize-size-4", "outputSize-zero"], INVALID, "inputSize"),
    (["gradOut-DHW", "inputSize-D-zero"], INVALID, "inputSize"),
    (["gradInput-shape", "outputSize-zero"], INVALID, "outputSize"),
    (["gradInput-shape", "gradOut-C"], INVALID, "gradOut"),
    # an infinite used scale and a read-only output come last
    (["scalesW-inf-used", "gradInput-shape"], INVALID, "gradInput"),
    (["gradInput-read-only", "scalesW-inf-used"], INVALID, "scalesW"),
])
def test_upsample_phase_one_check_order(valid_upsample, faults, status, param):
    for name in faults:
        UPSAMPLE_FAULTS[name][0](valid_upsample)
    result = aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(**valid_upsample)
    assert_failed(result, status, UPSAMPLE_OP + "GetWorkspaceSize", param)


@pytest.mark.parametrize("tag", [aclnn.ACL_FORMAT_FRACTAL_Z, aclnn.ACL_FORMAT_NCHW, aclnn.ACL_FORMAT_UNDEFINED])
def test_upsample_gradInput_tag_is_not_checked(rng, tag):
    """CANN's CheckFormat looks at gradOut's tag only; gradInput is channels-last when
    tagged NDHWC and (N, C, D, H, W) under any other tag."""
    arrays = upsample_arrays(rng, dtype=np.float64)
    args = upsample_args(arrays)
    retag(args, "gradInput", fmt=tag)
    run_upsample(args)
    expected = volsample.upsample_trilinear_3d_backward(arrays["gradOut"], arrays["input_size"])
    assert_bitwise_equal("gradInput", arrays["gradInput"], expected)


@pytest.mark.parametrize("N, C", [(0, 3), (2, 0)])
@pytest.mark.parametrize("fmt", ["NCDHW", "NDHWC"])
def test_upsample_zero_batch_or_channels(rng, N, C, fmt):
    assert run_upsample(upsample_args(upsample_arrays(rng, N=N, C=C, fmt=fmt), fmt=fmt)) == 0


def cann_scales(scales):
    """The scales CANN uses: all three when all are > 0, else none (every axis maps by its
    sizes), as aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize builds its scale list."""
    return tuple(scales) if all(s > 0 for s in scales) else (None, None, None)


UPSAMPLE_CASES = [
    # (input D, H, W, output D, H, W, scales): why
    ((3, 4, 5), (5, 7, 9), (0.0, 0.0, 0.0)),   # upsampling, ratios from the sizes
    ((3, 4, 5), (6, 8, 15), (2.0, 2.0, 3.0)),  # the forward's integer scales
    ((4, 5, 6), (6, 7, 9), (1.7, -1.0, 1.5)),  # one scale <= 0: every axis from the sizes
    ((6, 7, 8), (3, 7, 5), (0.0, 0.0, 0.0)),   # downsampling, and an identity axis
    ((1, 1, 2), (3, 2, 1), (0.0, 0.0, 0.0)),   # size-1 axes
    ((3, 4, 5), (5, 7, 9), (0.9, 3.0, 0.25)),  # scales inconsistent with the sizes
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("in_dhw, out_dhw, scales", UPSAMPLE_CASES)
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("fmt", ["ND", "NDHWC"])
def test_upsample_matches_numpy_api(rng, dtype, in_dhw, out_dhw, scales, align, fmt):
    arrays = upsample_arrays(rng, dtype=dtype, in_dhw=in_dhw, out_dhw=out_dhw, fmt=fmt)
    run_upsample(upsample_args(arrays, fmt=fmt, align=align, scales=scales))
    expected = volsample.upsample_trilinear_3d_backward(
        arrays["gradOut"], arrays["input_size"], align, cann_scales(scales), layout=LAYOUT[fmt])
    assert_bitwise_equal("gradInput", arrays["gradInput"], expected)


@pytest.mark.parametrize("scales", [(1.7, -1.0, 1.5), (1.7, 0.0, 1.5), (-1.0, 1.25, 1.5),
                                    (1.7, float("nan"), 1.5), (float("inf"), 0.0, 1.4)])
def test_upsample_scales_all_or_nothing(rng, scales):
    """One scale <= 0 (or NaN: not > 0) and CANN derives every axis from the sizes, where
    the NumPy API (like PyTorch) decides per axis."""
    arrays = upsample_arrays(rng, dtype=np.float64, in_dhw=(4, 5, 6), out_dhw=(6, 7, 9))
    run_upsample(upsample_args(arrays, scales=scales))
    from_sizes = volsample.upsample_trilinear_3d_backward(arrays["gradOut"], arrays["input_size"])
    assert_bitwise_equal("gradInput", arrays["gradInput"], from_sizes)
    finite = tuple(s if math.isfinite(s) else None for s in scales)
    per_axis = volsample.upsample_trilinear_3d_backward(arrays["gradOut"], arrays["input_size"],
                                                        scales=finite)
    assert not np.array_equal(arrays["gradInput"], per_axis)  # the case tells the two apart


@pytest.mark.parametrize("fmt_go, fmt_gi", [("NDHWC", "NDHWC"), ("NCDHW", "NDHWC"), ("NDHWC", "ND")])
@pytest.mark.parametrize("in_dhw, out_dhw, scales", UPSAMPLE_CASES[:4])
@pytest.mark.parametrize("align", [False, True])
def test_upsample_formats_against_torch(rng, fmt_go, fmt_gi, in_dhw, out_dhw, scales, align):
    """gradOut and gradInput in their own formats (NDHWC physically channels-last) give
    PyTorch's gradient; the int arrays stay in NCDHW / DHW order."""
    logical = upsample_arrays(rng, dtype=np.float64, in_dhw=in_dhw, out_dhw=out_dhw)
    arrays = dict(logical, gradOut=physical(logical["gradOut"], fmt_go),
                  gradInput=physical(logical["gradInput"], fmt_gi))
    args = upsample_args(arrays, align=align, scales=scales)
    retag(args, "gradOut", fmt=FORMATS[fmt_go])
    retag(args, "gradInput", fmt=FORMATS[fmt_gi])
    run_upsample(args)
    expected = torch.ops.aten.upsample_trilinear3d_backward(
        torch_tensor(logical["gradOut"]), list(out_dhw), list(logical["input_size"]), align,
        *cann_scales(scales))
    assert_close("gradInput", arrays["gradInput"], physical(numpy_array(expected), fmt_gi), 1e-12, 1e-12)


GAPS = {  # gradInput views in the physical order of their format, each with gaps
    "W every other element": lambda parent: parent[..., ::2],
    "H rows apart": lambda parent: parent[:, :, :, ::2],
    "W reversed": lambda parent: parent[..., ::-2],
}


@pytest.mark.parametrize("dtype", [np.float16, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("gaps", list(GAPS))
def test_upsample_writes_into_strided_views(rng, dtype, fmt, gaps):
    """gradInput may be a view with any strides (CANN computes into a contiguous tensor and
    ViewCopies it in): phase one succeeds, phase two writes the NumPy API's bits in place and
    touches nothing around them, and the workspace counts the contiguous copy."""
    arrays = upsample_arrays(rng, dtype=dtype, fmt=fmt)
    dense = arrays["gradInput"]
    double = tuple(2 * n if k in (3, 4) else n for k, n in enumerate(dense.shape))
    parent = np.full(double, 7.0, dtype)
    view = GAPS[gaps](parent)[tuple(slice(n) for n in dense.shape)]
    assert view.shape == dense.shape and not view.flags.c_contiguous
    size = run_upsample(upsample_args(dict(arrays, gradInput=view), fmt=fmt))
    expected = volsample.upsample_trilinear_3d_backward(arrays["gradOut"], arrays["input_size"],
                                                        layout=LAYOUT[fmt])
    assert_bitwise_equal("gradInput", np.ascontiguousarray(view), expected)
    untouched = np.ones(parent.shape, bool)
    GAPS[gaps](untouched)[tuple(slice(n) for n in dense.shape)] = False
    assert (parent[untouched] == 7.0).all()
    assert size == run_upsample(upsample_args(arrays, fmt=fmt)) + dense.nbytes


@pytest.mark.parametrize("fmt", ["NCDHW", "NDHWC"])
def test_upsample_writes_sliced_batches_and_channels_as_they_are(rng, fmt):
    """A gradInput cut from a larger volume along its first three physical axes keeps
    dense planes: the kernels write it in place, with no contiguous copy to count."""
    arrays = upsample_arrays(rng, dtype=np.float64, fmt=fmt)
    dense = arrays["gradInput"]
    parent = np.full(tuple(n + 2 for n in dense.shape[:3]) + dense.shape[3:], 7.0)
    view = parent[1:-1, 1:-1, 1:-1]
    assert not view.flags.c_contiguous
    size = run_upsample(upsample_args(dict(arrays, gradInput=view), fmt=fmt))
    expected = volsample.upsample_trilinear_3d_backward(arrays["gradOut"], arrays["input_size"],
                                                        layout=LAYOUT[fmt])
    assert_bitwise_equal("gradInput", np.ascontiguousarray(view), expected)
    view[...] = 7.0
    assert (parent == 7.0).all()
    assert size == run_upsample(upsample_args(arrays, fmt=fmt))


@pytest.mark.parametrize("position, value", [
    (p, v) for p in range(8) for v in WEIRD
], ids=lambda x: x if isinstance(x, int) else type(x).__name__)
def test_upsample_phase_one_never_raises(valid_upsample, position, value):
    """Anything in any argument position is a status code, never an exception."""
    names = ("gradOut", "outputSize", "inputSize", "alignCorners", "scalesD", "scalesH", "scalesW",
             "gradInput")
    args = [valid_upsample[name] for name in names]
    args[position] = value
    status, size, executor = aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(*args)
    if names[position].startswith("scales") and isinstance(value, (int, float)):
        # any number is valid beside two zero scales: every axis maps by its sizes
        assert status == 0, aclnn.aclGetRecentErrMsg()
        assert aclnn.aclnnUpsampleTrilinear3dBackward(aclnn.aclrtMalloc(size), size, executor) == 0
        return
    is_pointer = isinstance(valid_upsample[names[position]], (aclnn.aclTensor, aclnn.aclIntArray))
    expected = NULLPTR if value is None and is_pointer else INVALID
    assert (status, size, executor) == (expected, 0, None)
    assert names[position] in aclnn.aclGetRecentErrMsg()


# --- phase two (both operators) ---------------------------------------------------------

PHASE_ONE = {GRID_OP: aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize,
             UPSAMPLE_OP: aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize}
PHASE_TWO = {GRID_OP: aclnn.aclnnGridSampler3DBackward,
             UPSAMPLE_OP: aclnn.aclnnUpsampleTrilinear3dBackward}
OUTPUT = {GRID_OP: "inputGrad", UPSAMPLE_OP: "gradInput"}
# The operator module of each operator, and the function its run step computes with
OPERATOR_MODULE = {GRID_OP: _grid_sampler3d_backward, UPSAMPLE_OP: _upsample_trilinear3d_backward}


@pytest.fixture(params=[GRID_OP, UPSAMPLE_OP])
def valid_call(request, valid_grid, valid_upsample):
    """(operator, keyword arguments of a valid phase one)."""
    return request.param, valid_grid if request.param == GRID_OP else valid_upsample


def test_executor_runs_once(valid_call):
    op, args = valid_call
    status, size, executor = PHASE_ONE[op](**args)
    workspace = aclnn.aclrtMalloc(size)
    assert PHASE_TWO[op](workspace, size, executor, None) == 0
    assert_failed(PHASE_TWO[op](workspace, size, executor, None), INVALID, op, "executor")


def test_executor_runs_once_across_threads(valid_call):
    """Threads racing to run one executor: exactly one runs it."""
    op, args = valid_call
    _, size, executor = PHASE_ONE[op](**args)
    start = threading.Barrier(4)
    statuses = []

    def launch():
        start.wait()
        statuses.append(PHASE_TWO[op](aclnn.aclrtMalloc(size), size, executor))
    workers = [threading.Thread(target=launch) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(statuses) == [0, INVALID, INVALID, INVALID]


def test_executor_of_another_operator(valid_grid, valid_upsample):
    _, size, executor = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**valid_grid)
    assert_failed(aclnn.aclnnUpsampleTrilinear3dBackward(aclnn.aclrtMalloc(size), size, executor),
                  INVALID, UPSAMPLE_OP, "executor")


PHASE_TWO_FAULTS = {
    "null-executor": (lambda k, n: k.update(executor=None), NULLPTR, "executor"),
    "not-an-executor": (lambda k, n: k.update(executor="executor"), INVALID, "executor"),
    "workspaceSize-too-small": (lambda k, n: k.update(workspaceSize=n - 1), INVALID, "workspaceSize"),
    "workspaceSize-not-int": (lambda k, n: k.update(workspaceSize=float(n)), INVALID, "workspaceSize"),
    "null-workspace": (lambda k, n: k.update(workspace=None), NULLPTR, "workspace"),
    "workspace-buffer-too-small": (lambda k, n: k.update(workspace=aclnn.aclrtMalloc(n - 1)), INVALID, "workspace"),
    "workspace-not-a-buffer": (lambda k, n: k.update(workspace=object()), INVALID, "workspace"),
    "bad-stream": (lambda k, n: k.update(stream="stream 0"), INVALID, "stream"),
}


@pytest.mark.parametrize("fault", PHASE_TWO_FAULTS.values(), ids=PHASE_TWO_FAULTS.keys())
def test_phase_two_rejects(valid_call, fault):
    op, args = valid_call
    if op == GRID_OP:  # float16: its float32 accumulator is scratch (float32 may need none)
        for name in ("gradOutput", "input", "grid", "inputGrad", "gridGrad"):
            with_dtype(args, name, np.float16)
    break_launch, status, param = fault
    _, size, executor = PHASE_ONE[op](**args)
    assert size > 0
    launch = {"workspace": aclnn.aclrtMalloc(size), "workspaceSize": size,
              "executor": executor, "stream": None}
    break_launch(launch, size)
    output = args[OUTPUT[op]].array
    assert_failed(PHASE_TWO[op](**launch), status, op, param)
    assert not output.any(), "a refused launch wrote its output"
    # a refused launch leaves the executor usable
    assert PHASE_TWO[op](aclnn.aclrtMalloc(size), size, executor, None) == 0
    assert output.any()


def test_phase_two_accepts_streams_and_larger_workspaces(valid_call):
    op, args = valid_call
    _, size, executor = PHASE_ONE[op](**args)
    stream = aclnn.aclrtCreateStream()
    assert PHASE_TWO[op](bytearray(size + 100), size + 100, executor, stream) == 0
    assert aclnn.aclrtSynchronizeStream(stream) == 0
    assert args[OUTPUT[op]].array.any()


class _FailingKernel:
    """A prepared kernel whose run fails."""

    def backward_on(self, *arrays):
        raise MemoryError("out of memory")


def test_computation_failure_is_runtime_error(valid_call, monkeypatch):
    op, args = valid_call

    def fail(*args, **kwargs):
        raise MemoryError("out of memory")
    _prepared.forget_prepared_calls()  # planned afresh: the run is one of these
    monkeypatch.setattr(OPERATOR_MODULE[op]._backend, "backward", fail)
    monkeypatch.setattr(OPERATOR_MODULE[op]._backend, "prepare_backward",
                        lambda *args: _FailingKernel())
    _, size, executor = PHASE_ONE[op](**args)
    assert PHASE_TWO[op](aclnn.aclrtMalloc(size), size, executor) == RUNTIME
    message = aclnn.aclGetRecentErrMsg()
    assert message.startswith(op + ": ") and "MemoryError: out of memory" in message
    assert executor.used  # a failed run still used the executor up


def test_phase_one_internal_error_is_a_status(valid_grid, monkeypatch):
    """Even a bug behind phase one's checks reaches the caller as a status, not an exception."""
    def fail(*args, **kwargs):
        raise ZeroDivisionError("division by zero")
    _prepared.forget_prepared_calls()  # planned afresh
    monkeypatch.setattr(_grid_sampler3d_backward._backend, "workspace_nbytes", fail)
    result = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**valid_grid)
    assert result == (RUNTIME, 0, None)
    assert "ZeroDivisionError" in aclnn.aclGetRecentErrMsg()


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("fmt", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
def test_repeated_calls_run_their_plans_on_their_own_arrays(rng, dtype, fmt, dense):
    # A phase one met before (the arguments' kinds, formats, shapes, strides, dtypes,
    # writability and values, and the thread count) takes its plan and prepared kernel,
    # unchecked: each call runs on its own arrays (gradOutput a strided view; the
    # gradients dense or with gaps, which the kernels leave alone: the general path), with
    # the NumPy API's bits on 1 and 2 threads. A read-only output of a planned call still
    # fails its check.
    _prepared.forget_prepared_calls()

    def output(shape, dense=dense):  # NaN (the kernels write every element), gaps unless dense
        full = np.full(shape[:-1] + (shape[-1] * (1 if dense else 2),), np.nan, dtype)
        return full if dense else full[..., ::2]

    def strided(a):  # the values of a, through a view with strides of two elements
        return np.repeat(a, 2, axis=-1)[..., ::2]

    threads = volsample.get_num_threads()
    try:
        for k in range(4):
            volsample.set_num_threads(1 + k % 2)
            grid = grid_arrays(rng, dtype, fmt=fmt)
            grid.update(gradOutput=strided(grid["gradOutput"]),
                        inputGrad=output(grid["inputGrad"].shape),
                        gridGrad=output(grid["gridGrad"].shape))
            run_grid(grid_args(grid, fmt, padding=1, align=True))
            expected = volsample.grid_sample_3d_backward(
                grid["gradOutput"], grid["input"], grid["grid"], "bilinear", "border", True,
                layout=LAYOUT[fmt])
            for name, theirs in zip(("inputGrad", "gridGrad"), expected):
                assert_bitwise_equal(f"call {k}: {name}", grid[name], theirs)
            upsample = upsample_arrays(rng, dtype, in_dhw=(4, 5, 4), out_dhw=(6, 7, 6),
                                       fmt=fmt)
            upsample.update(gradOut=strided(upsample["gradOut"]),
                            gradInput=output(upsample["gradInput"].shape))
            run_upsample(upsample_args(upsample, fmt, scales=(1.5, 1.4, 1.5)))
            assert_bitwise_equal(f"call {k}: gradInput", upsample["gradInput"],
                                 volsample.upsample_trilinear_3d_backward(
                                     upsample["gradOut"], upsample["input_size"], False,
                                     (1.5, 1.4, 1.5), layout=LAYOUT[fmt]))
        # one plan per thread count, a prepared kernel where the arrays allow it
        for module in (_grid_sampler3d_backward, _upsample_trilinear3d_backward):
            plans = _prepared.kept(module.OP)
            assert len(plans) == 2
            sixteen_bit_gradient = module is _grid_sampler3d_backward and dtype == np.float16
            assert all((p.kernel is not None) == (dtype != ml_dtypes.bfloat16 and dense
                                                  and not sixteen_bit_gradient) for p in plans)
        grid["inputGrad"].flags.writeable = False
        assert_failed(aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(
            **grid_args(grid, fmt, padding=1, align=True)), INVALID, GRID_OP + "GetWorkspaceSize",
            "inputGrad")
        upsample["gradInput"].flags.writeable = False
        assert_failed(aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(
            **upsample_args(upsample, fmt, scales=(1.5, 1.4, 1.5))), INVALID,
            UPSAMPLE_OP + "GetWorkspaceSize",
            "gradInput")
    finally:
        volsample.set_num_threads(threads)


def traced_peak(phase_one):
    """Run phase two once untraced (to compile), then again under tracemalloc:
    return (workspace size, peak bytes NumPy allocated during the run)."""
    _, size, warm = phase_one()
    assert warm is not None, aclnn.aclGetRecentErrMsg()
    PHASE_TWO[warm.op](aclnn.aclrtMalloc(size), size, warm)
    _, size, executor = phase_one()
    workspace = aclnn.aclrtMalloc(size)
    tracemalloc.start()
    try:
        assert PHASE_TWO[executor.op](workspace, size, executor) == 0
        return size, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


PYTHON_OVERHEAD = 16 << 10  # interpreter objects tracemalloc also sees during a call


@pytest.fixture
def one_thread():
    """Per-thread scratch (counted, but allocated by the C++ kernels, untraced) grows with
    the thread count; one thread keeps the lower bound of the workspace tests
    machine-independent."""
    before = volsample.get_num_threads()
    volsample.set_num_threads(1)
    yield
    volsample.set_num_threads(before)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("in_dhw, out_dhw", [((6, 7, 8), (12, 14, 16)), ((6, 7, 8), (6, 7, 24))])
@pytest.mark.parametrize("gaps", [None, "W every other element"])
def test_upsample_workspace_covers_real_scratch(rng, one_thread, dtype, in_dhw, out_dhw, gaps):
    """The workspace bounds the memory phase two allocates (as NumPy reports it to
    tracemalloc), and is the scratch the C++ kernels document (their per-axis tables and
    planes, which tracemalloc cannot see: tests/test_memory.py checks those against the
    resident set). Results go straight into a dense gradInput: nothing is staged; a
    gradInput with gaps adds its contiguous copy."""
    arrays = upsample_arrays(rng, dtype=dtype, N=2, C=3, in_dhw=in_dhw, out_dhw=out_dhw)
    staged = 0
    if gaps is not None:
        dense = arrays["gradInput"]
        staged = dense.nbytes
        arrays["gradInput"] = GAPS[gaps](np.zeros(dense.shape[:-1] + (2 * dense.shape[-1],), dtype))
    size, peak = traced_peak(
        lambda: aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(**upsample_args(arrays)))
    assert peak <= size + PYTHON_OVERHEAD, f"phase two allocated {peak} bytes, workspace {size}"
    grad_out = arrays["gradOut"]
    assert size == staged + volsample.upsample.backward_workspace_nbytes(
        grad_out.shape, (2, 3) + tuple(in_dhw), dtype, threads=1)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mask", [(True, True), (True, False), (False, True)])
def test_grid_workspace_covers_real_scratch(rng, one_thread, dtype, mask):
    """The workspace bounds the memory phase two allocates (as NumPy reports it to
    tracemalloc; the C++ kernels' own tables are counted but not traced), and is
    not wildly above it."""
    arrays = grid_arrays(rng, dtype=dtype, N=2, C=3, in_dhw=(8, 9, 40), out_dhw=(7, 6, 40))
    size, peak = traced_peak(
        lambda: aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**grid_args(arrays, mask=mask)))
    assert peak <= size + PYTHON_OVERHEAD, f"phase two allocated {peak} bytes, workspace {size}"
    assert size <= 2 * peak, f"workspace {size} bytes is far above the {peak} bytes used"


# --- the seeds' examples -------------------------------------------------------------------


def load_example(name):
    return runpy.run_path(str(EXAMPLES / name))


def test_grid_example_documented_values(capsys):
    example = load_example("grid_sampler3d_backward.py")
    input_grad, grid_grad = example["run"]()
    # the values the CANN documentation prints for its example
    assert input_grad.ravel().tolist() == [0.25, 0, 0, 0.5, 0, 0, 0.125, 0.5, 0]
    assert grid_grad.ravel().tolist() == [0.75, 0.75, -0.125, 2.625, -2.625, 0.875, 6.0, 2.25,
                                          -1.0, 0.75, -12.0, -2.0]
    assert example["main"]() == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "inputGrad result[0] is: 0.250000"
    assert printed[-1] == "gridGrad result[11] is: -2.000000"
    assert len(printed) == 21


def test_grid_example_inputs_agree_with_torch():
    """The example's inputs give PyTorch's gradients too (the documented numbers are
    PyTorch's, not something only volsample computes)."""
    go = torch.ones(1, 1, 1, 2, 2)
    inp = torch.arange(1.0, 10.0).reshape(1, 1, 1, 3, 3)
    grid = torch.tensor([-1, -1, 0, -1, 1, -1, -1, 0, 0, 0, 1, 0.0]).reshape(1, 1, 2, 2, 3)
    gi, gg = torch.ops.aten.grid_sampler_3d_backward(go, inp, grid, 0, 0, False, [True, True])
    input_grad, grid_grad = load_example("grid_sampler3d_backward.py")["run"]()
    assert input_grad.ravel().tolist() == gi.ravel().tolist()
    assert grid_grad.ravel().tolist() == gg.ravel().tolist()


def test_upsample_example_documented_values(capsys):
    example = load_example("upsample_trilinear3d_backward.py")
    assert example["run"]().ravel().tolist() == [36, 100, 164, 228]  # the CANN documentation's numbers
    assert example["main"]() == 0
    assert capsys.readouterr().out.splitlines() == [
        "result[0] is: 36.000000", "result[1] is: 100.000000",
        "result[2] is: 164.000000", "result[3] is: 228.000000"]


def test_upsample_example_inputs_agree_with_torch():
    grad_out = torch.arange(1.0, 33.0).reshape(2, 2, 2, 2, 2)
    expected = torch.ops.aten.upsample_trilinear3d_backward(grad_out, [2, 2, 2], [2, 2, 1, 1, 1],
                                                            False, 0.0, 0.0, 0.0)
    assert load_example("upsample_trilinear3d_backward.py")["run"]().ravel().tolist() == \
        expected.ravel().tolist()


# --- runtime helpers ----------------------------------------------------------------------


@pytest.fixture
def restore_deterministic():
    before = volsample.get_deterministic()
    yield
    volsample.set_deterministic(before)


@pytest.mark.parametrize("value", [1, 0, 1])
def test_deterministic_switch(restore_deterministic, value):
    volsample.set_deterministic(not value)
    assert aclnn.aclrtCtxSetSysParamOpt(aclnn.ACL_OPT_DETERMINISTIC, value) == aclnn.ACL_SUCCESS
    assert volsample.get_deterministic() is bool(value)
    assert aclnn.aclrtCtxGetSysParamOpt(aclnn.ACL_OPT_DETERMINISTIC) == (aclnn.ACL_SUCCESS, value)


@pytest.mark.parametrize("opt, value, param", [(1, 1, "opt"), ("deterministic", 1, "opt"),
                                               (aclnn.ACL_OPT_DETERMINISTIC, 2, "value"),
                                               (aclnn.ACL_OPT_DETERMINISTIC, "on", "value")])
def test_deterministic_switch_rejects(restore_deterministic, opt, value, param):
    volsample.set_deterministic(False)
    assert aclnn.aclrtCtxSetSysParamOpt(opt, value) == aclnn.ACL_ERROR_INVALID_PARAM
    assert aclnn.aclGetRecentErrMsg().startswith(f"aclrtCtxSetSysParamOpt: {param}:")
    assert volsample.get_deterministic() is False


def test_results_identical_in_both_deterministic_modes(rng, restore_deterministic):
    results = []
    for value in (1, 0):
        aclnn.aclrtCtxSetSysParamOpt(aclnn.ACL_OPT_DETERMINISTIC, value)
        arrays = grid_arrays(np.random.default_rng(5), dtype=np.float32)
        run_grid(grid_args(arrays))
        results.append(arrays)
    for name in ("inputGrad", "gridGrad"):
        assert_bitwise_equal(name, results[0][name], results[1][name])


@pytest.mark.parametrize("call, param", [
    (lambda: aclnn.aclCreateTensor([1.0, 2.0], aclnn.ACL_FORMAT_ND), "array"),
    (lambda: aclnn.aclCreateTensor(np.zeros(3), 12345), "format"),
    (lambda: aclnn.aclCreateTensor(np.zeros(3), "NCDHW"), "format"),
    (lambda: aclnn.aclCreateIntArray([1, 2.5]), "values"),
    (lambda: aclnn.aclCreateIntArray([1, 2**63]), "values"),
    (lambda: aclnn.aclCreateIntArray(7), "values"),
    (lambda: aclnn.aclCreateBoolArray([True, "yes"]), "values"),
    (lambda: aclnn.aclCreateBoolArray([True, 2]), "values"),
    (lambda: aclnn.aclrtMalloc(-1), "size"),
    (lambda: aclnn.aclrtMalloc(1.5), "size"),
    (lambda: aclnn.aclrtMalloc(1 << 62), "size"),
])
def test_creation_failure_is_null(call, param):
    assert call() is None
    message = aclnn.aclGetRecentErrMsg()
    assert f": {param}:" in message, message


def test_tensor_shape_follows_format():
    arr = np.zeros((2, 4, 5, 6, 3), np.float32)  # physically N, D, H, W, C
    channels_last = aclnn.aclCreateTensor(arr, aclnn.ACL_FORMAT_NDHWC)
    assert channels_last.shape == (2, 4, 5, 6, 3)
    assert channels_last.logical_shape() == (2, 3, 4, 5, 6)
    assert aclnn.aclCreateTensor(arr, aclnn.ACL_FORMAT_ND).logical_shape() == (2, 4, 5, 6, 3)
    assert channels_last.dataType == aclnn.ACL_FLOAT
    arr.shape = (2, 4, 5, 18)  # reshaping the caller's array later does not change the tensor
    assert channels_last.shape == (2, 4, 5, 6, 3)
    assert aclnn.aclCreateBoolArray([True, np.bool_(False), 1]).values == (True, False, True)
    assert aclnn.aclCreateIntArray(np.array([1, 2, 3])).values == (1, 2, 3)


@pytest.mark.parametrize("destroy", [aclnn.aclDestroyTensor, aclnn.aclDestroyIntArray,
                                     aclnn.aclDestroyBoolArray, aclnn.aclDestroyAclOpExecutor,
                                     aclnn.aclrtFree, aclnn.aclrtDestroyStream])
def test_destroy_is_safe(destroy, valid_grid):
    for obj in (None, valid_grid["input"], valid_grid["outputMask"]):
        assert destroy(obj) == aclnn.ACL_SUCCESS
        assert destroy(obj) == aclnn.ACL_SUCCESS  # twice


def test_recent_error_message_is_per_thread_and_cleared_on_read(valid_grid):
    valid_grid["grid"] = None
    aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**valid_grid)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(aclnn.aclGetRecentErrMsg()))
    worker.start()
    worker.join()
    assert seen == [None]
    assert "grid" in aclnn.aclGetRecentErrMsg()
    assert aclnn.aclGetRecentErrMsg() is None


GRID_POSITIONS = ("gradOutput", "input", "grid", "interpolationMode", "paddingMode", "alignCorners",
                  "outputMask", "inputGrad", "gridGrad")


@pytest.mark.parametrize("position, value", [
    (p, v) for p in range(9) for v in WEIRD
    if not (GRID_POSITIONS[p] == "outputMask" and v is None)  # a None mask is valid
], ids=lambda x: x if isinstance(x, int) else type(x).__name__)
def test_grid_phase_one_never_raises(valid_grid, position, value):
    """Anything in any argument position is a status code, never an exception."""
    args = [valid_grid[name] for name in GRID_POSITIONS]
    args[position] = value
    status, size, executor = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(*args)
    is_pointer = isinstance(valid_grid[GRID_POSITIONS[position]], aclnn.aclTensor)
    expected = NULLPTR if value is None and is_pointer else INVALID
    assert (status, size, executor) == (expected, 0, None)
    assert GRID_POSITIONS[position] in aclnn.aclGetRecentErrMsg()
