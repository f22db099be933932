"""Triton kernels (``volsample._triton``), run on the CPU by Triton's interpreter.

Oracles: PyTorch's CPU operators evaluated in float64 on the same (rounded) inputs, and,
for what PyTorch does differently (non-finite and huge grid coordinates), the float64
NumPy reference. Shapes are small and odd on purpose: the interpreter runs every program
in Python, and odd sizes leave partial blocks everywhere.

The kernels compiled for GPUs (no GPU needed): tests/test_triton_aot.py.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, at import

import itertools  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import volsample  # noqa: E402
import volsample._triton as vt  # noqa: E402
from volsample import _calls, _coords, _reference  # noqa: E402
from volsample._triton import grid_coords as tgs_coords  # noqa: E402
from volsample._triton import grid_sample as tgs  # noqa: E402
from volsample._triton import grid_taps as tgs_taps  # noqa: E402
from volsample._triton import upsample as tup  # noqa: E402
from volsample.torch import _numpy_dtypes, _operands  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, on NaN lanes

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
MODES = {"bilinear": 0, "nearest": 1}
CUBIC = {"bicubic": 2, "bspline": 3}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
# Against a float64 truth. 16-bit results are computed in float32 and rounded once, so
# they must be within half an ulp of their own precision (and a little float32 noise);
# a whole ulp for bfloat16, which Triton's interpreter truncates (the GPU rounds).
TOLERANCE = {torch.float16: (2.0**-11 + 1e-4, 1e-4), torch.bfloat16: (2.0**-7 + 1e-4, 1e-4),
             torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}


def grid_forward(volume, grid, mode, padding, align):
    """The grid-sampling launcher on the checked description of these operands, into a
    result the caller allocates as the torch door does (the input's memory format)."""
    call = _calls.grid_sample(_operands.operand("input", volume), _operands.operand("grid", grid),
                              mode, padding, align, _operands.layout(volume), shape_order="NCDHW")
    out = torch.full(call.output_shape, float("nan"), dtype=volume.dtype).contiguous(
        memory_format=vt.memory_format(volume))
    tgs.forward(call, volume, grid, out)
    return out


def grid_backward(grad, volume, grid, mode, padding, align, output_mask, deterministic):
    """(grad_input, grad_grid), None where not asked for, written into NaN-filled results."""
    call = _calls.grid_sample_backward(
        _operands.operand("grad_output", grad), _operands.operand("input", volume),
        _operands.operand("grid", grid), mode, padding, align, output_mask,
        _operands.layout(volume), shape_order="NCDHW")
    grad_input = (vt.new_volume(volume.shape, volume.dtype, volume).fill_(float("nan"))
                  if output_mask[0] else None)
    grad_grid = torch.full_like(grid, float("nan"), memory_format=torch.contiguous_format) \
        if output_mask[1] else None
    tgs.backward(call, grad, volume, grid, grad_input, grad_grid, deterministic)
    return grad_input, grad_grid


def upsample_call(input_shape, output_size, align, scales, like):
    """An upsampling description made directly: the launchers must take inconsistent
    scales too (a backward's are not checked against the sizes)."""
    return _calls.Upsample(tuple(input_shape), tuple(input_shape[:2]) + tuple(output_size),
                           _numpy_dtypes.numpy_dtype(like.dtype), align,
                           tuple(scales or (None, None, None)), _operands.layout(like))


def upsample_forward(volume, output_size, align, scales):
    call = upsample_call(volume.shape, output_size, align, scales, volume)
    out = vt.new_volume(call.output_shape, volume.dtype, volume).fill_(float("nan"))
    tup.forward(call, volume, out)
    return out


def upsample_backward(grad, input_size, align, scales):
    call = upsample_call(input_size, grad.shape[2:], align, scales, grad)
    grad_input = vt.new_volume(call.input_shape, grad.dtype, grad).fill_(float("nan"))
    tup.backward(call, grad, grad_input)
    return grad_input


def assert_close(name, actual, expected, dtype):
    rtol, atol = TOLERANCE[dtype]
    actual = actual.double()
    bad = ~torch.isclose(actual, expected.double(), rtol=rtol, atol=atol, equal_nan=True)
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} of {bad.numel()} differ (rtol={rtol}, atol={atol}); first at "
        f"{tuple(bad.nonzero()[0].tolist())}: {actual[bad][0].item()!r} vs "
        f"{expected.double()[bad][0].item()!r}")


def assert_bitwise(name, a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, name
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), (
        f"{name}: bits differ between runs")


def layout(t, kind):
    """``t`` with the same values stored as ``kind``: NCDHW, channels_last_3d, or a view with
    odd strides (every other W element of a larger tensor)."""
    if kind == "channels_last":
        return t.contiguous(memory_format=torch.channels_last_3d)
    if kind == "strided":
        wide = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype)
        wide[..., ::2] = t
        return wide[..., ::2]
    return t.contiguous()


def strided_grid(grid):
    """The same grid as a non-contiguous view: coordinates stored as (N, 3, Do, Ho, Wo)."""
    return grid.permute(0, 4, 1, 2, 3).contiguous().permute(0, 2, 3, 4, 1)


