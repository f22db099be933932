"""volsample.torch as a drop-in for 5-D F.grid_sample and trilinear F.interpolate:
forward-mode AD, double backward, PyTorch's argument conventions, patch(). (What PyTorch's
own tests expect, copy-on-write inputs and error wording: test_torch_conformance.py.)

Oracles: PyTorch 2.13's own ops (values, reverse-mode second derivatives), finite
differences (gradcheck/gradgradcheck, which also check forward AD against them), and
reverse mode (jacrev) for forward mode (jacfwd). Tiny volumes.
"""
from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from test_torch import check, in_format, kink_free_grid  # noqa: E402

import volsample  # noqa: E402
import volsample.torch as vt  # noqa: E402

PADDINGS = ["zeros", "border", "reflection"]
BILINEAR_MODES = list(itertools.product(PADDINGS, [False, True]))


def _grid_problem(seed, align_corners, in_shape=(1, 2, 3, 4, 3), out_spatial=(2, 2, 2)):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(in_shape, generator=gen, dtype=torch.float64)
    grid = kink_free_grid(gen, (in_shape[0],) + out_spatial, in_shape[2:], align_corners)
    return x, grid


@pytest.mark.parametrize("padding_mode,align_corners", BILINEAR_MODES)
def test_grid_sample_gradgradcheck_and_forward_ad(padding_mode, align_corners):
    x, grid = _grid_problem(10, align_corners)
    x.requires_grad_(), grid.requires_grad_()

    def fn(a, b):
        return vt.grid_sample(a, b, "bilinear", padding_mode, align_corners)

    assert torch.autograd.gradcheck(fn, (x, grid), check_forward_ad=True,
                                    check_batched_forward_grad=False)
    assert torch.autograd.gradgradcheck(fn, (x, grid))


@pytest.mark.parametrize("padding_mode,align_corners", BILINEAR_MODES)
def test_grid_sample_second_derivatives_match_pytorch(padding_mode, align_corners):
    x, grid = _grid_problem(11, align_corners)
    go = torch.randn(1, 2, 2, 2, 2, dtype=torch.float64)
    kwargs = dict(mode="bilinear", padding_mode=padding_mode, align_corners=align_corners)

    def second(fn):
        a, b = x.clone().requires_grad_(), grid.clone().requires_grad_()
        ga, gb = torch.autograd.grad(fn(a, b, **kwargs), (a, b), go, create_graph=True)
        return torch.autograd.grad((ga.square().sum() + (gb * go.mean()).sin().sum()), (a, b))

    ours, theirs = second(vt.grid_sample), second(F.grid_sample)
    check("d2/d input", ours[0], theirs[0], 1e-10)
    check("d2/d grid", ours[1], theirs[1], 1e-10)


def test_grid_sample_nearest_second_derivatives():
    x, grid = _grid_problem(12, False)
    x.requires_grad_(), grid.requires_grad_()
    assert torch.autograd.gradgradcheck(
        lambda a, b: vt.grid_sample(a, b, "nearest", "border", False), (x, grid))


@pytest.mark.parametrize("padding_mode", PADDINGS)
def test_jacfwd_matches_jacrev(padding_mode):
    x, grid = _grid_problem(13, True, (1, 1, 2, 3, 2), (1, 2, 2))

    def fn(a, b):
        return vt.grid_sample(a, b, "bilinear", padding_mode, True)

    forward = torch.func.jacfwd(fn, argnums=(0, 1))(x, grid)
    reverse = torch.func.jacrev(fn, argnums=(0, 1))(x, grid)
    for name, f, r in zip(("d out/d input", "d out/d grid"), forward, reverse):
        assert r.abs().max() > 0
        check(name, f, r, 1e-12)


