"""Side-by-side benchmarks: volsample against every peer installed, in one process.

One harness serves ``volsample bench`` and the scripts under ``benchmarks/``. A workload
builds its inputs once and returns one callable per implementation; the harness times each
the same way (warm-up excluded, median of repeats, the same thread count for all), reports
the ratio peer time / volsample time (above 1: volsample is faster; the median and the
interquartile range over rounds that time every implementation back to back), the first call's time
on its own line (a cold call: caches, page faults, thread start-up), and the effective memory bandwidth
as a fraction of this machine's measured copy bandwidth.

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

import argparse
import dataclasses
import datetime
import fnmatch
import json
import math
import os
import platform
import random
import sys
import time
from collections.abc import Callable

import numpy as np

import volsample

from .. import _dtypes
from .._progress import ProgressBar
from . import bench_register

PEERS = ("volsample-grid", "volsample-warp", "volsample-trilinear", "pytorch", "scipy",
         "torch-interpol", "volresample", "simpleitk", "jax", "affiners", "volsample-numpy",
         "volsample-patch")
# volsample-grid: volsample's own grid sampler on a formed grid (the warp workloads' baseline);
# volsample-warp: the registration step as volsample.torch.warp then F.mse_loss;
# volsample-trilinear: volsample's trilinear sampling of the same grid (the cubic workloads');
# volsample-numpy, volsample-patch: the NumPy API and F.grid_sample under
# volsample.torch.patch(), beside volsample.torch (the small-size family)
# the other packages' modules (volsample's own variants are volsample's version, not peers)
_PEER_MODULES = {"pytorch": "torch", "scipy": "scipy", "torch-interpol": "interpol",
                 "volresample": "volresample", "simpleitk": "SimpleITK", "jax": "jax",
                 "affiners": "affiners"}


@dataclasses.dataclass
class Workload:
    """One benchmark: ``build()`` makes the inputs and returns {implementation: callable}."""

    name: str
    build: Callable[[], dict]
    nbytes: int  # bytes a perfect implementation reads and writes once
    quick: bool = False  # part of the --quick suite


@dataclasses.dataclass
class Result:
    workload: str
    implementation: str
    median_s: float
    first_call_s: float
    repeats: int
    bandwidth_fraction: float
    ratio: float | None = None  # the median over the rounds of this peer's time / volsample's
    # The interquartile range of the ratio over the rounds (each round times volsample and
    # this peer once, back to back): how far a ratio can be trusted on this machine; None
    # where fewer than MIN_SPREAD_ROUNDS rounds were paired (quartiles of one or two values
    # say nothing).
    ratio_iqr: tuple[float, float] | None = None
    rounds: int | None = None  # the rounds the ratio pairs (a peer's result)
    # bandwidth_fraction against the copy bandwidth measured after the run (the one above:
    # before it), where the two differ by more than NOISY_BANDWIDTH: the machine's memory
    # system did not hold still
    bandwidth_fraction_after: float | None = None


# ---------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------


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


def _have(module):
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def peer_versions() -> dict:
    """{peer: version string, or None when it is not installed}: the other packages, not
    volsample's own variants."""
    versions: dict[str, str | None] = {}
    for peer, module in _PEER_MODULES.items():
        if not _have(module):
            versions[peer] = None
            continue
        mod = sys.modules[module]
        versions[peer] = str(mod.Version_VersionString() if peer == "simpleitk"
                             else mod.__version__)
    return versions


def affiners_map(theta, spatial):
    """affiners' (scipy's) form of warp_3d's theta (one batch item, align_corners=False) for
    an output of the input's size: (matrix, offset) taking an output voxel index (z, y, x)
    to the input index it reads."""
    sizes = np.array(spatial[::-1], float)  # along x, y, z
    to_grid = np.zeros((4, 4))  # (z, y, x, 1) -> normalised (x, y, z, 1)
    to_index = np.zeros((4, 4))  # normalised (x, y, z, 1) -> (z, y, x, 1)
    for k in range(3):
        to_grid[k, 2 - k], to_grid[k, 3] = 2 / sizes[k], 1 / sizes[k] - 1
        to_index[2 - k, k], to_index[2 - k, 3] = sizes[k] / 2, (sizes[k] - 1) / 2
    to_grid[3, 3] = to_index[3, 3] = 1
    m = to_index @ np.vstack([theta, [0, 0, 0, 1]]) @ to_grid
    return np.ascontiguousarray(m[:3, :3]), np.ascontiguousarray(m[:3, 3])


