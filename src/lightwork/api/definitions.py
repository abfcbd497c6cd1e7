"""What the driver's event log hears of a remote function or actor class being pickled.

A ``RemoteFunction`` or ``ActorClass`` pickles what it wraps once, at its first call;
each ``@remote`` definition is a new object, so a definition repeated in a loop is
pickled again each time. :func:`note_definition` logs each pickling as a
``"define"`` span (``DriverSpan``: the definition's own file and line, the pickle's
size, the time it took; for a pickle of ``LARGE_DEFINITION_BYTES`` or more, the biggest
value it captured), from which the advisor names ``redefined-remote`` and
``large-closure``. This runs once per definition, never per call; without a runtime
(the first call starts one) or with the log off it does nothing.

It also keeps, for the advisor's ``global-changed``, what each shipped function read
from its module's globals when it was pickled (``_Shipped``: a weak ref to the function
and a fingerprint per global: the value itself for a small immutable one, else its
``id`` and a hash of its pickle); :func:`changed_globals`, called by the advisor's
looks, says which the driver has rebound since. The workers run the value they got,
so a rebinding the function's calls never see is Ray's "global variables to share
state" mistake.
"""

from __future__ import annotations

import hashlib
import inspect
import pickle
import threading
import time
import types
import weakref
from typing import Any

from lightwork.kernel.events import DriverSpan

LARGE_DEFINITION_BYTES = 1 << 20
_MEASURED_AT_MOST = 64  # captured values sized, at most


def note_definition(wrapped: Any, nbytes: int, start: float, end: float) -> None:
    """Log the pickling of ``wrapped`` (a function or class) as a ``define`` span."""
    from lightwork.api import core

    backend = core._backend
    holder = backend.run_record() if backend is not None else None
    log = holder.log if holder is not None else None
    if log is None or not log.enabled:
        return
    try:
        note = biggest_capture(wrapped) if nbytes >= LARGE_DEFINITION_BYTES else ""
        site = definition_site(wrapped)
        log.add_span(DriverSpan("define", start, end, 1, threading.get_ident(),
                                callsite=site, nbytes=nbytes, note=note))
        _watch_globals(wrapped, site)
    except Exception as exc:  # noqa: BLE001 - a diagnostic never stops the user's call
        from lightwork.kernel.introspect import report_unraisable

        report_unraisable(exc, "lightwork's advisor could not read a definition", wrapped)


def _functions_of(wrapped: Any) -> list[types.FunctionType]:
    """The Python functions a definition holds: itself, or a class's methods (a
    builtin such as ``time.sleep`` holds none)."""
    if isinstance(wrapped, types.FunctionType):
        return [wrapped]
    if isinstance(wrapped, type):
        return [member for member in vars(wrapped).values()
                if isinstance(member, types.FunctionType)]
    return []


_SMALL = (int, float, complex, str, bytes, bool, type(None))
_HASHED_AT_MOST = 64 << 10  # a global's pickle hashed when at most this big
_WATCHED_AT_MOST = 256  # shipped functions watched, the newest
_shipped: list[_Shipped] = []
_lock = threading.Lock()


class _Shipped:
    """What one shipped function read from its globals when it was pickled."""

    __slots__ = ("function", "name", "site", "values")

    def __init__(self, function: Any, name: str, site: Any,
                 values: dict[str, tuple[Any, ...]]) -> None:
        self.function = weakref.ref(function)
        self.name = name
        self.site = site
        self.values = values


def _fingerprint(value: Any) -> tuple[Any, ...]:
    if type(value) in _SMALL:
        return ("value", value)
    # Only a small container is pickled to fingerprint it: an array or a big one is
    # known by its identity alone (rebinding it is what counts).
    if hasattr(value, "nbytes") or not isinstance(value, (list, tuple, dict, set, frozenset)) \
            or len(value) > 1000:
        return ("id", id(value), None)
    try:
        data = pickle.dumps(value, protocol=5)
    except Exception:
        return ("id", id(value), None)
    digest = hashlib.blake2b(data, digest_size=8).digest() if len(data) <= _HASHED_AT_MOST else None
    return ("id", id(value), digest)


