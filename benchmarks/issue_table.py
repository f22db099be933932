"""The grid backward's table: volsample against PyTorch in one process
(``volsample.apps.bench``), the workloads of the backward's targets, at 1 and 2 threads,
medians of several runs.

    python benchmarks/issue_table.py [--runs 3] [--threads 1 2] [--json FILE]

Prints, per workload and thread count, volsample's median time and PyTorch's time over
volsample's (each run's ratio paired by round, then the median over the runs).
"""
import argparse
import json
import sys

import numpy as np

from volsample.apps import bench_timing, bench_workloads

WORKLOADS = {
    1: ["grid.bwd smooth N1 C1 96x112x96", "grid.bwd smooth N1 C8 96x112x96"],
    2: ["grid.bwd smooth N1 C1 96x112x96", "grid.bwd smooth N1 C8 96x112x96",
        "grid.bwd smooth N2 C1 96x112x96", "grid.bwd random N1 C1 64^3",
        "grid.bwd oasis field N1 C3 160x192x224", "grid.bwd feature N2 C16 80x96x112",
        "grid.fwd smooth N1 C8 96x112x96", "up.bwd unet N2 C16 40^3 x2",
        "up.bwd unet N1 C32 24x32x32 x2 NDHWC"],
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    suite = {w.name: w for w in bench_workloads.suite()}
    rows = []
    for threads in args.threads:
        chosen = [suite[name] for name in WORKLOADS[threads]]
        runs = [bench_timing.run(chosen, threads, peers=("pytorch",), progress=False)
                for _ in range(args.runs)]
        for w in chosen:
            ours = [r.median_s for run in runs for r in run
                    if r.workload == w.name and r.implementation == "volsample"]
            ratios = [r.ratio for run in runs for r in run
                      if r.workload == w.name and r.implementation == "pytorch"]
            row = dict(workload=w.name, threads=threads, volsample_ms=1e3 * float(np.median(ours)),
                       ratio=float(np.median(ratios)), ratios=ratios)
            rows.append(row)
            print(f"{threads}t  {w.name:42s} {row['volsample_ms']:9.2f} ms  "
                  f"{row['ratio']:5.2f}x  (runs: {', '.join(f'{x:.2f}' for x in ratios)})",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
