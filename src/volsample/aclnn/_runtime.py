"""The runtime under both aclnn operators: CANN's objects, status codes and acl* calls.

Tensors (``aclTensor``: a NumPy array and a format tag), int and bool arrays, streams,
the executor phase one makes and phase two runs once, the workspace, the status codes and
the per-thread recent-error message; the argument rules only aclnn has (the shared ones
are ``volsample._checks``'); and the two phases' common frame (``phase_one`` never raises,
``execute`` checks a launch and runs its executor), which turns failed checks into status
codes. Conventions: see the
package's docstring.
"""
from __future__ import annotations

import functools
import numbers
import threading
from collections.abc import Callable, Iterable
from typing import ParamSpec

import numpy as np

from .. import _calls, _config, _dtypes, _layout, _prepared
from .._errors import InvalidArgumentError, VolsampleError

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

FORMAT_NAMES = {
    ACL_FORMAT_UNDEFINED: "ACL_FORMAT_UNDEFINED", ACL_FORMAT_NCHW: "ACL_FORMAT_NCHW",
    ACL_FORMAT_NHWC: "ACL_FORMAT_NHWC", ACL_FORMAT_ND: "ACL_FORMAT_ND",
    ACL_FORMAT_NC1HWC0: "ACL_FORMAT_NC1HWC0", ACL_FORMAT_FRACTAL_Z: "ACL_FORMAT_FRACTAL_Z",
    ACL_FORMAT_NDHWC: "ACL_FORMAT_NDHWC", ACL_FORMAT_FRACTAL_NZ: "ACL_FORMAT_FRACTAL_NZ",
    ACL_FORMAT_NCDHW: "ACL_FORMAT_NCDHW", ACL_FORMAT_NDC1HWC0: "ACL_FORMAT_NDC1HWC0",
}
# The formats UpsampleTrilinear3dBackward accepts for gradOut (CANN's CheckFormat).
VOLUME_FORMATS = (ACL_FORMAT_ND, ACL_FORMAT_NCDHW, ACL_FORMAT_NDHWC)

ACL_DT_UNDEFINED = -1
ACL_FLOAT = 0
ACL_FLOAT16 = 1
ACL_DOUBLE = 11
ACL_BF16 = 27

# The one table of dtypes: NumPy dtype -> (aclDataType, its name). One dtype per call.
DTYPES = {
    _dtypes.FLOAT32: (ACL_FLOAT, "ACL_FLOAT"),
    _dtypes.FLOAT16: (ACL_FLOAT16, "ACL_FLOAT16"),
    _dtypes.FLOAT64: (ACL_DOUBLE, "ACL_DOUBLE"),
    _dtypes.BFLOAT16: (ACL_BF16, "ACL_BF16"),
}

ACL_OPT_DETERMINISTIC = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0

# --- error messages (one per thread, as in CANN) --------------------------------------

_recent = threading.local()


def record(message: str) -> None:
    _recent.message = message


def aclGetRecentErrMsg() -> str | None:
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

    def __init__(self, array: np.ndarray, format: int) -> None:
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
        return DTYPES.get(self.array.dtype, (ACL_DT_UNDEFINED,))[0]

    @property
    def layout(self) -> str:
        """The NumPy API layout a 5-D volume of this format is read in: "NDHWC" for
        ``ACL_FORMAT_NDHWC``, "NCDHW" for any other tag, as CANN's op_api code reads it."""
        return "NDHWC" if self.format == ACL_FORMAT_NDHWC else "NCDHW"

    def logical_shape(self, layout: str | None = None) -> tuple[int, ...]:
        """The shape in (N, C, D, H, W) order (a 5-D tensor), read in ``layout`` (its own
        format's by default)."""
        return _layout.logical_shape(self.shape, layout or self.layout)

    def logical(self, layout: str | None = None) -> np.ndarray:
        """The array as an (N, C, D, H, W) view, read in ``layout`` (its own format's by
        default)."""
        return _layout.logical(self.array, layout or self.layout)

    def __repr__(self):
        return (f"aclTensor(shape={self.shape}, dtype={self.dtype}, "
                f"format={FORMAT_NAMES.get(self.format, self.format)})")


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

    def __init__(self, op: str, workspace_size: int, run: Callable[[], object]) -> None:
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


def is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_bool(value) -> bool:
    # C's implicit conversion lets 0 and 1 stand for bools.
    return isinstance(value, (bool, np.bool_)) or (is_int(value) and value in (0, 1))


