"""The peers ``volsample bench`` measures volsample against: their names, which are
installed and at which version, and the adapters that call the ones whose interface differs
(affiners' affine warp, SimpleITK's resampling through a displacement field)."""
from __future__ import annotations

import sys

import numpy as np

PEERS = ("volsample-grid", "volsample-warp", "volsample-trilinear", "pytorch", "scipy",
         "torch-interpol", "volresample", "simpleitk", "jax", "jax-gather", "affiners",
         "volsample-numpy", "volsample-patch", "volsample-vmap")


# volsample-grid: volsample's own grid sampler on a formed grid (the warp workloads' baseline);
# volsample-warp: the registration step as volsample.torch.warp then F.mse_loss;
# volsample-trilinear: volsample's trilinear sampling of the same grid (the cubic workloads');
# volsample-numpy, volsample-patch: the NumPy API and F.grid_sample under
# volsample.torch.patch(), beside volsample.torch (the small-size family) or volsample.jax;
# volsample-vmap: jax.vmap of volsample.jax over a batch, beside one call with the batch as N;
# jax-gather: a trilinear gather in jax.numpy (bench_jax)
# the other packages' modules (volsample's own variants are volsample's version, not peers)
_PEER_MODULES = {"pytorch": "torch", "scipy": "scipy", "torch-interpol": "interpol",
                 "volresample": "volresample", "simpleitk": "SimpleITK", "jax": "jax",
                 "jax-gather": "jax", "affiners": "affiners"}


def have(module):
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
        if not have(module):
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


def affiners_warp(x, theta):
    """A callable warping every (n, c) volume of ``x`` by theta with affiners."""
    import affiners

    maps = [affiners_map(t, x.shape[2:]) for t in theta.astype(np.float64)]
    return lambda: [affiners.affine_transform(x[n, c], *maps[n], 0.0, 1)
                    for n in range(x.shape[0]) for c in range(x.shape[1])]


def simpleitk_warp(x, grid, in_spatial, threads):
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
