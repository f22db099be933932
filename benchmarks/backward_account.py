"""The grid sampler's backward at scale, accounted for: what docs/performance.md's section
"The backward at scale" states, measured on this machine and recorded in
benchmarks/results/account.json (its tables are drawn from it by benchmarks/figures.py).

    python benchmarks/backward_account.py [--threads 2] [--sizes 64 256] [--repeats 9]
                                          [--quick] [--json FILE]

The case: float32, N1 C1, a D^3 volume sampled at D^3 points of a smooth warp (the identity
plus about 3 voxels, ``bench_workloads.smooth_grid``), trilinear, zeros padding,
align_corners. For each D, each phase (both gradients, grad_input only, grad_grid only, and
the plan that splits grad_input into slabs of input planes) is run through the C++ backend
(``volsample._backends.cpu("grid_sample")``) into outputs the script allocates: NEW arrays
each call (``np.empty``: memory the C library maps anew above its threshold) against the
SAME arrays REUSED (written once before). Per call it takes the process's CPU time
(``time.process_time``: every thread's, which another job's load disturbs far less than
the wall time), the wall time and the minor page faults (``resource.getrusage``); the
record keeps the medians, the calls alternating by repeat.

Then the bandwidth, on 1 and 2 threads (benchmarks/bandwidth.cpp, built here with the C++
compiler, ``$CXX`` or ``c++``): stores into memory already mapped, the first touch of new
memory on 2 MiB pages (the operating system zeroes each page, then the stores land), loads,
and a copy (its bytes counted read and written), median of the passes.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import volsample
from volsample import _backends, _calls
from volsample._tables import MODES, PADDINGS
from volsample.apps import bench_timing, bench_workloads

HERE = Path(__file__).resolve().parent
RECORD = HERE / "results" / "account.json"
PHASES = {"both": (True, True), "grad_input": (True, False), "grad_grid": (False, True)}
BANDWIDTH = ("write", "first_touch", "read", "copy")
MiB = 1 << 20


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _measured(run) -> dict:
    """One call of ``run``: its CPU and wall seconds and minor page faults."""
    faults, cpu, wall = _faults(), time.process_time(), time.perf_counter()
    run()
    return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
            "minor_faults": _faults() - faults}


def _median(calls: list[dict], points: int) -> dict:
    """The medians of a cell's calls, per point where they are times."""
    median = lambda key: float(np.median([c[key] for c in calls]))
    return {"cpu_ns_per_point": median("cpu_s") * 1e9 / points,
            "wall_ns_per_point": median("wall_s") * 1e9 / points,
            "minor_faults": median("minor_faults"), "calls": len(calls)}


def backward_cells(D: int, threads: int, repeats: int) -> tuple[list[dict], int]:
    """The rows of the account at D^3 (one per phase and outputs: new, reused; the plan's
    outputs None) and the number of slabs the plan makes."""
    backend = _backends.cpu("grid_sample")
    grid = bench_workloads.smooth_grid(1, D, D, D)
    volume = np.random.default_rng(1).standard_normal((1, 1, D, D, D)).astype(np.float32)
    grad_output = np.random.default_rng(3).standard_normal(volume.shape).astype(np.float32)
    described = lambda mask: _calls.grid_sample_backward(
        _calls.operand("grad_output", grad_output), _calls.operand("input", volume),
        _calls.operand("grid", grid), MODES.code("bilinear"), PADDINGS.code("zeros"), True,
        output_mask=mask)
    calls = {phase: described(mask) for phase, mask in PHASES.items()}

    def outputs(call):
        want_input, want_grid = call.output_mask
        return (np.empty(volume.shape, np.float32) if want_input else None,
                np.empty(grid.shape, np.float32) if want_grid else None)

    def run(call, results):
        backend.backward(call, grad_output, volume, grid, *results, threads)

    reused = {phase: outputs(call) for phase, call in calls.items()}
    for phase, call in calls.items():  # the reused outputs written once, the code warm
        run(call, reused[phase])
    timed: dict[tuple[str, str | None], list[dict]] = {}
    for _ in range(repeats):  # alternating: a change of load moves every cell alike
        for phase, call in calls.items():  # new outputs: allocated and freed in the call
            timed.setdefault((phase, "new"), []).append(
                _measured(lambda call=call: run(call, outputs(call))))
            timed.setdefault((phase, "reused"), []).append(
                _measured(lambda call=call, phase=phase: run(call, reused[phase])))
        timed.setdefault(("plan", None), []).append(
            _measured(lambda: backend.backward_slabs(calls["both"], volume, grid, threads)))
    slabs = len(backend.backward_slabs(calls["both"], volume, grid, threads)) - 1
    return [{"D": D, "phase": phase, "outputs": where, **_median(cells, D**3)}
            for (phase, where), cells in timed.items()], slabs


