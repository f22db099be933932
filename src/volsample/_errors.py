"""The exceptions volsample raises on bad input: every front door raises these (or, in
``volsample.torch``, subclasses that are also PyTorch's classes; ``volsample.aclnn`` turns
them into CANN status codes).

Each error also carries the ``argument``, the ``kind`` of mistake and the ``value`` that
came, so that a front door can put the mistake in its own terms (the torch layer starts
its messages with PyTorch's words for the same mistake). The kinds:

    type            not of the Python type expected (not an array, a float size, a flag
                    that is not a bool, a scale that is not a number)
    dtype           an unsupported dtype
    dtype_mismatch  dtypes that do not go together (value: the expected dtype, the one that came)
    rank            the wrong number of dimensions (value: the number that came)
    shape           a shape that does not fit (a grid's last dimension, a gradient's shape)
    batch           a batch size that differs from the input's
    empty           an empty spatial dimension
    choice          a value not among those supported (a mode, a layout, an op's code)
    length          a sequence of the wrong length
    too_small       a number below the least allowed (a size or scale that gives no voxels)
    too_large       a number above the most allowed
    nonfinite       NaN or infinity
    mismatch        values that contradict each other (scales and sizes)
    exclusive       both or neither of two arguments that go one at a time (value: "both"
                    or "neither")
    device          tensors on different devices
"""


class VolsampleError(Exception):
    """Base class of every error volsample raises on bad input. ``argument``, ``kind`` (one
    of the kinds above) and ``value`` say what was wrong, where the check knows it."""

    def __init__(self, message: str, *, argument: str | None = None, kind: str | None = None,
                 value: object = None) -> None:
        super().__init__(message)
        self.argument, self.kind, self.value = argument, kind, value


class InvalidArgumentError(VolsampleError, ValueError):
    """A value, shape, size or mode that the operator does not accept."""


class UnsupportedDTypeError(VolsampleError, TypeError):
    """An array of a dtype the operator does not accept, or of mixed dtypes."""


class OutputTooLargeError(VolsampleError, MemoryError):
    """A result larger than this machine can hold, refused before any work. A
    ``MemoryError``, as NumPy's own refusal is, and a ``VolsampleError`` (not an invalid
    argument: the same call runs where memory suffices). ``argument`` names the result,
    ``value`` is its shape; ``nbytes`` its size."""

    def __init__(self, message: str, *, argument: str, value: tuple, nbytes: int) -> None:
        super().__init__(message, argument=argument, kind="too_large", value=value)
        self.nbytes = nbytes
