"""volsample.torch.warp: against PyTorch's F.affine_grid + displacement -> F.grid_sample
(values and every gradient, through autograd), gradcheck / gradgradcheck / forward-mode
AD in float64, torch.func, the custom ops' opcheck, torch.compile, memory formats and the
torch layer's errors."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_bitwise_equal

import volsample
import volsample.torch as vt
from volsample.torch import _memory

ALL_MODES = list(itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"],
                                   [False, True]))


def operands(dtype=torch.float64, N=2, C=3, in_spatial=(5, 4, 6), out_spatial=(3, 6, 4),
             seed=0, grad=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((N, C) + in_spatial, generator=gen, dtype=dtype)
    theta = torch.eye(3, 4, dtype=dtype) + 0.2 * torch.randn(N, 3, 4, generator=gen, dtype=dtype)
    u = 0.2 * torch.randn((N,) + out_spatial + (3,), generator=gen, dtype=dtype)
    return tuple(t.requires_grad_(grad) for t in (x, theta, u))


def pytorch_warp(x, theta, u, mode, padding_mode, align_corners):
    """The composition warp stands for, in PyTorch's own operators."""
    size = (x.shape[0], x.shape[1]) + tuple(u.shape[1:4])
    grid = F.affine_grid(theta, size, align_corners=align_corners) + u
    return F.grid_sample(x, grid, mode, padding_mode, align_corners)


def assert_same_with_gradients(ours, theirs, operands):
    """Two warps of ``operands`` (input, theta, displacement) agree to float64 round-off,
    and so do their gradients through autograd."""
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    go = torch.randn_like(ours)
    for a, b, name in zip(torch.autograd.grad(ours, operands, go),
                          torch.autograd.grad(theirs, operands, go),
                          ("input", "theta", "displacement")):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11, msg=f"grad {name}")


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_matches_pytorch_and_its_gradients(mode, padding_mode, align_corners):
    x, theta, u = operands()
    ours = vt.warp(x, theta, u, None, mode, padding_mode, align_corners)
    theirs = pytorch_warp(x, theta, u, mode, padding_mode, align_corners)
    assert_same_with_gradients(ours, theirs, (x, theta, u))


def test_float32_channels_last_and_bfloat16():
    x, theta, u = operands(torch.float32)
    cl = x.detach().contiguous(memory_format=torch.channels_last_3d).requires_grad_()
    out = vt.warp(cl, theta, u, padding_mode="border")
    assert out.is_contiguous(memory_format=torch.channels_last_3d)
    expected = pytorch_warp(x, theta, u, "bilinear", "border", False)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)
    grads = torch.autograd.grad(out.sum(), (cl, theta, u))
    expected_grads = torch.autograd.grad(expected.sum(), (x, theta, u))
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
    xb = x.detach().bfloat16()
    out = vt.warp(xb, theta.detach(), u.detach())  # float32 coordinates beside bfloat16
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), pytorch_warp(xb.float(), theta, u, "bilinear",
                                                         "zeros", False).detach(),
                               rtol=2 ** -8, atol=1e-2)


def test_absent_operands_and_sizes():
    x, theta, u = operands()
    assert vt.warp(x).shape == x.shape
    assert vt.warp(x, theta, size=(2, 3, 4, 4, 4)).shape == (2, 3, 4, 4, 4)
    out = vt.warp(x, None, u)
    identity = torch.eye(3, 4, dtype=x.dtype).expand(2, 3, 4)
    torch.testing.assert_close(out, pytorch_warp(x, identity, u, "bilinear", "zeros", False))
    gx, gu = torch.autograd.grad(out.sum(), (x, u))
    assert gx.shape == x.shape and gu.shape == u.shape


def test_voxel_units():
    x, theta, u = operands()
    ours = vt.warp(x, theta, u, align_corners=True, displacement_units="voxels")
    D, H, W = x.shape[2:]
    scale = torch.tensor([2 / (W - 1), 2 / (H - 1), 2 / (D - 1)], dtype=x.dtype)
    torch.testing.assert_close(ours, pytorch_warp(x, theta, u * scale, "bilinear", "zeros", True))
    torch.testing.assert_close(torch.autograd.grad(ours.sum(), u)[0], torch.autograd.grad(
        pytorch_warp(x, theta, u * scale, "bilinear", "zeros", True).sum(), u)[0])


