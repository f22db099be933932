"""Tests of ``volsample.aclnn``, the CANN two-phase API.

Every first-phase check of SPEC §6 has its own case (status code, and a message that names
the offending parameter); results are compared with the NumPy API (bitwise: same kernels)
and with PyTorch's CPU operators (independent oracle); the seeds' examples must give the
documented numbers exactly.
"""
from __future__ import annotations

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
from volsample import aclnn

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GRID_OP = "aclnnGridSampler3DBackward"
NULLPTR, INVALID, RUNTIME = 161001, 161002, 361001
FORMATS = {"ND": aclnn.ACL_FORMAT_ND, "NCDHW": aclnn.ACL_FORMAT_NCDHW, "NDHWC": aclnn.ACL_FORMAT_NDHWC}
LAYOUT = {"ND": "NCDHW", "NCDHW": "NCDHW", "NDHWC": "NDHWC"}
NDHWC_OF_NCDHW = (0, 2, 3, 4, 1)


def physical(logical_array, fmt):
    """A contiguous array in ``fmt``'s physical order holding an (N, C, D, H, W) volume."""
    if LAYOUT[fmt] == "NDHWC":
        return np.ascontiguousarray(logical_array.transpose(NDHWC_OF_NCDHW))
    return np.ascontiguousarray(logical_array)


def assert_failed(result, status, op, param):
    """Phase one failed with ``status`` and a message naming ``param``."""
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
    args = {name: aclnn.aclCreateTensor(arr, FORMATS[fmt] if name != "grid" and name != "gridGrad"
                                        else aclnn.ACL_FORMAT_ND)
            for name, arr in arrays.items()}
    args.update(interpolationMode=mode, paddingMode=padding, alignCorners=align,
                outputMask=None if mask is None else aclnn.aclCreateBoolArray(list(mask)))
    return args


def run_grid(args):
    """Both phases; return (phase-one status, workspace size, phase-two status)."""
    status, size, executor = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**args)
    assert status == 0, aclnn.aclGetRecentErrMsg()
    workspace = aclnn.aclrtMalloc(size) if size > 0 else None
    return status, size, aclnn.aclnnGridSampler3DBackward(workspace, size, executor, None)


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
    # 161002: a volume format these operators cannot read
    "format-gradOutput": (lambda a: retag(a, "gradOutput", fmt=aclnn.ACL_FORMAT_NCHW), INVALID, "gradOutput"),
    "format-input": (lambda a: retag(a, "input", fmt=aclnn.ACL_FORMAT_NC1HWC0), INVALID, "input"),
    "format-inputGrad": (lambda a: retag(a, "inputGrad", fmt=aclnn.ACL_FORMAT_NHWC), INVALID, "inputGrad"),
    # 161002: modes
    "interpolationMode-2": (lambda a: a.update(interpolationMode=2), INVALID, "interpolationMode"),
    "interpolationMode--1": (lambda a: a.update(interpolationMode=-1), INVALID, "interpolationMode"),
    "interpolationMode-str": (lambda a: a.update(interpolationMode="nearest"), INVALID, "interpolationMode"),
    "interpolationMode-float": (lambda a: a.update(interpolationMode=0.0), INVALID, "interpolationMode"),
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
    # several faults at once: the first in SPEC §6's order is the one reported
    (["null-gridGrad", "null-grid"], NULLPTR, "grid"),
    (["dtype-gradOutput", "null-inputGrad"], NULLPTR, "inputGrad"),
    (["interpolationMode-2", "dtype-grid"], INVALID, "grid"),
    (["rank-input", "paddingMode-3"], INVALID, "paddingMode"),
    (["outputMask-size-3", "gridGrad-shape", "grid-last-dim"], INVALID, "grid"),
    (["outputMask-size-1", "inputGrad-shape"], INVALID, "inputGrad"),
    (["inputGrad-read-only", "outputMask-size-1"], INVALID, "outputMask"),
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
    _, size, status = run_grid(grid_args(arrays, mask=mask))
    assert (size, status) == (0, 0)
    assert (arrays["inputGrad"] == 7.0).all() and (arrays["gridGrad"] == -7.0).all()


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
    _, size, status = run_grid(grid_args(arrays, fmt=fmt))
    assert status == 0 and size == 0
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


