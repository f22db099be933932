"""volsample.torch.warp_mse_loss: against F.mse_loss of PyTorch's F.affine_grid +
displacement -> F.grid_sample (the value and every gradient), against F.mse_loss of
volsample.torch.warp, slab by slab and whole, the same bits for any thread count,
torch.compile, its errors, and the peak memory of a step."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_bitwise_equal

import volsample
import volsample.torch as vt
from volsample.torch import _warp_loss
from volsample.torch._warp_call import describe


@pytest.fixture
def thin_slabs(monkeypatch):
    """Slabs of a few hundred values, so that small volumes are cut into many."""
    monkeypatch.setattr(_warp_loss, "_SLAB_ELEMENTS", 600)


def operands(dtype=torch.float64, N=2, C=3, in_spatial=(7, 6, 8), out_spatial=(9, 5, 6), seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((N, C) + in_spatial, generator=gen, dtype=dtype)
    target = torch.randn((N, C) + out_spatial, generator=gen, dtype=dtype)
    theta = torch.eye(3, 4, dtype=dtype) + 0.2 * torch.randn(N, 3, 4, generator=gen, dtype=dtype)
    u = 0.2 * torch.randn((N,) + out_spatial + (3,), generator=gen, dtype=dtype)
    return tuple(t.requires_grad_() for t in (x, target, theta, u))


def pytorch_loss(x, target, theta, u, mode="bilinear", padding_mode="zeros",
                 align_corners=False, reduction="mean"):
    """The composition warp_mse_loss stands for, in PyTorch's own operators."""
    if theta is None:
        theta = torch.eye(3, 4, dtype=x.dtype).expand(x.shape[0], 3, 4)
    grid = F.affine_grid(theta, list(target.shape), align_corners=align_corners)
    if u is not None:
        grid = grid + u
    warped = F.grid_sample(x, grid, mode, padding_mode, align_corners)
    return F.mse_loss(warped, target, reduction=reduction)


def loss_and_gradients(fn, tensors, seed=1.0):
    loss = fn(*tensors)
    wanted = [t for t in tensors if t is not None and t.requires_grad]
    return loss.detach(), torch.autograd.grad(loss * seed, wanted)


def count_slab_backwards(monkeypatch) -> list:
    """Replaces _slab_backward with a wrapper that notes each call."""
    calls = []
    inner = _warp_loss._slab_backward

    def noted(*args):
        calls.append(args[0].shape)
        return inner(*args)

    monkeypatch.setattr(_warp_loss, "_slab_backward", noted)
    return calls


@pytest.mark.parametrize("input_grad", [False, True])
@pytest.mark.parametrize("mode,padding_mode,align_corners,reduction", [
    ("bilinear", "zeros", False, "mean"), ("bilinear", "border", True, "sum"),
    ("bilinear", "reflection", False, "sum"), ("nearest", "zeros", True, "mean")])
def test_matches_pytorch_and_its_gradients(thin_slabs, monkeypatch, mode, padding_mode,
                                           align_corners, reduction, input_grad):
    tensors = operands()
    if not input_grad:
        tensors = (tensors[0].detach(),) + tensors[1:]
    call = describe(*(t.detach() for t in (tensors[0], tensors[2], tensors[3])), [9, 5, 6],
                     0, 0, False, 0)
    assert len(_warp_loss._slabs(call)) == 4  # the slabs are really cut
    slabs = count_slab_backwards(monkeypatch)
    kwargs = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners,
                  reduction=reduction)
    ours = loss_and_gradients(lambda *t: vt.warp_mse_loss(*t, **kwargs), tensors, seed=3.0)
    theirs = loss_and_gradients(lambda *t: pytorch_loss(*t, **kwargs), tensors, seed=3.0)
    # The input's gradient, a scatter over the whole input, comes from one piece.
    assert len(slabs) == (1 if input_grad else 4)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-12, atol=1e-12)
    names = ("input", "target", "theta", "displacement")[not input_grad:]
    for a, b, name in zip(ours[1], theirs[1], names):
        coordinates = name in ("theta", "displacement")
        assert float(b.abs().max()) > 1e-3 or (mode == "nearest" and coordinates)
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=f"grad {name}")