def _affiners_warp(x, theta):
    """A callable warping every (n, c) volume of ``x`` by theta with affiners."""
    import affiners

    maps = [affiners_map(t, x.shape[2:]) for t in theta.astype(np.float64)]
    return lambda: [affiners.affine_transform(x[n, c], *maps[n], 0.0, 1)
                    for n in range(x.shape[0]) for c in range(x.shape[1])]


def _simpleitk_warp(x, grid, in_spatial, threads):
    """A callable resampling ``x[0]`` (C channels, as one vector image) at the points of
    ``grid`` (align_corners=True) with ITK: the points become a voxel displacement field
    on the output lattice (spacing 1, origin 0, as the input's)."""
    import SimpleITK as sitk

    D, H, W = in_spatial
    out = grid.shape[1:4]
    voxel = (grid[0].astype(np.float64) + 1) / 2 * (np.array([W, H, D], np.float64) - 1)
    z, y, x_ = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in out), indexing="ij")
    field = sitk.GetImageFromArray(voxel - np.stack([x_, y, z], -1), isVector=True)
    transform = sitk.DisplacementFieldTransform(field)
    C = x.shape[1]
    image = (sitk.GetImageFromArray(x[0, 0]) if C == 1
             else sitk.GetImageFromArray(np.ascontiguousarray(np.moveaxis(x[0], 0, -1)),
                                         isVector=True))
    resample = sitk.ResampleImageFilter()
    resample.SetSize(tuple(int(n) for n in out[::-1]))
    resample.SetOutputSpacing((1.0, 1.0, 1.0))
    resample.SetOutputOrigin((0.0, 0.0, 0.0))
    resample.SetTransform(transform)
    resample.SetInterpolator(sitk.sitkLinear)
    resample.SetDefaultPixelValue(0.0)
    resample.SetNumberOfThreads(threads)
    return lambda: resample.Execute(image)


# ---------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------


def _grid_workload(name, N, C, in_spatial, grid_maker, out_spatial, direction, dtype=np.float32,
                   layout="NCDHW", quick=False):
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
        if _have("torch"):
            import torch

            tx, tg = _torch_tensor(x, layout == "NDHWC"), _torch_tensor(g, layout == "NDHWC")
            tgrid = torch.from_numpy(grid).to(tx.dtype)
            if direction == "forward":
                impls["pytorch"] = lambda: torch.ops.aten.grid_sampler_3d(tx, tgrid, 0, 0, True)
            else:
                impls["pytorch"] = lambda: torch.ops.aten.grid_sampler_3d_backward(
                    tg, tx, tgrid, 0, 0, True, [True, True])
        if direction == "forward" and layout == "NCDHW" and dtype == np.float32:
            # map_coordinates takes voxel coordinates (z, y, x) and samples one channel.
            voxel = [(grid[0, ..., k] + 1) / 2 * (s - 1) for k, s in ((2, in_spatial[0]),
                                                                      (1, in_spatial[1]),
                                                                      (0, in_spatial[2]))]
            if _have("scipy") and N == 1:
                from scipy import ndimage

                coords = np.stack(voxel)
                impls["scipy"] = lambda: [ndimage.map_coordinates(x[0, c], coords, order=1,
                                                                  mode="constant")
                                          for c in range(C)]
            if _have("volresample"):
                import volresample

                impls["volresample"] = lambda: volresample.grid_sample(x, grid, "linear", "zeros")
            if _have("SimpleITK") and N == 1:
                impls["simpleitk"] = _simpleitk_warp(x, grid, in_spatial,
                                                     volsample.get_num_threads())
            if _have("jax") and N == 1:
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
        if direction == "forward" and _have("scipy"):
            from scipy import ndimage

            impls["scipy"] = lambda: ndimage.map_coordinates(x[0, 0], voxel, order=3,
                                                             prefilter=False, mode="nearest")
        if _have("interpol") and _have("torch"):
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
        if _have("torch"):
            import torch

            tx = _torch_tensor(x, layout == "NDHWC")
            if direction == "forward":
                impls["pytorch"] = lambda: torch.ops.aten.upsample_trilinear3d(
                    tx, list(out_spatial), False, *scales)
            else:
                impls["pytorch"] = lambda: torch.ops.aten.upsample_trilinear3d_backward(
                    tx, list(out_spatial), [N, C, *in_spatial], False, *scales)
        if (direction == "forward" and layout == "NCDHW" and dtype != _dtypes.BFLOAT16
                and _have("scipy")):
            from scipy import ndimage

            impls["scipy"] = lambda: ndimage.zoom(x, (1, 1) + (scale,) * 3, order=1,
                                                  grid_mode=True, mode="nearest")
        if (direction == "forward" and layout == "NCDHW" and dtype == np.float32
                and _have("volresample")):
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
        if _have("torch"):
            import torch

            tx, tgrid = torch.from_numpy(x), torch.from_numpy(grid)
            impls["pytorch"] = lambda: torch.ops.aten.grid_sampler_3d(tx, tgrid, 0, 0, False)
        if _have("affiners"):
            impls["affiners"] = _affiners_warp(x, theta)
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
from volsample.apps.bench import registration_step, step_operands

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
    if _have("torch"):
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
    # volume sampled at D^3 points, smooth and random grids, 64^3 to 256^3.
    for direction, short in (("forward", "fwd"), ("backward", "bwd")):
        for kind, maker in (("smooth", smooth), ("random", rand)):
            for D in (64, 96, 128, 160, 192, 256):
                w.append(_grid_workload(f"grid.{short} sweep {kind} N1 C1 {D}^3", 1, 1,
                                        s(D, D, D), maker, s(D, D, D), direction))
    w.append(_grid_workload("grid.fwd gib N1 C1 512x512x1024 -> 256x256x512", 1, 1,
                            s(512, 512, 1024), smooth, s(256, 256, 512), "forward"))
    # Small calls, where the door's fixed cost shows: volumes of 8^3 to 32^3 sampled at as
    # many points, and keypoints (1,000 points of a 32^3 C16 feature volume).
    if _have("torch"):
        for direction, short in (("forward", "fwd"), ("step", "fwd+bwd")):
            for size, C in ((8, 1), (8, 4), (16, 1), (16, 4), (32, 1)):
                w.append(_small_workload(f"small.{short} N1 C{C} {size}^3", C, s(size)[0],
                                         s(size, size, size), direction))
            w.append(_small_workload(f"small.{short} keypoints N1 C16 32^3 at 1000", 16,
                                     s(32)[0], (1, 1, 1000), direction))
    return w


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------


