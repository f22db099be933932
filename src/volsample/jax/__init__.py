"""volsample for JAX: differentiable grid sampling, warps and trilinear upsampling on the
C++ kernels, through XLA's foreign function interface.

``grid_sample``, ``warp``, ``upsample_trilinear`` and ``spline_coefficients`` are named and
argued as ``volsample.torch``'s, plus ``layout`` (JAX arrays have no memory format). They are checked
when JAX traces them and run inside compiled programs (``jax.jit``) on the CPU, with the
same bits as the NumPy API; ``jax.grad``/``vjp``/``jacrev``, ``jax.jvp``/``jacfwd``,
second derivatives (``jax.hessian``) and ``jax.vmap`` (one kernel call) work. Importing ``volsample`` never imports
JAX; this module needs it (``pip install 'volsample[jax]'``).
"""
try:
    import jax  # noqa: F401
except ImportError as error:
    raise ImportError(
        "volsample.jax needs JAX (pip install 'volsample[jax]'); the NumPy API, "
        "`import volsample`, works without it") from error

from ._grid_sample import grid_sample
from ._primitives import UnsupportedDeviceError
from ._spline import spline_coefficients
from ._upsample import upsample_trilinear
from ._warp import warp

__all__ = ["grid_sample", "warp", "upsample_trilinear", "spline_coefficients",
           "UnsupportedDeviceError"]
