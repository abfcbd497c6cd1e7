"""What the driver's event log hears of a remote function or actor class being pickled.

A ``RemoteFunction`` or ``ActorClass`` pickles what it wraps once, at its first call;
each ``@remote`` definition is a new object, so a definition repeated in a loop is
pickled (and shipped) again each time. :func:`note_definition` logs each pickling as a
``"define"`` span (``DriverSpan``: the definition's own file and line, the pickle's
size, the time it took; for a pickle of ``LARGE_DEFINITION_BYTES`` or more, the biggest
value it captured), from which the advisor names ``redefined-remote`` and
``large-closure``. This runs once per definition, never per call; without a runtime
(the first call starts one) or with the log off it does nothing.
"""

from __future__ import annotations

import inspect
import pickle
import threading
import types
from typing import Any

from lightwork.kernel.events import DriverSpan

LARGE_DEFINITION_BYTES = 1 << 20
_MEASURED_AT_MOST = 64  # captured values sized, at most


def note_definition(wrapped: Any, nbytes: int, start: float, end: float) -> None:
    """Log the pickling of ``wrapped`` (a function or class) as a ``define`` span."""
    from lightwork.api import core

    backend = core._backend
    # The local runtime's node, or the cluster backend's session record.
    holder = getattr(backend, "node", None) or getattr(backend, "recorder", None)
    log = getattr(holder, "log", None)
    if log is None or not getattr(log, "enabled", False):
        return
    note = biggest_capture(wrapped) if nbytes >= LARGE_DEFINITION_BYTES else ""
    log.add_span(DriverSpan("define", start, end, 1, threading.get_ident(),
                            callsite=definition_site(wrapped), nbytes=nbytes, note=note))


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
    functions = [wrapped] if isinstance(wrapped, types.FunctionType) else [
        member for member in vars(wrapped).values() if isinstance(member, types.FunctionType)]
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
