"""The C++ Mattes mutual information of registration (``src/cpp/mutual_information.cpp``).

The oracle is NumPy in float64: the joint histogram from the cubic B-spline evaluated at
every bin (not the kernel's four taps), the MI from it, and its gradient from the spline's
derivative at every bin; finite differences of the kernel's own value check the gradient
again. The kernel must give the same bits for every thread count and ISA.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from volsample import _cpu
from volsample._cpu import similarity as kernels

SKIP = 255  # a fixed bin index that leaves the voxel out (any index >= bins does)


def _bspline(x):
    """The cubic B-spline and its derivative."""
    a = np.abs(x)
    value = np.where(a < 1, 2 / 3 - a * a + a ** 3 / 2, np.where(a < 2, (2 - a) ** 3 / 6, 0.0))
    slope = np.where(a < 1, -2 * x + 1.5 * x * a, np.where(a < 2, -np.sign(x) * (2 - a) ** 2 / 2,
                                                             0.0))
    return value, slope


def _oracle(fixed_bins, warped, bins, low, high):
    """(MI, d MI / d warped), float64."""
    keep = fixed_bins.ravel() < bins
    f = fixed_bins.ravel()[keep].astype(np.int64)
    J = warped.ravel()[keep].astype(np.float64)
    width = (high - low) / (bins - 4)
    inside = (J > low) & (J < high)
    t = (np.clip(J, low, high) - low) / width + 2
    value, slope = _bspline(t[:, None] - np.arange(bins)[None, :])  # (voxels, bins)
    joint = np.zeros((bins, bins))
    np.add.at(joint, f, value)
    p = joint / joint.sum()
    p_f, p_m = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
    nonzero = p > 0
    mi = np.sum(p[nonzero] * np.log(p[nonzero] / (p_f * p_m)[nonzero]))
    log_ratio = np.where(nonzero, np.log(np.where(nonzero, p, 1) / np.where(p_m > 0, p_m, 1)),
                         0.0)
    grad_kept = np.sum(slope * log_ratio[f], axis=1) / (J.size * width) * inside
    grad = np.zeros(warped.size)
    grad[keep] = grad_kept
    return mi, grad.reshape(warped.shape)


def _pair(shape, dtype, bins, seed=0, skip=0.1):
    """Fixed bins (some voxels left out) and a warped volume related to them by a
    non-monotonic map, plus noise; a few intensities beyond [0, 1], to be clamped."""
    rng = np.random.default_rng(seed)
    fixed = rng.uniform(0, 1, shape)
    fixed_bins = np.minimum((fixed * bins).astype(np.uint8), bins - 1)
    fixed_bins[rng.uniform(0, 1, shape) < skip] = SKIP
    warped = np.sin(3 * fixed) ** 2 * 0.8 + 0.2 * rng.uniform(0, 1, shape)
    warped.ravel()[:: 17] += rng.choice([-0.5, 0.5], warped.ravel()[:: 17].shape)
    return fixed_bins, warped.astype(dtype)


def _run(fixed_bins, warped, bins, low=0.0, high=1.0, scale=1.0, threads=None, grad=True):
    out = np.full_like(warped, np.nan) if grad else None  # every voxel written
    if threads is None:
        value = kernels.mutual_information(fixed_bins, warped, out, bins, low, high, scale)
    else:
        value = _cpu._kernels.mutual_information(fixed_bins, warped, out, bins, low, high, scale,
                                                 threads)
    return value, out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bins", [8, 32])
@pytest.mark.parametrize("shape", [(7, 8, 9), (1, 5, 12), (20, 21, 22)])
def test_value_and_gradient_match_numpy(shape, bins, dtype):
    fixed_bins, warped = _pair(shape, dtype, bins)
    expected_value, expected_grad = _oracle(fixed_bins, warped, bins, 0.0, 1.0)
    value, grad = _run(fixed_bins, warped, bins, scale=-2.0)
    assert expected_value > 0.05  # the pair shares information
    assert grad.dtype == dtype
    assert value == pytest.approx(expected_value, rel=1e-8)
    scale = np.abs(expected_grad).max()
    rtol = 1e-5 if dtype == np.float32 else 1e-7
    np.testing.assert_allclose(grad, -2.0 * expected_grad, rtol=rtol, atol=rtol * scale)
    assert np.all(grad[fixed_bins >= bins] == 0)
    assert _run(fixed_bins, warped, bins, scale=-2.0, grad=False)[0] == value


def test_gradient_matches_finite_differences():
    fixed_bins, warped = _pair((6, 7, 8), np.float64, 16, seed=2, skip=0)
    warped = np.clip(warped, 0.01, 0.99)  # none clamped
    _, grad = _run(fixed_bins, warped, 16)
    step = 1e-6
    for index in [(0, 0, 0), (2, 3, 4), (5, 6, 7), (1, 0, 6), (4, 2, 1)]:
        plus, minus = warped.copy(), warped.copy()
        plus[index] += step
        minus[index] -= step
        numeric = (_run(fixed_bins, plus, 16, grad=False)[0]
                   - _run(fixed_bins, minus, 16, grad=False)[0]) / (2 * step)
        assert grad[index] == pytest.approx(numeric, rel=1e-4, abs=1e-9)


def test_mi_is_high_for_a_non_monotonic_map_and_low_for_a_shuffle():
    rng = np.random.default_rng(4)
    fixed = rng.uniform(0, 1, (24, 24, 24))
    fixed_bins = (fixed * 32).astype(np.uint8)
    mapped = np.sin(3 * fixed) ** 2  # no linear map of fixed
    shuffled = rng.permutation(mapped.ravel()).reshape(mapped.shape)
    high, _ = _run(fixed_bins, mapped, 32, grad=False)
    low, _ = _run(fixed_bins, shuffled, 32, grad=False)
    assert high > 1.5 and 0 <= low < 0.2


def test_clamped_intensities_have_no_gradient_and_the_range_ends_value():
    fixed_bins, warped = _pair((5, 6, 7), np.float64, 16, skip=0)
    below, above = warped < 0, warped > 1
    assert below.any() and above.any()
    value, grad = _run(fixed_bins, warped, 16)
    assert np.all(grad[below | above] == 0)
    clipped, _ = _run(fixed_bins, np.clip(warped, 0, 1), 16)
    assert clipped == value


def test_everything_left_out_gives_zero():
    fixed_bins, warped = _pair((3, 4, 5), np.float32, 16)
    value, grad = _run(np.full_like(fixed_bins, 16), warped, 16)
    assert value == 0 and np.all(grad == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(13, 17, 19), (5, 37, 61)])  # planes of 1 and 9 blocks
def test_same_bits_for_every_thread_count_and_isa(shape, dtype):
    fixed_bins, warped = _pair(shape, dtype, 32, seed=3)
    reference = _run(fixed_bins, warped, 32, threads=1)
    previous = _cpu.isa()
    try:
        for isa in _cpu.supported_isas():
            _cpu.set_isa(isa)
            for threads in (1, 2, 3, 5):
                value, grad = _run(fixed_bins, warped, 32, threads=threads)
                assert value == reference[0], (isa, threads)
                np.testing.assert_array_equal(grad, reference[1], err_msg=f"{isa}, {threads}")
    finally:
        _cpu.set_isa(previous)


@pytest.mark.parametrize("case,match", [
    ("float16", "warped must be a C-contiguous float32 or float64"),
    ("strided", "warped must be a C-contiguous float32 or float64"),
    ("bins dtype", "fixed_bins must be a C-contiguous uint8"),
    ("shape", "fixed_bins must be .* of warped's shape"),
    ("grad dtype", "grad must be"),
    ("bins", r"bins must be in \[5, 255\]"),
    ("range", "low < high"),
])
def test_kernel_rejects_operands_it_cannot_read(case, match):
    fixed_bins, warped = _pair((4, 5, 6), np.float32, 8)
    grad, bins, low, high = np.empty_like(warped), 8, 0.0, 1.0
    if case == "float16":
        warped = warped.astype(np.float16)
    elif case == "strided":
        warped = np.empty((4, 5, 12), np.float32)[..., ::2]
    elif case == "bins dtype":
        fixed_bins = fixed_bins.astype(np.int16)
    elif case == "shape":
        fixed_bins = fixed_bins[:, :, :5].copy()
    elif case == "grad dtype":
        grad = grad.astype(np.float64)
    elif case == "bins":
        bins = 256
    else:
        low = high
    with pytest.raises(ValueError, match=match):
        _cpu._kernels.mutual_information(fixed_bins, warped, grad, bins, low, high, 1.0, 1)


# ---------------------------------------------------------------------------------------
# register(loss="mi")
# ---------------------------------------------------------------------------------------


def _remapped(volume):
    """A contrast no linear map of ``volume`` gives: a smooth non-monotonic curve of its
    normalised intensities."""
    from volsample import registration

    return np.sin(3 * np.clip(registration.normalise_intensity(volume), 0, 1.2)) ** 2


def test_registering_across_contrasts_finds_the_deformation():
    from volsample import registration

    pair = registration.synthetic_pair((32, 32, 32), seed=1)
    fixed = registration.normalise_intensity(pair.fixed)
    settings = dict(levels=2, iterations=[40, 20], affine_iterations=[20, 0])
    before = registration.dice(pair.fixed_labels, pair.moving_labels)
    dice = {}
    for loss, moving in [("ncc", pair.moving), ("mi", pair.moving), ("mi", _remapped(pair.moving))]:
        result = registration.register(fixed, registration.normalise_intensity(moving), loss,
                                       **settings)
        dice[loss, moving is pair.moving] = registration.dice(
            pair.fixed_labels, result.warp(pair.moving_labels, "nearest"))
        assert result.similarity[1] > result.similarity[0]
    assert dice["mi", True] > before + 0.05
    assert abs(dice["mi", True] - dice["ncc", True]) < 0.02
    assert dice["mi", False] > before + 0.05


def test_measure_bins_a_fixed_volume_of_any_memory_order():
    from volsample import registration

    fixed = np.asfortranarray(np.random.default_rng(5).uniform(0, 1, (6, 7, 8)))
    measure = registration.similarity_measure("mi", fixed)
    assert measure.fixed_bins.flags.c_contiguous
    value, grad = measure(np.ascontiguousarray(fixed))
    assert value == registration.similarity("mi", np.ascontiguousarray(fixed), fixed)
    assert grad.shape == fixed.shape


def test_measure_counts_the_voxels_near_where_fixed_varies_alone():
    # a textured object on a flat background (a skull-stripped brain): the background far
    # from it is left out, its rim counts, and the MI is weighted by the share counted
    from volsample import registration
    from volsample.apps.registration.losses import MI_MARGIN

    rng = np.random.default_rng(6)
    shape, inner = (48, 30, 36), (slice(16, 28), slice(10, 20), slice(12, 24))
    fixed = np.zeros(shape)
    fixed[inner] = rng.uniform(0.1, 1, fixed[inner].shape)
    warped = np.clip(np.sin(3 * fixed) ** 2 + 0.1 * rng.uniform(0, 1, shape), 0, 1)
    measure = registration.similarity_measure("mi", fixed)
    value, grad = measure(warped)
    assert measure.fixed.size < 0.5 * fixed.size and grad.shape == measure.fixed.shape
    counted = np.zeros(shape, bool)  # the measure's parts, on the whole volume
    for part in measure.parts:
        counted[measure.box][part] = True
    near = tuple(slice(s.start - 1 - MI_MARGIN, s.stop + 1 + MI_MARGIN) for s in inner)
    assert counted[near].all()  # the object and its rim
    # along H and W the parts end at the margin; along D at whole slabs (all of D here)
    outside = np.ones(shape, bool)
    outside[(slice(None),) + tuple(slice(s.start - 2 - MI_MARGIN, s.stop + 2 + MI_MARGIN)
                                   for s in inner[1:])] = False
    assert outside.any() and not counted[outside].any()
    share = counted.mean()
    assert measure.share == share
    fixed_bins = np.where(counted, np.minimum(fixed * 32, 31), SKIP).astype(np.uint8)
    expected_value, expected_grad = _oracle(fixed_bins, warped, 32, 0.0, 1.0)
    assert value == pytest.approx(share * expected_value, rel=1e-8)
    np.testing.assert_allclose(grad, share * expected_grad[measure.box],
                               atol=1e-7 * share * np.abs(expected_grad).max())
    changed = warped.copy()
    changed[outside] = rng.uniform(0, 1, changed[outside].shape)
    assert measure.value(changed) == value
    rim = warped.copy()
    rim[inner[0].start - 2, inner[1], inner[2]] = 1.0  # background beside the object
    assert measure.value(rim) != value


def test_bench_contrast_pair_is_non_monotonic_and_registered_with_mi(monkeypatch, tmp_path):
    from test_register import _tiny_template_pair

    from volsample.apps import bench_register as br

    ramp = br.remap_contrast(np.linspace(0, 1, 1001).reshape(1, 1, -1)).ravel()
    peak = int(np.argmax(ramp))
    assert ramp[0] < 0.01 and 200 < peak < 800 and ramp[-1] < 0.5 * ramp[peak]
    built, calls = [], []
    pair = _tiny_template_pair()

    def template_pair(scale, contrast=False):
        built.append(contrast)
        return dataclasses.replace(pair, moving=br.remap_contrast(pair.moving))

    run_tool = br.run_tool

    def recorded(tool, pair, paths, folder, threads, register_args=()):
        calls.append(list(register_args))
        return run_tool(tool, pair, paths, folder, threads, register_args)

    monkeypatch.setattr(br, "template_pair", template_pair)
    monkeypatch.setattr(br, "run_tool", recorded)
    steps = ["--levels", "1", "--iterations", "0"]  # the plumbing: the headers' alignment
    before, result = br.run(["volsample"], 2, 1, register_args=steps, folder=str(tmp_path),
                            log=lambda row: None, contrast=True)
    assert built == [True] and calls == [["--loss", "mi", *steps]]
    assert result.dice == before.dice
    assert json.load(open(tmp_path / "volsample" / "report.json"))["similarity"]["loss"] == "mi"
