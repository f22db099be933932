"""The CANN two-phase API (``aclnn``) on top of volsample's NumPy functions.

Mirrors, in Python, the C interface of Ascend CANN's ``aclnnGridSampler3DBackward`` and
``aclnnUpsampleTrilinear3dBackward``: tensors are wrapped with ``aclCreateTensor``, phase
one (``...GetWorkspaceSize``) checks every argument and returns
``(status, workspaceSize, executor)``, phase two runs the executor and writes the results
into the caller's output tensors in place. Nothing here raises on bad input: every failure
is a status code, and ``aclGetRecentErrMsg()`` says what was wrong.

Conventions
-----------
* ``None`` stands for a null pointer.
* A tensor's format tag says how to read its shape: ``ACL_FORMAT_NCDHW`` (and
  ``ACL_FORMAT_ND`` for a 5-D tensor) is (N, C, D, H, W), ``ACL_FORMAT_NDHWC`` is
  (N, D, H, W, C). Tensors of one call may mix the two; each is read in its own format.
  A grid is always (N, Do, Ho, Wo, 3), whatever its tag.
* Workspace: phase one reports the bytes of scratch memory phase two really allocates (the
  kernels' scratch, as ``backward_workspace_nbytes`` counts it, plus the results staged
  before they are copied into the caller's tensors). Phase two refuses a smaller
  ``workspaceSize`` or buffer with ``ACLNN_ERR_PARAM_INVALID``; the kernels allocate their
  own scratch, so the buffer's contents are never read or written.
* An executor runs once: a second run returns ``ACLNN_ERR_PARAM_INVALID`` (the executor
  argument is no longer valid; nothing is computed). A run refused before it starts (a
  null or too-small workspace, a bad stream) does not use the executor up.
* ``ACLNN_ERR_RUNTIME_ERROR`` is a failure of the computation itself in phase two (or,
  should one slip through, an internal error in phase one), never a bad argument.
* Streams: CPU work runs synchronously, so ``stream=None`` (the default stream) and a
  stream from ``aclrtCreateStream`` both mean "run now"; ``aclrtSynchronizeStream`` is
  a no-op that returns ``ACL_SUCCESS``.

Examples
--------
>>> import numpy as np
>>> from volsample import aclnn
>>> grad_out = aclnn.aclCreateTensor(np.ones((1, 1, 2, 2, 2), np.float32), aclnn.ACL_FORMAT_NCDHW)
>>> result = np.zeros((1, 1, 1, 1, 1), np.float32)
>>> grad_in = aclnn.aclCreateTensor(result, aclnn.ACL_FORMAT_NCDHW)
>>> status, size, executor = aclnn.aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(
...     grad_out, aclnn.aclCreateIntArray([2, 2, 2]), aclnn.aclCreateIntArray([1, 1, 1, 1, 1]),
...     False, 0.0, 0.0, 0.0, grad_in)
>>> workspace = aclnn.aclrtMalloc(size) if size > 0 else None
>>> aclnn.aclnnUpsampleTrilinear3dBackward(workspace, size, executor, None), result.item()
(0, 8.0)
"""
from __future__ import annotations

import functools
import math
import numbers
import threading

import numpy as np

from . import _config, _dtypes, _layout
from .grid_sample import backward_workspace_nbytes as _grid_workspace_nbytes
from .grid_sample import grid_sample_3d_backward
from .upsample import backward_workspace_nbytes as _upsample_workspace_nbytes
from .upsample import upsample_trilinear_3d_backward

# --- status codes -------------------------------------------------------------------

ACLNN_SUCCESS = 0
ACLNN_ERR_PARAM_NULLPTR = 161001
ACLNN_ERR_PARAM_INVALID = 161002
ACLNN_ERR_RUNTIME_ERROR = 361001

ACL_SUCCESS = 0  # status of the acl* runtime calls below
ACL_ERROR_INVALID_PARAM = 100000

# --- enumerations (CANN's values) ------------------------------------------------------

ACL_FORMAT_UNDEFINED = -1
ACL_FORMAT_NCHW = 0
ACL_FORMAT_NHWC = 1
ACL_FORMAT_ND = 2
ACL_FORMAT_NC1HWC0 = 3
ACL_FORMAT_FRACTAL_Z = 4
ACL_FORMAT_NDHWC = 27
ACL_FORMAT_FRACTAL_NZ = 29
ACL_FORMAT_NCDHW = 30
ACL_FORMAT_NDC1HWC0 = 32