@pytest.mark.parametrize("formats", [
    ("NDHWC", "NDHWC", "NDHWC"), ("NCDHW", "NDHWC", "NCDHW"), ("NDHWC", "ND", "NDHWC"),
], ids=lambda f: "-".join(f))
@pytest.mark.parametrize("mode, padding, align", [(0, 0, False), (0, 2, True), (1, 1, False)])
def test_grid_formats_against_torch(rng, formats, mode, padding, align):
    """gradOutput, input and inputGrad in their own formats (NDHWC is physically
    channels-last) give PyTorch's gradients."""
    logical = grid_arrays(rng, dtype=np.float64, N=2, C=5, in_dhw=(3, 4, 5), out_dhw=(2, 3, 4))
    fmt_go, fmt_in, fmt_gi = formats
    arrays = dict(logical, gradOutput=physical(logical["gradOutput"], fmt_go),
                  input=physical(logical["input"], fmt_in))
    arrays["inputGrad"] = np.zeros_like(physical(logical["input"], fmt_gi))
    args = grid_args(arrays, mode=mode, padding=padding, align=align)
    for name, fmt in zip(("gradOutput", "input", "inputGrad"), formats):
        retag(args, name, fmt=FORMATS[fmt])
    run_grid(args)
    gi, gg = torch.ops.aten.grid_sampler_3d_backward(
        torch_tensor(logical["gradOutput"]), torch_tensor(logical["input"]), torch_tensor(logical["grid"]),
        mode, padding, align, [True, True])
    assert_close("inputGrad", arrays["inputGrad"], physical(numpy_array(gi), fmt_gi), 1e-12, 1e-12)
    assert_close("gridGrad", arrays["gridGrad"], numpy_array(gg), 1e-12, 1e-12)


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


# --- phase two ---------------------------------------------------------------------------


def test_executor_runs_once(valid_grid):
    status, size, executor = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**valid_grid)
    workspace = aclnn.aclrtMalloc(size)
    assert aclnn.aclnnGridSampler3DBackward(workspace, size, executor, None) == 0
    assert_failed(aclnn.aclnnGridSampler3DBackward(workspace, size, executor, None), INVALID,
                  GRID_OP, "executor")


def grid_phase_two_fault(valid_grid, fault):
    _, size, executor = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**valid_grid)
    assert size > 0
    launch = {"workspace": aclnn.aclrtMalloc(size), "workspaceSize": size,
              "executor": executor, "stream": None}
    fault(launch, size)
    return executor, launch


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
def test_grid_phase_two_rejects(valid_grid, fault):
    break_launch, status, param = fault
    executor, launch = grid_phase_two_fault(valid_grid, break_launch)
    assert_failed(aclnn.aclnnGridSampler3DBackward(**launch), status, GRID_OP, param)
    assert not valid_grid["inputGrad"].array.any(), "a refused launch wrote its output"
    if isinstance(executor, aclnn.aclOpExecutor):  # a refused launch leaves the executor usable
        size = executor.workspace_size
        assert aclnn.aclnnGridSampler3DBackward(aclnn.aclrtMalloc(size), size, executor, None) == 0
        assert valid_grid["inputGrad"].array.any()


def test_phase_two_accepts_streams_and_larger_workspaces(valid_grid):
    _, size, executor = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**valid_grid)
    stream = aclnn.aclrtCreateStream()
    assert aclnn.aclnnGridSampler3DBackward(bytearray(size + 100), size + 100, executor, stream) == 0
    assert aclnn.aclrtSynchronizeStream(stream) == 0
    assert valid_grid["gridGrad"].array.any()


def test_grid_computation_failure_is_runtime_error(valid_grid, monkeypatch):
    def fail(*args, **kwargs):
        raise MemoryError("out of memory")
    monkeypatch.setattr(aclnn, "grid_sample_3d_backward", fail)
    _, size, executor = aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**valid_grid)
    assert aclnn.aclnnGridSampler3DBackward(aclnn.aclrtMalloc(size), size, executor) == RUNTIME
    message = aclnn.aclGetRecentErrMsg()
    assert message.startswith(GRID_OP + ": ") and "MemoryError: out of memory" in message
    assert executor.used  # a failed run still used the executor up


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mask", [(True, True), (True, False), (False, True)])
def test_grid_workspace_covers_real_scratch(rng, dtype, mask):
    """The workspace bounds the memory phase two allocates (as NumPy reports it to
    tracemalloc; the Numba kernels' own tables are counted but not traced), and is
    not wildly above it."""
    arrays = grid_arrays(rng, dtype=dtype, N=2, C=3, in_dhw=(8, 9, 40), out_dhw=(7, 6, 40))
    make = lambda: aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize(**grid_args(arrays, mask=mask))  # noqa: E731
    _, size, warm = make()
    aclnn.aclnnGridSampler3DBackward(aclnn.aclrtMalloc(size), size, warm)  # compile outside the trace
    _, size, executor = make()
    workspace = aclnn.aclrtMalloc(size)
    tracemalloc.start()
    try:
        assert aclnn.aclnnGridSampler3DBackward(workspace, size, executor) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    python_overhead = 16 << 10
    assert peak <= size + python_overhead, f"phase two allocated {peak} bytes, workspace {size}"
    assert size <= 2 * peak, f"workspace {size} bytes is far above the {peak} bytes used"


# --- the seeds' examples -------------------------------------------------------------------


def load_example(name):
    return runpy.run_path(str(EXAMPLES / name))


def test_grid_example_documented_values(capsys):
    example = load_example("grid_sampler3d_backward.py")
    input_grad, grid_grad = example["run"]()
    # SPEC §6: the values the CANN documentation prints for its example
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


WEIRD = [None, "x", 1.5, -1, 2**70, object(), [1, 2], np.zeros(0), float("nan")]
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
