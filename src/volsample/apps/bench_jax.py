"""The JAX family of ``volsample bench``: ``volsample.jax.grid_sample`` inside ``jax.jit``
against what JAX users write without it, forward and forward + ``jax.grad``.

Peers, each inside ``jax.jit`` on the same arrays: ``jax.scipy.ndimage.map_coordinates``
(order 1, one channel at a time, as its users call it: a ``vmap`` over the channels, voxel
coordinates (z, y, x)) and a trilinear gather written in ``jax.numpy`` ("jax-gather": the
eight corners' indices and weights, zeros outside). The gradient workloads differentiate a
sum of the samples with respect to the volume and the grid (``map_coordinates``: the
coordinates). Beside them, the NumPy API on the same memory ("volsample-numpy": the door's
fixed cost is volsample's time less this one at 8^3) and ``jax.vmap`` of the call over a
batch of 8 (volumes and grids, volumes alone, grids alone) against one call with N = 8
("volsample-vmap").
"""
from __future__ import annotations

import numpy as np

from .bench_peers import have
from .bench_timing import Workload

SIZES = (("8^3", (8, 8, 8), 1, True), ("32^3", (32, 32, 32), 1, False),
         ("oasis 160x192x224", (160, 192, 224), 3, False))


def _trilinear_gather(jnp, x, grid):
    """Trilinear sampling (align_corners=True, zeros outside) in jax.numpy: x (C, D, H, W),
    grid (D', H', W', 3) in normalised (x, y, z) coordinates."""
    C, D, H, W = x.shape
    coords = [(grid[..., k] + 1) / 2 * (n - 1) for k, n in ((2, D), (1, H), (0, W))]
    lows = [jnp.floor(c) for c in coords]
    fracs = [c - lo for c, lo in zip(coords, lows)]
    out = 0.0
    for corner in range(8):
        index, weight, inside = [], 1.0, True
        for axis, n in enumerate((D, H, W)):
            up = (corner >> (2 - axis)) & 1
            i = lows[axis].astype(jnp.int32) + up
            weight = weight * (fracs[axis] if up else 1 - fracs[axis])
            inside = inside & (i >= 0) & (i < n)
            index.append(jnp.clip(i, 0, n - 1))
        out = out + x[:, index[0], index[1], index[2]] * jnp.where(inside, weight, 0.0)
    return out


def _workload(label, spatial, C, gradient, quick, smooth_grid):
    name = f"jax.{'fwd+grad' if gradient else 'fwd'} {label} N1 C{C}"
    points = int(np.prod(spatial))
    nbytes = C * points * 4 * 2 + points * 12
    if gradient:
        nbytes *= 2

    def build():
        import jax
        import jax.numpy as jnp
        from jax.scipy import ndimage

        import volsample
        import volsample.jax as vj

        rng = np.random.default_rng(1)
        x = rng.standard_normal((1, C) + spatial).astype(np.float32)
        grid = smooth_grid(1, *spatial)
        jx, jgrid = jnp.asarray(x), jnp.asarray(grid)

        def ours(a, g):
            return vj.grid_sample(a, g, align_corners=True)

        def map_coordinates(a, g):
            coords = [(g[0, ..., k] + 1) / 2 * (n - 1) for k, n in zip((2, 1, 0), spatial)]
            return jax.vmap(lambda v: ndimage.map_coordinates(v, coords, order=1,
                                                              mode="constant"))(a[0])

        def gather(a, g):
            return _trilinear_gather(jnp, a[0], g[0])

        samplers = {"volsample": ours, "jax": map_coordinates, "jax-gather": gather}
        if gradient:
            compiled = {k: jax.jit(jax.grad(lambda a, g, f=f: jnp.sum(f(a, g)), argnums=(0, 1)))
                        for k, f in samplers.items()}
        else:
            compiled = {k: jax.jit(f) for k, f in samplers.items()}
        impls = {k: (lambda f=f: jax.block_until_ready(f(jx, jgrid)))
                 for k, f in compiled.items()}
        ones = np.ones((1, C) + spatial, np.float32)
        if gradient:
            def numpy_step():
                volsample.grid_sample_3d(x, grid, align_corners=True)
                volsample.grid_sample_3d_backward(ones, x, grid, align_corners=True)
            impls["volsample-numpy"] = numpy_step
        else:
            impls["volsample-numpy"] = lambda: volsample.grid_sample_3d(x, grid,
                                                                        align_corners=True)
        return impls

    return Workload(name, build, nbytes, quick)


def _vmap_workload(label, spatial, C, quick, smooth_grid, maps="volumes and grids"):
    """``jax.vmap`` of the call over 8 volumes and grids, or over 8 volumes with one grid,
    or 8 grids on one volume ("volsample-vmap"), against one call with N = 8 (the shared
    operand repeated; "volsample")."""
    B = 8
    points = B * int(np.prod(spatial))

    def build():
        import jax
        import jax.numpy as jnp

        import volsample.jax as vj

        x = jnp.asarray(np.random.default_rng(2).standard_normal((B, C) + spatial), jnp.float32)
        grid = jnp.asarray(smooth_grid(B, *spatial))
        in_axes = {"volumes and grids": (0, 0), "volumes": (0, None), "grids": (None, 0)}[maps]
        # the operand the batch does not map: its first member, repeated for the one call
        x, grid = (a if axis == 0 else jnp.repeat(a[:1], B, 0) for a, axis in zip((x, grid), in_axes))
        shared = [a if axis == 0 else a[0] for a, axis in zip((x, grid), in_axes)]
        one = jax.jit(lambda a, g: vj.grid_sample(a, g, align_corners=True))
        mapped = jax.jit(jax.vmap(lambda a, g: vj.grid_sample(a[None], g[None],
                                                              align_corners=True)[0],
                                  in_axes=in_axes))
        return {"volsample": lambda: one(x, grid).block_until_ready(),
                "volsample-vmap": lambda: mapped(*shared).block_until_ready()}

    name = "vmap8" if maps == "volumes and grids" else f"vmap8 {maps}"
    return Workload(f"jax.fwd {name} {label} C{C}", build, C * points * 8 + points * 12, quick)


def workloads(smooth_grid, shrink: int = 1) -> list[Workload]:
    """The JAX family (none where volsample.jax cannot be imported: no JAX, or a build
    without its handlers), sampling grids made by ``smooth_grid(N, D, H, W)`` (the suite's);
    ``shrink`` divides the spatial sizes, as ``suite``'s."""
    if not have("jax"):
        return []
    try:
        import volsample.jax  # noqa: F401
    except ImportError:
        return []
    w = []
    for label, spatial, C, quick in SIZES:
        spatial = tuple(max(2, n // shrink) for n in spatial)
        for gradient in (False, True):
            w.append(_workload(label, spatial, C, gradient, quick, smooth_grid))
    spatial = (max(2, 32 // shrink),) * 3
    for maps in ("volumes", "grids"):  # (before the last vmap8 row, which docs/jax.md quotes)
        w.append(_vmap_workload("32^3", spatial, 1, False, smooth_grid, maps))
    for label, size, quick in (("8^3", 8, True), ("32^3", 32, False)):
        spatial = (max(2, size // shrink),) * 3
        w.append(_vmap_workload(label, spatial, 1, quick, smooth_grid))
    return w
