"""``volsample.dask.warp``: chunked warping must equal, bit for bit, the in-memory
``grid_sample_3d`` on the whole arrays, and read only a halo per chunk.

Every chunk's full-shape view is filled with NaN outside the halo it copies here, so a
chunk that read outside its halo would show NaN and fail the equality.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

da = pytest.importorskip("dask.array")

import volsample  # noqa: E402
from volsample import registration  # noqa: E402
from volsample import dask as vdask  # noqa: E402

SHAPE = (2, 3, 13, 11, 12)  # N, C, D, H, W
CHUNKS = (1, 2, 5, 4, 5)  # more than one chunk along every axis
OUT = (9, 10, 7)  # the field's (and output's) spatial shape
FIELD_CHUNKS = (1, 4, 4, 3, 3)


@pytest.fixture(autouse=True)
def nan_outside_the_halo(monkeypatch):
    monkeypatch.setattr(vdask, "_new_buffer", lambda size, dtype: np.full(size, np.nan, dtype))


def _volume(dtype=np.float32):
    return np.random.default_rng(0).standard_normal(SHAPE).astype(dtype)


def _displacement(reach, dtype=np.float32, seed=1):
    """A random field of up to ``reach`` voxels, with a NaN and an infinite point."""
    field = reach * np.random.default_rng(seed).uniform(-1, 1, SHAPE[:1] + OUT + (3,))
    field[0, 1, 2, 3, 0] = np.nan
    field[1, 4, 5, 2, 2] = np.inf
    return field.astype(dtype)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [True, False])
@pytest.mark.parametrize("reach", [1.5, 8.0])  # mostly inside the volume; far past its faces
def test_warp_equals_in_memory_bitwise(mode, padding_mode, align_corners, reach):
    volume, displacement = _volume(), _displacement(reach)
    grid = vdask.sampling_grid(displacement, SHAPE[2:], align_corners)
    expected = volsample.grid_sample_3d(volume, grid, mode, padding_mode, align_corners)
    lazy = da.from_array(volume, chunks=CHUNKS)
    for field in (displacement, da.from_array(displacement, chunks=FIELD_CHUNKS)):
        out = vdask.warp(lazy, field, mode, padding_mode, align_corners)
        assert isinstance(out, da.Array) and out.dtype == volume.dtype
        np.testing.assert_array_equal(out.compute(), expected)


@pytest.mark.parametrize("dtype,field_dtype", [(np.float64, np.float64),
                                               (volsample._dtypes.BFLOAT16, np.float32),
                                               (np.float16, np.float64)])
def test_other_dtypes_equal_in_memory_bitwise(dtype, field_dtype):
    volume, displacement = _volume(dtype), _displacement(3.0, field_dtype)
    compute = volsample._dtypes.compute_dtype(dtype, field_dtype)
    grid = vdask.sampling_grid(displacement, SHAPE[2:], True, compute)
    expected = volsample.grid_sample_3d(volume, grid, "bilinear", "border", True)
    out = vdask.warp(da.from_array(volume, chunks=CHUNKS), displacement).compute()
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(out.view(np.uint8), expected.view(np.uint8))


def test_defaults_match_registration_warp():
    # registration.warp: (D, H, W) volume, (1, D, H, W, 3) voxel displacement (x, y, z),
    # border padding, corners aligned: the project's warp convention.
    volume = _volume()[0, 0]
    displacement = registration.smooth_deformation(volume.shape, 2.5)
    for mode in ("bilinear", "nearest"):
        expected = registration.warp(volume, displacement, mode)
        out = vdask.warp(da.from_array(volume[None, None], chunks=CHUNKS),
                         da.from_array(displacement, chunks=(1, 5, 4, 5, 3)), mode)
        np.testing.assert_array_equal(out.compute()[0, 0], expected)


def test_chunks_read_only_their_halo(monkeypatch):
    # A shift of 0.4 voxel: each chunk's halo is the chunk plus a voxel or two per side, far
    # less than the volume; reflection past the far faces widens those axes to the whole.
    halos = []
    full_view = vdask._full_view
    monkeypatch.setattr(vdask, "_full_view",
                        lambda region, *a: halos.append(region.shape[2:]) or full_view(region, *a))
    volume = da.from_array(_volume(), chunks=CHUNKS)
    displacement = np.full(SHAPE[:1] + SHAPE[2:] + (3,), 0.4, np.float32)
    vdask.warp(volume, displacement, padding_mode="zeros").compute(scheduler="synchronous")
    assert len(halos) == 2 * 2 * 3 * 3 * 3  # N, C, D, H, W blocks
    assert max(np.prod(h) for h in halos) <= 8 * 7 * 8 < np.prod(SHAPE[2:])
    halos.clear()
    vdask.warp(volume, displacement, padding_mode="reflection").compute(scheduler="synchronous")
    assert max(h[2] for h in halos) == SHAPE[4]
    assert min(h[2] for h in halos) < SHAPE[4]


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("shift", [-40.0, 40.0])
def test_every_point_past_one_face(padding_mode, shift):
    # Each chunk's points all lie beyond the volume: border reads the face's voxels only.
    volume = _volume()
    displacement = np.full(SHAPE[:1] + OUT + (3,), shift, np.float32)
    grid = vdask.sampling_grid(displacement, SHAPE[2:])
    expected = volsample.grid_sample_3d(volume, grid, "bilinear", padding_mode, True)
    out = vdask.warp(da.from_array(volume, chunks=CHUNKS), displacement, "bilinear",
                     padding_mode, True)
    np.testing.assert_array_equal(out.compute(), expected)


def test_output_chunks_follow_the_field_and_the_volume():
    volume = da.from_array(_volume(), chunks=CHUNKS)
    out = vdask.warp(volume, da.from_array(_displacement(1.0), chunks=FIELD_CHUNKS))
    assert out.chunks == ((1, 1), (2, 1), (4, 4, 1), (4, 4, 2), (3, 3, 1))
    same = vdask.warp(volume, np.zeros(SHAPE[:1] + SHAPE[2:] + (3,), np.float32))
    assert same.chunks == volume.chunks


@pytest.mark.parametrize("call,match", [
    (lambda v, d: vdask.warp(v[0], d), "volume: expected a 5-D"),
    (lambda v, d: vdask.warp(v, d[..., :2]), "displacement: expected shape"),
    (lambda v, d: vdask.warp(v, d[:1]), "displacement: expected shape"),
    (lambda v, d: vdask.warp(v, np.zeros(d.shape, np.int32)), "displacement: expected dtype"),
    (lambda v, d: vdask.warp(v.astype(np.int32), d), "volume: expected dtype"),
    (lambda v, d: vdask.warp(v, d, padding_mode="wrap"), "padding_mode"),
    (lambda v, d: vdask.warp(v, d, mode="cubic"), "mode"),
])
def test_bad_arguments_raise_before_any_work(call, match):
    volume = da.from_array(_volume(), chunks=CHUNKS)
    with pytest.raises((volsample.InvalidArgumentError, volsample.UnsupportedDTypeError),
                       match=match):
        call(volume, _displacement(1.0))


def test_import_volsample_does_not_import_dask():
    code = "import sys, volsample; assert 'dask' not in sys.modules, 'dask imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