def make_problem(dtype, grid_dtype=None, shape=(1, 3, 3, 4, 5), out=(2, 3, 4), spread=1.3,
                 seed=0):
    """Random input, grid (reaching beyond [-1, 1]) and grad_output, rounded to their dtypes."""
    gen = torch.Generator().manual_seed(seed)
    N, C = shape[:2]
    volume = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    grid = ((torch.rand((N,) + out + (3,), generator=gen, dtype=torch.float64) * 2 - 1) * spread)
    grad = torch.randn((N, C) + out, generator=gen, dtype=torch.float64).to(dtype)
    return volume, grid.to(grid_dtype or dtype), grad


def torch_grid_sample(volume, grid, grad, mode, padding, align):
    """PyTorch's CPU forward and backward in float64 on the given values."""
    v, g, go = volume.double(), grid.double(), grad.double()
    out = F.grid_sample(v, g, mode=mode, padding_mode=padding, align_corners=align)
    gi, gg = torch.ops.aten.grid_sampler_3d_backward(go, v, g, MODES[mode], PADDINGS[padding],
                                                     align, [True, True])
    return out, gi, gg


def cpu_grid_sample(volume, grid, grad, mode, padding, align):
    """The CPU kernels (the NumPy API) in float64 on the given values: the oracle of the
    cubic modes, which PyTorch samples in 2-D only."""
    v, g, go = (t.double().numpy() for t in (volume, grid, grad))
    out = volsample.grid_sample_3d(v, g, mode, padding, align)
    gi, gg = volsample.grid_sample_3d_backward(go, v, g, mode, padding, align)
    return torch.from_numpy(out), torch.from_numpy(gi), torch.from_numpy(gg)


def check_grid_sample(volume, grid, grad, mode, padding, align, dtype, kind="ncdhw"):
    """Forward and both backwards against PyTorch (the CPU kernels for the cubic modes);
    returns the deterministic gradients."""
    oracle = cpu_grid_sample if mode in CUBIC else torch_grid_sample
    out_ref, gi_ref, gg_ref = oracle(volume, grid, grad, mode, padding, align)
    volume, grad = layout(volume, kind), layout(grad, kind)
    if kind == "strided":
        grid = strided_grid(grid)
    m, p = {**MODES, **CUBIC}[mode], PADDINGS[padding]
    out = grid_forward(volume, grid, m, p, align)
    assert out.dtype == volume.dtype and out.shape == out_ref.shape
    assert out.is_contiguous(memory_format=vt.memory_format(volume))
    assert_close("output", out, out_ref, volume.dtype)
    results = {}
    for deterministic in (False, True):
        gi, gg = grid_backward(grad, volume, grid, m, p, align, (True, True), deterministic)
        assert gi.dtype == volume.dtype and gg.dtype == grid.dtype
        assert gi.is_contiguous(memory_format=vt.memory_format(volume))
        assert_close(f"grad_input (deterministic={deterministic})", gi, gi_ref, volume.dtype)
        assert_close(f"grad_grid (deterministic={deterministic})", gg, gg_ref, grid.dtype)
        results[deterministic] = gi, gg
    return results[True]


# --------------------------------------------------------------------------------------
# Grid sampling
# --------------------------------------------------------------------------------------


def alternating_layouts(*factors):
    """Every combination of ``factors``, each with one layout: NCDHW where the sum of the
    values' positions is even, channels_last where it is odd. Each layout then meets every
    value of every factor, in half the interpreter time of the full product."""
    cases = []
    for picks in itertools.product(*(list(enumerate(f)) for f in factors)):
        values = tuple(v for _, v in picks)
        kind = ("ncdhw", "channels_last")[sum(i for i, _ in picks) % 2]
        name = "-".join(str(v).removeprefix("torch.") for v in values + (kind,))
        cases.append(pytest.param(*values, kind, id=name))
    return cases


@pytest.mark.parametrize("mode, padding, align, dtype, kind", alternating_layouts(
    list(MODES), list(PADDINGS), [False, True], DTYPES))
def test_grid_sample_matches_torch(mode, padding, align, dtype, kind):
    check_grid_sample(*make_problem(dtype), mode, padding, align, dtype, kind)


@pytest.mark.parametrize("padding", list(PADDINGS))
@pytest.mark.parametrize("mode", list(MODES))
def test_grid_sample_any_strides(mode, padding):
    # Input and grad_output are every other element of wider tensors; the grid's
    # coordinates are far apart in memory.
    check_grid_sample(*make_problem(torch.float32, shape=(2, 3, 3, 4, 5)), mode, padding, False,
                      torch.float32, "strided")


@pytest.mark.parametrize("dtype, grid_dtype", [(torch.bfloat16, torch.float32),
                                               (torch.float16, torch.float64)])
@pytest.mark.parametrize("mode", list(MODES))
def test_grid_sample_mixed_precision(dtype, grid_dtype, mode):
    check_grid_sample(*make_problem(dtype, grid_dtype, shape=(2, 2, 3, 4, 5)), mode, "border",
                      True, dtype)


@pytest.mark.parametrize("shape, out, padding, align, kind", [
    ((1, 1, 1, 1, 1), (1, 1, 1), "reflection", True, "ncdhw"),  # sizes 1: an empty span
    ((1, 1, 1, 1, 1), (1, 2, 1), "border", False, "channels_last"),
    ((2, 2, 1, 3, 7), (2, 1, 3), "reflection", False, "ncdhw"),  # size-1 axes, a prime
    ((2, 2, 1, 3, 7), (2, 1, 3), "zeros", True, "channels_last"),
    ((1, 35, 2, 2, 2), (1, 2, 2), "zeros", True, "channels_last"),  # two chunks of channels
])
def test_grid_sample_odd_shapes(shape, out, padding, align, kind):
    problem = make_problem(torch.float64, shape=shape, out=out, spread=1.5)
    check_grid_sample(*problem, "bilinear", padding, align, torch.float64, kind)


