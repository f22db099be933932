"""What the operator families share: the torch front door's half of the op layer (tensors
as ``_calls.Operand``s, PyTorch's exception classes), zero-copy NumPy views of CPU tensors
for the C++ backend, memory formats and the GPU backend.

A CPU tensor reaches the C++ kernels as a NumPy view of its own memory in logical (N, C,
D, H, W) order, whatever its strides (a bfloat16 tensor through its int16 bits viewed as
``ml_dtypes.bfloat16``); results are tensors allocated here, which the kernels write
through such views. The torch layer adds no copy in either direction.
"""
from __future__ import annotations

import ctypes
import functools
import importlib
import inspect
import mmap
import sys
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad

from .. import _calls, _checks
from .._torch_formats import is_channels_last, memory_format

_TO_NUMPY = {torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
             torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
_TO_TORCH = {v: k for k, v in _TO_NUMPY.items()}

# How the torch front door speaks: tensors, torch dtypes, logical shapes.
TORCH = _calls.Dialect(noun="tensor", spell=lambda name: f"torch.{name}", names_layout=False)


# ---------------------------------------------------------------------------------------
# Memory format
# ---------------------------------------------------------------------------------------


def layout(t: torch.Tensor) -> str:
    """The NumPy API ``layout`` that reads the volume ``t`` in its own memory order."""
    return "NDHWC" if is_channels_last(t) else "NCDHW"


def empty_volume(shape, like: torch.Tensor, dtype=None) -> torch.Tensor:
    """An uninitialised volume of logical ``shape`` on ``like``'s device, in its format."""
    return huge_pages(torch.empty(tuple(shape), dtype=dtype or like.dtype, device=like.device,
                                  memory_format=memory_format(like)))


def empty_contiguous(like: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``like``'s shape, dtype and device."""
    return huge_pages(torch.empty_like(like, memory_format=torch.contiguous_format))


def huge_pages(t: torch.Tensor) -> torch.Tensor:
    """``t``, a new result; on Linux, one of 4 MiB or more is advised onto transparent huge
    pages before its first touch, as NumPy advises its own arrays (and so the NumPy API's
    results): under the kernel's "madvise" setting, first touching a large result page by
    4 KiB page took several times as long as the sampling itself."""
    nbytes = t.numel() * t.element_size()
    if _madvise is None or nbytes < _HUGE_PAGE_BYTES or not t.is_cpu:
        return t
    start = t.data_ptr()
    first = -(-start // _PAGE) * _PAGE  # whole pages inside the tensor's memory
    length = (start + nbytes - first) // _PAGE * _PAGE
    if length > 0:
        _madvise(first, length, mmap.MADV_HUGEPAGE)  # a hint: its failure changes nothing
    return t


_HUGE_PAGE_BYTES = 4 << 20  # NumPy's threshold
_PAGE = mmap.PAGESIZE


def _libc_madvise():
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        madvise = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


_madvise = _libc_madvise()


# ---------------------------------------------------------------------------------------
# CPU tensors as NumPy arrays, without copies
# ---------------------------------------------------------------------------------------


class _TensorMemory:
    """NumPy's array interface over a CPU tensor's elements, read-only. The address comes
    from ``Tensor.const_data_ptr()``, a read access: ``Tensor.numpy()``, ``data_ptr()``,
    ``__dlpack__()`` and the storage's ``data_ptr()`` all take the writable address, which
    makes a lazily copied (copy-on-write) tensor copy its data first. The array's base is
    this object, which holds the tensor, so the memory lives as long as the array."""

    def __init__(self, t: torch.Tensor):
        self.tensor = t
        size = t.element_size()
        self.__array_interface__ = {
            "version": 3, "shape": tuple(t.shape), "typestr": f"<u{size}",
            "strides": tuple(s * size for s in t.stride()), "data": (t.const_data_ptr(), True)}  # type: ignore[attr-defined]  # not in torch's stubs


_is_cow = torch._C._is_cow_tensor  # type: ignore[attr-defined]  # not in torch's stubs


def read_only_array(t: torch.Tensor) -> np.ndarray:
    """The elements of the CPU tensor ``t`` (an operand the op only reads) as a read-only
    NumPy array of its logical shape and strides: a view of its memory, never a copy, and a
    copy-on-write tensor stays unmaterialised. The raw elements: an op's operands come
    with negative views resolved by the dispatcher."""
    if not _is_cow(t):  # Tensor.numpy(): the cheapest view (no Python object of ours)
        arr = _numpy_view(t.detach())
        arr.flags.writeable = False
        return arr
    # Unsigned words of the element's size, then the element type (NumPy has no bfloat16).
    return np.asarray(_TensorMemory(t.detach())).view(_TO_NUMPY[t.dtype])


def writable_array(t: torch.Tensor | None) -> np.ndarray | None:
    """A result tensor the op allocated (never a lazy copy) as a writable NumPy view of the
    same logical shape and strides; None stays None (a gradient not asked for)."""
    return None if t is None else _numpy_view(t)


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: reinterpret the bits
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# ---------------------------------------------------------------------------------------
# Errors: volsample's classes and messages, said as PyTorch says the same mistake
# ---------------------------------------------------------------------------------------


class ArgumentError(_checks.InvalidArgumentError, RuntimeError):
    """A bad value, shape or mode (PyTorch raises RuntimeError, or ValueError for mode
    strings and for size/scale_factor both or neither: this is both)."""


class DTypeError(_checks.UnsupportedDTypeError, NotImplementedError):
    """A tensor of an unsupported or mismatched dtype (PyTorch: NotImplementedError for
    integer tensors, RuntimeError for mixed ones; NotImplementedError is a RuntimeError),
    or not a tensor (TypeError, as volsample.UnsupportedDTypeError is)."""


class ArgumentTypeError(_checks.InvalidArgumentError, TypeError, RuntimeError):
    """An argument of the wrong Python type: a float size, a non-bool align_corners
    (PyTorch: TypeError)."""


class UnsupportedArgumentError(_checks.InvalidArgumentError, NotImplementedError):
    """A call PyTorch does not implement: trilinear upsampling of a tensor that is not 5-D
    (PyTorch: NotImplementedError, a RuntimeError)."""


_TORCH_CLASSES = (ArgumentError, DTypeError, ArgumentTypeError, UnsupportedArgumentError)
_TORCH_CLASS = {_checks.InvalidArgumentError: ArgumentError,
                _checks.UnsupportedDTypeError: DTypeError}

GRID_SAMPLER, UPSAMPLE = "grid_sampler", "upsample_trilinear3d"  # the operators, in errors
WARP = "warp"  # volsample's own: PyTorch has no words for its mistakes

# PyTorch's words that several mistakes share
_INVALID_UPSAMPLE_ARGUMENTS = ("upsample_trilinear3d() received an invalid combination of "
                               "arguments")
_NO_VOXELS = "Input and output sizes should be greater than 0"
_OVERFLOW = "value cannot be converted to type int64_t without overflow"
_GRID_RANK = "grid_sampler(): expected 5D input and grid with same number of dimensions"


def _scalar_type(dtype) -> str:
    """PyTorch's C++ name of a dtype, torch's or NumPy's (torch.int32: Int), as its
    messages print it."""
    if not isinstance(dtype, torch.dtype):
        dtype = _TO_TORCH.get(dtype) or torch.from_numpy(np.empty(0, dtype)).dtype
    return torch.empty(0, dtype=dtype).type()[len("torch."):-len("Tensor")]


def _expected_scalar_type(dtypes) -> str:
    expected, found = dtypes
    return f"expected scalar type {_scalar_type(expected)} but found {_scalar_type(found)}"


def _not_implemented(op: str):
    return lambda dtype: f'"{op}" not implemented for \'{_scalar_type(dtype)}\''


def _trilinear_rank(ndim: int) -> str:
    if ndim in (3, 4):
        return f"Got {ndim}D input, but trilinear mode needs 5D input"
    return (f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {ndim}D) for the "
            f"modes: nearest | linear | bilinear | bicubic | trilinear | lanczos | area | "
            f"nearest-exact (got trilinear)")


def _grid_mode(mode) -> str:
    return (f"nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or "
            f"'bicubic', but got: '{mode}'")


def _size_types(size) -> str:
    if not isinstance(size, (list, tuple)):  # one size, repeated before the op's parser
        return _INVALID_UPSAMPLE_ARGUMENTS
    return ("expected size to be one of int or Tuple[int] or Tuple[int, int] or "
            f"Tuple[int, int, int], but got size with types {[type(v) for v in size]}")


def _scale_types(scale_factor) -> str:
    if not isinstance(scale_factor, (list, tuple)):
        return _INVALID_UPSAMPLE_ARGUMENTS
    return "upsample_trilinear3d(): argument 'scale_factors' must be tuple of floats"


# What PyTorch 2.13 raises for each mistake (torch.nn.functional.grid_sample / interpolate,
# aten::grid_sampler_3d, aten::upsample_trilinear3d and its backward), keyed by (operator,
# argument, kind of mistake; the kinds are volsample._checks'): the torch layer's class
# that is also PyTorch's, and PyTorch's words, as they are or a function of the value that
# came. They start the message; volsample's own (argument, expected, got) follows in
# parentheses. Mistakes PyTorch has no words for keep volsample's message alone.
_PYTORCH_WORDS: dict[tuple[str, str | None, str | None], tuple[Any, Any]] = {
    (GRID_SAMPLER, "input", "type"): (
        DTypeError, "grid_sampler(): argument 'input' (position 1) must be Tensor"),
    (GRID_SAMPLER, "grid", "type"): (
        DTypeError, "grid_sampler(): argument 'grid' (position 2) must be Tensor"),
    (GRID_SAMPLER, "input", "dtype"): (DTypeError, _not_implemented("grid_sampler_3d")),
    (GRID_SAMPLER, "grid", "dtype_mismatch"): (DTypeError, _expected_scalar_type),
    (GRID_SAMPLER, "grad_output", "dtype_mismatch"): (DTypeError, _expected_scalar_type),
    (GRID_SAMPLER, "input", "rank"): (ArgumentError, _GRID_RANK),
    (GRID_SAMPLER, "grid", "rank"): (ArgumentError, _GRID_RANK),
    (GRID_SAMPLER, "grid", "shape"): (
        ArgumentError, "grid_sampler(): expected grid to have size 3 in last dimension"),
    (GRID_SAMPLER, "grid", "batch"): (
        ArgumentError, "grid_sampler(): expected grid and input to have same batch size"),
    (GRID_SAMPLER, "input", "empty"): (
        ArgumentError, "grid_sampler(): expected input to have non-empty spatial dimensions"),
    (GRID_SAMPLER, "grid", "device"): (
        ArgumentError, "grid_sampler(): expected input and grid to be on same device"),
    (GRID_SAMPLER, "mode", "choice"): (ArgumentError, _grid_mode),
    (GRID_SAMPLER, "padding_mode", "choice"): (
        ArgumentError, lambda padding_mode: (
            "nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or "
            f"'reflection', but got: '{padding_mode}'")),
    (GRID_SAMPLER, "align_corners", "type"): (
        ArgumentTypeError, lambda value: ("grid_sampler(): argument 'align_corners' (position "
                                          f"5) must be bool, not {type(value).__name__}")),
    (UPSAMPLE, "input", "dtype"): (DTypeError, _not_implemented("upsample_trilinear3d")),
    (UPSAMPLE, "input", "rank"): (UnsupportedArgumentError, _trilinear_rank),
    (UPSAMPLE, "input", "empty"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "size", "type"): (ArgumentTypeError, _size_types),
    (UPSAMPLE, "size", "length"): (
        ArgumentError, "Input and output must have the same number of spatial dimensions"),
    (UPSAMPLE, "size", "too_small"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "scale_factor", "type"): (ArgumentTypeError, _scale_types),
    (UPSAMPLE, "scale_factor", "length"): (
        ArgumentError, "Input and scale_factor must have the same number of spatial dimensions"),
    (UPSAMPLE, "scale_factor", "too_small"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "scale_factor", "too_large"): (ArgumentError, _OVERFLOW),
    (UPSAMPLE, "scale_factor", "nonfinite"): (ArgumentError, _OVERFLOW),
    (UPSAMPLE, "size, scale_factor", "exclusive"): (
        ArgumentError, lambda got: ("only one of size or scale_factor should be defined"
                                    if got == "both"
                                    else "either size or scale_factor should be defined")),
    (UPSAMPLE, "align_corners", "type"): (ArgumentTypeError, _INVALID_UPSAMPLE_ARGUMENTS),
    (UPSAMPLE, "output_size", "length"): (
        ArgumentError, lambda size: f"It is expected output_size equals to 3, but got size "
                                    f"{len(size)}"),
    (UPSAMPLE, "output_size", "too_small"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "input_size", "length"): (
        ArgumentError, lambda size: f"It is expected input_size equals to 5, but got size "
                                    f"{len(size)}"),
    (UPSAMPLE, "input_size", "empty"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "grad_output", "empty"): (ArgumentError, _NO_VOXELS),
    (UPSAMPLE, "grad_output", "shape"): (
        ArgumentError, "Expected grad_output to have the same shape as output"),
}


def _torch_error(op: str, error: _checks.VolsampleError) -> _checks.VolsampleError:
    """``error`` of the shared checks as the torch layer raises it for operator ``op``."""
    cls, words = _PYTORCH_WORDS.get((op, error.argument, error.kind), (None, None))
    if cls is None:
        cls, message = _TORCH_CLASS[type(error)], str(error)
    else:
        message = f"{words(error.value) if callable(words) else words} ({error})"
    return cls(message, argument=error.argument, kind=error.kind, value=error.value)


class torch_errors:
    """Context: re-raise the shared checks' errors as the torch layer's classes, in
    PyTorch's words for the operator ``op`` (GRID_SAMPLER or UPSAMPLE) followed by
    volsample's message. (A class, not a generator: entered on every call of a door.)"""

    def __init__(self, op: str):
        self.op = op

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> None:
        if isinstance(error, _checks.VolsampleError) and not isinstance(error, _TORCH_CLASSES):
            raise _torch_error(self.op, error).with_traceback(traceback) from None


def raises_torch_errors(op: str):
    """Decorate a check or entry point of operator ``op`` so that its errors are the torch
    layer's (see ``torch_errors``; a plain try, cheaper per call than the context)."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except _TORCH_CLASSES:
                raise
            except _checks.VolsampleError as error:
                raise _torch_error(op, error).with_traceback(error.__traceback__) from None
        return wrapper
    return decorate


def _call_key(*args):
    """What an op's description depends on: its tensors' shapes, strides, dtypes and
    devices, and its other arguments (of their types; lists as tuples)."""
    return tuple((a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor)
                 else (list, tuple(a)) if isinstance(a, list) else (type(a), a)
                 for a in args)


# Decorate an op's ``describe(*args)`` (its checked ``_calls`` description) to reuse the
# description of an earlier call with the same ``_call_key``: building it costs more than a
# small call's kernel. Failing calls raise every time; calls that torch.compile traces
# (their sizes may be symbolic, and dynamo would guard on the caches) or strideless
# tensors describe afresh.
cached_description = _calls.memoised(_call_key)
_calls.tracing = torch.compiler.is_compiling


# Calls the C++ kernels ran before, prepared: each op's CPU kernel keeps (in a
# ``_calls.prepared_calls()`` cache), per key of a call's tensors (``tensor_key``), its
# other arguments and the thread count, the
# ``_kernels.PreparedGridSample`` (or the like) of its first run and its results' shapes
# and strides. A repeated call then allocates its results and hands the kernel the
# tensors' addresses (``const_data_ptr``: copy-on-write inputs stay lazy), with no
# description, NumPy view or check made again: a call with the same key passes the same
# checks.


def tensor_key(t: torch.Tensor):
    """What a prepared CPU call depends on of a tensor: its shape, strides and dtype (the
    op's CPU kernel sees CPU tensors only)."""
    return t.shape, t.stride(), t.dtype


def allocator(t: torch.Tensor):
    """A function of no arguments that allocates an uninitialised CPU tensor of ``t``'s
    shape, strides and dtype (advised onto huge pages where ``huge_pages`` would): a
    prepared call's result, allocated with nothing worked out again."""
    new = functools.partial(torch.empty_strided, tuple(t.shape), t.stride(), dtype=t.dtype)
    if t.numel() * t.element_size() < _HUGE_PAGE_BYTES:
        return new
    return lambda: huge_pages(new())


# ---------------------------------------------------------------------------------------
# Torch-level checks: tensors become the op layer's operands
# ---------------------------------------------------------------------------------------

_DTYPE_NAMES = "torch.float16, torch.bfloat16, torch.float32 or torch.float64"


def tensor(name: str, value) -> torch.Tensor:
    """``value`` as a 5-D tensor (every operand here is 5-D); its dtype is the op layer's
    to judge."""
    if not isinstance(value, torch.Tensor):
        raise _checks.UnsupportedDTypeError(
            f"{name}: expected a torch.Tensor, got {type(value).__name__}",
            argument=name, kind="type", value=value)
    if value.dim() != 5:
        raise _checks.InvalidArgumentError(
            f"{name}: expected a 5-D tensor, got {value.dim()}-D with shape {tuple(value.shape)}",
            argument=name, kind="rank", value=value.dim())
    return value


def operand(name: str, value) -> _calls.Operand:
    """A tensor argument as the op layer takes it: its logical shape and its dtype as
    NumPy's (the op layer's rules judge both)."""
    if not isinstance(value, torch.Tensor):
        raise _checks.UnsupportedDTypeError(
            f"{name}: expected a torch.Tensor, got {type(value).__name__}",
            argument=name, kind="type", value=value)
    dtype = numpy_dtype(value.dtype)
    if dtype is None:  # no NumPy twin (complex32, quantized, ...): unsupported anyway
        raise _checks.UnsupportedDTypeError(
            f"{name}: expected dtype {_DTYPE_NAMES}, got {value.dtype}",
            argument=name, kind="dtype", value=value.dtype)
    return _calls.Operand(name, tuple(value.shape), dtype)


def numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    """The NumPy dtype of a torch dtype, None where NumPy has none."""
    if dtype in _TO_NUMPY:
        return _TO_NUMPY[dtype]
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):
        return None


def same_device(**tensors: torch.Tensor) -> None:
    """All ``tensors`` live on one device (kernels read them all from there)."""
    (_, first), *others = tensors.items()
    for name, t in others:
        if t.device != first.device:
            found = ", ".join(f"{n} on {u.device}" for n, u in tensors.items())
            raise _checks.InvalidArgumentError(
                f"{name}: expected all tensors on one device, got {found}",
                argument=name, kind="device", value=t.device)


def align_corners(value) -> bool:
    """PyTorch's ``align_corners``: a bool, or None for its default, False (PyTorch warns
    for grid_sample; volsample does not)."""
    if value is None:
        return False
    if not isinstance(value, (bool, np.bool_)):
        raise _checks.InvalidArgumentError(
            f"align_corners: expected a bool or None, got {type(value).__name__} {value!r}",
            argument="align_corners", kind="type", value=value)
    return bool(value)


def sizes(value):
    """PyTorch's output size, or sizes, with each 0-d integer tensor as its int (as
    F.interpolate takes them); the shared checks judge the rest (a float is a mistake)."""
    def plain(v):
        integer = (isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype != torch.bool
                   and not v.dtype.is_floating_point and not v.dtype.is_complex)
        return int(v) if integer else v
    return tuple(plain(v) for v in value) if isinstance(value, (list, tuple)) else plain(value)


# ---------------------------------------------------------------------------------------
# The ops, defined at the dispatcher's own level: a schema, a kernel per dispatch key, a
# fake for torch.compile, an Autograd kernel and a batching rule. (torch.library.custom_op
# would wrap each kernel in per-call Python that costs more than a small call's kernel.)
# ---------------------------------------------------------------------------------------

_LIBRARY = torch.library.Library("volsample", "DEF")
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


def custom_op(name: str, schema: str, devices=("cpu",)):
    """Decorator: define the op ``volsample::<name>`` of ``schema`` with the function as its
    kernel on ``devices``; returns the op (``torch.ops.volsample.<name>.default``)."""
    def define(fn):
        _LIBRARY.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
        for device in devices:
            _LIBRARY.impl(name, fn, _DISPATCH_KEYS[device])
        op = getattr(torch.ops.volsample, name).default
        _CPU_KERNELS[op] = fn
        return op
    return define


_CPU_KERNELS: dict = {}  # op -> its CPU kernel, for ``below_autograd``'s direct calls


def below_autograd(op, *args):
    """``op(*args)`` below autograd (what a Function's forward and an unrecorded call run).
    Plain CPU tensors with nothing watching the dispatcher go straight to the op's CPU
    kernel: the dispatcher's round trip into Python costs more than a small kernel, and
    there is nothing for it to do (its other keys would fall through)."""
    kernel = _CPU_KERNELS.get(op)
    if kernel is not None and direct(args):
        return kernel(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def direct(args) -> bool:
    """Whether a call may skip the dispatcher: ``nothing_watches`` and every tensor
    ``plain_cpu``."""
    if not nothing_watches():
        return False
    for a in args:  # a loop, not all(...): a generator costs more than these tests
        if isinstance(a, torch.Tensor) and not plain_cpu(a):
            return False
    return True


def plain_cpu(t: torch.Tensor) -> bool:
    """Whether ``t`` is what the fast paths are written for, a dense CPU tensor with
    storage and nothing lazy about it: the one rule of every direct call. Its dispatch
    keys say it in one test: any other key is work the dispatcher does first or a tensor
    whose memory is not its elements (a legacy or functorch batched tensor, a grad
    wrapper, a Python subclass with ``__torch_dispatch__``, a conjugate or negative view,
    a zero tensor, meta, sparse or nested). Subclasses (FakeTensor, a user's) take the
    general path too; ``nn.Parameter`` is a plain tensor."""
    return type(t) in _PLAIN_TYPES and _dispatch_keys(t) in _PLAIN_CPU_KEYS


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_dispatch_keys = torch._C._dispatch_keys


def _plain_cpu_keys() -> tuple:
    """The dispatch keys of a plain CPU tensor (CPU, ADInplaceOrView, AutogradCPU,
    AutocastCPU) and of one made under ``torch.inference_mode`` (no autograd keys)."""
    with torch.inference_mode():
        inference = torch.empty(0)
    return _dispatch_keys(torch.empty(0)), _dispatch_keys(inference)


_PLAIN_CPU_KEYS = _plain_cpu_keys()


def nothing_watches() -> bool:
    """No dispatch or function mode (FakeTensor, tracing, opcheck, ``torch.device``
    contexts), no torch.func transform, no profiler (which records ops at the dispatcher),
    no ``torch.jit.trace`` (whose tracer is a dispatch key: skipped, it would record the
    kernel's allocations, not the op). (The tests' functions are bound here once: between
    the engine's work a lookup in torch's large module dictionaries costs more than the
    test.)"""
    return not (_dispatch_modes() or _function_modes() or _transforms_active()
                or _profiler._is_profiler_enabled or _tracing_state() is not None)


_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_transforms_active = torch._C._are_functorch_transforms_active
_tracing_state = torch._C._get_tracing_state
_profiler = torch.autograd.profiler
_is_compiling = torch.compiler.is_compiling


def eager(*tensors: torch.Tensor) -> bool:
    """Whether a door's call on ``tensors`` may go straight to the op's CPU kernel, or to
    its Function's C++ apply whose forward runs that kernel: nothing compiles or traces
    it, no forward-AD level, and ``direct``."""
    return not _is_compiling() and _forward_ad._current_level < 0 and direct(tensors)


def cpu_kernel(op):
    """The Python function that is ``op``'s CPU kernel."""
    return _CPU_KERNELS[op]


def c_apply(function):
    """``function``'s C++ ``apply``, which binds no signature (see ``Function``): for
    plain tensors with every argument given."""
    return super(torch.autograd.Function, function).apply


def register_kernel(op, device: str):
    """Decorator: the function is ``op``'s kernel for tensors on ``device`` ("cpu", "cuda")."""
    def register(fn):
        _LIBRARY.impl(op._opname, fn, _DISPATCH_KEYS[device])
        return fn
    return register


def register_fake(op):
    """Decorator: the function is ``op``'s fake (shapes, dtypes and memory formats of its
    results, for torch.compile and FakeTensor tracing)."""
    def register(fn):
        torch.library.register_fake(op, fn, lib=_LIBRARY)
        return fn
    return register


def register_vmap(op):
    """Decorator: the function is ``op``'s batching rule under ``torch.func.vmap`` (see
    ``torch.library.register_vmap``)."""
    def register(fn):
        torch.library.register_vmap(op, fn, lib=_LIBRARY)
        return fn
    return register


# Batching rules (torch.func.vmap): a vmapped call is one call of the op, the vmapped
# dimension folded into N (or, for one volume sampled at a batch of grids, into the grid's
# Do), never a loop over the batch.


def fold_into_n(batch_size: int, in_dims, args) -> list:
    """``args`` of one op call for a vmapped call: each tensor's vmapped dimension folded
    into its N (dim 0), (B, N, ...) -> (B * N, ...), an unbatched tensor expanded to the
    batch first (a view; the reshape copies only where it cannot view). Other arguments
    (None, modes) as they are."""
    return [_fold_into_n(a, d, batch_size) if isinstance(a, torch.Tensor) else a
            for a, d in zip(args, in_dims)]


def _fold_into_n(t: torch.Tensor, dim, batch_size: int) -> torch.Tensor:
    t = t.expand(batch_size, *t.shape) if dim is None else t.movedim(dim, 0)
    return t.flatten(0, 1)


def fold_points(t: torch.Tensor, dim, batch_size: int) -> torch.Tensor:
    """A grid-like (N, Do, Ho, Wo, 3) tensor of a vmapped call with the batch folded into
    Do: (B, N, Do, ...) -> (N, B * Do, ...), an unbatched one expanded first."""
    t = t.unsqueeze(1).expand(-1, batch_size, *t.shape[1:]) if dim is None else t.movedim(dim, 1)
    return t.flatten(1, 2)


def unfold_n(results, batch_size: int):
    """(results, out_dims) of a call made by ``fold_into_n``: (B * N, ...) -> (B, N, ...);
    the empty stand-in of a gradient not asked for stays unbatched."""
    def unfold(t):
        if t.dim() == 1 and t.numel() == 0:
            return t, None
        return t.unflatten(0, (batch_size, t.shape[0] // batch_size)), 0
    if isinstance(results, torch.Tensor):
        return unfold(results)
    pairs = [unfold(t) for t in results]
    return tuple(t for t, _ in pairs), tuple(d for _, d in pairs)


class Function(torch.autograd.Function):
    """``torch.autograd.Function`` whose ``apply`` binds no signature per call: outside
    torch.func transforms it goes straight to the C++ apply (``Function.apply`` runs
    ``inspect.signature`` on every call of a Function with ``setup_context``, to fill in
    defaults; volsample's callers pass every argument). Under the transforms, as before."""

    @classmethod
    def apply(cls, *args, **kwargs):
        if torch._C._are_functorch_transforms_active():
            return super().apply(*(_Leaf(a) if isinstance(a, (list, tuple)) else a
                                   for a in args), **kwargs)
        if kwargs or len(args) < _positional_count(cls):
            return super().apply(*args, **kwargs)  # defaults to fill in
        # Tensors that escaped a finished transform lose its wrappers (as Function.apply does).
        args = tuple(_unwrap_if_dead(a) if isinstance(a, torch.Tensor) else a for a in args)
        return super(torch.autograd.Function, cls).apply(*args)  # the C++ apply


_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


class _Leaf(tuple):
    """A Function's list argument (sizes, scales, an output mask) as one leaf of torch's
    pytrees, as the Functions hand it to their ops (which take it as the list it holds).
    Under torch.func transforms, the jvp of a Function's generated vmap rule pairs the
    pytree leaves of its inputs with one tangent per input (PyTorch 2.13's
    ``get_tangents_in_dims``): a list of k items would shift every later tangent, which
    broke ``jacfwd(jacrev(...))`` and ``torch.func.hessian``."""


@functools.cache
def _positional_count(cls) -> int:
    """How many arguments ``cls.forward`` takes (0 for ``*args``: any count is whole)."""
    parameters = inspect.signature(cls.forward).parameters.values()
    return 0 if any(p.kind is p.VAR_POSITIONAL for p in parameters) else len(parameters)


def set_autograd_kernels(functions: dict) -> None:
    """Make each ``torch.autograd.Function`` (by op name) its custom op's Autograd kernel,
    so that calling an op directly has both AD modes too. torch.func transforms reach
    Functions only through ``Function.apply`` at the top, never from inside an op's kernel:
    those get a clear error.
    """
    for name, function in functions.items():
        def kernel(*args, _op_name=name, _function=function):
            if torch._C._are_functorch_transforms_active():
                raise RuntimeError(
                    f"torch.ops.volsample.{_op_name}: torch.func transforms are not supported "
                    f"on the op called directly; call volsample.torch.grid_sample / "
                    f"upsample_trilinear / warp, which support them")
            return _function.apply(*args)

        _LIBRARY.impl(name, kernel, "Autograd")


def call(function, op, *args):
    """``function.apply(*args)`` in eager mode, ``op(*args)`` under torch.compile; the op
    below autograd where there is nothing for either AD mode to record (no operand requires
    grad, or grad mode is off, as in a backward; no forward-AD level; no torch.func
    transform), which costs a Function's context less."""
    if torch.compiler.is_compiling():
        return op(*args)
    if forward_ad_active():
        return function.apply(*args)
    if torch.is_grad_enabled():
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                return function.apply(*args)
    return below_autograd(op, *args)


def forward_ad_active() -> bool:
    """Whether a Function's ``jvp`` may be asked for (a forward-AD level, or a torch.func
    transform): its ``setup_context`` saves for forward mode only then."""
    return _forward_ad._current_level >= 0 or torch._C._are_functorch_transforms_active()


# ---------------------------------------------------------------------------------------
# GPU backend
# ---------------------------------------------------------------------------------------


def gpu_backend(family: str):
    """The Triton launchers of an operator family (``volsample._triton.<family>``)."""
    name = f"volsample._triton.{family}"
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise RuntimeError(
            f"volsample.torch: CUDA tensors need the Triton GPU backend ({name}), which could "
            f"not be imported ({error}); install triton, or compute on CPU tensors") from error
