"""Tests of ``volsample register`` / ``volsample demo`` and of the registration maths.

The hand-written gradient is checked against finite differences in float64; the demo must
recover its known deformation; ``register`` must round-trip ``.npy`` and NIfTI files; bad
input must end in one line on stderr and exit code 2.
"""
from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import numpy as np
import pytest
from helpers import assert_close

from volsample import InvalidArgumentError, registration
from volsample.apps import transforms
from volsample.apps.bench_register import rotation
from volsample.cli import main
from volsample._progress import ProgressBar

# "<name>: <before> -> <after>", as the commands print their results
_CHANGE = r"^{}: (\S+) -> (\S+)$"


def _change(stdout, name):
    """The (before, after) numbers of the line ``name: before -> after``."""
    match = re.search(_CHANGE.format(re.escape(name)), stdout, re.MULTILINE)
    assert match, f"no line {name!r} in:\n{stdout}"
    return float(match.group(1)), float(match.group(2))


def _check_report(out, stderr):
    """report.png was drawn if matplotlib is installed, and a warning given otherwise."""
    if importlib.util.find_spec("matplotlib") is None:
        assert "warning: matplotlib is not installed" in stderr
        assert not (out / "report.png").exists()
    else:
        assert (out / "report.png").stat().st_size > 10_000


def _smooth_volume(shape, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return registration.blur(rng.standard_normal(shape), 1).astype(dtype)


# ---------------------------------------------------------------------------------------
# Maths
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,radius", [
    ((5, 6, 7), 1),
    ((5, 6, 7), 2),
    ((2, 9, 4), 2),  # an axis shorter than the window
])
def test_box_sum_matches_a_direct_sum(shape, radius):
    volume = np.random.default_rng(0).standard_normal(shape)
    expected = np.empty(shape)
    for index in np.ndindex(shape):
        window = tuple(slice(max(0, i - radius), i + radius + 1) for i in index)
        expected[index] = volume[window].sum()
    assert_close("box_sum", registration.box_sum(volume, radius), expected, 1e-12, 1e-12)


@pytest.mark.parametrize("channel,axis", [(0, 2), (1, 1), (2, 0)])
def test_warp_channel_x_moves_along_w(channel, axis):
    # grid channel 0 is x (array axis 2, W), 1 is y (H), 2 is z (D): a displacement of
    # one voxel reads the next voxel along that axis, exactly.
    volume = np.random.default_rng(1).standard_normal((6, 7, 8)).astype(np.float32)
    displacement = np.zeros((1, 6, 7, 8, 3), np.float32)
    displacement[..., channel] = 1
    warped = registration.warp(volume, displacement)
    inner = [slice(None)] * 3
    inner[axis] = slice(0, -1)
    shifted = [slice(None)] * 3
    shifted[axis] = slice(1, None)
    assert_close("warped", warped[tuple(inner)], volume[tuple(shifted)], 1e-6, 1e-6)


def test_refining_a_control_grid_keeps_its_displacement():
    # Splitting every cell in two (n -> 2n - 1 points) describes the same trilinear field.
    control = np.random.default_rng(2).standard_normal((1, 3, 4, 5, 3))
    fine = registration.refine(control, (5, 7, 9))
    assert_close("dense", registration.dense_displacement(fine, (17, 19, 21)),
                 registration.dense_displacement(control, (17, 19, 21)), 1e-12, 1e-12)


def test_local_ncc_is_one_for_a_linear_intensity_map_and_small_for_noise():
    fixed = np.random.default_rng(3).standard_normal((10, 10, 10))
    value, _ = registration.local_ncc(fixed, 3 * fixed + 2)
    assert value == pytest.approx(1, abs=1e-6)
    noise = np.random.default_rng(4).standard_normal(fixed.shape)
    assert registration.local_ncc(fixed, noise)[0] < 0.1


@pytest.mark.parametrize("loss", sorted(registration.SIMILARITIES))
@pytest.mark.parametrize("full_shape", [None, (13, 15, 17)],
                         ids=["finest level", "coarse level"])
def test_objective_gradient_matches_finite_differences(loss, full_shape):
    # float64 end to end: similarity -> grid_sample backward -> upsample backward, plus the
    # smoothness penalty; odd sizes so that no axis is symmetric.
    fixed, moving = _smooth_volume((7, 8, 9), 5), _smooth_volume((7, 8, 9), 6)
    control = np.random.default_rng(7).uniform(-1, 1, (1, 3, 4, 3, 3))
    kwargs = dict(loss=loss, weight=0.3, full_shape=full_shape, window=3)
    _, grad, _ = registration.objective(control, fixed, moving, **kwargs)
    assert grad.dtype == np.float64 and grad.shape == control.shape
    eps = 1e-6
    numeric = np.empty_like(control)
    for index in np.ndindex(control.shape):
        plus, minus = control.copy(), control.copy()
        plus[index] += eps
        minus[index] -= eps
        numeric[index] = (registration.objective(plus, fixed, moving, **kwargs)[0]
                          - registration.objective(minus, fixed, moving, **kwargs)[0]) / (2 * eps)
    scale = np.abs(numeric).max()
    assert scale > 0
    assert_close("d objective / d control", grad, numeric, 1e-5, 1e-6 * scale)


def _two_grids():
    """Two volumes on different grids (shapes, voxel sizes, orientations) with affines."""
    fixed, moving = _smooth_volume((7, 8, 9), 10), _smooth_volume((6, 9, 5), 11)
    fixed_affine = np.eye(4)
    fixed_affine[:3, :3] = np.diag([2.0, -1.5, 2.5])
    fixed_affine[:3, 3] = (-6, 5, -10)
    moving_affine = np.eye(4)
    moving_affine[:3, :3] = rotation((0.1, -0.2, 0.3)) @ np.diag([2.5, 2.0, 3.0])
    moving_affine[:3, 3] = (-8, -7, -6)
    return fixed, fixed_affine, moving, moving_affine


