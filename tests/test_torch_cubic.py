"""volsample.torch in the cubic modes (``mode="bicubic"``, ``"bspline"``; custom-op
interpolation_mode 2 and 3).

Oracles: the NumPy API (bits: the torch door calls the same C++ kernels, every dtype and
memory format), PyTorch 2.13's 4-D bicubic of a volume constant along z, and finite
differences (gradcheck). ``torch.library.opcheck`` checks the ops' fakes and autograd
registration in these modes; torch.compile(fullgraph=True) runs them; CUDA tensors reach
the Triton launchers (a stand-in here: no GPU).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from helpers import assert_bitwise_equal, assert_close  # noqa: E402
from test_torch import CUBIC_MODES as ALL_MODES  # noqa: E402
from test_torch import _stand_in, check, in_format, kink_free_grid, leaves  # noqa: E402

import volsample  # noqa: E402
import volsample.torch as vt  # noqa: E402
from volsample._tables import MODES as MODE_TABLE  # noqa: E402
from volsample._torch_formats import memory_format  # noqa: E402
from volsample.torch import _grid_sample, _memory, _operands  # noqa: E402

ops = torch.ops.volsample
CUBIC = ["bicubic", "bspline"]
PADDINGS = ["zeros", "border", "reflection"]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _grid(gen, shape, spread=1.4, dtype=torch.float64):
    """Points in and around [-1, 1], every seventh on a voxel centre or edge of a small
    volume (-1, 0, 1) or far outside (-3.5, 2.25)."""
    grid = (torch.rand(shape + (3,), generator=gen, dtype=torch.float64) * 2 - 1) * spread
    flat = grid.view(-1, 3)
    special = torch.tensor([-1.0, 0.0, 1.0, -3.5, 2.25], dtype=torch.float64)
    picks = torch.randint(0, 5, flat[::7].shape, generator=gen)
    flat[::7] = special[picks]
    return grid.to(dtype)


def _numpy(t):
    return _memory.read_only_array(t.detach())


# ---------------------------------------------------------------------------------------
# The same kernels as the NumPy API: bits
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_torch_door_gives_the_numpy_apis_bits(mode, padding_mode, align_corners, dtype, fmt):
    gen = torch.Generator().manual_seed(hash((mode, padding_mode, align_corners)) % 2**31)
    x = in_format(torch.randn(2, 3, 5, 4, 6, generator=gen).to(dtype), fmt).requires_grad_()
    grid = _grid(gen, (2, 3, 4, 5), dtype=dtype).requires_grad_()
    go = in_format(torch.randn(2, 3, 3, 4, 5, generator=gen).to(dtype), fmt)
    out = vt.grid_sample(x, grid, mode, padding_mode, align_corners)
    out.backward(go)
    layout = _operands.layout(x)
    arrays = [np.asarray(_numpy(t)) for t in (x, grid, go)]
    if layout == "NDHWC":
        arrays[0], arrays[2] = (a.transpose(0, 2, 3, 4, 1) for a in (arrays[0], arrays[2]))
    expected = volsample.grid_sample_3d(arrays[0], arrays[1], mode, padding_mode,
                                        align_corners, layout=layout)
    gi, gg = volsample.grid_sample_3d_backward(arrays[2], arrays[0], arrays[1], mode,
                                               padding_mode, align_corners, layout=layout)
    assert out.dtype == x.grad.dtype == dtype and out.is_contiguous(
        memory_format=memory_format(x))
    back = (lambda a: a.transpose(0, 4, 1, 2, 3)) if layout == "NDHWC" else (lambda a: a)
    assert_bitwise_equal("output", _numpy(out), back(expected))
    assert_bitwise_equal("grad_input", _numpy(x.grad), back(gi))
    assert_bitwise_equal("grad_grid", _numpy(grid.grad), gg)


@pytest.mark.parametrize("mode", CUBIC)
def test_ops_take_pytorchs_interpolation_numbers(mode):
    """interpolation_mode 2 is bicubic (PyTorch's GridSamplerInterpolation), 3 bspline."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, 4, 5, 6, generator=gen)
    grid = _grid(gen, (1, 2, 3, 4), dtype=torch.float32)
    go = torch.randn(1, 2, 2, 3, 4, generator=gen)
    code = MODE_TABLE[mode].code
    assert code == {"bicubic": 2, "bspline": 3}[mode]
    expected = volsample.grid_sample_3d(x.numpy(), grid.numpy(), mode, "border", True)
    assert_bitwise_equal("output", ops.grid_sampler_3d(x, grid, code, 1, True).numpy(), expected)
    gi, gg = ops.grid_sampler_3d_backward(go, x, grid, code, 1, True, [True, True])
    egi, egg = volsample.grid_sample_3d_backward(go.numpy(), x.numpy(), grid.numpy(), mode,
                                                 "border", True)
    assert_bitwise_equal("grad_input", gi.numpy(), egi)
    assert_bitwise_equal("grad_grid", gg.numpy(), egg)


# ---------------------------------------------------------------------------------------
# PyTorch's 4-D bicubic (gradcheck: test_torch.py's, over every mode)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding_mode", PADDINGS)
@pytest.mark.parametrize("align_corners", [False, True])
def test_bicubic_of_a_z_constant_volume_is_pytorch_4d_bicubic(padding_mode, align_corners):
    """Through the torch door, with autograd: a volume constant along z, every z tap inside,
    is PyTorch's 4-D bicubic of the slice (values, x/y grid gradients; the slice's gradient
    is grad_input summed over z; the z grid gradient is 0, the z weights summing to 1)."""
    gen = torch.Generator().manual_seed(5)
    D = 6
    slice_ = torch.randn(2, 3, 5, 7, generator=gen, dtype=torch.float64)
    grid = _grid(gen, (2, 1, 4, 6), 1.6)
    iz = 1.0 + 1.999 * torch.rand(grid.shape[:4], generator=gen, dtype=torch.float64)
    grid[..., 2] = (2 * iz / (D - 1) - 1) if align_corners else ((2 * iz + 1) / D - 1)
    go = torch.randn(2, 3, 1, 4, 6, generator=gen, dtype=torch.float64)
    s, g = leaves(slice_, grid)
    out = vt.grid_sample(s[:, :, None].expand(-1, -1, D, -1, -1), g, "bicubic", padding_mode,
                         align_corners)
    out.backward(go)
    s4, g4 = leaves(slice_, grid[:, 0, ..., :2])
    expected = F.grid_sample(s4, g4, mode="bicubic", padding_mode=padding_mode,
                             align_corners=align_corners)
    expected.backward(go[:, :, 0])
    check("output", out[:, :, 0], expected, 1e-12)
    check("grad slice", s.grad, s4.grad, 1e-12)
    check("grad_grid xy", g.grad[:, 0, ..., :2], g4.grad, 1e-11)
    check("grad_grid z", g.grad[..., 2], torch.zeros(g.shape[:4]), 0, 1e-12)


# ---------------------------------------------------------------------------------------
# opcheck, torch.compile, CUDA dispatch
# ---------------------------------------------------------------------------------------


def _opcheck_samples():
    gen = torch.Generator().manual_seed(8)
    samples = []
    for fmt, code in itertools.product(("contiguous", "channels_last"), (2, 3)):
        x = in_format(torch.randn(2, 3, 5, 6, 7, generator=gen), fmt).requires_grad_()
        grid = _grid(gen, (2, 4, 3, 5), 1.2, torch.float32).requires_grad_()
        go = in_format(torch.randn(2, 3, 4, 3, 5, generator=gen), fmt)
        samples += [
            (fmt, ops.grid_sampler_3d, (x, grid, code, 0, False)),
            (fmt, ops.grid_sampler_3d, (x, grid, code, 2, True)),
            (fmt, ops.grid_sampler_3d_backward,
             (go, x.detach(), grid.detach(), code, 1, False, [True, True])),
            (fmt, ops.grid_sampler_3d_backward,
             (go, x.detach(), grid.detach(), code, 2, True, [False, True])),
        ]
        tangent = torch.randn(grid.shape, generator=gen)
        samples += [  # the grid-direction derivative ops (no autograd of their own)
            (fmt, ops.grid_sampler_3d_jvp, (x.detach(), grid.detach(), tangent, code, 1, True)),
            (fmt, ops.grid_sampler_3d_backward_jvp,
             (go, x.detach(), grid.detach(), tangent, code, 0, False, [True, True])),
        ]
    bf16 = torch.randn(1, 2, 4, 3, 5, generator=gen).bfloat16().requires_grad_()
    samples.append(("bf16", ops.grid_sampler_3d,
                    (bf16, _grid(gen, (1, 2, 2, 2), 1.2, torch.float32), 2, 1, False)))
    return [pytest.param(op, args, id=f"{op.__name__}-{tag}-{i}")
            for i, (tag, op, args) in enumerate(samples)]


@pytest.mark.parametrize("op,args", _opcheck_samples())
def test_opcheck(op, args):
    torch.library.opcheck(op, args)


@pytest.mark.parametrize("mode", CUBIC)
def test_compile_fullgraph_matches_eager(mode):
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(1, 2, 5, 6, 7, generator=gen)
    grid = _grid(gen, (1, 3, 4, 5), 1.2, torch.float32)

    def loss(v, g):
        return vt.grid_sample(v, g, mode, "reflection", False).square().mean()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    (a, b), (c, d) = leaves(x, grid), leaves(x, grid)
    out, ref = compiled(a, b), loss(c, d)
    out.backward()
    ref.backward()
    check("loss", out, ref, 1e-6)
    check("grad input", a.grad, c.grad, 1e-6)
    check("grad grid", b.grad, d.grad, 1e-6)


@pytest.mark.parametrize("mode", CUBIC)
def test_cuda_tensors_go_to_the_triton_launchers(monkeypatch, mode):
    """The cubic modes take the trilinear modes' path to the GPU backend: the launchers
    prepare the checked description with the mode's code (their own check decides what
    they run)."""
    x, grid, go = torch.randn(1, 2, 3, 4, 5), torch.zeros(1, 2, 2, 2, 3), torch.randn(1, 2, 2, 2, 2)
    out = torch.empty(1, 2, 2, 2, 2)
    calls = _stand_in(monkeypatch, "grid_sample", forward=(out,), backward=(grid,))
    code = MODE_TABLE[mode].code
    assert _grid_sample._grid_sampler_3d_cuda(x, grid, code, 1, True).shape == out.shape
    _grid_sample._grid_sampler_3d_backward_cuda(go, x, grid, code, 2, False, [False, True])
    (_, f_args), _, (_, b_args), _ = calls  # prepare_forward, forward_on, prepare_backward, ...
    assert (f_args[0].mode, f_args[0].padding, f_args[0].align_corners) == (code, 1, True)
    assert (b_args[0].mode, b_args[0].padding, b_args[0].output_mask) == (code, 2,
                                                                          (False, True))


def test_points_outside_and_non_finite_read_nothing():
    """Far outside under zeros padding, NaN/inf points, and a coordinate whose unnormalising
    overflows to infinity: output 0, no gradient, and no forward-AD tangent or second
    derivative either."""
    x = torch.randn(1, 2, 4, 4, 4, dtype=torch.float64, requires_grad=True)
    grid = torch.tensor([[5.0, 0, 0], [float("nan"), 0, 0], [0, float("inf"), 0],
                         [0, 0, -float("inf")], [0, 1e308, 0]],
                        dtype=torch.float64).view(1, 1, 1, 5, 3)
    grid.requires_grad_()
    direction = torch.ones_like(grid)
    for mode in CUBIC:
        out = vt.grid_sample(x, grid, mode, "zeros", False)
        gi, gg = torch.autograd.grad(out.sum(), (x, grid), create_graph=True)
        second = torch.autograd.grad(gg, (x, grid), direction)
        _, tangent = torch.func.jvp(lambda g: vt.grid_sample(x.detach(), g, mode, "zeros", False),
                                    (grid.detach(),), (direction,))
        for name, t in [("output", out), ("grad_input", gi), ("grad_grid", gg),
                        ("d grad_grid/d input", second[0]), ("d grad_grid/d grid", second[1]),
                        ("tangent", tangent)]:
            assert_close(name, t.detach().numpy(), np.zeros(t.shape), 0, 0)


# ---------------------------------------------------------------------------------------
# Forward-mode AD and second derivatives
# ---------------------------------------------------------------------------------------

# Axis sizes whose unnormalising is exact in float64 (S = 4 without align_corners, S - 1 = 4
# with), so that whole voxel coordinates stay whole: the points sit exactly on tap
# boundaries.
EXACT_SIZE = {False: 4, True: 5}


def tap_boundary_grid(gen, shape, size, align_corners):
    """Points whose voxel coordinates are whole numbers from -2 to size + 1 (on tap
    boundaries: a tap enters or leaves the footprint there; inside and outside the volume)
    on some axes, and at fractions 0.3 / 0.7 on the others."""
    voxel = torch.randint(-2, size + 2, shape + (3,), generator=gen).double()
    fractional = torch.rand(shape + (3,), generator=gen) < 0.4
    voxel = voxel + fractional * torch.where(torch.rand(shape + (3,), generator=gen) < 0.5,
                                             0.3, 0.7)
    grid = 2 * voxel / (size - 1) - 1 if align_corners else (2 * voxel + 1) / size - 1
    back = (grid + 1) / 2 * (size - 1) if align_corners else ((grid + 1) * size - 1) / 2
    assert torch.equal(back, voxel)  # the whole coordinates are exactly whole
    return grid


def _sampler(mode, padding_mode, align_corners):
    return lambda a, b: vt.grid_sample(a, b, mode, padding_mode, align_corners)


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_gradgradcheck_and_forward_ad(mode, padding_mode, align_corners):
    """Finite differences of the first derivatives (double backward) and of the forward
    (forward mode), points inside and outside the volume, away from tap boundaries."""
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(1, 2, 3, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    grid = kink_free_grid(gen, (1, 2, 2, 2), (3, 4, 3), align_corners).requires_grad_()
    fn = _sampler(mode, padding_mode, align_corners)
    assert torch.autograd.gradcheck(fn, (x, grid), check_forward_ad=True,
                                    check_batched_forward_grad=False)
    assert torch.autograd.gradgradcheck(fn, (x, grid))


@pytest.mark.parametrize("mode,padding_mode,align_corners", ALL_MODES)
def test_derivatives_on_tap_boundaries(mode, padding_mode, align_corners):
    """On whole voxel coordinates, where taps enter and leave the footprint. Both kernels
    are continuously differentiable there, so forward AD and the first derivatives match
    central differences; the B-spline is twice so, and its double backward does too. The
    bicubic kernel's second derivative jumps where a tap leaves (at distance 2 it is 2A on
    the inside, 0 beyond): its second derivatives are those of the piece the point starts
    (t = x - floor(x) = 0), which one-sided differences of the grid gradient measure."""
    gen = torch.Generator().manual_seed(11)
    S = EXACT_SIZE[align_corners]
    x = torch.randn(1, 2, S, S, S, generator=gen, dtype=torch.float64, requires_grad=True)
    grid = tap_boundary_grid(gen, (1, 2, 2, 2), S, align_corners).requires_grad_()
    fn = _sampler(mode, padding_mode, align_corners)
    assert torch.autograd.gradcheck(fn, (x, grid), check_forward_ad=True,
                                    check_batched_forward_grad=False)
    if mode == "bspline":
        assert torch.autograd.gradgradcheck(fn, (x, grid))
        return
    go = torch.randn(1, 2, 2, 2, 2, generator=gen, dtype=torch.float64)
    direction = torch.rand(grid.shape, generator=gen, dtype=torch.float64)  # >= 0: one side

    def grad_grid(g):  # torch.func's, so that jvp can run through it
        return torch.func.vjp(lambda points: fn(x.detach(), points), g)[1](go)[0]

    first = torch.autograd.grad(fn(x, grid), grid, go, create_graph=True)[0]
    analytic = torch.autograd.grad(first, grid, direction)[0]  # Hessian . direction
    hessian_direction = torch.func.jvp(grad_grid, (grid.detach(),), (direction,))[1]
    step = 1e-7
    one_sided = (grad_grid(grid.detach() + step * direction) - grad_grid(grid.detach())) / step
    check("double backward", analytic, one_sided, 1e-5, 1e-5)
    check("forward over reverse", hessian_direction, one_sided, 1e-5, 1e-5)


@pytest.mark.parametrize("mode", CUBIC)
def test_second_derivatives_of_the_grid_are_the_references(mode):
    """The grid-grid second derivatives against central differences of the float64
    reference's grid gradient (an oracle apart from the C++ kernels and the torch terms)."""
    from volsample import _reference as reference
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(1, 2, 4, 5, 3, generator=gen, dtype=torch.float64)
    grid = kink_free_grid(gen, (1, 2, 3, 2), (4, 5, 3), False)
    go = torch.randn(1, 2, 2, 3, 2, generator=gen, dtype=torch.float64)
    direction = torch.randn(grid.shape, generator=gen, dtype=torch.float64)
    g = grid.clone().requires_grad_()
    first = torch.autograd.grad(vt.grid_sample(x, g, mode, "reflection", False), g, go,
                                create_graph=True)[0]
    analytic = torch.autograd.grad(first, g, direction)[0]
    step = 1e-6

    def reference_grad_grid(points):
        return reference.grid_sample_3d_backward(go.numpy(), x.numpy(), points.numpy(), mode,
                                                 "reflection", False)[1]
    numeric = (reference_grad_grid(grid + step * direction)
               - reference_grad_grid(grid - step * direction)) / (2 * step)
    assert_close("d(grad_grid)/d(grid) . direction", analytic.numpy(), numeric, 1e-6, 1e-7)


@pytest.mark.parametrize("mode", CUBIC)
def test_derivative_terms_in_chunks_of_points_are_the_whole(monkeypatch, mode):
    """The 64-tap terms run in chunks of points that bound their temporaries: a chunk of
    one point (every boundary a chunk boundary) gives the results of one chunk."""
    from volsample.torch import _grid_derivatives
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(2, 3, 4, 5, 3, generator=gen, dtype=torch.float64)
    grid = _grid(gen, (2, 3, 2, 2))
    t = torch.randn(grid.shape, generator=gen, dtype=torch.float64)
    go = torch.randn(2, 3, 3, 2, 2, generator=gen, dtype=torch.float64)
    code = MODE_TABLE[mode].code

    def terms():
        return (ops.grid_sampler_3d_jvp(x, grid, t, code, 0, False),
                *ops.grid_sampler_3d_backward_jvp(go, x, grid, t, code, 0, False, [True, True]))
    whole = terms()
    monkeypatch.setattr(_grid_derivatives, "_CHUNK_ELEMENTS", 1)
    for name, a, b in zip(("jvp", "grad_input", "grad_grid"), terms(), whole):
        assert b.abs().max() > 0
        check(name, a, b, 1e-14, 1e-14)