def aclCreateTensor(array: np.ndarray, format: int = ACL_FORMAT_ND) -> aclTensor | None:
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
        record(f"aclCreateTensor: array: expected a NumPy array, got {type(array).__name__}")
        return None
    if not is_int(format) or format not in FORMAT_NAMES:
        record(f"aclCreateTensor: format: expected an ACL_FORMAT_* constant, got {format!r}")
        return None
    return aclTensor(array, int(format))


def aclCreateIntArray(values: Iterable[int]) -> aclIntArray | None:
    """An ``aclIntArray`` of ``values`` (integers in int64 range); None if they are not."""
    try:
        items = tuple(values)
    except TypeError:
        items = None
    if items is None or not all(is_int(v) and -2**63 <= v < 2**63 for v in items):
        record(f"aclCreateIntArray: values: expected a sequence of int64 values, got {values!r}")
        return None
    return aclIntArray(int(v) for v in items)


def aclCreateBoolArray(values: Iterable[bool]) -> aclBoolArray | None:
    """An ``aclBoolArray`` of ``values`` (bools, or 0/1); None if they are not."""
    try:
        items = tuple(values)
    except TypeError:
        items = None
    if items is None or not all(is_bool(v) for v in items):
        record(f"aclCreateBoolArray: values: expected a sequence of bools, got {values!r}")
        return None
    return aclBoolArray(bool(v) for v in items)


def aclDestroyTensor(tensor: object = None) -> int:
    """Release a tensor: a no-op (Python frees it), safe on None and repeated calls."""
    return ACL_SUCCESS


def aclDestroyIntArray(array: object = None) -> int:
    """Release an int array: a no-op, safe on None and repeated calls."""
    return ACL_SUCCESS


def aclDestroyBoolArray(array: object = None) -> int:
    """Release a bool array: a no-op, safe on None and repeated calls."""
    return ACL_SUCCESS


def aclDestroyAclOpExecutor(executor: object = None) -> int:
    """Release an executor: a no-op, safe on None and repeated calls."""
    return ACL_SUCCESS


def aclrtMalloc(size: int, policy: int = ACL_MEM_MALLOC_HUGE_FIRST) -> np.ndarray | None:
    """A buffer of ``size`` bytes (a uint8 array), or None if ``size`` is bad or too large.

    The pages are not touched, so an unused buffer costs address space only.
    """
    if not is_int(size) or size < 0:
        record(f"aclrtMalloc: size: expected a non-negative integer, got {size!r}")
        return None
    try:
        return np.empty(int(size), np.uint8)
    except (MemoryError, ValueError) as exc:
        record(f"aclrtMalloc: size: cannot allocate {size} bytes ({exc})")
        return None


def aclrtFree(buffer: object = None) -> int:
    """Release a buffer from ``aclrtMalloc``: a no-op, safe on None and repeated calls."""
    return ACL_SUCCESS


def aclrtCreateStream() -> aclrtStream:
    """A stream to pass to phase two (work runs synchronously on it)."""
    return aclrtStream()


def aclrtSynchronizeStream(stream: object = None) -> int:
    """Wait for a stream's work: already done, since phase two runs synchronously."""
    return ACL_SUCCESS


def aclrtDestroyStream(stream: object = None) -> int:
    """Release a stream: a no-op, safe on None and repeated calls."""
    return ACL_SUCCESS


def aclrtCtxSetSysParamOpt(opt: int, value: int) -> int:
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
    if not is_int(opt) or opt != ACL_OPT_DETERMINISTIC:
        record(f"aclrtCtxSetSysParamOpt: opt: expected ACL_OPT_DETERMINISTIC "
                f"({ACL_OPT_DETERMINISTIC}), got {opt!r}")
        return ACL_ERROR_INVALID_PARAM
    if not is_int(value) or value not in (0, 1):
        record(f"aclrtCtxSetSysParamOpt: value: expected 0 or 1, got {value!r}")
        return ACL_ERROR_INVALID_PARAM
    _config.set_deterministic(bool(value))
    return ACL_SUCCESS


def aclrtCtxGetSysParamOpt(opt: int) -> tuple[int, int]:
    """``(status, value)`` of a system option; see ``aclrtCtxSetSysParamOpt``."""
    if not is_int(opt) or opt != ACL_OPT_DETERMINISTIC:
        record(f"aclrtCtxGetSysParamOpt: opt: expected ACL_OPT_DETERMINISTIC "
                f"({ACL_OPT_DETERMINISTIC}), got {opt!r}")
        return ACL_ERROR_INVALID_PARAM, 0
    return ACL_SUCCESS, int(_config.get_deterministic())