def test_frame_maps_world_points_as_the_affines_say():
    """theta = the fixed grid's normalised coordinates -> world (fixed affine) -> T -> the
    moving grid's normalised coordinates: checked point by point, and its gradient map."""
    fixed, fixed_affine, moving, moving_affine = _two_grids()
    frame = registration.Frame.of(fixed.shape, fixed_affine, moving.shape, moving_affine)
    params = registration.IDENTITY_PARAMS + np.random.default_rng(12).normal(0, 0.1, (3, 4))
    T = frame.transform(params)
    theta = frame.theta(params)[0].astype(np.float64)
    for index in [(0, 0, 0), (6, 7, 8), (3, 2, 5)]:
        world = fixed_affine @ np.append(index, 1)
        voxel = np.linalg.inv(moving_affine) @ T @ world  # where it lands in moving (i, j, k)
        normalised = np.linalg.inv(registration.grid_to_voxel(fixed.shape)) @ np.append(index, 1)
        expected = np.linalg.inv(registration.grid_to_voxel(moving.shape)) @ voxel
        assert_close(f"point {index}", theta @ normalised, expected[:3], 1e-6, 1e-6)
    # the affine's own gradient, through theta: d<G, theta(S)>/dS by finite differences
    G = np.random.default_rng(13).normal(size=(1, 3, 4))
    numeric = np.empty((3, 4))
    for index in np.ndindex(3, 4):
        step = np.zeros((3, 4))
        step[index] = 1e-6
        plus = (frame.left @ np.vstack([params + step, [0, 0, 0, 1]]) @ frame.right)[:3]
        minus = (frame.left @ np.vstack([params - step, [0, 0, 0, 1]]) @ frame.right)[:3]
        numeric[index] = (G[0] * (plus - minus)).sum() / 2e-6
    assert_close("gradient", frame.gradient(G), numeric, 1e-6, 1e-8)


@pytest.mark.parametrize("loss", sorted(registration.SIMILARITIES))
@pytest.mark.parametrize("interp", registration.INTERPOLATIONS)
def test_affine_objective_gradient_matches_finite_differences(loss, interp):
    # float64 end to end: similarity -> warp_3d_backward's grad_theta -> the frame's chain
    fixed, fixed_affine, moving, moving_affine = _two_grids()
    moving = registration.interpolant(moving, interp)
    frame = registration.Frame.of(fixed.shape, fixed_affine, moving.shape, moving_affine)
    params = registration.IDENTITY_PARAMS + np.random.default_rng(14).normal(0, 0.05, (3, 4))
    value = lambda p: registration.affine_objective(p, fixed, moving, frame, loss, window=3,
                                                    interp=interp)
    _, grad, _ = value(params)
    eps = 1e-6
    numeric = np.empty((3, 4))
    for index in np.ndindex(3, 4):
        plus, minus = params.copy(), params.copy()
        plus[index] += eps
        minus[index] -= eps
        numeric[index] = (value(plus)[0] - value(minus)[0]) / (2 * eps)
    assert_close("d objective / d params", grad, numeric, 1e-5, 1e-6 * np.abs(numeric).max())


@pytest.mark.parametrize("interp", registration.INTERPOLATIONS)
def test_deformable_objective_through_an_affine_matches_finite_differences(interp):
    """float64 volumes on different grids, a non-identity theta: the displacement enters
    through theta's linear part, and its gradient comes back through it."""
    fixed, fixed_affine, moving, moving_affine = _two_grids()
    moving = registration.interpolant(moving, interp)
    frame = registration.Frame.of(fixed.shape, fixed_affine, moving.shape, moving_affine)
    theta = frame.theta(registration.IDENTITY_PARAMS).astype(np.float64)
    control = np.random.default_rng(15).uniform(-1, 1, (1, 3, 3, 4, 3))
    kwargs = dict(loss="mse", weight=0.2, theta=theta, window=3, interp=interp)
    _, grad, _ = registration.objective(control, fixed, moving, **kwargs)
    eps = 1e-6
    numeric = np.empty_like(control)
    for index in np.ndindex(control.shape):
        plus, minus = control.copy(), control.copy()
        plus[index] += eps
        minus[index] -= eps
        numeric[index] = (registration.objective(plus, fixed, moving, **kwargs)[0]
                          - registration.objective(minus, fixed, moving, **kwargs)[0]) / (2 * eps)
    assert_close("d objective / d control", grad, numeric, 1e-5,
                 1e-6 * np.abs(numeric).max())


