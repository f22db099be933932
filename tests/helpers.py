"""Shared test utilities: verbose comparisons and NumPy <-> torch conversion (bfloat16 too)."""
from __future__ import annotations

import os
import pathlib
import shutil
import sys

import ml_dtypes
import numpy as np

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
SIXTEEN_BIT = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def assert_close(name, actual, expected, rtol, atol):
    """Compare arrays elementwise; on failure name the tensor and count the mismatches."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    bad = ~np.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    if bad.any():
        where = np.argwhere(bad)[0]
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {bad.size} elements differ (rtol={rtol}, atol={atol}); "
            f"first at {tuple(where)}: {actual[tuple(where)]!r} vs {expected[tuple(where)]!r}; "
            f"max abs diff {np.nanmax(np.abs(actual - expected)):.3g}")


def assert_bitwise_equal(name, a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, f"{name}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    same = a.view(np.uint8) == b.view(np.uint8)
    assert same.all(), f"{name}: {int((~same).sum())} bytes differ"


def assert_same_bits(name, actual, expected):
    """Bit equality under IEEE 754's NaN rule: every element that is not NaN in ``expected``
    has its bits in ``actual``, and ``actual`` is NaN exactly where ``expected`` is (a NaN's
    sign and payload are free: where two NaNs meet, which one an operation returns is
    unspecified). On failure, name the tensor, count the mismatches, show the first."""
    actual, expected = np.ascontiguousarray(actual), np.ascontiguousarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        f"{name}: {actual.dtype}{actual.shape} vs {expected.dtype}{expected.shape}")
    bits = np.dtype(f"u{actual.itemsize}")
    nan_a, nan_e = np.isnan(actual), np.isnan(expected)
    bad = (nan_a != nan_e) | (~nan_e & (actual.view(bits) != expected.view(bits)))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        a, e = actual[where], expected[where]
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {bad.size} elements differ; first at {where}: "
            f"{a!r} ({a.view(bits):#x}) vs {e!r} ({e.view(bits):#x})")


def torch_tensor(arr):
    """A torch tensor with the values of a NumPy array (bfloat16 kept as bfloat16)."""
    import torch
    arr = np.ascontiguousarray(arr)
    if arr.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(arr.copy())


def numpy_array(tensor):
    """A NumPy array with the values of a torch tensor (bfloat16 kept as bfloat16)."""
    import torch
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return tensor.numpy().copy()


class KernelRuns:
    """Counts the runs of a C++ launcher of a ``volsample._cpu`` module (``name``:
    "forward" or "backward"): its direct launches, and the runs of the kernels that
    ``prepare_<name>`` prepares while it counts (the torch layer's prepared calls are
    forgotten first, so that each is prepared again)."""

    def __init__(self, monkeypatch, module, name):
        from volsample import _prepared
        _prepared.forget_prepared_calls()
        self.calls = 0
        launch, prepare = getattr(module, name), getattr(module, f"prepare_{name}", None)

        def counted(*args, **kwargs):
            self.calls += 1
            return launch(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
        if prepare is None:
            return

        def counted_prepare(*args, **kwargs):
            kernel = prepare(*args, **kwargs)
            return None if kernel is None else _CountedKernel(kernel, name, self)
        monkeypatch.setattr(module, f"prepare_{name}", counted_prepare)


class _CountedKernel:
    """A prepared kernel whose runs of ``name`` (on addresses, or ``name_on`` arrays) a
    KernelRuns counts."""

    def __init__(self, kernel, name, runs):
        self.kernel, self.name, self.runs = kernel, name, runs

    def __getattr__(self, name):
        run = getattr(self.kernel, name)
        if name not in (self.name, self.name + "_on"):
            return run

        def counted(*addresses):
            self.runs.calls += 1
            return run(*addresses)
        return counted


def shell_environment(folder: pathlib.Path) -> dict[str, str]:
    """An environment whose ``python`` and ``volsample`` are this interpreter and the
    volsample imported here (installed or not), as a user's shell finds them after the
    README's install: the documented commands run as written."""
    import volsample

    folder.mkdir()
    for name, line in (("python", f'exec "{sys.executable}" "$@"'),
                       ("volsample", f'exec "{sys.executable}" -m volsample "$@"')):
        script = folder / name
        script.write_text(f"#!/bin/sh\n{line}\n")
        script.chmod(0o755)
    package_root = str(pathlib.Path(volsample.__file__).resolve().parents[1])
    return dict(os.environ, PATH=f"{folder}{os.pathsep}{os.environ.get('PATH', '')}",
                PYTHONPATH=os.pathsep.join(
                    [package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


# A POSIX shell for the documented commands, found where a user's shell lives even when PATH
# holds only a virtual environment's programs (as CI's does: no compiler to fall back on).
BASH = shutil.which("bash") or next(
    (path for path in ("/bin/bash", "/usr/bin/bash") if os.access(path, os.X_OK)), None)
