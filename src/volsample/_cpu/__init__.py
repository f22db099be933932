"""The compiled C++ CPU core, one launcher module per operator family (``grid_sample``,
``upsample``), over the nanobind extension ``_kernels``.

The kernels are built for several instruction sets (scalar C++, AVX2, AVX-512 on x86-64)
and the best one this CPU runs is chosen when the module loads; the environment variable
``VOLSAMPLE_CPU_ISA=scalar|avx2|avx512`` or ``set_isa`` picks one instead. Every ISA
computes the same bits.
"""
from __future__ import annotations

import numpy as np

from .. import _dtypes
from . import _kernels

isa = _kernels.isa
set_isa = _kernels.set_isa
supported_isas = _kernels.supported_isas
max_threads = _kernels.max_threads
# The C++ core's integer codes of the modes and paddings, as its kernels take them.
MODES = _kernels.MODES
PADDINGS = _kernels.PADDINGS


def operand(arr: np.ndarray | None) -> np.ndarray | None:
    """``arr`` as the kernels take it: bfloat16 as its uint16 bits (NumPy's buffer
    protocol has no bfloat16), and strides that are whole elements (else a copy)."""
    if arr is None:
        return None
    # (an aligned array of these dtypes, whose alignment is their size, has whole strides)
    if not arr.flags.aligned and any(s % arr.itemsize for s in arr.strides):
        arr = np.ascontiguousarray(arr)
    return arr.view(np.uint16) if _dtypes.is_bfloat16(arr.dtype) else arr