def test_dice_and_deformation_error_exact_cases():
    a = np.zeros((2, 2, 2), int)
    b = np.zeros((2, 2, 2), int)
    a[0, 0, :2] = 1  # label 1: two voxels in a, one of them in b
    b[0, 0, 0] = 1
    a[1] = 2  # label 2: identical, four voxels
    b[1] = 2
    assert registration.dice(a, b) == pytest.approx((2 * 1 / 3 + 1) / 2)
    # the counting path (small integer ranges) and the per-label one agree; labels <= 0
    # and labels absent from both maps do not count
    rng = np.random.default_rng(70)
    x, y = rng.integers(-2, 6, (9, 10, 11)), rng.integers(-2, 6, (9, 10, 11))
    y[y == 4] = 5  # label 4 only in x
    expected = np.mean([2 * np.sum((x == k) & (y == k)) / (np.sum(x == k) + np.sum(y == k))
                        for k in (1, 2, 3, 4, 5)])
    assert registration.dice(x.astype(np.int16), y.astype(np.int16)) == pytest.approx(expected)
    assert registration.dice(x.astype(np.float32), y.astype(np.float32)) == pytest.approx(expected)
    # a range counted in one joint histogram (more labels than are compared one by one),
    # then in three passes (over the joint histogram's), then one too wide to count: per
    # label
    many = x.astype(np.int16) * 20
    assert registration.dice(many, y.astype(np.int16) * 20) == pytest.approx(expected)
    spread = x.astype(np.int32) * 500
    assert registration.dice(spread, y.astype(np.int32) * 500) == pytest.approx(expected)
    wide = x.astype(np.int32) * 100_000
    assert registration.dice(wide, y.astype(np.int32) * 100_000) == pytest.approx(expected)
    truth = np.zeros((2, 2, 2, 3))
    found = np.zeros((2, 2, 2, 3))
    found[..., 0], found[..., 1] = 3, 4  # 5 voxels off everywhere
    found[0, 0, 0] = 0
    mask = a > 0
    assert registration.deformation_error(found, truth, mask) == pytest.approx((5 * 5 + 0) / 6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(loss="l1"), "loss: expected one of 'mse', 'ncc', 'mi', got 'l1'"),
    (dict(levels=0), "levels: expected an int >= 1"),
    (dict(iterations=[5, 5]), "iterations: expected an int >= 0 or 3 of them"),
    (dict(grid_spacing=0), "grid_spacing: expected a number > 0"),
    (dict(weight=-1), "weight: expected a number >= 0"),
    (dict(window=4), "window: expected an odd int >= 1"),
    (dict(interp="nearest"), "interp: expected one of 'bilinear', 'bicubic', 'bspline', got "
                             "'nearest'"),
])
def test_register_rejects_bad_arguments(kwargs, match):
    volume = _smooth_volume((6, 6, 6), 8, np.float32)
    with pytest.raises(ValueError, match=re.escape(match)):
        registration.register(volume, volume, **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(fixed_affine=np.eye(3)), "fixed_affine: expected an invertible 4x4 affine"),
    (dict(moving_affine=np.diag([1.0, 0, 1, 1])), "moving_affine: expected an invertible 4x4"),
    (dict(affine_iterations=[1, 2]), "affine_iterations: expected an int >= 0 or 3 of them"),
    (dict(initial_affine=np.diag([1.0, 1, 0, 1])), "initial_affine: expected an invertible 4x4"),
    (dict(initial_affine="no-such-affine.tfm"), "initial_affine: no-such-affine.tfm: not an "
                                                "affine transform file"),
])
def test_register_rejects_bad_affines(kwargs, match):
    volume = _smooth_volume((6, 6, 6), 8, np.float32)
    with pytest.raises(ValueError, match=re.escape(match)):
        registration.register(volume, volume[:, :5], **kwargs)


def test_register_starts_its_affine_stage_from_the_initial_affine(tmp_path):
    # With no affine steps the result's transform is the initial affine (an array, or the
    # file register writes); with steps it starts there: a moving volume under a known
    # affine is found closer than from the headers.
    rng = np.random.default_rng(3)
    fixed = _smooth_volume((20, 22, 18), 11, np.float32)
    known = np.eye(4)
    known[:3, :3] = rotation(rng.uniform(-0.15, 0.15, 3))
    known[:3, 3] = rng.uniform(-2, 2, 3)
    transforms.write_itk_affine(str(tmp_path / "known.tfm"), known)
    for initial in (known, str(tmp_path / "known.tfm")):
        result = registration.register(fixed, fixed, iterations=0, affine_iterations=0,
                                       levels=1, initial_affine=initial)
        np.testing.assert_allclose(result.transform, known, atol=1e-12)
    moving = registration.register(fixed, fixed, iterations=0, affine_iterations=0, levels=1,
                                   initial_affine=np.linalg.inv(known)).warped
    errors = {}
    for start in (None, known):
        result = registration.register(fixed, moving, iterations=0, affine_iterations=5,
                                       levels=1, initial_affine=start)
        errors[start is None] = np.abs(result.transform - known)[:3].max()
    assert errors[False] < errors[True]


def _total_displacement(out, shape):
    """T(p + d(p)) - p in voxels along the array axes, from affine.txt and displacement.npy
    (identity affines: world millimetres are voxels)."""
    transform = np.loadtxt(out / "affine.txt")
    points = np.stack(np.meshgrid(*(np.arange(n) for n in shape), indexing="ij"), -1)
    moved = points + np.load(out / "displacement.npy")
    return moved @ transform[:3, :3].T + transform[:3, 3] - points


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def test_demo_recovers_the_known_deformation(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    stdout = captured.out
    error_before, error_after = _change(stdout, "deformation error (voxels)")
    assert error_before > 0.5 and error_after < 0.5 * error_before
    dice_before, dice_after = _change(stdout, "dice")
    assert dice_after > dice_before + 0.1
    ncc_before, ncc_after = _change(stdout, "similarity (ncc)")
    assert ncc_after > ncc_before
    assert stdout.strip().splitlines()[-1].startswith("similarity (ncc): ")
    shape = np.load(out / "fixed.npy").shape
    assert np.load(out / "warped.npy").shape == shape
    assert np.load(out / "displacement.npy").shape == shape + (3,)
    _check_report(out, captured.err)


@pytest.fixture(scope="module")
def pair():
    # A non-cubic phantom, so that a mixed-up axis order shows.
    return registration.synthetic_pair((22, 18, 20))


def _register_args(fixed, moving, out, *extra):
    return ["register", str(fixed), str(moving), "--out", str(out), "--no-progress",
            "--levels", "2", "--iterations", "30", *map(str, extra)]


def test_bspline_interpolant_gives_the_voxels_back():
    """Sampled at its own voxel centres, the bspline interpolant is the volume (the
    coefficients differ from it)."""
    volume = _smooth_volume((6, 7, 5), 16)
    coefficients = registration.interpolant(volume, "bspline")
    assert not np.allclose(coefficients, volume)
    assert registration.interpolant(volume, "bicubic") is volume
    identity = np.eye(3, 4)[None]
    sampled = registration.objectives._sample(coefficients, identity, None, volume.shape,
                                             "bspline")
    assert_close("voxels", sampled, volume, 1e-12, 1e-12)


@pytest.mark.parametrize("loss,levels", [("ncc", 1), ("ncc", 2), ("mse", 2)])
def test_register_scores_the_headers_alignment_and_its_result(monkeypatch, loss, levels):
    # The result's similarity (the last level's measure, made for its steps or after
    # none, the box warped part by part) is what the measure of the whole volumes says;
    # warp() samples where the result's moved displacement says, kept or made again.
    monkeypatch.setattr(registration.losses, "_SLAB_PLANES", 4)  # several slabs
    affine = np.diag([1.1, 1.0, 0.9, 1.0])
    fixed = _brain_on_flat_background((36, 30, 34), 70).astype(np.float32)
    moving = np.ascontiguousarray(fixed[::-1])
    result = registration.register(fixed, moving, loss, fixed_affine=affine,
                                   moving_affine=affine, levels=levels, affine_iterations=3,
                                   iterations=[4] * (levels - 1) + [0 if levels == 1 else 3])
    before = registration.resample(fixed.shape, affine, moving, affine)
    expected = (registration.similarity(loss, fixed, before),
                registration.similarity(loss, fixed, result.warped))
    assert result.similarity == pytest.approx(expected, rel=1e-5)
    assert result.similarity[0] != pytest.approx(result.similarity[1], rel=1e-3)
    kept = result.warp(moving)
    np.testing.assert_array_equal(kept, result.warped)
    result.moved = None
    np.testing.assert_array_equal(result.warp(moving), kept)


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory, pair):
    folder = tmp_path_factory.mktemp("pair")
    paths = {name: folder / f"{name}.npy" for name in ("fixed", "moving")}
    for name, path in paths.items():
        np.save(path, getattr(pair, name))
    return paths