_FORMAT_NAMES = {
    ACL_FORMAT_UNDEFINED: "ACL_FORMAT_UNDEFINED", ACL_FORMAT_NCHW: "ACL_FORMAT_NCHW",
    ACL_FORMAT_NHWC: "ACL_FORMAT_NHWC", ACL_FORMAT_ND: "ACL_FORMAT_ND",
    ACL_FORMAT_NC1HWC0: "ACL_FORMAT_NC1HWC0", ACL_FORMAT_FRACTAL_Z: "ACL_FORMAT_FRACTAL_Z",
    ACL_FORMAT_NDHWC: "ACL_FORMAT_NDHWC", ACL_FORMAT_FRACTAL_NZ: "ACL_FORMAT_FRACTAL_NZ",
    ACL_FORMAT_NCDHW: "ACL_FORMAT_NCDHW", ACL_FORMAT_NDC1HWC0: "ACL_FORMAT_NDC1HWC0",
}
# The formats these operators read volumes in, and the NumPy API layout of each.
_VOLUME_LAYOUTS = {ACL_FORMAT_ND: "NCDHW", ACL_FORMAT_NCDHW: "NCDHW", ACL_FORMAT_NDHWC: "NDHWC"}

ACL_DT_UNDEFINED = -1
ACL_FLOAT = 0
ACL_FLOAT16 = 1
ACL_DOUBLE = 11
ACL_BF16 = 27

# The one table of dtypes: NumPy dtype -> (aclDataType, its name). One dtype per call.
_DTYPES = {
    _dtypes.FLOAT32: (ACL_FLOAT, "ACL_FLOAT"),
    _dtypes.FLOAT16: (ACL_FLOAT16, "ACL_FLOAT16"),
    _dtypes.FLOAT64: (ACL_DOUBLE, "ACL_DOUBLE"),
    _dtypes.BFLOAT16: (ACL_BF16, "ACL_BF16"),
}

ACL_OPT_DETERMINISTIC = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0

_INTERPOLATION_MODES = ("bilinear", "nearest")  # index = CANN interpolationMode
_PADDING_MODES = ("zeros", "border", "reflection")  # index = CANN paddingMode

# --- error messages (one per thread, as in CANN) --------------------------------------

_recent = threading.local()


def _record(message: str) -> None:
    _recent.message = message


def aclGetRecentErrMsg():
    """The message of the most recent failure in this thread, and clear it.

    Returns
    -------
    str or None
        None when no call has failed since the last read (CANN returns a null pointer).
    """
    message = getattr(_recent, "message", None)
    _recent.message = None
    return message


# --- objects ----------------------------------------------------------------------------


class aclTensor:
    """A NumPy array seen as a CANN tensor: the caller's memory, a format tag and a shape.

    Create it with ``aclCreateTensor``. ``shape`` is the shape in the format's order (for
    ``ACL_FORMAT_NDHWC``: N, D, H, W, C), as CANN's view dims. Results are written into
    ``array`` in place.
    """

    __slots__ = ("array", "format")

    def __init__(self, array: np.ndarray, format: int):
        # A view: the caller's memory, but a shape that later `arr.shape = ...` cannot change.
        self.array = array.view()
        self.format = format

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def dataType(self) -> int:
        """The aclDataType code, or ``ACL_DT_UNDEFINED`` for a dtype these operators lack."""
        return _DTYPES.get(self.array.dtype, (ACL_DT_UNDEFINED,))[0]

    @property
    def layout(self) -> str:
        """The NumPy API layout of a 5-D volume in this tensor's format."""
        return _VOLUME_LAYOUTS[self.format]

    def logical_shape(self) -> tuple[int, ...]:
        """The shape in (N, C, D, H, W) order (a 5-D tensor of a volume format)."""
        return _layout.logical_shape(self.shape, self.layout)

    def logical(self) -> np.ndarray:
        """The array as an (N, C, D, H, W) view."""
        return _layout.logical(self.array, self.layout)

    def __repr__(self):
        return (f"aclTensor(shape={self.shape}, dtype={self.dtype}, "
                f"format={_FORMAT_NAMES.get(self.format, self.format)})")


class _ValueArray:
    """An immutable array of values, as CANN's int and bool arrays are."""

    __slots__ = ("values",)

    def __init__(self, values):
        self.values = tuple(values)

    def __len__(self):
        return len(self.values)

    def __repr__(self):
        return f"{type(self).__name__}({list(self.values)})"


class aclIntArray(_ValueArray):
    """An immutable array of int64 values (``aclCreateIntArray``)."""

    __slots__ = ()


