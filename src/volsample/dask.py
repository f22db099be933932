"""Out-of-core warping of dask-array volumes: ``warp`` (optional extra ``dask``).

A volume larger than memory (light-sheet microscopy, whole-body CT) is warped output chunk
by output chunk; each chunk reads only the region of the volume its sample points can
touch (its halo). The displacement convention is ``volsample.registration``'s: voxels of
the volume, channels (x, y, z), ``out(p) = volume(p + displacement(p))``.

Why the result is bitwise equal to the in-memory call: grid sampling turns normalised
coordinates into voxel coordinates with the volume's size, so sampling a cut-out sub-volume
with re-normalised coordinates would round differently. Instead each chunk samples a
zero-filled array of the full volume's shape into which only its halo is copied. That
array is an anonymous memory map: the operating system allocates the pages that are
written (the halo, rounded up to whole 4 KiB pages along each of its rows) and none of the
rest, so a chunk costs address space for the full volume but memory only for about its
halo (more when the halo's rows are much shorter than a page: chunk W generously), and
``grid_sample_3d`` sees exactly the arguments of the in-memory call.
"""
from __future__ import annotations

import dataclasses
import math
import mmap
import sys
from collections.abc import Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np
import numpy.typing as npt

from . import _backends, _calls, _checks, _coords, _dtypes, _layout
from ._errors import InvalidArgumentError
from ._tables import BORDER, MODES, PADDINGS, REFLECTION

_backend = _backends.cpu("grid_sample")

# Linux's MAP_NORESERVE (Python < 3.13 does not name it): a mapping larger than memory
# plus swap is then not refused up front by the kernel's overcommit heuristic.
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


