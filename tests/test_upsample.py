"""Tests of trilinear upsampling (docs/semantics.md, section 3): ``volsample.upsample_trilinear_3d`` and
``volsample.upsample_trilinear_3d_backward``.

Oracles: PyTorch's CPU operators (``torch.ops.aten.upsample_trilinear3d`` and its
backward) and the float64 reference ``volsample._reference``, itself checked against
PyTorch. Tolerances scale with ``bound``, the operator applied in float64 to the absolute
values of its argument: that is the size of the sum each output rounds, whatever cancels.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import (SIXTEEN_BIT, assert_bitwise_equal, assert_close, numpy_array,
                     torch_tensor)

import volsample
from volsample import _prepared
from volsample import _reference as ref
from volsample import upsample as upsample_module
from volsample._checks import InvalidArgumentError, UnsupportedDTypeError

EPS32 = float(np.finfo(np.float32).eps)
NDHWC_OF_NCDHW = (0, 2, 3, 4, 1)

# (input D, H, W), then either ("size", output D, H, W) or ("scale", scale factors).
CASES = {
    "2x": ((4, 5, 6), "size", (8, 10, 12)),
    "primes": ((3, 5, 7), "size", (7, 11, 13)),  # ratios with no common factor
    "size-1 axes": ((1, 4, 3), "size", (5, 1, 6)),  # from 1 voxel, and down to 1 voxel
    "down + identity W": ((6, 8, 7), "size", (3, 4, 7)),  # out < in; W keeps its size
    "identity": ((3, 4, 5), "size", (3, 4, 5)),  # nothing changes: a copy
    "mixed scales": ((4, 4, 6), "scale", (2.0, 1.5, 0.7)),  # up, up, down by factor
    "scale 1.7": ((3, 4, 5), "scale", 1.7),  # floor(in * 1.7), and 1/1.7 maps coordinates
    "scale 1 on D": ((2, 3, 5), "scale", (1.0, 2.5, 3.0)),  # identity D from a factor
}


def make_case(name, rng, dtype, N=2, C=3):
    """(input, output spatial size, forward scales, kwargs of upsample_trilinear_3d)."""
    in_dhw, kind, value = CASES[name]
    x = rng.uniform(-1, 1, (N, C) + in_dhw).astype(dtype)
    if kind == "size":
        return x, value, (None, None, None), {"size": value}
    scales = value if isinstance(value, tuple) else (value,) * 3
    out = tuple(math.floor(n * s) for n, s in zip(in_dhw, scales))
    return x, out, scales, {"scale_factor": value}


def to_layout(logical_array, layout):
    if layout == "NDHWC":
        return np.ascontiguousarray(logical_array.transpose(NDHWC_OF_NCDHW))
    return logical_array


def from_layout(array, layout):
    return array.transpose(0, 4, 1, 2, 3) if layout == "NDHWC" else array


def torch_forward(x, out, align_corners, scales, layout="NCDHW"):
    t = torch_tensor(x)
    if layout == "NDHWC":
        t = t.contiguous(memory_format=torch.channels_last_3d)
    return numpy_array(torch.ops.aten.upsample_trilinear3d(t, list(out), align_corners, *scales))


def torch_backward(g, out, input_size, align_corners, scales, layout="NCDHW"):
    t = torch_tensor(g)
    if layout == "NDHWC":
        t = t.contiguous(memory_format=torch.channels_last_3d)
    return numpy_array(torch.ops.aten.upsample_trilinear3d_backward(
        t, list(out), list(input_size), align_corners, *scales))


def forward(x, align_corners, kwargs, layout="NCDHW"):
    """Our forward on a logical array stored in ``layout``; the result seen logically."""
    y = volsample.upsample_trilinear_3d(to_layout(x, layout), align_corners=align_corners,
                                        layout=layout, **kwargs)
    return from_layout(y, layout)


def backward(g, input_size, align_corners, scales, layout="NCDHW"):
    gi = volsample.upsample_trilinear_3d_backward(to_layout(g, layout), input_size,
                                                  align_corners, scales, layout=layout)
    return from_layout(gi, layout)


def as64(a):
    return np.asarray(a, np.float64)


# --- the float64 reference against PyTorch ------------------------------------------------

@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("name", CASES)
def test_reference_matches_torch(name, align_corners):
    rng = np.random.default_rng(1)
    x, out, scales, _ = make_case(name, rng, np.float64)
    g = rng.uniform(-1, 1, x.shape[:2] + out)
    assert_close("reference forward", ref.upsample_trilinear_3d(x, out, align_corners, scales),
                 torch_forward(x, out, align_corners, scales), rtol=1e-12, atol=1e-12)
    assert_close("reference backward",
                 ref.upsample_trilinear_3d_backward(g, x.shape, align_corners, scales),
                 torch_backward(g, out, x.shape, align_corners, scales), rtol=1e-12, atol=1e-12)


def test_reference_hand_computed():
    # 2 -> 4 along W, align_corners=False: sources max(0, (o + 0.5) / 2 - 0.5) = 0, .25, .75, 1.25
    # (clamped to 1), so weights on (v0, v1): (1, 0), (.75, .25), (.25, .75), (0, 1).
    x = np.array([2.0, 6.0]).reshape(1, 1, 1, 1, 2)
    y = ref.upsample_trilinear_3d(x, (1, 1, 4), False)
    np.testing.assert_array_equal(y.ravel(), [2.0, 3.0, 5.0, 6.0])
    g = np.array([1.0, 10.0, 100.0, 1000.0]).reshape(1, 1, 1, 1, 4)
    gi = ref.upsample_trilinear_3d_backward(g, (1, 1, 1, 1, 2), False)
    np.testing.assert_array_equal(gi.ravel(), [1 + 7.5 + 25, 2.5 + 75 + 1000])


# --- forward and backward against PyTorch and the reference -------------------------------

@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("name", CASES)
def test_forward_matches_torch(name, align_corners, dtype, layout):
    rng = np.random.default_rng(2)
    x, out, scales, kwargs = make_case(name, rng, dtype)
    y = forward(x, align_corners, kwargs, layout)
    assert y.dtype == dtype and y.shape == x.shape[:2] + out
    bound = ref.upsample_trilinear_3d(np.abs(as64(x)), out, align_corners, scales).max()
    if dtype == np.float64:
        rtol, atol, ref_atol = 1e-10, 1e-10 * bound, 1e-12 * bound
    else:  # float32: a few ulp of PyTorch; to the exact values, coordinates rounded too
        rtol, atol, ref_atol = 4 * EPS32, 4 * EPS32 * bound, 16 * EPS32 * bound
    assert_close("output vs torch", y, torch_forward(x, out, align_corners, scales, layout),
                 rtol=rtol, atol=atol)
    assert_close("output vs reference", y, ref.upsample_trilinear_3d(x, out, align_corners, scales),
                 rtol=0, atol=ref_atol)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("name", CASES)
def test_backward_matches_torch(name, align_corners, dtype, layout):
    rng = np.random.default_rng(3)
    x, out, scales, _ = make_case(name, rng, dtype)
    g = rng.uniform(-1, 1, x.shape[:2] + out).astype(dtype)
    gi = backward(g, x.shape, align_corners, scales, layout)
    assert gi.dtype == dtype and gi.shape == x.shape
    bound = ref.upsample_trilinear_3d_backward(np.abs(as64(g)), x.shape, align_corners,
                                               scales).max()
    if dtype == np.float64:
        rtol, atol = 1e-10, 1e-10 * bound
    else:  # float32: sums in another order than PyTorch's
        rtol, atol = 4 * EPS32, 4 * EPS32 * bound
    assert_close("grad_input vs torch", gi,
                 torch_backward(g, out, x.shape, align_corners, scales, layout),
                 rtol=rtol, atol=atol)
    assert_close("grad_input vs reference", gi,
                 ref.upsample_trilinear_3d_backward(g, x.shape, align_corners, scales),
                 rtol=0, atol=4 * atol)


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                    reason="PyTorch fuses its multiply-adds only in its AVX2 / AVX-512 kernels")
def test_forward_bitwise_like_torch_float32():
    # The forward evaluates PyTorch's nested lerps operation for operation (fused
    # multiply-adds included), so against PyTorch's x86 FMA kernels the bits agree.
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 5, 6, 7)).astype(np.float32)
    for align_corners in (False, True):
        y = volsample.upsample_trilinear_3d(x, size=(9, 13, 11), align_corners=align_corners)
        expected = torch_forward(x, (9, 13, 11), align_corners, (None,) * 3)
        assert_bitwise_equal(f"align_corners={align_corners}", y, expected)


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                    reason="PyTorch fuses its multiply-adds only in its AVX2 / AVX-512 kernels")
def test_forward_in_bands_bitwise_like_torch(monkeypatch):
    # 600 channels last: a dst row holds 19200 values, so the C++ forward works in bands
    # of one dst row (each with its own halo of source rows), and its 8.6 MB result is
    # written past the caches. Neither may change a bit: PyTorch's (from NCDHW, as above),
    # for any thread count.
    monkeypatch.setattr(volsample._cpu, "MIN_WORK_PER_THREAD", 1)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 600, 4, 7, 16)).astype(np.float32)
    expected = torch_forward(x, (8, 14, 32), False, (None,) * 3)
    threads = volsample.get_num_threads()
    try:
        for n in sorted({1, 2, threads}):
            volsample.set_num_threads(n)
            y = volsample.upsample_trilinear_3d(to_layout(x, "NDHWC"), size=(8, 14, 32),
                                                layout="NDHWC")
            assert_bitwise_equal(f"{n} threads", from_layout(y, "NDHWC"), expected)
    finally:
        volsample.set_num_threads(threads)


def test_scale_factor_matches_interpolate():
    # F.interpolate's default recompute_scale_factor=False: the size is floor(in * scale) and
    # the scale itself maps coordinates.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 3, 4, 5))
    for factor in (1.7, (2.0, 0.5, 1.3)):
        y = volsample.upsample_trilinear_3d(x, scale_factor=factor)
        expected = torch.nn.functional.interpolate(torch.from_numpy(x), scale_factor=factor,
                                                   mode="trilinear").numpy()
        assert_close(f"scale_factor={factor}", y, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", SIXTEEN_BIT, ids=lambda d: d.name)
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("name", ["primes", "size-1 axes", "down + identity W", "mixed scales"])
def test_sixteen_bit_error_no_larger_than_torch(name, align_corners, dtype, layout):
    """16-bit results are computed in float32 and rounded once: within half a 16-bit ulp
    of the exact value, and never further from it than PyTorch's own 16-bit results."""
    rng = np.random.default_rng(6)
    x, out, scales, kwargs = make_case(name, rng, dtype)
    g = rng.uniform(-1, 1, x.shape[:2] + out).astype(dtype)
    results = {
        "output": (forward(x, align_corners, kwargs, layout),
                   torch_forward(x, out, align_corners, scales, layout),
                   ref.upsample_trilinear_3d(x, out, align_corners, scales),
                   ref.upsample_trilinear_3d(np.abs(as64(x)), out, align_corners, scales)),
        "grad_input": (backward(g, x.shape, align_corners, scales, layout),
                       torch_backward(g, out, x.shape, align_corners, scales, layout),
                       ref.upsample_trilinear_3d_backward(g, x.shape, align_corners, scales),
                       ref.upsample_trilinear_3d_backward(np.abs(as64(g)), x.shape,
                                                          align_corners, scales)),
    }
    nmant = ml_dtypes.finfo(dtype).nmant
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    for what, (ours, theirs, exact, bound) in results.items():
        assert ours.dtype == dtype
        float32_error = 16 * EPS32 * bound.max()  # what float32 arithmetic may add
        ours_error = np.abs(as64(ours) - exact)
        with np.errstate(divide="ignore"):
            ulp = np.maximum(2.0 ** (np.floor(np.log2(np.abs(as64(ours)))) - nmant), tiny)
        worst = ours_error - (ulp / 2 + float32_error)
        assert worst.max() <= 0, f"{what}: not rounded once, {worst.max():.3g} beyond half an ulp"
        theirs_error = np.abs(as64(theirs) - exact).max()
        assert ours_error.max() <= theirs_error + float32_error, (
            f"{what}: max error {ours_error.max():.3g} > PyTorch's {theirs_error:.3g}")