class aclBoolArray(_ValueArray):
    """An immutable array of bools (``aclCreateBoolArray``)."""

    __slots__ = ()


class aclrtStream:
    """A stream handle (``aclrtCreateStream``). CPU work runs synchronously on any stream."""

    __slots__ = ()


class aclOpExecutor:
    """The work one phase-one call planned: run it once with its phase two.

    Attributes
    ----------
    op : str
        The operator (phase-two function name) it belongs to.
    workspace_size : int
        The bytes of workspace phase two needs.
    """

    __slots__ = ("op", "workspace_size", "_run", "used", "_lock")

    def __init__(self, op: str, workspace_size: int, run):
        self.op = op
        self.workspace_size = int(workspace_size)
        self._run = run
        self.used = False
        self._lock = threading.Lock()

    def _claim(self) -> bool:
        """Mark the executor used; False if it already was (two threads racing for one run)."""
        with self._lock:
            claimed, self.used = not self.used, True
        return claimed

    def __repr__(self):
        return f"aclOpExecutor({self.op}, workspace_size={self.workspace_size}, used={self.used})"


# --- creation, destruction, runtime -------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_bool(value) -> bool:
    # C's implicit conversion lets 0 and 1 stand for bools.
    return isinstance(value, (bool, np.bool_)) or (_is_int(value) and value in (0, 1))


def aclCreateTensor(array, format=ACL_FORMAT_ND):
    """Wrap a NumPy array (the caller's memory, any strides) as an ``aclTensor``.

    Parameters
    ----------
    array : ndarray
        The data, with its shape in ``format``'s order: (N, C, D, H, W) for
        ``ACL_FORMAT_NCDHW`` and ``ACL_FORMAT_ND``, (N, D, H, W, C) for ``ACL_FORMAT_NDHWC``
        (physically channels-last). Output tensors are written into it in place.
    format : int
        An ``ACL_FORMAT_*`` constant. Other known formats can be tagged; the operators
        reject them.

    Returns
    -------
    aclTensor or None
        None (a null pointer) when ``array`` is not a NumPy array or ``format`` is unknown;
        ``aclGetRecentErrMsg`` says which.
    """
    if not isinstance(array, np.ndarray):
        _record(f"aclCreateTensor: array: expected a NumPy array, got {type(array).__name__}")
        return None
    if not _is_int(format) or format not in _FORMAT_NAMES:
        _record(f"aclCreateTensor: format: expected an ACL_FORMAT_* constant, got {format!r}")
        return None
    return aclTensor(array, int(format))


def aclCreateIntArray(values):
    """An ``aclIntArray`` of ``values`` (integers in int64 range); None if they are not."""
    try:
        items = tuple(values)
    except TypeError:
        items = None
    if items is None or not all(_is_int(v) and -2**63 <= v < 2**63 for v in items):
        _record(f"aclCreateIntArray: values: expected a sequence of int64 values, got {values!r}")
        return None
    return aclIntArray(int(v) for v in items)


def aclCreateBoolArray(values):
    """An ``aclBoolArray`` of ``values`` (bools, or 0/1); None if they are not."""
    try:
        items = tuple(values)
    except TypeError:
        items = None
    if items is None or not all(_is_bool(v) for v in items):
        _record(f"aclCreateBoolArray: values: expected a sequence of bools, got {values!r}")
        return None
    return aclBoolArray(bool(v) for v in items)


def aclDestroyTensor(tensor=None) -> int:
    """Release a tensor: a no-op (Python frees it), safe on None and repeated calls."""
    return ACL_SUCCESS


def aclDestroyIntArray(array=None) -> int:
    """Release an int array: a no-op, safe on None and repeated calls."""
    return ACL_SUCCESS


def aclDestroyBoolArray(array=None) -> int:
    """Release a bool array: a no-op, safe on None and repeated calls."""
    return ACL_SUCCESS


def aclDestroyAclOpExecutor(executor=None) -> int:
    """Release an executor: a no-op, safe on None and repeated calls."""
    return ACL_SUCCESS


def aclrtMalloc(size, policy=ACL_MEM_MALLOC_HUGE_FIRST):
    """A buffer of ``size`` bytes (a uint8 array), or None if ``size`` is bad or too large.

    The pages are not touched, so an unused buffer costs address space only.
    """
    if not _is_int(size) or size < 0:
        _record(f"aclrtMalloc: size: expected a non-negative integer, got {size!r}")
        return None
    try:
        return np.empty(int(size), np.uint8)
    except (MemoryError, ValueError) as exc:
        _record(f"aclrtMalloc: size: cannot allocate {size} bytes ({exc})")
        return None


