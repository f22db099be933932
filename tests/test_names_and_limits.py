"""What a new user meets first: "trilinear" as the 3-D name of mode "bilinear", and results
too large to allocate refused with volsample's error (issue 34, items 7 and 8)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_bitwise_equal, numpy_array, torch_tensor

import volsample
import volsample.torch as vt
from volsample import _layout, _tables
from volsample._errors import InvalidArgumentError, OutputTooLargeError, VolsampleError


def _operands(seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    volume = rng.standard_normal((2, 3, 5, 6, 7)).astype(dtype)
    grid = rng.uniform(-1.2, 1.2, (2, 4, 3, 5, 3)).astype(dtype)
    return volume, grid


# ---------------------------------------------------------------------------------------
# "trilinear"
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_trilinear_forward_is_pytorchs_bilinear_bit_for_bit(padding_mode, align_corners):
    volume, grid = _operands()
    padding = {"zeros": 0, "border": 1, "reflection": 2}[padding_mode]
    expected = numpy_array(torch.ops.aten.grid_sampler_3d(
        torch_tensor(volume), torch_tensor(grid), 0, padding, align_corners))
    out = volsample.grid_sample_3d(volume, grid, "trilinear", padding_mode, align_corners)
    assert_bitwise_equal("output", out, expected)


def test_trilinear_backward_and_warp_equal_bilinear():
    volume, grid = _operands(1, np.float64)
    grad_output = np.random.default_rng(2).standard_normal((2, 3, 4, 3, 5))
    for a, b in zip(volsample.grid_sample_3d_backward(grad_output, volume, grid, "trilinear"),
                    volsample.grid_sample_3d_backward(grad_output, volume, grid, "bilinear")):
        assert_bitwise_equal("grad", a, b)
    theta = np.tile(np.eye(3, 4), (2, 1, 1)) * 0.9
    assert_bitwise_equal("warp", volsample.warp_3d(volume, theta, mode="trilinear"),
                         volsample.warp_3d(volume, theta, mode="bilinear"))
    grad_output = np.ones((2, 3, 5, 6, 7))
    for a, b in zip(volsample.warp_3d_backward(grad_output, volume, theta, None, "trilinear"),
                    volsample.warp_3d_backward(grad_output, volume, theta, None, "bilinear")):
        assert (a is None) == (b is None)
        if a is not None:
            assert_bitwise_equal("warp grad", a, b)


def test_trilinear_in_volsample_torch_forward_and_gradients():
    volume, grid = _operands(3, np.float64)
    results = {}
    for mode in ("trilinear", "bilinear"):
        x, g = (torch.from_numpy(a).requires_grad_() for a in (volume, grid))
        out = vt.grid_sample(x, g, mode, "border", True)
        out.square().sum().backward()
        theta = torch.eye(3, 4, dtype=torch.float64).expand(2, 3, 4).clone().requires_grad_()
        warped = vt.warp(x.detach(), theta, mode=mode)
        warped.sum().backward()
        results[mode] = [out.detach(), x.grad, g.grad, warped.detach(), theta.grad]
    for a, b in zip(results["trilinear"], results["bilinear"]):
        assert torch.equal(a, b)


def test_unknown_mode_message_lists_trilinear():
    volume, grid = _operands()
    with pytest.raises(InvalidArgumentError,
                       match=r"mode: expected one of 'bilinear', 'nearest'.*, got 'cubic' "
                             r"\('trilinear' is another name of 'bilinear'\)"):
        volsample.grid_sample_3d(volume, grid, "cubic")
    with pytest.raises(ValueError, match=r"got 'linear' \('trilinear' is another name"):
        vt.grid_sample(torch.from_numpy(volume), torch.from_numpy(grid), "linear")


def test_patched_grid_sample_keeps_pytorchs_rules():
    # PyTorch's F.grid_sample refuses "trilinear"; patched, it must too, with its message.
    x, g = (torch.from_numpy(a) for a in _operands())
    with pytest.raises(ValueError) as theirs:
        F.grid_sample(x, g, "trilinear", align_corners=False)
    with vt.patch(), pytest.raises(ValueError) as ours:
        F.grid_sample(x, g, "trilinear", align_corners=False)
    assert str(ours.value) == str(theirs.value)


def test_alias_is_a_name_not_a_choice():
    # The kernels' table (and _cpu.MODES) list choices only; an alias leaves the list alone,
    # so modes added to MODES later need no change here.
    assert "trilinear" not in _tables.MODES.names()
    assert _tables.MODES.code("trilinear") == _tables.MODES.code("bilinear") == 0
    table = _tables.Table("mode", [_tables.Mode("a", 0), _tables.Mode("b", 1),
                                   _tables.Mode("c", 2)])
    table.alias("z", "c")
    assert table.code("z") == 2
    assert table.names() == ("a", "b", "c")
    with pytest.raises(KeyError):
        table.alias("y", "missing")
    with pytest.raises(KeyError):
        table.alias("a", "b")  # a choice's own name cannot stand for another
    with pytest.raises(InvalidArgumentError, match=r"expected one of 'a', 'b', 'c', got 'y' "
                                                   r"\('z' is another name of 'c'\)"):
        table.code("y")


# ---------------------------------------------------------------------------------------
# Results too large to allocate
# ---------------------------------------------------------------------------------------

HUGE = 1 << 20  # per axis: 2**60 voxels, beyond any machine (and beyond int64 bytes at 2**63)


def _refused(call, name, shape, itemsize):
    with pytest.raises(OutputTooLargeError) as info:
        call()
    error = info.value
    nbytes = int(np.prod(shape, dtype=object)) * itemsize
    assert error.argument == name and error.value == shape and error.nbytes == nbytes
    assert str(error).startswith(f"{name}: shape {shape} of ")
    assert f"{nbytes:,} bytes" in str(error)
    assert isinstance(error, MemoryError) and isinstance(error, VolsampleError)


def test_upsample_output_beyond_memory_is_refused_by_name():
    volume = np.zeros((1, 2, 2, 2, 2), np.float32)
    _refused(lambda: volsample.upsample_trilinear_3d(volume, size=(HUGE, HUGE, HUGE)),
             "output", (1, 2, HUGE, HUGE, HUGE), 4)
    # 2**40 per axis: the product overflows int64, still counted exactly
    _refused(lambda: volsample.upsample_trilinear_3d(volume, scale_factor=2.0**39),
             "output", (1, 2, 2**40, 2**40, 2**40), 4)


def test_upsample_backward_grad_input_beyond_memory_is_refused():
    grad_output = np.zeros((1, 1, 2, 2, 2), np.float64)
    _refused(lambda: volsample.upsample_trilinear_3d_backward(grad_output,
                                                              (1, 1, HUGE, HUGE, 1)),
             "grad_input", (1, 1, HUGE, HUGE, 1), 8)


def test_grid_sample_results_beyond_memory_are_refused():
    volume = np.zeros((1, 1, 2, 2, 2), np.float32)
    grid = np.broadcast_to(np.float32(0), (1, HUGE, HUGE, 4, 3))  # no memory of its own
    _refused(lambda: volsample.grid_sample_3d(volume, grid), "output", (1, 1, HUGE, HUGE, 4), 4)
    grad_output = np.broadcast_to(np.float32(0), (1, 1, HUGE, HUGE, 4))
    _refused(lambda: volsample.grid_sample_3d_backward(grad_output, volume, grid,
                                                       output_mask=(False, True)),
             "grad_grid", (1, HUGE, HUGE, 4, 3), 4)
    # channels last: the shape as stored
    _refused(lambda: volsample.grid_sample_3d(volume.transpose(0, 2, 3, 4, 1), grid,
                                              layout="NDHWC"),
             "output", (1, HUGE, HUGE, 4, 1), 4)


def test_warp_output_beyond_memory_is_refused():
    volume = np.zeros((1, 3, 2, 2, 2), np.float32)
    _refused(lambda: volsample.warp_3d(volume, size=(HUGE, HUGE, 2)), "output",
             (1, 3, HUGE, HUGE, 2), 4)


def test_allocator_refusal_becomes_volsamples_error(monkeypatch):
    # A result within the machine's memory that the allocator still refuses (memory in use).
    def refuse(*args, **kwargs):
        raise MemoryError("Unable to allocate")

    monkeypatch.setattr(_layout.np, "empty", refuse)
    with pytest.raises(OutputTooLargeError, match=r"output: shape \(1, 1, 4, 4, 4\) of float32 "
                                                  r"needs 256 bytes .* can be allocated now"):
        volsample.upsample_trilinear_3d(np.zeros((1, 1, 2, 2, 2), np.float32), scale_factor=2)


@pytest.mark.parametrize("shape", [(3, 5), (3, 1 << 16)], ids=["small", "1.5 MiB"])
def test_results_within_memory_are_allocated(shape):
    out = _layout.aligned_empty(shape, np.float64, zero=True, name="x")
    assert out.shape == shape and out.flags.c_contiguous and not out.any()
    if out.nbytes >= 1 << 20:  # large enough to be streamed: on a cache line
        assert out.ctypes.data % _layout.ALIGNMENT == 0