def test_grid_sample_nearest_rounds_half_to_even():
    # align_corners, W = 5: ix = 2 * (c + 1), so c = -0.75, -0.25, 0.25, 0.75 give
    # ix = 0.5, 1.5, 2.5, 3.5, which round to 0, 2, 2, 4.
    volume = torch.arange(5, dtype=torch.float32).reshape(1, 1, 1, 1, 5)
    xs = torch.tensor([-0.75, -0.25, 0.25, 0.75])
    grid = torch.stack([xs, torch.zeros(4), torch.zeros(4)], -1).reshape(1, 1, 1, 4, 3)
    out = grid_forward(volume, grid, 1, 0, True)
    assert out.flatten().tolist() == [0.0, 2.0, 2.0, 4.0]
    grad = torch.ones(1, 1, 1, 1, 4)
    for deterministic in (False, True):
        gi, gg = grid_backward(grad, volume, grid, 1, 0, True, (True, True), deterministic)
        assert gi.flatten().tolist() == [1.0, 0.0, 2.0, 0.0, 1.0]
        assert not gg.any()


def test_grid_sample_linear_function_is_exact():
    # Trilinear interpolation reproduces a linear function exactly, and its gradient with
    # respect to the grid is the function's slope times d(voxel)/d(coordinate).
    D, H, W = 4, 5, 6
    z, y, x = torch.meshgrid(*(torch.arange(s, dtype=torch.float64) for s in (D, H, W)),
                             indexing="ij")
    volume = (1.0 * x + 2.0 * y + 3.0 * z)[None, None]
    gen = torch.Generator().manual_seed(1)
    grid = torch.rand(1, 2, 3, 4, 3, dtype=torch.float64, generator=gen) * 1.8 - 0.9  # inside
    out = grid_forward(volume, grid, 0, 0, True)
    ix, iy, iz = ((grid[..., k] + 1) / 2 * (s - 1) for k, s in enumerate((W, H, D)))
    torch.testing.assert_close(out[:, 0], ix + 2 * iy + 3 * iz, rtol=0, atol=1e-12)
    _, gg = grid_backward(torch.ones_like(out), volume, grid, 0, 0, True, (False, True), True)
    slope = torch.tensor([1.0 * (W - 1) / 2, 2.0 * (H - 1) / 2, 3.0 * (D - 1) / 2],
                         dtype=torch.float64)
    torch.testing.assert_close(gg, slope.expand_as(gg), rtol=0, atol=1e-12)


@pytest.mark.parametrize("padding", list(PADDINGS))
@pytest.mark.parametrize("mode", list(MODES))
def test_grid_sample_non_finite_points_contribute_nothing(mode, padding):
    volume, grid, grad = make_problem(torch.float32)
    bad = torch.zeros(grid.shape[:-1], dtype=torch.bool)
    bad[0, 0, 0, :3] = True
    grid[0, 0, 0, 0, 0] = float("nan")
    grid[0, 0, 0, 1, 1] = float("inf")
    grid[0, 0, 0, 2, 2] = -float("inf")
    # Oracle: PyTorch on the other points alone (bad points moved and their gradient zeroed).
    grad_ref = grad.masked_fill(bad[:, None], 0)
    out_ref, gi_ref, gg_ref = torch_grid_sample(volume, grid.masked_fill(bad[..., None], 0),
                                                grad_ref, mode, padding, False)
    _assert_bad_points_contribute_nothing(volume, grid, grad, bad, MODES[mode], PADDINGS[padding],
                                          out_ref, gi_ref, gg_ref)


def _assert_bad_points_contribute_nothing(volume, grid, grad, bad, mode, padding, out_ref,
                                          gi_ref, gg_ref):
    """The kernels (forward, both backwards) against an oracle run with the ``bad`` points
    moved inside and their gradient zeroed: the bad points read 0 and get no gradient.
    Returns the kernels' output."""
    out = grid_forward(volume, grid, mode, padding, False)
    assert_close("output", out, out_ref.masked_fill(bad[:, None], 0), torch.float32)
    for deterministic in (False, True):
        gi, gg = grid_backward(grad, volume, grid, mode, padding, False, (True, True),
                               deterministic)
        assert_close("grad_input", gi, gi_ref, torch.float32)
        assert_close("grad_grid", gg, gg_ref, torch.float32)
        assert not gg[bad].any()
    return out