def aclrtFree(buffer=None) -> int:
    """Release a buffer from ``aclrtMalloc``: a no-op, safe on None and repeated calls."""
    return ACL_SUCCESS


def aclrtCreateStream() -> aclrtStream:
    """A stream to pass to phase two (work runs synchronously on it)."""
    return aclrtStream()


def aclrtSynchronizeStream(stream=None) -> int:
    """Wait for a stream's work: already done, since phase two runs synchronously."""
    return ACL_SUCCESS


def aclrtDestroyStream(stream=None) -> int:
    """Release a stream: a no-op, safe on None and repeated calls."""
    return ACL_SUCCESS


def aclrtCtxSetSysParamOpt(opt, value) -> int:
    """Set a system option of the context; ``ACL_OPT_DETERMINISTIC`` is the one known.

    ``aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1)`` calls
    ``volsample.set_deterministic(True)``, and 0 sets it to False (GPU backward kernels may
    then use atomics; the CPU is always deterministic).

    Returns
    -------
    int
        ``ACL_SUCCESS``, or ``ACL_ERROR_INVALID_PARAM`` for another option or a value
        other than 0 and 1.
    """
    if not _is_int(opt) or opt != ACL_OPT_DETERMINISTIC:
        _record(f"aclrtCtxSetSysParamOpt: opt: expected ACL_OPT_DETERMINISTIC "
                f"({ACL_OPT_DETERMINISTIC}), got {opt!r}")
        return ACL_ERROR_INVALID_PARAM
    if not _is_int(value) or value not in (0, 1):
        _record(f"aclrtCtxSetSysParamOpt: value: expected 0 or 1, got {value!r}")
        return ACL_ERROR_INVALID_PARAM
    _config.set_deterministic(bool(value))
    return ACL_SUCCESS


def aclrtCtxGetSysParamOpt(opt):
    """``(status, value)`` of a system option; see ``aclrtCtxSetSysParamOpt``."""
    if not _is_int(opt) or opt != ACL_OPT_DETERMINISTIC:
        _record(f"aclrtCtxGetSysParamOpt: opt: expected ACL_OPT_DETERMINISTIC "
                f"({ACL_OPT_DETERMINISTIC}), got {opt!r}")
        return ACL_ERROR_INVALID_PARAM, 0
    return ACL_SUCCESS, int(_config.get_deterministic())


# --- argument checks: each returns (status, message); status 0 means it passed --------------

_OK = (ACLNN_SUCCESS, "")


def _not_null(named: dict):
    """The first None of ``named`` (in order) is a null pointer."""
    for name, value in named.items():
        if value is None:
            return ACLNN_ERR_PARAM_NULLPTR, f"{name}: is a null pointer (None)"
    return _OK


def _kind(named: dict, kind: type):
    """Every value of ``named`` is a ``kind`` (say, an aclTensor rather than a NumPy array)."""
    for name, value in named.items():
        if not isinstance(value, kind):
            return ACLNN_ERR_PARAM_INVALID, f"{name}: expected an {kind.__name__}, got {type(value).__name__}"
    return _OK


def _supported_dtype(name: str, tensor: aclTensor):
    if tensor.dtype not in _DTYPES:
        supported = ", ".join(f"{acl} ({np_dtype.name})" for np_dtype, (_, acl) in _DTYPES.items())
        return ACLNN_ERR_PARAM_INVALID, f"{name}: expected dtype {supported}, got {tensor.dtype}"
    return _OK


def _dtype_name(dtype) -> str:
    return f"{dtype} ({_DTYPES[dtype][1]})" if dtype in _DTYPES else str(dtype)


def _same_dtype(name: str, tensor: aclTensor, ref_name: str, ref: aclTensor):
    if tensor.dtype != ref.dtype:
        return (ACLNN_ERR_PARAM_INVALID,
                f"{name}: expected dtype {_dtype_name(ref.dtype)} (the dtype of {ref_name}), "
                f"got {_dtype_name(tensor.dtype)}")
    return _OK


def _volume_format(name: str, tensor: aclTensor):
    if tensor.format not in _VOLUME_LAYOUTS:
        return (ACLNN_ERR_PARAM_INVALID,
                f"{name}: expected format ACL_FORMAT_ND, ACL_FORMAT_NCDHW or ACL_FORMAT_NDHWC, "
                f"got {_FORMAT_NAMES.get(tensor.format, tensor.format)}")
    return _OK