def test_linear_function_is_exact():
    # With align_corners the source of output o is o * (in - 1) / (out - 1), and trilinear
    # interpolation reproduces a linear function: the result is known in closed form.
    D, H, W, out = 3, 5, 9, (5, 9, 17)  # ratios 1/2, 1/2, 1/2: every coordinate exact
    d, h, w = np.meshgrid(np.arange(D), np.arange(H), np.arange(W), indexing="ij")
    x = (2.0 * d - 3.0 * h + 0.5 * w + 1.0)[None, None]
    od, oh, ow = np.meshgrid(*(np.arange(n) / 2 for n in out), indexing="ij")
    expected = (2.0 * od - 3.0 * oh + 0.5 * ow + 1.0)[None, None]
    for dtype in (np.float32, np.float64):
        y = volsample.upsample_trilinear_3d(x.astype(dtype), size=out, align_corners=True)
        np.testing.assert_array_equal(y, expected.astype(dtype))


def test_adjoint_identity():
    """<up(x), g> == <x, up^T(g)> in float64, for shapes and scales of every kind."""
    rng = np.random.default_rng(7)
    for name in CASES:
        for align_corners in (False, True):
            x, out, scales, kwargs = make_case(name, rng, np.float64)
            g = rng.standard_normal(x.shape[:2] + out)
            y = volsample.upsample_trilinear_3d(x, align_corners=align_corners, **kwargs)
            gi = volsample.upsample_trilinear_3d_backward(g, x.shape, align_corners, scales)
            lhs, rhs = np.vdot(y, g), np.vdot(x, gi)
            assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12 * np.abs(g).sum()), name


