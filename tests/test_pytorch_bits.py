"""Bit for bit against PyTorch 2.13 CPU (``torch.ops.aten``), float32 and float64.

Grid sampling: the forward, grad_input and grad_grid of every mode, padding and
align_corners, several channel counts, both layouts, every instruction set this CPU runs and
1 or 2 threads, with NaN and infinities in the volume, in grad_output and in the grid. Bits
are equal for every value that is not NaN, and NaN lies exactly where PyTorch has NaN (its
sign and payload are free: where two NaNs meet, the vector code may return the other one).
A grid point with a non-finite coordinate is where volsample differs on purpose: it
contributes nothing (output 0, grad_grid 0, no scatter), and is checked against that rule.

Trilinear upsampling: bit for bit where PyTorch's order of operations allows (the
channels-first forward), elsewhere within a stated bound (see ``UPSAMPLE_ULPS``).
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from helpers import assert_same_bits, numpy_array, torch_tensor

import volsample
from volsample import _cpu

MODES = {"bilinear": 0, "nearest": 1}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
DTYPES = [np.float32, np.float64]
LAYOUTS = ["NCDHW", "NDHWC"]
ISAS = _cpu.supported_isas()
THREADS = (1, 2)


@pytest.fixture
def all_threads(monkeypatch):
    """Small inputs run on every thread asked for (else 2 threads would quietly be 1); the
    ISA and thread count in use are restored afterwards."""
    monkeypatch.setattr(volsample._cpu, "MIN_WORK_PER_THREAD", 1)
    isa, threads = _cpu.isa(), volsample.get_num_threads()
    yield
    _cpu.set_isa(isa)
    volsample.set_num_threads(threads)


def each_setting(two_thread_layout):
    """Sets each (layout, ISA, thread count) in turn and yields the layout and a name: every
    layout and ISA on 1 thread, every ISA on 2 threads in ``two_thread_layout`` (how the work
    is split across threads does not depend on the layout, and a 2-thread call costs many
    1-thread ones on a busy machine)."""
    for layout, isa, threads in itertools.product(LAYOUTS, ISAS, THREADS):
        if threads > 1 and layout != two_thread_layout:
            continue
        _cpu.set_isa(isa)
        volsample.set_num_threads(min(threads, volsample._cpu._MAX_THREADS))
        yield layout, f"{layout}, {isa}, {threads} thread(s)"


def to_layout(logical, layout):
    return np.ascontiguousarray(logical.transpose(0, 2, 3, 4, 1)) if layout == "NDHWC" else logical


def from_layout(array, layout):
    return array.transpose(0, 4, 1, 2, 3) if layout == "NDHWC" else array


# --- grid sampling ------------------------------------------------------------------------

# One case per channel count; each also picks the batch and the kind of grid, so that two
# threads meet every way the backward splits its work: whole batches per thread (N = 2),
# slabs of planes that rows straddle (N = 1, a smooth grid), one slab scattering beside
# threads computing the grid gradient (N = 1, a random grid).
GRID_CASES = {1: (1, "smooth"), 3: (1, "random"), 8: (1, "smooth"), 17: (2, "random")}
VOLUME = (8, 5, 6)      # D, H, W: few voxels, so each receives many terms (their order counts)
POINTS = (6, 4, 19)     # Do, Ho, Wo: 19 is no multiple of any vector width

# Points with a coordinate that is not finite: volsample's rule (docs/semantics.md), not PyTorch's.
NON_FINITE = [(np.nan, 0.1, 0.2), (0.3, np.inf, -0.5), (0.1, 0.2, -np.inf),
              (np.inf, -np.inf, np.nan), (-np.inf, 0.0, 0.0)]


def special_points(sizes):
    """Finite points that test edges: voxel centres and half-way points of both
    align_corners conventions (nearest meets exact ties), the edges +-1, points beyond
    them, and huge coordinates (border clips, reflection folds, zeros reads nothing)."""
    W, H, D = sizes
    centre = lambda i, S: 2.0 * i / max(S - 1, 1) - 1.0
    half = lambda i, S: (2.0 * i + 2.0) / S - 1.0
    return [(centre(1, W), centre(2, H), centre(1, D)), (half(2, W), half(1, H), half(0, D)),
            (half(0, W), centre(0, H), half(2, D)), (1.0, -1.0, 1.0), (-1.0, 1.0, -1.0),
            (3.0, 0.2, -0.4), (-1.02, 1.3, 0.0), (1e30, 0.5, 0.5), (0.1, -1e30, 0.3),
            (-7.5, 40.0, -3.25)]


def make_grid(rng, N, kind, dtype):
    """N grids of POINTS: smooth (an affine map with a little jitter: rows stay on a few
    planes) or uniform in [-1.3, 1.3]; then the special and non-finite points, spread out."""
    Do, Ho, Wo = POINTS
    if kind == "smooth":
        z, y, x = np.meshgrid(*(np.linspace(-1.15, 1.15, n) for n in POINTS), indexing="ij")
        base = np.stack([x + 0.1 * y, y - 0.05 * z, z + 0.08 * x], axis=-1)
        grid = base[None] + rng.uniform(-0.04, 0.04, (N,) + POINTS + (3,))
    else:
        grid = rng.uniform(-1.3, 1.3, (N,) + POINTS + (3,))
    flat = grid.reshape(-1, 3)
    specials = special_points(VOLUME[::-1]) + NON_FINITE
    at = rng.choice(flat.shape[0], len(specials), replace=False)
    flat[at] = specials
    return grid.astype(dtype)


def sprinkle(rng, array, values):
    """``array`` with ``values`` at distinct random places."""
    flat = array.reshape(-1)
    flat[rng.choice(flat.size, len(values), replace=False)] = values
    return array


def grid_case(dtype, mode, padding, align_corners, C):
    rng = np.random.default_rng([C, MODES[mode], PADDINGS[padding], int(align_corners),
                                 np.dtype(dtype).itemsize])
    N, kind = GRID_CASES[C]
    x = rng.standard_normal((N, C) + VOLUME).astype(dtype)
    sprinkle(rng, x, [np.nan, np.inf, -np.inf])
    grid = make_grid(rng, N, kind, dtype)
    grad_out = rng.standard_normal((N, C) + POINTS).astype(dtype)
    sprinkle(rng, grad_out, [np.nan, np.inf, -np.inf, np.inf])
    return x, grid, grad_out


def pytorch_grid_sample(x, grid, grad_out, mode, padding, align_corners):
    """PyTorch's output, grad_input and grad_grid for volsample's semantics at points with
    a non-finite coordinate: there PyTorch clips NaN to the last voxel (border, reflection),
    so those points are given coordinate 0 and grad_output 0 instead. A point with
    grad_output 0 scatters 0 * w with w >= 0 finite, i.e. +-0, into grad_input; adding +-0
    changes no accumulator that is not -0, and an accumulator that starts at +0 and adds
    values in round-to-nearest is never -0. So grad_input is exactly that of points that
    contribute nothing. The other points' outputs and grid gradients depend on their own
    coordinates and grad_output only. Returns those and the mask of finite points."""
    finite = np.isfinite(grid).all(axis=-1)
    safe_grid = np.where(finite[..., None], grid, 0).astype(grid.dtype)
    safe_grad = np.where(finite[:, None], grad_out, 0).astype(grad_out.dtype)
    codes = (MODES[mode], PADDINGS[padding], align_corners)
    out = torch.ops.aten.grid_sampler_3d(torch_tensor(x), torch_tensor(safe_grid), *codes)
    grad_input, grad_grid = torch.ops.aten.grid_sampler_3d_backward(
        torch_tensor(safe_grad), torch_tensor(x), torch_tensor(safe_grid), *codes, [True, True])
    return numpy_array(out), numpy_array(grad_input), numpy_array(grad_grid), finite


def check_grid_sample(name, ours, expected, finite):
    """Our (output, grad_input, grad_grid), logical layout, against PyTorch's and the rule
    for non-finite points."""
    out, grad_input, grad_grid = ours
    ref_out, ref_grad_input, ref_grad_grid = expected
    points_last = (0, 2, 3, 4, 1)  # (N, Do, Ho, Wo, C): indexable by the point mask
    out, ref_out = out.transpose(points_last), ref_out.transpose(points_last)
    assert_same_bits(f"{name}: output", out[finite], ref_out[finite])
    assert_same_bits(f"{name}: output at non-finite points", out[~finite],
                     np.zeros_like(out[~finite]))
    assert_same_bits(f"{name}: grad_input", grad_input, ref_grad_input)
    assert_same_bits(f"{name}: grad_grid", grad_grid[finite], ref_grad_grid[finite])
    assert_same_bits(f"{name}: grad_grid at non-finite points", grad_grid[~finite],
                     np.zeros_like(grad_grid[~finite]))


@pytest.mark.parametrize("C", list(GRID_CASES))
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding", list(PADDINGS))
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_grid_sample_bits_like_pytorch(dtype, mode, padding, align_corners, C, all_threads):
    x, grid, grad_out = grid_case(dtype, mode, padding, align_corners, C)
    *expected, finite = pytorch_grid_sample(x, grid, grad_out, mode, padding, align_corners)
    assert (~finite).sum() == len(NON_FINITE)
    for layout, setting in each_setting(LAYOUTS[list(GRID_CASES).index(C) % 2]):
        out = volsample.grid_sample_3d(to_layout(x, layout), grid, mode, padding,
                                       align_corners, layout=layout)
        grad_input, grad_grid = volsample.grid_sample_3d_backward(
            to_layout(grad_out, layout), to_layout(x, layout), grid, mode, padding,
            align_corners, layout=layout)
        check_grid_sample(setting, (from_layout(out, layout), from_layout(grad_input, layout),
                                    grad_grid), expected, finite)


# Rows of points that walk along x about a voxel a point, as smooth warps do: the AVX-512
# backward scatters runs of such points (consecutive low corners) as vectors, on volumes
# whose rows are wider than a vector. Here the step along x swings between about 0.4 and
# 1.6 voxels (runs broken by points that share a low corner or skip one), y and z drift
# across rows, rows start and end outside the volume, and points outnumber voxels, so that
# each grad_input element receives many terms whose order counts.
RUNS_VOLUME = (5, 6, 40)     # D, H, W
RUNS_POINTS = (7, 9, 70)     # Do, Ho, Wo


def runs_grid(rng, dtype):
    Do, Ho, Wo = RUNS_POINTS
    t = np.linspace(-1.15, 1.15, Wo)
    x = t + 0.2 * np.sin(2.6 * t)[None, None] * np.linspace(0.6, 1.4, Ho)[None, :, None]
    y = np.linspace(-1.05, 1.05, Ho)[None, :, None] + 0.3 * np.sin(1.5 * t + 0.5)
    z = np.linspace(-1.1, 1.1, Do)[:, None, None] + 0.25 * np.cos(1.3 * t)
    grid = np.stack(np.broadcast_arrays(x, y, z), axis=-1)[None]
    return (grid + rng.uniform(-0.002, 0.002, grid.shape)).astype(dtype)


@pytest.mark.parametrize("C", [1, 3])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_grid_backward_along_runs_bits_like_pytorch(dtype, padding, align_corners, C,
                                                     all_threads):
    rng = np.random.default_rng([C, PADDINGS[padding], int(align_corners),
                                 np.dtype(dtype).itemsize])
    x = rng.standard_normal((1, C) + RUNS_VOLUME).astype(dtype)
    grid = runs_grid(rng, dtype)
    grad_out = rng.standard_normal((1, C) + RUNS_POINTS).astype(dtype)
    *expected, finite = pytorch_grid_sample(x, grid, grad_out, "bilinear", padding,
                                            align_corners)
    for _, setting in each_setting("NCDHW"):
        grad_input, grad_grid = volsample.grid_sample_3d_backward(
            grad_out, x, grid, "bilinear", padding, align_corners)
        assert_same_bits(f"{setting}: grad_input", grad_input, expected[1])
        assert_same_bits(f"{setting}: grad_grid", grad_grid, expected[2])


# The backward kernels write their results whole (grad_input's planes zeroed by the tasks
# that add into them, grad_grid 0 where points touch nothing), so results need not start
# at 0: here they start as NaN. Rows of points wholly outside the volume touch no plane, and
# with 2 threads a smooth grid is cut into several slabs, one of which must still write
# those rows' grid gradient; a grad_input with gaps between its rows and channels takes
# the element-by-element zeroing.
@pytest.mark.parametrize("C", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_grid_backward_writes_its_results_whole(dtype, C, all_threads):
    from volsample import _calls
    from volsample._cpu import grid_sample as cpu_grid_sample

    rng = np.random.default_rng([C, np.dtype(dtype).itemsize])
    x = rng.standard_normal((1, C) + RUNS_VOLUME).astype(dtype)
    grid = runs_grid(rng, dtype)
    grid[:, :, 2, :, 0] = 1.8  # a row of points outside the volume at every depth
    grad_out = rng.standard_normal((1, C) + RUNS_POINTS).astype(dtype)
    _, *expected, _ = pytorch_grid_sample(x, grid, grad_out, "bilinear", "zeros", False)
    for layout, setting in each_setting("NCDHW"):
        call = _calls.grid_sample_backward(
            *(_calls.operand(n, a) for n, a in (("grad_output", grad_out), ("input", x),
                                                ("grid", grid))), 0, 0, False)
        gapped = np.full((1, C + 1, RUNS_VOLUME[0], RUNS_VOLUME[1] + 1, RUNS_VOLUME[2] + 3),
                         np.nan, dtype)
        dense = from_layout(to_layout(np.full_like(x, np.nan), layout), layout)
        for grad_input in (dense, gapped[:, :C, :, 1:, 2:-1]):
            grad_grid = np.full_like(grid, np.nan)
            cpu_grid_sample.backward(call, grad_out, x, grid, grad_input, grad_grid,
                                     volsample.get_num_threads())
            strides = grad_input.strides
            assert_same_bits(f"{setting}, grad_input strides {strides}", grad_input,
                             expected[0])
            assert_same_bits(f"{setting}: grad_grid", grad_grid, expected[1])
        assert np.isnan(gapped[:, C:]).all() and np.isnan(gapped[:, :, :, 0]).all(), \
            "memory between the gapped grad_input's elements was written"


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding", list(PADDINGS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_infinite_grad_output_gives_pytorchs_nan(dtype, padding, align_corners):
    # With grad_output = +-inf a point's grid-gradient terms are +-inf, and corners of
    # opposite sign meet as inf - inf = NaN, as in PyTorch; a difference of corner values
    # times grad_output would give +-inf there instead.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2) + VOLUME).astype(dtype)
    grid = rng.uniform(-1.1, 1.1, (1,) + POINTS + (3,)).astype(dtype)
    grad_out = np.where(rng.random((1, 2) + POINTS) < 0.5, np.inf, -np.inf).astype(dtype)
    grad_out[:, 1] = rng.standard_normal(POINTS)  # channel 1 finite: the sum stays NaN
    codes = (0, PADDINGS[padding], align_corners)
    _, expected = torch.ops.aten.grid_sampler_3d_backward(
        torch_tensor(grad_out), torch_tensor(x), torch_tensor(grid), *codes, [False, True])
    expected = numpy_array(expected)
    assert np.isnan(expected).mean() > 0.5  # the case this test is about
    _, grad_grid = volsample.grid_sample_3d_backward(grad_out, x, grid, "bilinear", padding,
                                                     align_corners, output_mask=(False, True))
    assert_same_bits("grad_grid", grad_grid, expected)


# --- trilinear upsampling -----------------------------------------------------------------
#
# Where the bits are PyTorch's, and where not (found over 10^5 random cases of the kinds
# below, input sizes 1-9, scale factors 0.5-8):
# - forward, channels first: PyTorch's bits (we fuse the multiply-adds its x86 build fuses),
#   with two exceptions of PyTorch's. (1) float64: PyTorch rounds the float64 source
#   coordinate to float32 before its floor (``floorf``), so a coordinate a hair below a
#   whole number k (a whole-number position that came out an ulp low, say) becomes k with
#   weight 0 on voxel k - 1; we keep float64 and give voxel k - 1 that small weight.
#   ``pytorch_dropped_weight`` says where and how much; everywhere else the bits agree.
#   (2) A 1x1x1 volume: PyTorch's loop then evaluates the W lerp unfused (<= 2 ulp).
# - forward, channels last: PyTorch's channels-last kernel sums eight products
#   (w_d * w_h * w_w) * v, another formula than its own channels-first one; we give the
#   channels-first bits in both layouts.
# - backward: we apply the adjoint axis by axis; PyTorch adds each output's eight terms into
#   grad_input point by point. Different rounding: 5% of the cases agree bit for bit.
# Where they differ the results agree within UPSAMPLE_ULPS * eps * B, B the operator applied
# to the absolute values in float64 (the magnitude of the sum each result rounds), plus the
# weight PyTorch's floorf drops times the values it moves between. Each side rounds a
# handful of times per term (three nested lerps, or a weight product and a running sum),
# so they differ by a few eps * B: the worst measured is 3.8 (forward, channels last) and
# 4.1 (backward) for scale factors up to 4, as here, and 4.6 (backward) up to 8, where each
# value sums more terms.
UPSAMPLE_ULPS = 6
UPSAMPLE_KINDS = ["integer scales", "fractional scales", "integer ratio sizes", "other sizes"]


def upsample_case(rng, kind, dtype, max_in=7, max_scale=4.0):
    """(input, output size, scales as the forward takes them, kwargs of the forward)."""
    while True:
        ins = tuple(int(v) for v in rng.integers(1, max_in + 1, 3))
        if kind == "integer scales":
            scales = tuple(float(v) for v in rng.integers(1, int(max_scale) + 1, 3))
        elif kind == "fractional scales":
            scales = tuple(float(v) for v in rng.uniform(0.5, max_scale, 3))
        elif kind == "integer ratio sizes":
            out = tuple(int(n * k) for n, k in zip(ins, rng.integers(1, int(max_scale) + 1, 3)))
        else:
            out = tuple(int(v) for v in rng.integers(1, int(max_scale * max_in) + 1, 3))
        if "scales" in kind:
            out = tuple(math.floor(n * s) for n, s in zip(ins, scales))
            kwargs = {"scale_factor": scales}
        else:
            scales, kwargs = (None,) * 3, {"size": out}
        if min(out) >= 1 and out != ins:
            break
    N, C = (int(v) for v in rng.integers(1, [3, 9]))
    return rng.standard_normal((N, C) + ins).astype(dtype), out, scales, kwargs


def pytorch_dropped_weight(n_in, n_out, align_corners, scale, dtype):
    """Per output index along one axis, the weight PyTorch's float64 kernels move from
    voxel k - 1 to voxel k (0 where none): the source coordinate as volsample's float64
    kernel computes it (src/cpp/coords.h; one rounding of the fused ratio * (o + 0.5) - 0.5),
    and PyTorch's index floor(float32(src)) where it differs from floor(src)."""
    dropped = np.zeros(n_out)
    if np.dtype(dtype) != np.float64 or n_in == n_out:
        return dropped
    if align_corners:
        ratio = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale else n_in / n_out
    for o in range(n_out):
        if align_corners:
            src = ratio * o
        else:
            src = max(0.0, float(Fraction(ratio) * (o + Fraction(1, 2)) - Fraction(1, 2)))
        theirs = min(math.floor(np.float32(src)), n_in - 1)
        if theirs != min(math.floor(src), n_in - 1):
            dropped[o] = theirs - src
    return dropped


