"""The sweeps of ``volsample.apps.triton_aot``: which launches of the Triton kernels a
sweep makes (``sweep``: the calls of a covering array of the launchers' factors, from the
op layer's tables, and the calls most prone to spills), and their specializations,
recorded without compiling (``record``: the launchers run on CPU tensors beside a stand-in
driver that names a CUDA target, and Triton's ``jit_cache_hook`` keeps each launch's
signature, constexprs, alignment attributes and options).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import itertools
import os
import random
from typing import Any

import numpy as np
import torch
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

import volsample._triton as vt

from .. import _calls, _dtypes
from .._tables import MODES, PADDINGS, UNITS
from .._triton import grid_sample, upsample, warp
from ..torch import _operands

ARCHS = (80, 90)  # the targets compiled for; launches are recorded for the newest


# ---------------------------------------------------------------------------------------
# The calls of a sweep
# ---------------------------------------------------------------------------------------


def _channel_counts():
    """Channel counts that give every tile width the launchers may pick (a power of two up
    to their widest, 32) and two chunks of the widest: 1, 2, 3, 5, 9, 17, 33."""
    return (1,) + tuple(2**k + 1 for k in range(6))


def _factors(family: str) -> dict[str, tuple]:
    """Each factor of a family's calls and its values, from the op layer's tables."""
    names = _dtypes.SUPPORTED_NAMES
    common = dict(layout=("ncdhw", "channels_last", "strided"), channels=_channel_counts(),
                  sizes=("odd", "aligned"), index=("int32", "int64"))
    if family == "upsample":
        resized = tuple(r for r in itertools.product((False, True), repeat=3) if any(r))
        return dict(dtypes=tuple((n, n) for n in names), resized=resized,
                    align=(False, True), **common,
                    run=("forward", "backward"))
    pairs = tuple((v, g) for v in names for g in names
                  if _dtypes.grid_dtype_allowed(_numpy_dtype(v), _numpy_dtype(g)))
    factors = dict(mode=tuple(m.code for m in MODES.choices),
                   padding=tuple(PADDINGS.code(n) for n in PADDINGS.names()),
                   align=(False, True), dtypes=pairs, **common)
    if family == "warp":
        factors["operands"] = ((True, True), (False, True), (True, False))
        factors["units"] = tuple(UNITS.code(n) for n in UNITS.names())
        masks = [m for m in itertools.product((False, True), repeat=3) if any(m)]
    else:
        masks = [m for m in itertools.product((False, True), repeat=2) if any(m)]
    # a backward that wants no input gradient runs the same kernels whatever
    # ``deterministic`` says
    factors["run"] = ("forward",) + tuple(
        ("backward", mask, deterministic) for mask in masks
        for deterministic in ((False, True) if mask[0] else (True,)))
    return factors


def _numpy_dtype(name: str) -> np.dtype:
    return _dtypes.BFLOAT16 if name == "bfloat16" else np.dtype(name)


def _spill_prone(family: str, f: dict[str, tuple]) -> list[dict]:
    """The calls most prone to spills, which CI compiles: float64 data and coordinates,
    int64 indexing, sizes Triton takes as aligned, reflection, every operand (a warp's
    theta and a displacement in the last unit), for every mode, in the narrowest and the
    widest tile (one channel in NCDHW, 17 in channels_last_3d), forward and the backward
    with every gradient, deterministic or not. ``f``: the family's factors."""
    heavy = dict(dtypes=("float64", "float64"), index="int64", align=True, sizes="aligned")
    if family == "upsample":
        runs = f["run"]
        heavy["resized"] = (True, True, True)
    else:
        every = max(f["run"][1:], key=lambda run: sum(run[1]))
        runs = ("forward", every, (every[0], every[1], not every[2]))
        heavy.update(padding=f["padding"][-1])
        if family == "warp":
            heavy.update(operands=(True, True), units=f["units"][-1])
    rows = []
    for (layout, channels), run, mode in itertools.product(
            (("ncdhw", 1), ("channels_last", 17)), runs, f.get("mode", (None,))):
        row = dict(heavy, layout=layout, channels=channels, run=run)
        if mode is not None:
            row["mode"] = mode
        rows.append(row)
    return rows