def _same(known: tuple[Any, ...], value: Any) -> bool:
    if known[0] == "value":
        return type(value) in _SMALL and type(value) is type(known[1]) and value == known[1]
    if id(value) == known[1]:
        return True
    return known[2] is not None and _fingerprint(value)[2] == known[2]


def _watch_globals(wrapped: Any, site: Any) -> None:
    for function in _functions_of(wrapped):
        read = {}
        for name in _globals_read(function.__code__):
            if name in function.__globals__:
                value = function.__globals__[name]
                if not isinstance(value, (types.ModuleType, types.FunctionType, type)) \
                        and not callable(value):
                    read[name] = _fingerprint(value)
        if read:
            try:
                shipped = _Shipped(function, str(getattr(wrapped, "__qualname__", "?")),
                                   site, read)
            except TypeError:  # takes no weak reference
                continue
            with _lock:
                _shipped.append(shipped)
                del _shipped[:-_WATCHED_AT_MOST]


def _globals_read(code: types.CodeType) -> set[str]:
    """The global names ``code`` (and the code nested in it) loads: its bytecode's
    LOAD_GLOBAL/LOAD_NAME, not ``co_names`` (which holds attribute names too)."""
    import dis

    names: set[str] = set()
    todo = [code]
    while todo:
        current = todo.pop()
        for instruction in dis.get_instructions(current):
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                names.add(str(instruction.argval))
        todo.extend(const for const in current.co_consts if isinstance(const, types.CodeType))
    return names


def changed_globals() -> list[tuple[str, Any, str, float]]:
    """(function's qualified name, its definition site, the global, when seen) for each
    global a shipped function read that the driver has rebound since; each is said
    once (the advisor's looks call this, off the program's threads)."""
    with _lock:
        watched = list(_shipped)
    found = []
    now = time.monotonic()
    for shipped in watched:
        function = shipped.function()
        if function is None:
            continue
        for name, known in list(shipped.values.items()):
            if name in function.__globals__ and not _same(known, function.__globals__[name]):
                found.append((shipped.name, shipped.site, name, now))
                del shipped.values[name]
    with _lock:
        _shipped[:] = [s for s in _shipped if s.values and s.function() is not None]
    return found


def definition_site(wrapped: Any) -> tuple[str, int, str] | None:
    """(file, line, qualified name) of a function's or class's definition, or None."""
    code = getattr(wrapped, "__code__", None)
    name = str(getattr(wrapped, "__qualname__", None) or getattr(wrapped, "__name__", "?"))
    if code is not None:
        return (str(code.co_filename), int(code.co_firstlineno), name)
    if isinstance(wrapped, type):
        lines = [member.__code__.co_firstlineno for member in vars(wrapped).values()
                 if isinstance(member, types.FunctionType)]
        filename = next((member.__code__.co_filename for member in vars(wrapped).values()
                         if isinstance(member, types.FunctionType)), None)
        if filename is None:
            try:
                filename = inspect.getsourcefile(wrapped)
            except TypeError:
                return None
        if filename is None:
            return None
        return (filename, min(lines) - 1 if lines else 0, name)
    return None


def biggest_capture(wrapped: Any) -> str:
    """"the global `table` (8.0 MB)": the biggest value a function's pickle carries
    with it (closure cells and the module globals it names; for a class, its methods'),
    or "" when none is big."""
    functions = _functions_of(wrapped)
    best: tuple[int, str] = (0, "")
    measured = 0
    for function in functions:
        code = function.__code__
        cells = zip(code.co_freevars, function.__closure__ or ())
        for name, cell in cells:
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            measured += 1
            best = max(best, (_size_of(value), f"the captured variable `{name}`"))
        for name in code.co_names:
            if name in function.__globals__ and measured < _MEASURED_AT_MOST:
                value = function.__globals__[name]
                if isinstance(value, (types.ModuleType, types.FunctionType, type)):
                    continue
                measured += 1
                best = max(best, (_size_of(value), f"the global `{name}`"))
    if best[0] < LARGE_DEFINITION_BYTES // 2:
        return ""
    return f"{best[1]} ({best[0] / (1 << 20):.1f} MB)"


def _size_of(value: Any) -> int:
    size = getattr(value, "nbytes", None)
    if isinstance(size, int):
        return size
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    try:
        return len(pickle.dumps(value, protocol=5))
    except Exception:
        return 0
