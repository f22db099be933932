"""volsample.torch under torch.func.vmap, and the door's per-call shortcuts.

vmap: every op has a batching rule that folds the vmapped dimension into N (or, for one
volume sampled at a batch of grids, into the grid's Do): one kernel call per vmapped call,
no "performance drop" warning, and the results of the loop over the batch. Jacobians by
jacrev (vmap over the backward ops) and jacfwd (vmap over the jvp ops) against each other
and against PyTorch's own F.grid_sample. The door: descriptions cached per call shape
never hide a check or a memory format, and a Function called with defaults left out
still fills them in.

Oracles: the loop over the batch (the same ops, call by call), PyTorch 2.13's jacobians.
"""
from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from test_torch import kink_free_grid  # noqa: E402
from helpers import KernelRuns  # noqa: E402

import volsample.torch as vt  # noqa: E402
from volsample import _reference as reference  # noqa: E402
from volsample import _backends  # noqa: E402
from volsample.torch import _grid_sample, _upsample, _warp  # noqa: E402

B = 3  # the vmapped batch


def _operands(seed=0, N=2, C=2, spatial=(4, 5, 3), out=(2, 3, 2)):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((B, N, C) + spatial, generator=gen, dtype=torch.float64)
    grid = torch.stack([kink_free_grid(gen, (N,) + out, spatial, False) for _ in range(B)])
    return x, grid


def _item(t, dim, i):
    return t if dim is None else t.select(dim, i)


def _loop(fn, in_dims, args):
    return torch.stack([fn(*(_item(a, d, i) for a, d in zip(args, in_dims)))
                        for i in range(B)])


def _no_performance_drop(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args)
    drops = [str(w.message) for w in caught if "performance drop" in str(w.message)]
    assert not drops, drops
    return result


@pytest.mark.parametrize("in_dims", [(0, 0), (None, 0), (0, None), (2, 1)])
@pytest.mark.parametrize("mode,padding_mode", [("bilinear", "zeros"), ("bilinear", "reflection"),
                                               ("nearest", "border"), ("bicubic", "zeros"),
                                               ("bspline", "reflection")])
def test_vmap_grid_sample_is_one_kernel_call_and_the_loop(monkeypatch, in_dims, mode,
                                                          padding_mode):
    x, grid = _operands()
    x = x if in_dims[0] is not None else x[0]
    grid = grid if in_dims[1] is not None else grid[0]
    if in_dims[0] == 2:  # the batch elsewhere than in front
        x = x.movedim(0, 2)
    if in_dims[1] == 1:
        grid = grid.movedim(0, 1)

    def fn(a, b):
        return vt.grid_sample(a, b, mode, padding_mode, align_corners=False)
    expected = _loop(fn, in_dims, (x, grid))
    counter = KernelRuns(monkeypatch, _backends.cpu("grid_sample"), "forward")
    got = _no_performance_drop(torch.func.vmap(fn, in_dims=in_dims), x, grid)
    assert counter.calls == 1
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)


def test_vmap_grid_sample_keeps_channels_last():
    x, grid = _operands()
    x = torch.stack([t.contiguous(memory_format=torch.channels_last_3d) for t in x])
    got = torch.func.vmap(lambda a, b: vt.grid_sample(a, b, align_corners=True))(x, grid)
    expected = _loop(lambda a, b: vt.grid_sample(a, b, align_corners=True), (0, 0), (x, grid))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("mode", [0, 2, 3])  # bilinear, bicubic, bspline
