"""The exceptions volsample raises on bad input: every front door raises these (or, in
``volsample.torch``, subclasses that are also PyTorch's classes; ``volsample.aclnn`` turns
them into CANN status codes)."""


class VolsampleError(Exception):
    """Base class of every error volsample raises on bad input."""


class InvalidArgumentError(VolsampleError, ValueError):
    """A value, shape, size or mode that the operator does not accept."""


class UnsupportedDTypeError(VolsampleError, TypeError):
    """An array of a dtype the operator does not accept, or of mixed dtypes."""