def test_forward_ad_of_upsample_and_grid_backward():
    import torch.autograd.forward_ad as fwAD
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(1, 2, 2, 3, 2, generator=gen, dtype=torch.float64)
    t = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    with fwAD.dual_level():
        out = vt.upsample_trilinear(fwAD.make_dual(x, t), size=4, align_corners=True)
        tangent = fwAD.unpack_dual(out).tangent
    # Linear: the tangent is the op applied to the tangent.
    check("tangent", tangent, F.interpolate(t, size=4, mode="trilinear", align_corners=True),
          1e-12)
    _, jvp_out = torch.func.jvp(lambda a: vt.upsample_trilinear(a, size=4, align_corners=True),
                                (x,), (torch.ones_like(x),))
    check("torch.func.jvp", jvp_out, F.interpolate(torch.ones_like(x), size=4, mode="trilinear",
                                                   align_corners=True), 1e-12)
    # The backward ops through forward AD, against finite differences.
    go = torch.randn(1, 2, 4, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda g: torch.ops.volsample.upsample_trilinear3d_backward(g, [1, 2, 2, 3, 2], False,
                                                                     None),
        (go,), check_forward_ad=True, check_batched_forward_grad=False)
    xg, grid = _grid_problem(15, False)
    gog = torch.randn(1, 2, 2, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda g, a, b: torch.ops.volsample.grid_sampler_3d_backward(g, a, b, 0, 2, False,
                                                                     [True, True]),
        (gog, xg.requires_grad_(), grid.requires_grad_()), check_forward_ad=True,
        check_batched_forward_grad=False)


def test_upsample_channels_last_gradient_keeps_the_format():
    x = in_format(torch.randn(1, 3, 2, 3, 2), "channels_last").requires_grad_()
    vt.upsample_trilinear(x, scale_factor=2).sum().backward()  # contiguous grad_output
    assert x.grad.is_contiguous(memory_format=torch.channels_last_3d)


def test_align_corners_none_means_false():
    x, grid = torch.randn(1, 2, 3, 4, 5), torch.rand(1, 2, 2, 2, 3) * 2 - 1
    check("grid_sample", vt.grid_sample(x, grid, align_corners=None),
          vt.grid_sample(x, grid, align_corners=False), 0)
    check("upsample", vt.upsample_trilinear(x, size=4, align_corners=None),
          F.interpolate(x, size=4, mode="trilinear", align_corners=None), 2e-6)
    up = torch.nn.Upsample(scale_factor=2, mode="trilinear")  # passes align_corners=None
    with vt.patch():
        check("nn.Upsample", up(x), F.interpolate(x, scale_factor=2, mode="trilinear"), 2e-6)


GRID = torch.zeros(1, 2, 2, 2, 3)


def test_numpy_api_errors_are_unchanged():
    import numpy as np
    with pytest.raises(volsample.InvalidArgumentError) as error:
        volsample.grid_sample_3d(np.zeros((1, 1, 2, 2, 2)), np.zeros((1, 1, 1, 1, 2)))
    assert type(error.value) is volsample.InvalidArgumentError
    assert str(error.value).startswith("grid: expected last dimension 3")  # no PyTorch words


def test_ops_called_directly_under_torch_func_raise_clearly():
    x = torch.randn(1, 1, 2, 2, 2)
    with pytest.raises(RuntimeError, match="call volsample.torch.grid_sample"):
        torch.func.grad(lambda a: torch.ops.volsample.grid_sampler_3d(
            a, GRID[:, :1], 0, 0, False).sum())(x)


def test_third_derivatives_raise_clearly():
    x, grid = _grid_problem(16, False)
    x.requires_grad_(), grid.requires_grad_()
    out = vt.grid_sample(x, grid)
    (gg,) = torch.autograd.grad(out.sum(), grid, create_graph=True)
    (ggg,) = torch.autograd.grad(gg.square().sum(), grid, create_graph=True)
    with pytest.raises(NotImplementedError, match="third derivatives"):
        ggg.sum().backward()


@pytest.mark.parametrize("op,args", [
    (torch.ops.volsample.grid_sampler_3d_jvp,
     (torch.randn(1, 2, 3, 4, 5), torch.rand(1, 2, 2, 2, 3) * 2 - 1,
      torch.randn(1, 2, 2, 2, 3), 0, 1, False)),
    (torch.ops.volsample.grid_sampler_3d_backward_jvp,
     (torch.randn(1, 2, 2, 2, 2), torch.randn(1, 2, 3, 4, 5), torch.rand(1, 2, 2, 2, 3) * 2 - 1,
      torch.randn(1, 2, 2, 2, 3), 0, 2, True, [True, True])),
])
def test_opcheck_grid_direction_ops(op, args):
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                "test_aot_dispatch_dynamic"))


