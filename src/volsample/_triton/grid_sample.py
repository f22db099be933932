"""Triton kernels for 3-D grid sampling (SPEC §2), forward and backward, and their
launchers, for grid sampling and warps alike.

The kernels take their coordinate maths from ``grid_coords`` (the C++ core's coords.h)
and their taps from ``grid_taps`` (grid_taps.h): one point's corners for the modes of 1
and 2 taps per axis, the 4 x 4 x 4 footprint for those of 4. Where a call's points sample
comes from its coordinate source (``Coordinates``): a grid, or a warp's theta and
displacement.

The launchers take the backends' contract: a checked description and tensors (volumes
logical (N, C, D, H, W), any strides), results allocated by the caller and written whole
(a result whose points do not lie at one stride is computed into a dense copy and copied
in), and ``workspace_nbytes``, the scratch a backward allocates.

Backward, ``deterministic=False``: one pass over the points computes grad_grid and
scatters grad_output * weight into grad_input with atomic adds (into a float32 buffer for
16-bit data, rounded once at the end). Fast, but the order of the adds varies.

Backward, ``deterministic=True``: the scatter becomes a gather. Each point's key is the
cell it falls in: for bilinear, the unit cube whose low corner is (floor(iz), floor(iy),
floor(ix)), for nearest the voxel itself; points that touch nothing get a key past the
last cell. A stable sort by key lists every cell's points in increasing point order, and
a binary search gives each cell's range. Then one program per block of input voxels sums,
for each voxel, the points of the 8 cells around it (1 for nearest), cell by cell in a
fixed order and in point order within a cell. Every grad_input element is written once,
by one program, from terms in a fixed order: no atomics, the same bits on every run, and
no zero-filling or rounding pass either.

The cubic modes key a point by its window: along each axis its padded taps lie within
four consecutive voxels (taps of consecutive whole numbers, clamped or folded, move by at
most one voxel each), the lowest of which the taps read gives the window's low corner.
The keys pass stores per point and axis the summed weights of its taps on each of those
four voxels (padding can fold several taps onto one), and each voxel gathers the 4 x 4 x 4
windows that contain it, window by window, in point order within a window. (Under
reflection, a coordinate beyond 2**24 voxels in float32 (2**53 in float64), whose taps
round to whole numbers 2 apart, can spread its B-spline taps over five voxels: the
deterministic gather then drops the fifth voxel's term, which the atomic scatter keeps.) grad_grid is per point in both modes, summed
over channels in a fixed order.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from .._tables import MODES, NEAREST
from . import (LAUNCH, block_of_points, compute_dtype, index_dtype,
               is_channels_last, new_volume, on_device_of, programs,
               split_spatial, tile, tl_dtype, writable_volume, written)
from .grid_coords import Coordinates, grid_coordinates, grid_point, or_unused, point_coordinates
from .grid_taps import (axis_tap, cell_id, corner, corner_weight_grad, cubic_footprint,
                        rows_of_item, store_theta_terms, tap_backward, tap_value, tap_window,
                        within, positions)


@triton.jit
def _forward_kernel(inp, field, theta, table, out, C, D, H, W, S, Do, Ho, Wo,
                    siN, siC, siD, siH, siW, sfN, sfD, sfH, sfW, sfK, soN, soC, soQ,
                    MODE: tl.constexpr, TAPS: tl.constexpr, PADDING: tl.constexpr,
                    ALIGN: tl.constexpr,
                    AFFINE: tl.constexpr, FIELD: tl.constexpr, SCALED: tl.constexpr,
                    COMPUTE: tl.constexpr, INDEX: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[n, c, q] = sum over corners (taps) of weight * input; one program per BLOCK_P
    points."""
    n, q, pmask = block_of_points(tl.program_id(0), S, BLOCK_P, INDEX)
    cx, cy, cz, _ = point_coordinates(field, theta, table, n, q, pmask, Do, Ho, Wo, sfN, sfD,
                                       sfH, sfW, sfK, COMPUTE, AFFINE, FIELD, SCALED)
    if TAPS == 4:
        fp, _, _, _, _ = cubic_footprint(cx, cy, cz, pmask, D, H, W, MODE, PADDING, ALIGN,
                                          INDEX)
    else:
        ix, iy, iz, _, _, _, valid = grid_point(cx, cy, cz, pmask, D, H, W, PADDING, ALIGN)
    for c0 in range(0, C, BLOCK_C):
        c = (c0 + tl.arange(0, BLOCK_C)).to(INDEX)
        cmask = c < C
        if TAPS == 4:
            acc = tap_value(inp + n * siN, fp, c, cmask, siC, siD, siH, siW, COMPUTE)
        else:
            acc = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
            for k in tl.static_range(TAPS * TAPS * TAPS):
                x, y, z, inside, weight = corner(k, ix, iy, iz, valid, D, H, W, TAPS, INDEX)
                offset = n * siN + z * siD + y * siH + x * siW
                v = tl.load(inp + offset[:, None] + c[None, :] * siC,
                            mask=inside[:, None] & cmask[None, :], other=0.0)
                acc += v.to(COMPUTE) * weight[:, None]
        tl.store(out + n * soN + q[:, None] * soQ + c[None, :] * soC,
                 acc.to(out.dtype.element_ty), mask=pmask[:, None] & cmask[None, :])


