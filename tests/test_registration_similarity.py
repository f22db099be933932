"""The C++ box sums, local NCC and varying rows of registration (``src/cpp/local_ncc.cpp``).

The oracle is PyTorch in float64: window sums as a convolution with a box of ones (zero
padding cuts the windows at the border), the NCC from them, and its gradient by autograd;
the varying rows and columns against NumPy's comparisons of neighbours. The kernels must
give the same bits for every thread count and ISA.
"""
from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_close

from volsample import _cpu, registration
from volsample._cpu import similarity as kernels

torch = pytest.importorskip("torch")

EPS = registration.losses._NCC_EPS

# odd sizes so that no axis is symmetric; one axis shorter than the window; a single plane
SHAPES = [(7, 8, 9), (3, 10, 6), (1, 5, 12)]


def _box(volume, radius):
    """Window sums, PyTorch float64: a convolution with ones, zero padding."""
    size = 2 * radius + 1
    ones = torch.ones((1, 1, size, size, size), dtype=volume.dtype)
    return torch.nn.functional.conv3d(volume[None, None], ones, padding=radius)[0, 0]


def _ncc_oracle(fixed, warped, radius):
    """(mean local NCC, its gradient with respect to warped), float64."""
    F = torch.tensor(fixed, dtype=torch.float64)
    J = torch.tensor(warped, dtype=torch.float64, requires_grad=True)
    n = _box(torch.ones_like(F), radius)
    F_sum, J_sum = _box(F, radius), _box(J, radius)
    cross = _box(F * J, radius) - F_sum * J_sum / n
    F_var = _box(F * F, radius) - F_sum * F_sum / n
    J_var = _box(J * J, radius) - J_sum * J_sum / n
    value = (cross * cross / (F_var * J_var + EPS)).mean()
    value.backward()
    return value.item(), J.grad.numpy()


