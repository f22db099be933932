"""Property-based tests (hypothesis) of the three front doors.

* Random valid calls -- shapes with size-1 axes and primes, every dtype (and the mixed
  16-bit volume / wide grid), both layouts, views with odd and negative strides, every
  mode, padding, align_corners, sizes and scale factors -- agree with the float64
  reference (``volsample._reference``) within the dtype's tolerance.
* Random invalid calls raise the documented error class, naming the argument; in
  ``volsample.aclnn`` they return the documented status, never an exception.
* Junk of every kind in every aclnn argument position is a status code.
* Crash-prone inputs (0-d / 1-d arrays, object and exotic dtypes, huge, zero and
  negative strides, unaligned memory, absurd sizes) run in a subprocess, which must exit
  normally.

Example counts are modest and the search is derandomised, so CI runs the same examples
every time; ``database=None`` keeps hypothesis from writing an example database.
"""
from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import assert_close, numpy_array, torch_tensor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import volsample
import volsample.torch as vt
from volsample import InvalidArgumentError, UnsupportedDTypeError, aclnn
from volsample import _reference as reference
from volsample.aclnn import _runtime as aclnn_runtime

FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEW = settings(FUZZ, max_examples=20)

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
# Relative tolerance of a result stored in a dtype, against float64 (scaled by the
# result's magnitude): 16-bit results are rounded once from float32.
TOL = {np.dtype(np.float16): 3e-3, BF16: 2e-2, np.dtype(np.float32): 2e-5,
       np.dtype(np.float64): 1e-11}
# Size-1 axes (align_corners' degenerate (S-1)/2 = 0), 2, and primes.
SIZES = st.sampled_from([1, 2, 3, 5, 7, 13])
MODES, PADDINGS, LAYOUTS = ["bilinear", "nearest"], ["zeros", "border", "reflection"], ["NCDHW", "NDHWC"]
NULLPTR, INVALID = aclnn.ACLNN_ERR_PARAM_NULLPTR, aclnn.ACLNN_ERR_PARAM_INVALID
TO_NDHWC, TO_NCDHW = (0, 2, 3, 4, 1), (0, 4, 1, 2, 3)
# Grid values that are exact in every dtype: borders, centre, half-way, far outside.
EXACT_COORDS = np.array([-1.0, 1.0, 0.0, 0.5, -0.5, 0.25, 3.0, -3.0, 1.5])


def check(name, actual, expected, dtype):
    """Compare with the float64 truth, tolerance relative to the result's magnitude."""
    tol = TOL[np.dtype(dtype)]
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    assert_close(name, actual, expected, tol, tol * scale)


def odd_view(arr, rng):
    """The values of ``arr`` in a view with doubled and (on random axes) negative strides."""
    big = np.zeros(tuple(2 * s for s in arr.shape), arr.dtype)
    view = big[tuple(slice(None, None, 2) for _ in arr.shape)]
    flips = tuple(i for i in range(arr.ndim) if rng.random() < 0.5)
    view = np.flip(view, flips) if flips else view
    view[...] = arr
    return view


def physical(logical, layout):
    return logical.transpose(TO_NDHWC) if layout == "NDHWC" else logical


def logical(physical_, layout):
    return physical_.transpose(TO_NCDHW) if layout == "NDHWC" else physical_


def random_grid(rng, shape, dtype):
    """Uniform points in and around [-1, 1], a fifth of the coordinates replaced by exact
    special values (borders, centre, far outside)."""
    grid = rng.uniform(-1.3, 1.3, shape)
    special = rng.random(shape) < 0.2
    grid[special] = rng.choice(EXACT_COORDS, size=int(special.sum()))
    return grid.astype(dtype)


# --- strategies -----------------------------------------------------------------------------

@st.composite
def grid_sample_cases(draw, modes=MODES):
    dtype = draw(st.sampled_from(DTYPES))
    grid_dtype = dtype
    if dtype.itemsize == 2:  # mixed precision: a float32/float64 grid beside a 16-bit volume
        grid_dtype = draw(st.sampled_from([dtype, np.dtype(np.float32), np.dtype(np.float64)]))
    return dict(
        dtype=dtype, grid_dtype=grid_dtype,
        N=draw(st.integers(1, 2)), C=draw(st.integers(1, 3)),
        in_dhw=tuple(draw(SIZES) for _ in range(3)), out_dhw=tuple(draw(SIZES) for _ in range(3)),
        mode=draw(st.sampled_from(modes)), padding_mode=draw(st.sampled_from(PADDINGS)),
        align_corners=draw(st.booleans()), layout=draw(st.sampled_from(LAYOUTS)),
        strided=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)),
        output_mask=draw(st.sampled_from([(True, True), (True, False), (False, True)])))


def grid_sample_arrays(case):
    """(input, grid, grad_output) as logical NCDHW arrays of the case's dtypes."""
    rng = np.random.default_rng(case["seed"])
    N, C = case["N"], case["C"]
    x = rng.standard_normal((N, C) + case["in_dhw"]).astype(case["dtype"])
    grid = random_grid(rng, (N,) + case["out_dhw"] + (3,), case["grid_dtype"])
    grad_out = rng.standard_normal((N, C) + case["out_dhw"]).astype(case["dtype"])
    return x, grid, grad_out