def covering(factors: dict[str, tuple], strength: int, seed: int = 0) -> list[dict]:
    """Rows (one value per factor) such that every combination of ``strength`` factors'
    values appears in some row: a greedy covering array, deterministic for a seed."""
    names = list(factors)
    groups = list(itertools.combinations(range(len(names)), strength))
    values = [list(range(len(factors[n]))) for n in names]
    uncovered = {(g, combo) for g in groups
                 for combo in itertools.product(*(values[i] for i in g))}
    rng = random.Random(seed)
    rows = []
    while uncovered:
        # Seed each candidate with an uncovered combination, fill the rest at random,
        # then improve factor by factor; keep the best of a few.
        best: list[int] = []
        best_gain = -1
        for _ in range(20):
            g, combo = rng.choice(sorted(uncovered))
            row = [rng.choice(v) for v in values]
            for i, value in zip(g, combo):
                row[i] = value
            for i in rng.sample(range(len(names)), len(names)):
                if i in g:
                    continue
                row[i] = max(values[i], key=lambda v: _gain(row[:i] + [v] + row[i + 1:],
                                                            groups, uncovered))
            gain = _gain(row, groups, uncovered)
            if gain > best_gain:
                best, best_gain = row, gain
        uncovered -= {(g, tuple(best[i] for i in g)) for g in groups}
        rows.append({n: factors[n][v] for n, v in zip(names, best)})
    return rows


def _gain(row, groups, uncovered) -> int:
    return sum((g, tuple(row[i] for i in g)) in uncovered for g in groups)


def sweep(strength: int, modes: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    """(family, row) of every call of a sweep: the covering array of ``strength`` (none
    for 0) and the spill-prone calls; ``modes`` (names) restricts it to grid sampling in
    those modes."""
    calls = []
    for family in ("grid_sample", "warp", "upsample"):
        factors = _factors(family)
        if modes:
            if family != "grid_sample":
                continue
            factors["mode"] = tuple(MODES.code(m) for m in modes)
        elif not strength and "mode" in factors:
            # CI's sweep leaves the cubic modes to the others: their 16 specializations
            # would add about 4 minutes of compiling on 2 busy cores (the full sweep, in
            # docs/gpu.md, has them)
            factors["mode"] = tuple(m for m in factors["mode"] if MODES.of(m).taps <= 2)
        rows = (covering(factors, strength) if strength else []) + _spill_prone(family, factors)
        calls += [(family, row) for row in rows]
    return calls


# ---------------------------------------------------------------------------------------
# Recording the launches
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Specialization:
    """One compiled form of a kernel, as a launch asks for it."""
    module: str
    kernel: str
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    reproducible: bool  # launched by a call that must give the same bits every run
    example: str        # the first call that launched it

    @property
    def name(self) -> str:
        """The kernel's name with its module's: grid_sample._forward_kernel."""
        return f"{self.module.rsplit('.', 1)[-1]}.{self.kernel}"

    def constants(self) -> dict:
        """The kernel's constexpr parameters by name (not the integers Triton made
        constants because they were 1)."""
        fn = getattr(importlib.import_module(self.module), self.kernel)
        declared = {p.name for p in fn.params if p.is_constexpr}
        params = list(self.signature)
        return {params[path[0]]: _plain(v) for path, v in self.constexprs.items()
                if len(path) == 1 and params[path[0]] in declared}


def _plain(value):
    return str(value) if not isinstance(value, (bool, int, float)) else value


class _StandInDriver:
    """What Triton asks a driver while it specializes a launch: a CUDA target."""

    def __init__(self, arch: int):
            self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
            return torch.device("cpu")


@contextlib.contextmanager
def _recording(found: dict, state: dict):
    """Launches only record their specializations (into ``found``, by Triton's key)."""

    def hook(*, key, fn, compile, **_):
        spec = found.get(str(key))
        if spec is None:
            jit = fn.jit_function
            options = {k: compile[k] for k in ("num_warps", "num_ctas", "num_stages",
                                               "enable_fp_fusion")}
            found[str(key)] = Specialization(jit.fn.__module__, jit.fn.__name__,
                                             dict(compile["signature"]),
                                             dict(compile["constants"]),
                                             dict(compile["configs"][0]), options,
                                             state["reproducible"], state["example"])
        elif state["reproducible"]:
            spec.reproducible = True
        return True  # compile nothing

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("recording needs Triton's compiler: unset TRITON_INTERPRET "
                           "before volsample._triton is imported")
    previous = driver._active, knobs.runtime.jit_cache_hook  # (no default driver without a GPU)
    driver.set_active(_StandInDriver(ARCHS[-1]))
    knobs.runtime.jit_cache_hook = hook
    try:
        yield
    finally:
        driver._active, knobs.runtime.jit_cache_hook = previous


def record(calls) -> list[Specialization]:
    """The distinct specializations the launchers ask for on ``calls`` (``sweep``'s)."""
    found: dict[str, Specialization] = {}
    state = {"reproducible": True, "example": ""}
    with _recording(found, state):
        for family, row in calls:
            state["example"] = f"{family} {row}"
            _run(family, row, state)
    return list(found.values())


def _volume(shape, dtype, layout):
    t = torch.randn(shape, dtype=torch.float64).to(dtype)
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last_3d)
    if layout == "strided":  # every other W element of a wider tensor
        wide = torch.zeros(shape[:-1] + (2 * shape[-1],), dtype=dtype)
        wide[..., ::2] = t
        return wide[..., ::2]
    return t