def _pair(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    fixed = rng.uniform(0, 1, shape)
    warped = 0.7 * fixed + 0.3 * rng.uniform(0, 1, shape)  # correlated, not perfectly
    return fixed.astype(dtype), warped.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("radius", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
def test_box_sum_matches_a_convolution_with_ones(shape, radius, dtype):
    volume = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    expected = _box(torch.tensor(volume, dtype=torch.float64), radius).numpy()
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    assert_close("box_sum", registration.box_sum(volume, radius), expected, tolerance, tolerance)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("radius", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
def test_local_ncc_value_and_gradient_match_pytorch(shape, radius, dtype):
    fixed, warped = _pair(shape, dtype)
    expected_value, expected_grad = _ncc_oracle(fixed, warped, radius)
    measure = registration.LocalNCC(fixed, 2 * radius + 1)
    value, grad = measure(warped)
    assert grad.dtype == dtype and grad.shape == shape
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    assert value == pytest.approx(expected_value, rel=rtol)
    scale = np.abs(expected_grad).max()
    assert scale > 0
    assert_close("d ncc / d warped", grad, expected_grad, 1e-3 if dtype == np.float32 else 1e-9,
                 rtol * scale)
    assert measure.value(warped) == value  # the value alone takes the same sums


def test_local_ncc_gradient_matches_finite_differences():
    fixed, warped = _pair((5, 6, 7), np.float64, seed=2)
    measure = registration.LocalNCC(fixed, 3)
    _, grad = measure(warped)
    grad = grad.copy()
    step = 1e-6
    for index in [(0, 0, 0), (2, 3, 4), (4, 5, 6), (1, 0, 6)]:
        plus, minus = warped.copy(), warped.copy()
        plus[index] += step
        minus[index] -= step
        numeric = (measure.value(plus) - measure.value(minus)) / (2 * step)
        assert grad[index] == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def _ncc_bits(fixed, warped, threads):
    measure = registration.LocalNCC(fixed, 5)
    work = np.empty((3,) + fixed.shape, fixed.dtype)
    grad = np.empty_like(fixed)
    value = _cpu._kernels.local_ncc(measure.fixed, measure.F_sum, measure.F_var, warped, work,
                                    grad, 2, EPS, 1 / fixed.size, threads)
    sums = np.empty_like(fixed)
    _cpu._kernels.box_sum(warped, sums, 2, threads)
    return value, grad, sums


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_same_bits_for_every_thread_count_and_isa(dtype):
    fixed, warped = _pair((13, 17, 19), dtype, seed=3)
    reference = _ncc_bits(fixed, warped, 1)
    previous = _cpu.isa()
    try:
        for isa in _cpu.supported_isas():
            _cpu.set_isa(isa)
            for threads in (1, 2, 3, 5):
                value, grad, sums = _ncc_bits(fixed, warped, threads)
                assert value == reference[0], (isa, threads)
                np.testing.assert_array_equal(grad, reference[1], err_msg=f"{isa}, {threads}")
                np.testing.assert_array_equal(sums, reference[2], err_msg=f"{isa}, {threads}")
    finally:
        _cpu.set_isa(previous)


@pytest.mark.parametrize("case,match", [
    ("float16", "C-contiguous float32 or float64"),
    ("strided", "C-contiguous float32 or float64"),
    ("shape", "first volume's shape"),
    ("work", "work must be"),
])
def test_kernel_rejects_operands_it_cannot_read(case, match):
    fixed, warped = _pair((4, 5, 6), np.float32)
    measure = registration.LocalNCC(fixed, 3)
    work = np.empty((3, 4, 5, 6), np.float32)
    if case == "float16":
        warped = warped.astype(np.float16)
    elif case == "strided":
        warped = np.empty((4, 5, 12), np.float32)[..., ::2]
    elif case == "shape":
        warped = warped[:, :, :5].copy()
    else:
        work = work[:2]
    with pytest.raises(ValueError, match=match):
        kernels._kernels.local_ncc(measure.fixed, measure.F_sum, measure.F_var, warped, work,
                                   None, 1, EPS, 1.0, 1)


def _varying_oracle(volume):
    """NumPy: every voxel that differs from a neighbour along some axis, projected onto
    the (D, H) rows and the (D, W) columns."""
    varying = np.zeros(volume.shape, bool)
    for axis in range(3):
        low = (slice(None),) * axis + (slice(None, -1),)
        high = (slice(None),) * axis + (slice(1, None),)
        step = volume[high] != volume[low]
        varying[high] |= step
        varying[low] |= step
    return varying.any(axis=2), varying.any(axis=1)


# size-1 axes (no neighbour along them), a single voxel, and odd sizes
@pytest.mark.parametrize("shape", [(9, 11, 13), (1, 6, 7), (5, 1, 8), (4, 6, 1), (1, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_varying_rows_and_columns_match_numpy(shape, dtype):
    # a volume flat but for a few voxels, so that most rows and columns do not vary
    volume = np.zeros(shape, dtype)
    rng = np.random.default_rng(7)
    for index in zip(*(rng.integers(0, n, 3) for n in shape)):
        volume[index] = rng.uniform(1, 2)
    expected = _varying_oracle(volume)
    assert expected[0].any() == (volume.size > 1)
    previous = _cpu.isa()
    try:
        for isa in _cpu.supported_isas():
            _cpu.set_isa(isa)
            for threads in (1, 2, 3):
                rows = np.full(shape[:2], 7, np.uint8)  # written whole
                columns = np.full(shape[::2], 7, np.uint8)
                _cpu._kernels.varying(volume, rows, columns, threads)
                np.testing.assert_array_equal(rows, expected[0], err_msg=f"{isa}, {threads}")
                np.testing.assert_array_equal(columns, expected[1], err_msg=f"{isa}, {threads}")
    finally:
        _cpu.set_isa(previous)


def test_varying_rejects_rows_and_columns_of_the_wrong_shape():
    volume = np.zeros((3, 4, 5), np.float32)
    with pytest.raises(ValueError, match="rows and columns must be"):
        kernels._kernels.varying(volume, np.empty((3, 5), np.uint8), np.empty((3, 5), np.uint8), 1)