def pytorch_upsample(array, out, input_shape, align_corners, scales, layout, backward):
    t = torch_tensor(array)
    if layout == "NDHWC":
        t = t.contiguous(memory_format=torch.channels_last_3d)
    if backward:
        return numpy_array(torch.ops.aten.upsample_trilinear3d_backward(
            t, list(out), list(input_shape), align_corners, *scales))
    return numpy_array(torch.ops.aten.upsample_trilinear3d(t, list(out), align_corners, *scales))


def upsample_results(x, out, scales, kwargs, align_corners, layout, g):
    """Ours and PyTorch's forward and backward (logical layout), and their bounds: the
    operator on absolute values (float64), and the difference PyTorch's dropped weights may
    make (forward: per output; backward: per (n, c), any voxel)."""
    backward_scales = None if scales[0] is None else scales
    ours = (from_layout(volsample.upsample_trilinear_3d(
                to_layout(x, layout), align_corners=align_corners, layout=layout, **kwargs),
                layout),
            from_layout(volsample.upsample_trilinear_3d_backward(
                to_layout(g, layout), x.shape, align_corners, backward_scales, layout=layout),
                layout))
    theirs = (pytorch_upsample(x, out, x.shape, align_corners, scales, layout, False),
              pytorch_upsample(g, out, x.shape, align_corners, scales, layout, True))
    magnitude = (volsample.upsample_trilinear_3d(np.abs(x).astype(np.float64),
                                                 align_corners=align_corners, **kwargs),
                 volsample.upsample_trilinear_3d_backward(np.abs(g).astype(np.float64), x.shape,
                                                          align_corners, backward_scales))
    d, h, w = (pytorch_dropped_weight(n, m, align_corners, s, x.dtype)
               for n, m, s in zip(x.shape[2:], out, scales))
    dropped = d[:, None, None] + h[None, :, None] + w[None, None, :]
    moved = (2 * np.abs(x).max(axis=(2, 3, 4), keepdims=True) * dropped,
             (np.abs(g) * dropped).sum(axis=(2, 3, 4), keepdims=True))
    return ours, theirs, magnitude, moved, dropped == 0


