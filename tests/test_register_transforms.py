"""Tests of what ``volsample register`` hands on: ITK's transforms and the fold report.

The oracles are independent: SimpleITK (ITK's own readers, transforms and resampler) for
the written ITK files, analytic maps for the Jacobian determinant in world millimetres.
"""
from __future__ import annotations

import contextlib
import io
import json
import re

import numpy as np
import pytest
from helpers import assert_close

from volsample import registration, warp_3d
from volsample.apps import folds, transforms
from volsample.apps.bench_register import rotation
from volsample.cli import main

LPS = np.array([-1.0, -1.0, 1.0])  # RAS -> LPS, per coordinate


def _grid_affine(angles, spacing, origin, flip=(1, 1, 1)):
    """A voxel-to-world affine: rotated, anisotropic, its axes flipped as ``flip`` says."""
    affine = np.eye(4)
    affine[:3, :3] = rotation(angles) @ np.diag(np.multiply(spacing, flip))
    affine[:3, 3] = origin
    return affine


def _world_points(shape, affine):
    index = np.stack(np.meshgrid(*(np.arange(n) for n in shape), indexing="ij"), -1)
    return index @ affine[:3, :3].T + affine[:3, 3]


# ---------------------------------------------------------------------------------------
# The Jacobian determinant and the foreground
# ---------------------------------------------------------------------------------------


# a grid deeper than a slab (16 planes), so that the slabs' seams are crossed
GRID = ((37, 9, 11), _grid_affine((0.3, -0.2, 0.5), (1.5, 0.8, 2.0), (4, -7, 2), (1, -1, 1)))


def test_jacobian_of_a_linear_displacement_is_its_determinant_everywhere():
    # d(x) = M x + b in world mm: det(I + M) at every voxel (finite differences of a linear
    # map are exact, edges included), whatever the grid's spacing, rotation and flips.
    shape, affine = GRID
    M = np.array([[0.2, -0.1, 0.05], [0.15, -0.3, 0.1], [-0.05, 0.2, 0.1]])
    d = _world_points(shape, affine) @ M.T + [1, 2, 3]
    det = folds.jacobian_mm(d.astype(np.float32), affine)
    assert det.shape == shape and det.dtype == np.float32
    assert_close("det", det, np.full(shape, np.linalg.det(np.eye(3) + M)), 0, 2e-4)
    # taken per voxel without the affine (voxel units read as mm), it is another number
    naive = folds.jacobian_mm(d.astype(np.float32), np.eye(4))
    assert np.abs(naive - det).max() > 0.05


def test_jacobian_of_a_smooth_map_matches_its_analytic_determinant():
    # d_a(x) = s_a sin(k_a . x): dd_a/dx = s_a cos(k_a . x) k_a^T. Central differences
    # are second-order: inside, the error is about h^2 |k|^2 / 6 of the derivative.
    shape, affine = GRID
    x = _world_points(shape, affine)
    k = np.array([[0.11, -0.05, 0.07], [0.04, 0.09, -0.1], [-0.08, 0.03, 0.12]])
    s = np.array([3.0, -2.5, 2.0])
    d = s * np.sin(x @ k.T)
    gradient = (s * np.cos(x @ k.T))[..., :, None] * k  # (..., a, b) = dd_a/dx_b
    expected = np.linalg.det(np.eye(3) + gradient)
    det = folds.jacobian_mm(d.astype(np.float32), affine)
    inner = (slice(1, -1),) * 3
    assert expected.min() < 0.6 and expected.max() > 1.4  # the map does vary
    assert_close("det inside", det[inner], expected[inner], 0, 0.03)


