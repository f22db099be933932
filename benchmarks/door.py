"""The door's cost: small calls through volsample.torch, patch() and the NumPy API against
PyTorch (``volsample bench``'s small-size family), at 1 and 2 threads.

Each row: the median over three runs of each implementation's median time (one process,
the implementations timed in turn), the ratios PyTorch time / time (above 1: faster than
PyTorch), and the door's fixed cost, volsample.torch's time minus the NumPy API's on the
same call (patch(): its time minus volsample.torch's). Prints a Markdown table.
Run: ``python benchmarks/door.py [--runs 3] [--threads 1 2]``.
"""
from __future__ import annotations

import argparse

import numpy as np

from volsample import bench


def measure(threads: int, runs: int) -> dict:
    """{workload: {implementation: median seconds over the runs}}."""
    workloads = bench.select(bench.suite(), pattern="small.*")
    times: dict = {}
    for _ in range(runs):
        for r in bench.run(workloads, threads, progress=False):
            times.setdefault(r.workload, {}).setdefault(r.implementation, []).append(r.median_s)
    return {w: {impl: float(np.median(ts)) for impl, ts in row.items()} for w, row in times.items()}


def table(threads: int, medians: dict) -> str:
    us = lambda s: f"{s * 1e6:,.0f} us"
    lines = [f"| {threads} thread{'s' if threads > 1 else ''}, float32 | PyTorch | NumPy API | "
             "volsample.torch | patch() | door (torch - NumPy) | patch() - torch |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in medians.items():
        torch_s, ours = row["pytorch"], row["volsample"]
        numpy_s, patch_s = row["volsample-numpy"], row["volsample-patch"]
        cells = [name.replace("small.", ""), us(torch_s),
                 f"{us(numpy_s)} ({torch_s / numpy_s:.2f}x)", f"{us(ours)} ({torch_s / ours:.2f}x)",
                 f"{us(patch_s)} ({torch_s / patch_s:.2f}x)",
                 f"{(ours - numpy_s) * 1e6:+.1f} us", f"{(patch_s - ours) * 1e6:+.1f} us"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    for threads in args.threads:
        print(table(threads, measure(threads, args.runs)))
        print()


if __name__ == "__main__":
    main()