def test_identity_is_exact_copy():
    x = np.array([np.inf, -np.inf, np.nan, -0.0, 1e-300, 3.0]).reshape(1, 1, 1, 2, 3)
    y = volsample.upsample_trilinear_3d(x, scale_factor=1.0)
    assert y is not x and not np.shares_memory(y, x)
    assert_bitwise_equal("identity forward", y, x)
    # H changes, W keeps its size: along W nothing mixes, so the NaN of column 2 stays
    # there (a second tap of weight 0 would spread it: 0 * nan is nan).
    z = volsample.upsample_trilinear_3d(x, size=(1, 4, 3))
    assert not np.isnan(z[..., :2]).any() and np.isnan(z[0, 0, 0, 0, 2])


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("where", [(0, 0, 0), (2, 1, 3), (4, 6, 4)])
def test_infinity_spreads_like_the_reference(where, layout):
    # One infinite value reaches exactly the voxels whose weight for it is not zero (inf)
    # or is zero (0 * inf: NaN), as the reference's sum of weighted terms says; padding and
    # identity axes add no terms of their own.
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 2, 5, 4, 3))
    g = rng.standard_normal((1, 2, 5, 7, 5))
    x[(0, 1) + tuple(min(i, n - 1) for i, n in zip(where, x.shape[2:]))] = np.inf
    g[(0, 1) + where] = -np.inf
    for align_corners in (False, True):
        with np.errstate(invalid="ignore"):  # 0 * inf in the reference
            pairs = [("output", forward(x, align_corners, {"size": (5, 7, 5)}, layout),
                      ref.upsample_trilinear_3d(x, (5, 7, 5), align_corners)),
                     ("grad_input", backward(g, x.shape, align_corners, None, layout),
                      ref.upsample_trilinear_3d_backward(g, x.shape, align_corners))]
        for what, ours, exact in pairs:
            np.testing.assert_array_equal(np.isnan(ours), np.isnan(exact), err_msg=what)
            np.testing.assert_array_equal(np.isposinf(ours), np.isposinf(exact), err_msg=what)
            np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(exact), err_msg=what)