@pytest.mark.parametrize("padding", list(PADDINGS))
def test_grid_sample_huge_coordinates_follow_the_reference(padding):
    # Reflection folds them with a floating-point parity, border clips them and zeros
    # reads nothing; no integer overflows anywhere. (float64: folding a huge coordinate
    # depends on its every bit, so the oracle must compute in the same precision.)
    volume, grid, grad = make_problem(torch.float64)
    grid[0, 0, 0, :4] = torch.tensor([[1e30, -3e9, 0.2], [-1e300, 7.5e7, 1e20],
                                      [2.5e15, 0.1, -1e25], [-0.3, 1e10, 4e8]])
    for align in (False, True):
        args = (volume.numpy(), grid.numpy(), "bilinear", padding, align)
        out = grid_forward(volume, grid, 0, PADDINGS[padding], align)
        assert_close(f"output ({align})", out, torch.from_numpy(_reference.grid_sample_3d(*args)),
                     torch.float64)
        gi, gg = grid_backward(grad, volume, grid, 0, PADDINGS[padding], align, (True, True), True)
        gi_ref, gg_ref = _reference.grid_sample_3d_backward(grad.numpy(), *args)
        assert_close(f"grad_input ({align})", gi, torch.from_numpy(gi_ref), torch.float64)
        assert_close(f"grad_grid ({align})", gg, torch.from_numpy(gg_ref), torch.float64)


def test_grid_sample_coordinates_overflowing_float32_contribute_nothing():
    # -1e38 is a float32, but the voxel coordinate (-1e38 + 1) * 5 / 2 is not: it
    # overflows to -inf, which reads nothing rather than NaN, in every padding mode
    # (border clips it first, to voxel 0).
    volume, grid, grad = make_problem(torch.float32)
    grid[..., 0] = -1e38
    for padding, p in PADDINGS.items():
        out = grid_forward(volume, grid, 0, p, False)
        gi, gg = grid_backward(grad, volume, grid, 0, p, False, (True, True), True)
        assert torch.isfinite(out).all() and torch.isfinite(gi).all() and torch.isfinite(gg).all()
        if padding != "border":
            assert not out.any() and not gi.any() and not gg.any()


@pytest.mark.parametrize("deterministic", [False, True])
def test_grid_sample_output_mask(deterministic):
    volume, grid, grad = make_problem(torch.float32)
    full_gi, full_gg = grid_backward(grad, volume, grid, 0, 1, False, (True, True), deterministic)
    gi, gg = grid_backward(grad, volume, grid, 0, 1, False, (True, False), deterministic)
    assert gg is None and torch.equal(gi, full_gi)
    gi, gg = grid_backward(grad, volume, grid, 0, 1, False, (False, True), deterministic)
    assert gi is None and torch.equal(gg, full_gg)
    nothing = grid_backward(grad, volume, grid, 0, 1, False, (False, False), deterministic)
    assert nothing == (None, None)


@pytest.mark.parametrize("shape, out", [((0, 2, 3, 3, 3), (2, 2, 2)),   # no batch
                                        ((2, 0, 3, 3, 3), (2, 2, 2)),   # no channels
                                        ((2, 2, 3, 3, 3), (0, 2, 2))])  # no points
def test_grid_sample_empty(shape, out):
    volume, grid, grad = make_problem(torch.float32, shape=shape, out=out)
    assert grid_forward(volume, grid, 0, 0, False).shape == grad.shape
    for deterministic in (False, True):
        gi, gg = grid_backward(grad, volume, grid, 0, 0, False, (True, True), deterministic)
        assert gi.shape == volume.shape and not gi.any()
        assert gg.shape == grid.shape and not gg.any()


def _window(shape, pad=2, dtype=torch.float64):
    """A NaN-filled view of ``shape`` whose last axis is part of a longer one: a result
    whose points do not lie at one stride, which the kernels cannot write as it is."""
    return torch.full(tuple(shape[:-1]) + (shape[-1] + pad,), float("nan"),
                      dtype=dtype)[..., :shape[-1]]


@pytest.mark.parametrize("deterministic", [False, True])
def test_results_of_any_strides_are_written_whole(deterministic):
    """The launchers write a caller's result of any strides whole, with the bits of a
    dense one (through a dense copy, copied in), every gradient and every family."""
    volume, grid, grad = make_problem(torch.float64, shape=(2, 3, 3, 4, 5))
    codes = (0, 1, False)
    call = _calls.grid_sample_backward(
        _operands.operand("grad_output", grad), _operands.operand("input", volume),
        _operands.operand("grid", grid), *codes, (True, True), "NCDHW", shape_order="NCDHW")
    out = _window(grad.shape)
    tgs.forward(call, volume, grid, out)
    assert_bitwise("output", out, grid_forward(volume, grid, *codes))
    grad_input, grad_grid = _window(volume.shape), _window(grid.shape, 1)
    tgs.backward(call, grad, volume, grid, grad_input, grad_grid, deterministic)
    expected = grid_backward(grad, volume, grid, *codes, (True, True), deterministic)
    assert_close("grad_input", grad_input, expected[0], torch.float64)
    assert_bitwise("grad_grid", grad_grid, expected[1])
    up = upsample_call(volume.shape, (5, 6, 7), False, None, volume)
    out = _window(up.output_shape)
    tup.forward(up, volume, out)
    assert_bitwise("upsampled", out, upsample_forward(volume, (5, 6, 7), False, None))
    grad_up = torch.randn(up.output_shape, dtype=torch.float64)
    grad_input = _window(volume.shape)
    tup.backward(up, grad_up, grad_input)
    assert_bitwise("upsampling's grad_input", grad_input,
                   upsample_backward(grad_up, volume.shape, False, None))