def _choice(name: str, value, names: tuple):
    if not _is_int(value) or not 0 <= value < len(names):
        options = ", ".join(f"{i} ({n})" for i, n in enumerate(names))
        return ACLNN_ERR_PARAM_INVALID, f"{name}: expected one of {options}, got {value!r}"
    return _OK


def _bool(name: str, value):
    if not _is_bool(value):
        return ACLNN_ERR_PARAM_INVALID, f"{name}: expected a bool, got {type(value).__name__} {value!r}"
    return _OK


def _rank5(name: str, tensor: aclTensor):
    if tensor.array.ndim != 5:
        return (ACLNN_ERR_PARAM_INVALID,
                f"{name}: expected a 5-D tensor, got {tensor.array.ndim}-D with shape {tensor.shape}")
    return _OK


def _equal(name: str, what: str, actual, expected):
    """``actual == expected`` for a named quantity of a named parameter."""
    if tuple(actual) != tuple(expected):
        return ACLNN_ERR_PARAM_INVALID, f"{name}: expected {what} {tuple(expected)}, got {tuple(actual)}"
    return _OK


def _writable(name: str, tensor: aclTensor):
    if not tensor.array.flags.writeable:
        return ACLNN_ERR_PARAM_INVALID, f"{name}: the output array is read-only"
    return _OK


def _first_failure(checks):
    """The first failing (status, message) of a lazy sequence of checks, or ``_OK``.

    Checks are generated lazily so that each may rely on the ones before it having passed.
    """
    for status, message in checks:
        if status != ACLNN_SUCCESS:
            return status, message
    return _OK


def _phase_one(op: str):
    """Decorate a phase-one function: record failures and never raise.

    The wrapped function returns ``(status, message)`` on failure or
    ``(ACLNN_SUCCESS, workspace_size, executor)``.
    """
    def wrap(fn):
        @functools.wraps(fn)
        def phase_one(*args, **kwargs):
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:  # a bug here must still not reach the caller as an exception
                result = ACLNN_ERR_RUNTIME_ERROR, f"internal error: {type(exc).__name__}: {exc}"
            if result[0] != ACLNN_SUCCESS:
                _record(f"{op}: {result[1]}")
                return result[0], 0, None
            return result
        return phase_one
    return wrap


def _execute(op: str, workspace, workspaceSize, executor, stream) -> int:
    """Phase two of every operator: check the launch, run the executor once."""
    status, message = _first_failure(_launch_checks(op, workspace, workspaceSize, executor, stream))
    if status == ACLNN_SUCCESS and not executor._claim():  # used up by another thread meanwhile
        status, message = ACLNN_ERR_PARAM_INVALID, _USED_UP.format(op=op)
    if status == ACLNN_SUCCESS:  # the executor is used up now, even if the run fails
        try:
            executor._run()
        except Exception as exc:
            status, message = (ACLNN_ERR_RUNTIME_ERROR,
                               f"the computation failed: {type(exc).__name__}: {exc}")
    if status != ACLNN_SUCCESS:
        _record(f"{op}: {message}")
    return status


def _buffer_nbytes(buffer):
    """The size of a buffer-protocol object (NumPy array, bytearray ...), else None."""
    try:
        with memoryview(buffer) as view:
            return view.nbytes
    except TypeError:
        return None


_USED_UP = "executor: has already run (an executor runs once; call {op}GetWorkspaceSize again)"


def _launch_checks(op, workspace, workspaceSize, executor, stream):
    yield _not_null({"executor": executor})
    yield _kind({"executor": executor}, aclOpExecutor)
    if executor.op != op:
        yield ACLNN_ERR_PARAM_INVALID, f"executor: was made for {executor.op}, not {op}"
    if executor.used:
        yield ACLNN_ERR_PARAM_INVALID, _USED_UP.format(op=op)
    if stream is not None and not isinstance(stream, aclrtStream):
        yield (ACLNN_ERR_PARAM_INVALID,
               f"stream: expected None or an aclrtStream, got {type(stream).__name__}")
    needed = executor.workspace_size
    if not _is_int(workspaceSize) or workspaceSize < needed:
        yield (ACLNN_ERR_PARAM_INVALID,
               f"workspaceSize: expected at least {needed} bytes (from {op}GetWorkspaceSize), "
               f"got {workspaceSize!r}")
    if needed > 0 and workspace is None:
        yield ACLNN_ERR_PARAM_NULLPTR, f"workspace: is a null pointer (None) but {needed} bytes are needed"
    if workspace is not None:
        nbytes = _buffer_nbytes(workspace)
        if nbytes is None:
            yield (ACLNN_ERR_PARAM_INVALID,
                   f"workspace: expected a buffer from aclrtMalloc, got {type(workspace).__name__}")
        elif nbytes < workspaceSize:
            yield (ACLNN_ERR_PARAM_INVALID,
                   f"workspace: the buffer holds {nbytes} bytes, fewer than workspaceSize {workspaceSize}")


