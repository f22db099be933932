"""The torch door's place at PyTorch's dispatcher: the ops' registration (schema, a kernel
per device, fake, Autograd kernel, batching rule), the rules for when a call may skip the
dispatcher or autograd, the ``autograd.Function`` base of the ops and the batching helpers
of their vmap rules."""
from __future__ import annotations

import functools
import inspect

import torch
import torch.autograd.forward_ad as _forward_ad

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