# Timing limits of a full run and of --quick: the quick workloads take microseconds, so
# each of their samples times a batch of calls (at least ``min_sample_seconds``) and more
# rounds are taken, for a median that holds from one run to the next.
LIMITS = dict(min_repeats=5, min_seconds=0.3, max_repeats=50, max_seconds=10.0)
QUICK_LIMITS = dict(min_repeats=25, min_seconds=0.2, max_repeats=200, max_seconds=2.0,
                    min_sample_seconds=2e-3)


# The fewest paired rounds whose interquartile range is reported: a slow workload (seconds
# a call) stops after ``max_seconds``, sometimes after one round.
MIN_SPREAD_ROUNDS = 4
# A ratio whose rounds spread wider than this (the interquartile range's high over its
# low) is marked noisy in the plain table, as is a copy bandwidth that moved by more than
# NOISY_BANDWIDTH between the start and the end of a run: a figure the machine did not
# hold still for (another program's work, a peer's own thread pool), to rerun quietly.
NOISY_SPREAD = 1.5
NOISY_BANDWIDTH = 1.25


def time_calls(fns, min_repeats=5, min_seconds=0.3, max_repeats=50, max_seconds=10.0):
    """{name: (first call seconds, median seconds of the later calls, repeats)} for the
    callables ``fns`` (a dict), timed in rounds (``time_rounds``)."""
    timed = time_rounds(fns, min_repeats, min_seconds, max_repeats, max_seconds)
    return {name: (first, float(np.median(times)), len(times))
            for name, (first, times) in timed.items()}


def time_rounds(fns, min_repeats=5, min_seconds=0.3, max_repeats=50, max_seconds=10.0,
                min_sample_seconds=0.0):
    """{name: (first call seconds, [seconds per call of each later round])} for the
    callables ``fns`` (a dict), timed in rounds: each round calls every one still short of
    its repeats once, so a machine that drifts (a shared VM) moves all of them alike and
    their ratios hold. After the first round, in ``fns``' order, each round takes them in
    an order of its own (shuffled, with a fixed seed): a call pays for what the call before
    it left in the caches (PyTorch's small backward leaves the next call about 100 us
    slower at 32^3 C16), and a fixed order, or a rotation of it, would make one of them
    always pay for the same other one.

    Repeats are adaptive, per callable: at least ``min_repeats`` and ``min_seconds`` of
    its own time, but a slow call (the big shapes: seconds each) stops after
    ``max_seconds`` of repeats, at least one. A call faster than ``min_sample_seconds``
    (timed three times after the first) is repeated in each round as many times as take that
    long, the sample its mean: a timer's resolution and one-off stalls then weigh less."""
    first, times, spent = {}, {name: [] for name in fns}, dict.fromkeys(fns, 0.0)
    batch = dict.fromkeys(fns, 1)
    for name, fn in fns.items():
        start = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - start
        if min_sample_seconds:  # sized by the slowest of three warm calls: never too long
            warm = []
            for _ in range(3):
                start = time.perf_counter()
                fn()
                warm.append(time.perf_counter() - start)
            slowest = max(max(warm), 1e-7)
            batch[name] = max(1, min(10_000, math.ceil(min_sample_seconds / slowest)))

    def wanted(name):
        n = len(times[name])
        if n >= max_repeats or (n and spent[name] >= max_seconds):
            return False
        return n < min_repeats or spent[name] < min_seconds

    order, shuffle = list(fns), random.Random(0).shuffle
    while any(wanted(name) for name in order):
        for name in order:
            if wanted(name):
                start = time.perf_counter()
                for _ in range(batch[name]):
                    fns[name]()
                elapsed = time.perf_counter() - start
                times[name].append(elapsed / batch[name])
                spent[name] += elapsed
        shuffle(order)
    return {name: (first[name], times[name]) for name in fns}


