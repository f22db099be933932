"""Every way PyTorch calls a backward reaches a correct kernel: batched gradients
(``autograd.grad(..., is_grads_batched=True)``, which ``gradcheck``'s
``check_batched_grad`` uses, hands the backward a legacy batched tensor with no storage),
forward mode over the backward (``torch.func.hessian``, ``jacfwd(jacrev(...))``,
``gradgradcheck``'s ``check_fwd_over_rev``), eager and under ``patch()``.

Oracles: finite differences (gradcheck, gradgradcheck), PyTorch's own operators for
batched gradients, reverse over reverse (``torch.autograd.functional.hessian``) for forward
over reverse, and, for a registration-style loss, central differences of its gradient.
PyTorch's own module tests of trilinear interpolation (``common_nn``) run under
``patch()`` as test_nn runs them. Tiny float64 volumes.
"""
from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from test_torch import check, kink_free_grid  # noqa: E402

import volsample.torch as vt  # noqa: E402
from volsample.torch import _dispatch  # noqa: E402

D = torch.float64
GRID_MODES = ["bilinear", "nearest", "bicubic", "bspline"]
PADDINGS = ["zeros", "border", "reflection"]
# Every mode with every padding once, align_corners alternating.
GRID_CASES = [(m, p, (i + j) % 2 == 1) for i, m in enumerate(GRID_MODES)
              for j, p in enumerate(PADDINGS)]
CHECKS = dict(check_batched_grad=True, check_forward_ad=True, check_batched_forward_grad=True)
SECOND = dict(check_batched_grad=True, check_fwd_over_rev=True)
# PyTorch's own functions, as they are before any test patches them
PYTORCH_GRID_SAMPLE, PYTORCH_INTERPOLATE = F.grid_sample, F.interpolate


def _grid_problem(seed, align_corners, in_shape=(1, 2, 3, 4, 3), out_spatial=(2, 3, 2)):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(in_shape, generator=gen, dtype=D)
    grid = kink_free_grid(gen, (in_shape[0],) + out_spatial, in_shape[2:], align_corners)
    return x, grid


def _warp_problem(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 2, 3, 4, 3, generator=gen, dtype=D)
    theta = (torch.eye(3, 4, dtype=D) + 0.05 * torch.randn(3, 4, generator=gen, dtype=D))[None]
    displacement = 0.05 * torch.randn(1, 2, 2, 3, 3, generator=gen, dtype=D)
    return x, theta, displacement


def _leaves(*tensors):
    return tuple(t.detach().clone().requires_grad_() for t in tensors)


def _sampler(patched: bool, mode: str, padding_mode: str, align_corners: bool):
    """grid sampling through volsample.torch, or through F.grid_sample under patch()
    (which routes PyTorch's modes; "bspline" is volsample's own)."""
    if patched and mode != "bspline":
        return lambda a, b: F.grid_sample(a, b, mode, padding_mode, align_corners)
    return lambda a, b: vt.grid_sample(a, b, mode, padding_mode, align_corners)


@pytest.fixture(params=["eager", "patched"])
def patched(request):
    if request.param == "eager":
        yield False
        return
    with vt.patch():
        yield True


# ---------------------------------------------------------------------------------------
# gradcheck / gradgradcheck as PyTorch's own tests call them
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,padding_mode,align_corners", GRID_CASES)
def test_grid_sample_gradchecks_with_batched_gradients(patched, mode, padding_mode,
                                                       align_corners):
    x, grid = _leaves(*_grid_problem(1, align_corners, (1, 1, 3, 4, 3), (2, 2, 1)))
    fn = _sampler(patched, mode, padding_mode, align_corners)
    assert torch.autograd.gradcheck(fn, (x, grid), **CHECKS)
    assert torch.autograd.gradgradcheck(fn, (x, grid), **SECOND)


@pytest.mark.parametrize("size,scale_factor,align_corners", [
    ((4, 3, 5), None, False), (None, 1.7, True), (None, (2.0, 1.5, 0.75), False)])