def _run(family: str, row: dict, state: dict) -> None:
    """Run one call of the sweep on small CPU tensors (the launches only record), into
    results allocated as the torch door allocates them."""

    dtype, coord_dtype = (getattr(torch, n) for n in row["dtypes"])
    C, layout = row["channels"], row["layout"]
    run = row["run"]
    state["reproducible"] = run == "forward" or family == "upsample" or run[2]
    limit = vt._INT32_LIMIT
    vt._INT32_LIMIT = 1 if row["index"] == "int64" else limit
    op = _operands.operand
    # odd sizes, or multiples of 16, which Triton specializes on (alignment attributes)
    size_in, size_out = ((3, 4, 5), (2, 3, 4)) if row["sizes"] == "odd" else ((16,) * 3,) * 2
    try:
        if family == "upsample":
            size_out = tuple(2 * n if r else n for n, r in zip(size_in, row["resized"]))
            x = _volume((2, C) + size_in, dtype, layout)
            call = _calls.upsample(op("input", x), size=size_out,
                                   align_corners=row["align"], layout=_operands.layout(x),
                                   shape_order="NCDHW")
            if run == "forward":
                upsample.forward(call, x, _result(call.output_shape, x))
            else:
                upsample.backward(call, _volume((2, C) + size_out, dtype, layout),
                                  _result(call.input_shape, x))
            return
        x = _volume((2, C) + size_in, dtype, layout)
        go = _volume((2, C) + size_out, dtype, layout)
        codes = (row["mode"], row["padding"], row["align"])
        if family == "grid_sample":
            grid = torch.rand((2,) + size_out + (3,), dtype=torch.float64).to(coord_dtype)
            if run == "forward":
                call = _calls.grid_sample(op("input", x), op("grid", grid), *codes,
                                          _operands.layout(x), shape_order="NCDHW")
                grid_sample.forward(call, x, grid, _result(call.output_shape, x))
            else:
                call = _calls.grid_sample_backward(
                    op("grad_output", go), op("input", x), op("grid", grid), *codes, run[1],
                    _operands.layout(x), shape_order="NCDHW")
                grad_input, grad_grid = _gradients(run[1], x, grid)
                grid_sample.backward(call, go, x, grid, grad_input, grad_grid, run[2])
            return
        use_theta, use_u = row["operands"]
        theta = torch.randn(2, 3, 4, dtype=torch.float64).to(coord_dtype) if use_theta else None
        u = (torch.randn((2,) + size_out + (3,), dtype=torch.float64).to(coord_dtype)
             if use_u else None)
        theta_op = None if theta is None else op("theta", theta)
        u_op = None if u is None else op("displacement", u)
        if run == "forward":
            call = _calls.warp(op("input", x), theta_op, u_op, size_out, *codes, row["units"],
                               shape_order="NCDHW", layout=_operands.layout(x))
            warp.forward(call, x, theta, u, _result(call.output_shape, x))
        else:
            mask = tuple(m and t is not None for m, t in zip(run[1], (x, theta, u)))
            if not any(mask):
                return
            call = _calls.warp_backward(op("grad_output", go), op("input", x), theta_op, u_op,
                                        *codes, row["units"], mask, shape_order="NCDHW",
                                        layout=_operands.layout(x))
            grad_input, grad_theta, grad_u = _gradients(mask, x, theta, u)
            warp.backward(call, go, x, theta, u, grad_input, grad_theta, grad_u, run[2])
    finally:
        vt._INT32_LIMIT = limit


def _result(shape, like):
    """A result volume in the memory format of ``like``, as the front doors allocate it."""
    return vt.new_volume(shape, like.dtype, like)


def _gradients(mask, input, *coordinates) -> tuple[Any, ...]:
    """The gradients a backward asks for (None for the others): grad_input in the input's
    memory format, the coordinates' contiguous."""
    return (_result(input.shape, input) if mask[0] else None,
            *(torch.empty_like(t, memory_format=torch.contiguous_format) if want else None
              for want, t in zip(mask[1:], coordinates)))