@pytest.mark.parametrize("given", ["theta", "displacement", "neither"])
def test_theta_or_displacement_absent(thin_slabs, given):
    x, target, theta, u = operands()
    theta = theta if given == "theta" else None
    u = u if given == "displacement" else None
    ours = loss_and_gradients(lambda *t: vt.warp_mse_loss(*t, align_corners=True),
                              (x, target, theta, u))
    theirs = loss_and_gradients(lambda *t: pytorch_loss(*t, align_corners=True),
                                (x, target, theta, u))
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-12, atol=1e-12)
    for a, b in zip(ours[1], theirs[1]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["bicubic", "bspline"])
def test_cubic_modes_match_mse_loss_of_warp(thin_slabs, mode):
    # PyTorch has no 3-D cubic sampling: the oracle is F.mse_loss of warp (itself checked
    # against SciPy and finite differences)
    tensors = operands()
    kwargs = dict(mode=mode, padding_mode="border")
    ours = loss_and_gradients(lambda *t: vt.warp_mse_loss(*t, **kwargs), tensors)
    composed = loss_and_gradients(
        lambda x, t, th, u: F.mse_loss(vt.warp(x, th, u, **kwargs), t), tensors)
    torch.testing.assert_close(ours[0], composed[0], rtol=1e-12, atol=1e-12)
    for a, b in zip(ours[1], composed[1]):
        assert float(b.abs().max()) > 1e-3
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("input_grad", [False, True])
def test_float32_matches_mse_loss_of_warp_and_one_slab_matches_many(monkeypatch, input_grad):
    x, target, theta, u = (t.detach().float().requires_grad_() for t in operands(
        N=1, C=2, in_spatial=(20, 22, 24), out_spatial=(18, 20, 22)))
    tensors = (x.requires_grad_(input_grad), target, theta, u)
    composed = loss_and_gradients(
        lambda x, t, th, u: F.mse_loss(vt.warp(x, th, u, padding_mode="border"), t), tensors)
    runs = []
    for elements in (1 << 30, 3000):  # one slab, then 9
        monkeypatch.setattr(_warp_loss, "_SLAB_ELEMENTS", elements)
        runs.append(loss_and_gradients(
            lambda *t: vt.warp_mse_loss(*t, padding_mode="border"), tensors))
    for ours in runs:
        torch.testing.assert_close(ours[0], composed[0], rtol=1e-5, atol=0)
        for a, b in zip(ours[1], composed[1]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sixteen_bit_volumes(thin_slabs, dtype):
    x, target, theta, u = operands(torch.float32, N=1, C=1)
    x16, t16 = (t.detach().to(dtype).requires_grad_() for t in (x, target))
    ours = loss_and_gradients(vt.warp_mse_loss, (x16, t16, theta, u))
    theirs = loss_and_gradients(pytorch_loss, (x16.float(), t16.float(), theta, u))
    assert ours[0].dtype == dtype
    torch.testing.assert_close(ours[0].float(), theirs[0], rtol=2e-2, atol=1e-3)
    for a, b in zip(ours[1], theirs[1]):
        torch.testing.assert_close(a.float(), b.float(), rtol=5e-2, atol=2e-2)


@pytest.mark.parametrize("input_grad", [False, True])
def test_same_bits_for_any_thread_count(thin_slabs, input_grad):
    tensors = tuple(t.detach().float().requires_grad_() for t in operands(
        N=1, C=2, in_spatial=(30, 28, 26), out_spatial=(24, 30, 28)))
    tensors[0].requires_grad_(input_grad)
    runs = []
    before = volsample.get_num_threads()
    try:
        for threads in (1, 2):
            volsample.set_num_threads(threads)
            runs.append(loss_and_gradients(vt.warp_mse_loss, tensors))
    finally:
        volsample.set_num_threads(before)
    for loss, grads in runs[1:]:
        assert_bitwise_equal("loss", loss.numpy(), runs[0][0].numpy())
        names = ("input", "target", "theta", "displacement")[not input_grad:]
        for a, b, name in zip(grads, runs[0][1], names):
            assert_bitwise_equal(f"grad {name}", a.numpy(), b.numpy())


def test_backward_scales_by_the_loss_gradient_and_runs_once():
    x, target, theta, u = operands()
    loss = vt.warp_mse_loss(x, target, theta, u)
    once = torch.autograd.grad(loss, (theta, u), retain_graph=True)
    with pytest.raises(RuntimeError, match="call warp_mse_loss again"):
        torch.autograd.grad(loss, (theta, u))
    (0.25 * vt.warp_mse_loss(x, target, theta, u)).backward()
    torch.testing.assert_close(theta.grad, 0.25 * once[0], rtol=1e-14, atol=0)
    torch.testing.assert_close(u.grad, 0.25 * once[1], rtol=1e-14, atol=0)


def test_without_autograd_it_is_the_loss_alone():
    x, target, theta, u = operands()
    with torch.no_grad():
        loss = vt.warp_mse_loss(x, target, theta, u)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, pytorch_loss(x, target, theta, u).detach(),
                               rtol=1e-12, atol=0)