@pytest.mark.parametrize("in_dims", [(0, 0, 0), (None, 0, 0), (0, None, 0), (0, 0, None)])
def test_vmap_grid_sample_backward_is_one_kernel_call_and_the_loop(monkeypatch, in_dims, mode):
    x, grid = _operands(1)
    go = torch.randn(B, 2, 2, 2, 3, 2, dtype=torch.float64)
    args = tuple(t if d is not None else t[0] for t, d in zip((go, x, grid), in_dims))

    def fn(g, a, b):
        return torch.ops.volsample.grid_sampler_3d_backward(g, a, b, mode, 1, False,
                                                            [True, True])
    expected = [torch.stack(t) for t in zip(*(fn(*(_item(a, d, i) for a, d in zip(args, in_dims)))
                                              for i in range(B)))]
    counter = KernelRuns(monkeypatch, _backends.cpu("grid_sample"), "backward")
    with torch.autograd.graph.disable_saved_tensors_hooks("no autograd here"), torch.no_grad():
        got = _no_performance_drop(torch.func.vmap(fn, in_dims=in_dims), *args)
    assert counter.calls == 1
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-13)


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_jacobians_through_the_batching_rules_match_pytorch(padding_mode):
    x, grid = _operands(2, N=1, C=2, spatial=(3, 4, 3), out=(2, 2, 1))
    x, grid = x[0], grid[0]

    def ours(a, b):
        return vt.grid_sample(a, b, "bilinear", padding_mode, align_corners=False)

    def theirs(a, b):
        return F.grid_sample(a, b, "bilinear", padding_mode, align_corners=False)
    reverse = _no_performance_drop(torch.func.jacrev(ours, argnums=(0, 1)), x, grid)
    forward = _no_performance_drop(torch.func.jacfwd(ours, argnums=(0, 1)), x, grid)
    expected = torch.func.jacrev(theirs, argnums=(0, 1))(x, grid)
    for r, f, e in zip(reverse, forward, expected):
        torch.testing.assert_close(r, e, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(f, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["bicubic", "bspline"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_cubic_jacobians_through_the_batching_rules_match_the_reference(mode, padding_mode):
    """jacrev (vmap over the backward op) and jacfwd (vmap over the jvp ops) in the cubic
    modes, against the float64 reference's backward, one output element at a time."""
    x, grid = _operands(4, N=1, C=2, spatial=(3, 4, 3), out=(2, 2, 1))
    x, grid = x[0], grid[0]

    def ours(a, b):
        return vt.grid_sample(a, b, mode, padding_mode, align_corners=True)
    reverse = _no_performance_drop(torch.func.jacrev(ours, argnums=(0, 1)), x, grid)
    forward = _no_performance_drop(torch.func.jacfwd(ours, argnums=(0, 1)), x, grid)
    out_shape = (1, 2, 2, 2, 1)
    rows = []
    for k in range(math.prod(out_shape)):
        one_hot = np.zeros(math.prod(out_shape))
        one_hot[k] = 1
        rows.append(reference.grid_sample_3d_backward(one_hot.reshape(out_shape), x.numpy(),
                                                      grid.numpy(), mode, padding_mode, True))
    for i, (r, f) in enumerate(zip(reverse, forward)):
        expected = torch.from_numpy(np.stack([row[i] for row in rows])).reshape(r.shape)
        assert expected.abs().max() > 0
        torch.testing.assert_close(r, expected, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(f, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "bspline"])
def test_vmap_of_jacrev_matches_the_loop(mode):
    x, grid = _operands(3, N=1, C=1, spatial=(3, 3, 4), out=(1, 2, 2))

    def loss(b, a):
        return vt.grid_sample(a, b, mode, align_corners=True).pow(2).sum()
    per_grid = torch.func.jacrev(loss)
    got = _no_performance_drop(torch.func.vmap(per_grid, in_dims=(0, None)), grid, x[0])
    torch.testing.assert_close(got, _loop(lambda b: per_grid(b, x[0]), (0,), (grid,)),
                               rtol=0, atol=1e-13)


def test_vmap_upsample_forward_and_backward(monkeypatch):
    x, _ = _operands(4)

    def fn(a):
        return vt.upsample_trilinear(a, scale_factor=2, align_corners=False)
    counter = KernelRuns(monkeypatch, _backends.cpu("upsample"), "forward")
    got = _no_performance_drop(torch.func.vmap(fn), x)
    assert counter.calls == 1
    torch.testing.assert_close(got, _loop(fn, (0,), (x,)), rtol=0, atol=1e-14)
    go = torch.randn_like(got)
    backward = KernelRuns(monkeypatch, _backends.cpu("upsample"), "backward")
    _, vjp = torch.func.vjp(torch.func.vmap(fn), x)
    (grad,) = _no_performance_drop(vjp, go)
    assert backward.calls == 1
    def one(a, g):
        a = a.detach().requires_grad_()
        return torch.autograd.grad(fn(a), a, g)[0]
    torch.testing.assert_close(grad, _loop(one, (0, 0), (x, go)), rtol=0, atol=1e-13)


def test_vmap_warp_forward_and_jacobians(monkeypatch):
    x, grid = _operands(5)
    theta = (torch.eye(3, 4, dtype=torch.float64)
             + 0.05 * torch.randn(B, 2, 3, 4, dtype=torch.float64))
    u = 0.1 * torch.randn(2, 2, 3, 2, 3, dtype=torch.float64)

    def fn(a, t):
        return vt.warp(a, t, u)
    counter = KernelRuns(monkeypatch, _backends.cpu("warp"), "forward")
    got = _no_performance_drop(torch.func.vmap(fn, in_dims=(None, 0)), x[0], theta)
    assert counter.calls == 1
    torch.testing.assert_close(got, _loop(fn, (None, 0), (x[0], theta)), rtol=0, atol=1e-14)
    reverse = _no_performance_drop(torch.func.jacrev(lambda t: fn(x[0], t)), theta[0])
    forward = _no_performance_drop(torch.func.jacfwd(lambda t: fn(x[0], t)), theta[0])
    torch.testing.assert_close(reverse, forward, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------
# The door's shortcuts
# ---------------------------------------------------------------------------------------


def test_cached_descriptions_keep_every_check_and_memory_format():
    x, grid = torch.randn(1, 2, 4, 4, 4), torch.zeros(1, 2, 2, 2, 3)
    vt.grid_sample(x, grid)  # described once
    for _ in range(2):  # a failing call is never remembered
        with pytest.raises(RuntimeError, match="same batch size"):
            vt.grid_sample(x, torch.zeros(2, 2, 2, 2, 3))
        with pytest.raises(RuntimeError, match="same device|one device"):
            torch.ops.volsample.grid_sampler_3d(x, grid.to("meta"), 0, 0, False)
    last = x.contiguous(memory_format=torch.channels_last_3d)  # same shape, other strides
    assert vt.grid_sample(last, grid).is_contiguous(memory_format=torch.channels_last_3d)
    assert vt.grid_sample(x, grid).is_contiguous()
    double = vt.grid_sample(x.double(), grid.double())  # same shape, other dtype
    assert double.dtype == torch.float64
    torch.testing.assert_close(double, F.grid_sample(x.double(), grid.double(),
                                                     align_corners=False))


def test_functions_called_without_their_defaults_fill_them_in():
    x = torch.randn(1, 1, 2, 3, 2, requires_grad=True)
    # upsample's Function takes scales=None by default: apply must bind it.
    out = _upsample._UpsampleTrilinear3d.apply(x, [4, 6, 4], False)
    out.sum().backward()
    expected = F.interpolate(x.detach(), size=(4, 6, 4), mode="trilinear", align_corners=False)
    torch.testing.assert_close(out.detach(), expected)
    assert x.grad is not None and x.grad.shape == x.shape


class _Seen(TorchDispatchMode):
    """A dispatch mode that records the ops it sees."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_calls_skip_the_dispatcher_only_where_nothing_watches_it():
    x, grid = torch.randn(1, 2, 4, 4, 4), torch.rand(1, 2, 2, 2, 3) * 2 - 1
    expected = F.grid_sample(x, grid, align_corners=False)
    # A lazily negated view: the dispatcher resolves the negation before the kernel reads.
    torch.testing.assert_close(vt.grid_sample(torch._neg_view(x), grid), -expected)
    with _Seen() as seen:
        torch.testing.assert_close(vt.grid_sample(x, grid), expected)
    assert "volsample.grid_sampler_3d.default" in seen.ops
    with torch.profiler.profile() as profile:
        vt.grid_sample(x, grid)
    assert any(e.name == "volsample::grid_sampler_3d" for e in profile.events())
    # torch.jit.trace records ops at the dispatcher: the trace holds the op, and replays it.
    traced = torch.jit.trace(lambda a, b: vt.grid_sample(a, b), (x, grid), check_trace=False)
    assert "volsample::grid_sampler_3d" in str(traced.graph)
    other = torch.rand(1, 2, 2, 2, 3) * 2 - 1
    torch.testing.assert_close(traced(x, other), F.grid_sample(x, other, align_corners=False))


def test_eager_backward_skips_the_dispatcher_only_where_nothing_watches_it():
    """The backward of an eager call on plain CPU tensors runs the CPU kernel directly
    unless its gradient or the backward's context asks for the dispatcher: a dispatch
    mode or the profiler around ``backward()`` sees the backward op, a lazily negated
    gradient is resolved first, and a differentiated backward (create_graph) keeps its
    graph."""
    x = torch.randn(1, 2, 4, 4, 4, dtype=torch.float64, requires_grad=True)
    grid = (torch.rand(1, 2, 2, 2, 3, dtype=torch.float64) * 2 - 1).requires_grad_()
    go = torch.randn(1, 2, 2, 2, 2, dtype=torch.float64)
    expected = torch.autograd.grad(F.grid_sample(x, grid, align_corners=False), (x, grid), go)

    def gradients(grad_output, **kwargs):
        return torch.autograd.grad(vt.grid_sample(x, grid), (x, grid), grad_output, **kwargs)
    with _Seen() as seen:
        got = gradients(go)
    assert "volsample.grid_sampler_3d_backward.default" in seen.ops
    torch.testing.assert_close(got, expected)
    with torch.profiler.profile() as profile:
        gradients(go)
    assert any(e.name == "volsample::grid_sampler_3d_backward" for e in profile.events())
    got = gradients(torch._neg_view(-go))
    torch.testing.assert_close(got, expected)
    got = gradients(go, create_graph=True)
    assert all(g.requires_grad for g in got)
    torch.testing.assert_close(got, expected)


def test_calls_met_before_keep_pytorchs_checks_and_bits():
    """A repeated eager call finds its prepared kernel by its key alone: it keeps the first
    call's bits (forward and both gradients, the engine's expanded gradient of ``sum``),
    autograd's in-place check of the saved operands, and a backward node called by hand
    with a gradient of another shape or layout (``grad_fn.apply``) gets that gradient's
    own results, not the prepared call's."""
    x = torch.randn(1, 2, 4, 4, 4, requires_grad=True)
    grid = (torch.rand(1, 3, 2, 2, 3) * 2 - 1).requires_grad_()
    with torch.no_grad():
        expected = F.grid_sample(x, grid, align_corners=True)
    first = None
    for _ in range(3):
        x.grad = grid.grad = None
        out = vt.grid_sample(x, grid, align_corners=True)
        out.sum().backward()
        torch.testing.assert_close(out, expected)
        got = out.detach(), x.grad, grid.grad
        first = first or got
        for a, b in zip(got, first):
            assert torch.equal(a, b)
    out = vt.grid_sample(x, grid, align_corners=True)
    with torch.no_grad():
        x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    with torch.no_grad():
        x.sub_(1)
    go = torch.randn(1, 2, 2, 2, 3).transpose(2, 4)  # the result's shape, other strides
    for grad_output in (torch.ones(1, 2, 3, 2, 2), go):
        node = vt.grid_sample(x, grid, align_corners=True).grad_fn
        reference = _grid_sample.grid_sampler_3d_backward(grad_output, x.detach(), grid.detach(),
                                                          0, 0, True, [True, True])
        with torch.no_grad():  # as the engine calls it (grad mode on: the general backward)
            got = node.apply(grad_output)
        for a, b in zip(got, reference):
            assert torch.equal(a, b)
    node = vt.grid_sample(x, grid, align_corners=True).grad_fn
    with torch.no_grad(), pytest.raises(RuntimeError, match="grad_output"):
        node.apply(torch.ones(1, 2, 2, 3, 2))  # refused, never read past its end


def test_eager_warp_backward_skips_the_dispatcher_only_where_nothing_watches_it():
    """As grid_sample's: warp's eager backward runs the fused CPU kernel unless a dispatch
    mode or the profiler watches, or the gradient is a lazily negated view."""
    x = torch.randn(1, 2, 4, 4, 4, dtype=torch.float64, requires_grad=True)
    theta = (torch.eye(3, 4, dtype=torch.float64) + 0.1 * torch.randn(1, 3, 4,
                                                                     dtype=torch.float64))
    u = (0.1 * torch.randn(1, 3, 2, 3, 3, dtype=torch.float64)).requires_grad_()
    theta.requires_grad_()
    go = torch.randn(1, 2, 3, 2, 3, dtype=torch.float64)

    def gradients(grad_output):
        return torch.autograd.grad(vt.warp(x, theta, u), (x, theta, u), grad_output)
    expected = gradients(go)
    with _Seen() as seen:
        torch.testing.assert_close(gradients(go), expected)
    assert "volsample.warp_3d_backward.default" in seen.ops
    with torch.profiler.profile() as profile:
        gradients(go)
    assert any(e.name == "volsample::warp_3d_backward" for e in profile.events())
    torch.testing.assert_close(gradients(torch._neg_view(-go)), expected)


def test_modes_met_before_still_check_every_argument():
    """A call's mode strings and bool met before skip their checks, never the tensors'
    (kinds, ranks) or a value of another kind (1 is not a bool)."""
    x, grid = torch.randn(1, 2, 4, 4, 4), torch.rand(1, 2, 2, 2, 3) * 2 - 1
    for _ in range(2):
        vt.grid_sample(x, grid, "nearest", "border", True)
        with pytest.raises(TypeError, match="align_corners"):
            vt.grid_sample(x, grid, "nearest", "border", 1)
        with pytest.raises(TypeError, match="'input'"):
            vt.grid_sample(x.numpy(), grid, "nearest", "border", True)
        with pytest.raises(RuntimeError, match="5D input"):
            vt.grid_sample(x[0], grid, "nearest", "border", True)
        with pytest.raises(ValueError, match="padding_mode"):
            vt.grid_sample(x, grid, "nearest", "borders", True)


def _thp_eligible(address):
    """Linux's THPeligible flag of the mapping that holds ``address`` (None: not found)."""
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(v, 16) for v in head.split("-"))
                inside = low <= address < high
            elif inside and head == "THPeligible:":
                return line.split()[1] == "1"
    return None


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
                    or "[madvise]" not in open("/sys/kernel/mm/transparent_hugepage/enabled").read(),
                    reason="needs Linux with transparent huge pages on madvise")
def test_large_results_are_advised_onto_huge_pages_as_numpy_does():
    from volsample.torch import _memory

    small = torch.empty(1000)
    assert _memory.huge_pages(small) is small
    plain = torch.empty(8 << 20 >> 2)  # 8 MiB
    inside = plain.data_ptr() + (4 << 20)
    if _thp_eligible(inside):
        # Some machines put every anonymous mapping on huge pages (or merge a new one into an
        # advised neighbour): there the advice cannot be told apart from the default.
        pytest.skip("this machine's plain allocations are already eligible for huge pages")
    assert _memory.huge_pages(plain) is plain
    assert _thp_eligible(inside) is True
    x, grid = torch.randn(1, 3, 8, 8, 8), torch.zeros(1, 64, 128, 128, 3)  # 12 MiB result
    out = vt.grid_sample(x, grid, align_corners=True)
    assert _thp_eligible(out.data_ptr() + (4 << 20)) is True
    torch.testing.assert_close(out, F.grid_sample(x, grid, align_corners=True))