def test_upsample_gradchecks_with_batched_gradients(patched, size, scale_factor,
                                                    align_corners):
    (x,) = _leaves(torch.randn(1, 2, 3, 2, 4, dtype=D))
    if patched:
        def fn(a):
            return F.interpolate(a, size, scale_factor, "trilinear", align_corners)
    else:
        def fn(a):
            return vt.upsample_trilinear(a, size, scale_factor, align_corners)
    assert torch.autograd.gradcheck(fn, (x,), **CHECKS)
    assert torch.autograd.gradgradcheck(fn, (x,), **SECOND)


@pytest.mark.parametrize("mode,padding_mode", [("bilinear", "zeros"), ("bicubic", "border"),
                                               ("bspline", "reflection")])
@pytest.mark.parametrize("units", ["normalized", "voxels"])
def test_warp_gradchecks_with_batched_gradients(mode, padding_mode, units):
    x, theta, displacement = _warp_problem(2)
    operands = _leaves(x[:, :1], theta, displacement[:, :, :2, :2])

    def fn(a, t, u):
        return vt.warp(a, t, u, mode=mode, padding_mode=padding_mode, displacement_units=units)
    assert torch.autograd.gradcheck(fn, operands, **CHECKS)
    assert torch.autograd.gradgradcheck(fn, operands, **SECOND)


@pytest.mark.parametrize("padding_mode", PADDINGS)
def test_spline_coefficients_gradchecks_with_batched_gradients(padding_mode):
    (x,) = _leaves(torch.randn(1, 1, 4, 3, 5, dtype=D))

    def fn(a):
        return vt.spline_coefficients(a, padding_mode, align_corners=True)
    assert torch.autograd.gradcheck(fn, (x,), **CHECKS)
    assert torch.autograd.gradgradcheck(fn, (x,), **SECOND)


# ---------------------------------------------------------------------------------------
# autograd.grad(..., is_grads_batched=True) against PyTorch's answer
# ---------------------------------------------------------------------------------------


def _batched_and_each(fn, operands, out_shape, seed):
    """The gradients of ``fn(*operands)`` for a batch of 3 incoming gradients, batched,
    and those of each incoming gradient alone."""
    vectors = torch.randn((3,) + tuple(out_shape), generator=torch.Generator().manual_seed(seed),
                          dtype=D)
    batched = torch.autograd.grad(fn(*operands), operands, vectors, is_grads_batched=True)
    each = [torch.autograd.grad(fn(*operands), operands, v) for v in vectors]
    return vectors, batched, each


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode,align_corners", list(itertools.product(PADDINGS, [False, True])))
def test_batched_grid_gradients_match_pytorch(patched, mode, padding_mode, align_corners):
    x, grid = _leaves(*_grid_problem(3, align_corners))
    vectors, batched, _ = _batched_and_each(
        _sampler(patched, mode, padding_mode, align_corners), (x, grid), (1, 2, 2, 3, 2), 4)
    theirs = torch.autograd.grad(
        PYTORCH_GRID_SAMPLE(x, grid, mode, padding_mode, align_corners), (x, grid), vectors,
        is_grads_batched=True)
    assert batched[0].shape == (3,) + x.shape and batched[1].shape == (3,) + grid.shape
    check("grad input", batched[0], theirs[0], 1e-12)
    check("grad grid", batched[1], theirs[1], 1e-12)


@pytest.mark.parametrize("mode", ["bicubic", "bspline"])
def test_batched_cubic_gradients_match_one_at_a_time(mode):
    # PyTorch has no 5-D cubic sampler: each incoming gradient alone is the oracle.
    x, grid = _leaves(*_grid_problem(5, False))
    _, batched, each = _batched_and_each(_sampler(False, mode, "border", False), (x, grid),
                                         (1, 2, 2, 3, 2), 6)
    for i, single in enumerate(each):
        check(f"grad input {i}", batched[0][i], single[0], 1e-14)
        check(f"grad grid {i}", batched[1][i], single[1], 1e-14)


