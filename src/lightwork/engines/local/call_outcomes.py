"""What a call reads and what its failure becomes, in the worker.

``load_args`` turns a task's stored arguments and the values of its ref arguments into
the call's ``args`` and ``kwargs`` (a ref argument's segment gone from ``/dev/shm`` is
``LostArgument``: the driver rebuilds it and sends the task again). ``error_outcome``
turns a user's exception into the stored ``TaskError`` the caller raises, its traceback
without lightwork's own frames (``user_traceback``). Plain functions, no state: the
task loop (``worker.py``) and the API inside a task (``worker_calls.py``) both use them.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

from lightwork.kernel import exceptions, serialization
from lightwork.kernel.calls import ArgSlot
from lightwork.kernel.serialization import Stored
# Frames in lightwork's own files (worker loop, serialization, the API's plumbing) are
# left out of a remote traceback shown to the user.
from lightwork.kernel.introspect import LIGHTWORK_DIR as _LIGHTWORK_DIR


def user_traceback(exc: BaseException) -> str:
    """``exc``'s traceback (with its chained exceptions) without lightwork's frames.

    A stack made only of lightwork frames (an error in lightwork itself) is kept whole.
    """
    formatted = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    pending = [formatted]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        kept = [f for f in current.stack if not f.filename.startswith(_LIGHTWORK_DIR)]
        if kept and len(kept) != len(current.stack):
            current.stack = traceback.StackSummary.from_list(kept)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return "".join(formatted.format())


def error_outcome(name: str, exc: BaseException) -> Stored:
    """Serialize a user exception as a TaskError (see TaskError for how its cause travels)."""
    try:
        tb = user_traceback(exc)
    except Exception:  # noqa: BLE001 - never lose the error over its formatting
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        return serialization.serialize(exceptions.TaskError(name, tb, exc, os.getpid()), None)
    except Exception:  # noqa: BLE001 - the cause is packed safely; this is a last resort
        return serialization.serialize(exceptions.TaskError(name, tb, None, os.getpid()), None)


class LostArgument(Exception):
    """A ref argument's segment file vanished before the task could read it."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def load_args(args_stored: Stored | bytes, dep_values: Any) -> tuple[list[Any], dict[str, Any]]:
    args, kwargs = serialization.loads(args_stored)
    if dep_values:
        try:
            values = [serialization.loads(stored) for stored in dep_values]
        except FileNotFoundError as exc:
            raise LostArgument(exc.filename) from exc
        args = [values[a.index] if type(a) is ArgSlot else a for a in args]
        for k, v in kwargs.items():
            if type(v) is ArgSlot:
                kwargs[k] = values[v.index]
    return args, kwargs