@pytest.mark.parametrize("padding_mode", ["zeros", "reflection"])
def test_gradcheck_gradgradcheck_forward_ad(padding_mode):
    x, theta, u = operands(N=1, C=2, in_spatial=(3, 4, 3), out_spatial=(2, 3, 3))
    fn = lambda a, b, c: vt.warp(a, b, c, padding_mode=padding_mode, align_corners=True,
                                 displacement_units="voxels")
    assert torch.autograd.gradcheck(fn, (x, theta, u), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(fn, (x, theta, u))


def test_torch_func_transforms():
    x, theta, u = operands(N=1, C=1, in_spatial=(3, 4, 3), out_spatial=(2, 2, 3), grad=False)
    fn = lambda t: vt.warp(x, t, u, padding_mode="border")
    forward = torch.func.jacfwd(fn)(theta)
    reverse = torch.func.jacrev(fn)(theta)
    torch.testing.assert_close(forward, reverse)
    batched = torch.func.vmap(lambda t: vt.warp(x, t[None], u))(theta.expand(3, 3, 4))
    torch.testing.assert_close(batched[1], vt.warp(x, theta, u))


@pytest.mark.parametrize("theta_given,displacement_given", [(True, True), (True, False),
                                                            (False, True), (False, False)])
def test_opcheck(theta_given, displacement_given):
    x, theta, u = operands(torch.float32, N=1, C=2, grad=False)
    theta, u = (theta if theta_given else None), (u if displacement_given else None)
    args = (x, theta, u, [3, 6, 4], 0, 1, False, 0)
    torch.library.opcheck(torch.ops.volsample.warp_3d.default, args)
    go = torch.randn(1, 2, 3, 6, 4)
    torch.library.opcheck(torch.ops.volsample.warp_3d_backward.default,
                          (go, x, theta, u, 0, 1, False, 0, [True, True, True]))


def test_compile_fullgraph_matches_eager():
    x, theta, u = operands(torch.float32, N=1, C=2)

    def step(theta, u):
        return ((vt.warp(x.detach(), theta, u, padding_mode="border") - 0.5) ** 2).mean()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(theta, u)
    grads = torch.autograd.grad(loss, (theta, u))
    ref = step(theta, u)
    ref_grads = torch.autograd.grad(ref, (theta, u))
    torch.testing.assert_close(loss, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


def test_backward_is_the_fused_op_unless_differentiated(monkeypatch):
    """A plain backward runs the fused op (no grid formed); create_graph takes the
    composition through the grid."""
    from volsample.torch import _warp

    formed = []
    original = _warp.stored_grid
    monkeypatch.setattr(_warp, "stored_grid", lambda *a: formed.append(1) or original(*a))
    x, theta, u = operands()
    torch.autograd.grad(vt.warp(x, theta, u).sum(), (theta, u))
    assert not formed
    torch.autograd.grad(vt.warp(x, theta, u).sum(), (theta, u), create_graph=True)
    assert formed


def test_errors_are_volsample_and_pytorch_classes():
    x, theta, u = operands(torch.float32, grad=False)
    with pytest.raises(volsample.InvalidArgumentError, match=r"theta: expected shape \(N, 3, 4\)"):
        vt.warp(x, theta[:, :, :3])
    with pytest.raises(RuntimeError, match=r"displacement: expected shape \(N, D, H, W, 3\)"):
        vt.warp(x, theta, u[..., :2])
    with pytest.raises(TypeError, match=r"theta: expected dtype torch.float32"):
        vt.warp(x, theta.double())
    with pytest.raises(ValueError, match=r"displacement_units: expected one of"):
        vt.warp(x, theta, displacement_units="mm")
    with pytest.raises(ValueError, match=r"size: expected the displacement's spatial size"):
        vt.warp(x, theta, u, size=(1, 2, 3))


@pytest.mark.parametrize("mode", [0, 2, 3])  # bilinear, bicubic, bspline: one path
@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_kernels_prepare_their_calls_on_the_triton_backend(monkeypatch, deterministic,
                                                                mode):
    """The ops' CUDA kernels take the CPU kernels' way (``_prepared``): the first call of a
    key builds the Warp description and prepares it, with the tensors and the results it
    allocates (None for a gradient not asked for), on volsample._triton.warp (a stand-in
    here: no GPU), then runs the prepared call; a second call of that key only runs it.
    They return those results."""
    import sys
    import types

    from volsample import _prepared
    from volsample.torch import _warp

    for name in ("warp_3d", "warp_3d_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"volsample::{name}", "CUDA")
    x, theta, u = operands(torch.float32, N=1, C=2, grad=False)
    go = torch.randn(1, 2, 3, 6, 4)
    calls = []
    prepared = types.SimpleNamespace(
        forward_on=lambda *args: calls.append(("forward_on", args)) or args[-1].fill_(1.0),
        backward_on=lambda *args: calls.append(("backward_on", args)) or [
            t.fill_(2.0) for t in args[-3:] if t is not None])
    stand_in = types.SimpleNamespace(
        prepare_forward=lambda *args: calls.append(("prepare_forward", args)) or prepared,
        prepare_backward=lambda *args, **kw: calls.append(
            ("prepare_backward", args + tuple(kw.values()))) or prepared)
    monkeypatch.setitem(sys.modules, "volsample._triton.warp", stand_in)
    monkeypatch.setattr(volsample._config, "_deterministic", deterministic)
    _prepared.forget_prepared_calls()
    for _ in range(2):
        out = _warp._warp_3d_cuda(x, theta, u, [3, 6, 4], mode, 1, True, 1)
        gi, gt, gd = _warp._warp_3d_backward_cuda(go, x, theta, u, mode, 1, True, 1,
                                                  [False, True, True])
        assert out.shape == (1, 2, 3, 6, 4) and bool((out == 1).all())
        assert gi.numel() == 0 and gt.shape == theta.shape and bool((gt == 2).all())
        assert gd.shape == u.shape and bool((gd == 2).all())
    assert [name for name, _ in calls] == ["prepare_forward", "forward_on", "prepare_backward",
                                           "backward_on", "forward_on", "backward_on"]
    (_, (call, *tensors)), _, (_, (bcall, *btensors)), _ = calls[:4]
    assert tensors[:3] == [x, theta, u] and tensors[3].shape == (1, 2, 3, 6, 4)
    assert btensors[:4] == [go, x, theta, u] and btensors[4] is None
    assert btensors[5].shape == theta.shape and btensors[6].shape == u.shape
    assert call.output_spatial == (3, 6, 4) and call.units == 1 and call.padding == 1
    assert call.mode == bcall.mode == mode
    assert bcall.output_mask == (False, True, True) and btensors[-1] == deterministic
    _prepared.forget_prepared_calls()


# ---------------------------------------------------------------------------------------
# The cubic modes (bicubic, bspline)
# ---------------------------------------------------------------------------------------

CUBIC_MODES = list(itertools.product(["bicubic", "bspline"], ["zeros", "border", "reflection"],
                                     [False, True]))


def _logical(t):
    return np.asarray(_memory.read_only_array(t.detach()))


@pytest.mark.parametrize("mode,padding_mode,align_corners", CUBIC_MODES)
@pytest.mark.parametrize("dtype,fmt", [(torch.float64, "contiguous"),
                                       (torch.float32, "channels_last")])
def test_cubic_warp_gives_the_numpy_warps_bits(mode, padding_mode, align_corners, dtype, fmt):
    """The torch door runs the NumPy API's kernels: forward and the fused backward (no
    grid formed), bit for bit."""
    x, theta, u = operands(dtype, seed=3)
    if fmt == "channels_last":
        x = x.detach().contiguous(memory_format=torch.channels_last_3d).requires_grad_()
    sampling = (mode, padding_mode, align_corners)
    out = vt.warp(x, theta, u, None, *sampling, displacement_units="voxels")
    go = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, theta, u), go)
    layout = "NDHWC" if fmt == "channels_last" else "NCDHW"
    physical = ((lambda a: a.transpose(0, 2, 3, 4, 1)) if layout == "NDHWC"
                else (lambda a: a))
    arrays = [_logical(t) for t in (x, theta, u, go)]
    expected = volsample.warp_3d(physical(arrays[0]), arrays[1], arrays[2], None, *sampling,
                                 layout=layout, displacement_units="voxels")
    expected_grads = volsample.warp_3d_backward(
        physical(arrays[3]), physical(arrays[0]), arrays[1], arrays[2], *sampling,
        layout=layout, displacement_units="voxels")
    assert_bitwise_equal("output", physical(_logical(out)), expected)
    for name, got, want in zip(("input", "theta", "displacement"), grads, expected_grads):
        got = _logical(got)
        assert_bitwise_equal(f"grad {name}", physical(got) if name == "input" else got, want)


@pytest.mark.parametrize("mode,padding_mode,align_corners", CUBIC_MODES)
def test_cubic_warp_is_grid_sample_on_its_grid(mode, padding_mode, align_corners):
    """Against vt.grid_sample on the grid affine_grid(theta) + displacement (float64 to
    round-off), every gradient through autograd."""
    x, theta, u = operands(seed=4)
    ours = vt.warp(x, theta, u, None, mode, padding_mode, align_corners)
    size = (x.shape[0], x.shape[1]) + tuple(u.shape[1:4])
    grid = F.affine_grid(theta, size, align_corners=align_corners) + u
    theirs = vt.grid_sample(x, grid, mode, padding_mode, align_corners)
    assert_same_with_gradients(ours, theirs, (x, theta, u))


@pytest.mark.parametrize("mode,padding_mode", [("bicubic", "zeros"), ("bspline", "reflection"),
                                               ("bicubic", "border")])
def test_cubic_gradcheck_gradgradcheck_forward_ad(mode, padding_mode):
    x, theta, u = operands(N=1, C=2, in_spatial=(3, 4, 3), out_spatial=(2, 3, 2), seed=5)
    fn = lambda a, b, c: vt.warp(a, b, c, None, mode, padding_mode, True,  # noqa: E731
                                 displacement_units="voxels")
    assert torch.autograd.gradcheck(fn, (x, theta, u), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(fn, (x, theta, u))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
@pytest.mark.parametrize("theta_given", [True, False])
def test_repeated_calls_run_on_their_own_tensors(dtype, fmt, theta_given):
    """CPU calls after the first of a key (the tensors' shapes, strides and dtypes, the
    other arguments, the thread count) run with the description and kernel arguments of
    the first (bfloat16, and a 16-bit grad_input: the general path), each on its own
    tensors, forward and fused backward: the NumPy API's bits, on 1 and 2 threads."""
    from volsample import _prepared
    _prepared.forget_prepared_calls()
    threads = volsample.get_num_threads()
    coord = torch.float64 if dtype == torch.float64 else torch.float32
    try:
        for k in range(4):
            volsample.set_num_threads(1 + k % 2)
            x, theta, u = operands(coord, seed=10 + k)
            x = x.detach().to(dtype)
            if fmt == "channels_last":
                x = x.contiguous(memory_format=torch.channels_last_3d)
            x.requires_grad_()
            theta = theta if theta_given else None
            sampling = ("bilinear", "border", True)
            out = vt.warp(x, theta, u, None, *sampling, displacement_units="voxels")
            go = torch.randn_like(out)
            wrt = [t for t in (x, theta, u) if t is not None]
            grads = list(torch.autograd.grad(out, wrt, go))
            if theta is None:
                grads.insert(1, None)
            layout = "NDHWC" if fmt == "channels_last" else "NCDHW"
            physical = ((lambda a: a.transpose(0, 2, 3, 4, 1)) if layout == "NDHWC"
                        else (lambda a: a))
            arrays = [None if t is None else _logical(t) for t in (x, theta, u, go)]
            expected = volsample.warp_3d(physical(arrays[0]), arrays[1], arrays[2], None,
                                         *sampling, layout=layout, displacement_units="voxels")
            expected_grads = volsample.warp_3d_backward(
                physical(arrays[3]), physical(arrays[0]), arrays[1], arrays[2], *sampling,
                layout=layout, displacement_units="voxels")
            assert_bitwise_equal(f"call {k}: output", physical(_logical(out)), expected)
            for name, got, want in zip(("input", "theta", "displacement"), grads,
                                       expected_grads):
                if want is None:
                    assert got is None, name
                    continue
                got = _logical(got)
                assert_bitwise_equal(f"call {k}: grad {name}",
                                     physical(got) if name == "input" else got, want)
    finally:
        volsample.set_num_threads(threads)