def test_compile_upsample_scale_factor_then_grid_sample():
    gen = torch.Generator().manual_seed(17)
    field = (0.1 * torch.randn(1, 3, 2, 3, 2, generator=gen)).requires_grad_()
    x = torch.randn(1, 2, 4, 6, 4, generator=gen)

    def loss(f):
        flow = vt.upsample_trilinear(f, scale_factor=2.0, align_corners=None)
        identity = F.affine_grid(torch.eye(3, 4)[None], (1, 2, 4, 6, 4), align_corners=False)
        return vt.grid_sample(x, identity + flow.permute(0, 2, 3, 4, 1)).square().mean()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    (grad,) = torch.autograd.grad(compiled(field), field)
    (ref,) = torch.autograd.grad(loss(field), field)
    check("grad field", grad, ref, 1e-6)


def test_jit_script_gets_a_clear_error():
    def user(x: torch.Tensor) -> torch.Tensor:
        return vt.upsample_trilinear(x, size=4)

    with pytest.raises(Exception, match="upsample_trilinear|volsample|Python"):
        torch.jit.script(user)


# ---------------------------------------------------------------------------------------
# patch(): an unedited MONAI-style spatial transformer
# ---------------------------------------------------------------------------------------


class SpatialTransformer(torch.nn.Module):
    """A coarse learnt displacement field, upsampled (nn.Upsample) and used to warp a
    volume with F.grid_sample: the shape of MONAI's / VoxelMorph's warping blocks."""

    def __init__(self, shape):
        super().__init__()
        self.field = torch.nn.Parameter(torch.zeros(1, 3, *(s // 2 for s in shape)))
        self.upsample = torch.nn.Upsample(size=shape, mode="trilinear")
        self.register_buffer("identity", F.affine_grid(torch.eye(3, 4)[None], (1, 1) + shape,
                                                       align_corners=False))

    def forward(self, moving):
        flow = self.upsample(self.field).permute(0, 2, 3, 4, 1)
        return F.grid_sample(moving, self.identity + flow, mode="bilinear",
                             padding_mode="border", align_corners=False)


def _train(steps=4):
    gen = torch.Generator().manual_seed(18)
    shape = (4, 6, 4)
    moving = torch.randn((1, 1) + shape, generator=gen)
    fixed = torch.roll(moving, 1, dims=3)
    model = SpatialTransformer(shape)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        optimiser.zero_grad()
        loss = F.mse_loss(model(moving), fixed)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return torch.tensor(losses)


def test_patch_trains_a_spatial_transformer_like_pytorch(monkeypatch):
    calls = []
    real = vt._patch.grid_sample
    monkeypatch.setattr(vt._patch, "grid_sample", lambda *a: calls.append(1) or real(*a))
    reference = _train()
    with vt.patch():
        patched = _train()
    assert calls, "grid_sample was not routed to volsample"
    assert F.grid_sample is vt._patch._ORIGINAL["grid_sample"]  # undone on exit
    assert reference[-1] < reference[0]
    check("losses", patched, reference, 1e-5)


@pytest.mark.parametrize("padding_mode", PADDINGS)
@pytest.mark.parametrize("align_corners", [False, True, None])
def test_patch_routes_5d_bicubic(monkeypatch, padding_mode, align_corners):
    """PyTorch 2.13 raises "bicubic interpolation only supports 4D input" for 5-D bicubic;
    under patch() it is volsample's, values and gradients (align_corners None: False)."""
    calls = []
    real = vt._patch.grid_sample
    monkeypatch.setattr(vt._patch, "grid_sample", lambda *a: calls.append(a[2]) or real(*a))
    x, grid = _grid_problem(16, bool(align_corners))
    with pytest.raises(RuntimeError, match="bicubic interpolation only supports 4D input"):
        F.grid_sample(x, grid, mode="bicubic", padding_mode=padding_mode,
                      align_corners=align_corners)
    a, b = x.clone().requires_grad_(), grid.clone().requires_grad_()
    with vt.patch():
        out = F.grid_sample(a, b, mode="bicubic", padding_mode=padding_mode,
                            align_corners=align_corners)
    out.square().sum().backward()
    c, d = x.clone().requires_grad_(), grid.clone().requires_grad_()
    expected = vt.grid_sample(c, d, "bicubic", padding_mode, bool(align_corners))
    expected.square().sum().backward()
    assert calls == ["bicubic"]
    for name, ours, theirs in [("output", out, expected), ("grad input", a.grad, c.grad),
                               ("grad grid", b.grad, d.grad)]:
        assert torch.equal(ours, theirs), name


def test_patch_leaves_4d_bicubic_and_bspline_to_pytorch():
    """4-D bicubic stays PyTorch's; "bspline" is not a mode of F.grid_sample, and under
    patch() it is PyTorch's error still (vt.grid_sample takes it)."""
    image, grid = torch.randn(1, 2, 5, 6), torch.rand(1, 3, 2, 2) * 2 - 1
    volume, grid5 = torch.randn(1, 2, 3, 4, 5), torch.rand(1, 2, 2, 2, 3) * 2 - 1
    with vt.patch():
        check("4-D bicubic", F.grid_sample(image, grid, mode="bicubic", align_corners=True),
              vt._patch._ORIGINAL["grid_sample"](image, grid, mode="bicubic",
                                                 align_corners=True), 0)
        with pytest.raises(ValueError, match=r"expected mode to be 'bilinear', 'nearest' or "
                                             r"'bicubic', but got: 'bspline'") as error:
            F.grid_sample(volume, grid5, mode="bspline", align_corners=False)
    assert not isinstance(error.value, volsample.VolsampleError)
    assert vt.grid_sample(volume, grid5, "bspline").shape == (1, 2, 2, 2, 2)


def test_an_unknown_mode_is_named_once_with_every_mode_listed_once():
    volume, grid = torch.randn(1, 2, 3, 4, 5), torch.rand(1, 2, 2, 2, 3) * 2 - 1
    with pytest.raises(ValueError, match=r"expected mode to be .*, but got: 'lanczos' \(mode: "
                                         r"expected one of 'bilinear', 'nearest', 'bicubic', "
                                         r"'bspline', got 'lanczos'") as error:
        vt.grid_sample(volume, grid, mode="lanczos")
    assert str(error.value).count("'bilinear'") == 2  # the list, and the alias 'trilinear'


@pytest.mark.parametrize("step", ["", "y.sum().backward()",
                                  "volsample.set_num_threads(1); y.sum().backward()"])
def test_a_graph_alive_at_exit_leaves_no_warning(step):
    """A result with its graph kept by a global at exit (README's first example) prints
    nothing: autograd contexts hold no kernel (nanobind reports kernels alive at exit as
    leaks), and a backward after the thread count changed takes the general path."""
    code = ("import torch, volsample, volsample.torch as vt\n"
            "x = torch.randn(1, 1, 4, 4, 4, requires_grad=True)\n"
            "y = vt.grid_sample(x, torch.rand(1, 2, 2, 2, 3) * 2 - 1)\n" + step + "\n"
            "print(None if x.grad is None else float(x.grad.sum()))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert (run.stdout.strip() == "None") == (step == "")


def test_patch_falls_through_for_what_volsample_does_not_cover():
    vt.patch()
    try:
        assert F.interpolate is not vt._patch._ORIGINAL["interpolate"]
        image = torch.randn(1, 2, 5, 6)
        check("4-D grid_sample", F.grid_sample(image, torch.zeros(1, 2, 2, 2), align_corners=True),
              vt._patch._ORIGINAL["grid_sample"](image, torch.zeros(1, 2, 2, 2),
                                                 align_corners=True), 0)
        volume = torch.randn(1, 2, 3, 4, 5)
        check("nearest interpolate", F.interpolate(volume, size=4),
              vt._patch._ORIGINAL["interpolate"](volume, size=4), 0)
    finally:
        vt.unpatch()
    assert F.interpolate is vt._patch._ORIGINAL["interpolate"]