def test_jacobian_matches_simpleitks_filter_on_an_lps_aligned_grid(tmp_path):
    # ITK's DisplacementFieldJacobianDeterminantFilter takes derivatives along the index
    # axes over the spacing (not the direction), so it is an oracle where ITK's direction
    # is the identity: a NIfTI affine of axes -x, -y, +z (LPS), anisotropic spacing. The
    # field goes through the ITK displacement file, as register writes it.
    sitk = pytest.importorskip("SimpleITK")
    nib = pytest.importorskip("nibabel")
    shape = (19, 23, 21)
    affine = np.diag([-1.5, -0.8, 2.0, 1.0])
    affine[:3, 3] = (10, -5, 3)
    rng = np.random.default_rng(8)
    d = np.stack([registration.blur(rng.standard_normal(shape), 2) for _ in range(3)], -1) * 8
    image = nib.Nifti1Image(transforms.itk_displacement(d.astype(np.float32)), affine)
    image.header.set_intent(transforms.NIFTI_INTENT_VECTOR)
    nib.save(image, tmp_path / "field.nii.gz")
    field = sitk.ReadImage(str(tmp_path / "field.nii.gz"), sitk.sitkVectorFloat64)
    assert np.allclose(field.GetDirection(), np.eye(3).ravel())
    theirs = sitk.DisplacementFieldJacobianDeterminant(field, True)
    theirs = sitk.GetArrayFromImage(theirs).transpose(2, 1, 0)
    ours = folds.jacobian_mm(d.astype(np.float32), affine)
    inner = (slice(1, -1),) * 3  # ITK takes half a one-sided difference at the edges
    assert ours[inner].min() < 0.7 and ours[inner].max() > 1.3  # the field does vary
    assert_close("det", ours[inner], theirs[inner], 0, 1e-4)


def test_folds_are_counted_in_the_foreground_only():
    det = np.ones((4, 5, 6), np.float32)
    det[0, 0, 0], det[1, 2, 3], det[2, 2, 2], det[3, 4, 5] = -0.5, 0.0, 0.3, -2.0
    mask = np.zeros(det.shape, bool)
    mask[1:, 1:, 1:] = True  # leaves (0, 0, 0) out
    summary = folds.folds(det, mask, "test")
    assert (summary.folded, summary.voxels) == (2, mask.sum())
    assert summary.minimum == -2.0 and summary.fraction == 2 / mask.sum()
    assert "min -2.0000, folded (<= 0) 2 of 60 voxels (3.3333%)" in summary.line()


def test_otsu_foreground_is_the_bright_object():
    rng = np.random.default_rng(3)
    volume = rng.normal(0.1, 0.03, (30, 32, 34))
    inside = _world_points(volume.shape, np.eye(4))
    inside = np.linalg.norm(inside - [15, 16, 17], axis=-1) < 10
    volume[inside] = rng.normal(0.8, 0.05, inside.sum())
    threshold = folds.otsu_threshold(volume)
    assert 0.3 < threshold < 0.6  # in the gap, not on a tail
    mask, where = folds.foreground(volume)
    np.testing.assert_array_equal(mask, inside)
    assert "Otsu" in where
    labels = inside.astype(np.int32) * 3
    mask, where = folds.foreground(volume, labels)
    np.testing.assert_array_equal(mask, inside)
    assert where == "FIXED_LABELS > 0"
    mask, where = folds.foreground(np.full((3, 4, 5), 7.0))  # flat: no foreground to find
    assert mask.all() and where == "all voxels"


# ---------------------------------------------------------------------------------------
# ITK's affine, read by SimpleITK
# ---------------------------------------------------------------------------------------


def _random_affine(seed):
    rng = np.random.default_rng(seed)
    transform = np.eye(4)
    transform[:3, :3] = rotation(rng.uniform(-0.3, 0.3, 3)) @ np.diag(rng.uniform(0.9, 1.1, 3))
    transform[:3, 3] = rng.uniform(-5, 5, 3)
    return transform


def test_itk_affine_maps_lps_points_as_the_world_affine_maps_ras_ones(tmp_path):
    sitk = pytest.importorskip("SimpleITK")
    transform = _random_affine(4)
    path = tmp_path / "affine.tfm"
    transforms.write_itk_affine(str(path), transform)
    itk = sitk.ReadTransform(str(path))
    points = np.random.default_rng(5).uniform(-80, 80, (20, 3))  # RAS mm
    for point in points:
        moved = transform[:3, :3] @ point + transform[:3, 3]
        got = itk.TransformPoint(tuple(LPS * point))
        assert_close("point", got, LPS * moved, 0, 1e-9)