SCALES = st.sampled_from([0.3, 0.5, 0.7, 1.0, 4 / 3, 1.5, 2.0, 2.5, 3.0])


@st.composite
def upsample_cases(draw):
    in_dhw = tuple(draw(SIZES) for _ in range(3))
    if draw(st.booleans()):
        scales = tuple(draw(SCALES) for _ in range(3))
        out_dhw = tuple(math.floor(n * s) for n, s in zip(in_dhw, scales))
        if min(out_dhw) < 1:  # a scale that leaves no voxel: use sizes instead
            scales, out_dhw = None, tuple(max(1, n) for n in out_dhw)
    else:
        scales, out_dhw = None, tuple(draw(SIZES) for _ in range(3))
    # The backward may be given any finite scales (consistent with the sizes or not,
    # <= 0 meaning "from the sizes"); the forward only ones that made its size.
    backward_scales = draw(st.one_of(
        st.just(scales), st.none(),
        st.tuples(*[st.one_of(st.none(), st.sampled_from([-1.0, 0.0, 0.4, 1.0, 2.0, 7.5]))] * 3)))
    return dict(dtype=draw(st.sampled_from(DTYPES)), N=draw(st.integers(1, 2)),
                C=draw(st.integers(1, 3)), in_dhw=in_dhw, out_dhw=out_dhw, scales=scales,
                backward_scales=backward_scales, align_corners=draw(st.booleans()),
                layout=draw(st.sampled_from(LAYOUTS)), strided=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)))


def upsample_arrays(case):
    """(input, grad_output) as logical NCDHW arrays of the case's dtype."""
    rng = np.random.default_rng(case["seed"])
    N, C = case["N"], case["C"]
    x = rng.standard_normal((N, C) + case["in_dhw"]).astype(case["dtype"])
    grad_out = rng.standard_normal((N, C) + case["out_dhw"]).astype(case["dtype"])
    return x, grad_out


def reference_scales(scales):
    """The reference's per-axis scales: None for "from the sizes" (also for <= 0)."""
    return None if scales is None else tuple(s if s is not None and s > 0 else None for s in scales)


# --- valid calls agree with the float64 reference ----------------------------------------

@FUZZ
@given(case=grid_sample_cases())
def test_numpy_grid_sample_matches_reference(case):
    x, grid, grad_out = grid_sample_arrays(case)
    modes = (case["mode"], case["padding_mode"], case["align_corners"])
    layout = case["layout"]
    rng = np.random.default_rng(case["seed"] + 1)
    x_arg, go_arg, grid_arg = physical(x, layout), physical(grad_out, layout), grid
    if case["strided"]:
        x_arg, go_arg, grid_arg = odd_view(x_arg, rng), odd_view(go_arg, rng), odd_view(grid_arg, rng)

    out = volsample.grid_sample_3d(x_arg, grid_arg, *modes, layout=layout)
    gi, gg = volsample.grid_sample_3d_backward(go_arg, x_arg, grid_arg, *modes,
                                               output_mask=case["output_mask"], layout=layout)

    assert out.dtype == case["dtype"] and out.shape == physical(grad_out, layout).shape
    check("output", logical(out, layout), reference.grid_sample_3d(x, grid, *modes), case["dtype"])
    ref_gi, ref_gg = reference.grid_sample_3d_backward(grad_out, x, grid, *modes)
    want_input, want_grid = case["output_mask"]
    assert (gi is None) != want_input and (gg is None) != want_grid
    if want_input:
        assert gi.dtype == case["dtype"]
        check("grad_input", logical(gi, layout), ref_gi, case["dtype"])
    if want_grid:
        assert gg.dtype == case["grid_dtype"] and gg.shape == grid.shape
        check("grad_grid", gg, ref_gg, case["dtype"])


@FUZZ
@given(case=upsample_cases())
def test_numpy_upsample_matches_reference(case):
    x, grad_out = upsample_arrays(case)
    layout, align = case["layout"], case["align_corners"]
    rng = np.random.default_rng(case["seed"] + 1)
    x_arg, go_arg = physical(x, layout), physical(grad_out, layout)
    if case["strided"]:
        x_arg, go_arg = odd_view(x_arg, rng), odd_view(go_arg, rng)
    if case["scales"] is None:
        out = volsample.upsample_trilinear_3d(x_arg, size=case["out_dhw"], align_corners=align,
                                              layout=layout)
    else:
        out = volsample.upsample_trilinear_3d(x_arg, scale_factor=case["scales"],
                                              align_corners=align, layout=layout)
    gi = volsample.upsample_trilinear_3d_backward(go_arg, x.shape, align, case["backward_scales"],
                                                  layout=layout)
    assert out.dtype == gi.dtype == case["dtype"]
    check("output", logical(out, layout),
          reference.upsample_trilinear_3d(x, case["out_dhw"], align, case["scales"]), case["dtype"])
    check("grad_input", logical(gi, layout),
          reference.upsample_trilinear_3d_backward(grad_out, x.shape, align,
                                                   reference_scales(case["backward_scales"])),
          case["dtype"])