# --- GridSampler3DBackward ----------------------------------------------------------------

_GRID_OP = "aclnnGridSampler3DBackward"


def _grid_sampler_checks(tensors, interpolationMode, paddingMode, alignCorners, outputMask):
    """SPEC §6's first-phase checks of GridSampler3DBackward, in order."""
    yield _not_null(tensors)
    yield _kind(tensors, aclTensor)
    go, inp, grid = tensors["gradOutput"], tensors["input"], tensors["grid"]
    in_grad, grid_grad = tensors["inputGrad"], tensors["gridGrad"]
    yield _supported_dtype("input", inp)
    for name, tensor in tensors.items():
        if name != "input":
            yield _same_dtype(name, tensor, "input", inp)
    for name in ("gradOutput", "input", "inputGrad"):  # volumes; a grid's tag is not read
        yield _volume_format(name, tensors[name])
    yield _choice("interpolationMode", interpolationMode, _INTERPOLATION_MODES)
    yield _choice("paddingMode", paddingMode, _PADDING_MODES)
    yield _bool("alignCorners", alignCorners)
    for name, tensor in tensors.items():
        yield _rank5(name, tensor)
    N, C, D, H, W = inp.logical_shape()
    gN, gC, oD, oH, oW = go.logical_shape()
    yield _equal("gradOutput", "N (input's N)", (gN,), (N,))
    yield _equal("gradOutput", "C (input's C)", (gC,), (C,))
    yield _equal("grid", "N (input's N)", grid.shape[:1], (N,))
    yield _equal("grid", "D, H, W (gradOutput's D, H, W)", grid.shape[1:4], (oD, oH, oW))
    yield _equal("grid", "last dimension (x, y, z)", grid.shape[4:], (3,))
    yield _equal("inputGrad", "shape (N, C, D, H, W) (input's)", in_grad.logical_shape(), (N, C, D, H, W))
    yield _equal("gridGrad", "shape (grid's)", grid_grad.shape, grid.shape)
    if outputMask is not None:
        yield _kind({"outputMask": outputMask}, aclBoolArray)
        yield _equal("outputMask", "size", (len(outputMask),), (2,))
        if outputMask.values[0]:
            yield _writable("inputGrad", in_grad)
        if outputMask.values[1]:
            yield _writable("gridGrad", grid_grad)


@_phase_one(_GRID_OP + "GetWorkspaceSize")
def aclnnGridSampler3DBackwardGetWorkspaceSize(gradOutput, input, grid, interpolationMode,
                                               paddingMode, alignCorners, outputMask,
                                               inputGrad, gridGrad):
    """Phase one of ``aclnnGridSampler3DBackward``: check the arguments, plan the work.

    Parameters
    ----------
    gradOutput : aclTensor, (N, C, Do, Ho, Wo) in its format
        Gradient of the forward's output.
    input : aclTensor, (N, C, Di, Hi, Wi) in its format
        The forward's volume. Its dtype is the call's: every tensor must share it
        (float16, bfloat16, float32 or float64).
    grid : aclTensor, (N, Do, Ho, Wo, 3)
        The forward's sample coordinates (x, y, z).
    interpolationMode : int
        0 bilinear (trilinear), 1 nearest.
    paddingMode : int
        0 zeros, 1 border, 2 reflection.
    alignCorners : bool
    outputMask : aclBoolArray of 2 or None
        Which of inputGrad, gridGrad to compute. None or all-false: nothing is computed.
    inputGrad : aclTensor, shape of input (in its own format)
        Output, written in place by phase two.
    gridGrad : aclTensor, shape of grid
        Output, written in place by phase two.

    Returns
    -------
    (status, workspaceSize, executor)
        ``ACLNN_SUCCESS`` with the bytes of workspace and the executor for phase two;
        on failure ``ACLNN_ERR_PARAM_NULLPTR`` (a None tensor, checked in the order
        gradOutput, input, grid, inputGrad, gridGrad) or ``ACLNN_ERR_PARAM_INVALID``
        (dtypes, formats, modes, ranks, shapes, outputMask size), with ``0, None``.

    Notes
    -----
    An empty input (a zero N, C, Di, Hi, Wi, Do, Ho or Wo) needs no workspace: phase two
    fills the requested gradients with zeros without running a kernel.
    """
    tensors = {"gradOutput": gradOutput, "input": input, "grid": grid,
               "inputGrad": inputGrad, "gridGrad": gridGrad}
    status, message = _first_failure(
        _grid_sampler_checks(tensors, interpolationMode, paddingMode, alignCorners, outputMask))
    if status != ACLNN_SUCCESS:
        return status, message
    mask = outputMask.values if outputMask is not None else (False, False)
    args = (gradOutput, input, grid, _INTERPOLATION_MODES[interpolationMode],
            _PADDING_MODES[paddingMode], bool(alignCorners), mask, inputGrad, gridGrad)
    size = 0
    if any(mask) and not _grid_call_is_empty(input, grid):
        size = _grid_workspace_nbytes(input.logical_shape(), grid.shape, input.dtype,
                                      output_mask=mask)
        # The NumPy API returns new arrays that are copied into the caller's tensors.
        size += (inputGrad.array.nbytes if mask[0] else 0) + (gridGrad.array.nbytes if mask[1] else 0)
    return ACLNN_SUCCESS, size, aclOpExecutor(_GRID_OP, size, functools.partial(_run_grid, *args))