def test_workspace_counts_the_scratch_of_each_path():
    """The deterministic gather's scratch grows with the points, the atomic scatter's is
    the accumulator of a 16-bit grad_input alone; nothing without a grad_input to form
    in nearest; upsampling's backward holds an intermediate volume per resized axis but
    the last, and the dense copy of a result given that the kernels cannot write."""
    def call(dtype, points, mode=0, mask=(True, True)):
        return _calls.GridSample((2, 3, 4, 5, 6), (2, points, 4, 5, 3), dtype, np.float32,
                                 mode, 0, False, "NCDHW", mask)
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    assert tgs.workspace_nbytes(call(f32, 6), deterministic=False) == 0
    assert tgs.workspace_nbytes(call(f16, 6), deterministic=False) == 2 * 3 * 4 * 5 * 6 * 4
    few, many = (tgs.workspace_nbytes(call(f32, n)) for n in (3, 6))
    assert 0 < few < many
    assert tgs.workspace_nbytes(call(f32, 6, mode=1, mask=(False, True))) == 0
    up = upsample_call((2, 3, 4, 5, 6), (8, 10, 12), False, None, torch.empty(0))
    one_axis = upsample_call((2, 3, 4, 5, 6), (4, 5, 12), False, None, torch.empty(0))
    tables = tup.workspace_nbytes(one_axis, backward=True)
    assert tables > 0 and tup.workspace_nbytes(up, backward=True) > 2 * 3 * 4 * 10 * 12 * 4
    window = _window((2, 3, 4, 5, 6), dtype=torch.float32)
    assert tup.workspace_nbytes(one_axis, backward=True, result=window) == tables + window.numel() * 4


@pytest.mark.parametrize("kind", ["ncdhw", "channels_last"])
@pytest.mark.parametrize("mode", list(MODES))
def test_grid_sample_deterministic_is_bitwise_reproducible(mode, kind):
    # Many points in few cells, so that voxels gather long, shared lists.
    volume, grid, grad = make_problem(torch.bfloat16, shape=(2, 5, 3, 3, 3), spread=0.6)
    volume, grad = layout(volume, kind), layout(grad, kind)
    first = grid_backward(grad, volume, grid, MODES[mode], 0, False, (True, True), True)
    second = grid_backward(grad, volume, grid, MODES[mode], 0, False, (True, True), True)
    assert_bitwise("grad_input", first[0], second[0])
    assert_bitwise("grad_grid", first[1], second[1])


def test_grid_sample_64_bit_indexing_gives_the_same_bits(monkeypatch):
    volume, grid, grad = make_problem(torch.float32, shape=(2, 3, 3, 4, 5))
    expected = [grid_forward(volume, grid, 0, 2, False),
                *grid_backward(grad, volume, grid, 0, 2, False, (True, True), True),
                *grid_backward(grad, volume, grid, 0, 2, False, (True, True), False)]
    monkeypatch.setattr(vt, "_INT32_LIMIT", 1)  # every launch now indexes in int64
    assert vt.index_dtype(volume) == vt.tl.int64
    actual = [grid_forward(volume, grid, 0, 2, False),
              *grid_backward(grad, volume, grid, 0, 2, False, (True, True), True),
              *grid_backward(grad, volume, grid, 0, 2, False, (True, True), False)]
    for name, a, b in zip(["output", "grad_input", "grad_grid", "grad_input (atomic)",
                           "grad_grid (atomic)"], actual, expected):
        assert_bitwise(name, a, b)


def test_index_dtype_widens_past_int32():
    # Meta tensors have sizes and strides but no memory: 2**31 elements cost nothing.
    assert vt.index_dtype(torch.empty(2**31 - 1, device="meta")) == vt.tl.int32
    assert vt.index_dtype(torch.empty(2**31, device="meta")) == vt.tl.int64
    far_apart = torch.empty(2, 3, device="meta").as_strided((2, 3), (2**31, 1))
    assert vt.index_dtype(far_apart) == vt.tl.int64
    assert vt.index_dtype(torch.empty(4), counts=(2**31,)) == vt.tl.int64


# --------------------------------------------------------------------------------------
# Bicubic and cubic B-spline grid sampling: against the CPU kernels
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, padding, align, dtype, kind", alternating_layouts(
    list(CUBIC), list(PADDINGS), [False, True], DTYPES))
def test_cubic_grid_sample_matches_cpu(mode, padding, align, dtype, kind):
    check_grid_sample(*make_problem(dtype, spread=1.6), mode, padding, align, dtype, kind)


@pytest.mark.parametrize("mode, padding", [("bicubic", "reflection"), ("bspline", "zeros")])
def test_cubic_grid_sample_any_strides(mode, padding):
    check_grid_sample(*make_problem(torch.float32, shape=(2, 3, 3, 4, 5)), mode, padding, True,
                      torch.float32, "strided")


@pytest.mark.parametrize("mode, dtype, grid_dtype", [("bicubic", torch.bfloat16, torch.float32),
                                                     ("bspline", torch.float16, torch.float64)])
def test_cubic_grid_sample_mixed_precision(mode, dtype, grid_dtype):
    check_grid_sample(*make_problem(dtype, grid_dtype, shape=(2, 2, 3, 4, 5)), mode,
                      "reflection", False, dtype)