TORCH_DTYPES = {np.dtype(np.float16): torch.float16, BF16: torch.bfloat16,
                np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def as_torch(arr, channels_last, requires_grad=False):
    t = torch_tensor(np.ascontiguousarray(arr))
    if channels_last:
        t = t.contiguous(memory_format=torch.channels_last_3d)
    return t.requires_grad_(requires_grad)


@FEW
@given(case=grid_sample_cases(MODES + ["bicubic", "bspline"]))
def test_torch_grid_sample_matches_reference(case):
    """volsample.torch forward and autograd backward (both gradients) on CPU tensors."""
    x, grid, grad_out = grid_sample_arrays(case)
    modes = (case["mode"], case["padding_mode"], case["align_corners"])
    channels_last = case["layout"] == "NDHWC"
    xt, gt = as_torch(x, channels_last, True), as_torch(grid, False, True)
    out = vt.grid_sample(xt, gt, *modes)
    out.backward(as_torch(grad_out, channels_last))
    assert out.dtype == TORCH_DTYPES[case["dtype"]]
    check("output", numpy_array(out), reference.grid_sample_3d(x, grid, *modes), case["dtype"])
    ref_gi, ref_gg = reference.grid_sample_3d_backward(grad_out, x, grid, *modes)
    check("grad_input", numpy_array(xt.grad), ref_gi, case["dtype"])
    check("grad_grid", numpy_array(gt.grad), ref_gg, case["dtype"])


@FEW
@given(case=upsample_cases())
def test_torch_upsample_matches_reference(case):
    x, grad_out = upsample_arrays(case)
    align, channels_last = case["align_corners"], case["layout"] == "NDHWC"
    xt = as_torch(x, channels_last, True)
    if case["scales"] is None:
        out = vt.upsample_trilinear(xt, size=case["out_dhw"], align_corners=align)
    else:
        out = vt.upsample_trilinear(xt, scale_factor=case["scales"], align_corners=align)
    out.backward(as_torch(grad_out, channels_last))
    check("output", numpy_array(out),
          reference.upsample_trilinear_3d(x, case["out_dhw"], align, case["scales"]), case["dtype"])
    check("grad_input", numpy_array(xt.grad),
          reference.upsample_trilinear_3d_backward(grad_out, x.shape, align, case["scales"]),
          case["dtype"])


ACL_FORMATS = {"ND": aclnn.ACL_FORMAT_ND, "NCDHW": aclnn.ACL_FORMAT_NCDHW,
               "NDHWC": aclnn.ACL_FORMAT_NDHWC}
ACL_LAYOUT = {"ND": "NCDHW", "NCDHW": "NCDHW", "NDHWC": "NDHWC"}


def acl_volume(logical_array, layout, fmt):
    """An aclTensor tagged ``fmt`` holding a logical volume in ``layout``'s physical order."""
    arr = np.ascontiguousarray(physical(logical_array, layout))
    return aclnn.aclCreateTensor(arr, ACL_FORMATS[fmt]), arr


def run_two_phases(phase_one, phase_two, args):
    status, size, executor = phase_one(*args)
    assert status == 0, aclnn.aclGetRecentErrMsg()
    workspace = aclnn.aclrtMalloc(size) if size else None
    assert phase_two(workspace, size, executor) == 0, aclnn.aclGetRecentErrMsg()


FORMAT_NAMES = st.sampled_from(list(ACL_FORMATS))


@FEW
@given(case=grid_sample_cases(), formats=st.tuples(FORMAT_NAMES, FORMAT_NAMES, FORMAT_NAMES))
def test_aclnn_grid_sampler_matches_reference(case, formats):
    """input's format decides the layout of gradOutput, input and inputGrad (their own
    tags are not read, as in CANN); CANN keeps one dtype: the grid's is the input's."""
    case = dict(case, grid_dtype=case["dtype"])
    x, grid, grad_out = grid_sample_arrays(case)
    layout = ACL_LAYOUT[formats[1]]
    go_t, _ = acl_volume(grad_out, layout, formats[0])
    in_t, _ = acl_volume(x, layout, formats[1])
    gi_t, gi = acl_volume(np.zeros_like(x), layout, formats[2])
    gg = np.zeros_like(grid)
    modes = (MODES.index(case["mode"]), PADDINGS.index(case["padding_mode"]), case["align_corners"])
    run_two_phases(aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize, aclnn.aclnnGridSampler3DBackward,
                   (go_t, in_t, aclnn.aclCreateTensor(grid), *modes,
                    aclnn.aclCreateBoolArray(list(case["output_mask"])), gi_t, aclnn.aclCreateTensor(gg)))
    ref_gi, ref_gg = reference.grid_sample_3d_backward(
        grad_out, x, grid, case["mode"], case["padding_mode"], case["align_corners"])
    want_input, want_grid = case["output_mask"]
    check("inputGrad", logical(gi, layout), ref_gi if want_input else 0 * ref_gi, case["dtype"])
    check("gridGrad", gg, ref_gg if want_grid else 0 * ref_gg, case["dtype"])


@FEW
@given(case=upsample_cases(), formats=st.tuples(FORMAT_NAMES, FORMAT_NAMES))
def test_aclnn_upsample_matches_reference(case, formats):
    x, grad_out = upsample_arrays(case)
    go_t, _ = acl_volume(grad_out, ACL_LAYOUT[formats[0]], formats[0])
    gi_t, gi = acl_volume(np.zeros_like(x), ACL_LAYOUT[formats[1]], formats[1])
    # aclnn passes 0.0 for "no scale"; CANN uses the scales only when all three are > 0.
    scales = [0.0 if s is None else s for s in (case["backward_scales"] or (None,) * 3)]
    used = tuple(scales) if all(s > 0 for s in scales) else None
    run_two_phases(aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize,
                   aclnn.aclnnUpsampleTrilinear3dBackward,
                   (go_t, aclnn.aclCreateIntArray(list(case["out_dhw"])),
                    aclnn.aclCreateIntArray(list(x.shape)), case["align_corners"], *scales, gi_t))
    check("gradInput", logical(gi, ACL_LAYOUT[formats[1]]),
          reference.upsample_trilinear_3d_backward(grad_out, x.shape, case["align_corners"], used),
          case["dtype"])


# --- invalid calls raise the documented errors ---------------------------------------------

def pick(rng, options):
    """One of ``options`` (any objects: ``rng.choice`` would make an array of them)."""
    return options[int(rng.integers(len(options)))]


def _junk_dtype(kwargs, name, dtype):
    kwargs[name] = kwargs[name].astype(dtype)


# (name, how to break valid NumPy grid-sampling kwargs, error, text the message starts with)
GRID_SAMPLE_FAULTS = [
    ("input-rank", lambda k, r: k.update(input=k["input"][0]), InvalidArgumentError, "input"),
    ("input-0d", lambda k, r: k.update(input=np.float32(1.0)), InvalidArgumentError, "input"),
    ("grid-rank", lambda k, r: k.update(grid=k["grid"][..., None]), InvalidArgumentError, "grid"),
    ("grid-last-dim", lambda k, r: k.update(grid=k["grid"][..., :int(r.integers(0, 3))]),
     InvalidArgumentError, "grid"),
    ("grid-batch", lambda k, r: k.update(grid=np.concatenate([k["grid"]] * 2)),
     InvalidArgumentError, "grid"),
    ("input-empty-spatial", lambda k, r: k.update(input=k["input"][:, :, :0]),
     InvalidArgumentError, "input"),
    ("input-int", lambda k, r: _junk_dtype(k, "input", pick(r, [np.int32, np.int64, np.uint8])),
     UnsupportedDTypeError, "input"),
    ("input-exotic-dtype", lambda k, r: _junk_dtype(
        k, "input", pick(r, [np.complex64, np.bool_, object, np.longdouble, ml_dtypes.float8_e4m3fn,
                              np.dtype(">f4")])), UnsupportedDTypeError, "input"),
    ("grid-dtype", lambda k, r: _junk_dtype(
        k, "grid", np.float64 if k["input"].dtype == np.float32 else np.int16),
     UnsupportedDTypeError, "grid"),
    ("input-not-an-array", lambda k, r: k.update(input=pick(r, ["volume", None, 3.5, {}])),
     UnsupportedDTypeError, "input"),
    ("mode", lambda k, r: k.update(mode=pick(r, ["trilinear", "BILINEAR", "", None, 0])),
     InvalidArgumentError, "mode"),
    ("padding_mode", lambda k, r: k.update(padding_mode=pick(r, ["zero", "reflect", None, 1])),
     InvalidArgumentError, "padding_mode"),
    ("align_corners", lambda k, r: k.update(align_corners=pick(r, [1, 0, "True", None, 1.0])),
     InvalidArgumentError, "align_corners"),
    ("layout", lambda k, r: k.update(layout=pick(r, ["ncdhw", "NHWC", "", None])),
     InvalidArgumentError, "layout"),
]
# Only the backward has these arguments.
GRID_BACKWARD_FAULTS = [
    ("grad_output-shape", lambda k, r: k.update(grad_output=k["grad_output"][..., :-1]
                                                if k["grad_output"].shape[-1] > 1 else
                                                np.concatenate([k["grad_output"]] * 2, -1)),
     InvalidArgumentError, "grad_output"),
    ("grad_output-dtype", lambda k, r: _junk_dtype(
        k, "grad_output", np.float64 if k["input"].dtype != np.float64 else np.float32),
     UnsupportedDTypeError, "grad_output"),
    ("output_mask", lambda k, r: k.update(output_mask=pick(r, 
        [(True,), (True, True, True), (1, 0), "ab", None, True], )), InvalidArgumentError, "output_mask"),
]


@FUZZ
@given(case=grid_sample_cases(), fault=st.sampled_from(GRID_SAMPLE_FAULTS + GRID_BACKWARD_FAULTS),
       seed=st.integers(0, 2**16))
def test_numpy_grid_sample_rejects(case, fault, seed):
    name, corrupt, error, argument = fault
    x, grid, grad_out = grid_sample_arrays(case)
    layout = case["layout"]
    kwargs = dict(input=physical(x, layout), grid=grid, mode=case["mode"],
                  padding_mode=case["padding_mode"], align_corners=case["align_corners"], layout=layout)
    if fault in GRID_BACKWARD_FAULTS or seed % 2:
        kwargs.update(grad_output=physical(grad_out, layout), output_mask=case["output_mask"])
        function = volsample.grid_sample_3d_backward
    else:
        function = volsample.grid_sample_3d
    corrupt(kwargs, np.random.default_rng(seed))
    with pytest.raises(error, match=f"^{argument}: "):
        function(**kwargs)


UPSAMPLE_FAULTS = [
    ("input-rank", lambda k, r: k.update(input=k["input"][0]), InvalidArgumentError, "input"),
    ("input-dtype", lambda k, r: _junk_dtype(k, "input", pick(r, [np.int8, np.complex128, object])),
     UnsupportedDTypeError, "input"),
    ("size-zero", lambda k, r: k.update(size=(1, 0, 2), scale_factor=None), InvalidArgumentError, "size"),
    ("size-negative", lambda k, r: k.update(size=-3, scale_factor=None), InvalidArgumentError, "size"),
    ("size-float", lambda k, r: k.update(size=(2.0, 2, 2), scale_factor=None), InvalidArgumentError, "size"),
    ("size-length", lambda k, r: k.update(size=(2, 2), scale_factor=None), InvalidArgumentError, "size"),
    ("size-bool", lambda k, r: k.update(size=True, scale_factor=None), InvalidArgumentError, "size"),
    ("both", lambda k, r: k.update(size=(2, 2, 2), scale_factor=2.0), InvalidArgumentError, "size, scale_factor"),
    ("neither", lambda k, r: k.update(size=None, scale_factor=None), InvalidArgumentError, "size, scale_factor"),
    ("scale-non-finite", lambda k, r: k.update(size=None, scale_factor=pick(r, [np.nan, np.inf, -np.inf])),
     InvalidArgumentError, "scale_factor"),
    ("scale-non-positive", lambda k, r: k.update(size=None, scale_factor=(2.0, pick(r, [0.0, -1.0]), 2.0)),
     InvalidArgumentError, "scale_factor"),
    ("scale-empty-output", lambda k, r: k.update(size=None, scale_factor=1e-9), InvalidArgumentError, "scale_factor"),
    ("scale-junk", lambda k, r: k.update(size=None, scale_factor=pick(r, ["2", None, 2j, True], )),
     InvalidArgumentError, "s"),  # None with size None is "neither"
    ("align_corners", lambda k, r: k.update(align_corners=pick(r, [1, "no", None])), InvalidArgumentError,
     "align_corners"),
    ("layout", lambda k, r: k.update(layout="NHWDC"), InvalidArgumentError, "layout"),
]
UPSAMPLE_BACKWARD_FAULTS = [
    ("grad_output-rank", lambda k, r: k.update(grad_output=k["grad_output"][None]), InvalidArgumentError,
     "grad_output"),
    ("grad_output-dtype", lambda k, r: _junk_dtype(k, "grad_output", np.int32), UnsupportedDTypeError,
     "grad_output"),
    ("input_size-length", lambda k, r: k.update(input_size=k["input_size"][:4]), InvalidArgumentError,
     "input_size"),
    ("input_size-negative", lambda k, r: k.update(input_size=(-1,) + k["input_size"][1:]),
     InvalidArgumentError, "input_size"),
    ("input_size-zero-spatial", lambda k, r: k.update(input_size=k["input_size"][:4] + (0,)),
     InvalidArgumentError, "input_size"),
    ("input_size-float", lambda k, r: k.update(input_size=tuple(float(v) for v in k["input_size"])),
     InvalidArgumentError, "input_size"),
    ("input_size-N", lambda k, r: k.update(input_size=(k["input_size"][0] + 1,) + k["input_size"][1:]),
     InvalidArgumentError, "grad_output"),
    ("scales-length", lambda k, r: k.update(scales=(2.0, 2.0)), InvalidArgumentError, "scales"),
    ("scales-non-finite", lambda k, r: k.update(scales=(None, pick(r, [np.nan, np.inf]), None)),
     InvalidArgumentError, "scales"),
    ("scales-junk", lambda k, r: k.update(scales=pick(r, [2.0, "abc", (None, "2", None)])),
     InvalidArgumentError, "scales"),
]


@FUZZ
@given(case=upsample_cases(), fault=st.sampled_from(UPSAMPLE_FAULTS + UPSAMPLE_BACKWARD_FAULTS),
       seed=st.integers(0, 2**16))
def test_numpy_upsample_rejects(case, fault, seed):
    name, corrupt, error, argument = fault
    x, grad_out = upsample_arrays(case)
    layout = case["layout"]
    if fault in UPSAMPLE_BACKWARD_FAULTS or (fault[0] in ("align_corners", "layout") and seed % 2):
        kwargs = dict(grad_output=physical(grad_out, layout), input_size=x.shape,
                      align_corners=case["align_corners"], scales=case["backward_scales"], layout=layout)
        function = volsample.upsample_trilinear_3d_backward
    else:
        kwargs = dict(input=physical(x, layout), size=case["out_dhw"], scale_factor=None,
                      align_corners=case["align_corners"], layout=layout)
        function = volsample.upsample_trilinear_3d
    corrupt(kwargs, np.random.default_rng(seed))
    with pytest.raises(error, match=f"^{argument}"):
        function(**kwargs)


def test_error_classes_are_value_and_type_errors():
    """The documented hierarchy: callers may catch ValueError / TypeError."""
    assert issubclass(InvalidArgumentError, ValueError) and issubclass(UnsupportedDTypeError, TypeError)
    assert issubclass(InvalidArgumentError, volsample.VolsampleError)
    assert issubclass(UnsupportedDTypeError, volsample.VolsampleError)


# The torch layer's message names the argument after PyTorch's words for the mistake, in
# parentheses (or at the start where PyTorch has no words for it).
TORCH_DETAIL = r"(^|\(){}: "

TORCH_FAULTS = [
    ("input-int", lambda k, r: k.update(input=k["input"].to(torch.int32)), UnsupportedDTypeError, "input"),
    ("input-complex", lambda k, r: k.update(input=k["input"].to(torch.complex64)), UnsupportedDTypeError, "input"),
    ("input-rank", lambda k, r: k.update(input=k["input"][0]), InvalidArgumentError, "input"),
    ("input-not-a-tensor", lambda k, r: k.update(input=k["input"].numpy()), UnsupportedDTypeError, "input"),
    ("grid-last-dim", lambda k, r: k.update(grid=k["grid"][..., :2]), InvalidArgumentError, "grid"),
    ("grid-dtype", lambda k, r: k.update(grid=k["grid"].to(torch.int64)), UnsupportedDTypeError, "grid"),
    ("mode", lambda k, r: k.update(mode="bicubic"), InvalidArgumentError, "mode"),
    ("padding_mode", lambda k, r: k.update(padding_mode="circular"), InvalidArgumentError, "padding_mode"),
    ("align_corners", lambda k, r: k.update(align_corners="yes"), InvalidArgumentError, "align_corners"),
]


@FEW
@given(case=grid_sample_cases(), fault=st.sampled_from(TORCH_FAULTS))
def test_torch_grid_sample_rejects(case, fault):
    name, corrupt, error, argument = fault
    x, grid, _ = grid_sample_arrays(dict(case, dtype=np.dtype(np.float32), grid_dtype=np.dtype(np.float32)))
    kwargs = dict(input=torch.from_numpy(x), grid=torch.from_numpy(grid), mode=case["mode"],
                  padding_mode=case["padding_mode"], align_corners=case["align_corners"])
    corrupt(kwargs, None)
    with pytest.raises(error, match=TORCH_DETAIL.format(argument)) as info:
        vt.grid_sample(**kwargs)
    assert info.value.argument == argument


TORCH_UPSAMPLE_FAULTS = [
    ("input-dtype", lambda k: k.update(input=k["input"].to(torch.int16)), UnsupportedDTypeError, "input"),
    ("input-rank", lambda k: k.update(input=k["input"][0, 0]), InvalidArgumentError, "input"),
    ("size-zero", lambda k: k.update(size=(0, 2, 2)), InvalidArgumentError, "size"),
    ("both", lambda k: k.update(size=(2, 2, 2), scale_factor=2.0), InvalidArgumentError, "size, scale_factor"),
    ("scale-nan", lambda k: k.update(size=None, scale_factor=float("nan")), InvalidArgumentError, "scale_factor"),
    ("align_corners", lambda k: k.update(align_corners="yes"), InvalidArgumentError, "align_corners"),
]


@FEW
@given(case=upsample_cases(), fault=st.sampled_from(TORCH_UPSAMPLE_FAULTS))
def test_torch_upsample_rejects(case, fault):
    name, corrupt, error, argument = fault
    x, _ = upsample_arrays(dict(case, dtype=np.dtype(np.float64)))
    kwargs = dict(input=torch.from_numpy(x), size=case["out_dhw"], scale_factor=None,
                  align_corners=case["align_corners"])
    corrupt(kwargs)
    with pytest.raises(error, match=TORCH_DETAIL.format(argument)) as info:
        vt.upsample_trilinear(**kwargs)
    assert info.value.argument == argument


# --- aclnn: junk in every argument position is a status ---------------------------------

def junk_arrays():
    """NumPy arrays of random rank (0-5), small shape and any dtype, some read-only."""
    dtypes = st.sampled_from([np.float16, BF16, np.float32, np.float64, np.int8, np.int64, np.bool_,
                              np.complex64, object, np.dtype(">f4")])
    shapes = st.lists(st.integers(0, 4), min_size=0, max_size=6).map(tuple)

    def make(dtype, shape, writeable):
        arr = np.zeros(shape, dtype)
        arr.setflags(write=writeable)
        return arr
    return st.builds(make, dtypes, shapes, st.booleans())


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5), st.lists(st.integers(-3, 8), max_size=6), st.builds(object), junk_arrays(),
    st.builds(aclnn.aclTensor, junk_arrays(), st.sampled_from(sorted(aclnn_runtime.FORMAT_NAMES))),
    st.lists(st.integers(-3, 8), max_size=6).map(aclnn.aclIntArray),
    st.lists(st.booleans(), max_size=3).map(aclnn.aclBoolArray),
    st.builds(aclnn.aclrtStream), st.builds(lambda: aclnn.aclOpExecutor("other", 0, lambda: None)),
)