def time_call(fn, **limits):
    """(first call seconds, median seconds of the later calls, repeats) of ``fn`` alone
    (``time_calls``' limits)."""
    return time_calls({"": fn}, **limits)[""]


def copy_bandwidth(nbytes=1 << 27):
    """Bytes per second this machine copies (read + write), median of a few copies."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    _, median, _ = time_call(lambda: np.copyto(dst, src), min_repeats=5, min_seconds=0.1)
    return 2 * nbytes / median


def run(workloads, threads=None, peers=PEERS, progress=True, limits=None):
    """Time every workload's implementations (``time_rounds`` with ``limits``, by default
    ``LIMITS``); return the list of ``Result``."""
    threads = threads or volsample.get_num_threads()
    volsample.set_num_threads(threads)
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # affiners' pool, made by its first call
    if _have("torch"):
        import torch

        torch.set_num_threads(threads)
    if _have("volresample"):
        import volresample

        volresample.set_num_threads(threads)
    bandwidth = copy_bandwidth()
    results: list[Result] = []
    bar = ProgressBar(len(workloads), progress)
    for workload in workloads:
        impls = {name: fn for name, fn in workload.build().items()
                 if name == "volsample" or name in peers}
        timed = time_rounds(impls, **(limits or LIMITS))
        ours = timed.get("volsample")
        for name, (first, times) in timed.items():
            median = float(np.median(times))
            result = Result(workload.name, name, median, first, len(times),
                            workload.nbytes / median / bandwidth)
            if name != "volsample" and ours is not None:
                # paired by round (timed back to back), over the rounds both ran: a
                # machine that slows down mid-run moves both sides of each ratio alike
                rounds = min(len(times), len(ours[1]))
                ratios = np.divide(times[:rounds], ours[1][:rounds])
                low, result.ratio, high = (float(q) for q in np.percentile(ratios, [25, 50, 75]))
                result.rounds = rounds
                result.ratio_iqr = (low, high) if rounds >= MIN_SPREAD_ROUNDS else None
            results.append(result)
        bar.step(workload.name)
    bar.close()
    after = copy_bandwidth()
    if max(bandwidth, after) > NOISY_BANDWIDTH * min(bandwidth, after):
        for result in results:
            result.bandwidth_fraction_after = result.bandwidth_fraction * bandwidth / after
    return results


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------


def format_table(results) -> str:
    """Plain table: one row per workload, volsample's median and each peer's ratio."""
    by_workload: dict[str, dict[str, Result]] = {}
    for r in results:
        by_workload.setdefault(r.workload, {})[r.implementation] = r
    peers = [p for p in PEERS if any(p in row for row in by_workload.values())]
    header = ["workload", "volsample ms", "of copy bw", "first call ms"] + [f"vs {p} (IQR)"
                                                                           for p in peers]
    rows = []
    for name, row in by_workload.items():
        ours = row["volsample"]
        cells = [name, _figure(ours.median_s * 1e3), _bandwidth_cell(ours),
                 _figure(ours.first_call_s * 1e3)]
        cells += [_ratio_cell(row[p]) + " *" * _noisy(row[p]) if p in row else "-"
                  for p in peers]
        rows.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    notes = []
    if any(_noisy(r) for r in results):
        notes.append(f"*: noisy, the rounds' ratios spread more than {NOISY_SPREAD}x "
                     f"(interquartile range); rerun on a quiet machine")
    if any(r.bandwidth_fraction_after is not None for r in results):
        notes.append("of copy bw: noisy, the copy bandwidth moved by more than "
                     f"{NOISY_BANDWIDTH}x during the run (against the start's - the end's)")
    return "\n".join([line(header), line(["-" * w for w in widths])]
                     + [line(r) for r in rows] + notes)


def _noisy(result: Result) -> bool:
    return result.ratio_iqr is not None and \
        result.ratio_iqr[1] > NOISY_SPREAD * result.ratio_iqr[0]


def _bandwidth_cell(result: Result) -> str:
    if result.bandwidth_fraction_after is None:
        return f"{result.bandwidth_fraction:.0%}"
    return f"{result.bandwidth_fraction:.0%}-{result.bandwidth_fraction_after:.0%}"


# README's names of the peers, in the order of its columns
_PEER_TITLES = {"volsample-grid": "volsample's grid sampler",
                "volsample-warp": "volsample.torch.warp + F.mse_loss",
                "volsample-trilinear": "volsample trilinear",
                "volsample-numpy": "volsample's NumPy API",
                "volsample-patch": "F.grid_sample under patch()", "pytorch": "PyTorch",
                "scipy": "SciPy", "torch-interpol": "torch-interpol",
                "volresample": "volresample", "simpleitk": "SimpleITK", "jax": "JAX",
                "affiners": "affiners"}


def _duration(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{_figure(seconds * 1e3)} ms"


def recorded_line(meta: dict, results: list[Result]) -> str:
    """How a recorded run (``read_json``) was taken, as one sentence: the date, the command,
    the machine, the threads, every version, the load average."""
    m = meta["machine"]
    load = meta["load_average"]
    peers = [p for p in PEERS if any(r.implementation == p for r in results)]
    versions = ", ".join(f"{_PEER_TITLES[p]} {m['peers'][p]}" for p in peers
                         if not p.startswith("volsample-"))  # volsample's own: one version
    return (f"Recorded {meta['recorded'][:10]} by `{meta['command']}`: volsample "
            f"{m['volsample']} on {m['cpu']} ({m['logical_cpus']} logical CPUs, {m['isa']} "
            f"kernels), {m['threads']} threads for every implementation, Python {m['python']}, "
            f"NumPy {m['numpy']}, {versions}. Load average (1 min) {_load(load['before'])} "
            f"before the run and {_load(load['after'])} after.")


def _rows_by_workload(results) -> dict[str, dict[str, Result]]:
    by_workload: dict[str, dict[str, Result]] = {}
    for r in results:
        by_workload.setdefault(r.workload, {})[r.implementation] = r
    return by_workload


def markdown_report(meta: dict, results) -> str:
    """A recorded run (``read_json``) in one table: how it was taken, then one row per
    workload (volsample's median time, its fraction of copy bandwidth, its first call, and
    each peer's time over volsample's with the IQR over the rounds)."""
    peers = [p for p in PEERS if any(r.implementation == p for r in results)]
    lines = [
        recorded_line(meta, results),
        "",
        "| workload | volsample | of copy bandwidth | first call | "
        + " | ".join(f"vs {_PEER_TITLES[p]}" for p in peers) + " |",
        "|---|" + "---:|" * (3 + len(peers)),
    ]
    for name, row in _rows_by_workload(results).items():
        ours = row["volsample"]
        cells = [f"`{name}`", _duration(ours.median_s), f"{ours.bandwidth_fraction:.0%}",
                 _duration(ours.first_call_s)]
        cells += [_ratio_cell(row[p]) if p in row else "" for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


MAX_COLUMNS = 7  # a table of a family, readable at 1280 px


def markdown_families(results: list[Result], heading: str = "###") -> str:
    """A recorded run as one table per operator family (``FAMILIES``), each under a
    ``heading`` with what its rows time, each of at most ``MAX_COLUMNS`` columns: the
    workload, volsample's median time, each peer's time over volsample's (five peers at
    most per table: more go into a second table), then, while there is room, volsample's
    fraction of copy bandwidth and its first call."""
    by_workload = _rows_by_workload(results)
    notes = {key: note for key, _, note in FAMILIES}
    out = []
    for key, names in by_family(results).items():
        out += [f"{heading} {family_title(key)[0].upper()}{family_title(key)[1:]}", ""]
        if key in notes:
            out += [notes[key][0].upper() + notes[key][1:] + ".", ""]
        peers = [p for p in PEERS if any(p in by_workload[n] for n in names)]
        for first in range(0, max(len(peers), 1), MAX_COLUMNS - 2):
            chunk = peers[first:first + MAX_COLUMNS - 2]
            extras = [("of copy bandwidth", lambda r: f"{r.bandwidth_fraction:.0%}"),
                      ("first call", lambda r: _duration(r.first_call_s))]
            extras = extras[:MAX_COLUMNS - 2 - len(chunk)]
            out.append("| workload | volsample | " + " | ".join(
                [f"vs {_PEER_TITLES[p]}" for p in chunk] + [title for title, _ in extras])
                + " |")
            out.append("|---|" + "---:|" * (1 + len(chunk) + len(extras)))
            for name in names:
                row = by_workload[name]
                ours = row["volsample"]
                cells = [f"`{name}`", _duration(ours.median_s)]
                cells += [_ratio_cell(row[p]) if p in row else "" for p in chunk]
                cells += [cell(ours) for _, cell in extras]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
    return "\n".join(out).rstrip("\n")


def _load(value) -> str:
    return "unknown" if value is None else f"{value:.1f}"


def _ratio_cell(result: Result) -> str:
    """``7.02x (6.8-7.3)``: the median of the per-round ratios and their IQR; ``5.53x (1
    round)`` where too few rounds were paired for an IQR."""
    assert result.ratio is not None  # a peer's result
    if result.ratio_iqr is None:
        if result.rounds is not None and result.rounds < MIN_SPREAD_ROUNDS:
            return f"{_figure(result.ratio)}x ({result.rounds} round{'s' * (result.rounds > 1)})"
        return f"{_figure(result.ratio)}x"
    return f"{_figure(result.ratio)}x ({_spread(*result.ratio_iqr)})"


def _spread(low: float, high: float) -> str:
    """``6.8-7.3``: two significant digits, three where two would not tell them apart."""
    for digits in (2, 3):
        text = f"{_figure(low, digits)}-{_figure(high, digits)}"
        if _figure(low, digits) != _figure(high, digits):
            break
    return text


def short_ratio(ratio: float) -> str:
    """A ratio as the charts and summaries write it: ``5.8x``, ``17.2x``, ``130x``."""
    return f"{ratio:.1f}x" if ratio < 10 else f"{_figure(ratio)}x"


def _figure(x: float, digits: int = 3) -> str:
    """``digits`` significant digits, never in exponent form."""
    return f"{x:.{digits}g}" if x < 10 ** digits else f"{x:.0f}"


def cpu_model() -> str:
    """The CPU's marketing name where the OS tells it (Linux), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine_info(threads):
    from .. import _cpu

    return {"python": platform.python_version(), "machine": platform.machine(),
            "processor": platform.processor(), "cpu": cpu_model(),
            "logical_cpus": os.cpu_count(), "isa": _cpu.isa(), "threads": threads,
            "volsample": volsample.__version__, "numpy": np.__version__,
            "peers": peer_versions()}


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return None


