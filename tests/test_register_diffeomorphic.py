"""The diffeomorphic model of ``volsample.registration``: a stationary velocity on the
control grid, its exponential by scaling and squaring, the inverse map.

Oracles: finite differences (the gradient through the squarings), the Jacobian
determinant (``volsample.jacobian_determinant``) for folds, and the composition of the map
with its inverse, which is the identity; SimpleITK's own transforms for the ITK files.
"""
from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from volsample import jacobian_determinant, registration, warp_3d
from volsample.apps.registration import velocity
from volsample.cli import main

_FIELD = dict(padding_mode="border", align_corners=True, layout="NDHWC",
              displacement_units="voxels")


def _round_trip(forward, inverse):
    """|x + d(x) + w(x + d(x)) - x| at every voxel: forward d, then inverse w, both
    (1, D, H, W, 3) in voxels."""
    back = forward + warp_3d(inverse, displacement=forward, **_FIELD)
    return np.linalg.norm(back[0], axis=-1)


def test_exponential_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    shape = (30, 26, 22)
    v = rng.normal(0, 1.5, (1, 6, 5, 4, 3))
    weights = rng.normal(0, 1, v.shape)
    exponential = velocity.Exponential(shape)
    u = exponential.forward(v)
    assert exponential.steps > 0 and not np.allclose(u, v, atol=0.1)  # squarings ran
    grad = exponential.backward(weights)
    eps = 1e-6
    for index in [(0, 1, 2, 1, 0), (0, 3, 0, 2, 1), (0, 5, 4, 3, 2), (0, 0, 0, 0, 0)]:
        plus, minus = v.copy(), v.copy()
        plus[index] += eps
        minus[index] -= eps
        numeric = (np.sum(weights * velocity.exponential(plus, shape))
                   - np.sum(weights * velocity.exponential(minus, shape))) / (2 * eps)
        assert grad[index] == pytest.approx(numeric, rel=1e-6, abs=1e-8)


def test_exponential_of_a_folding_velocity_does_not_fold():
    # A velocity as large as the control spacing folds the volume when read as a
    # displacement; its exponential does not, and exp(-v) is its inverse.
    rng = np.random.default_rng(1)
    shape = (25, 29, 21)
    coarse = rng.normal(0, 4.0, (1, 3, 3, 3, 3))  # smooth: a 3^3 grid's field, upsampled
    v = registration.refine(coarse, (7, 8, 6))
    direct = registration.dense_displacement(v, shape)
    assert jacobian_determinant(direct).min() < 0
    control = velocity.exponential(v, shape)
    dense = registration.dense_displacement(control, shape)
    assert jacobian_determinant(dense).min() > 0
    inverse = velocity.dense_inverse(control, velocity.exponential(-v, shape), shape)
    assert _round_trip(dense, inverse)[3:-3, 3:-3, 3:-3].mean() < 0.05


@pytest.fixture(scope="module")
def pair():
    return registration.synthetic_pair((32, 32, 32), amplitude=3.0)


def _register(pair, model, weight=None):
    return registration.register(pair.fixed, pair.moving, levels=2, iterations=[40, 20],
                                 affine_iterations=0, weight=weight, model=model)


def test_diffeomorphic_register_does_not_fold_even_unpenalised(pair):
    inside = pair.fixed_labels > 0
    result = _register(pair, "diffeomorphic", weight=0.0)
    assert result.velocity is not None and result.inverse_control is not None
    assert jacobian_determinant(result.fixed_displacement)[0][inside].min() > 0
    assert registration.dice(pair.fixed_labels, result.warp(pair.moving_labels, "nearest")) \
        > registration.dice(pair.fixed_labels, pair.moving_labels) + 0.05


def test_diffeomorphic_register_holds_a_consistent_inverse(pair):
    result = _register(pair, "diffeomorphic")
    assert _register(pair, "free-form").inverse_displacement is None
    inverse_mm = result.inverse_displacement  # identity affines: mm are voxels (i, j, k)
    assert inverse_mm.shape == pair.fixed.shape + (3,) and inverse_mm.dtype == np.float32
    inverse = np.ascontiguousarray(inverse_mm[..., ::-1])[None]
    errors = _round_trip(result.fixed_displacement, inverse)[pair.fixed_labels > 0]
    assert errors.mean() < 0.1 and np.linalg.norm(inverse_mm, axis=-1).max() > 1.0
    # exp(-v) upsampled alone is a worse inverse than the refined one
    rough = registration.dense_displacement(result.inverse_control, pair.fixed.shape)
    assert _round_trip(result.fixed_displacement, rough)[pair.fixed_labels > 0].mean() \
        > errors.mean()


def test_register_writes_the_inverse_which_simpleitk_reads(tmp_path):
    # The inverse's ITK files take MOVING's points back to FIXED's: through SimpleITK, the
    # forward transforms and then the inverse ones (T^-1 first) give the points back.
    sitk = pytest.importorskip("SimpleITK")
    nib = pytest.importorskip("nibabel")
    pair = registration.synthetic_pair((24, 20, 22), amplitude=2.0)
    affine = np.diag([1.2, -1.0, 1.1, 1.0])
    affine[:3, 3] = (-10, 12, -9)
    moving_affine = affine.copy()
    moving_affine[:3, 3] += (1.0, -0.5, 0.8)
    for name, data, grid in (("fixed", pair.fixed, affine), ("moving", pair.moving, moving_affine)):
        nib.save(nib.Nifti1Image(data, grid), tmp_path / f"{name}.nii.gz")
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["register", str(tmp_path / "fixed.nii.gz"), str(tmp_path / "moving.nii.gz"),
                     "--out", str(out), "--no-progress", "--levels", "2", "--iterations",
                     "30"]) == 0
    inverse = nib.load(out / "inverse_displacement.nii.gz")
    assert inverse.shape == pair.fixed.shape + (3,)

    def field(name):
        return sitk.DisplacementFieldTransform(
            sitk.ReadImage(str(out / f"{name}.nii.gz"), sitk.sitkVectorFloat64))

    T = sitk.ReadTransform(str(out / "affine_itk.tfm"))
    forward = sitk.CompositeTransform([T, field("displacement_itk")])
    backward = sitk.CompositeTransform([field("inverse_displacement_itk"), T.GetInverse()])
    rng = np.random.default_rng(2)
    index = np.argwhere(pair.fixed_labels > 0)
    index = index[rng.choice(len(index), 200, replace=False)]
    lps = (index @ affine[:3, :3].T + affine[:3, 3]) * [-1, -1, 1]
    moved = [forward.TransformPoint(tuple(p)) for p in lps]
    back = np.array([backward.TransformPoint(p) for p in moved])
    assert np.linalg.norm(np.array(moved) - lps, axis=1).max() > 0.5  # the map moves them
    assert np.linalg.norm(back - lps, axis=1).mean() < 0.1  # mm, voxels of 1-1.2 mm
