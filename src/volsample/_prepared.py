"""The op layer's prepared calls: the one store of what makes a small call cheap.

A call whose key (its operands' shapes, strides and dtypes, its other arguments, the
thread count: whatever tells it apart) was met before passed the same checks then, and
runs what was worked out then: its checked description (``memoised`` builders), and a
front door's prepared kernel with its results' allocators (``find`` / ``remember``). Every
front door (the NumPy functions and warps, the torch ops, ``volsample.aclnn``) builds its
call's key, led by its ``site`` (which door and op: keys of two sites never meet), and
looks it up once here; a miss runs the op layer's checks and prepares the kernel through
``_backends``, and the door remembers it. One policy bounds the store, and
``forget_prepared_calls`` empties it.
"""
from __future__ import annotations

import atexit
import functools
from collections.abc import Callable

# (site, *key parts) -> a door's prepared call, or (builder, key) -> a checked description
_CALLS: dict = {}

# The calls kept: a training loop's shapes (each call a handful of entries: description,
# forward, backward), many times over. When full, the oldest entry goes (a dict keeps its
# insertion order), not the whole store.
KEPT = 4096

# One lookup: ``find(key)`` is the prepared call of ``key`` or None, for keys that always
# hash (``lookup`` where an argument may not).
find = _CALLS.get


def lookup(*key):
    """(``key``, the prepared call of that key or None), or (None, None) where a part of
    ``key`` cannot be hashed (an argument of a wrong type: the checks then name it).
    ``key`` is (site, *parts): the arguments' own tuple, so that a lookup copies nothing."""
    try:
        return key, _CALLS.get(key)
    except TypeError:
        return None, None


def remember(key, value, store: dict = _CALLS):
    """Keep ``value`` as the prepared call of ``key`` (the oldest entry dropped when
    ``KEPT`` are kept); returns ``value``. ``store``: a prepared call's own calls kept with
    it (a torch forward's eager backwards), under the same policy."""
    if len(store) >= KEPT:
        del store[next(iter(store))]
    store[key] = value
    return value


def kept(site) -> list:
    """The prepared calls of ``site`` (a site string, or a memoised builder) kept (tests)."""
    return [v for k, v in _CALLS.items() if k[0] == site]


def forget_prepared_calls() -> None:
    """Prepare and describe every call afresh (tests: a spy on the preparing functions sees
    them)."""
    _CALLS.clear()


# The prepared kernels go before the extension module does at exit (else nanobind reports
# them as leaked instances).
atexit.register(forget_prepared_calls)


def array_key(a) -> tuple:
    """What a prepared call depends on of a NumPy array: its shape, strides and dtype."""
    return a.shape, a.strides, a.dtype


def _never() -> bool:
    return False


# Whether a compiler is tracing the calls, which then describe afresh: a tracer would
# guard on the store's contents. volsample.torch sets torch.compiler.is_compiling.
tracing: Callable[[], bool] = _never


def memoised(call_key):
    """Decorate a description builder to return the description it built before for
    arguments of the same ``call_key(*args, **kwargs)`` (kept here, led by the builder): a
    call's checks depend on its arguments alone, descriptions are frozen, and building one
    costs microseconds that a small call's kernel does not. A call that fails its checks is
    not remembered (it raises every time); arguments that give no key (unhashable: a list
    of sizes, an array, a symbolic size) build afresh."""
    def decorate(build):
        @functools.wraps(build)
        def described(*args, **kwargs):
            if tracing():
                return build(*args, **kwargs)
            try:
                k = (build, call_key(*args, **kwargs))
                return _CALLS[k]
            except KeyError:
                pass
            except (TypeError, RuntimeError):  # no key
                return build(*args, **kwargs)
            return remember(k, build(*args, **kwargs))
        return described
    return decorate
