"""The workloads of ``volsample bench`` and of the scripts under ``benchmarks/``: each
builds its inputs once and returns one callable per implementation, volsample's and each
installed peer's, which ``bench_timing`` times the same way.

Peers, each when installed, each given the same thread count: PyTorch (forward and
backward), and for the float32 NCDHW forwards SciPy ``ndimage.map_coordinates`` / ``zoom``,
volresample (``grid_sample``, which has no align_corners and samples the same grid with
align_corners=False, and ``resample``), SimpleITK (``ResampleImageFilter`` with a
``DisplacementFieldTransform``: the grid as a voxel displacement field, linear
interpolation, 0 outside) and JAX ``map_coordinates``; for the affine warp, affiners
(``pip install affine-rs``: trilinear, 0 outside the input's voxel centres; its Rayon pool
takes the thread count from ``RAYON_NUM_THREADS``, set before its first call). Their versions
go into the report.

The warp workloads compare ``warp_3d`` (no grid) with volsample's own grid sampler fed
the grid ``affine_grid(theta) + displacement`` ("volsample-grid") and with PyTorch: an
affine warp (the grid formed beforehand, untimed), and one registration step through
``volsample.torch`` (I(A x + u(x)), MSE, gradients for theta and u: ``warp_mse_loss``,
against ``warp`` then ``F.mse_loss`` ("volsample-warp") and the grid-based steps, which
form the grid with ``F.affine_grid`` inside the step, as a user's code does).

The cubic workloads (bicubic, bspline; forward, backward) compare with volsample's own
trilinear sampling of the same grid ("volsample-trilinear"), SciPy's
``map_coordinates(order=3, prefilter=False)`` (forward) and torch-interpol's
``grid_pull(interpolation=3)`` (``pip install torch-interpol``; forward, and backward
through autograd), which compute the same B-spline sum (tests check it).
``step_peak_memory`` measures such a step's peak memory in a child process.

The suite covers the field's standard shapes: OASIS/IXI brain registration (160x192x224,
one image, a 3-channel displacement field, 36 one-hot labels), 3-D U-Net feature maps
(N2 C16 80x96x112) and a volume of 1 GiB; ``suite(shrink=k)`` divides every spatial size
by k, so that tests run every workload and peer at tiny sizes.
"""
from __future__ import annotations

import json
import sys

import numpy as np

import volsample

from .. import _dtypes
from . import bench_jax, bench_register
from .bench_peers import affiners_warp, have, simpleitk_warp
from .bench_timing import Workload


def smooth_grid(N, D, H, W, amplitude=3.0, seed=0, dtype=np.float32):
    """Identity grid plus a smooth displacement of about ``amplitude`` voxels: the kind of
    field image registration produces (align_corners=True coordinates)."""
    rng = np.random.default_rng(seed)
    z, y, x = np.meshgrid(np.linspace(-1, 1, D), np.linspace(-1, 1, H), np.linspace(-1, 1, W),
                          indexing="ij")
    grid = np.stack([x, y, z], -1)[None].repeat(N, 0)
    for axis, size in enumerate((W, H, D)):
        phase = rng.uniform(0, 2 * np.pi, 3)
        bump = np.sin(2 * x + phase[0]) * np.cos(3 * y + phase[1]) * np.sin(2.5 * z + phase[2])
        grid[..., axis] += amplitude * 2 / max(size - 1, 1) * bump
    return grid.astype(dtype)


def random_grid(N, D, H, W, seed=0, dtype=np.float32):
    """Uniform random points in [-1, 1]: no locality at all."""
    return np.random.default_rng(seed).uniform(-1, 1, (N, D, H, W, 3)).astype(dtype)


