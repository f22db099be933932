"""The result cache: memory of large results handed out again once nothing uses it.

Reused memory holds the last result's bytes, not the operating system's zeros, so every
operator is run here with the cache's blocks poisoned (every byte 0xFF, a NaN in every
float type) and must give the bits it gives on new memory: a kernel that left an element
unwritten would show. The cache serves results of 32 MiB and more; these tests lower that
threshold so small volumes go through it.
"""
from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

import volsample
from volsample import _result_cache

torch = pytest.importorskip("torch")
import volsample.torch as vt  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def small_results(monkeypatch):
    """Cache every aligned result (1 MiB and up), starting from an empty cache."""
    limit, _ = volsample.get_result_cache()
    volsample.set_result_cache(0)
    volsample.set_result_cache(1 << 30)
    monkeypatch.setattr(_result_cache, "MIN_BYTES", 1 << 20)
    yield
    volsample.set_result_cache(0)
    volsample.set_result_cache(limit)


def _poison_unused():
    with _result_cache._lock:
        for i in range(len(_result_cache._blocks)):
            if _result_cache._references(_result_cache._blocks, i) == _result_cache._UNUSED:
                _result_cache._blocks[i].fill(0xFF)


def _result_cache_alignment() -> int:
    from volsample import _layout
    return _layout.ALIGNMENT


def _address(a) -> int:
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data_ptr()


def _bits(results):
    """Each result's bytes (None stays None), as a comparable list."""
    out = []
    for r in results if isinstance(results, (tuple, list)) else (results,):
        if r is None:
            out.append(None)
            continue
        if not isinstance(r, np.ndarray):
            r = r.detach().contiguous()
            r = (r.view(torch.int16) if r.dtype == torch.bfloat16 else r).numpy()
        out.append(np.ascontiguousarray(r).view(np.uint8).tobytes())
    return out


def _on_new_memory(op):
    limit, _ = volsample.get_result_cache()
    volsample.set_result_cache(0)
    try:
        return _bits(op())
    finally:
        volsample.set_result_cache(limit)


def _volume(rng, shape, dtype, layout="NCDHW"):
    arr = rng.standard_normal(shape).astype(dtype)
    return np.ascontiguousarray(arr.transpose(0, 2, 3, 4, 1)) if layout == "NDHWC" else arr


def _numpy_ops():
    """(name, op) for every NumPy API operator, each with results of 1 MiB and more."""
    rng = np.random.default_rng(7)
    ops = []
    for dtype in (np.float32, np.float64, np.float16, BF16):
        for layout in ("NCDHW", "NDHWC"):
            x = _volume(rng, (1, 2, 40, 36, 32), dtype, layout)
            grid = rng.uniform(-1.1, 1.1, (1, 48, 40, 36, 3)).astype(dtype)
            go = _volume(rng, (1, 2, 48, 40, 36), dtype, layout)
            for mode in ("bilinear", "nearest", "bicubic", "bspline"):
                for padding in ("zeros", "border", "reflection"):
                    kw = dict(mode=mode, padding_mode=padding, layout=layout)
                    ops.append((f"grid_sample_3d {np.dtype(dtype).name} {layout} {mode} {padding}",
                                lambda x=x, grid=grid, kw=kw: volsample.grid_sample_3d(
                                    x, grid, **kw)))
                    ops.append((f"grid_sample_3d_backward {np.dtype(dtype).name} {layout} {mode} "
                                f"{padding}",
                                lambda go=go, x=x, grid=grid, kw=kw:
                                    volsample.grid_sample_3d_backward(go, x, grid, **kw)))
            small = _volume(rng, (1, 2, 24, 20, 16), dtype, layout)
            up = volsample.upsample_trilinear_3d(small, scale_factor=2, layout=layout)
            ops.append((f"upsample_trilinear_3d {np.dtype(dtype).name} {layout}",
                        lambda small=small, layout=layout: volsample.upsample_trilinear_3d(
                            small, scale_factor=2, layout=layout)))
            ops.append((f"upsample_trilinear_3d_backward {np.dtype(dtype).name} {layout}",
                        lambda up=up, small=small, layout=layout:
                            volsample.upsample_trilinear_3d_backward(
                                up, (1, 2, 24, 20, 16), scales=(2.0, 2.0, 2.0), layout=layout)))
    x = rng.standard_normal((1, 2, 48, 40, 36)).astype(np.float32)
    theta = np.eye(3, 4, dtype=np.float32)[None] + rng.normal(0, 0.05, (1, 3, 4)).astype(
        np.float32)
    disp = rng.normal(0, 0.05, (1, 48, 40, 36, 3)).astype(np.float32)
    go = rng.standard_normal((1, 2, 48, 40, 36)).astype(np.float32)
    for mode in ("bilinear", "bspline"):
        ops.append((f"warp_3d {mode}", lambda mode=mode: volsample.warp_3d(
            x, theta, disp, mode=mode)))
        ops.append((f"warp_3d_backward {mode}", lambda mode=mode: volsample.warp_3d_backward(
            go, x, theta, disp, mode=mode)))
    ops.append(("spline_coefficients", lambda: volsample.spline_coefficients(x)))
    return ops


NUMPY_OPS = _numpy_ops()


@pytest.mark.parametrize("name,op", NUMPY_OPS, ids=[name for name, _ in NUMPY_OPS])
def test_numpy_results_on_reused_memory(small_results, name, op):
    expected = _on_new_memory(op)
    first = op()  # fills the cache with this op's sizes
    del first
    _poison_unused()
    assert _bits(op()) == expected