@pytest.mark.parametrize("suffix", [".tfm", ".mat"])
def test_read_affine_maps_points_as_itk_does(tmp_path, suffix):
    # An ITK affine about a centre, written by SimpleITK (text, and the MATLAB file ANTs
    # writes): read_affine's RAS map takes each point where ITK takes it in LPS.
    sitk = pytest.importorskip("SimpleITK")
    if suffix == ".mat":
        pytest.importorskip("scipy")
    rng = np.random.default_rng(7)
    itk = sitk.AffineTransform(3)
    itk.SetMatrix(tuple((rotation(rng.uniform(-0.4, 0.4, 3))
                         @ np.diag(rng.uniform(0.8, 1.2, 3))).ravel()))
    itk.SetTranslation(tuple(rng.uniform(-9, 9, 3)))
    itk.SetCenter(tuple(rng.uniform(-30, 30, 3)))
    path = tmp_path / f"affine{suffix}"
    sitk.WriteTransform(itk, str(path))
    transform = transforms.read_affine(path)
    for point in rng.uniform(-80, 80, (20, 3)):  # RAS mm
        moved = transform[:3, :3] @ point + transform[:3, 3]
        assert_close("point", LPS * moved, itk.TransformPoint(tuple(LPS * point)), 0, 1e-9)


def test_read_affine_reads_back_what_register_writes(tmp_path):
    transform = _random_affine(8)
    transforms.write_itk_affine(str(tmp_path / "affine_itk.tfm"), transform)
    np.savetxt(tmp_path / "affine.txt", transform, header="a comment line")
    for name in ("affine_itk.tfm", "affine.txt"):
        assert_close(name, transforms.read_affine(tmp_path / name), transform, 0, 1e-12)


@pytest.mark.parametrize("text, says", [
    ("not a transform\n", "not an affine transform file"),
    ("#Insight Transform File V1.0\nTransform: Euler3DTransform_double_3_3\n"
     "Parameters: 0 0 0 0 0 0\nFixedParameters: 0 0 0\n", "found Euler3DTransform"),
    ("#Insight Transform File V1.0\nTransform: AffineTransform_double_3_3\n"
     "Parameters: 1 0 0 0 1 0\nFixedParameters: 0 0 0\n", "expected 12 parameters"),
    ("1 0 0 0\n0 0 0 0\n0 0 1 0\n0 0 0 1\n", "singular"),
])
def test_read_affine_names_the_file_that_holds_no_affine(tmp_path, text, says):
    path = tmp_path / "bad.tfm"
    path.write_text(text)
    with pytest.raises(ValueError, match=says) as error:
        transforms.read_affine(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("flips", [((1, 1, 1), (1, 1, 1)), ((-1, 1, 1), (1, -1, -1))])
def test_itk_affine_resamples_as_volsample_on_oriented_grids(tmp_path, flips):
    # Two images of rotated, flipped grids (NIfTI headers, read by ITK as LPS origin and
    # direction) and a known T: SimpleITK resampling MOVING through the ITK file is
    # volsample's sampling of MOVING at T(x), inside MOVING's field of view.
    sitk = pytest.importorskip("SimpleITK")
    nib = pytest.importorskip("nibabel")
    shape = (20, 22, 18)
    fixed_affine = _grid_affine((0.1, 0.2, -0.3), (2.0, 1.8, 2.2), (0, 0, 0), flips[0])
    moving_affine = _grid_affine((-0.2, 0.1, 0.25), (1.9, 2.1, 1.7), (0, 0, 0), flips[1])
    for affine, centre in ((fixed_affine, (3, -2, 4)), (moving_affine, (2, -1, 2))):
        affine[:3, 3] = centre - affine[:3, :3] @ (np.array(shape) - 1) / 2  # overlapping
    moving = registration.blur(np.random.default_rng(6).standard_normal(shape), 2)
    transform = _random_affine(7)
    transform[:3, 3] *= 0.3
    for name, data, affine in (("fixed", np.zeros(shape), fixed_affine),
                               ("moving", moving, moving_affine)):
        nib.save(nib.Nifti1Image(data, affine), tmp_path / f"{name}.nii.gz")
    transforms.write_itk_affine(str(tmp_path / "affine.tfm"), transform)
    images = {name: sitk.ReadImage(str(tmp_path / f"{name}.nii.gz"), sitk.sitkFloat64)
              for name in ("fixed", "moving")}
    itk = sitk.ReadTransform(str(tmp_path / "affine.tfm"))

    def resampled(image):
        out = sitk.Resample(image, images["fixed"], itk, sitk.sitkLinear, 0.0)
        return sitk.GetArrayFromImage(out).transpose(2, 1, 0)  # ITK's (z, y, x) to (i, j, k)

    theirs = resampled(images["moving"])
    inside = resampled(images["moving"] * 0 + 1) > 1 - 1e-9
    frame = registration.Frame.of(shape, fixed_affine, shape, moving_affine)
    params = (np.linalg.inv(frame.centre) @ transform @ frame.centre)[:3]
    ours = warp_3d(moving[None, None], frame.theta(params, np.float64), None,
                                shape, "bilinear", padding_mode="border",
                                align_corners=True)[0, 0]
    assert inside.mean() > 0.3
    assert_close("resampled", ours[inside], theirs[inside], 0, 1e-6)


# ---------------------------------------------------------------------------------------
# volsample register: its ITK files reproduce its warped volume in SimpleITK
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """volsample register on a small NIfTI pair of different, oriented grids (MOVING
    stored with its first axis reversed, a little rotated and shifted), with labels and
    --jacobian: (output folder, input folder, stdout)."""
    nib = pytest.importorskip("nibabel")
    folder = tmp_path_factory.mktemp("pair")
    pair = registration.synthetic_pair((22, 18, 20))
    shape = pair.fixed.shape
    fixed_affine = _grid_affine((0.0, 0.0, 0.0), (1.5, 1.2, 1.4), (-15, -11, -13), (-1, 1, 1))
    fixed_affine[:3, 3] += [21 * 1.5, 0, 0]  # LAS: the first axis runs right to left
    # MOVING's voxel (i, j, k) is the phantom's (D-1-i, j, k), placed by a small rigid map
    # of FIXED's world, so that it overlaps FIXED with a misalignment to find
    flip = np.eye(4)
    flip[0, 0], flip[0, 3] = -1, shape[0] - 1
    nudge = np.eye(4)
    nudge[:3, :3], nudge[:3, 3] = rotation((0.04, -0.03, 0.05)), (1.0, -0.8, 0.6)
    moving_affine = nudge @ fixed_affine @ flip
    files = {"fixed": (pair.fixed, fixed_affine), "moving": (pair.moving[::-1], moving_affine),
             "fixed_labels": (pair.fixed_labels, fixed_affine),
             "moving_labels": (pair.moving_labels[::-1], moving_affine)}
    for name, (data, affine) in files.items():
        nib.save(nib.Nifti1Image(np.ascontiguousarray(data), affine), folder / f"{name}.nii.gz")
    out = folder / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["register", str(folder / "fixed.nii.gz"), str(folder / "moving.nii.gz"),
                     "--out", str(out), "--no-progress", "--levels", "2", "--iterations", "30",
                     "--labels", str(folder / "fixed_labels.nii.gz"),
                     str(folder / "moving_labels.nii.gz"), "--jacobian"])
    assert code == 0
    return out, folder, stdout.getvalue()


