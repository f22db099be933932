"""``volsample.dask.warp`` in the cubic modes: the halo of each chunk widens by the 4-tap
footprint, and the chunked result equals, bit for bit, the in-memory ``grid_sample_3d``.
Every chunk's full-shape view is NaN outside its halo, so a chunk that read a voxel beyond
it would show NaN and fail the equality."""
from __future__ import annotations

import numpy as np
import pytest

da = pytest.importorskip("dask.array")

import volsample  # noqa: E402
from volsample import dask as vdask  # noqa: E402

SHAPE = (2, 3, 13, 11, 12)  # N, C, D, H, W
CHUNKS = (1, 2, 5, 4, 5)
OUT = (9, 10, 7)
FIELD_CHUNKS = (1, 4, 4, 3, 3)


@pytest.fixture(autouse=True)
def nan_outside_the_halo(monkeypatch):
    monkeypatch.setattr(vdask, "_new_buffer", lambda size, dtype: np.full(size, np.nan, dtype))


@pytest.mark.parametrize("mode", ["bicubic", "bspline"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [True, False])
@pytest.mark.parametrize("reach", [0.4, 1.5, 8.0])  # a shift; mostly inside; far past the faces
def test_warp_equals_in_memory_bitwise(mode, padding_mode, align_corners, reach):
    rng = np.random.default_rng(0)
    volume = rng.standard_normal(SHAPE).astype(np.float32)
    field = reach * rng.uniform(-1, 1, SHAPE[:1] + OUT + (3,))
    if reach == 0.4:
        field[:] = reach  # every chunk reads a narrow halo
    field[0, 1, 2, 3, 0] = np.nan
    field = field.astype(np.float32)
    grid = vdask.sampling_grid(field, SHAPE[2:], align_corners)
    expected = volsample.grid_sample_3d(volume, grid, mode, padding_mode, align_corners)
    lazy = da.from_array(volume, chunks=CHUNKS)
    for displacement in (field, da.from_array(field, chunks=FIELD_CHUNKS)):
        out = vdask.warp(lazy, displacement, mode, padding_mode, align_corners)
        np.testing.assert_array_equal(out.compute(), expected)


def test_cubic_halos_are_one_voxel_wider():
    extremes = np.array([2.3, 4.0, 5.5, 3.1, 6.2, 7.9])  # min x, y, z; max x, y, z
    in_shape = (13, 11, 12)
    linear = vdask._halo(extremes, 0, in_shape)
    cubic = vdask._halo(extremes, 0, in_shape, 4)
    for a, b in zip(linear, cubic):
        assert (b.start, b.stop) == (a.start - 1, a.stop + 1)
