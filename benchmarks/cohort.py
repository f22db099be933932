"""``volsample register-cohort``'s throughput: pairs per minute in one process against a
local dask.distributed cluster, and the peak memory of the process that runs a subject.

A cohort of N synthetic subjects (the demo's phantom under N known deformations, SIZE^3
voxels, with label maps) registered to the undeformed phantom with ``register``'s
defaults, first in this process (``--threads`` threads), then on a LocalCluster of
``--workers`` worker processes (``--threads`` / ``--workers`` threads each); the two runs'
rows and files are compared bit for bit. Run:
``python benchmarks/cohort.py [--subjects 8] [--size 48] [--threads 2] [--workers 2] [--json FILE]``
(needs dask.distributed: ``pip install "volsample[cluster]"``). It records the runs, the
machine, the load average before and after, the date and the command in
benchmarks/results/cohort.json (docs/cli.md's throughput is drawn from it by
benchmarks/figures.py); ``--quick`` (4 subjects of 32^3) only checks that it works.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from volsample import registration
from volsample.apps import bench_timing, cohort

RECORD = Path(__file__).resolve().parent / "results" / "cohort.json"

_RUN_COLUMNS = ("seconds", "peak_memory_mb")  # of the run, not of its result
_FILES = ("warped.npy", "displacement.npy", "warped_labels.npy", "affine.txt")


def _inputs(folder, subjects, size):
    template = registration.synthetic_pair((size,) * 3, seed=0)
    np.save(os.path.join(folder, "template.npy"), template.moving)
    np.save(os.path.join(folder, "template_labels.npy"), template.moving_labels)
    moving, labels = [], []
    for seed in range(1, subjects + 1):
        pair = registration.synthetic_pair((size,) * 3, seed=seed)
        moving.append(os.path.join(folder, f"sub{seed}.npy"))
        labels.append(os.path.join(folder, f"sub{seed}_labels.npy"))
        np.save(moving[-1], pair.fixed)
        np.save(labels[-1], pair.fixed_labels)
    return moving, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", type=int, default=8)
    parser.add_argument("--size", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="4 subjects of 32^3: to check the script, not a record")
    parser.add_argument("--json", default=str(RECORD), help=f"the record ({RECORD.name})")
    args = parser.parse_args()
    if args.quick:
        args.subjects, args.size = 4, 32
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = bench_timing.load_average()
    folder = tempfile.mkdtemp(prefix="volsample-cohort-bench-")
    try:
        moving, labels = _inputs(folder, args.subjects, args.size)
        runs = {"one process": dict(threads=args.threads),
                f"LocalCluster of {args.workers}": dict(
                    local_workers=args.workers, threads=max(1, args.threads // args.workers))}
        tables, record = [], []
        for index, (name, where) in enumerate(runs.items()):
            start = time.perf_counter()
            rows = cohort.register_cohort(
                os.path.join(folder, "template.npy"), moving, os.path.join(folder, str(index)),
                labels=labels, template_labels=os.path.join(folder, "template_labels.npy"),
                **where)
            wall = time.perf_counter() - start
            tables.append(rows)
            # each row's peak: its process's so far (a worker's, on the cluster)
            record.append({"run": name, "workers": where.get("local_workers"),
                           "threads": where["threads"], "seconds": wall,
                           "pairs_per_minute": 60 * args.subjects / wall,
                           "peak_memory_mb": max(row["peak_memory_mb"] for row in rows),
                           "mean_dice": float(np.mean([row["dice_after"] for row in rows]))})
            print(f"{name}: {args.subjects} pairs of {args.size}^3 in {wall:.1f} s, "
                  f"{record[-1]['pairs_per_minute']:.1f} pairs/minute; a subject's peak memory "
                  f"{record[-1]['peak_memory_mb']:.0f} MB; mean Dice "
                  f"{record[-1]['mean_dice']:.4f}", flush=True)
        results = [[{k: v for k, v in row.items() if k not in _RUN_COLUMNS} for row in rows]
                   for rows in tables]
        files = all(open(os.path.join(folder, "0", row["subject"], name), "rb").read()
                    == open(os.path.join(folder, "1", row["subject"], name), "rb").read()
                    for row in tables[0] for name in _FILES)
        print(f"rows the same: {results[0] == results[1]}; files the same bits: {files}")
    finally:
        shutil.rmtree(folder)
    payload = {"recorded": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
               "command": shlex.join(["python", "benchmarks/cohort.py", *sys.argv[1:]]),
               "quick": args.quick,
               "load_average": {"before": load_before, "after": bench_timing.load_average()},
               "machine": bench_timing.machine_info(args.threads),
               "subjects": args.subjects, "size": args.size,
               "same_rows": results[0] == results[1], "same_files": files, "runs": record}
    with open(args.json, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")


if __name__ == "__main__":  # the cluster's workers import this module
    main()