def _helper(folder: str) -> ctypes.CDLL:
    """benchmarks/bandwidth.cpp, built into ``folder`` and loaded."""
    library = os.path.join(folder, "bandwidth.so")
    subprocess.run([os.environ.get("CXX", "c++"), "-O3", "-march=native", "-fopenmp", "-shared",
                    "-fPIC", "-o", library, str(HERE / "bandwidth.cpp")], check=True)
    helper = ctypes.CDLL(library)
    size, word = ctypes.c_size_t, ctypes.c_uint64
    helper.map_buffer.restype, helper.map_buffer.argtypes = ctypes.c_void_p, [size]
    helper.unmap_buffer.argtypes = [ctypes.c_void_p, size]
    for name, arguments in (("write_pass", [ctypes.c_void_p, size, word, ctypes.c_int]),
                            ("read_pass", [ctypes.c_void_p, size, ctypes.POINTER(word),
                                           ctypes.c_int]),
                            ("copy_pass", [ctypes.c_void_p, ctypes.c_void_p, size,
                                           ctypes.c_int])):
        getattr(helper, name).restype = ctypes.c_double
        getattr(helper, name).argtypes = arguments
    return helper


def bandwidth(nbytes: int, thread_counts: list[int], passes: int) -> list[dict]:
    """GB/s of each operation of ``BANDWIDTH`` per thread count and its minor page faults
    (the medians of ``passes`` passes over ``nbytes``, alternating)."""
    with tempfile.TemporaryDirectory(prefix="volsample-bandwidth-") as folder:
        helper = _helper(folder)
        source, target = helper.map_buffer(nbytes), helper.map_buffer(nbytes)
        if not source or not target:
            raise MemoryError(f"cannot map 2 x {nbytes} bytes")
        for buffer in (source, target):  # written before: no first touch in the others
            helper.write_pass(buffer, nbytes, 1, max(thread_counts))
        total = ctypes.c_uint64()

        def first_touch(threads):
            fresh = helper.map_buffer(nbytes)
            if not fresh:
                raise MemoryError(f"cannot map {nbytes} bytes")
            faults = _faults()
            seconds = helper.write_pass(fresh, nbytes, 2, threads)
            faults = _faults() - faults
            helper.unmap_buffer(fresh, nbytes)
            return seconds, nbytes, faults

        operations = {  # name: threads -> (seconds, bytes moved, minor faults)
            "write": lambda t: (helper.write_pass(target, nbytes, 3, t), nbytes, 0),
            "first_touch": first_touch,
            "read": lambda t: (helper.read_pass(source, nbytes, ctypes.byref(total), t),
                               nbytes, 0),
            "copy": lambda t: (helper.copy_pass(target, source, nbytes, t), 2 * nbytes, 0)}
        timed: dict[tuple[str, int], list[tuple[float, int]]] = {}
        for _ in range(passes):
            for threads in thread_counts:
                for name, operation in operations.items():
                    seconds, moved, faults = operation(threads)
                    timed.setdefault((name, threads), []).append((moved / seconds / 1e9, faults))
        helper.unmap_buffer(source, nbytes)
        helper.unmap_buffer(target, nbytes)
    return [{"operation": name, "threads": threads,
             "gb_per_s": float(np.median([rate for rate, _ in runs])),
             "minor_faults": float(np.median([faults for _, faults in runs])),
             "passes": len(runs)}
            for (name, threads), runs in timed.items()]


def caches() -> dict[str, int]:
    """Bytes of each cache level a core sees (Linux's sysfs; empty elsewhere)."""
    found = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind = (index / "level").read_text().strip(), (index / "type").read_text()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind.strip() != "Instruction":
            units = {"K": 1 << 10, "M": 1 << 20}
            found[f"L{level}"] = int(size.rstrip("KM")) * units.get(size[-1], 1)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="the backward's threads (2)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256], help="D (64 256)")
    parser.add_argument("--repeats", type=int, default=9, help="calls a cell (9)")
    parser.add_argument("--bandwidth-mib", type=int, default=256,
                        help="MiB a bandwidth pass moves (256)")
    parser.add_argument("--quick", action="store_true",
                        help="3 calls a cell, 64 MiB passes: to check the script, not a record")
    parser.add_argument("--json", default=str(RECORD), help=f"the record ({RECORD.name})")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.bandwidth_mib = 3, 64
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = bench_timing.load_average()
    volsample.set_num_threads(args.threads)
    rows, slabs = [], {}
    for D in args.sizes:
        cells, slabs[str(D)] = backward_cells(D, args.threads, args.repeats)
        rows += cells
        for c in cells:
            print(f"{D}^3 {c['phase']:10s} {c['outputs'] or '':6s} "
                  f"{c['cpu_ns_per_point']:6.1f} ns CPU a point, {c['minor_faults']:6.0f} faults",
                  flush=True)
    rates = bandwidth(args.bandwidth_mib * MiB, sorted({1, args.threads}), args.repeats)
    for r in rates:
        print(f"{r['operation']:12s} {r['threads']} thread(s): {r['gb_per_s']:.1f} GB/s", flush=True)
    payload = {
        "recorded": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": shlex.join(["python", "benchmarks/backward_account.py",
                               *(sys.argv[1:] if argv is None else argv)]),
        "quick": args.quick,
        "load_average": {"before": load_before, "after": bench_timing.load_average()},
        "machine": {**bench_timing.machine_info(args.threads), "caches": caches()},
        "threads": args.threads, "repeats": args.repeats, "slabs": slabs,
        "bandwidth_bytes": args.bandwidth_mib * MiB, "backward": rows, "bandwidth": rates}
    with open(args.json, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