def write_json(path, results, threads, started=None, load=(None, None), quick=False,
               command=""):
    """The results and how they were taken: the machine, the command, when, the 1-minute
    load average before and after (another program's work slows every implementation)."""
    started = started or datetime.datetime.now(datetime.timezone.utc)
    payload = {"recorded": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "command": command,
               "quick": quick, "load_average": {"before": load[0], "after": load[1]},
               "machine": machine_info(threads),
               "results": [dataclasses.asdict(r) for r in results]}
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")


def read_json(path) -> tuple[dict, list[Result]]:
    """A file ``write_json`` wrote: (everything but the results, the ``Result`` list)."""
    with open(path) as f:
        payload = json.load(f)
    results = [Result(**{**r, "ratio_iqr": tuple(r["ratio_iqr"]) if r.get("ratio_iqr")
                         else None}) for r in payload.pop("results")]
    ours = {r.workload: r for r in results if r.implementation == "volsample"}
    for r in results:  # files written before ``rounds`` was kept: the shorter side's repeats
        if r.ratio is not None and r.rounds is None and r.workload in ours:
            r.rounds = min(r.repeats, ours[r.workload].repeats)
        if r.rounds is not None and r.rounds < MIN_SPREAD_ROUNDS:
            r.ratio_iqr = None
    return payload, results


