"""The warp figures of the README: time and peak memory of one registration step.

A step samples a 160x192x224 image at A x + u(x), takes the MSE to a target and the
gradients for theta and u (``volsample.apps.bench_workloads.registration_step``): with
``volsample.torch.warp_mse_loss`` (the warp and the MSE at once, slab by slab), and as a
warp then ``F.mse_loss`` (the peak memory also with the MSE written out,
``((w - t) ** 2).mean()``): ``volsample.torch.warp`` (no grid), and
``F.affine_grid(theta) + u`` sampled by ``volsample.torch.grid_sample`` and by
``F.grid_sample``. Times are the bench harness's
(``volsample bench --filter warp``: one process, interleaved rounds, medians; the affine
warp forward too); the peak memory is each variant's peak resident-set growth over one
step in a child process of its own (``volsample.apps.bench_workloads.step_peak_memory``, Linux), the
median of three. Run: ``python benchmarks/warp_step.py [--threads N] [--runs N]``.
"""
from __future__ import annotations

import argparse

import numpy as np

from volsample.apps import bench, bench_timing, bench_workloads

VARIANTS = ("volsample", "volsample-warp", "volsample-grid", "pytorch")
LOSSES = ("mse_loss", "square")  # F.mse_loss, and ((w - t) ** 2).mean()
SHAPE = (160, 192, 224)
MIB = 1 << 20


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3, help="runs of each measure (median)")
    args = parser.parse_args()
    workloads = bench.select(bench_workloads.suite(), pattern="warp.* oasis *")
    rows = {}
    for _ in range(args.runs):
        for r in bench_timing.run(workloads, args.threads, progress=False):
            rows.setdefault((r.workload, r.implementation), []).append(r.median_s)
    print(f"{args.threads} threads; medians of {args.runs} runs")
    for workload in dict.fromkeys(w for w, _ in rows):
        ours = np.median(rows[workload, "volsample"])
        cells = [f"{impl} {np.median(t) * 1e3:.1f} ms ({np.median(t) / ours:.2f}x)"
                 for (w, impl), t in rows.items() if w == workload]
        print(f"{workload}: " + "; ".join(cells))
    fused = np.median([bench_workloads.step_peak_memory("volsample", 1, 1, SHAPE, args.threads)
                       for _ in range(args.runs)])  # the same whatever the loss's spelling
    for loss in LOSSES:
        memory = {v: np.median([bench_workloads.step_peak_memory(v, 1, 1, SHAPE, args.threads, loss)
                                for _ in range(args.runs)]) for v in VARIANTS[1:]}
        print(f"peak memory of a step, loss {loss}: volsample {fused / MIB:.1f} MiB; " + "; ".join(
            f"{v} {m / MIB:.1f} MiB ({m / fused:.2f}x)" for v, m in memory.items()))


if __name__ == "__main__":
    main()