def valid_grid_call():
    # float16: its float32 accumulator is real scratch, so the workspace is not 0
    x, grid, go = grid_sample_arrays(dict(dtype=np.dtype(np.float16), grid_dtype=np.dtype(np.float16),
                                          N=2, C=3, in_dhw=(3, 4, 5), out_dhw=(2, 3, 2), seed=1))
    t = aclnn.aclCreateTensor
    return [t(go), t(x), t(grid), 0, 0, False, aclnn.aclCreateBoolArray([True, True]),
            t(np.zeros_like(x)), t(np.zeros_like(grid))]


def valid_upsample_call():
    x, go = upsample_arrays(dict(dtype=np.dtype(np.float32), N=2, C=3, in_dhw=(3, 4, 5),
                                 out_dhw=(5, 7, 9), seed=2))
    return [aclnn.aclCreateTensor(go), aclnn.aclCreateIntArray([5, 7, 9]),
            aclnn.aclCreateIntArray(list(x.shape)), False, 0.0, 0.0, 0.0,
            aclnn.aclCreateTensor(np.zeros_like(x))]


OPERATORS = {
    "grid": (valid_grid_call, aclnn.aclnnGridSampler3DBackwardGetWorkspaceSize,
             aclnn.aclnnGridSampler3DBackward, {0, 1, 2, 7, 8}),
    "upsample": (valid_upsample_call, aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize,
                 aclnn.aclnnUpsampleTrilinear3dBackward, {0, 1, 2, 7}),
}