def test_batched_upsample_gradients_match_pytorch(patched):
    (x,) = _leaves(torch.randn(1, 2, 3, 2, 4, dtype=D))
    up = (lambda a: F.interpolate(a, scale_factor=1.5, mode="trilinear")) if patched else (
        lambda a: vt.upsample_trilinear(a, scale_factor=1.5))
    vectors, (batched,), _ = _batched_and_each(up, (x,), (1, 2, 4, 3, 6), 7)
    (theirs,) = torch.autograd.grad(
        PYTORCH_INTERPOLATE(x, scale_factor=1.5, mode="trilinear"), (x,), vectors,
        is_grads_batched=True)
    check("grad input", batched, theirs, 1e-12)


def test_batched_warp_gradients_match_pytorch():
    x, theta, displacement = _leaves(*_warp_problem(8))

    def pytorch(a, t, u):
        grid = F.affine_grid(t, (1, 2, 2, 2, 3), align_corners=False) + u
        return PYTORCH_GRID_SAMPLE(a, grid, align_corners=False)
    vectors, batched, _ = _batched_and_each(vt.warp, (x, theta, displacement), (1, 2, 2, 2, 3), 9)
    theirs = torch.autograd.grad(pytorch(x, theta, displacement), (x, theta, displacement),
                                 vectors, is_grads_batched=True)
    for name, ours, truth in zip(("input", "theta", "displacement"), batched, theirs):
        check(f"grad {name}", ours, truth, 1e-12)


def test_batched_warp_mse_loss_gradients_match_one_at_a_time():
    x, theta, displacement = _warp_problem(10)
    target = torch.randn(1, 2, 2, 2, 3, dtype=D)
    seeds = torch.tensor([1.0, -0.5, 2.0], dtype=D)

    def loss():
        operands = _leaves(x, theta, displacement)
        return operands, vt.warp_mse_loss(operands[0], target, operands[1], operands[2])
    operands, value = loss()
    batched = torch.autograd.grad(value, operands, seeds, is_grads_batched=True)
    for i, seed in enumerate(seeds):
        operands, value = loss()  # its gradients are handed out once: a new loss each
        for name, ours, single in zip(("input", "theta", "displacement"), batched,
                                      torch.autograd.grad(value, operands, seed)):
            check(f"grad {name} {i}", ours[i], single, 1e-14)


# ---------------------------------------------------------------------------------------
# Forward over reverse: Hessians
# ---------------------------------------------------------------------------------------


def _hessians(loss, point):
    """``loss``'s Hessian at ``point`` by forward over reverse (torch.func.hessian) and by
    reverse over reverse (torch.autograd.functional.hessian)."""
    return torch.func.hessian(loss)(point), torch.autograd.functional.hessian(loss, point)


@pytest.mark.parametrize("mode", GRID_MODES)
def test_grid_sample_hessians_forward_over_reverse(mode):
    x, grid = _grid_problem(11, True)
    sample = _sampler(False, mode, "reflection", True)
    for name, loss, point in (("grid", lambda g: sample(x, g).pow(2).sum(), grid),
                              ("input", lambda a: sample(a, grid).pow(2).sum(), x)):
        forward, reverse = _hessians(loss, point)
        if mode != "nearest" or name == "input":
            assert reverse.abs().max() > 0
        check(f"{mode} Hessian in {name}", forward, reverse, 1e-12)
    jacobian = torch.func.jacfwd(torch.func.jacrev(lambda a, g: sample(a, g).sum(), (0, 1)),
                                 (0, 1))(x, grid)
    mixed = torch.autograd.functional.hessian(lambda a, g: sample(a, g).sum(), (x, grid))
    for i, j in itertools.product(range(2), range(2)):
        check(f"{mode} jacfwd(jacrev) block {i}{j}", jacobian[i][j], mixed[i][j], 1e-12)


