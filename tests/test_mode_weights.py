"""Each interpolation mode's weights in Python (``volsample._weights``, reached through
``_tables.MODES``), the home the float64 reference and the torch derivatives share.

Oracles: the weights' own defining properties (they sum to 1 and reproduce a linear
function, so sampling a ramp is exact), central differences for their first and second
derivatives, and the C++ kernels, which sample a ramp along one axis with the same taps.
"""
from __future__ import annotations

import numpy as np
import pytest

import volsample
from volsample._tables import MODES

WEIGHTED = [m for m in MODES.choices if m.weights is not None]


def _taps(mode):
    """The taps' offsets from floor(x): -1 .. 2 for four taps, 0 .. 1 for two."""
    return np.arange(1 - mode.taps // 2, mode.taps // 2 + 1)


def test_every_mode_with_a_grid_gradient_has_weights():
    assert {m.name for m in WEIGHTED} == {m.name for m in MODES.choices if m.grid_gradient}
    for mode in WEIGHTED:
        weights, first, second = mode.weights(np.linspace(0, 0.99, 5))
        assert len(weights) == len(first) == len(second) == mode.taps


@pytest.mark.parametrize("mode", WEIGHTED, ids=lambda m: m.name)
def test_weights_sum_to_one_and_reproduce_a_ramp(mode):
    f = np.random.default_rng(1).uniform(0, 1, 101)
    weights, first, second = (np.array(v) for v in mode.weights(f))
    offsets = _taps(mode)[:, None]
    np.testing.assert_allclose(weights.sum(0), 1, atol=1e-15)
    np.testing.assert_allclose(first.sum(0), 0, atol=1e-14)  # their derivatives too
    np.testing.assert_allclose(second.sum(0), 0, atol=1e-13)
    ramp = (weights * offsets).sum(0)
    if mode.name == "bicubic":
        # Cubic convolution reproduces a ramp only for A = -0.5; PyTorch's A = -0.75 bends
        # it by -2 (A + 0.5) f (1 - f) (1 - 2 f) (expanding the kernel's pieces), which
        # this checks instead.
        a = -0.75
        np.testing.assert_allclose(ramp - f, -2 * (a + 0.5) * f * (1 - f) * (1 - 2 * f),
                                   atol=1e-15)
    else:
        np.testing.assert_allclose(ramp, f, atol=1e-15)
        np.testing.assert_allclose((first * offsets).sum(0), 1, atol=1e-14)


@pytest.mark.parametrize("mode", WEIGHTED, ids=lambda m: m.name)
def test_derivatives_match_central_differences(mode):
    f = np.random.default_rng(2).uniform(0.01, 0.99, 51)
    h = 1e-6
    up, down = (np.array(mode.weights(f + s)[0]) for s in (h, -h))
    first = np.array(mode.weights(f)[1])
    np.testing.assert_allclose(first, (up - down) / (2 * h), atol=1e-8)
    up, down = (np.array(mode.weights(f + s)[1]) for s in (h, -h))
    np.testing.assert_allclose(np.array(mode.weights(f)[2]), (up - down) / (2 * h), atol=1e-7)


@pytest.mark.parametrize("mode", WEIGHTED, ids=lambda m: m.name)
def test_torch_tensors_get_the_same_weights(mode):
    torch = pytest.importorskip("torch")
    f = np.random.default_rng(3).uniform(0, 1, 17)
    for ours, theirs in zip(mode.weights(f), mode.weights(torch.from_numpy(f))):
        np.testing.assert_array_equal(np.array(ours), np.array([t.numpy() for t in theirs]))


@pytest.mark.parametrize("mode", WEIGHTED, ids=lambda m: m.name)
def test_the_kernels_take_the_same_taps(mode):
    """Sampling a cubic along x between the volume's voxels: the kernels' answer is the
    Python weights applied to the taps' values."""
    W = 9
    column = np.random.default_rng(4).standard_normal(W)
    volume = np.broadcast_to(column, (1, 1, 2, 2, W)).astype(np.float64).copy()
    x = np.array([2.3, 4.5, 5.875])  # voxel coordinates, far from the edges
    grid = np.zeros((1, 1, 1, 3, 3))
    grid[..., 0] = (2 * x + 1) / W - 1  # align_corners=False
    grid[..., 1] = grid[..., 2] = -0.5  # y = z = voxel 0 (every row holds the same column,
    #                                      and the y and z taps' weights sum to 1)
    ours = volsample.grid_sample_3d(volume, grid, mode.name, "border").reshape(-1)
    low = np.floor(x).astype(int)
    weights = np.array(mode.weights(x - low)[0])
    expected = (weights * column[low[None] + _taps(mode)[:, None]]).sum(0)
    np.testing.assert_allclose(ours, expected, rtol=1e-13)