@settings(FUZZ, max_examples=40)
@given(op=st.sampled_from(sorted(OPERATORS)), data=st.data())
def test_aclnn_junk_in_every_position_is_a_status(op, data):
    """Replace one to three arguments of a valid phase one by junk: the result is a
    status (a null pointer for a None pointer argument, else invalid) with (0, None), or
    a success whose phase two also succeeds; never an exception."""
    make_valid, phase_one, phase_two, pointers = OPERATORS[op]
    args = make_valid()
    positions = data.draw(st.lists(st.integers(0, len(args) - 1), min_size=1, max_size=3, unique=True))
    for p in positions:
        args[p] = data.draw(JUNK, label=f"argument {p}")
    aclnn.aclGetRecentErrMsg()  # clear
    status, size, executor = phase_one(*args)
    if status == 0:  # the junk happened to be valid (0 for a bool, a finite scale, a None mask)
        assert aclnn.aclGetRecentErrMsg() is None
        assert phase_two(aclnn.aclrtMalloc(size) if size else None, size, executor) == 0, \
            aclnn.aclGetRecentErrMsg()
        return
    assert (size, executor) == (0, None)
    assert status in (NULLPTR, INVALID), aclnn.aclGetRecentErrMsg()
    assert aclnn.aclGetRecentErrMsg()
    if len(positions) == 1:
        p = positions[0]
        is_null_pointer = args[p] is None and p in pointers
        assert status == (NULLPTR if is_null_pointer else INVALID)