def test_upsample_hessian_forward_over_reverse():
    x = torch.randn(1, 2, 3, 2, 3, dtype=D)
    forward, reverse = _hessians(
        lambda a: vt.upsample_trilinear(a, size=(4, 3, 5)).pow(2).sum(), x)
    assert reverse.abs().max() > 0
    check("upsample Hessian", forward, reverse, 1e-12)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_warp_hessians_forward_over_reverse(mode):
    x, theta, displacement = _warp_problem(12)

    def warped(a, t, u):
        return vt.warp(a, t, u, mode=mode, padding_mode="border").pow(2).sum()
    for name, loss, point in (
            ("input", lambda a: warped(a, theta, displacement), x),
            ("theta", lambda t: warped(x, t, displacement), theta),
            ("displacement", lambda u: warped(x, theta, u), displacement)):
        forward, reverse = _hessians(loss, point)
        assert reverse.abs().max() > 0
        check(f"warp {mode} Hessian in {name}", forward, reverse, 1e-12)


def test_spline_coefficients_hessian_forward_over_reverse():
    x = torch.randn(1, 1, 4, 3, 5, dtype=D)
    forward, reverse = _hessians(lambda a: vt.spline_coefficients(a).pow(2).sum(), x)
    check("spline Hessian", forward, reverse, 1e-12)


def test_registration_loss_hessian_matches_differences_of_its_gradient():
    """An independent Hessian: a registration-style loss (local image similarity of a
    moving volume warped by an affine map onto a fixed one) in theta, by torch.func.hessian
    against central differences of its reverse-mode gradient."""
    gen = torch.Generator().manual_seed(13)
    fixed = torch.randn(1, 1, 6, 7, 6, generator=gen, dtype=D)
    moving = F.avg_pool3d(torch.randn(1, 1, 8, 9, 8, generator=gen, dtype=D), 3, 1, 1)
    theta = torch.eye(3, 4, dtype=D)[None] + 0.03 * torch.randn(1, 3, 4, generator=gen,
                                                                 dtype=D)

    def loss(t):
        warped = vt.warp(moving, t, size=fixed.shape[2:], mode="bspline",
                         padding_mode="border")
        residual = warped - fixed
        return residual.pow(2).mean() - 0.1 * (warped * fixed).mean() ** 2

    hessian = torch.func.hessian(loss)(theta).reshape(12, 12)
    h = 1e-5
    differences = torch.empty(12, 12, dtype=D)
    for k in range(12):
        step = torch.zeros(12, dtype=D)
        step[k] = h
        step = step.reshape(1, 3, 4)
        up, down = torch.func.grad(loss)(theta + step), torch.func.grad(loss)(theta - step)
        differences[:, k] = ((up - down) / (2 * h)).reshape(12)
    assert hessian.abs().max() > 1e-3
    check("Hessian in theta", hessian, differences, 1e-6)
    check("symmetric", hessian, hessian.T, 1e-12)


# ---------------------------------------------------------------------------------------
# PyTorch's own module tests of trilinear interpolation, under patch()
# ---------------------------------------------------------------------------------------


def _pytorch_trilinear_module_tests():
    """common_nn's ``interpolate_trilinear_*`` module tests (what test_nn runs), each
    made anew with ``F.interpolate`` looked up when it runs (common_nn binds the function
    it was given when it is imported: patch() would not reach it)."""
    from torch.testing._internal import common_nn

    tests = []
    for params in common_nn.get_new_module_tests():
        if not params.get("fullname", "").startswith("interpolate_trilinear"):
            continue
        forward = params["constructor"].forward
        function, kwargs = (cell.cell_contents for cell in forward.__closure__)
        assert function is F.interpolate or function.__name__ == "interpolate"
        tests.append(dict(params, constructor=common_nn.wrap_functional(
            lambda *a, _kw=kwargs: F.interpolate(*a, **_kw))))
    return tests