# --- layouts, strides, threads, empties ----------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layouts_give_the_same_bits(dtype):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 5, 4, 6, 3)).astype(dtype)
    g = rng.standard_normal((2, 5, 7, 9, 8)).astype(dtype)
    dense = np.ascontiguousarray
    for align_corners in (False, True):
        assert_bitwise_equal("forward", forward(x, align_corners, {"size": (7, 9, 8)}),
                             dense(forward(x, align_corners, {"size": (7, 9, 8)}, "NDHWC")))
        assert_bitwise_equal("backward", backward(g, x.shape, align_corners, None),
                             dense(backward(g, x.shape, align_corners, None, "NDHWC")))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("factor", [2, 3, 0.5])
def test_long_rows_give_the_same_bits_in_both_layouts(dtype, factor):
    """Rows long enough for the W map's strided runs (the backward of an integer
    upsampling, a downsampling forward: one channel reads them without gathers, channels
    last does not) keep the gathers' bits, with NaN and infinities passing through."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 2, 3, 4, 48)).astype(dtype)
    x[0, 0, 1, 2, 17] = np.nan
    x[0, 1, 2, 3, 30] = np.inf
    for align_corners in (False, True):
        y = forward(x, align_corners, {"scale_factor": (1, 1, factor)})
        assert_bitwise_equal("forward", y, forward(x, align_corners, {"scale_factor": (1, 1, factor)}, "NDHWC"))
        g = rng.standard_normal(y.shape).astype(dtype)
        g[0, 1, 1, 1, 20] = -np.inf
        for scales in (None, (1.0, 1.0, float(factor))):
            gi = backward(g, x.shape, align_corners, scales)
            assert_bitwise_equal("backward", gi, backward(g, x.shape, align_corners, scales, "NDHWC"))
            assert_bitwise_equal("backward, NaN", np.isnan(gi), np.isnan(
                ref.upsample_trilinear_3d_backward(g, x.shape, align_corners, scales)))


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_any_strides(layout):
    rng = np.random.default_rng(9)
    base = rng.standard_normal((3, 4, 9, 10, 11)).astype(np.float32)
    views = {
        "negative strides": base[::-1, :, ::-1, :, ::-1],
        "steps": base[::2, 1:, ::2, 1::3, ::2],
        "transposed": base.transpose(1, 0, 2, 4, 3),
        "broadcast": np.broadcast_to(base[:1, :1], base.shape),
    }
    for what, view in views.items():
        dense = np.ascontiguousarray(view)
        assert_bitwise_equal(f"forward, {what}",
                             volsample.upsample_trilinear_3d(view, size=(5, 7, 13), layout=layout),
                             volsample.upsample_trilinear_3d(dense, size=(5, 7, 13), layout=layout))
        size = from_layout(view, layout).shape[:2] + (4, 3, 2)
        assert_bitwise_equal(f"backward, {what}",
                             volsample.upsample_trilinear_3d_backward(view, size, layout=layout),
                             volsample.upsample_trilinear_3d_backward(dense, size, layout=layout))


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_thread_count_does_not_change_bits(layout, monkeypatch):
    monkeypatch.setattr(volsample._cpu, "MIN_WORK_PER_THREAD", 1)  # small inputs use all threads
    rng = np.random.default_rng(10)
    # N = C = 1: the work is split along D alone.
    cases = [((1, 1, 9, 12, 10), (19, 23, 21)), ((2, 3, 12, 7, 9), (5, 14, 20))]
    threads = volsample.get_num_threads()
    try:
        for shape, out in cases:
            x = to_layout(rng.standard_normal(shape).astype(np.float32), layout)
            g = to_layout(rng.standard_normal(shape[:2] + out).astype(np.float32), layout)
            results = []
            for n in sorted({1, min(2, threads), threads}):
                volsample.set_num_threads(n)
                results.append((volsample.upsample_trilinear_3d(x, size=out, layout=layout),
                                volsample.upsample_trilinear_3d_backward(g, shape, layout=layout)))
            for y, gi in results[1:]:
                assert_bitwise_equal("forward", y, results[0][0])
                assert_bitwise_equal("backward", gi, results[0][1])
    finally:
        volsample.set_num_threads(threads)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
def test_repeated_calls_run_on_their_own_arrays(layout, dtype, monkeypatch):
    # Calls after the first of a key (arrays' shapes, strides and dtypes, arguments, thread
    # count) run its prepared kernel (bfloat16: the general path): each on its own arrays
    # (strided views at an offset; out= too), with the bits of the unprepared path on the
    # same arrays, on 1 and 2 threads; a wrong argument of a prepared call still raises.
    _prepared.forget_prepared_calls()
    rng = np.random.default_rng(13)
    threads = volsample.get_num_threads()

    def unprepared(run, *args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(_prepared, "lookup", lambda site, *parts: (None, None))  # no kernel prepared
            return run(*args, **kwargs)

    try:
        for k in range(4):
            volsample.set_num_threads(1 + k % 2)
            x = to_layout(rng.standard_normal((2, 3, 4, 5, 9)).astype(dtype)[..., 1::2], layout)
            g = to_layout(rng.standard_normal((2, 3, 6, 7, 7)).astype(dtype)[..., 1:], layout)
            out = to_layout(np.full((2, 3, 6, 7, 6), np.nan, dtype), layout)
            forward = (volsample.upsample_trilinear_3d, x, (6, 7, 6))
            backward = (volsample.upsample_trilinear_3d_backward, g, (2, 3, 4, 5, 4), True,
                        (1.5, None, 1.5))
            into_out = volsample.upsample_trilinear_3d(x, (6, 7, 6), layout=layout, out=out)
            assert into_out is out
            results = {"forward": (forward[0](x, scale_factor=1.5, layout=layout),
                                   unprepared(*forward[:2], scale_factor=1.5, layout=layout)),
                       "forward into out": (into_out, unprepared(*forward, layout=layout)),
                       "backward": (backward[0](*backward[1:], layout=layout),
                                    unprepared(*backward, layout=layout))}
            for name, (ours, expected) in results.items():
                assert_bitwise_equal(f"call {k}: {name}", ours, expected)
        # per thread count: the forward's two keys (size, scale_factor), the backward's one
        counts = (len(_prepared.kept("upsample_trilinear_3d")),
                  len(_prepared.kept("upsample_trilinear_3d_backward")))
        assert counts == ((0, 0) if dtype == ml_dtypes.bfloat16 else (4, 2))
        with pytest.raises(InvalidArgumentError, match="align_corners"):
            volsample.upsample_trilinear_3d(x, scale_factor=1.5, align_corners=0, layout=layout)
        with pytest.raises(UnsupportedDTypeError, match="out: expected dtype"):
            volsample.upsample_trilinear_3d(x, (6, 7, 6), layout=layout,
                                            out=out.astype(np.float32 if dtype != np.float32
                                                           else np.float64))
        with pytest.raises(InvalidArgumentError, match="scales"):
            volsample.upsample_trilinear_3d_backward(g, (2, 3, 4, 5, 4), True, (1.5, "1", 1.5),
                                                     layout=layout)
    finally:
        volsample.set_num_threads(threads)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("n, c", [(0, 3), (2, 0)])
def test_empty_batch_or_channels(n, c, layout):
    x = to_layout(np.zeros((n, c, 2, 3, 4), np.float32), layout)
    y = from_layout(volsample.upsample_trilinear_3d(x, size=(4, 6, 8), layout=layout), layout)
    assert y.shape == (n, c, 4, 6, 8) and y.dtype == np.float32
    g = to_layout(np.zeros((n, c, 4, 6, 8), np.float16), layout)
    gi = volsample.upsample_trilinear_3d_backward(g, (n, c, 2, 3, 4), layout=layout)
    assert from_layout(gi, layout).shape == (n, c, 2, 3, 4) and gi.dtype == np.float16
    nbytes = upsample_module.backward_workspace_nbytes(g.shape, (n, c, 2, 3, 4), np.float16)
    assert nbytes == 0


# --- scales -------------------------------------------------------------------------------

def test_scales_fall_back_per_axis():
    # A None or non-positive scale derives that axis's ratio from the sizes, alone.
    rng = np.random.default_rng(11)
    g = rng.standard_normal((1, 2, 7, 9, 10))
    size = (1, 2, 3, 4, 4)
    mixed = volsample.upsample_trilinear_3d_backward(g, size, False, (None, 2.5, -1.0))
    assert_close("mixed scales", mixed,
                 ref.upsample_trilinear_3d_backward(g, size, False, (None, 2.5, None)),
                 rtol=1e-12, atol=1e-12)
    assert_close("mixed scales vs torch", mixed,
                 torch_backward(g, (7, 9, 10), size, False, (None, 2.5, 0.0)),
                 rtol=1e-12, atol=1e-12)
    sizes_only = volsample.upsample_trilinear_3d_backward(g, size, False, (0.0, None, -2.0))
    assert_bitwise_equal("all derived", sizes_only,
                         volsample.upsample_trilinear_3d_backward(g, size))
    assert not np.allclose(mixed, sizes_only)  # the H scale 2.5 (not 9 / 4) does matter


@pytest.mark.parametrize("scales, torch_safe", [
    ((0.01, 50.0, 0.3), True),
    ((1e6, 3.0, 0.4), True),
    # 1 / 1e-30 puts sources beyond int64: PyTorch's int64 cast of them is undefined (on
    # x86 it indexes out of bounds); ours clamp to the last voxel while still floats.
    ((0.01, 1e-30, 2.0), False),
])
def test_inconsistent_scales_stay_in_bounds(scales, torch_safe):
    # Scales that do not match the sizes map far outside the input: taps clamp to its edge.
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 2, 3, 4, 5))
    g = rng.standard_normal((1, 2, 6, 2, 7))
    gi = volsample.upsample_trilinear_3d_backward(g, x.shape, False, scales)
    assert_close("backward", gi, ref.upsample_trilinear_3d_backward(g, x.shape, False, scales),
                 rtol=1e-12, atol=1e-12)
    if torch_safe:
        assert_close("backward vs torch", gi, torch_backward(g, (6, 2, 7), x.shape, False, scales),
                     rtol=1e-10, atol=1e-10)
    # The per-axis sums of the weights are still 1: no gradient is lost.
    np.testing.assert_allclose(gi.sum(axis=(2, 3, 4)), g.sum(axis=(2, 3, 4)), rtol=1e-12)


# --- workspace ---------------------------------------------------------------------------

def test_workspace_sixteen_bit_needs_no_copies():
    # 16-bit calls read and write their own memory (computing in float32 a row or a tile
    # at a time): no float32 copy of the source or the result, the workspace of float32.
    go, size = (2, 3, 8, 10, 12), (2, 3, 4, 5, 6)
    for layout in ("NCDHW", "NDHWC"):
        for dtype in SIXTEEN_BIT:
            for nbytes, shapes in ((upsample_module.backward_workspace_nbytes, (go, size)),
                                   (upsample_module.forward_workspace_nbytes, (size, go[2:]))):
                narrow = nbytes(*shapes, dtype, layout=layout)
                assert narrow == nbytes(*shapes, np.float32, layout=layout) > 0
    # Scratch is per running thread, tables are shared: the backward's scratch is a plane
    # combined along D (Hs x (Ws + 1), a zero voxel ending each row) and one along H too.
    one = upsample_module.backward_workspace_nbytes(go, size, np.float32, threads=1)
    two = upsample_module.backward_workspace_nbytes(go, size, np.float32, threads=2)
    assert two - one == (10 + 5) * (12 + 1) * 4
    assert upsample_module.backward_workspace_nbytes(size, size, np.float32) == 0  # a copy


# --- errors ------------------------------------------------------------------------------

X = np.zeros((1, 2, 3, 4, 5), np.float32)
G = np.zeros((1, 2, 6, 8, 10), np.float32)
BAD, DTYPE = InvalidArgumentError, UnsupportedDTypeError


@pytest.mark.parametrize("kwargs, error, match", [
    ({"input": "volume"}, DTYPE, "input: expected a NumPy array"),
    ({"input": X.astype(np.int32)}, DTYPE, "input: expected dtype float16, .*got int32"),
    ({"input": X[0]}, BAD, "input: expected a 5-D array, got 4-D"),
    ({"input": X[:, :, :0]}, BAD, r"input: expected non-empty spatial .* \(0, 4, 5\)"),
    ({"size": (6, 8, 10), "scale_factor": 2.0}, BAD, "exactly one of them, got both"),
    ({}, BAD, "exactly one of them, got neither"),
    ({"size": (6, 0, 10)}, BAD, r"size: expected integers in \[1, 2\*\*40\], got 0"),
    ({"size": -2}, BAD, r"size: expected a positive integer <= 2\*\*40, got -2"),
    ({"size": 2.5}, BAD, "size: expected a positive integer, got float 2.5"),
    ({"size": (6.0, 8, 10)}, BAD, "size: expected integers, got float 6.0"),
    ({"size": (6, 8)}, BAD, "size: expected 3 integers, got 2"),
    ({"scale_factor": 0.0}, BAD, "scale_factor: expected positive numbers"),
    ({"scale_factor": (2.0, -1.0, 2.0)}, BAD, "scale_factor: expected positive numbers"),
    ({"scale_factor": float("nan")}, BAD, "scale_factor: expected finite numbers"),
    ({"scale_factor": (2.0, math.inf, 2.0)}, BAD, "scale_factor: expected finite numbers"),
    ({"scale_factor": "2"}, BAD, "scale_factor: expected real numbers, got str"),
    ({"scale_factor": (2.0, 2.0)}, BAD, "scale_factor: expected a number or 3 numbers"),
    ({"scale_factor": 0.2}, BAD, r"scale_factor: expected an output of at least 1 .*\(0, 0, 1\)"),
    ({"size": 4, "layout": "NHWC"}, BAD, "layout: expected 'NCDHW' or 'NDHWC', got 'NHWC'"),
    ({"size": 4, "align_corners": 1}, BAD, "align_corners: expected a bool, got int 1"),
])
def test_forward_errors(kwargs, error, match):
    kwargs = {"input": X, **kwargs}
    with pytest.raises(error, match=match):
        volsample.upsample_trilinear_3d(**kwargs)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"grad_output": [[1.0]]}, BAD, "grad_output: expected a 5-D array, got 2-D"),
    ({"grad_output": G.astype(np.int64)}, DTYPE, "grad_output: expected dtype .*got int64"),
    ({"grad_output": G[:, :, :, :0]}, BAD, "grad_output: expected non-empty spatial"),
    ({"input_size": (1, 2, 3, 4)}, BAD, "input_size: expected 5 integers, got 4"),
    ({"input_size": 5}, BAD, "input_size: expected 5 integers, got 5"),
    ({"input_size": (1, 2, 3, 4, 5.0)}, BAD, "input_size: expected integers, got float"),
    ({"input_size": (-1, 2, 3, 4, 5)}, BAD, r"input_size: expected integers in \[0, 2\*\*40\], got -1"),
    ({"input_size": (1, 2, 0, 4, 5)}, BAD, "input_size: expected non-empty spatial"),
    ({"input_size": (1, 3, 3, 4, 5)}, BAD, r"grad_output: expected N, C = \(1, 3\)"),
    ({"input_size": (2, 2, 3, 4, 5)}, BAD, r"grad_output: expected N, C = \(2, 2\)"),
    ({"scales": 2.0}, BAD, "scales: expected None or 3 numbers-or-None, got 2.0"),
    ({"scales": (2.0, 2.0)}, BAD, "scales: expected None or 3 numbers-or-None, got 2"),
    ({"scales": (2.0, float("nan"), None)}, BAD, "scales: expected finite numbers"),
    ({"scales": (2.0, "2", None)}, BAD, "scales: expected real numbers, got str"),
    ({"layout": "ncdhw"}, BAD, "layout: expected 'NCDHW' or 'NDHWC', got 'ncdhw'"),
    ({"layout": "NDHWC"}, BAD, r"grad_output: expected N, C = \(1, 2\)"),  # C read last
    ({"align_corners": None}, BAD, "align_corners: expected a bool"),
])
def test_backward_errors(kwargs, error, match):
    kwargs = {"grad_output": G, "input_size": X.shape, **kwargs}
    with pytest.raises(error, match=match):
        volsample.upsample_trilinear_3d_backward(**kwargs)


def test_upsample_into_out_is_the_same_bits_as_a_new_result():
    volume = np.random.default_rng(42).standard_normal((1, 3, 4, 5, 6)).astype(np.float32)
    expected = volsample.upsample_trilinear_3d(volume, size=(7, 9, 11), align_corners=True)
    out = np.full(expected.shape, np.nan, np.float32)
    got = volsample.upsample_trilinear_3d(volume, size=(7, 9, 11), align_corners=True, out=out)
    assert got is out
    assert_bitwise_equal("upsample into out", out, expected)
    with pytest.raises(ValueError, match=r"out: expected the result's shape \(1, 3, 7, 9, 11\)"):
        volsample.upsample_trilinear_3d(volume, size=(7, 9, 11), out=out[:, :, :-1])