@settings(FUZZ, max_examples=40)
@given(op=st.sampled_from(sorted(OPERATORS)), data=st.data())
def test_aclnn_phase_two_junk_is_a_status(op, data):
    """Junk workspace / size / executor / stream in phase two: a status, and the output
    is written only by a run that reports success."""
    make_valid, phase_one, phase_two, _ = OPERATORS[op]
    args = make_valid()
    output = args[7].array
    status, size, executor = phase_one(*args)
    assert status == 0 and size > 0
    launch = [aclnn.aclrtMalloc(size), size, executor, None]
    for p in data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True)):
        launch[p] = data.draw(st.one_of(JUNK, st.integers(-1, 2 * size).map(aclnn.aclrtMalloc)),
                              label=f"argument {p}")
    result = phase_two(*launch)
    assert result in (0, NULLPTR, INVALID), aclnn.aclGetRecentErrMsg()
    assert output.any() == (result == 0)
    # A refused launch leaves a valid executor usable; one that ran is used up.
    again = phase_two(aclnn.aclrtMalloc(size), size, executor)
    assert again == (INVALID if result == 0 else 0)


# --- nothing crashes the interpreter ------------------------------------------------------

CRASH_SCRIPT = r"""
import resource, sys, traceback
# Keep an accidental huge allocation from touching the machine's memory: fail it instead.
resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))
import ml_dtypes, numpy as np
from numpy.lib.stride_tricks import as_strided
import volsample
from volsample import aclnn

x = np.random.default_rng(0).standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
g = np.random.default_rng(1).uniform(-1.2, 1.2, (1, 2, 3, 4, 3)).astype(np.float32)
go = np.ones((1, 2, 2, 3, 4), np.float32)
gs, gsb = volsample.grid_sample_3d, volsample.grid_sample_3d_backward
up, upb = volsample.upsample_trilinear_3d, volsample.upsample_trilinear_3d_backward
unaligned = np.frombuffer(bytearray(x.nbytes + 1), np.uint8)[1:].view(np.float32).reshape(x.shape)
huge_stride = as_strided(np.ones(1, np.float32), (1, 1, 1, 1, 1), (2**40,) * 5)
odd_stride = np.zeros((1, 2, 3, 4, 5), [("a", "f4"), ("b", "u1")])["a"]
overlapping = as_strided(np.arange(8, dtype=np.float32), (1, 2, 3, 4, 5), (0, 4, 4, 4, 4))
CASES = {
    "0-d": lambda: gs(np.float32(1), g),
    "0-d grid": lambda: gs(x, np.array(0.5, np.float32)),
    "1-d": lambda: gs(np.zeros(5, np.float32), g),
    "1-d upsample": lambda: up(np.zeros(5, np.float32), size=2),
    "object": lambda: gs(x.astype(object), g),
    "object upsample": lambda: up(x.astype(object), size=2),
    "ragged list": lambda: gs([[1.0], [1.0, 2.0]], g),
    "nested lists": lambda: gs(x.tolist(), g.tolist()),
    "structured": lambda: up(np.zeros((1, 1, 2, 2, 2), [("a", "f4")]), size=3),
    "big-endian": lambda: up(x.astype(">f4"), size=3),
    "float8": lambda: up(x.astype(ml_dtypes.float8_e5m2), size=3),
    "huge strides": lambda: (gs(huge_stride, g[:, :1, :1, :1]), up(huge_stride, size=(2, 3, 4))),
    "zero strides": lambda: (gs(np.broadcast_to(x[:, :, :1], x.shape), g),
                             upb(np.broadcast_to(go[:, :, :1], go.shape), (1, 2, 3, 4, 5))),
    "overlapping": lambda: (gs(overlapping, g), up(overlapping, size=(4, 3, 2))),
    "strides not a multiple of the itemsize": lambda: (gs(odd_stride, g), up(odd_stride, size=3)),
    "unaligned": lambda: (gs(unaligned, g), gsb(go, unaligned, g), up(unaligned, size=4)),
    "negative strides": lambda: gsb(go[:, ::-1, ::-1], x[..., ::-1], g[:, :, ::-1]),
    "huge size": lambda: up(x, size=(1, 1, 2**40)),
    "absurd size": lambda: up(x, size=(2**62, 2**62, 2**62)),
    "size past int64": lambda: up(x, size=(1, 1, 2**64)),
    "huge scale": lambda: up(x, scale_factor=1e300),
    "huge backward input_size": lambda: upb(go, (1, 2, 2**40, 1, 1)),
    "backward input_size past int64": lambda: upb(go, (1, 2, 1, 1, 2**64)),
    "huge backward scales": lambda: upb(go, (1, 2, 5, 7, 3), scales=(1e300, 5e-324, -1e300)),
    "extreme grid": lambda: gsb(go, x, np.full_like(g, 3.4e38), "bilinear", "reflection", True),
    # Zero strides: tiny memory, absurd logical sizes (the output cannot be allocated).
    "huge grid": lambda: gs(x, as_strided(g, (1, 2**20, 2**20, 2**20, 3), (0, 0, 0, 0, 4))),
    "huge N": lambda: gs(as_strided(x, (2**40, 2, 3, 4, 5), (0,) + x.strides[1:]),
                         as_strided(g, (2**40, 2, 3, 4, 3), (0,) + g.strides[1:])),
    "aclnn huge workspace": lambda: aclnn.aclrtMalloc(2**62),
    "aclnn absurd int array": lambda: aclnn.aclCreateIntArray([2**64]),
}
print(f"CASES {len(CASES)}", flush=True)
for name, case in CASES.items():
    try:
        case()
        outcome = "ok"
    except Exception as exc:
        outcome = type(exc).__module__ + "." + type(exc).__name__
    print(f"{name}: {outcome}", flush=True)
print("DONE", flush=True)
"""