def _nn_test_case():
    """A test case as test_nn's: a module applied to its input(s)."""
    from torch.testing._internal.common_nn import NNTestCase

    class Case(NNTestCase):
        def _forward(self, module, input):
            return module(*input) if isinstance(input, tuple) else module(input)

        def _backward(self, module, input, output, grad_output, create_graph=False):
            output.backward(grad_output, retain_graph=True, create_graph=create_graph)
            inputs = input if isinstance(input, tuple) else (input,)
            grads = tuple(None if i.grad is None else i.grad.data for i in inputs)
            return grads if isinstance(input, tuple) else grads[0]

        def _get_parameters(self, module):
            params = list(module.parameters())
            return params, [p.grad for p in params]

        def _zero_grad_parameters(self, module):
            for p in module.parameters():
                p.grad = None

        def runTest(self):
            pass

    return Case()


@pytest.mark.parametrize("params", _pytorch_trilinear_module_tests(),
                         ids=lambda params: params["fullname"])
def test_pytorchs_trilinear_module_tests_pass_under_patch(params, monkeypatch):
    from torch.testing._internal.common_nn import NewModuleTest

    calls = []
    kernel = _dispatch.cpu_kernel(torch.ops.volsample.upsample_trilinear3d.default)
    monkeypatch.setitem(_dispatch._CPU_KERNELS, torch.ops.volsample.upsample_trilinear3d.default,
                        lambda *a: calls.append(1) or kernel(*a))
    with vt.patch():
        NewModuleTest(**params)(_nn_test_case())
    assert params["input_size"][0] == 0 or calls  # volsample's kernel ran


# ---------------------------------------------------------------------------------------
# The one rule of the fast paths
# ---------------------------------------------------------------------------------------


def test_fast_paths_take_only_plain_cpu_tensors():
    from torch._vmap_internals import _vmap

    x = torch.randn(2, 3, dtype=D)
    assert _dispatch.plain_cpu(x) and _dispatch.plain_cpu(torch.nn.Parameter(x))
    with torch.inference_mode():
        assert _dispatch.plain_cpu(torch.randn(2))
    assert not _dispatch.plain_cpu(torch._neg_view(x))
    assert not _dispatch.plain_cpu(torch.randn(2, dtype=torch.complex64).conj())
    assert not _dispatch.plain_cpu(torch._efficientzerotensor(2))
    assert not _dispatch.plain_cpu(x.to("meta"))
    assert not _dispatch.plain_cpu(x.to_sparse())

    class Subclass(torch.Tensor):
        pass
    assert not _dispatch.plain_cpu(x.as_subclass(Subclass))
    seen = []
    _vmap(lambda t: seen.append(_dispatch.plain_cpu(t)) or t)(x)  # legacy batching
    torch.func.vmap(lambda t: seen.append(_dispatch.plain_cpu(t)) or t)(x)
    torch.func.grad(lambda t: seen.append(_dispatch.plain_cpu(t)) or t.sum())(x)
    assert seen == [False, False, False]


def test_parameters_take_the_fast_paths_with_the_same_bits():
    """``nn.Parameter`` (a theta or a grid being optimised) is a plain tensor: its eager
    calls find the prepared kernel (the eager cache holds their key), and give a plain
    tensor's bits, gradients included."""
    from volsample import _prepared
    from volsample.torch import _grid_sample

    x, grid = _grid_problem(14, False)

    def sampled(a, b):
        out = vt.grid_sample(a, b, "bilinear", "border", False)
        return (out, *torch.autograd.grad(out.square().sum(), (a, b)))
    plain = sampled(*_leaves(x, grid))
    _prepared.forget_prepared_calls()
    parameters = sampled(torch.nn.Parameter(x.clone()), torch.nn.Parameter(grid.clone()))
    assert len(_prepared.kept(_grid_sample._EAGER)) == 1
    for ours, theirs in zip(parameters, plain):
        assert torch.equal(ours, theirs)