def _torch_ops():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, 40, 36, 32, generator=g)
    grid = torch.rand(1, 48, 40, 36, 3, generator=g) * 2.2 - 1.1
    disp = torch.randn(1, 48, 40, 36, 3, generator=g) * 0.05
    theta = torch.eye(3, 4)[None] + torch.randn(1, 3, 4, generator=g) * 0.05
    small = torch.randn(1, 2, 24, 20, 16, generator=g)

    def grads(f, *operands):
        leaves = [t.clone().requires_grad_() for t in operands]
        out = f(*leaves)
        out.backward(torch.ones_like(out) * 0.5)
        return (out,) + tuple(t.grad for t in leaves)
    ops = []
    for mode in ("bilinear", "nearest", "bicubic", "bspline"):
        for fmt in (torch.contiguous_format, torch.channels_last_3d):
            xs = x.contiguous(memory_format=fmt)
            ops.append((f"grid_sample {mode} {fmt}", lambda xs=xs, mode=mode: grads(
                lambda a, b: vt.grid_sample(a, b, mode=mode, align_corners=False), xs, grid)))
    ops.append(("grid_sample float64 bf16", lambda: (
        vt.grid_sample(x.double(), grid.double()),
        vt.grid_sample(x.bfloat16(), grid.bfloat16()))))
    ops.append(("warp", lambda: grads(lambda a, t, d: vt.warp(a, t, d), x, theta, disp)))
    ops.append(("upsample_trilinear", lambda: grads(
        lambda a: vt.upsample_trilinear(a, scale_factor=2), small)))
    ops.append(("torch.ops grid_sampler_3d_backward", lambda: torch.ops.volsample.grid_sampler_3d_backward(
        torch.ones(1, 2, 48, 40, 36), x, grid, 0, 0, True, [True, True])))
    return ops


TORCH_OPS = _torch_ops()


@pytest.mark.parametrize("name,op", TORCH_OPS, ids=[name for name, _ in TORCH_OPS])
def test_torch_results_on_reused_memory(small_results, name, op):
    expected = _on_new_memory(op)
    for _ in range(2):  # the second call runs prepared, its allocators from the first
        del _
        first = op()
        del first
        _poison_unused()
        assert _bits(op()) == expected


def test_memory_in_use_is_not_handed_out(small_results):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 64, 64, 64)).astype(np.float32)
    grid = rng.uniform(-1, 1, (1, 64, 64, 64, 3)).astype(np.float32)
    first = volsample.grid_sample_3d(x, grid)
    address = _address(first)
    view = first[0, 0, 3]
    del first
    second = volsample.grid_sample_3d(x, grid)  # the view still uses the first's memory
    assert _address(second) != address
    del second
    assert _address(volsample.grid_sample_3d(x, grid)) != address
    view = None
    assert _address(volsample.grid_sample_3d(x, grid)) == address

    del view
    volsample.set_result_cache(0)  # forget the NumPy results' blocks, of the same size
    volsample.set_result_cache(1 << 30)
    tensor = vt.grid_sample(torch.from_numpy(x), torch.from_numpy(grid))
    address = _address(tensor)
    row = tensor[0, 0, 5]  # a view holds the tensor's storage, and so the block
    del tensor
    other = vt.grid_sample(torch.from_numpy(x), torch.from_numpy(grid))
    assert _address(other) != address
    del other, row
    assert _address(vt.grid_sample(torch.from_numpy(x), torch.from_numpy(grid))) == address


def test_gradients_kept_in_grad_stay_in_use(small_results):
    x = torch.randn(1, 1, 64, 64, 64, requires_grad=True)
    grid = (torch.rand(1, 64, 64, 64, 3) * 2 - 1).requires_grad_()
    vt.grid_sample(x, grid).sum().backward()
    kept = grid.grad.clone()
    vt.grid_sample(x, grid).sum().backward()  # accumulates into the kept gradients
    torch.testing.assert_close(grid.grad, 2 * kept, rtol=0, atol=1e-5)
    address = grid.grad.data_ptr()
    grid.grad = None
    x.grad = None
    vt.grid_sample(x, grid).sum().backward()
    assert grid.grad.data_ptr() == address  # released, then reused
    assert torch.equal(grid.grad, kept)


def test_limit_bounds_the_unused_memory_kept(small_results):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 32, 32, 32)).astype(np.float32)
    results = [volsample.grid_sample_3d(x, rng.uniform(-1, 1, (1, 64, 64, n, 3)).astype(
        np.float32)) for n in (64, 65, 66, 67)]
    sizes = [r.nbytes + _result_cache_alignment() for r in results]
    del results
    volsample.set_result_cache(sizes[0] + sizes[1])
    # The least recently handed out are dropped first, until what is kept fits.
    assert volsample.get_result_cache() == (sizes[0] + sizes[1], sizes[3])
    volsample.set_result_cache(0)
    assert volsample.get_result_cache() == (0, 0)
    first = volsample.grid_sample_3d(x, rng.uniform(-1, 1, (1, 64, 64, 64, 3)).astype(
        np.float32))
    assert not _result_cache._blocks and first.shape == (1, 1, 64, 64, 64)


def test_threads_get_blocks_of_their_own(small_results):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 1, 48, 48, 48)).astype(np.float32)
    grids = [rng.uniform(-1, 1, (1, 64, 64, 64, 3)).astype(np.float32) for _ in range(4)]
    expected = [_on_new_memory(lambda g=g: volsample.grid_sample_3d(x, g)) for g in grids]
    got = [None] * 4

    def run(i):
        for _ in range(5):
            got[i] = _bits(volsample.grid_sample_3d(x, grids[i]))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected


@pytest.mark.parametrize("value,error", [(-1, ValueError), (1.5, TypeError),
                                         (True, TypeError), ("1G", TypeError)])
def test_bad_limit_is_refused(value, error):
    with pytest.raises(error, match="set_result_cache: max_bytes"):
        volsample.set_result_cache(value)