def _register_npy(paths, out, interp):
    assert main(_register_args(paths["fixed"], paths["moving"], out, "--loss", "mse",
                               "--interp", interp)) == 0
    return np.load(out / "warped.npy"), np.load(out / "displacement.npy")


@pytest.fixture(scope="module")
def linear_run(tmp_path_factory, pair_files):
    return _register_npy(pair_files, tmp_path_factory.mktemp("linear"), "linear")


@pytest.mark.parametrize("interp", ["bicubic", "bspline"])
def test_register_cubic_interp(tmp_path, capsys, pair_files, linear_run, interp):
    """--interp bicubic|bspline registers the synthetic pair (the MSE halves, as linear's
    does) sampling the moving volume in that mode, and gives a result of its own (the
    warped volume and the displacement found differ from linear's)."""
    linear = linear_run
    capsys.readouterr()
    cubic = _register_npy(pair_files, tmp_path / interp, interp)
    mse_before, mse_after = _change(capsys.readouterr().out, "similarity (mse)")
    assert mse_after < 0.5 * mse_before
    for what, a, b in zip(("warped", "displacement"), cubic, linear):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.abs(a - b).max() > 1e-3 * np.abs(b).max(), what


def test_register_npy_round_trip(tmp_path, capsys, pair):
    paths = {}
    for name in ("fixed", "moving", "fixed_labels", "moving_labels"):
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], getattr(pair, name))
    out = tmp_path / "out"
    code = main(_register_args(paths["fixed"], paths["moving"], out, "--loss", "mse", "--labels",
                               paths["fixed_labels"], paths["moving_labels"]))
    assert code == 0
    captured = capsys.readouterr()
    stdout = captured.out
    mse_before, mse_after = _change(stdout, "similarity (mse)")
    assert mse_after < 0.5 * mse_before
    assert stdout.strip().splitlines()[-1].startswith("similarity (mse): ")
    dice_before, dice_after = _change(stdout, "dice")
    assert dice_after > dice_before
    warped = np.load(out / "warped.npy")
    assert warped.shape == pair.fixed.shape and warped.dtype == np.float32
    labels = np.load(out / "warped_labels.npy")
    assert labels.dtype == pair.moving_labels.dtype
    assert set(np.unique(labels)) <= set(np.unique(pair.moving_labels))
    # Components in array-axis order (identity affines: millimetres are voxels); the map
    # written, T(p + d(p)), is closer to the truth than none.
    displacement = np.load(out / "displacement.npy")
    assert displacement.shape == pair.fixed.shape + (3,)
    total = _total_displacement(out, pair.fixed.shape)
    inside = pair.fixed_labels > 0
    assert (registration.deformation_error(total, pair.displacement, inside)
            < 0.6 * registration.deformation_error(0 * total, pair.displacement, inside))
    _check_report(out, captured.err)


def test_register_nifti_round_trip(tmp_path, capsys, pair):
    nib = pytest.importorskip("nibabel")
    affine = np.array([[0, 0, 1.5, -10], [0, 2, 0, 5], [2.5, 0, 0, 7], [0, 0, 0, 1]])
    fixed, moving = tmp_path / "fixed.nii", tmp_path / "moving.nii.gz"
    nib.save(nib.Nifti1Image(pair.fixed, affine), fixed)
    # int16 with a scale factor: read through it, into the same intensities
    nib.save(nib.Nifti1Image((pair.moving * 1000).astype(np.int16), affine), moving)
    labels = [tmp_path / "fixed_labels.nii.gz", tmp_path / "moving_labels.nii.gz"]
    for path, data in zip(labels, (pair.fixed_labels, pair.moving_labels)):
        nib.save(nib.Nifti1Image(data.astype(np.float32), affine), path)  # float, as often
    out = tmp_path / "out"
    assert main(_register_args(fixed, moving, out, "--labels", *labels)) == 0
    stdout = capsys.readouterr().out
    dice_before, dice_after = _change(stdout, "dice")
    assert dice_after > dice_before
    ncc_before, ncc_after = _change(stdout, "similarity (ncc)")
    assert ncc_after > ncc_before
    assert stdout.strip().splitlines()[-1].startswith("similarity (ncc): ")
    warped = nib.load(out / "warped.nii.gz")
    assert warped.shape == pair.fixed.shape
    assert_close("affine", warped.affine, affine, 0, 1e-6)
    displacement = nib.load(out / "displacement.nii.gz")
    assert displacement.shape == pair.fixed.shape + (3,)
    assert_close("affine", displacement.affine, affine, 0, 1e-6)
    # warped keeps the moving volume's intensity units
    assert 500 < warped.get_fdata().max() <= 1000
    warped_labels = nib.load(out / "warped_labels.nii.gz")
    assert warped_labels.get_data_dtype() == np.int32
    assert set(np.unique(warped_labels.dataobj)) <= set(np.unique(pair.moving_labels))
    assert np.loadtxt(out / "affine.txt").shape == (4, 4)
    assert (out / "affine_itk.tfm").exists()
    assert nib.load(out / "displacement_itk.nii.gz").shape == pair.fixed.shape + (1, 3)