def sampling_grid(displacement: np.ndarray, volume_shape: Sequence[int],
                  align_corners: bool = True, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
    """The normalised grid that ``warp`` samples at, for a NumPy displacement.

    ``identity + displacement * scale`` computed in ``dtype``, where, per channel (x, y, z)
    and axis of size S of ``volume_shape`` (D, H, W): with align_corners=True the identity
    is ``np.linspace(-1, 1, n)`` over the n output voxels and ``scale = 2 / (S - 1)``
    (``registration.identity_grid`` and ``registration.voxel_to_normalised``); with
    align_corners=False the identity is the voxel centres ``(2 i + 1) / n - 1`` and
    ``scale = 2 / S``.
    """
    displacement = np.asarray(displacement)
    return _grid_block(displacement, (0, 0, 0), displacement.shape[1:4], tuple(volume_shape),
                       align_corners, np.dtype(dtype))


def warp(volume: da.Array | np.ndarray, displacement: da.Array | np.ndarray,
         mode: str = "bilinear", padding_mode: str = "border", align_corners: bool = True,
         *, chunks: Any = None) -> da.Array:
    """Warp a dask-array volume by a displacement field, chunk by chunk.

    Parameters
    ----------
    volume : dask array (or NumPy array), shape (N, C, D, H, W)
        float16, bfloat16, float32 or float64, NCDHW.
    displacement : dask array or NumPy array, shape (N, Do, Ho, Wo, 3)
        In voxels of ``volume``, channels (x, y, z) (along W, H, D); float.
    mode, padding_mode, align_corners
        As for ``volsample.grid_sample_3d``. Border padding (the default) is
        ``registration.warp``'s.
    chunks : tuple of 3 chunk specs, optional
        Output chunks along (Do, Ho, Wo); default the displacement's spatial chunks (a dask
        field) or the volume's chunk sizes. N and C follow the volume's chunks.

    Returns
    -------
    dask array, shape (N, C, Do, Ho, Wo), dtype of ``volume``.
        Bitwise equal to ``grid_sample_3d(volume, sampling_grid(displacement, (D, H, W),
        align_corners, dtype), mode, padding_mode, align_corners)`` on the whole arrays,
        where ``dtype`` is the compute dtype (the volume's; float32 for a 16-bit volume,
        float64 beside a float64 field), for any chunking.

    Notes
    -----
    The field is read twice: once, now, for the range of each chunk's sample coordinates
    (which decides the halos and so the task graph), and again when the result is computed;
    persist an expensive field first. A chunk reads the voxels from the floor of its
    smallest coordinate to one past the floor of its largest (the cubic modes: one more
    voxel each way), per axis, plus one voxel of margin for rounding, clipped to the
    volume: zeros padding reads nothing outside, border padding clamps into range, and
    reflection padding reads the whole axis when the range leaves the volume (a reflected
    point may land anywhere on it).
    """
    mode, padding = MODES.code(mode), PADDINGS.code(padding_mode)
    volume = da.asarray(volume)
    field = displacement if isinstance(displacement, da.Array) else np.asarray(displacement)
    # The arrays as a warp takes them (the volume first); the op layer checks the rest.
    for name, array in (("volume", volume), ("displacement", field)):
        _checks.volume_dtype(name, array.dtype)
        _checks.rank(name, array.shape, 5)
    if field.shape[-1] != 3 or field.shape[0] != volume.shape[0]:
        raise InvalidArgumentError(
            f"displacement: expected shape ({volume.shape[0]}, Do, Ho, Wo, 3) (N of volume, "
            f"channels x, y, z), got {field.shape}")
    dtype = _dtypes.compute_dtype(volume.dtype, field.dtype)
    # The call every chunk makes, checked once: the chunks' grids are in the compute dtype.
    call = _calls.grid_sample(_calls.operand("volume", volume),
                              _calls.Operand("displacement", field.shape, dtype), mode, padding,
                              align_corners)
    out_shape, in_shape = tuple(field.shape[1:4]), tuple(volume.shape[2:])
    if chunks is None:
        chunks = field.chunks[1:4] if isinstance(field, da.Array) else volume.chunksize[2:]
    spatial_chunks = da.core.normalize_chunks(chunks, out_shape, dtype=dtype)
    field = da.asarray(field).rechunk((volume.chunks[0],) + spatial_chunks + (3,))

    ranges = field.map_blocks(_coordinate_range, dtype=np.float64, chunks=(
        (1,) * field.numblocks[0], *(((1,) * n) for n in field.numblocks[1:4]), (6,)),
        out_shape=out_shape, in_shape=in_shape, align_corners=align_corners, grid_dtype=dtype,
        block_origins=_origins(field.chunks))
    ranges = ranges.compute()

    n_edges, c_edges = (np.cumsum((0,) + c) for c in volume.chunks[:2])
    spatial_edges = [np.cumsum((0,) + c) for c in spatial_chunks]
    blocks = np.empty((len(n_edges) - 1, len(c_edges) - 1) + field.numblocks[1:4], object)
    for index in np.ndindex(blocks.shape):
        b, c, z, y, x = index
        origin = tuple(int(spatial_edges[a][i]) for a, i in enumerate((z, y, x)))
        size = tuple(int(spatial_edges[a][i + 1]) - o
                     for a, (i, o) in enumerate(zip((z, y, x), origin)))
        halo = _halo(ranges[b, z, y, x], padding, in_shape, MODES.of(mode).taps)
        batch, channels = slice(n_edges[b], n_edges[b + 1]), slice(c_edges[c], c_edges[c + 1])
        task = dask.delayed(_warp_block)(
            volume[(batch, channels) + halo], field.blocks[b, z, y, x, 0], origin, halo,
            out_shape, in_shape, call)
        blocks[index] = da.from_delayed(
            task, (batch.stop - batch.start, channels.stop - channels.start) + size, volume.dtype)
    return da.block(blocks.tolist())


def _origins(chunks):
    """Per axis, the first index of every block (map_blocks' ``block_info`` without dicts)."""
    return [np.cumsum((0,) + c)[:-1].tolist() for c in chunks]


def _grid_block(displacement, origin, out_shape, in_shape, align_corners, dtype):
    """``sampling_grid`` of the output block starting at ``origin`` (D, H, W), given the
    displacement there: the identity's values are those of the whole grid, sliced."""
    axes = []
    for start, n_block, n in zip(origin, displacement.shape[1:4], out_shape):
        if align_corners:
            identity = np.linspace(-1, 1, n, dtype=dtype)
        else:
            identity = ((2 * np.arange(n, dtype=dtype) + 1) / dtype.type(n) - 1).astype(dtype)
        axes.append(identity[start:start + n_block])
    z, y, x = np.meshgrid(*axes, indexing="ij")
    D, H, W = in_shape
    if align_corners:
        scale = np.array([2 / (W - 1), 2 / (H - 1), 2 / (D - 1)], dtype)
    else:
        scale = np.array([2 / W, 2 / H, 2 / D], dtype)
    return np.stack([x, y, z], axis=-1)[None] + displacement.astype(dtype) * scale


def _voxel(grid, in_shape, align_corners):
    """Voxel coordinates (x, y, z) of a normalised grid, in float64 (for the halos only)."""
    size = np.array(in_shape[::-1], np.float64)
    return _coords.unnormalize(np, grid.astype(np.float64), size, align_corners)[0]


def _coordinate_range(field_block, out_shape, in_shape, align_corners, grid_dtype,
                      block_origins, block_id=None):
    """(min x, min y, min z, max x, max y, max z) of a block's finite voxel coordinates
    (inf, -inf where none is finite), shaped as one element of the range array."""
    b, z, y, x = block_id[:4]
    origin = (block_origins[1][z], block_origins[2][y], block_origins[3][x])
    grid = _grid_block(field_block, origin, out_shape, in_shape, align_corners, grid_dtype)
    voxel = _voxel(grid, in_shape, align_corners).reshape(-1, 3)
    finite = np.where(np.isfinite(voxel), voxel, np.nan)
    low = _nan_extreme(finite, np.nanmin, np.inf)
    high = _nan_extreme(finite, np.nanmax, -np.inf)
    return np.concatenate([low, high]).reshape(1, 1, 1, 1, 6)


def _nan_extreme(values, reduce, empty):
    """``reduce`` over rows ignoring NaN, ``empty`` in columns with nothing finite."""
    all_nan = np.isnan(values).all(0)
    out = np.full(values.shape[1], empty)
    if not all_nan.all():
        with np.errstate(all="ignore"):
            out[~all_nan] = reduce(values[:, ~all_nan], axis=0)
    return out


def _halo(extremes, padding, in_shape, taps=2):
    """Slices (D, H, W) of the voxels a block reads, from its coordinate ``extremes``: a
    point reads floor(x) - (taps // 2 - 1) .. floor(x) + taps // 2 per axis (bilinear's 2
    taps from floor(x), the cubic modes' 4 from floor(x) - 1), widened by one voxel each
    way for rounding."""
    reach = max(taps // 2 - 1, 0)  # taps below floor(x)
    halo = []
    for axis, size in enumerate(in_shape):  # D, H, W: channels z, y, x
        low, high = extremes[2 - axis], extremes[5 - axis]
        if low > high:  # no finite coordinate: nothing is read
            halo.append(slice(0, 0))
            continue
        if padding == BORDER:  # points outside read the clamped coordinate
            low, high = min(max(low, 0.0), size - 1.0), min(max(high, 0.0), size - 1.0)
        first = math.floor(max(low, -2.0 - reach)) - 1 - reach
        last = math.floor(min(high, size + 1.0 + reach)) + 2 + reach
        if padding == REFLECTION and (first < 0 or last > size - 1):
            first, last = 0, size - 1
        first, last = max(first, 0), min(last, size - 1)
        halo.append(slice(first, last + 1) if first <= last else slice(0, 0))
    return tuple(halo)


def _warp_block(region, field_block, origin, halo, out_shape, in_shape, call):
    """One output block, sampled from ``region`` (the volume's voxels in ``halo``) by the
    C++ backend, with ``call`` (the whole warp's description) cut to this block."""
    grid = _grid_block(field_block, origin, out_shape, in_shape, call.align_corners,
                       call.compute_dtype)
    full = _full_view(region, in_shape, halo, call.compute_dtype)
    block = dataclasses.replace(call, input_shape=full.shape, grid_shape=grid.shape,
                                dtype=full.dtype, grid_dtype=grid.dtype)
    out = _layout.empty(block.output_shape, block.dtype, block.layout, name="output chunk")
    _backend.forward(block, full, grid, out)
    return out.astype(region.dtype, copy=False)


def _full_view(region, in_shape, halo, dtype):
    """An array of the full volume's spatial shape holding ``region`` at ``halo``; what
    lies outside is never read."""
    shape = region.shape[:2] + tuple(in_shape)
    full = _new_buffer(math.prod(shape), dtype).reshape(shape)
    full[(slice(None), slice(None)) + tuple(halo)] = region
    return full


def _new_buffer(size, dtype):
    """A flat zero-filled buffer whose memory is allocated only where it is written: an
    anonymous private map (zero pages on demand), or ``np.zeros`` where mmap takes no flags."""
    if not hasattr(mmap, "MAP_ANONYMOUS") or size == 0:
        return np.zeros(size, dtype)
    pages = mmap.mmap(-1, size * dtype.itemsize,
                      flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    return np.frombuffer(pages, dtype, size)