def _sitk_warp(sitk, folder, out, order):
    """MOVING resampled on FIXED's grid (linear) by SimpleITK through the written files:
    ``order`` lists "affine" and "field" as CompositeTransform takes them (the last is
    applied to the point first); and where MOVING's field of view holds the point."""
    fixed = sitk.ReadImage(str(folder / "fixed.nii.gz"), sitk.sitkFloat64)
    moving = sitk.ReadImage(str(folder / "moving.nii.gz"), sitk.sitkFloat64)
    parts = {"affine": sitk.ReadTransform(str(out / "affine_itk.tfm")),
             "field": sitk.DisplacementFieldTransform(sitk.ReadImage(
                 str(out / "displacement_itk.nii.gz"), sitk.sitkVectorFloat64))}
    composite = sitk.CompositeTransform([parts[name] for name in order])

    def resampled(image):
        result = sitk.Resample(image, fixed, composite, sitk.sitkLinear, 0.0)
        return sitk.GetArrayFromImage(result).transpose(2, 1, 0)

    return resampled(moving), resampled(moving * 0 + 1) > 1 - 1e-9


def test_simpleitk_through_the_written_transforms_reproduces_warped(registered):
    sitk = pytest.importorskip("SimpleITK")
    nib = pytest.importorskip("nibabel")
    out, folder, _ = registered
    warped = nib.load(out / "warped.nii.gz").get_fdata()
    fixed_labels = np.asarray(nib.load(folder / "fixed_labels.nii.gz").dataobj) > 0
    theirs, inside = _sitk_warp(sitk, folder, out, ["affine", "field"])
    inside &= fixed_labels
    assert inside.sum() > 0.9 * fixed_labels.sum()
    value_range = np.ptp(warped[inside])
    correlation = np.corrcoef(warped[inside], theirs[inside])[0, 1]
    worst = np.abs(warped - theirs)[inside].max()
    assert correlation > 0.9999 and worst < 1e-3 * value_range, (correlation, worst)
    # the map is not trivial: the affine alone, or the two in the other order, fall short
    displacement = nib.load(out / "displacement.nii.gz").get_fdata()
    assert np.linalg.norm(displacement, axis=-1)[fixed_labels].max() > 1.0  # mm
    for order in (["affine"], ["field", "affine"]):
        other, _ = _sitk_warp(sitk, folder, out, order)
        assert np.abs(warped - other)[inside].max() > 20 * max(worst, 1e-4 * value_range)


