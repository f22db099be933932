"""Forward + backward through autograd: volsample.torch against PyTorch's own operators.

For each core workload it times one autograd step (forward, then the gradients of every
operand that requires one) with ``volsample.torch`` and with ``F.grid_sample`` /
``F.interpolate``, and the same forward + backward through the NumPy API called directly,
which gives the cost of the torch layer (custom-op dispatch, autograd, tensor views).
Last, a spatial-transformer step: a coarse displacement field upsampled to the image,
added to the identity grid, used to warp a volume; MSE loss to a target, backward to
the field.

One process, 2 threads for every implementation, medians of repeats with the warm-up
call excluded. The implementations of a workload take turns, call by call, so that load
from other processes drifting over time weighs on all of them alike.
Run: ``python benchmarks/torch_autograd.py``.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

import volsample
import volsample.torch as vt
from volsample.apps.bench_workloads import smooth_grid

THREADS = 2
IMAGE = (96, 112, 96)
ROUNDS = 9


def interleaved_medians(fns, rounds=ROUNDS):
    """Median seconds of each callable over ``rounds`` turns, after one warm-up call each."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, spent in zip(fns, times):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def _randn(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def grid_workload(C):
    """Trilinear sampling of (1, C, 96, 112, 96) along a smooth ~3-voxel deformation;
    gradients for the volume and the grid."""
    x = _randn(1, C, *IMAGE).requires_grad_()
    grid = torch.from_numpy(smooth_grid(1, *IMAGE)).requires_grad_()
    go = _randn(1, C, *IMAGE, seed=1)
    xn, gn, gon = x.detach().numpy(), grid.detach().numpy(), go.numpy()

    def step(sample):
        return lambda: torch.autograd.grad(sample(x, grid, align_corners=True), (x, grid), go)

    def numpy_api():
        volsample.grid_sample_3d(xn, gn, align_corners=True)
        volsample.grid_sample_3d_backward(gon, xn, gn, align_corners=True)

    return step(vt.grid_sample), step(F.grid_sample), numpy_api


def upsample_workload():
    """(2, 16, 40^3) upsampled x2 to 80^3 (align_corners=False); gradient for the input."""
    x = _randn(2, 16, 40, 40, 40).requires_grad_()
    go = _randn(2, 16, 80, 80, 80, seed=1)
    xn, gon = x.detach().numpy(), go.numpy()

    def interpolate(t, scale_factor):
        return F.interpolate(t, scale_factor=scale_factor, mode="trilinear")

    def step(upsample):
        return lambda: torch.autograd.grad(upsample(x, scale_factor=2.0), x, go)

    def numpy_api():
        volsample.upsample_trilinear_3d(xn, scale_factor=2.0)
        volsample.upsample_trilinear_3d_backward(gon, xn.shape, scales=(2.0, 2.0, 2.0))

    return step(vt.upsample_trilinear), step(interpolate), numpy_api


def spatial_transformer_workload():
    """One registration step: a (1, 3, 12, 14, 12) displacement field upsampled
    (align_corners=True) to 96x112x96, added to the identity grid, warping a
    (1, 1, 96, 112, 96) volume; MSE to a target; gradient for the field."""
    field = (0.02 * _randn(1, 3, 12, 14, 12)).requires_grad_()
    moving, target = _randn(1, 1, *IMAGE, seed=1), _randn(1, 1, *IMAGE, seed=2)
    identity = F.affine_grid(torch.eye(3, 4)[None], (1, 1) + IMAGE, align_corners=True)

    def step(upsample, sample):
        def run():
            flow = upsample(field, size=IMAGE, align_corners=True)
            warped = sample(moving, identity + flow.permute(0, 2, 3, 4, 1), align_corners=True)
            return torch.autograd.grad(F.mse_loss(warped, target), field)
        return run

    def interpolate(t, size, align_corners):
        return F.interpolate(t, size=size, mode="trilinear", align_corners=align_corners)

    return step(vt.upsample_trilinear, vt.grid_sample), step(interpolate, F.grid_sample), None


def main():
    torch.set_num_threads(THREADS)
    volsample.set_num_threads(THREADS)
    workloads = [("grid fwd+bwd smooth N1 C1 96x112x96", lambda: grid_workload(1)),
                 ("grid fwd+bwd smooth N1 C8 96x112x96", lambda: grid_workload(8)),
                 ("upsample fwd+bwd N2 C16 40^3->80^3", upsample_workload),
                 ("spatial transformer step 12x14x12->96x112x96", spatial_transformer_workload)]
    rows = []
    for name, build in workloads:
        fns = [fn for fn in build() if fn is not None]
        ours_s, theirs_s, *numpy_s = interleaved_medians(fns)
        rows.append((name, ours_s, theirs_s, numpy_s[0] if numpy_s else None))
    print(f"volsample {volsample.__version__}, torch {torch.__version__}, {THREADS} threads; "
          f"medians, warm-up excluded")
    header = ("workload", "volsample.torch ms", "PyTorch ms", "speed-up", "NumPy API ms",
              "torch-layer overhead")
    cells = [header] + [
        (name, f"{ours * 1e3:.1f}", f"{theirs * 1e3:.1f}", f"{theirs / ours:.2f}x",
         "-" if numpy_s is None else f"{numpy_s * 1e3:.1f}",
         "-" if numpy_s is None else f"{ours / numpy_s - 1:+.1%}")
        for name, ours, theirs, numpy_s in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for k, row in enumerate(cells):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
        if k == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
