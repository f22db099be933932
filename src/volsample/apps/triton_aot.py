"""Ahead-of-time compilation of the Triton kernels for NVIDIA GPUs, on a machine with none.

The launchers say which specializations exist. ``record`` runs them on CPU tensors with
a stand-in driver that names a CUDA target, and Triton's ``jit_cache_hook`` keeps each
launch's specialization (signature, constexprs, alignment attributes, options) instead
of compiling it. The calls come from the op layer's tables and the launchers' own
inputs, so that a new mode, padding, unit, dtype or flag joins the sweep unedited:

- grid sampling and warps: every mode, padding and ``align_corners``, every (volume,
  coordinates) dtype pair the op layer allows, NCDHW, channels_last_3d and strided
  views, channel counts that give every tile width (1, 2, 4, ... 32 channels a block,
  and several chunks), int32 and int64 indexing, forward and every backward (each
  output mask, deterministic or not); warps with theta and/or a displacement in every
  unit;
- upsampling: every dtype, layout, channel count and index width, every subset of
  resized axes, forward and backward.

Those factors multiply to thousands of launches, so a sweep takes a covering array of
them: ``strength`` 2 (the full sweep) holds every pair of factor values in some call,
``strength`` 1 every value; every sweep adds the calls most prone to spills (float64,
int64 indexing, reflection, every mode, the narrowest and widest tiles, every sink),
which alone are ``strength`` 0, CI's (they reach every kernel; CI's leave out the cubic
modes, which every other sweep has).

``compile_all`` compiles each specialization for sm_80 and sm_90 with Triton's compiler
and ptxas (Triton's on-disk cache keeps the results between runs), and reads from each
cubin its registers, shared memory, stack frame and local memory (``cuobjdump
-res-usage``), and from its SASS and PTX the atomics and the subroutine calls
(``CALL``: a 64-bit integer divide or remainder, a division's or fmod's slow path).
``problems`` lists what a kernel must not have: a compile error, a stack frame or local
memory (spills), an atomic in a kernel that a bitwise-reproducible call launched
(forwards, deterministic backwards, upsampling), and a subroutine call.

Command line (docs/testing.md, docs/gpu.md)::

    python -m volsample.apps.triton_aot [--strength 0|1|2] [--jobs N] [--modes A,B]
                                        [--markdown PATH]

``--modes`` sweeps grid sampling in those modes alone, and writes its table as a section
of the markdown file (docs/gpu.md is the full sweep's, every mode, written whole).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import importlib
import itertools
import json
import multiprocessing
import os
import random
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime import driver

import volsample._triton as vt

from .. import _calls, _dtypes
from .._tables import MODES, PADDINGS, UNITS
from .._triton import grid_sample, upsample, warp
from ..torch import _operands

ARCHS = (80, 90)
_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


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
    """Run one call of the sweep on small CPU tensors (the launches only record)."""

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
                upsample.forward(call, x)
            else:
                upsample.backward(call, _volume((2, C) + size_out, dtype, layout), True)
            return
        x = _volume((2, C) + size_in, dtype, layout)
        go = _volume((2, C) + size_out, dtype, layout)
        codes = (row["mode"], row["padding"], row["align"])
        if family == "grid_sample":
            grid = torch.rand((2,) + size_out + (3,), dtype=torch.float64).to(coord_dtype)
            if run == "forward":
                call = _calls.grid_sample(op("input", x), op("grid", grid), *codes,
                                          _operands.layout(x), shape_order="NCDHW")
                grid_sample.forward(call, x, grid)
            else:
                call = _calls.grid_sample_backward(
                    op("grad_output", go), op("input", x), op("grid", grid), *codes, run[1],
                    _operands.layout(x), shape_order="NCDHW")
                grid_sample.backward(call, go, x, grid, run[2])
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
            warp.forward(call, x, theta, u)
        else:
            mask = tuple(m and t is not None for m, t in zip(run[1], (x, theta, u)))
            if not any(mask):
                return
            call = _calls.warp_backward(op("grad_output", go), op("input", x), theta_op, u_op,
                                        *codes, row["units"], mask, shape_order="NCDHW",
                                        layout=_operands.layout(x))
            warp.backward(call, go, x, theta, u, run[2])
    finally:
        vt._INT32_LIMIT = limit


# ---------------------------------------------------------------------------------------
# Compiling and measuring
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    """A specialization compiled for one target, or the error that stopped it."""
    spec: Specialization
    arch: int
    error: str = ""
    registers: int = 0
    shared: int = 0
    stack: int = 0
    local: int = 0
    atomics: int = 0
    calls: int = 0

    def problems(self) -> list[str]:
        """What this kernel must not have (empty: it passes)."""
        if self.error:
            return [f"compile error: {self.error}"]
        found = []
        if self.stack or self.local:
            found.append(f"spills: {self.stack} bytes stack, {self.local} bytes local")
        if self.atomics and self.spec.reproducible:
            found.append(f"{self.atomics} atomics in a reproducible kernel")
        if self.calls:
            found.append(f"{self.calls} subroutine calls (64-bit div/rem, div or fmod slow "
                         f"path)")
        return found

    def describe(self) -> str:
        return f"sm_{self.arch} {self.spec.name} {self.spec.constants()}"

    def summary(self) -> dict:
        """What the test and the table read, as JSON."""
        return dict(kernel=self.spec.name, arch=self.arch, constants=self.spec.constants(),
                    reproducible=self.spec.reproducible, example=self.spec.example,
                    error=self.error, registers=self.registers, shared=self.shared,
                    stack=self.stack, local=self.local, atomics=self.atomics,
                    calls=self.calls, problems=self.problems())


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_one(spec: Specialization, arch: int) -> Result:
    """Compile ``spec`` for sm_<arch> and measure it."""
    result = Result(spec, arch)
    fn = getattr(importlib.import_module(spec.module), spec.kernel)
    try:
        kernel = triton.compile(ASTSource(fn, spec.signature, spec.constexprs, spec.attrs),
                                target=GPUTarget("cuda", arch, 32), options=spec.options)
    except Exception as error:  # a compile error is a finding, not a crash of the sweep
        result.error = f"{type(error).__name__}: {str(error)[-2000:]}"
        return result
    ptx = kernel.asm["ptx"]
    result.atomics = len(re.findall(r"^\s*(?:@%p\d+\s+)?(?:atom|red)\.", ptx, re.M))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([_tool("cuobjdump"), "-sass", cubin.name],
                              capture_output=True, text=True, check=True).stdout
    resources = _RESOURCES.search(usage)
    if resources is None:
        raise RuntimeError(f"cuobjdump -res-usage: no resources in {usage!r}")
    registers, stack, shared, local = (int(v) for v in resources.groups())
    result.registers, result.stack, result.shared, result.local = registers, stack, shared, local
    result.calls = _subroutine_calls(sass)
    return result


_WARP_COLLECTIVES = ("SHFL", "WARPSYNC", "REDUX", "VOTE")
_SASS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def _subroutine_calls(sass: str) -> int:
    """Calls (SASS ``CALL``) of subroutines that compute: 64-bit integer division and
    remainder, the slow paths of division and fmod. Calls of the warp-shuffle helpers that
    reductions take on a divergent path (``WARPSYNC``, ``SHFL``, ``REDUX``) do not count, nor do
    ``CALL``s that ptxas uses as a jump out of a loop (their target is no subroutine)."""
    code = [(int(a, 16), text) for a, text in _SASS.findall(sass)]
    where = {a: i for i, (a, _) in enumerate(code)}
    calls = 0
    for _, text in code:
        target = re.search(r"\bCALL\.\S*\s+0x([0-9a-f]+)", text)
        if target is None or int(target.group(1), 16) not in where:
            continue
        body = []  # from the target to the first unconditional RET or EXIT
        for _, instruction in code[where[int(target.group(1), 16)]:]:
            body.append(instruction)
            if instruction.startswith(("RET", "EXIT")):
                break
        if body[-1].startswith("RET") and not any(op in i for i in body
                                                  for op in _WARP_COLLECTIVES):
            calls += 1
    return calls


def _compile_job(job):
    os.environ.pop("TRITON_INTERPRET", None)
    return compile_one(*job)


def compile_all(specs, archs=ARCHS, jobs: int = 1) -> list[Result]:
    """Every specialization compiled for every target, in ``jobs`` processes."""
    work = [(spec, arch) for arch in archs for spec in specs]
    if jobs <= 1:
        return [compile_one(*job) for job in work]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        return list(pool.map(_compile_job, work, chunksize=4))


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def markdown(results: list[Result], strength: int, count: int,
             modes: tuple[str, ...] = ()) -> str:
    """docs/gpu.md: per kernel and target, the range of registers, shared memory and
    spills over its specializations, and the heaviest specialization. A sweep restricted
    to ``modes`` gives a section of the file (``write_markdown``)."""
    command = (f"python -m volsample.apps.triton_aot --strength {strength}"
               + (f" --modes {','.join(modes)}" if modes else "") + " --markdown docs/gpu.md")
    heading = "##" if modes else "#"
    lines = [
        f"{heading} Grid sampling in modes {', '.join(modes)}" if modes
        else "# The Triton kernels on NVIDIA GPUs",
        "",
        f"Generated by `{command}` (no GPU needed: Triton's compiler and ptxas run on the "
        "CPU); do not edit by hand." + (" It replaces this section alone; a sweep of every "
                                        "mode rewrites the file." if modes else ""),
        "",
        f"{count} specializations ("
        + (f"every {_TUPLES[strength]} of the launchers' factor values, plus "
           if strength else "") + "the calls most prone to spills), "
        "each compiled for sm_80 (A100) and sm_90 (H100). Per kernel and target: how many "
        "specializations, the fewest and most registers per thread, shared memory per "
        "block, stack frame and local memory (spills) in bytes, atomics in reproducible "
        "kernels and subroutine calls (64-bit integer division, the slow paths of division "
        "and fmod). Every one must be 0 but registers and shared memory: "
        "`tests/test_triton_aot.py` checks it.",
        "",
        "| kernel | target | specializations | registers | shared memory | stack | local "
        "| atomics (reproducible) | calls | heaviest (most registers) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    by_kernel: dict[tuple, list[Result]] = {}
    for r in results:
        by_kernel.setdefault((r.spec.name, r.arch), []).append(r)
    for (kernel, arch), group in sorted(by_kernel.items()):
        ok = [r for r in group if not r.error]
        if not ok:
            lines.append(f"| `{kernel}` | sm_{arch} | {len(group)} | compile error |"
                         " | | | | | |")
            continue
        regs = [r.registers for r in ok]
        shared = [r.shared for r in ok]
        heaviest = max(ok, key=lambda r: r.registers)
        lines.append(
            f"| `{kernel}` | sm_{arch} | {len(group)} | {min(regs)}–{max(regs)} | "
            f"{min(shared)}–{max(shared)} | {max(r.stack for r in ok)} | "
            f"{max(r.local for r in ok)} | "
            f"{sum(r.atomics for r in ok if r.spec.reproducible)} | "
            f"{max(r.calls for r in ok)} | {_short(heaviest.spec.constants())} |")
    problems = [f"- sm_{r.arch} `{r.spec.name}` ({_short(r.spec.constants())}): {p}"
                for r in results for p in r.problems()]
    if problems:
        lines += ["", f"{heading}# Open problems ({len(problems)})", "", *problems]
    lines.append("")
    return "\n".join(lines)


def write_markdown(path: str, text: str, modes: tuple[str, ...] = ()) -> None:
    """Write ``markdown``'s text to ``path``: the whole file, or for a sweep restricted to
    ``modes`` its section, between markers, in place of the one before (or appended)."""
    if not modes:
        with open(path, "w") as f:
            f.write(text)
        return
    begin, end = f"<!-- sweep of modes {','.join(modes)} -->\n", "<!-- end of sweep -->\n"
    old = open(path).read() if os.path.exists(path) else ""
    if begin in old:
        before, rest = old.split(begin, 1)
        after = rest.split(end, 1)[1]
    else:
        before, after = old + ("\n" if old else ""), ""
    with open(path, "w") as f:
        f.write(before + begin + text + end + after)


_TUPLES = {1: "value", 2: "pair"}


def _short(constants: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in constants.items())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m volsample.apps.triton_aot",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--strength", type=int, default=2, choices=(0, 1, 2),
                        help="covering strength: 2 every pair of factor values (the full "
                             "sweep), 1 every value, 0 only the calls most prone to spills "
                             "(CI)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--modes", default="",
                        help="comma-separated mode names: sweep grid sampling in these modes "
                             "alone (its table replaces a section of --markdown's file)")
    parser.add_argument("--markdown", help="write the resource table (docs/gpu.md) here")
    parser.add_argument("--json", help="write every result here (tests/test_triton_aot.py)")
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    specs = record(sweep(args.strength, modes))
    results = compile_all(specs, jobs=args.jobs)
    failed = [(r, p) for r in results for p in r.problems()]
    for r, problem in failed:
        print(f"{r.describe()}: {problem}\n    first launched by {r.spec.example}")
    print(f"{len(specs)} specializations x {len(ARCHS)} targets, {len(failed)} problems")
    if args.markdown:
        write_markdown(args.markdown, markdown(results, args.strength, len(specs), modes),
                       modes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.summary() for r in results], f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
