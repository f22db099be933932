"""GPU benchmark: volsample's Triton kernels against PyTorch's CUDA operators, one process.

    python benchmarks/gpu.py                # on a CUDA device
    python benchmarks/gpu.py --device cpu   # dry run of the logic, tiny sizes, Triton's interpreter

Each row times one operation (median of repeats, the first call, with its compilation,
excluded; torch.cuda.synchronize after every call) and prints PyTorch's time over ours
(above 1: volsample is faster), the target, and the largest difference between the two
results relative to the largest value. The deterministic backward is also run twice and
its bits compared. Targets (H200): grid backward >= 1.5x PyTorch in float32 and >= 3x in
bfloat16, the deterministic backward within 1.3x of the atomic one, upsampling backward
>= 1.5x.
"""
from __future__ import annotations

import argparse
import os
import sys

CASES = {  # name: (N, C, grid or input spatial size, upsampled size)
    "cuda": dict(grid=(1, 16, (128,) * 3), upsample=(2, 32, (64,) * 3, (128,) * 3)),
    "cpu": dict(grid=(1, 2, (6, 7, 8)), upsample=(1, 2, (3, 4, 5), (6, 8, 10))),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a dry run with tiny sizes under TRITON_INTERPRET=1")
    parser.add_argument("--layout", choices=("ncdhw", "channels_last"), default="ncdhw")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are imported
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py: no CUDA device (torch.cuda.is_available() is False). "
                 "Run it on a machine with an NVIDIA GPU, or use --device cpu for a dry run.")
    from volsample._triton import grid_sample, upsample
    from volsample.apps.bench_timing import time_call
    from volsample.apps.bench_workloads import smooth_grid

    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(fn):
        """Median seconds of ``fn`` run to completion, warm-up excluded."""
        return time_call(lambda: (fn(), sync()))[1]

    def volume(shape, dtype, seed):
        g = torch.Generator().manual_seed(seed)
        t = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
        return t.contiguous(memory_format=torch.channels_last_3d) if args.layout != "ncdhw" else t

    rows, notes = [], []

    def row(name, ours, theirs, target, result=None, expected=None):
        ratio = theirs / ours
        verdict = "" if target is None else ("ok" if ratio >= target else "MISSED")
        diff = "" if result is None else f"{_relative_difference(result, expected):.1e}"
        rows.append((name, f"{ours * 1e3:.3f}", f"{theirs * 1e3:.3f}", f"{ratio:.2f}x",
                     "" if target is None else f">= {target}x", verdict, diff))

    N, C, size = CASES[args.device]["grid"]
    grid = torch.from_numpy(smooth_grid(N, *size)).to(device)  # ~3-voxel smooth displacement
    for dtype, target in ((torch.float32, 1.5), (torch.bfloat16, 3.0)):
        name = str(dtype).removeprefix("torch.")
        x, g = volume((N, C) + size, dtype, 1), volume((N, C) + size, dtype, 2)
        grid_t = grid.to(dtype)
        ours_out = grid_sample.forward(x, grid_t, 0, 0, True)
        theirs_out = torch.ops.aten.grid_sampler_3d(x, grid_t, 0, 0, True)
        row(f"grid forward {name}", timed(lambda: grid_sample.forward(x, grid_t, 0, 0, True)),
            timed(lambda: torch.ops.aten.grid_sampler_3d(x, grid_t, 0, 0, True)), None,
            ours_out, theirs_out)

        def ours(deterministic):
            return grid_sample.backward(g, x, grid_t, 0, 0, True, (True, True), deterministic)

        theirs = torch.ops.aten.grid_sampler_3d_backward(g, x, grid_t, 0, 0, True, [True, True])
        t_torch = timed(lambda: torch.ops.aten.grid_sampler_3d_backward(
            g, x, grid_t, 0, 0, True, [True, True]))
        t_atomic, t_det = timed(lambda: ours(False)), timed(lambda: ours(True))
        first, second = ours(True), ours(True)
        row(f"grid backward {name}, atomic", t_atomic, t_torch, target, ours(False)[0], theirs[0])
        row(f"grid backward {name}, deterministic", t_det, t_torch, target, first[0], theirs[0])
        same = all(torch.equal(a, b) for a, b in zip(first, second))
        notes.append(f"grid backward {name}: deterministic / atomic time {t_det / t_atomic:.2f} "
                     f"(target <= 1.3: {'ok' if t_det <= 1.3 * t_atomic else 'MISSED'}); "
                     f"deterministic bits equal on a second run: {'yes' if same else 'NO'}")

    N, C, small, large = CASES[args.device]["upsample"]
    x, g = volume((N, C) + small, torch.float32, 3), volume((N, C) + large, torch.float32, 4)
    none = (None, None, None)
    row("upsample forward float32", timed(lambda: upsample.forward(x, large, False, none)),
        timed(lambda: torch.ops.aten.upsample_trilinear3d(x, large, False, *none)), None,
        upsample.forward(x, large, False, none),
        torch.ops.aten.upsample_trilinear3d(x, large, False, *none))
    row("upsample backward float32",
        timed(lambda: upsample.backward(g, (N, C) + small, False, none, True)),
        timed(lambda: torch.ops.aten.upsample_trilinear3d_backward(g, large, (N, C) + small,
                                                                   False, *none)),
        1.5, upsample.backward(g, (N, C) + small, False, none, True),
        torch.ops.aten.upsample_trilinear3d_backward(g, large, (N, C) + small, False, *none))

    header = ("operation", "ours ms", "torch ms", "torch/ours", "target", "", "max rel diff")
    print(f"device: {_device_name(torch, device)}; layout: {args.layout}")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                        enumerate(zip(r, widths))))
    print("\n".join(notes))
    if args.device == "cpu":
        print("(a dry run under Triton's interpreter: the times mean nothing)")


def _relative_difference(result, expected):
    """Largest |result - expected| over the largest |expected|, in float64."""
    result, expected = result.double(), expected.double()
    return ((result - expected).abs().max() / expected.abs().max().clamp_min(1e-300)).item()


def _device_name(torch, device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"


if __name__ == "__main__":
    main()