@pytest.mark.parametrize("mode, shape, out, padding, align, kind", [
    ("bicubic", (1, 1, 1, 1, 1), (1, 2, 1), "reflection", True, "ncdhw"),  # empty spans
    ("bspline", (1, 1, 1, 1, 1), (1, 2, 1), "border", False, "channels_last"),
    ("bicubic", (2, 2, 1, 2, 7), (2, 1, 3), "reflection", False, "channels_last"),  # < 4 voxels
    ("bspline", (2, 2, 1, 2, 7), (2, 1, 3), "zeros", True, "ncdhw"),
    ("bspline", (1, 35, 2, 3, 2), (1, 2, 2), "reflection", True, "channels_last"),  # 2 chunks
])
def test_cubic_grid_sample_odd_shapes(mode, shape, out, padding, align, kind):
    problem = make_problem(torch.float64, shape=shape, out=out, spread=2.5)
    check_grid_sample(*problem, mode, padding, align, torch.float64, kind)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", list(CUBIC))
def test_cubic_forward_and_grid_gradient_take_the_cpu_bits(mode, dtype):
    # The kernels do the CPU's operations in its order (weights, tap sums, the chain;
    # B-spline's division by 6 as a product corrected by its residual), so the
    # interpreter gives the CPU's bits; grad_input adds its terms in another order.
    volume, grid, grad = make_problem(dtype, spread=1.6)
    for (padding, p), align in zip(PADDINGS.items(), (False, True, dtype == torch.float32)):
        v, g, go = (t.numpy() for t in (volume, grid, grad))
        out_ref = torch.from_numpy(volsample.grid_sample_3d(v, g, mode, padding, align))
        gg_ref = torch.from_numpy(volsample.grid_sample_3d_backward(
            go, v, g, mode, padding, align, (False, True))[1])
        assert_bitwise(f"output ({padding}, {align})",
                       grid_forward(volume, grid, CUBIC[mode], p, align), out_ref)
        _, gg = grid_backward(grad, volume, grid, CUBIC[mode], p, align, (False, True),
                              True)
        assert_bitwise(f"grad_grid ({padding}, {align})", gg, gg_ref)


@pytest.mark.parametrize("mode, padding", list(zip(["bicubic", "bspline", "bicubic"], PADDINGS)))
def test_cubic_non_finite_points_contribute_nothing(mode, padding):
    volume, grid, grad = make_problem(torch.float32)
    grid[0, 0, 0, 0, 0] = float("nan")
    grid[0, 0, 0, 1, 1] = float("inf")
    grid[0, 0, 0, 2, 2] = -float("inf")
    grid[0, 1, 0, 0, 0] = -1e38  # a voxel coordinate that overflows float32: reads nothing
    bad = ~torch.isfinite(grid).all(-1)
    bad[0, 1, 0, 0] = True
    out_ref, gi_ref, gg_ref = cpu_grid_sample(volume, grid.masked_fill(bad[..., None], 0),
                                              grad.masked_fill(bad[:, None], 0), mode,
                                              padding, False)
    out = _assert_bad_points_contribute_nothing(volume, grid, grad, bad, CUBIC[mode],
                                                PADDINGS[padding], out_ref, gi_ref, gg_ref)
    assert not out[0, :, 1, 0, 0].any()


@pytest.mark.parametrize("padding", list(PADDINGS))
def test_cubic_huge_coordinates_follow_the_cpu(padding):
    # Every tap of a huge coordinate is padded on its own, in floating point (reflection
    # folds it, border clips it, zeros reads nothing); no integer overflows anywhere.
    volume, grid, grad = make_problem(torch.float64)
    grid[0, 0, 0, :4] = torch.tensor([[1e30, -3e9, 0.2], [-1e300, 7.5e7, 1e20],
                                      [2.5e15, 0.1, -1e25], [-0.3, 1e10, 4e8]])
    for mode, align in zip(CUBIC, (padding != "border", padding == "border")):
        out_ref, gi_ref, gg_ref = cpu_grid_sample(volume, grid, grad, mode, padding, align)
        args = (CUBIC[mode], PADDINGS[padding], align)
        assert_close(f"output ({mode}, {align})", grid_forward(volume, grid, *args), out_ref,
                     torch.float64)
        for deterministic in (False, True):
            gi, gg = grid_backward(grad, volume, grid, *args, (True, True), deterministic)
            assert_close(f"grad_input ({mode}, {align})", gi, gi_ref, torch.float64)
            assert_close(f"grad_grid ({mode}, {align})", gg, gg_ref, torch.float64)


@pytest.mark.parametrize("mode, deterministic", [("bicubic", False), ("bspline", True)])
def test_cubic_output_mask(mode, deterministic):
    volume, grid, grad = make_problem(torch.float32)
    args = (CUBIC[mode], 2, True)
    full_gi, full_gg = grid_backward(grad, volume, grid, *args, (True, True), deterministic)
    gi, gg = grid_backward(grad, volume, grid, *args, (True, False), deterministic)
    assert gg is None and torch.equal(gi, full_gi)
    gi, gg = grid_backward(grad, volume, grid, *args, (False, True), deterministic)
    assert gi is None and torch.equal(gg, full_gg)
    assert grid_backward(grad, volume, grid, *args, (False, False), deterministic) == (None, None)


@pytest.mark.parametrize("mode, padding, kind", [
    ("bicubic", "border", "ncdhw"), ("bicubic", "reflection", "channels_last"),
    ("bspline", "zeros", "channels_last"), ("bspline", "reflection", "ncdhw")])