def _volume(shape, dtype, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _torch_tensor(arr, channels_last=False):
    import torch

    if arr.dtype == _dtypes.BFLOAT16:
        tensor = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(arr)
    if channels_last:  # arr is physically N, D, H, W, C
        tensor = tensor.permute(0, 4, 1, 2, 3)
    return tensor


def _grid_workload(name, N, C, in_spatial, grid_maker, out_spatial, direction, dtype=np.float32,
                   layout="NCDHW", quick=False, other_peers=True):
    dtype = np.dtype(dtype)
    volume_shape = (N, C) + in_spatial
    out_shape = (N, C) + out_spatial
    points = N * int(np.prod(out_spatial))
    volume_bytes = N * C * int(np.prod(in_spatial)) * dtype.itemsize
    grid_bytes = points * 3 * 4
    out_bytes = points * C * dtype.itemsize
    if direction == "forward":
        nbytes = volume_bytes + grid_bytes + out_bytes
    else:  # read grad_output, input, grid; write grad_input, grad_grid
        nbytes = out_bytes + 2 * volume_bytes + 2 * grid_bytes

    def build():
        grid = grid_maker(N, *out_spatial)
        x = _volume(volume_shape, dtype)
        g = _volume(out_shape, dtype, seed=3)
        if layout == "NDHWC":
            x, g = (np.ascontiguousarray(a.transpose(0, 2, 3, 4, 1)) for a in (x, g))
        impls = {}
        if direction == "forward":
            impls["volsample"] = lambda: volsample.grid_sample_3d(x, grid, align_corners=True,
                                                                  layout=layout)
        else:
            impls["volsample"] = lambda: volsample.grid_sample_3d_backward(
                g, x, grid, align_corners=True, layout=layout)
        if have("torch"):
            import torch

            tx, tg = _torch_tensor(x, layout == "NDHWC"), _torch_tensor(g, layout == "NDHWC")
            tgrid = torch.from_numpy(grid).to(tx.dtype)
            if direction == "forward":
                impls["pytorch"] = lambda: torch.ops.aten.grid_sampler_3d(tx, tgrid, 0, 0, True)
            else:
                impls["pytorch"] = lambda: torch.ops.aten.grid_sampler_3d_backward(
                    tg, tx, tgrid, 0, 0, True, [True, True])
        if other_peers and direction == "forward" and layout == "NCDHW" and dtype == np.float32:
            # map_coordinates takes voxel coordinates (z, y, x) and samples one channel.
            voxel = [(grid[0, ..., k] + 1) / 2 * (s - 1) for k, s in ((2, in_spatial[0]),
                                                                      (1, in_spatial[1]),
                                                                      (0, in_spatial[2]))]
            if have("scipy") and N == 1:
                from scipy import ndimage

                coords = np.stack(voxel)
                impls["scipy"] = lambda: [ndimage.map_coordinates(x[0, c], coords, order=1,
                                                                  mode="constant")
                                          for c in range(C)]
            if have("volresample"):
                import volresample

                impls["volresample"] = lambda: volresample.grid_sample(x, grid, "linear", "zeros")
            if have("SimpleITK") and N == 1:
                impls["simpleitk"] = simpleitk_warp(x, grid, in_spatial,
                                                     volsample.get_num_threads())
            if have("jax") and N == 1:
                import jax
                import jax.numpy as jnp
                from jax.scipy import ndimage as jndimage

                jx, jcoords = jnp.asarray(x[0]), [jnp.asarray(v) for v in voxel]
                sample = jax.jit(jax.vmap(lambda vol: jndimage.map_coordinates(
                    vol, jcoords, order=1, mode="constant")))
                impls["jax"] = lambda: sample(jx).block_until_ready()
        return impls

    return Workload(name, build, nbytes, quick)


def _cubic_workload(name, mode, spatial, direction, quick=False):
    """Bicubic or B-spline sampling of an N1 C1 float32 volume on a smooth grid (border
    padding, align_corners): against volsample's trilinear on the same grid, SciPy's
    ``map_coordinates(order=3, prefilter=False)`` (forward; the same B-spline sum) and
    torch-interpol's ``grid_pull(interpolation=3)`` (the B-spline; forward and, through
    autograd, backward)."""
    volume_bytes = int(np.prod(spatial)) * 4
    nbytes = 3 * volume_bytes + 12 * int(np.prod(spatial))

    def build():
        grid = smooth_grid(1, *spatial)
        x = _volume((1, 1) + spatial, np.float32)
        g = _volume((1, 1) + spatial, np.float32, seed=3)
        args = ("border", True)
        if direction == "forward":
            impls = {"volsample": lambda: volsample.grid_sample_3d(x, grid, mode, *args),
                     "volsample-trilinear": lambda: volsample.grid_sample_3d(x, grid,
                                                                             "bilinear", *args)}
        else:
            impls = {"volsample": lambda: volsample.grid_sample_3d_backward(g, x, grid, mode,
                                                                            *args),
                     "volsample-trilinear": lambda: volsample.grid_sample_3d_backward(
                         g, x, grid, "bilinear", *args)}
        voxel = np.stack([(grid[0, ..., k] + 1) / 2 * (size - 1)
                          for k, size in ((2, spatial[0]), (1, spatial[1]), (0, spatial[2]))])
        if direction == "forward" and have("scipy"):
            from scipy import ndimage

            impls["scipy"] = lambda: ndimage.map_coordinates(x[0, 0], voxel, order=3,
                                                             prefilter=False, mode="nearest")
        if have("interpol") and have("torch"):
            import interpol
            import torch

            tx = torch.from_numpy(x[0])  # (C, D, H, W): channels first, no batch
            coords = torch.from_numpy(np.moveaxis(voxel, 0, -1).astype(np.float32))
            if direction == "forward":
                impls["torch-interpol"] = lambda: interpol.grid_pull(
                    tx, coords, interpolation=3, bound="replicate", extrapolate=True,
                    prefilter=False)
            else:
                tg = torch.from_numpy(g[0])

                def pull_backward():
                    tx_ = tx.clone().requires_grad_()
                    coords_ = coords.clone().requires_grad_()
                    interpol.grid_pull(tx_, coords_, interpolation=3, bound="replicate",
                                       extrapolate=True, prefilter=False).backward(tg)
                    return tx_.grad, coords_.grad
                impls["torch-interpol"] = pull_backward
        return impls

    return Workload(name, build, nbytes, quick)


def _upsample_workload(name, N, C, in_spatial, scale, direction, dtype=np.float32,
                       layout="NCDHW", quick=False):
    dtype = np.dtype(dtype)
    out_spatial = tuple(int(s * scale) for s in in_spatial)
    small = N * C * int(np.prod(in_spatial)) * dtype.itemsize
    large = N * C * int(np.prod(out_spatial)) * dtype.itemsize
    nbytes = small + large

    def build():
        if direction == "forward":
            x = _volume((N, C) + in_spatial, dtype)
        else:
            x = _volume((N, C) + out_spatial, dtype)
        if layout == "NDHWC":
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 4, 1))
        impls = {}
        scales = (float(scale),) * 3
        if direction == "forward":
            impls["volsample"] = lambda: volsample.upsample_trilinear_3d(
                x, scale_factor=scale, layout=layout)
        else:
            impls["volsample"] = lambda: volsample.upsample_trilinear_3d_backward(
                x, (N, C) + in_spatial, scales=scales, layout=layout)
        if have("torch"):
            import torch

            tx = _torch_tensor(x, layout == "NDHWC")
            if direction == "forward":
                impls["pytorch"] = lambda: torch.ops.aten.upsample_trilinear3d(
                    tx, list(out_spatial), False, *scales)
            else:
                impls["pytorch"] = lambda: torch.ops.aten.upsample_trilinear3d_backward(
                    tx, list(out_spatial), [N, C, *in_spatial], False, *scales)
        if (direction == "forward" and layout == "NCDHW" and dtype != _dtypes.BFLOAT16
                and have("scipy")):
            from scipy import ndimage

            impls["scipy"] = lambda: ndimage.zoom(x, (1, 1) + (scale,) * 3, order=1,
                                                  grid_mode=True, mode="nearest")
        if (direction == "forward" and layout == "NCDHW" and dtype == np.float32
                and have("volresample")):
            import volresample

            impls["volresample"] = lambda: volresample.resample(x, out_spatial, "linear")
        return impls

    return Workload(name, build, nbytes, quick)