def test_compile_fullgraph_matches_eager(thin_slabs):
    x, target, theta, u = operands(torch.float32, N=1, C=1)
    x, target = x.detach(), target.detach()

    def step(theta, u):
        return vt.warp_mse_loss(x, target, theta, u, padding_mode="border")

    eager = loss_and_gradients(step, (theta, u))
    compiled = loss_and_gradients(torch.compile(step, fullgraph=True, backend="aot_eager"),
                                  (theta, u))
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=0)
    for a, b in zip(compiled[1], eager[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case,argument", [
    (dict(target=torch.zeros(2, 2, 9, 5, 6, dtype=torch.float64)), "target"),
    (dict(target=torch.zeros(2, 3, 9, 5, dtype=torch.float64)), "target"),
    (dict(target=torch.zeros(2, 3, 9, 5, 6)), "target"),
    (dict(theta=torch.zeros(2, 3, 3, dtype=torch.float64)), "theta"),
    (dict(displacement=torch.zeros(2, 8, 5, 6, 3, dtype=torch.float64)), "displacement"),
    (dict(reduction="none"), "reduction"),
    (dict(mode="area"), "mode"),
])
def test_bad_input_names_the_argument(case, argument):
    x, target, theta, u = (t.detach() for t in operands())
    kwargs = dict(input=x, target=target, theta=theta, displacement=u) | case
    with pytest.raises(volsample.VolsampleError, match=argument) as error:
        vt.warp_mse_loss(**kwargs)
    assert argument in str(error.value)


_STEP_PEAK = r"""
import json, sys, torch, volsample
from volsample.apps.bench_workloads import registration_step, step_operands
variant, spatial = json.loads(sys.argv[1])
operands = step_operands(1, 1, tuple(spatial))
registration_step(variant, *operands)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
def rss(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))
before = rss("VmRSS:")
grads = registration_step(variant, *operands)
print(json.dumps(rss("VmHWM:") - before))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_step_holds_little_beyond_the_displacement_gradient():
    # A registration step's peak resident-set growth: the displacement's gradient, a slab
    # and the allocator's slack, where F.mse_loss of warp adds the warped volume's gradient.
    spatial = (96, 128, 128)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(64 << 10))
    peaks = {}
    for variant in ("volsample", "volsample-warp"):
        proc = subprocess.run([sys.executable, "-c", _STEP_PEAK, json.dumps([variant, spatial])],
                              capture_output=True, text=True, timeout=300, env=env, check=True)
        peaks[variant] = int(proc.stdout.splitlines()[-1])
    points = int(np.prod(spatial))
    gradient = 3 * 4 * points
    call = describe(torch.empty((1, 1) + spatial), None, None, list(spatial), 0, 0, False, 0)
    slab = 4 * points // spatial[0] * max(s.stop - s.start for s in _warp_loss._slabs(call))
    assert peaks["volsample"] <= gradient + 2 * slab + (2 << 20), peaks
    assert peaks["volsample-warp"] >= gradient + 4 * points, peaks  # the warped volume's gradient