def test_cubic_deterministic_is_bitwise_reproducible(mode, padding, kind):
    # Many points in few windows, so that voxels gather long, shared lists; border and
    # reflection fold several taps of a point onto one voxel.
    volume, grid, grad = make_problem(torch.bfloat16, shape=(2, 3, 3, 3, 4), spread=1.2)
    _, gi_ref, _ = cpu_grid_sample(volume, grid, grad, mode, padding, False)
    volume, grad = layout(volume, kind), layout(grad, kind)
    args = (CUBIC[mode], PADDINGS[padding], False, (True, True), True)
    first = grid_backward(grad, volume, grid, *args)
    second = grid_backward(grad, volume, grid, *args)
    assert_bitwise("grad_input", first[0], second[0])
    assert_bitwise("grad_grid", first[1], second[1])
    assert_close("grad_input", first[0], gi_ref, torch.bfloat16)


@pytest.mark.parametrize("mode", list(CUBIC))
def test_cubic_64_bit_indexing_gives_the_same_bits(monkeypatch, mode):
    volume, grid, grad = make_problem(torch.float32, shape=(2, 3, 3, 4, 5), spread=1.6)
    m = CUBIC[mode]

    def run():
        return [grid_forward(volume, grid, m, 2, False),
                *grid_backward(grad, volume, grid, m, 2, False, (True, True), True),
                *grid_backward(grad, volume, grid, m, 2, False, (True, True), False)]

    expected = run()
    monkeypatch.setattr(vt, "_INT32_LIMIT", 1)  # every launch now indexes in int64
    for name, a, b in zip(["output", "grad_input", "grad_grid", "grad_input (atomic)",
                           "grad_grid (atomic)"], run(), expected):
        assert_bitwise(name, a, b)


@triton.jit
def _sixth_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tgs_taps.sixth(tl.load(x_ptr + i, mask=i < n, other=0.0)), mask=i < n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_division_by_six_is_correctly_rounded(dtype):
    # B-spline's weights divide by 6 as the CPU does, without a division.
    gen = np.random.default_rng(6)
    x = np.concatenate([gen.uniform(0, 4, 20000), gen.uniform(0, 1e-3, 2000),
                        np.arange(0, 600) / 64]).astype(dtype)
    out = torch.empty(len(x), dtype=getattr(torch, np.dtype(dtype).name))
    _sixth_kernel[(1,)](torch.from_numpy(x), out, len(x), triton.next_power_of_2(len(x)))
    np.testing.assert_array_equal(out.numpy(), x / dtype(6))


# --------------------------------------------------------------------------------------
# Trilinear upsampling
# --------------------------------------------------------------------------------------

RESIZES = {
    "up": ((3, 4, 5), (5, 8, 9), None),
    "mixed": ((4, 4, 5), (4, 7, 3), None),  # D kept (the identity), H up, W down
    "scales": ((3, 4, 5), (4, 6, 7), (1.5, 1.6, 1.5)),
    "inconsistent scales": ((3, 4, 5), (6, 3, 7), (2.5, 0.4, None)),
    "to size 1": ((3, 2, 4), (1, 1, 6), None),
}


def check_upsample(resize, align, dtype, kind):
    size_in, size_out, scales = RESIZES[resize]
    gen = torch.Generator().manual_seed(2)
    volume = torch.randn((2, 3) + size_in, generator=gen, dtype=torch.float64).to(dtype)
    grad = torch.randn((2, 3) + size_out, generator=gen, dtype=torch.float64).to(dtype)
    scales = scales or (None, None, None)
    expected = torch.ops.aten.upsample_trilinear3d(volume.double(), size_out, align, *scales)
    grad_expected = torch.ops.aten.upsample_trilinear3d_backward(
        grad.double(), size_out, volume.shape, align, *scales)
    volume, grad = layout(volume, kind), layout(grad, kind)
    out = upsample_forward(volume, size_out, align, scales)
    assert out.dtype == dtype and out.is_contiguous(memory_format=vt.memory_format(volume))
    assert_close("output", out, expected, dtype)
    results = []
    for _ in range(2):
        gi = upsample_backward(grad, tuple(volume.shape), align, scales)
        assert gi.dtype == dtype and gi.is_contiguous(memory_format=vt.memory_format(grad))
        assert_close("grad_input", gi, grad_expected, dtype)
        results.append(gi)
    assert_bitwise("grad_input (run twice)", *results)


@pytest.mark.parametrize("align, dtype, kind", alternating_layouts([False, True], DTYPES))
def test_upsample_matches_torch(align, dtype, kind):
    check_upsample("up", align, dtype, kind)


@pytest.mark.parametrize("resize", list(RESIZES))
@pytest.mark.parametrize("align", [False, True])
def test_upsample_resizes(resize, align):
    check_upsample(resize, align, torch.float64, "ncdhw")


@pytest.mark.parametrize("kind", ["channels_last", "strided"])
def test_upsample_layouts(kind):
    check_upsample("mixed", False, torch.float32, kind)


def test_upsample_identity_and_empty():
    volume = torch.randn(2, 3, 3, 4, 5)
    assert torch.equal(upsample_forward(volume, (3, 4, 5), False, (None,) * 3), volume)
    assert torch.equal(upsample_backward(volume, (2, 3, 3, 4, 5), True, None), volume)
    assert upsample_forward(volume[:0], (6, 8, 10), False, None).shape == (0, 3, 6, 8, 10)
    assert upsample_backward(volume[:, :0], (2, 0, 2, 2, 2), False, None).shape == (2, 0, 2, 2, 2)