def _grid_call_is_empty(inp, grid) -> bool:
    """No voxels, channels, batch or sample points: every gradient is zero."""
    return inp.array.size == 0 or grid.array.size == 0


def _run_grid(go, inp, grid, mode, padding_mode, align_corners, mask, in_grad, grid_grad):
    if not any(mask):
        return
    if _grid_call_is_empty(inp, grid):  # zero-filled without a kernel (nor workspace)
        if mask[0]:
            in_grad.array[...] = 0
        if mask[1]:
            grid_grad.array[...] = 0
        return
    layout = inp.layout
    grad_output = _layout.physical(go.logical(), layout)  # a view in input's layout
    gi, gg = grid_sample_3d_backward(grad_output, inp.array, grid.array, mode, padding_mode,
                                     align_corners, mask, layout=layout)
    if mask[0]:
        in_grad.logical()[...] = _layout.logical(gi, layout)
    if mask[1]:
        grid_grad.array[...] = gg


def aclnnGridSampler3DBackward(workspace, workspaceSize, executor, stream=None) -> int:
    """Phase two of ``aclnnGridSampler3DBackward``: run the executor once.

    Parameters
    ----------
    workspace : buffer or None
        At least ``workspaceSize`` bytes (``aclrtMalloc``); None when the size is 0.
    workspaceSize : int
        At least the size phase one returned.
    executor : aclOpExecutor
        From ``aclnnGridSampler3DBackwardGetWorkspaceSize``, not run before.
    stream : aclrtStream or None
        None runs on the default stream; the work is done when this returns.

    Returns
    -------
    int
        ``ACLNN_SUCCESS``; ``ACLNN_ERR_PARAM_NULLPTR`` for a None executor or a None
        workspace that is needed; ``ACLNN_ERR_PARAM_INVALID`` for a too-small workspace, a
        used or foreign executor or a bad stream; ``ACLNN_ERR_RUNTIME_ERROR`` if the
        computation fails.
    """
    return _execute(_GRID_OP, workspace, workspaceSize, executor, stream)


# --- UpsampleTrilinear3dBackward ----------------------------------------------------------

_UPSAMPLE_OP = "aclnnUpsampleTrilinear3dBackward"


def _int_array(name: str, array: aclIntArray, axes: str, positive: str):
    """``array`` has one element per letter of ``axes``; those of ``positive`` are > 0."""
    values = array.values
    if len(values) != len(axes):
        return (ACLNN_ERR_PARAM_INVALID,
                f"{name}: expected {len(axes)} elements ({', '.join(axes)}), got {len(values)}: {list(values)}")
    if any(v <= 0 for axis, v in zip(axes, values) if axis in positive):
        return (ACLNN_ERR_PARAM_INVALID,
                f"{name}: expected {', '.join(positive)} > 0, got {list(values)} ({', '.join(axes)})")
    return _OK


