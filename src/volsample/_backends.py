"""The seam between the op layer and the backends: the one place the front doors reach a
backend through, and the contract every backend keeps.

Two backends run checked descriptions (``volsample._calls``): the C++ core (``cpu``) runs
NumPy arrays, and CPU tensors as NumPy views of their memory; the Triton kernels
(``gpu``) run CUDA tensors (the torch door's ops choose by device, as the dispatcher
hands them the tensors). Each has one module per operator family (``grid_sample``,
``upsample``, ``warp``) with the same functions in the same argument order:

- ``forward(call, *operands, out, setting)`` and ``backward(call, grad_output, *operands,
  *gradients, setting)``: volumes as logical (N, C, D, H, W) views with any strides,
  results allocated by the caller and written whole (a gradient not asked for is None);
  grid sampling's and warps' ``setting`` is the backend's own (the C++ thread count,
  default ``get_num_threads``; the GPU's ``deterministic``), upsampling's forward and
  backward take the C++ thread count alone (the GPU's is always reproducible);
- ``workspace_nbytes(call, ...)``: the scratch memory a call allocates beyond its results;
- ``preparable`` and ``prepare_forward`` / ``prepare_backward`` (the forward's and the
  backward's arguments): a call prepared once for operands of the same shapes, strides
  and dtypes (and device), whose ``forward_on`` / ``backward_on`` run it on new ones (the
  C++ core's kernel arguments, also run on bare addresses; the Triton kernels' launches
  and tables); None where the backend runs the call unprepared (nothing to compute, and
  on the C++ core the operands it cannot take as they are).

The C++ core is imported with this module where it is built; without it, importing
volsample still works, CUDA tensors still run, and a CPU call says what is missing. The
Triton backend is imported on first use, and needs no C++ extension.
"""
from __future__ import annotations

import importlib
from types import ModuleType

_CPU_PACKAGE = "volsample._cpu"
_KERNELS = "volsample._cpu._kernels"
_GPU_PACKAGE = "volsample._triton"


class _Unbuilt:
    """Stands for the C++ backend (or one of its families) where its extension is not
    built: any use says so."""

    def __init__(self, what: str, error: ImportError):
        self._what = what
        self._error = error

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(
            f"volsample: {self._what} needs the C++ CPU backend ({_KERNELS}), which could "
            f"not be imported ({self._error}); build volsample with its C++ core, or compute "
            f"on CUDA tensors") from self._error


try:
    from . import _cpu
except ImportError as error:
    if error.name not in (_KERNELS, _CPU_PACKAGE):  # not the extension: a bug to see
        raise
    _cpu = _Unbuilt("computing on NumPy arrays and CPU tensors", error)  # type: ignore[assignment]


def cpu(family: str):
    """The C++ launchers of an operator family (``volsample._cpu.<family>``; also
    ``similarity``, the registration's window sums), or a stand-in that says the C++
    core is missing wherever it is used."""
    if isinstance(_cpu, _Unbuilt):
        return _Unbuilt(f"{family} on the CPU", _cpu._error)
    return importlib.import_module(f"{_CPU_PACKAGE}.{family}")


def gpu(family: str) -> ModuleType:
    """The Triton launchers of an operator family (``volsample._triton.<family>``),
    imported on first use."""
    name = f"{_GPU_PACKAGE}.{family}"
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise RuntimeError(
            f"volsample: CUDA tensors need the Triton GPU backend ({name}), which could "
            f"not be imported ({error}); install triton, or compute on CPU tensors") from error


def ffi_targets() -> dict | None:
    """The C++ core's XLA FFI handlers, name -> capsule, that volsample.jax registers with
    JAX; None where the core is not built, or was built without them (no jaxlib)."""
    if isinstance(_cpu, _Unbuilt) or not hasattr(_cpu._kernels, "ffi_targets"):
        return None
    return _cpu._kernels.ffi_targets()


def cpu_core():
    """The C++ core itself (``volsample._cpu``): its instruction sets and thread limit,
    for what reports them (``volsample info``, the benchmarks)."""
    return _cpu


# The thread count of the C++ kernels: their own setting, kept by the C++ backend (asked
# for without it, it says it is missing).
if isinstance(_cpu, _Unbuilt):
    get_num_threads = lambda: _cpu.get_num_threads()  # noqa: E731
    set_num_threads = lambda n: _cpu.set_num_threads(n)  # noqa: E731
else:
    get_num_threads = _cpu.get_num_threads
    set_num_threads = _cpu.set_num_threads