def test_itk_displacement_field_is_a_vector_nifti_on_the_fixed_grid(registered):
    nib = pytest.importorskip("nibabel")
    out, folder, _ = registered
    fixed = nib.load(folder / "fixed.nii.gz")
    field = nib.load(out / "displacement_itk.nii.gz")
    assert field.shape == fixed.shape + (1, 3)
    assert field.header["intent_code"] == 1007 and field.get_data_dtype() == np.float32
    assert_close("affine", field.affine, fixed.affine, 0, 1e-6)
    ras = nib.load(out / "displacement.nii.gz").get_fdata()
    assert_close("LPS vectors", field.get_fdata()[:, :, :, 0], ras * LPS, 0, 1e-6)


def test_register_reports_the_folds_it_writes(registered):
    nib = pytest.importorskip("nibabel")
    out, folder, stdout = registered
    fixed = nib.load(folder / "fixed.nii.gz")
    jacobian = nib.load(out / "jacobian.nii.gz")
    assert jacobian.shape == fixed.shape
    assert_close("affine", jacobian.affine, fixed.affine, 0, 1e-6)
    det = jacobian.get_fdata()
    displacement = nib.load(out / "displacement.nii.gz").get_fdata()
    assert_close("det", det, folds.jacobian_mm(displacement, fixed.affine), 0, 1e-6)
    mask = np.asarray(nib.load(folder / "fixed_labels.nii.gz").dataobj) > 0
    expected = folds.folds(det, mask, "FIXED_LABELS > 0")
    report = json.loads((out / "report.json").read_text())
    assert report["jacobian"]["foreground"] == "FIXED_LABELS > 0"
    assert report["jacobian"]["voxels"] == mask.sum()
    assert report["jacobian"]["folded"] == expected.folded
    assert report["jacobian"]["minimum"] == pytest.approx(expected.minimum, abs=1e-6)
    assert expected.line() in stdout.splitlines()
    assert np.any(det != 1) and 0 < expected.minimum < 1.5
    wrote = re.search(r"^wrote (.*) to ", stdout, re.MULTILINE).group(1).split(", ")
    assert sorted(wrote) == sorted(report["files"]) == sorted(p.name for p in out.iterdir())
    assert {"affine_itk.tfm", "displacement_itk.nii.gz", "jacobian.nii.gz", "report.json"} \
        <= set(wrote)
    assert report["similarity"]["after"] > report["similarity"]["before"]
    assert report["dice"]["after"] > report["dice"]["before"]


def test_register_npy_writes_no_itk_files(tmp_path, capsys):
    # .npy volumes have no header to place ITK's field: volsample's own files only
    pair = registration.synthetic_pair((16, 14, 12))
    for name in ("fixed", "moving"):
        np.save(tmp_path / f"{name}.npy", getattr(pair, name))
    out = tmp_path / "out"
    assert main(["register", str(tmp_path / "fixed.npy"), str(tmp_path / "moving.npy"),
                 "--out", str(out), "--no-progress", "--levels", "1", "--iterations", "3"]) == 0
    stdout = capsys.readouterr().out
    names = {p.name for p in out.iterdir()}
    assert "affine_itk.tfm" not in names and "displacement_itk.nii.gz" not in names
    assert "jacobian determinant in the foreground (FIXED above its Otsu threshold)" in stdout
    assert json.loads((out / "report.json").read_text())["jacobian"]["voxels"] > 0