# --- argument checks ---------------------------------------------------------------------
# The rules of volsample's other front doors come from ``volsample._checks`` (dtypes, ranks,
# shapes) and ``volsample._tables`` (CANN's integers); the rules only aclnn has (null
# pointers, the kinds of Python arguments that C's types would guarantee, formats, writable
# outputs) are here. Each raises volsample's exceptions; ``phase_one`` and ``execute`` turn
# them into status codes: ``NullPointerError`` is ACLNN_ERR_PARAM_NULLPTR, any other
# ACLNN_ERR_PARAM_INVALID.


class NullPointerError(InvalidArgumentError):
    """A null pointer (None) where CANN requires an object."""


def _acl_dtype_name(name: str) -> str:
    """A dtype as the aclnn docs name it: NumPy's name and CANN's aclDataType."""
    acl = {dtype.name: acl_name for dtype, (_, acl_name) in DTYPES.items()}.get(name)
    return f"{name} ({acl})" if acl else name


# How aclnn speaks in the shared checks' messages.
ACL = _calls.Dialect(noun="tensor", spell=_acl_dtype_name)


def not_null(named: dict) -> None:
    """The first None of ``named`` (in order) is a null pointer."""
    for name, value in named.items():
        if value is None:
            raise NullPointerError(f"{name}: is a null pointer (None)")


# Python lets any object into any parameter; C's types would not. The phase-one functions
# check these kinds first, then CANN's own checks in CANN's order.

def kind(named: dict, cls: type) -> None:
    """Every value of ``named`` is a ``cls`` (say, an aclTensor rather than a NumPy array)
    or None (a null pointer, for CANN's null checks to report in their turn)."""
    for name, value in named.items():
        if value is not None and not isinstance(value, cls):
            raise InvalidArgumentError(
                f"{name}: expected an {cls.__name__}, got {type(value).__name__}")


def integer(name: str, value) -> None:
    """An int64_t parameter."""
    if not is_int(value) or not -2**63 <= value < 2**63:
        raise InvalidArgumentError(
            f"{name}: expected an integer, got {type(value).__name__} {value!r}")