# Operator families, in report order: (key, title, what the family's rows time). A
# workload's family is its name's first word, the cubic modes a family of their own; a
# workload of a new kind is a family of its own name.
FAMILIES = (
    ("grid.fwd", "grid sampling, forward", "`grid_sample_3d`, trilinear"),
    ("grid.bwd", "grid sampling, backward", "`grid_sample_3d_backward`, trilinear: both gradients"),
    ("up.fwd", "upsampling, forward", "`upsample_trilinear_3d`"),
    ("up.bwd", "upsampling, backward", "`upsample_trilinear_3d_backward`"),
    ("warp", "warps",
     "`warp_3d` at an affine map, and a registration step through `volsample.torch` "
     "(`warp_mse_loss`: the warp, the MSE and the gradients for theta and u), against "
     "samplers fed the grid `affine_grid(theta) + u`"),
    ("cubic", "cubic sampling",
     "bicubic and B-spline `grid_sample_3d` and its backward; \"volsample trilinear\" is "
     "volsample's own trilinear sampling of the same grid (below 1: the cubic mode takes "
     "longer)"),
    ("small.fwd", "small calls, forward",
     "`volsample.torch.grid_sample`, beside volsample's NumPy API and `F.grid_sample` "
     "under `patch()` on the same tensors"),
    ("small.fwd+bwd", "small calls, forward and backward",
     "the forward, then `.sum().backward()`, through `volsample.torch`; the NumPy API's "
     "forward and backward beside it"),
)
_FAMILY_TITLES = {key: title for key, title, _ in FAMILIES}
CHART_WIDTH = 8.5  # inches: 850 px at 100 dpi, the width of the documentation's column
# Okabe and Ito's colour-blind-safe palette (yellow last: faint on white)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#000000",
           "#F0E442")