def test_register_nibabel_pair_on_different_grids(tmp_path, capsys):
    """As a new user would: nibabel's anatomical.nii (33x41x25, 2 mm, LAS) against
    reoriented_anat_moved.nii (21x26x22, 4 mm, RAS), the same head moved by a known world
    affine E (rotations 0.1, 0.2, 0.3 rad about x, y, z, then 3, 4, 5 mm: nibabel's
    make_moved_anat.py). The headers start it; the affine stage finds E to about a fixed
    voxel at the field of view's corners, and the outputs are on FIXED's grid."""
    nib = pytest.importorskip("nibabel")
    data = pathlib.Path(nib.__file__).parent / "tests" / "data"
    fixed, moving = data / "anatomical.nii", data / "reoriented_anat_moved.nii"
    if not (fixed.exists() and moving.exists()):
        pytest.skip("nibabel's test data are not installed")
    out = tmp_path / "out"
    assert main(["register", str(fixed), str(moving), "--out", str(out), "--no-progress",
                 "--levels", "2", "--iterations", "10", "--affine-iterations", "60", "30"]) == 0
    ncc_before, ncc_after = _change(capsys.readouterr().out, "similarity (ncc)")
    assert ncc_before < 0.2 and ncc_after > 0.4
    reference = nib.load(fixed)
    for name in ("warped", "displacement"):
        image = nib.load(out / f"{name}.nii.gz")
        assert image.shape[:3] == reference.shape
        assert_close(f"{name} affine", image.affine, reference.affine, 0, 1e-6)
    from nibabel.affines import from_matvec
    from nibabel.eulerangles import euler2mat

    E = from_matvec(euler2mat(0.1, 0.2, 0.3), [3, 4, 5])  # as make_moved_anat.py builds it
    T = np.loadtxt(out / "affine.txt")
    D, H, W = reference.shape
    corners = np.array([(i, j, k, 1) for i in (0, D - 1) for j in (0, H - 1) for k in (0, W - 1)])
    world = corners @ reference.affine.T
    assert np.abs(world @ E.T - world).max() > 8  # the headers alone are far off
    assert np.abs(world @ T.T - world @ E.T).max() < 3  # mm: 1.5 fixed voxels


@pytest.mark.parametrize("shape,iterations,expected", [
    ((197, 233, 189), [100, 50, 25], [100, 0, 0]),  # MNI152 at 1 mm: 50x59x48 at its coarsest
    ((99, 117, 95), [100, 50, 25], [100, 50, 0]),   # 25x30x24, then 50x59x48
    ((33, 41, 25), [100, 50], [100, 50]),           # nibabel's head: 17x21x13, then 33x41x25
    ((33, 41, 25), [60, 30, 20], [60, 30, 20]),
    ((20, 22, 18), [9], [9]),                       # one level: its steps, however small
])
def test_default_affine_steps_run_up_to_a_level_of_enough_voxels(shape, iterations, expected):
    assert registration.default_affine_iterations(shape, iterations) == expected


@pytest.mark.parametrize("levels,loss,expected", [
    (3, "ncc", [100, 50, 25]), (5, "mse", [100, 50, 25, 12, 10]), (1, "ncc", [100]),
    (3, "mi", [100, 50, 10]), (2, "mi", [100, 10]), (1, "mi", [100]),
])
def test_default_steps_halve_per_level_and_mi_takes_10_at_the_finest(levels, loss, expected):
    assert registration.default_iterations(levels, loss) == expected


@pytest.mark.parametrize("loss,steps", [("ncc", [100, 50]), ("mi", [100, 10])])
def test_register_command_takes_the_default_steps(tmp_path, monkeypatch, loss, steps):
    seen = {}

    def register(fixed, moving, loss, **settings):
        seen.update(settings)
        raise InvalidArgumentError("stop here")

    monkeypatch.setattr(registration, "register", register)
    volume = _smooth_volume((33, 41, 25), 0, np.float32)
    np.save(tmp_path / "f.npy", volume)
    np.save(tmp_path / "m.npy", volume)
    assert main(["register", str(tmp_path / "f.npy"), str(tmp_path / "m.npy"),
                 "--out", str(tmp_path / "out"), "--levels", "2", "--loss", loss,
                 "--no-progress"]) == 2
    assert seen["iterations"] == steps
    assert seen["affine_iterations"] == registration.default_affine_iterations(
        (33, 41, 25), steps) == steps
    assert main(["register", str(tmp_path / "f.npy"), str(tmp_path / "m.npy"),
                 "--out", str(tmp_path / "out"), "--levels", "2", "--loss", loss,
                 "--iterations", "7", "--no-progress"]) == 2
    assert seen["iterations"] == [7, 7]


def test_register_without_matplotlib_warns_and_writes_the_volumes(tmp_path, capsys,
                                                                    monkeypatch, pair):
    # A None entry makes the import fail, even of a submodule imported before.
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    np.save(tmp_path / "f.npy", pair.fixed)
    np.save(tmp_path / "m.npy", pair.moving)
    out = tmp_path / "out"
    assert main(["register", str(tmp_path / "f.npy"), str(tmp_path / "m.npy"), "--out", str(out),
                 "--levels", "1", "--iterations", "2", "--no-progress"]) == 0
    captured = capsys.readouterr()
    warning = [line for line in captured.err.splitlines() if "matplotlib is not installed" in line]
    assert len(warning) == 1 and "pip install matplotlib" in warning[0]
    assert (out / "warped.npy").exists() and not (out / "report.png").exists()
    assert captured.out.strip().splitlines()[-1].startswith("similarity (ncc): ")


def _write(path, array):
    np.save(path, array)
    return str(path)