def boolean(name: str, value) -> bool:
    """A bool parameter (0 and 1 count, as C converts them)."""
    if not is_bool(value):
        raise InvalidArgumentError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def real(name: str, value) -> None:
    """A double parameter: a real number (NaN and infinities included), not a bool."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name}: expected a number, got {type(value).__name__} {value!r}")


def volume_format(name: str, tensor: aclTensor) -> None:
    if tensor.format not in VOLUME_FORMATS:
        raise InvalidArgumentError(
            f"{name}: expected format ACL_FORMAT_ND, ACL_FORMAT_NCDHW or ACL_FORMAT_NDHWC, "
            f"got {FORMAT_NAMES.get(tensor.format, tensor.format)}")


def operand(name: str, tensor: aclTensor, layout: str | None = None) -> _calls.Operand:
    """A tensor as the shared checks take it: its logical shape, read in ``layout`` (its
    own format's by default). Only for 5-D tensors."""
    return _calls.Operand(name, tensor.logical_shape(layout), tensor.dtype)


def writable(name: str, tensor: aclTensor) -> None:
    if not tensor.array.flags.writeable:
        raise InvalidArgumentError(f"{name}: the output array is read-only")


def status_of(error: VolsampleError) -> int:
    return ACLNN_ERR_PARAM_NULLPTR if isinstance(error, NullPointerError) else ACLNN_ERR_PARAM_INVALID


# --- plans: a phase one met before --------------------------------------------------------
# A phase one whose arguments' kinds, formats, shapes, strides, dtypes, writability and
# values (and the thread count) are those of a call that passed before passes the same
# checks and makes the same plan: each operator keeps its plans (in the op layer's
# ``_prepared``) by ``plan``'s key and hands the new call's memory to the plan's prepared
# kernel.


def plan(operator: str, *arguments):
    """(key, plan or None) of a phase one of ``operator`` on its arguments and the thread
    count; the key None where one cannot be a key (a wrong kind of argument: the checks
    then say so)."""
    return _prepared.lookup(operator, *map(_argument_key, arguments), _config.get_num_threads())


def _argument_key(value):
    """What phase one's checks and plan depend on of an argument: a tensor's format,
    shape, strides, dtype and writability; an int or bool array's values; any other
    value with its type (True is not 1)."""
    if type(value) is aclTensor:
        a = value.array
        return aclTensor, value.format, a.shape, a.strides, a.dtype, a.flags.writeable
    if type(value) in (aclIntArray, aclBoolArray):
        return type(value), _calls.typed(value.values)
    return _calls.typed(value)


_P = ParamSpec("_P")


def phase_one(op: str) -> Callable[[Callable[_P, tuple[int, aclOpExecutor]]],
                                   Callable[_P, tuple[int, int, aclOpExecutor | None]]]:
    """Decorate a phase-one function: record failures and never raise.

    The wrapped function returns ``(workspace_size, executor)`` or raises: a failed check
    becomes its status code (``status_of``), anything else ACLNN_ERR_RUNTIME_ERROR; the
    caller gets ``(status, workspace_size, executor)``.
    """
    def wrap(fn: Callable[_P, tuple[int, aclOpExecutor]]
             ) -> Callable[_P, tuple[int, int, aclOpExecutor | None]]:
        @functools.wraps(fn)
        def call(*args: _P.args, **kwargs: _P.kwargs) -> tuple[int, int, aclOpExecutor | None]:
            try:
                return (ACLNN_SUCCESS, *fn(*args, **kwargs))
            except VolsampleError as exc:
                status, message = status_of(exc), str(exc)
            except Exception as exc:  # a bug here must still not reach the caller as an exception
                status, message = ACLNN_ERR_RUNTIME_ERROR, f"internal error: {type(exc).__name__}: {exc}"
            record(f"{op}: {message}")
            return status, 0, None
        return call
    return wrap


def execute(op: str, workspace, workspaceSize, executor, stream) -> int:
    """Phase two of every operator: check the launch, run the executor once."""
    status, message = ACLNN_SUCCESS, ""
    try:
        _check_launch(op, workspace, workspaceSize, executor, stream)
    except VolsampleError as exc:
        status, message = status_of(exc), str(exc)
    if status == ACLNN_SUCCESS and not executor._claim():  # used up by another thread meanwhile
        status, message = ACLNN_ERR_PARAM_INVALID, _USED_UP.format(op=op)
    if status == ACLNN_SUCCESS:  # the executor is used up now, even if the run fails
        try:
            executor._run()
        except Exception as exc:
            status, message = (ACLNN_ERR_RUNTIME_ERROR,
                               f"the computation failed: {type(exc).__name__}: {exc}")
    if status != ACLNN_SUCCESS:
        record(f"{op}: {message}")
    return status


def _buffer_nbytes(buffer):
    """The size of a buffer-protocol object (NumPy array, bytearray ...), else None."""
    try:
        with memoryview(buffer) as view:
            return view.nbytes
    except TypeError:
        return None


_USED_UP = "executor: has already run (an executor runs once; call {op}GetWorkspaceSize again)"


def _check_launch(op, workspace, workspaceSize, executor, stream) -> None:
    not_null({"executor": executor})
    kind({"executor": executor}, aclOpExecutor)
    if executor.op != op:
        raise InvalidArgumentError(f"executor: was made for {executor.op}, not {op}")
    if executor.used:
        raise InvalidArgumentError(_USED_UP.format(op=op))
    if stream is not None and not isinstance(stream, aclrtStream):
        raise InvalidArgumentError(
            f"stream: expected None or an aclrtStream, got {type(stream).__name__}")
    needed = executor.workspace_size
    if not is_int(workspaceSize) or workspaceSize < needed:
        raise InvalidArgumentError(
            f"workspaceSize: expected at least {needed} bytes (from {op}GetWorkspaceSize), "
            f"got {workspaceSize!r}")
    if needed > 0 and workspace is None:
        raise NullPointerError(
            f"workspace: is a null pointer (None) but {needed} bytes are needed")
    if workspace is not None:
        nbytes = _buffer_nbytes(workspace)
        if nbytes is None:
            raise InvalidArgumentError(
                f"workspace: expected a buffer from aclrtMalloc, got {type(workspace).__name__}")
        if nbytes < workspaceSize:
            raise InvalidArgumentError(
                f"workspace: the buffer holds {nbytes} bytes, fewer than workspaceSize "
                f"{workspaceSize}")