def _scale(name: str, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return ACLNN_ERR_PARAM_INVALID, f"{name}: expected a finite number, got {type(value).__name__} {value!r}"
    return _OK


def _upsample_checks(go, outputSize, inputSize, alignCorners, scales, gi):
    """SPEC §6's first-phase checks of UpsampleTrilinear3dBackward, in order (then the
    scalar arguments and the output's writability)."""
    yield _not_null({"gradOut": go, "outputSize": outputSize, "inputSize": inputSize, "gradInput": gi})
    yield _kind({"gradOut": go, "gradInput": gi}, aclTensor)
    yield _kind({"outputSize": outputSize, "inputSize": inputSize}, aclIntArray)
    yield _supported_dtype("gradOut", go)
    yield _volume_format("gradOut", go)
    yield _volume_format("gradInput", gi)
    yield _same_dtype("gradInput", gi, "gradOut", go)
    yield _rank5("gradOut", go)
    yield _int_array("outputSize", outputSize, "DHW", positive="DHW")
    yield _int_array("inputSize", inputSize, "NCDHW", positive="DHW")
    N, C, oD, oH, oW = go.logical_shape()
    yield _equal("gradOut", "N, C (inputSize's)", (N, C), inputSize.values[:2])
    yield _equal("gradOut", "D, H, W (outputSize)", (oD, oH, oW), outputSize.values)
    yield _equal("gradInput", f"shape (inputSize in {gi.layout} order)", gi.shape,
                 _layout.physical_shape(inputSize.values, gi.layout))
    yield _bool("alignCorners", alignCorners)
    for name, value in zip(("scalesD", "scalesH", "scalesW"), scales):
        yield _scale(name, value)
    yield _writable("gradInput", gi)


@_phase_one(_UPSAMPLE_OP + "GetWorkspaceSize")
def aclnnUpsampleTrilinear3dBackwardGetWorkspaceSize(gradOut, outputSize, inputSize, alignCorners,
                                                     scalesD, scalesH, scalesW, gradInput):
    """Phase one of ``aclnnUpsampleTrilinear3dBackward``: check the arguments, plan the work.

    Parameters
    ----------
    gradOut : aclTensor, (N, C, Do, Ho, Wo) in its format
        Gradient of the forward's output; float16, bfloat16, float32 or float64.
    outputSize : aclIntArray of 3
        (Do, Ho, Wo), the forward's output size; each > 0.
    inputSize : aclIntArray of 5
        (N, C, Di, Hi, Wi), the forward's input shape in NCDHW order whatever the formats;
        Di, Hi, Wi > 0.
    alignCorners : bool
    scalesD, scalesH, scalesW : float
        The forward's scale factors; a value <= 0 means "from the sizes" (in / out) on that
        axis. Ignored with alignCorners.
    gradInput : aclTensor, inputSize in its format (N, D, H, W, C for NDHWC)
        Output, gradOut's dtype, written in place by phase two.

    Returns
    -------
    (status, workspaceSize, executor)
        ``ACLNN_SUCCESS`` with the bytes of workspace and the executor for phase two; on
        failure ``ACLNN_ERR_PARAM_NULLPTR`` (a None gradOut, outputSize, inputSize or
        gradInput) or ``ACLNN_ERR_PARAM_INVALID``, with ``0, None``.

    Notes
    -----
    A zero N or C needs no workspace and no work. Unlike the NPU, sizes above 2^20 per
    dimension or 60 GB in all are accepted.
    """
    scales = (scalesD, scalesH, scalesW)
    status, message = _first_failure(
        _upsample_checks(gradOut, outputSize, inputSize, alignCorners, scales, gradInput))
    if status != ACLNN_SUCCESS:
        return status, message
    align_corners, scales = bool(alignCorners), tuple(float(s) for s in scales)
    size = 0
    if gradInput.array.size:
        size = _upsample_workspace_nbytes(gradOut.logical_shape(), inputSize.values, gradOut.dtype,
                                          align_corners, scales, layout=gradInput.layout)
        size += gradInput.array.nbytes  # the NumPy API's result, copied into gradInput
    run = functools.partial(_run_upsample, gradOut, inputSize.values, align_corners, scales,
                            gradInput)
    return ACLNN_SUCCESS, size, aclOpExecutor(_UPSAMPLE_OP, size, run)


def _run_upsample(go, input_size, align_corners, scales, gi):
    if gi.array.size == 0:  # a zero N or C: nothing to compute
        return
    layout = gi.layout
    grad_output = _layout.physical(go.logical(), layout)  # a view in gradInput's layout
    result = upsample_trilinear_3d_backward(grad_output, input_size, align_corners, scales,
                                            layout=layout)
    gi.logical()[...] = _layout.logical(result, layout)


def aclnnUpsampleTrilinear3dBackward(workspace, workspaceSize, executor, stream=None) -> int:
    """Phase two of ``aclnnUpsampleTrilinear3dBackward``: run the executor once.

    Parameters and return values as for ``aclnnGridSampler3DBackward``.
    """
    return _execute(_UPSAMPLE_OP, workspace, workspaceSize, executor, stream)
