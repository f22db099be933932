"""``volsample register-cohort``'s throughput: pairs per minute in one process against a
local dask.distributed cluster, and the peak memory of the process that runs a subject.

A cohort of N synthetic subjects (the demo's phantom under N known deformations, SIZE^3
voxels, with label maps) registered to the undeformed phantom with ``register``'s
defaults, first in this process (``--threads`` threads), then on a LocalCluster of
``--workers`` worker processes (``--threads`` / ``--workers`` threads each); the two runs'
rows and files are compared bit for bit. Run:
``python benchmarks/cohort.py [--subjects 8] [--size 48] [--threads 2] [--workers 2]``
(needs dask.distributed: ``pip install "volsample[cluster]"``).
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

from volsample import registration
from volsample.apps import cohort

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
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="volsample-cohort-bench-")
    try:
        moving, labels = _inputs(folder, args.subjects, args.size)
        runs = {"one process": dict(threads=args.threads),
                f"LocalCluster of {args.workers}": dict(
                    local_workers=args.workers, threads=max(1, args.threads // args.workers))}
        tables = []
        for index, (name, where) in enumerate(runs.items()):
            start = time.perf_counter()
            rows = cohort.register_cohort(
                os.path.join(folder, "template.npy"), moving, os.path.join(folder, str(index)),
                labels=labels, template_labels=os.path.join(folder, "template_labels.npy"),
                **where)
            wall = time.perf_counter() - start
            tables.append(rows)
            print(f"{name}: {args.subjects} pairs of {args.size}^3 in {wall:.1f} s, "
                  f"{60 * args.subjects / wall:.1f} pairs/minute; a subject's peak memory "
                  f"{max(row['peak_memory_mb'] for row in rows):.0f} MB; mean Dice "
                  f"{np.mean([row['dice_after'] for row in rows]):.4f}", flush=True)
        results = [[{k: v for k, v in row.items() if k not in _RUN_COLUMNS} for row in rows]
                   for rows in tables]
        files = all(open(os.path.join(folder, "0", row["subject"], name), "rb").read()
                    == open(os.path.join(folder, "1", row["subject"], name), "rb").read()
                    for row in tables[0] for name in _FILES)
        print(f"rows the same: {results[0] == results[1]}; files the same bits: {files}")
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":  # the cluster's workers import this module
    main()