def _small_workload(name, C, in_size, out_shape, direction, quick=False):
    """A small call through volsample.torch ("volsample"), where the cost of the door (the
    custom op, autograd, the description, the tensor views) weighs most: against PyTorch's
    F.grid_sample, the NumPy API on the same memory and F.grid_sample under
    ``volsample.torch.patch()``. ``direction`` "forward", or "step": the forward, then
    ``.sum().backward()`` into input and grid, as users write it (the NumPy API: its
    forward and its backward with an output gradient of ones)."""
    spatial = (in_size,) * 3
    points = int(np.prod(out_shape))
    volume_bytes, out_bytes = C * in_size ** 3 * 4, points * C * 4
    nbytes = volume_bytes + points * 12 + out_bytes
    if direction == "step":
        nbytes += out_bytes + volume_bytes + points * 12

    def build():
        import torch
        import torch.nn.functional as F

        import volsample.torch as vt

        x = _volume((1, C) + spatial, np.float32)
        grid = random_grid(1, *out_shape)
        ones = np.ones((1, C) + out_shape, np.float32)
        tx, tgrid = torch.from_numpy(x), torch.from_numpy(grid)
        with vt.patch():
            patched = F.grid_sample  # what the user's F.grid_sample is under patch()
        samplers = {"volsample": vt.grid_sample, "pytorch": F.grid_sample,
                    "volsample-patch": patched}
        if direction == "forward":
            impls = {name: (lambda fn=fn: fn(tx, tgrid, align_corners=True))
                     for name, fn in samplers.items()}
            impls["volsample-numpy"] = lambda: volsample.grid_sample_3d(x, grid,
                                                                        align_corners=True)
            return impls
        tx.requires_grad_(), tgrid.requires_grad_()

        def step(fn):
            fn(tx, tgrid, align_corners=True).sum().backward()

        def numpy_step():
            volsample.grid_sample_3d(x, grid, align_corners=True)
            volsample.grid_sample_3d_backward(ones, x, grid, align_corners=True)

        impls = {name: (lambda fn=fn: step(fn)) for name, fn in samplers.items()}
        impls["volsample-numpy"] = numpy_step
        return impls

    return Workload(name, build, nbytes, quick)


