"""The torch door's backends: the CPU kernels are the C++ extension's (each op's module
imports its own); CUDA tensors go to the Triton launchers, imported on first use."""
from __future__ import annotations

import importlib

# ---------------------------------------------------------------------------------------
# GPU backend
# ---------------------------------------------------------------------------------------


def gpu_backend(family: str):
    """The Triton launchers of an operator family (``volsample._triton.<family>``)."""
    name = f"volsample._triton.{family}"
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise RuntimeError(
            f"volsample.torch: CUDA tensors need the Triton GPU backend ({name}), which could "
            f"not be imported ({error}); install triton, or compute on CPU tensors") from error