@pytest.mark.parametrize("kind", UPSAMPLE_KINDS)
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_upsample_bits_like_pytorch(dtype, layout, align_corners, kind):
    rng = np.random.default_rng([UPSAMPLE_KINDS.index(kind), int(align_corners),
                                 LAYOUTS.index(layout), np.dtype(dtype).itemsize])
    eps = np.finfo(dtype).eps
    compared = total = 0
    for case in range(8):
        x, out, scales, kwargs = upsample_case(rng, kind, dtype)
        g = rng.standard_normal(x.shape[:2] + out).astype(dtype)
        ours, theirs, magnitude, moved, same = upsample_results(x, out, scales, kwargs,
                                                                align_corners, layout, g)
        name = f"case {case}: {x.shape} -> {out}, {kwargs}"
        if x.shape[2:] != (1, 1, 1):  # PyTorch's own exception (see above)
            channels_first = pytorch_upsample(x, out, x.shape, align_corners, scales, "NCDHW",
                                              False)
            assert_same_bits(f"{name}: forward (PyTorch channels first)",
                             ours[0][:, :, same], channels_first[:, :, same])
            compared += ours[0][:, :, same].size
        total += ours[0].size
        for what, a, b, bound, extra in zip(("forward", "backward"), ours, theirs, magnitude,
                                            moved):
            excess = np.abs(a.astype(np.float64) - b) - UPSAMPLE_ULPS * eps * bound - extra
            assert excess.max() <= 0, (
                f"{name}: {what} {int((excess > 0).sum())} elements beyond "
                f"{UPSAMPLE_ULPS} eps * B (+ PyTorch's dropped weights)")
    assert compared > total / 2  # most outputs were compared bit for bit