def affine_theta(N, seed=0, dtype=np.float32):
    """Per batch item a small rotation, scaling and shift, as a registration meets them:
    theta (N, 3, 4) in affine_grid's convention."""
    rng = np.random.default_rng(seed)
    theta = np.empty((N, 3, 4))
    for n in range(N):
        theta[n, :, :3] = (bench_register.rotation(rng.uniform(-0.1, 0.1, 3))
                           * rng.uniform(0.95, 1.05, 3))
        theta[n, :, 3] = rng.uniform(-0.05, 0.05, 3)
    return theta.astype(dtype)


def _warp_workload(name, N, C, spatial, quick=False):
    """An affine warp: ``warp_3d(x, theta)`` against the grid samplers on
    ``affine_grid(theta)`` formed beforehand (trilinear, zeros, align_corners=False)."""
    volume_bytes = N * C * int(np.prod(spatial)) * 4

    def build():
        from .. import _reference

        x, theta = _volume((N, C) + spatial, np.float32), affine_theta(N)
        grid = _reference.affine_grid(theta, spatial).astype(np.float32)
        impls = {"volsample": lambda: volsample.warp_3d(x, theta),
                 "volsample-grid": lambda: volsample.grid_sample_3d(x, grid)}
        if have("torch"):
            import torch

            tx, tgrid = torch.from_numpy(x), torch.from_numpy(grid)
            impls["pytorch"] = lambda: torch.ops.aten.grid_sampler_3d(tx, tgrid, 0, 0, False)
        if have("affiners"):
            impls["affiners"] = affiners_warp(x, theta)
        return impls

    return Workload(name, build, 2 * volume_bytes, quick)


def registration_step(variant, x, theta, displacement, target, loss="mse_loss"):
    """One registration step of ``variant``: the MSE of I(A x + u(x)) to ``target`` and its
    gradients for theta and u. "volsample" takes the warp and the MSE at once,
    ``vt.warp_mse_loss``; the others warp, with ``vt.warp`` ("volsample-warp"), or with
    ``F.affine_grid(theta) + u`` then ``vt.grid_sample`` ("volsample-grid") or
    ``F.grid_sample`` ("pytorch"), then take the MSE as ``F.mse_loss`` ("mse_loss") or
    written out, ``((w - target) ** 2).mean()`` ("square": its autograd holds five
    image-sized tensors at once)."""
    import torch
    import torch.nn.functional as F

    import volsample.torch as vt

    def warped():  # a function, so that the step holds no result beyond what autograd keeps
        if variant == "volsample-warp":
            return vt.warp(x, theta, displacement)
        grid = F.affine_grid(theta, list(target.shape), align_corners=False) + displacement
        sample = vt.grid_sample if variant == "volsample-grid" else F.grid_sample
        return sample(x, grid, align_corners=False)

    if loss not in ("mse_loss", "square"):
        raise ValueError(f"loss must be 'mse_loss' or 'square', got {loss!r}")
    if variant == "volsample":
        value = vt.warp_mse_loss(x, target, theta, displacement)
    elif loss == "mse_loss":
        value = F.mse_loss(warped(), target)
    elif loss == "square":
        value = ((warped() - target) ** 2).mean()
    return torch.autograd.grad(value, (theta, displacement))