def family(workload: str) -> str:
    """The operator family of a workload's name (a key of ``FAMILIES``)."""
    if " bicubic " in workload or " bspline " in workload:
        return "cubic"
    first = workload.split()[0]
    return "warp" if first.startswith("warp.") else first


def family_title(key: str) -> str:
    return _FAMILY_TITLES.get(key, key)


def by_family(results: list[Result]) -> dict[str, list[str]]:
    """{family: its workloads in report order}, the families in ``FAMILIES``' order."""
    order = [key for key, _, _ in FAMILIES]
    grouped: dict[str, list[str]] = {}
    for r in results:
        names = grouped.setdefault(family(r.workload), [])
        if r.workload not in names:
            names.append(r.workload)
    return dict(sorted(grouped.items(),
                       key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))


def write_plot(path, results):
    """``plot`` written to ``path`` (a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plot(results)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _ratio_rows(ax, rows, xlabel):
    """One row per (title, colour, ratios): a bar from 1 to the median, a dot per workload,
    the median and the count written beside; log axis."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    everything = [x for _, _, ratios in rows for x in ratios]
    low, high = min(everything + [1.0]), max(everything + [1.0])
    for k, (_, colour, ratios) in enumerate(rows):
        ratios = np.sort(np.asarray(ratios, dtype=float))
        median = float(np.median(ratios))
        ax.barh(k, median - 1, 0.7, left=1, color=colour, alpha=0.3, edgecolor=colour)
        spread = np.resize([0.0, -0.2, 0.2], len(ratios))  # neighbours apart
        ax.scatter(ratios, k + spread, s=42, color=colour, edgecolor="black", linewidth=0.6,
                   zorder=3)
        ax.text(max(ratios.max(), median) * 1.15, k,
                f"median {short_ratio(median)} ({len(ratios)} workload"
                f"{'s' * (len(ratios) > 1)})", va="center", fontsize=11)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    # room right of the highest dot for its row's label: about 40% of the axis' width
    left, label = np.log10(min(low, 1.0) / 1.6), np.log10(high * 1.15)
    right = (label - 0.4 * left) / 0.6
    ax.set_xlim(10 ** left, 10 ** right)
    decades = right - left
    subs = (1.0, 2.0, 5.0) if decades < 3.5 else (1.0, 3.0) if decades < 4.5 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks(range(len(rows)), [title for title, _, _ in rows], fontsize=12)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top
    ax.tick_params(axis="x", labelsize=11)
    ax.set_xlabel(xlabel, fontsize=12)
    ax.grid(axis="x", color="0.88", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _against_pytorch_rows(results):
    rated = [r for r in results if r.implementation == "pytorch" and r.ratio is not None]
    rows = []
    for k, (key, names) in enumerate(by_family(rated).items()):
        ratios = [r.ratio for r in rated if r.workload in names]
        rows.append((family_title(key), PALETTE[k % len(PALETTE)], ratios))
    return rows


# the libraries beside PyTorch, in the second chart (volsample's own variants are in the
# tables, not charted)
_OTHER_LIBRARIES = ("scipy", "volresample", "simpleitk", "torch-interpol", "affiners", "jax")


def _against_others_rows(results):
    rows = []
    for k, peer in enumerate(p for p in _OTHER_LIBRARIES
                             if any(r.implementation == p for r in results)):
        ratios = [r.ratio for r in results if r.implementation == peer and r.ratio is not None]
        rows.append((_PEER_TITLES[peer], PALETTE[k % len(PALETTE)], ratios))
    return rows


def plot_against_pytorch(results: list[Result], ax=None):
    """The speed-up against PyTorch per operator family (``FAMILIES``): PyTorch's time over
    volsample's, one dot per workload, a bar to the family's median, on a log axis. The
    matplotlib figure."""
    import matplotlib.pyplot as plt

    rows = _against_pytorch_rows(results)
    if ax is None:
        _, ax = plt.subplots(figsize=(CHART_WIDTH, 0.55 * len(rows) + 1.3), layout="constrained")
    _ratio_rows(ax, rows, "PyTorch's time / volsample's (above 1: volsample is faster)")
    return ax.figure


def plot_against_others(results: list[Result], ax=None):
    """The speed-up against each library other than PyTorch (SciPy, volresample, SimpleITK,
    torch-interpol, affiners, JAX: those in ``results``), drawn as ``plot_against_pytorch``."""
    import matplotlib.pyplot as plt

    rows = _against_others_rows(results)
    if ax is None:
        _, ax = plt.subplots(figsize=(CHART_WIDTH, 0.55 * len(rows) + 1.3), layout="constrained")
    _ratio_rows(ax, rows, "the library's time / volsample's (above 1: volsample is faster)")
    return ax.figure


def plot(results):
    """The speed-ups of a run: against PyTorch per operator family, then against each
    other library, on log axes (``plot_against_pytorch``, ``plot_against_others``; a chart
    with no rows is left out). The matplotlib figure."""
    import matplotlib.pyplot as plt

    charts = [(draw, rows) for draw, rows in ((plot_against_pytorch, _against_pytorch_rows(results)),
                                              (plot_against_others, _against_others_rows(results)))
              if rows]
    heights = [0.55 * len(rows) + 1.3 for _, rows in charts] or [1.0]
    fig, axes = plt.subplots(len(heights), 1, figsize=(CHART_WIDTH, sum(heights)),
                             height_ratios=heights, layout="constrained", squeeze=False)
    for (draw, _), ax in zip(charts, axes[:, 0]):
        draw(results, ax)
    return fig


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny workloads only (seconds)")
    parser.add_argument("--filter", metavar="PATTERN",
                        help="only workloads whose name matches this glob or contains it")
    parser.add_argument("--threads", type=int, help="threads for every implementation "
                        "(default: volsample's current count)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="write a bar chart of the ratios")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (shown by default when stderr is a terminal)")
    parser.add_argument("--register", action="store_true",
                        help="the registration benchmark instead: volsample register against "
                             "ANTsPy SyN on the MNI152 template under a known map (needs "
                             "nilearn and nibabel; minutes)")
    parser.add_argument("--register-scale", type=int, choices=(1, 2), default=1, metavar="MM",
                        help="with --register: the fixed template's voxel size, 1 mm (default) "
                             "or 2 mm (a quick run)")
    parser.add_argument("--repeats", type=int, default=1, metavar="N",
                        help="with --register: rounds of runs (medians reported)")


def select(workloads, quick=False, pattern=None):
    chosen = [w for w in workloads if w.quick] if quick else [w for w in workloads if not w.quick]
    if pattern:
        chosen = [w for w in chosen if pattern in w.name or fnmatch.fnmatch(w.name, pattern)]
    return chosen


def run_bench(args: argparse.Namespace) -> int:
    if args.register:
        threads = args.threads or volsample.get_num_threads()
        return bench_register.main(args.register_scale, threads, args.repeats, args.json)
    workloads = select(suite(), args.quick, args.filter)
    if not workloads:
        print(f"volsample bench: error: --filter: no workload{' of --quick' if args.quick else ''} "
              f"matches {args.filter!r}", file=sys.stderr)
        return 2
    threads = args.threads or volsample.get_num_threads()
    started, load = datetime.datetime.now(datetime.timezone.utc), _load_average()
    results = run(workloads, threads, progress=not args.no_progress and sys.stderr.isatty(),
                  limits=QUICK_LIMITS if args.quick else LIMITS)
    print(f"volsample {volsample.__version__}, {threads} threads, {cpu_model()}; times are "
          f"medians of repeats, warm-up excluded; ratios are peer time / volsample time "
          f"(above 1: volsample is faster), each round timing all implementations back to "
          f"back: the median over the rounds, in brackets the interquartile range")
    if args.quick:
        print("--quick: tiny volumes, whose time is mostly each call's fixed cost (argument "
              "checks, dispatch, thread start-up), not the kernels': the full suite measures "
              "those")
    print("peers: " + ", ".join(f"{peer} {version or '(not installed)'}"
                                for peer, version in peer_versions().items()))
    print(format_table(results))
    if args.json:
        command = " ".join(["volsample bench", *(["--quick"] if args.quick else []),
                            *(["--filter", repr(args.filter)] if args.filter else []),
                            f"--threads {threads} --json {args.json}"])
        write_json(args.json, results, threads, started, (load, _load_average()), args.quick,
                   command)
    if args.plot:
        write_plot(args.plot, results)
    return 0
