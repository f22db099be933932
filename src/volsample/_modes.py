"""Kernel integers of the sampling modes, shared by every backend (the C++ core's
src/cpp/tensor.h holds the same values) and equal to the aclnn interpolationMode /
paddingMode codes. Mode strings become these once, at the front doors (``_checks``)."""

BILINEAR, NEAREST = 0, 1
ZEROS, BORDER, REFLECTION = 0, 1, 2