def step_operands(N, C, spatial, seed=0):
    """(x, theta, u, target) of a registration step: u a smooth field of about a voxel."""
    import torch

    x = torch.from_numpy(_volume((N, C) + spatial, np.float32, seed))
    theta = torch.from_numpy(affine_theta(N, seed)).requires_grad_()
    u = torch.from_numpy(smooth_grid(N, *spatial, amplitude=1.0, seed=seed)
                         - smooth_grid(N, *spatial, amplitude=0.0, seed=seed)).requires_grad_()
    target = torch.from_numpy(_volume((N, C) + spatial, np.float32, seed + 1))
    return x, theta, u, target


def _warp_step_workload(name, N, C, spatial, quick=False):
    points = N * int(np.prod(spatial))

    def build():
        operands = step_operands(N, C, spatial)
        return {variant: (lambda v=variant: registration_step(v, *operands))
                for variant in ("volsample", "volsample-warp", "volsample-grid", "pytorch")}

    # x, u and the target read; u's gradient written
    return Workload(name, build, points * (2 * C + 6) * 4, quick)


# Run in a child interpreter: the peak resident set growth of one step (after a warm-up one).
_STEP_CHILD = r"""
import gc, json, sys
import torch
import volsample
from volsample.apps.bench_workloads import registration_step, step_operands

variant, N, C, spatial, threads, loss = json.loads(sys.argv[1])
torch.set_num_threads(threads)
volsample.set_num_threads(threads)
operands = step_operands(N, C, tuple(spatial))

def rss(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))

registration_step(variant, *operands, loss)
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident set, reset to the current one
before = rss("VmRSS:")
grads = registration_step(variant, *operands, loss)
print(json.dumps(rss("VmHWM:") - before))
"""