def test_crash_prone_inputs_do_not_crash_the_interpreter():
    """Every case runs in one child interpreter (address space capped), which must finish
    normally having reported each case: an exception is fine, a crash is not."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CRASH_SCRIPT)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    lines = proc.stdout.splitlines()
    assert lines[-1] == "DONE", proc.stdout
    assert lines[0].startswith("CASES ") and len(lines) == int(lines[0].split()[1]) + 2, proc.stdout


# --- sizes beyond the index range, and NumPy scalars as scales ------------------------------

X = np.zeros((1, 2, 3, 4, 5), np.float32)


@pytest.mark.parametrize("call", [
    lambda: volsample.upsample_trilinear_3d(X, scale_factor=1e300),
    lambda: volsample.upsample_trilinear_3d(X, size=(1, 1, 2**64)),
    lambda: volsample.upsample_trilinear_3d_backward(np.zeros((1, 2, 1, 1, 1), np.float32), (1, 2, 1, 1, 2**64)),
    lambda: vt.upsample_trilinear(torch.zeros(1, 2, 3, 4, 5), scale_factor=1e300),
], ids=["scale-1e300", "size-2**64", "input_size-2**64", "torch-scale-1e300"])
def test_sizes_beyond_int64_are_invalid_arguments(call):
    with pytest.raises(InvalidArgumentError, match=r"2\*\*40"):
        call()


def test_zero_d_array_scale_factor():
    out = volsample.upsample_trilinear_3d(X, scale_factor=np.array(2.0))
    assert out.shape == (1, 2, 6, 8, 10)
