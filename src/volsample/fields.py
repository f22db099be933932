"""Displacement fields for registration: ``compose``, ``integrate_velocity`` and
``jacobian_determinant`` (NumPy; ``volsample.torch`` has the same three, differentiable).

A field is a displacement in voxels of its own grid, shape (N, D, H, W, 3), channels
(x, y, z) along (W, H, D) -- the convention of ``warp_3d(..., displacement_units="voxels")``:
the point at voxel x moves to x + u(x), and ``warp_3d(image, displacement=u,
displacement_units="voxels", align_corners=True)`` samples ``image(x + u(x))``. Fields are
sampled (in ``compose``) trilinearly, ``padding_mode="zeros"`` by default (no displacement
outside the grid, as VoxelMorph, MONAI and ITK read a field). Conventions, the stencil and
a worked example: docs/fields.md.
"""
from __future__ import annotations


import numpy as np

from . import _checks, _dtypes, _fields
from .warp import warp_3d


def _sample(field, displacement, padding_mode):
    """``field`` sampled at x + displacement(x): a field is an NDHWC volume of 3 channels."""
    return warp_3d(field, displacement=displacement, padding_mode=padding_mode,
                   align_corners=True, layout="NDHWC", displacement_units="voxels")


def _field(name, value):
    array = _checks.ndarray(name, value)
    _fields.check_field(name, array.shape)
    _checks.volume_dtype(name, array.dtype)
    return array


def compose(u: np.ndarray, v: np.ndarray, padding_mode: str = "zeros") -> np.ndarray:
    """The displacement of "v, then u": each point moves by v, then by u from there.

    ``w(x) = v(x) + u(x + v(x))``, u read trilinearly at the moved points. Warping with w
    samples an image where warping it by u and then warping the result by v would:
    ``warp(image, w) ~ warp(warp(image, u), v)`` (up to the interpolation of the
    intermediate image, which composing fields avoids).

    Parameters
    ----------
    u, v : ndarray, shape (N, D, H, W, 3)
        Displacements in voxels, channels (x, y, z); one shape and one float dtype.
    padding_mode : {"zeros", "border", "reflection"}
        What u reads beyond its grid: 0 by default (no displacement outside).

    Returns
    -------
    ndarray, shape and dtype of ``v``.

    Examples
    --------
    >>> import numpy as np, volsample
    >>> u = np.zeros((1, 4, 4, 4, 3)); u[..., 0] = 1     # 1 voxel along x
    >>> v = np.zeros((1, 4, 4, 4, 3)); v[..., 1] = 0.5   # half a voxel along y
    >>> volsample.compose(u, v)[0, 1, 1, 1]              # u read at (1, 1.5, 1): 1 along x
    array([1. , 0.5, 0. ])
    """
    u, v = _field("u", u), _field("v", v)
    _fields.check_pair(u.shape, v.shape)
    _checks.same_dtype("v", v.dtype, "u", u.dtype)
    return _fields.compose(_sample, u, v, padding_mode)


def integrate_velocity(v: np.ndarray, steps: int = 7, padding_mode: str = "zeros") -> np.ndarray:
    """The displacement of a stationary velocity field by scaling and squaring.

    ``u = v / 2**steps``, then ``steps`` times ``u = compose(u, u)``: the displacement
    exp(v) of flowing along v for unit time (VoxelMorph's ``VecInt``, MONAI's ``DVF2DDF``,
    same conventions: trilinear, zeros padding). The result is diffeomorphic when v is
    smooth and small enough per step.

    Parameters
    ----------
    v : ndarray, shape (N, D, H, W, 3)
        Velocity in voxels (per unit time), channels (x, y, z).
    steps : int >= 0
        Squarings (0: v itself).
    padding_mode : {"zeros", "border", "reflection"}
        As for ``compose``.

    Returns
    -------
    ndarray, shape and dtype of ``v``.
    """
    v = _field("v", v)
    steps = _fields.check_steps(steps)
    return _fields.integrate_velocity(_sample, v, steps, padding_mode)


def jacobian_determinant(u: np.ndarray) -> np.ndarray:
    """det(I + du/dx) of a displacement at every voxel: below 0 where the map folds.

    The derivatives are finite differences per voxel: central, ``(u[i+1] - u[i-1]) / 2``,
    inside, one-sided, ``u[1] - u[0]`` and ``u[n-1] - u[n-2]``, at the two ends of each
    axis (NumPy's ``gradient``), and 0 along an axis of one voxel. Inside, this is ITK's
    ``DisplacementFieldJacobianDeterminantFilter`` at unit spacing (ITK takes half a
    one-sided difference at the border).

    Parameters
    ----------
    u : ndarray, shape (N, D, H, W, 3)
        Displacement in voxels, channels (x, y, z).

    Returns
    -------
    ndarray, shape (N, D, H, W), ``u``'s dtype (16-bit fields are computed in float32).
    """
    u = _field("u", u)
    compute = _dtypes.compute_dtype(u.dtype)
    return _fields.jacobian_determinant(np, u.astype(compute, copy=False)).astype(
        u.dtype, copy=False)