def step_peak_memory(variant, N, C, spatial, threads, loss="mse_loss") -> int:
    """Peak resident-set growth in bytes (Linux) of one ``registration_step`` of ``variant``
    (with ``loss``) in a child process, its operands allocated before: what the step itself
    allocates, its gradients for theta and u included."""
    import os
    import subprocess

    # glibc then maps every large block afresh and returns it when freed, so that pages a
    # warm-up step left resident do not hide the growth
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(64 << 10))
    proc = subprocess.run([sys.executable, "-c", _STEP_CHILD,
                           json.dumps([variant, N, C, list(spatial), threads, loss])],
                          capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return int(proc.stdout.splitlines()[-1])


def suite(shrink: int = 1) -> list[Workload]:
    """Every workload, in report order. Names read: operator.direction kind shape dtype layout.

    ``shrink`` divides every spatial size (at least 2 voxels remain); names keep the full
    sizes, so that tests can run each workload, peers included, in milliseconds."""
    smooth, rand = smooth_grid, random_grid
    s = lambda *shape: tuple(max(2, n // shrink) for n in shape)
    reg = s(96, 112, 96)
    oasis, feature = s(160, 192, 224), s(80, 96, 112)
    bf16 = _dtypes.BFLOAT16
    w = []
    for direction, short in (("forward", "fwd"), ("backward", "bwd")):
        w += [
            _grid_workload(f"grid.{short} smooth N1 C1 96x112x96", 1, 1, reg, smooth, reg, direction),
            _grid_workload(f"grid.{short} smooth N1 C8 96x112x96", 1, 8, reg, smooth, reg, direction),
            _grid_workload(f"grid.{short} smooth N2 C1 96x112x96", 2, 1, reg, smooth, reg, direction),
            _grid_workload(f"grid.{short} random N1 C1 64^3", 1, 1, s(64, 64, 64), rand, s(64, 64, 64), direction),
            _grid_workload(f"grid.{short} smooth N1 C8 96x112x96 bf16", 1, 8, reg, smooth, reg, direction, bf16),
            _grid_workload(f"grid.{short} smooth N1 C8 96x112x96 NDHWC", 1, 8, reg, smooth, reg, direction,
                           layout="NDHWC"),
            _grid_workload(f"grid.{short} video N1 C3 16x256x256", 1, 3, s(16, 256, 256), smooth,
                           s(16, 256, 256), direction),
            _grid_workload(f"grid.{short} tiny N1 C2 12^3", 1, 2, s(12, 12, 12), smooth, s(12, 12, 12),
                           direction, quick=True),
            _upsample_workload(f"up.{short} unet N2 C16 40^3 x2", 2, 16, s(40, 40, 40), 2, direction),
            _upsample_workload(f"up.{short} unet N1 C32 24x32x32 x2 NDHWC", 1, 32, s(24, 32, 32), 2,
                               direction, layout="NDHWC"),
            _upsample_workload(f"up.{short} unet N1 C32 24x32x32 x2 bf16", 1, 32, s(24, 32, 32), 2,
                               direction, bf16),
            _upsample_workload(f"up.{short} field N1 C3 12x14x12 x8", 1, 3, s(12, 14, 12), 8, direction),
            _upsample_workload(f"up.{short} video N1 C3 8x128x128 x2", 1, 3, s(8, 128, 128), 2, direction),
            _upsample_workload(f"up.{short} tiny N1 C2 6^3 x2", 1, 2, s(6, 6, 6), 2, direction,
                               quick=True),
        ]
    # The field's standard shapes: OASIS/IXI registration (an image, a displacement field
    # and 36 one-hot labels warped; the image's gradient; the control field upsampled x4),
    # U-Net feature maps, and a 1 GiB volume read by a 2x zoomed-out warp.
    for C, what in ((1, "image"), (3, "field"), (36, "labels")):
        w.append(_grid_workload(f"grid.fwd oasis {what} N1 C{C} 160x192x224", 1, C, oasis, smooth,
                                oasis, "forward"))
    for C, what in ((1, "image"), (3, "field")):
        w.append(_grid_workload(f"grid.bwd oasis {what} N1 C{C} 160x192x224", 1, C, oasis, smooth,
                                oasis, "backward"))
    w.append(_upsample_workload("up.fwd oasis field N1 C3 40x48x56 x4", 1, 3, s(40, 48, 56), 4,
                                "forward"))
    # Warps without a grid: an affine warp, and a registration step through volsample.torch.
    w.append(_warp_workload("warp.fwd affine oasis N1 C1 160x192x224", 1, 1, oasis))
    w.append(_warp_workload("warp.fwd affine tiny N1 C2 12^3", 1, 2, s(12, 12, 12), quick=True))
    if have("torch"):
        w.append(_warp_step_workload("warp.step oasis N1 C1 160x192x224", 1, 1, oasis))
    for direction, short in (("forward", "fwd"), ("backward", "bwd")):
        w += [
            _grid_workload(f"grid.{short} feature N2 C16 80x96x112", 2, 16, feature, smooth,
                           feature, direction),
            _upsample_workload(f"up.{short} feature N2 C16 40x48x56 x2", 2, 16, s(40, 48, 56), 2,
                               direction),
        ]
    # Cubic sampling (bicubic, B-spline) of an OASIS image.
    for direction, short in (("forward", "fwd"), ("backward", "bwd")):
        for mode in ("bicubic", "bspline"):
            w.append(_cubic_workload(f"grid.{short} {mode} oasis N1 C1 160x192x224", mode, oasis,
                                     direction))
    # How the cost per point grows as the volume and its grid leave the caches: a D^3
    # volume sampled at D^3 points, smooth and random grids, 64^3 to 256^3, against
    # PyTorch alone (the other libraries' forwards would take most of the sweep's time).
    for direction, short in (("forward", "fwd"), ("backward", "bwd")):
        for kind, maker in (("smooth", smooth), ("random", rand)):
            for D in (64, 96, 128, 160, 192, 256):
                w.append(_grid_workload(f"grid.{short} sweep {kind} N1 C1 {D}^3", 1, 1,
                                        s(D, D, D), maker, s(D, D, D), direction,
                                        other_peers=False))
    w.append(_grid_workload("grid.fwd gib N1 C1 512x512x1024 -> 256x256x512", 1, 1,
                            s(512, 512, 1024), smooth, s(256, 256, 512), "forward"))
    # Small calls, where the door's fixed cost shows: volumes of 8^3 to 32^3 sampled at as
    # many points, and keypoints (1,000 points of a 32^3 C16 feature volume).
    if have("torch"):
        for direction, short in (("forward", "fwd"), ("step", "fwd+bwd")):
            for size, C in ((8, 1), (8, 4), (16, 1), (16, 4), (32, 1)):
                w.append(_small_workload(f"small.{short} N1 C{C} {size}^3", C, s(size)[0],
                                         s(size, size, size), direction))
            w.append(_small_workload(f"small.{short} keypoints N1 C16 32^3 at 1000", 16,
                                     s(32)[0], (1, 1, 1000), direction))
    # volsample.jax inside jax.jit against JAX's own samplers (bench_jax).
    w += bench_jax.workloads(smooth_grid, shrink)
    return w
