"""volsample for PyTorch: differentiable grid sampling, warps and trilinear upsampling.

``grid_sample`` and ``upsample_trilinear`` are drop-ins for ``F.grid_sample`` (5-D) and
``F.interpolate(mode="trilinear")``; ``warp`` samples at ``affine_grid(theta) +
displacement`` without forming that grid, and ``warp_mse_loss`` is ``F.mse_loss`` of such a
warp and a target without holding the warped volume. They run the custom ops
``torch.ops.volsample.grid_sampler_3d`` / ``grid_sampler_3d_backward`` /
``warp_3d`` / ``warp_3d_backward`` /
``upsample_trilinear3d`` / ``upsample_trilinear3d_backward`` (registered on import), which
carry autograd and work under ``torch.compile``: the CPU kernels on CPU tensors, the
Triton kernels on CUDA tensors. Both AD modes (torch.autograd.forward_ad, torch.func) and
double backward work. ``patch()`` routes ``F.grid_sample`` / ``F.interpolate`` here.
``spline_coefficients`` is the prefilter of ``mode="bspline"``; ``compose``,
``integrate_velocity`` and ``jacobian_determinant`` are the displacement field tools of
``volsample``; all differentiable.
"""
try:
    import torch  # noqa: F401
except ImportError as error:
    raise ImportError(
        "volsample.torch needs PyTorch (pip install 'volsample[torch]'); the NumPy API, "
        "`import volsample`, works without it") from error

from ._fields import compose, integrate_velocity, jacobian_determinant
from ._grid_sample import grid_sample
from ._patch import patch, unpatch
from ._spline import spline_coefficients
from ._upsample import upsample_trilinear
from ._warp import warp
from ._warp_loss import warp_mse_loss

__all__ = ["grid_sample", "upsample_trilinear", "warp", "warp_mse_loss", "spline_coefficients", "compose",
           "integrate_velocity", "jacobian_determinant", "patch", "unpatch"]