def test_upsample_64_bit_indexing_gives_the_same_bits(monkeypatch):
    volume = torch.randn(2, 3, 3, 4, 5)
    grad = torch.randn(2, 3, 5, 7, 9)
    expected = (upsample_forward(volume, (5, 7, 9), False, None),
                upsample_backward(grad, (2, 3, 3, 4, 5), False, None))
    monkeypatch.setattr(vt, "_INT32_LIMIT", 1)
    assert_bitwise("output", upsample_forward(volume, (5, 7, 9), False, None), expected[0])
    assert_bitwise("grad_input", upsample_backward(grad, (2, 3, 3, 4, 5), False, None),
                   expected[1])


# --------------------------------------------------------------------------------------
# The exact arithmetic the kernels do without divisions (no subroutine calls on a GPU)
# --------------------------------------------------------------------------------------


@triton.jit
def _reflect_kernel(x_ptr, folded_ptr, sign_ptr, n, W, H, D, ALIGN: tl.constexpr,
                    BLOCK: tl.constexpr):
    """The same coordinates folded along three axes of sizes W, H, D."""
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0)
    fx, fy, fz, gx, gy, gz = tgs_coords.reflect(x, x, x, W, H, D, ALIGN)
    for k, f, g in ((0, fx, gx), (1, fy, gy), (2, fz, gz)):
        tl.store(folded_ptr + k * n + i, f, mask=i < n)
        tl.store(sign_ptr + k * n + i, g, mask=i < n)


def _near_multiples(span, dtype, count, gen):
    """Coordinates at, just below and just above whole multiples of ``span`` (quotients up
    to 2**p, where a correctly rounded division rounds up across an integer), huge ones,
    and plain ones."""
    p = np.finfo(dtype).nmant + 1
    q = np.unique(np.concatenate([gen.integers(0, 2**p, count), 2**p - gen.integers(1, 9, 8),
                                  2 ** (p - 1) + gen.integers(-4, 4, 8)])).astype(np.float64)
    at = (q * span).astype(dtype)
    values = [at, np.nextafter(at, dtype(0)), np.nextafter(at, dtype(np.inf)),
              np.nextafter(np.nextafter(at, dtype(0)), dtype(0)),
              gen.normal(0, 1, count).astype(dtype) * dtype(span * 3),
              np.array([1e30, 3e38 if dtype == np.float32 else 1e300, 2.0**p * span,
                        np.nextafter(dtype(2.0**p * span), dtype(0))], dtype=dtype)]
    values = np.concatenate(values).astype(dtype)
    return np.concatenate([values, -values]) - dtype(0.5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reflection_folds_bit_for_bit_with_the_reference(dtype):
    # The reference takes an exact fmod and a correctly rounded x / span; the kernels fold
    # with multiplications and fmas, and must give the same bits, sign included.
    gen = np.random.default_rng(7)
    for sizes in ((1, 2, 3), (7, 100, 1023)):
        for align in (False, True):
            spans = [s - 1 if align and s > 1 else s for s in sizes]
            x = np.concatenate([_near_multiples(span, dtype, 100, gen) for span in spans])
            folded = torch.empty(3 * len(x), dtype=getattr(torch, np.dtype(dtype).name))
            sign = torch.empty_like(folded)
            _reflect_kernel[(1,)](torch.from_numpy(x), folded, sign, len(x), *sizes, align,
                                  triton.next_power_of_2(len(x)))
            for k, size in enumerate(sizes):
                bounds = (0, 2 * (size - 1)) if align else (-1, 2 * size - 1)
                ref_folded, ref_sign = _coords.reflect(np, x, *bounds)
                got = folded[k * len(x):(k + 1) * len(x)].numpy()
                bad = got != ref_folded
                assert not bad.any(), (f"size {size} align {align}: {int(bad.sum())} differ, "
                                       f"first x={x[bad][0]!r}: {got[bad][0]!r} vs "
                                       f"{ref_folded[bad][0]!r}")
                np.testing.assert_array_equal(sign[k * len(x):(k + 1) * len(x)].numpy(),
                                              ref_sign)


@triton.jit
def _divmod_kernel(x_ptr, q_ptr, r_ptr, n, d, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0)
    q, r = vt.divmod_index(x, d)
    tl.store(q_ptr + i, q, mask=i < n)
    tl.store(r_ptr + i, r, mask=i < n)


@pytest.mark.parametrize("d", [1, 3, 7, 640, 2**20 + 7, 2**31 - 1])
def test_int64_division_without_a_divide(d):
    gen = np.random.default_rng(d)
    x = np.concatenate([gen.integers(0, 2**50, 500), np.arange(0, 3 * d, max(1, d // 5))[:200],
                        d * gen.integers(0, 2**50 // d, 100) + np.array([[0], [-1], [1]])
                        .repeat(100, 1).ravel()[:100], [0, 2**50 - 1]])
    x = torch.from_numpy(np.clip(x, 0, 2**50 - 1).astype(np.int64))
    q, r = torch.empty_like(x), torch.empty_like(x)
    _divmod_kernel[(1,)](x, q, r, len(x), d, triton.next_power_of_2(len(x)))
    assert torch.equal(q, x // d) and torch.equal(r, x % d)
