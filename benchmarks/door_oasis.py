"""volsample.torch against the NumPy API at the OASIS size (160x192x224), to a few percent.

On a shared machine one call's time swings by more than the 3% the door may cost, and two
medians taken minutes apart swing with the machine's load. Here each round times the two
doors back to back on the same memory, in both orders (torch, NumPy, NumPy, torch: ABBA,
so a load that rises or falls through a round weighs on both alike), and the round's
ratio is torch's two calls over NumPy's two. The ratios of many rounds give a median and
its bootstrap 95% interval: a door that costs 3% shows as an interval above 1.03, noise as
one that straddles 1. Two clocks: wall time, and the CPU time of the process's threads,
which a busy machine's scheduling (the process waiting for a core) does not inflate, so
that work the door adds (a copy, an allocation) shows within a percent or two. Also
printed: each door's min and median wall time.

Workloads (float32, align_corners=True, smooth grids as ``volsample bench`` makes them):
grid sampling forward and the backward op of an image (C1) and a field (C3); the x4
upsampling of a control field; an affine warp. torch: ``volsample.torch`` (the backward:
the op autograd runs); NumPy: ``volsample``'s functions.
Run: ``python benchmarks/door_oasis.py [--rounds 15] [--threads 2] [--filter fwd]``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import volsample
import volsample.torch as vt
from volsample.apps import bench_workloads


def workloads(shrink: int = 1) -> dict:
    """{name: (torch call, NumPy call)} on shared memory."""
    D, H, W = (n // shrink for n in (160, 192, 224))
    grid = bench_workloads.smooth_grid(1, D, H, W)
    tgrid = torch.from_numpy(grid)
    calls = {}
    for C, what in ((1, "image"), (3, "field")):
        x = bench_workloads._volume((1, C, D, H, W), np.float32)
        go = bench_workloads._volume((1, C, D, H, W), np.float32, seed=3)
        tx, tgo = torch.from_numpy(x), torch.from_numpy(go)
        calls[f"grid.fwd {what} C{C}"] = (
            lambda tx=tx: vt.grid_sample(tx, tgrid, align_corners=True),
            lambda x=x: volsample.grid_sample_3d(x, grid, align_corners=True))
        calls[f"grid.bwd {what} C{C}"] = (
            lambda tx=tx, tgo=tgo: torch.ops.volsample.grid_sampler_3d_backward(
                tgo, tx, tgrid, 0, 0, True, [True, True]),
            lambda x=x, go=go: volsample.grid_sample_3d_backward(go, x, grid, align_corners=True))
    field = bench_workloads._volume((1, 3, D // 4, H // 4, W // 4), np.float32)
    tfield = torch.from_numpy(field)
    calls["up.fwd field C3 x4"] = (
        lambda: vt.upsample_trilinear(tfield, size=(D, H, W), align_corners=True),
        lambda: volsample.upsample_trilinear_3d(field, size=(D, H, W), align_corners=True))
    image = bench_workloads._volume((1, 1, D, H, W), np.float32)
    theta = bench_workloads.affine_theta(1)
    timage, ttheta = torch.from_numpy(image), torch.from_numpy(theta)
    calls["warp.fwd affine C1"] = (lambda: vt.warp(timage, ttheta),
                                   lambda: volsample.warp_3d(image, theta))
    return calls


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process's threads) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(torch_call, numpy_call, rounds: int) -> dict:
    """Per clock (wall, CPU): the median over the rounds of torch's time over NumPy's, its
    bootstrap 95% interval, and each door's min and median time."""
    torch_call(), numpy_call()  # prepared, pages touched
    ratios: dict = {"wall": [], "cpu": []}
    times: dict = {"torch": [], "numpy": []}
    for _ in range(rounds):
        a1, b1, b2, a2 = (_timed(torch_call), _timed(numpy_call), _timed(numpy_call),
                          _timed(torch_call))
        for k, clock in enumerate(ratios):
            ratios[clock].append((a1[k] + a2[k]) / (b1[k] + b2[k]))
        times["torch"] += [a1[0], a2[0]]
        times["numpy"] += [b1[0], b2[0]]
    rng = np.random.default_rng(0)
    result = {}
    for clock, values in ratios.items():
        boot = np.median(rng.choice(values, (2000, len(values))), axis=1)
        result[clock] = (float(np.median(values)), float(np.percentile(boot, 2.5)),
                         float(np.percentile(boot, 97.5)))
    for door, ts in times.items():
        result[door] = (float(np.min(ts)), float(np.median(ts)))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--filter", default="")
    parser.add_argument("--shrink", type=int, default=1, help="divide the sizes (tests)")
    args = parser.parse_args()
    volsample.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    print(f"| {args.threads} threads, {args.rounds} ABBA rounds | torch / NumPy, wall (95%) | "
          "torch / NumPy, CPU (95%) | torch min / median | NumPy min / median |\n"
          "|---|---:|---:|---:|---:|")
    ms = lambda s: f"{s * 1e3:.1f} ms"
    ratio = lambda r: f"{r[0]:.3f} ({r[1]:.3f}-{r[2]:.3f})"
    for name, (torch_call, numpy_call) in workloads(args.shrink).items():
        if args.filter not in name:
            continue
        r = measure(torch_call, numpy_call, args.rounds)
        print(f"| {name} | {ratio(r['wall'])} | {ratio(r['cpu'])} | "
              f"{ms(r['torch'][0])} / {ms(r['torch'][1])} | "
              f"{ms(r['numpy'][0])} / {ms(r['numpy'][1])} |", flush=True)


if __name__ == "__main__":
    main()