@triton.jit
def _backward_points_kernel(
        gout, inp, field, theta, table, grad_field, grad_theta, gin, keys, coords, go_offsets,
        C, D, H, W, S, Do, Ho, Wo, NO_CELL,
        sgoN, sgoC, sgoD, sgoH, sgoW, siN, siC, siD, siH, siW, sfN, sfD, sfH, sfW, sfK,
        giN, giC, giD, giH, giW,
        MODE: tl.constexpr, TAPS: tl.constexpr, PADDING: tl.constexpr,
        ALIGN: tl.constexpr,
        AFFINE: tl.constexpr, FIELD: tl.constexpr, SCALED: tl.constexpr,
        FIELD_GRAD: tl.constexpr, THETA_GRAD: tl.constexpr, SCATTER: tl.constexpr,
        KEYS: tl.constexpr, COMPUTE: tl.constexpr, INDEX: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Per-point backward work, one program per BLOCK_P points, whose grid gradient (the
    derivative in the sample coordinates; bilinear only, nearest's is 0) goes to the
    coordinate source's sinks: FIELD_GRAD stores it into ``grad_field`` (a grid's gradient,
    or a displacement's, times the scales where SCALED); THETA_GRAD stores this program's
    sums of it times (bx, by, bz, 1) into its 12 entries of ``grad_theta``, in a fixed
    order. SCATTER: atomic adds of grad_output * weight into ``gin``. KEYS: each point's
    cell id (NO_CELL if it touches no voxel), the offset of its grad_output elements
    (``go_offsets``) and, for bilinear, its padded coordinates."""
    n, q, pmask = block_of_points(tl.program_id(0), S, BLOCK_P, INDEX)
    cx, cy, cz, base = point_coordinates(field, theta, table, n, q, pmask, Do, Ho, Wo, sfN,
                                          sfD, sfH, sfW, sfK, COMPUTE, AFFINE, FIELD, SCALED)
    if TAPS == 4:
        fp, mx, my, mz, valid = cubic_footprint(cx, cy, cz, pmask, D, H, W, MODE, PADDING,
                                                 ALIGN, INDEX)
    else:
        ix, iy, iz, mx, my, mz, valid = grid_point(cx, cy, cz, pmask, D, H, W, PADDING,
                                                    ALIGN)
    p = n * S + q  # row of grad_grid, keys, coords and go_offsets
    if FIELD_GRAD or THETA_GRAD or SCATTER or KEYS:
        d, h, w = split_spatial(q, Ho, Wo)
        go_at = n * sgoN + d * sgoD + h * sgoH + w * sgoW  # grad_output[n, 0, point]
    if FIELD_GRAD or THETA_GRAD or SCATTER:
        go_q = gout + go_at
        sx = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
        sy = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
        sz = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
        for c0 in range(0, C, BLOCK_C):
            c = (c0 + tl.arange(0, BLOCK_C)).to(INDEX)
            cmask = c < C
            g = tl.load(go_q[:, None] + c[None, :] * sgoC, mask=valid[:, None] & cmask[None, :],
                        other=0.0).to(COMPUTE)
            if TAPS == 4:
                tx, ty, tz = tap_backward(inp + n * siN, gin + n * giN, fp, g, c, cmask, siC,
                                           siD, siH, siW, giC, giD, giH, giW,
                                           FIELD_GRAD or THETA_GRAD, SCATTER, COMPUTE)
            else:
                tx = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
                ty = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
                tz = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
                for k in tl.static_range(TAPS * TAPS * TAPS):
                    x, y, z, inside, weight = corner(k, ix, iy, iz, valid, D, H, W, TAPS,
                                                      INDEX)
                    m = inside[:, None] & cmask[None, :]
                    if FIELD_GRAD or THETA_GRAD:
                        dwx, dwy, dwz = corner_weight_grad(k, ix, iy, iz)
                        offset = n * siN + z * siD + y * siH + x * siW
                        v = tl.load(inp + offset[:, None] + c[None, :] * siC, mask=m,
                                    other=0.0).to(COMPUTE)
                        tx += v * dwx[:, None]
                        ty += v * dwy[:, None]
                        tz += v * dwz[:, None]
                    if SCATTER:
                        offset = n * giN + z * giD + y * giH + x * giW
                        tl.atomic_add(gin + offset[:, None] + c[None, :] * giC,
                                      g * weight[:, None], mask=m, sem="relaxed")
            sx += tx * g
            sy += ty * g
            sz += tz * g
        if FIELD_GRAD or THETA_GRAD:
            gx = tl.where(valid, mx * tl.sum(sx, axis=1), 0.0)
            gy = tl.where(valid, my * tl.sum(sy, axis=1), 0.0)
            gz = tl.where(valid, mz * tl.sum(sz, axis=1), 0.0)
            if FIELD_GRAD:
                fx, fy, fz = gx, gy, gz
                if SCALED:
                    scales = table + Wo + Ho + Do
                    fx = gx * tl.load(scales)
                    fy = gy * tl.load(scales + 1)
                    fz = gz * tl.load(scales + 2)
                row = grad_field + 3 * p
                dtype = grad_field.dtype.element_ty
                mine = rows_of_item(p, n, S)
                tl.store(row, fx.to(dtype), mask=mine)
                tl.store(row + 1, fy.to(dtype), mask=mine)
                tl.store(row + 2, fz.to(dtype), mask=mine)
            if THETA_GRAD:
                store_theta_terms(grad_theta + 12 * tl.program_id(0).to(INDEX), gx, gy, gz,
                                   base, valid, table, q, Ho, Wo)
    if KEYS:
        mine = rows_of_item(p, n, S)
        if TAPS == 4:  # keyed by the low corner of its window
            voxels, reads, weights, _ = fp
            x, wx = tap_window(voxels[0], reads[0], weights[0], W)
            y, wy = tap_window(voxels[1], reads[1], weights[1], H)
            z, wz = tap_window(voxels[2], reads[2], weights[2], D)
            touches = (x < W) & (y < H) & (z < D)
            row = coords + 12 * p
            for j in tl.static_range(4):
                tl.store(row + j, wx[j], mask=mine)
                tl.store(row + 4 + j, wy[j], mask=mine)
                tl.store(row + 8 + j, wz[j], mask=mine)
            x, y, z = x + 3, y + 3, z + 3
        elif TAPS == 1:
            x, y, z, touches, _ = corner(0, ix, iy, iz, valid, D, H, W, TAPS, INDEX)
        else:  # shifted by one: the cell's low corner may lie at -1
            fx = tl.floor(ix) + 1.0
            fy = tl.floor(iy) + 1.0
            fz = tl.floor(iz) + 1.0
            touches = valid & within(fx, W + 1) & within(fy, H + 1) & within(fz, D + 1)
            x, y, z = positions(fx, fy, fz, touches, INDEX)
            row = coords + 3 * p
            tl.store(row, ix, mask=mine)
            tl.store(row + 1, iy, mask=mine)
            tl.store(row + 2, iz, mask=mine)
        cell = tl.where(touches, cell_id(n, z, y, x, D, H, W, TAPS), NO_CELL)
        tl.store(keys + p, cell.to(keys.dtype.element_ty), mask=mine)
        tl.store(go_offsets + p, go_at.to(go_offsets.dtype.element_ty), mask=mine)


@triton.jit
def _gather_cell(acc, ex, ey, ez, n, z, y, x, D, H, W, gout, order, coords, go_offsets,
                 starts, vmask, c, cmask, sgoC, TAPS: tl.constexpr, COMPUTE: tl.constexpr,
                 INDEX: tl.constexpr):
    """``acc`` plus the terms of the points of the cell at offset (ex, ey, ez) from each
    voxel (z, y, x), in point order: grad_output times the voxel's weight, from the
    values the keys pass stored per point in ``coords`` (bilinear: the padded coordinates,
    the cubic modes: per axis the summed weights of the window's voxels)."""
    cell = cell_id(n, z + ez, y + ey, x + ex, D, H, W, TAPS)
    first = tl.load(starts + cell, mask=vmask, other=0).to(INDEX)
    end = tl.load(starts + cell + 1, mask=vmask, other=0).to(INDEX)
    for j in range(tl.max(end - first)):
        at = first + j
        m = at < end
        p = tl.load(order + at, mask=m, other=0).to(INDEX)
        go = gout + tl.load(go_offsets + p, mask=m, other=0).to(INDEX)
        g = tl.load(go[:, None] + c[None, :] * sgoC, mask=m[:, None] & cmask[None, :],
                    other=0.0).to(COMPUTE)
        if TAPS == 1:
            acc += g
        elif TAPS == 4:
            row = coords + 12 * p
            wx = tl.load(row + (3 - ex), mask=m, other=0.0)
            wy = tl.load(row + (7 - ey), mask=m, other=0.0)
            wz = tl.load(row + (11 - ez), mask=m, other=0.0)
            acc += g * (wx * (wy * wz))[:, None]
        else:
            _, wx, _ = axis_tap(tl.load(coords + 3 * p, mask=m, other=0.0), 1 - ex)
            _, wy, _ = axis_tap(tl.load(coords + 3 * p + 1, mask=m, other=0.0), 1 - ey)
            _, wz, _ = axis_tap(tl.load(coords + 3 * p + 2, mask=m, other=0.0), 1 - ez)
            acc += g * (wx * wy * wz)[:, None]
    return acc


@triton.jit
def _gather_input_grad_kernel(
        gout, gin, order, coords, go_offsets, starts,
        C, D, H, W, S_in, CHUNKS, sgoC, giN, giC, giQ,
        TAPS: tl.constexpr, COMPUTE: tl.constexpr, INDEX: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """grad_input without atomics: one program per BLOCK_P input voxels and BLOCK_C
    channels, each voxel summing the points of the cells around it (``order``/``starts``:
    the points sorted by cell, and each cell's first position), cell by cell, in point
    order within a cell. A point's grad_output elements are read at its offset from the
    points pass: no division per point."""
    pid = tl.program_id(0)
    n, v, vmask = block_of_points(pid // CHUNKS, S_in, BLOCK_P, INDEX)
    c = (pid % CHUNKS) * BLOCK_C + tl.arange(0, BLOCK_C).to(INDEX)
    cmask = c < C
    z, y, x = split_spatial(v, H, W)
    acc = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
    if TAPS == 4:
        # Along each axis the voxel is tap 3 - e of the window whose (shifted) low corner
        # lies at its own position + e, e = 0..3.
        for k in range(64):
            acc = _gather_cell(acc, k % 4, (k // 4) % 4, k // 16, n, z, y, x, D, H, W, gout,
                               order, coords, go_offsets, starts, vmask, c, cmask, sgoC, TAPS,
                               COMPUTE, INDEX)
    else:
        # Bilinear: along each axis the voxel is the high corner of the cell at its own
        # (shifted) position and the low corner of the next cell.
        for k in tl.static_range(TAPS * TAPS * TAPS):
            acc = _gather_cell(acc, k & 1, (k >> 1) & 1, k >> 2, n, z, y, x, D, H, W, gout,
                               order, coords, go_offsets, starts, vmask, c, cmask, sgoC, TAPS,
                               COMPUTE, INDEX)
    # v again, from the (z, y, x) the cells keep live: v's own base would be one more
    # value live across them (ptxas spilled it: sm_80, int64, cubic at (64, 8))
    v = (z * H + y) * W + x
    tl.store(gin + n * giN + v[:, None] * giQ + c[None, :] * giC,
             acc.to(gin.dtype.element_ty), mask=vmask[:, None] & cmask[None, :])


def _points_tile(channels: int, channels_last: bool) -> tuple[int, int]:
    """Tile of the kernels over grid points: one point per thread in NCDHW, looping over
    channels; a point's channels side by side in channels_last_3d. (More points per thread
    leave the unrolled corners short of registers.)"""
    if channels_last:
        return tile(channels, 32, 128)
    return 128, 1


def _tile_of(input):
    return _points_tile(input.shape[1], is_channels_last(input))


def _setup(input, coords, mode, padding_mode, align_corners, tensors, counts):
    """Sizes (N, C, D, H, W, S = Do*Ho*Wo, Do, Ho, Wo), the compute dtype and the
    constexprs shared by the kernels of one call; INDEX covers ``tensors`` and ``counts``."""
    N, C, D, H, W = input.shape
    Do, Ho, Wo = coords.spatial
    compute = compute_dtype(input.dtype, coords.dtype)
    # The kernels' structure follows the mode's taps per axis; MODE picks its weights.
    consts = dict(MODE=mode, TAPS=MODES.of(mode).taps, PADDING=padding_mode,
                  ALIGN=bool(align_corners),
                  COMPUTE=tl_dtype(compute), **coords.consts(),
                  INDEX=index_dtype(input, *coords.tensors(), *tensors, counts=counts))
    return (N, C, D, H, W, Do * Ho * Wo, Do, Ho, Wo), compute, consts


def _cells(N, D, H, W, mode):
    """Number of cells points are keyed by: voxels (nearest), unit cubes (bilinear) or
    windows of 4 x 4 x 4 voxels (the cubic modes)."""
    if mode == NEAREST:
        return N * D * H * W
    reach = MODES.of(mode).taps - 1
    return N * (D + reach) * (H + reach) * (W + reach)


def _window_values(mode):
    """Values per point the keys pass stores for the gather: none (nearest), the padded
    coordinates (bilinear) or the summed weights of the 4 voxels of each axis (cubic)."""
    return {1: 0, 2: 3, 4: 12}[MODES.of(mode).taps]


class PreparedGridSample:
    """A grid-sampling call prepared (``prepare_forward``, ``prepare_backward``) for
    operands of the same shapes, strides, dtypes and device, as the C++ core's: its
    launches worked out once (``ForwardLaunch``, ``BackwardLaunch``); ``forward_on`` and
    ``backward_on`` run them on new operands (tensors here, the C++ core's arrays)."""

    __slots__ = ("launch",)

    def __init__(self, launch) -> None:
        self.launch = launch

    def forward_on(self, input, grid, out) -> None:
        with on_device_of(input):
            self.launch.run(input, grid_coordinates(grid), out)

    def backward_on(self, grad_output, input, grid, grad_input, grad_grid) -> None:
        with on_device_of(input):
            self.launch.run(grad_output, input, grid_coordinates(grid), grad_input, grad_grid,
                            None)


def preparable(*tensors) -> bool:
    """Whether a call on operands like these may be prepared: always (the launchers take
    any strides, and stage a result they cannot write as it is)."""
    return True


def prepare_forward(call, input, grid, out) -> PreparedGridSample | None:
    """``forward(call, input, grid, out)`` prepared for operands of these tensors' shapes,
    strides, dtypes and device; None for a call with nothing to compute."""
    if out.numel() == 0:
        return None
    return PreparedGridSample(ForwardLaunch(input, grid_coordinates(grid), call.mode,
                                            call.padding, call.align_corners, out))


def forward(call, input, grid, out) -> None:
    """Sample ``input`` (N, C, D, H, W) at ``grid`` (N, Do, Ho, Wo, 3) into ``out`` (N, C,
    Do, Ho, Wo, the input's dtype) as the checked ``call`` (a ``_calls.GridSample``) says:
    SPEC §2. A float32/float64 grid may accompany 16-bit input (computed in the grid's
    precision, at least float32)."""
    prepared = prepare_forward(call, input, grid, out)
    if prepared is not None:
        prepared.forward_on(input, grid, out)


class ForwardLaunch:
    """The forward's launch (of grid sampling and of warps) worked out for operands like
    these: its launch grid, its integer arguments (sizes and strides), its constexprs and
    tile, and whether the result is computed into a dense copy (``writable_volume``)."""

    __slots__ = ("programs", "ints", "consts", "dense")

    def __init__(self, input, coords: Coordinates, mode: int, padding_mode: int,
                 align_corners: bool, out) -> None:
        target, strides = writable_volume(out)
        self.dense = target is out
        sizes, _, consts = _setup(input, coords, mode, padding_mode, align_corners, (target,), ())
        block_p, block_c = _tile_of(input)
        self.programs = programs(sizes[0], sizes[5], block_p)
        self.ints = (*sizes[1:], *input.stride(), *coords.args(target)[3:], *strides)
        self.consts = dict(consts, BLOCK_P=block_p, BLOCK_C=block_c, **LAUNCH)

    def run(self, input, coords: Coordinates, out) -> None:
        """``input`` sampled where ``coords`` says, into ``out``."""
        target = out if self.dense else new_volume(out.shape, out.dtype, out)
        _forward_kernel[self.programs](input, *coords.args(target)[:3], target, *self.ints,
                                       **self.consts)
        written(target, out)


def prepare_backward(call, grad_output, input, grid, grad_input, grad_grid,
                     deterministic: bool = True) -> PreparedGridSample:
    """``backward(...)`` prepared for operands and gradients (None: not asked for) of these
    tensors' shapes, strides, dtypes and device."""
    return PreparedGridSample(BackwardLaunch(
        grad_output, input, grid_coordinates(grid), call.mode, call.padding,
        call.align_corners, grad_input, grad_grid, None, deterministic))


def backward(call, grad_output, input, grid, grad_input, grad_grid,
             deterministic: bool = True) -> None:
    """Write the gradients of ``forward`` that ``call.output_mask`` asks for into
    ``grad_input`` (the input's shape and dtype) and ``grad_grid`` (the grid's), None for
    one not asked for: SPEC §2. ``deterministic`` selects the atomic-free gather for
    grad_input (bitwise reproducible) over the atomic scatter. grad_grid is exactly 0 for
    nearest."""
    prepare_backward(call, grad_output, input, grid, grad_input, grad_grid,
                     deterministic).backward_on(grad_output, input, grid, grad_input, grad_grid)


class BackwardLaunch:
    """The backward's launches (of grid sampling and of warps) worked out for operands and
    results like these: which run (the points pass alone, with the atomic scatter, or with
    the keys, the sort and the deterministic gather), their constexprs, tiles and launch
    grids, the scratch each call allocates, and which results are only zeroed (a
    coordinate gradient of nearest, anything of a call with no point or no channel)."""

    __slots__ = ("zero_input", "zero_coords", "run_input", "run_field", "run_theta",
                 "stage_field", "deterministic", "sizes", "compute", "consts", "points",
                 "partials", "cells", "key_dtype", "gather")

    def __init__(self, grad_output, input, coords: Coordinates, mode: int, padding_mode: int,
                 align_corners: bool, grad_input, grad_field, grad_theta,
                 deterministic: bool) -> None:
        N, C, D, H, W = input.shape
        Do, Ho, Wo = coords.spatial
        points = N * Do * Ho * Wo
        work = points * C > 0
        smooth = mode != NEAREST and work
        self.zero_coords = not smooth
        self.zero_input = not work
        self.run_input = grad_input is not None and work
        self.run_field = grad_field is not None and smooth
        self.run_theta = grad_theta is not None and smooth
        self.deterministic = deterministic
        if not (self.run_input or self.run_field or self.run_theta):
            return
        results = tuple(t for t in (grad_input, grad_field) if t is not None)
        cells = _cells(N, D, H, W, mode)
        self.sizes, self.compute, consts = _setup(input, coords, mode, padding_mode,
                                                  align_corners, (grad_output, *results),
                                                  (3 * points, cells + 1, input.numel()))
        block_p, block_c = _tile_of(input)
        self.consts = dict(consts, BLOCK_P=block_p, BLOCK_C=block_c, **LAUNCH)
        self.points = programs(N, Do * Ho * Wo, block_p)
        self.cells = cells
        # the kernels store a field's gradient densely
        self.stage_field = self.run_field and not grad_field.is_contiguous()
        self.partials = (self.points[0], 12) if self.run_theta else None
        self.key_dtype = torch.int64 if consts["INDEX"] == tl.int64 else torch.int32
        if self.run_input and deterministic:
            target, strides = writable_volume(grad_input)
            # a voxel's channels share its walk over the points
            block_p, block_c = tile(C, 32, 512)
            chunks = triton.cdiv(C, block_c)
            self.gather = (target is grad_input, programs(N, D * H * W, block_p, chunks),
                           (C, D, H, W, D * H * W, chunks, grad_output.stride(1), *strides),
                           dict(TAPS=consts["TAPS"], COMPUTE=consts["COMPUTE"],
                                INDEX=consts["INDEX"], BLOCK_P=block_p, BLOCK_C=block_c))

    def run(self, grad_output, input, coords: Coordinates, grad_input, grad_field,
            grad_theta) -> None:
        """The gradients of sampling ``input`` where ``coords`` says into ``grad_input``,
        ``grad_field`` (the field's shape, ``coords.dtype``; scaled as the field is) and
        ``grad_theta`` ((N, 3, 4), ``coords.dtype``: summed per block of points and then
        over the blocks in float64, in a fixed order), each written whole, None where not
        wanted. The last two are exactly 0 for nearest."""
        for result in (grad_field, grad_theta) if self.zero_coords else ():
            if result is not None:
                result.zero_()
        if grad_input is not None and self.zero_input:
            grad_input.zero_()
        if not (self.run_input or self.run_field or self.run_theta):
            return
        device = input.device
        field_target = (None if not self.run_field else grad_field if not self.stage_field
                        else torch.empty(grad_field.shape, dtype=grad_field.dtype, device=device))
        sinks: dict[str, Any] = dict(
            grad_field=field_target,
            partials=(None if self.partials is None
                      else torch.empty(self.partials, dtype=self.compute, device=device)))
        if not self.run_input:
            self._points_pass(grad_output, input, coords, **sinks)
        elif self.deterministic:
            self._gathered_input_grad(grad_output, input, coords, sinks, grad_input)
        else:
            self._scattered_input_grad(grad_output, input, coords, sinks, grad_input)
        if field_target is not None and field_target is not grad_field:
            grad_field.copy_(field_target)
        if self.run_theta:  # the blocks' sums, batch by batch, in block order
            grad_theta.copy_(sinks["partials"].view(self.sizes[0], -1, 3, 4)
                             .to(torch.float64).sum(1))

    def _points_pass(self, grad_output, input, coords, grad_field=None, partials=None,
                     gin=None, keys=None, coords_out=None, go_offsets=None):
        """Launch ``_backward_points_kernel`` for the outputs given (None: not wanted)."""
        N, C, D, H, W, S, Do, Ho, Wo = self.sizes
        unused = grad_output.new_empty(0)  # stands for the pointers of outputs not wanted
        _backward_points_kernel[self.points](
            grad_output, input, *coords.args(unused)[:3], or_unused(grad_field, unused),
            or_unused(partials, unused), or_unused(gin, unused), or_unused(keys, unused), or_unused(coords_out, unused),
            or_unused(go_offsets, unused), C, D, H, W, S, Do, Ho, Wo, self.cells,
            *grad_output.stride(), *input.stride(), *coords.args(unused)[3:],
            *(gin.stride() if gin is not None else (0,) * 5), **self.consts,
            FIELD_GRAD=grad_field is not None, THETA_GRAD=partials is not None,
            SCATTER=gin is not None, KEYS=keys is not None)

    def _scattered_input_grad(self, grad_output, input, coords, sinks, grad_input):
        """grad_input by atomic adds (at any strides), through a compute-dtype buffer
        rounded once at the end where grad_input is 16-bit."""
        acc = (grad_input.zero_() if grad_input.dtype == self.compute
               else new_volume(input.shape, self.compute, input, zero=True))
        self._points_pass(grad_output, input, coords, gin=acc, **sinks)
        written(acc, grad_input)

    def _gathered_input_grad(self, grad_output, input, coords, sinks, grad_input):
        """grad_input by the deterministic gather (see the module docstring)."""
        device = input.device
        count = self.sizes[0] * self.sizes[5]  # N * S points
        keys = torch.empty(count, dtype=self.key_dtype, device=device)
        go_offsets = torch.empty(count, dtype=self.key_dtype, device=device)
        voxel_coords = torch.empty(_window_values(self.consts["MODE"]) * count,
                                   dtype=self.compute, device=device)
        self._points_pass(grad_output, input, coords, keys=keys, coords_out=voxel_coords,
                          go_offsets=go_offsets, **sinks)
        sorted_keys, order = torch.sort(keys, stable=True)
        cell_ids = torch.arange(self.cells + 1, dtype=self.key_dtype, device=device)
        starts = torch.searchsorted(sorted_keys, cell_ids,
                                    out_int32=self.key_dtype == torch.int32)
        dense, launch, ints, consts = self.gather
        target = grad_input if dense else new_volume(grad_input.shape, grad_input.dtype,
                                                     grad_input)
        # 8 warps, 2 values a thread: at 4 (4 warps), ptxas spills a value live across the
        # cells (8 bytes, sm_80, at (256, 2) and the cubic modes' (128, 4))
        _gather_input_grad_kernel[launch](
            grad_output, target, order, voxel_coords, go_offsets, starts, *ints, **consts,
            num_warps=8, **LAUNCH)
        written(target, grad_input)


def workspace_nbytes(call, deterministic: bool = True) -> int:
    """Bytes of device memory the backward of ``call`` (a ``_calls.GridSample``, or a
    ``_calls.Warp``) allocates beyond its results, for results the kernels write as they
    are (``point_strides``; any other result adds its dense copy): a warp's per-block sums
    for grad_theta; for grad_input, the compute-dtype accumulator of a 16-bit one (the
    atomic scatter), or the deterministic gather's per-point keys, grad_output offsets
    and cell values, the sorted keys and their order, and each cell's id and first
    position (``torch.sort``'s own scratch aside)."""
    want_input = call.output_mask[0]
    N, C, D, H, W = call.input_shape
    points = call.points
    if points * C == 0 or (call.mode == NEAREST and not want_input):
        return 0
    compute = np.dtype(call.compute_dtype).itemsize
    total = 0
    if len(call.output_mask) == 3 and call.output_mask[1]:  # a warp's grad_theta
        block_p, _ = _points_tile(C, call.layout == "NDHWC" and C > 1)
        total += N * triton.cdiv(points // N, block_p) * 12 * compute
    if not want_input:
        return total
    if not deterministic:
        same = np.dtype(call.dtype) == np.dtype(call.compute_dtype)
        return total + (0 if same else math.prod(call.input_shape) * compute)
    cells = _cells(N, D, H, W, call.mode)
    counts = (math.prod(call.input_shape), math.prod(call.output_shape), 3 * points, cells + 1)
    key = 8 if index_dtype(counts=counts) == tl.int64 else 4
    # keys, offsets, sorted keys, their int64 order, cell values; cells' ids and starts
    per_point = 3 * key + 8 + _window_values(call.mode) * compute
    return total + points * per_point + 2 * (cells + 1) * key
