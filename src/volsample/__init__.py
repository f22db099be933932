"""volsample: differentiable 3-D volume resampling.

Grid sampling (trilinear, nearest, bicubic and cubic B-spline, with the B-spline
prefilter ``spline_coefficients``), warps without a grid (``warp_3d``: an affine map
plus a displacement) and trilinear upsampling, forward and backward, and the displacement
field tools of registration (``compose``, ``integrate_velocity``,
``jacobian_determinant``), for NumPy arrays; ``volsample.torch`` adds PyTorch autograd and
custom ops, and ``volsample.aclnn`` the CANN two-phase API.
"""
from ._errors import (InvalidArgumentError, OutputTooLargeError, UnsupportedDTypeError,
                      VolsampleError)
from ._config import get_deterministic, get_num_threads, set_deterministic, set_num_threads
from ._result_cache import get_result_cache, set_result_cache
from .grid_sample import grid_sample_3d, grid_sample_3d_backward
from .upsample import upsample_trilinear_3d, upsample_trilinear_3d_backward
from .warp import warp_3d, warp_3d_backward
from .fields import compose, integrate_velocity, jacobian_determinant
from .spline import spline_coefficients

__version__ = "0.1.0"

__all__ = [
    "grid_sample_3d", "grid_sample_3d_backward",
    "upsample_trilinear_3d", "upsample_trilinear_3d_backward",
    "warp_3d", "warp_3d_backward", "spline_coefficients", "compose", "integrate_velocity", "jacobian_determinant",
    "set_num_threads", "get_num_threads", "set_deterministic", "get_deterministic",
    "set_result_cache", "get_result_cache",
    "VolsampleError", "InvalidArgumentError", "UnsupportedDTypeError", "OutputTooLargeError",
]
