"""Torch dtypes and their NumPy twins: the four the kernels take (bfloat16 as
``ml_dtypes.bfloat16``, which NumPy lacks), and NumPy's own for the rest."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

TO_NUMPY = {torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
             torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
TO_TORCH = {v: k for k, v in TO_NUMPY.items()}


def numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    """The NumPy dtype of a torch dtype, None where NumPy has none."""
    if dtype in TO_NUMPY:
        return TO_NUMPY[dtype]
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):
        return None
