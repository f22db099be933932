"""Ahead-of-time compilation of the Triton kernels for NVIDIA GPUs, on a machine with none.

The launchers say which specializations exist. ``record`` runs them on CPU tensors with
a stand-in driver that names a CUDA target, and Triton's ``jit_cache_hook`` keeps each
launch's specialization (signature, constexprs, alignment attributes, options) instead
of compiling it. The calls come from the op layer's tables and the launchers' own
inputs, so that a new mode, padding, unit, dtype or flag joins the sweep unedited
(``_triton_sweep`` makes and records the calls; this module compiles and reports):

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
import dataclasses
import importlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ._triton_sweep import ARCHS, Specialization, record, sweep

_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


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
