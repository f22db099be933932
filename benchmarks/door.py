"""The door's cost: small calls through volsample.torch, patch() and the NumPy API against
PyTorch (``volsample bench``'s small-size family), at 1 and 2 threads.

Each row: the median over three runs of each implementation's median time (one process,
the implementations timed in turn), the ratios PyTorch time / time (above 1: faster than
PyTorch), and the door's fixed cost, volsample.torch's time minus the NumPy API's on the
same call (patch(): its time minus volsample.torch's). Prints a Markdown table.

``--floor`` prints instead what a forward + backward step at 8^3 C1 (float32,
``.sum().backward()``) costs before any kernel, measured in one process: PyTorch's step
and its two aten kernels called directly (the difference is PyTorch's own door), the
engine's floor (``(x * 1).sum().backward()``), an ``autograd.Function`` that computes
nothing (what any Python Function pays), the NumPy API's forward and backward, and
``volsample.torch``; the empty Function plus the NumPy API is the floor a door through
a Python Function can reach. Rows are timed in turn, ``--rounds``
rounds of 2,000 calls; medians of the rounds, wall time and the thread's CPU time (which
waiting for a core does not inflate).
Run: ``python benchmarks/door.py [--runs 3] [--threads 1 2] [--floor [--rounds 7]]``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import volsample
from volsample.apps import bench, bench_timing, bench_workloads


def measure(threads: int, runs: int) -> dict:
    """{workload: {implementation: median seconds over the runs}}."""
    workloads = bench.select(bench_workloads.suite(), pattern="small.*")
    times: dict = {}
    for _ in range(runs):
        for r in bench_timing.run(workloads, threads, progress=False):
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


def floor_steps() -> dict:
    """{row: a function of no arguments that takes one 8^3 C1 step}."""
    import torch
    import torch.nn.functional as F

    import volsample.torch as vt

    x = torch.randn(1, 1, 8, 8, 8, requires_grad=True)
    grid = (torch.rand(1, 8, 8, 8, 3) * 2 - 1).requires_grad_()
    xd, gd, ones = x.detach(), grid.detach(), torch.ones(1, 1, 8, 8, 8)
    xn, gn, onesn = xd.numpy(), gd.numpy(), ones.numpy()

    class Nothing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, grid):
            return x.new_empty((1, 1, 8, 8, 8))

        @staticmethod
        def backward(ctx, grad_output):
            return torch.empty_like(x), torch.empty_like(grid)

    def step(sample):
        def run():
            x.grad = grid.grad = None
            sample(x, grid).sum().backward()
        return run

    def aten_kernels():
        torch.ops.aten.grid_sampler_3d(xd, gd, 0, 0, False)
        torch.ops.aten.grid_sampler_3d_backward(ones, xd, gd, 0, 0, False, [True, True])

    def engine():
        x.grad = None
        (x * 1).sum().backward()

    def numpy_api():
        volsample.grid_sample_3d(xn, gn)
        volsample.grid_sample_3d_backward(onesn, xn, gn)

    return {"PyTorch F.grid_sample step": step(lambda a, b: F.grid_sample(a, b, align_corners=False)),
            "PyTorch's aten kernels, called directly": aten_kernels,
            "engine floor: (x * 1).sum().backward()": engine,
            "autograd.Function computing nothing": step(Nothing.apply),
            "NumPy API forward + backward": numpy_api,
            "volsample.torch step": step(vt.grid_sample)}


def floor(threads: int, rounds: int) -> str:
    """The floor rows (``floor_steps``) as a Markdown table."""
    import torch

    torch.set_num_threads(threads)
    volsample.set_num_threads(threads)
    steps = floor_steps()
    wall: dict = {name: [] for name in steps}
    cpu: dict = {name: [] for name in steps}
    for run in steps.values():
        for _ in range(300):
            run()
    calls = 2000
    for _ in range(rounds):
        for name, run in steps.items():
            w, c = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                run()
            cpu[name].append((time.thread_time() - c) / calls)
            wall[name].append((time.perf_counter() - w) / calls)
    us = {name: (np.median(wall[name]) * 1e6, np.median(cpu[name]) * 1e6) for name in steps}
    pytorch = us["PyTorch F.grid_sample step"]
    lines = [f"| 8^3 C1 float32 f+b, {threads} thread{'s' if threads > 1 else ''} | wall | "
             "CPU time | PyTorch step / this (wall) |", "|---|---:|---:|---:|"]
    for name, (w, c) in us.items():
        lines.append(f"| {name} | {w:.1f} us | {c:.1f} us | {pytorch[0] / w:.2f}x |")
    d = lambda a, b: f"{us[a][0] - us[b][0]:+.1f} us wall, {us[a][1] - us[b][1]:+.1f} us CPU"
    lines += ["", f"PyTorch's own door (step - its kernels): "
              f"{d('PyTorch F.grid_sample step', 'PyTorch' + chr(39) + 's aten kernels, called directly')}",
              f"volsample.torch's door (step - NumPy API): "
              f"{d('volsample.torch step', 'NumPy API forward + backward')}",
              f"a Python Function's own cost (empty Function - engine floor): "
              f"{d('autograd.Function computing nothing', 'engine floor: (x * 1).sum().backward()')}"]
    reach = [us["autograd.Function computing nothing"][k] + us["NumPy API forward + backward"][k]
             for k in (0, 1)]
    lines.append(f"reachable through a Python Function (empty Function + NumPy API): "
                 f"{reach[0]:.1f} us wall ({pytorch[0] / reach[0]:.2f}x PyTorch), "
                 f"{reach[1]:.1f} us CPU; volsample.torch over it: "
                 f"{us['volsample.torch step'][0] - reach[0]:+.1f} us wall, "
                 f"{us['volsample.torch step'][1] - reach[1]:+.1f} us CPU")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--floor", action="store_true",
                        help="the forward + backward floor rows at 8^3 C1 instead")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for threads in args.threads:
        if args.floor:
            print(floor(threads, args.rounds))
            print()
            continue
        print(table(threads, measure(threads, args.runs)))
        print()


if __name__ == "__main__":
    main()