@pytest.mark.parametrize("case,match", [
    ("missing", "FIXED: no such file"),
    ("extension", "FIXED: expected a .nii, .nii.gz or .npy file, got"),
    ("corrupt", "FIXED: cannot read"),
    ("2-D", "FIXED: expected a 3-D volume, got shape (6, 6)"),
    ("complex", "FIXED: expected real numbers, got dtype complex128"),
    ("nan", "MOVING: expected finite values, got NaN or inf"),
    ("labels", "moving_labels.npy: expected the shape of moving.npy, (6, 6, 6), got (5, 6, 6)"),
    ("fraction labels", "fixed_labels.npy: expected integer labels, got fractions"),
    ("empty labels", "fixed_labels.npy: expected some label > 0, got none"),
    ("constant", "FIXED: expected a volume with some contrast, got the constant 3.0"),
    ("iterations", "iterations: expected an int >= 0 or 2 of them (one per level), got [5, 5, 5]"),
    ("no nibabel", "reading and writing NIfTI files needs nibabel: pip install nibabel"),
    ("initial affine", "--initial-affine: "),
    ("singular initial affine", "--initial-affine: "),
])
def test_register_errors_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch, case, match):
    volume = _smooth_volume((6, 6, 6), 9, np.float32)
    fixed = _write(tmp_path / "fixed.npy", volume)
    moving = _write(tmp_path / "moving.npy", volume)
    extra = []
    if case == "missing":
        fixed = str(tmp_path / "absent.npy")
    elif case == "extension":
        fixed = str(tmp_path / "fixed.txt")
    elif case == "corrupt":
        (tmp_path / "fixed.npy").write_bytes(b"not an array")
    elif case == "2-D":
        fixed = _write(tmp_path / "fixed.npy", volume[0])
    elif case == "complex":
        fixed = _write(tmp_path / "fixed.npy", volume.astype(complex))
    elif case == "nan":
        volume[1, 2, 3] = np.nan
        moving = _write(tmp_path / "moving.npy", volume)
    elif case in ("labels", "fraction labels", "empty labels"):
        labels = np.zeros((6, 6, 6))
        labels[2:4] = {"labels": 1, "fraction labels": 1.5, "empty labels": 0}[case]
        extra = ["--labels", _write(tmp_path / "fixed_labels.npy", labels),
                 _write(tmp_path / "moving_labels.npy",
                        labels[:5] if case == "labels" else labels)]
    elif case == "constant":
        fixed = _write(tmp_path / "fixed.npy", np.full((6, 6, 6), 3.0))
    elif case == "iterations":
        extra = ["--levels", "2", "--iterations", "5", "5", "5"]
    elif case in ("initial affine", "singular initial affine"):
        path = tmp_path / "affine.txt"
        path.write_text("not a transform" if case == "initial affine" else
                        "1 0 0 0\n0 1 0 0\n0 0 0 0\n0 0 0 1\n")
        extra = ["--initial-affine", str(path)]
        match += f"{path}: " + ("not an affine transform file" if case == "initial affine"
                                else "the affine is singular")
    elif case == "no nibabel":
        monkeypatch.setitem(sys.modules, "nibabel", None)
        fixed = str(tmp_path / "fixed.nii.gz")
        (tmp_path / "fixed.nii.gz").write_bytes(b"")
    out = tmp_path / "out"
    assert main(["register", fixed, moving, "--out", str(out), "--no-progress", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("volsample register: error: ")
    assert match in lines[0]
    assert not out.exists()


def test_progress_bar_counts_to_the_end(capsys):
    bar = ProgressBar(total=3, enabled=True)
    for label in ("level 1/2", "level 1/2", "level 2/2 similarity 0.5"):
        bar.step(label)
    bar.close()
    err = capsys.readouterr().err
    assert "3/3" in err and "level 2/2 similarity 0.5" in err and err.endswith("\n")


def test_progress_bar_disabled_prints_nothing(capsys):
    bar = ProgressBar(total=3, enabled=False)
    bar.step("level 1/2")
    bar.close()
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------
# The registration benchmark's scoring (volsample bench --register); no nilearn, no ANTs
# ---------------------------------------------------------------------------------------


def _tiny_template_pair():
    """A TemplatePair built like the benchmark's, on a smooth random volume instead of the
    MNI template: fixed 2 mm, moving 3 mm, the known map moving it."""
    from volsample.apps import bench_register as br

    shape = (20, 22, 18)
    fixed = _smooth_volume(shape, 20, np.float32)
    fixed_affine = np.diag([2.0, 2.0, 2.0, 1.0])
    fixed_affine[:3, 3] = (-20, -22, -18)
    centre = fixed_affine[:3, :3] @ ((np.array(shape) - 1) / 2) + fixed_affine[:3, 3]
    known = br.KnownMap.default(centre)
    labels = np.where(fixed > 0.05, 1, np.where(fixed < -0.05, 2, 0)).astype(np.int16)
    moving_shape = (13, 15, 12)
    moving_affine = np.diag([3.0, 3.0, 3.0, 1.0])
    moving_affine[:3, 3] = fixed_affine[:3, 3]
    points = known(br._world(moving_shape, moving_affine))
    moving = br._sample(fixed, fixed_affine, points, 1).astype(np.float32)
    moving_labels = br._sample(labels, fixed_affine, points, 0).astype(np.int16)
    brain = np.zeros(shape, bool)
    brain[4:-4, 4:-4, 4:-4] = True
    return br.TemplatePair(fixed, fixed_affine, labels, brain, moving, moving_affine,
                           moving_labels, known)


def test_bench_map_error_is_zero_for_the_known_maps_inverse():
    # psi = phi^-1 on the fixed grid (Newton steps on phi(y) = x) scores 0; psi = the
    # identity scores the unregistered error, the known map's mean move (several mm).
    from volsample.apps import bench_register as br

    pair = _tiny_template_pair()
    x = br._world(pair.fixed.shape, pair.fixed_affine)
    y = x.copy()
    inverse_linear = np.linalg.inv(pair.known.linear)
    for _ in range(30):
        y -= (pair.known(y) - x) @ inverse_linear.T
    assert br.map_error(pair, y) < 1e-6
    moved = np.linalg.norm(pair.known(x) - x, axis=-1)[pair.brain].mean()
    assert moved > 3
    assert br.map_error(pair, x) == pytest.approx(moved, rel=1e-12)


def test_bench_dice_per_label_exact_case():
    from volsample.apps import bench_register as br

    a = np.array([0, 1, 1, 2, 2, 2])
    b = np.array([1, 1, 0, 2, 2, 1])
    assert br.dice_per_label(a, b) == {1: pytest.approx(2 * 1 / (2 + 3)),
                                       2: pytest.approx(2 * 2 / (3 + 2))}


def test_bench_volsample_with_no_steps_scores_as_the_headers(tmp_path):
    # volsample register with every step count 0 keeps T = I and d = 0: its files, read
    # back by the benchmark (psi = T(x + d(x)), the labels warped nearest), must score
    # exactly as the headers' alignment does; the child reports its peak memory.
    from volsample.apps import bench_register as br

    pair = _tiny_template_pair()
    paths = br.write_pair(pair, str(tmp_path))
    before = br.unregistered(pair)
    run = br.run_tool("volsample", pair, paths, str(tmp_path), 1,
                      ["--levels", "1", "--iterations", "0", "--affine-iterations", "0"])
    assert run.dice == before.dice
    assert run.error_mm == pytest.approx(before.error_mm, rel=1e-5)
    assert run.peak_mb > 10 and run.wall_s > 0
    registered = br.run_tool("volsample", pair, paths, str(tmp_path), 1,
                             ["--levels", "2", "--iterations", "30"])
    assert registered.error_mm < before.error_mm
    table = br.format_table([before, run, registered])
    assert "volsample" in table and "before" in table


@pytest.mark.parametrize("loss", sorted(registration.SIMILARITIES))
def test_similarity_value_alone_matches_the_value_with_its_gradient(loss):
    # value() takes a leaner path (no gradient buffers) than a call; the two must agree.
    fixed, warped = _smooth_volume((9, 10, 11), 30, np.float32), _smooth_volume((9, 10, 11), 31, np.float32)
    measure = registration.similarity_measure(loss, fixed, 3)
    value, grad = measure(warped)
    assert grad.shape == warped.shape
    assert measure.value(warped) == pytest.approx(value, rel=1e-6)
    assert registration.similarity(loss, fixed, warped, 3) == pytest.approx(value, rel=1e-6)


def test_bench_register_without_nilearn_is_one_line_and_exit_2(monkeypatch, capsys):
    from volsample.apps import bench_register as br

    def missing():
        raise ImportError("the registration benchmark needs nilearn's MNI152 template: "
                          "pip install nilearn")

    monkeypatch.setattr(br, "template_files", missing)
    assert main(["bench", "--register", "--register-scale", "2", "--threads", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        "volsample bench: error: the registration benchmark needs nilearn's MNI152 template: "
        "pip install nilearn"]
    assert "registration benchmark" in captured.out


def test_nifti_gzip_written_on_threads_is_one_gzip_member_of_the_same_bytes(tmp_path):
    # Several chunks deflated apart (and a partial last one) must join into one valid gzip
    # stream: Python's gzip and nibabel read back exactly what nibabel would write.
    gzip = pytest.importorskip("gzip")
    nib = pytest.importorskip("nibabel")
    from volsample.apps import gzip_stream

    rng = np.random.default_rng(50)
    data = rng.standard_normal((97, 101, 103)).astype(np.float32)  # 4.03 MB: over 4 MiB
    data[:30] = 0  # runs, which Z_RLE codes as such
    image = nib.Nifti1Image(data, np.diag([1.5, 2.0, 2.5, 1.0]))
    path = tmp_path / "volume.nii.gz"
    with open(path, "wb") as file, gzip_stream.ParallelGzip(file) as stream:
        image.to_stream(stream)
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    import zlib
    member = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert member.decompress(raw) == image.to_bytes() and member.eof and not member.unused_data
    assert gzip.decompress(raw) == image.to_bytes()
    back = nib.load(path)
    np.testing.assert_array_equal(np.asarray(back.dataobj), data)
    np.testing.assert_array_equal(back.affine, image.affine)


@pytest.mark.parametrize("kind", ["noise", "labels"])
def test_nifti_gzip_stores_what_barely_compresses_and_deflates_the_rest(tmp_path, kind):
    # Float noise (a field's low mantissa bits) shrinks by under an eighth: stored blocks,
    # a little over the raw bytes; a label map's runs deflate to a fraction. Both read back.
    nib = pytest.importorskip("nibabel")
    from volsample.apps import gzip_stream

    rng = np.random.default_rng(51)
    shape = (90, 100, 120)  # 4.3 MB of float32: two chunks
    if kind == "noise":
        data = rng.standard_normal(shape).astype(np.float32)
    else:
        data = np.zeros(shape, np.int16)
        data[20:70, 30:80, 40:100] = rng.integers(1, 3, (1, 1, 60), dtype=np.int16)
    image = nib.Nifti1Image(data, np.eye(4))
    path = tmp_path / "volume.nii.gz"
    with open(path, "wb") as file, gzip_stream.ParallelGzip(file) as stream:
        image.to_stream(stream)
    size, raw = path.stat().st_size, len(image.to_bytes())
    if kind == "noise":
        assert raw < size < raw * 1.01
    else:
        assert size < raw / 10
    np.testing.assert_array_equal(np.asarray(nib.load(path).dataobj), data)


def _brain_on_flat_background(shape, seed):
    """A smooth volume inside an ellipsoid, exactly 0 around it (as a skull-stripped
    template is), so that the local NCC's box is a part of the volume."""
    volume = _smooth_volume(shape, seed) + 2
    index = np.indices(shape) - (np.array(shape) - 1)[:, None, None, None] / 2
    radii = np.array(shape)[:, None, None, None] * np.array([0.2, 0.18, 0.2])[:, None, None, None]
    volume[np.sum((index / radii) ** 2, axis=0) > 1] = 0
    return volume


def test_local_ncc_box_holds_every_window_that_counts():
    fixed = _brain_on_flat_background((30, 28, 32), 60)
    warped = _smooth_volume(fixed.shape, 61)
    cropped, whole = (registration.LocalNCC(fixed, 5, crop=crop) for crop in (True, False))
    assert np.prod(cropped.fixed.shape) < 0.6 * fixed.size  # the box is a part
    value, grad = cropped(warped)
    expected_value, expected_grad = whole(warped)
    assert value == pytest.approx(expected_value, rel=1e-9)
    full = np.zeros(fixed.shape)
    full[cropped.box] = grad
    assert_close("gradient", full, expected_grad, 1e-9, 1e-12 * np.abs(expected_grad).max())
    assert cropped.value(warped) == pytest.approx(value, rel=1e-12)  # a full-size volume


def test_local_ncc_box_keeps_planes_that_vary_only_within_themselves():
    # Planes equal along D (no change between them) that vary within themselves still have
    # windows that count: the box reaches them.
    fixed = _brain_on_flat_background((30, 28, 32), 68)
    fixed[:12] = fixed[15]
    warped = _smooth_volume(fixed.shape, 69)
    cropped, whole = (registration.LocalNCC(fixed, 5, crop=crop) for crop in (True, False))
    assert cropped.box[0].start == 0 and np.prod(cropped.fixed.shape) < fixed.size
    assert cropped.value(warped) == pytest.approx(whole.value(warped), rel=1e-9)


def test_local_ncc_parts_hold_every_voxel_that_counts(monkeypatch):
    # The warped volume read only in the slabs (0 elsewhere) gives the same value and
    # gradient: no window that counts reaches a voxel outside them.
    monkeypatch.setattr(registration.losses, "_SLAB_PLANES", 4)
    fixed = _brain_on_flat_background((30, 28, 32), 66)
    measure = registration.LocalNCC(fixed, 3)
    inside = np.zeros(measure.fixed.shape, bool)
    for part in measure.parts:
        inside[part] = True
    assert len(measure.parts) > 2 and inside.mean() < 0.9  # the slabs are a part of the box
    warped = _smooth_volume(fixed.shape, 67)[measure.box]
    value, grad = measure(np.ascontiguousarray(warped))
    grad = grad.copy()
    kept_value, kept_grad = measure(np.where(inside, warped, 0))
    assert kept_value == value
    np.testing.assert_array_equal(kept_grad, grad)
    assert not grad[~inside].any()


@pytest.mark.parametrize("slab_planes", [16, 3])
@pytest.mark.parametrize("stage", ["affine", "deformable"])
def test_objectives_on_the_ncc_box_match_the_whole_volume(stage, slab_planes, monkeypatch):
    # The box is sampled through theta times the box's map (part by part with slabs of
    # 3 planes, and its gradient taken back): the objective and its gradient are the
    # whole volume's, to round-off.
    monkeypatch.setattr(registration.losses, "_SLAB_PLANES", slab_planes)
    fixed = _brain_on_flat_background((15, 17, 16), 62)
    moving = _smooth_volume((14, 18, 13), 63)
    frame = registration.Frame.of(fixed.shape, np.diag([1.0, 1.1, 0.9, 1.0]), moving.shape,
                                  np.diag([1.05, 1.0, 1.0, 1.0]))
    params = np.eye(3, 4) + 0.02 * np.random.default_rng(64).standard_normal((3, 4))
    control = np.random.default_rng(65).uniform(-1, 1, (1, 4, 5, 4, 3))
    results = []
    for crop in (True, False):
        measure = registration.LocalNCC(fixed, 3, crop=crop)
        if stage == "affine":
            value, grad, _ = registration.affine_objective(params, fixed, moving, frame,
                                                           measure=measure)
        else:
            value, grad, _ = registration.objective(
                control, fixed, moving, "ncc", 0.1, theta=frame.theta(params, np.float64),
                measure=measure, buffers=registration.StepBuffers())
        results.append((value, grad))
    assert np.prod(registration.LocalNCC(fixed, 3).fixed.shape) < 0.7 * fixed.size
    assert (len(registration.LocalNCC(fixed, 3).parts) > 1) == (slab_planes == 3)
    (value, grad), (expected_value, expected_grad) = results
    assert value == pytest.approx(expected_value, rel=1e-9)
    assert_close("gradient", grad, expected_grad, 1e-7, 1e-9 * np.abs(expected_grad).max())


def test_report_says_at_which_resolution_each_level_scores(tmp_path, monkeypatch):
    # A coarse level scores its blurred volumes, higher than the full resolution's: the
    # curve names each run of steps' stage and resolution, and marks the full resolution's
    # before and after apart.
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from volsample.apps import register

    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: drawn.append(self))
    history = ([("affine", 0, -0.6, 0.6)] * 3 + [("affine", 1, -0.3, 0.3)] * 2
               + [("deformable", 0, -0.62, 0.62)] * 2 + [("deformable", 1, -0.35, 0.35)] * 4)
    volume = np.zeros((6, 7, 8), np.float32)
    folds = register._folds.Folds(-0.25, 3, 120, "FIXED_LABELS > 0")
    assert register._write_report(str(tmp_path / "report.png"), volume, volume, volume,
                                   history, "ncc", (0.1, 0.35), folds)
    (figure,) = drawn
    assert folds.line() in [text.get_text() for text in figure.texts]  # the folds, below
    curve = next(ax for ax in figure.axes if ax.get_xlabel() == "iteration")
    assert [" ".join(text.get_text().split()) for text in curve.texts] == [
        "affine 1/2", "affine full", "deformable 1/2", "deformable full"]
    assert "0.1000 -> 0.3500 at full resolution" in curve.get_title()
    (twin,) = [ax for ax in figure.axes if "similarity" in ax.get_ylabel()]
    assert "resolution" in twin.get_ylabel()
    marked = [line for line in twin.get_lines() if line.get_marker() == "o"]
    assert len(marked) == 1
    assert list(marked[0].get_xdata()) == [0, len(history) - 1]
    assert list(marked[0].get_ydata()) == [0.1, 0.35]
