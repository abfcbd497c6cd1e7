"""What the runtime keeps out of CPython's cyclic garbage collector, and how.

Every class instance is tracked by the cyclic collector and visited by its collections:
a young collection visits the objects made since the last one, a full collection every
tracked object in the process (each a cache miss once it has gone cold). A batch of
tasks keeps each task's ref, spec and table entry pending through dozens of
collections, enough to bring a full collection about once a batch; that was a quarter
of the driver's CPU (measured: see bench/HOTPATH.md, "The cyclic collector").

The rule: an object may leave the collector ("untracked") only when it cannot be part
of a reference cycle that becomes garbage; reference counting alone then frees it.
Untracking an object that is in such a cycle leaks everything the cycle reaches. What is
untracked, and why that is safe:

* task records and the event log's rings (``events.py``): a record holds strings,
  numbers, ``None`` and tuples of those; the rings hold records and spans, which cannot
  lead back to them;
* a new task's or call's ref (``_object_ref.fresh_ref``): an ``ObjectRef`` holds one int;
* a task's or an actor call's spec made by the driver (``submit_task``,
  ``submit_actor_task``): it references its arguments, record and ids, nothing that
  leads back to it, except while a task runs: ``spec.worker`` is the ``WorkerSlot``
  whose ``inflight`` queue holds the spec (an actor's calls have no ``worker``). The
  scheduler breaks that cycle whenever a spec leaves the queue (``Scheduler.finish`` and
  ``remove_worker`` set ``worker`` to ``None``), and ``Node.shutdown`` empties every
  slot's queue;
* a table entry (``ObjectTable.create``): it holds its value (bytes or a ``Stored``),
  holders' ids, the spec that can rebuild it, and its waiters, callables that may lead
  to the node and so back to the table; but the waiters leave when the object resolves,
  times out or the runtime shuts down (which resolves every pending object), so a cycle
  through them never outlives the runtime's hold on the entry. An error may carry a
  traceback whose frames hold anything, the entry too: an entry that takes an error
  returns to the collector (``track_again``).

How: Python cannot untrack an object itself. ``lightwork._collector`` (``_collector.c``,
built by ``pip install``/``make``; optional) does it in ~6 ns. Without it, records and
rings are untracked through ``ctypes`` (~170 ns a call, which a record's many fields
repay but a ref, spec or entry does not: ``untrack_hot`` is then ``None`` and they stay
tracked), and where ``ctypes`` cannot reach the C API either, nothing is untracked: the
same runtime, with the collector's cost back. ``LIGHTWORK_PURE_PYTHON=1`` forces the
fallback (the tests run part of the suite that way).

The same module makes the hot path's records, specs and entries (``maker``): a
``dataclass(slots=True)``'s generated ``__init__`` stores every field, three bytecodes
each, though most take their defaults; a ``Maker`` copies the given values and the
defaults into the slots in C, out of the collector from birth where asked (about a
third of the time). Without the module ``maker`` returns the class itself (with the
untracking above where it pays). Its ``RunSummer`` reads records' run times from their
slots the same way, for the advisor's tally (``diagnostics/_measure.py``'s
``RunTally``, whose Python loop is the fallback; ``compiled_module`` hands the module
over).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any, cast


def _compiled() -> Any:
    """``lightwork._collector``, or None where it is not built or the fallback is forced."""
    if os.environ.get("LIGHTWORK_PURE_PYTHON"):
        return None
    try:
        from lightwork import _collector
    except ImportError:
        return None
    return _collector


def maker(cls: type, untrack: Callable[[Any], None] | None) -> Callable[..., Any]:
    """A function making instances of ``cls``, a ``dataclass(slots=True)`` whose fields
    all take plain defaults after the required ones: called with its first fields'
    values by position (at least the required ones), it returns what ``cls(*values)``
    would, taken out of the collector if ``untrack`` is ``keep_out_of_collector`` or
    ``untrack_hot`` (and that does something here)."""
    names: list[str]
    defaults: list[Any]
    names, defaults, required = [], [], 0
    for field in fields(cls):
        if field.default_factory is not MISSING or not field.init:
            raise TypeError(f"maker: {cls.__name__}.{field.name} has no plain default")
        if field.default is MISSING:
            if len(defaults) > required:
                raise TypeError(f"maker: {cls.__name__}.{field.name} is required after a default")
            required += 1
        names.append(field.name)
        defaults.append(None if field.default is MISSING else field.default)
    untracked = untrack is not None and untrack is not _nothing
    if _module is not None:
        return _module.Maker(cls, tuple(names), tuple(defaults), required, untracked)
    if not untracked:
        return cls
    assert untrack is not None  # (untracked says so; once per maker, not per instance)

    def make_untracked(*values: Any) -> Any:
        made = cls(*values)
        untrack(made)
        return made

    return make_untracked


def _ctypes_untrack() -> Callable[[Any], None]:
    """CPython's ``PyObject_GC_UnTrack`` through ``ctypes`` (the GIL held: a
    ``pythonapi`` function), or, where that cannot be reached, a function that does
    nothing."""
    try:
        import ctypes

        untrack = ctypes.pythonapi.PyObject_GC_UnTrack
    except (ImportError, AttributeError, OSError):
        return _nothing
    untrack.argtypes = [ctypes.py_object]
    untrack.restype = None
    return cast(Callable[[Any], None], untrack)


def _nothing(obj: Any) -> None:
    return None


#: Take ``obj`` out of the collector (a record, a ring: see the module docstring).
#: Twice is harmless.
keep_out_of_collector: Callable[[Any], None]
#: The same for the hot path's refs, specs and entries, or ``None`` where it would cost
#: more than it saves (no compiled module).
untrack_hot: Callable[[Any], None] | None
#: Put an untracked object back in the collector (an entry that took an error).
track_again: Callable[[Any], None]
_module = _compiled()
if _module is not None:
    keep_out_of_collector = untrack_hot = _module.untrack
    track_again = _module.track
else:
    keep_out_of_collector, untrack_hot, track_again = _ctypes_untrack(), None, _nothing
#: Whether the compiled module does the work.
COMPILED = _module is not None


def compiled_module() -> Any:
    """``lightwork._collector``, or None where it is not built or the fallback is forced
    (what else it offers: ``diagnostics/_measure.py``'s ``RunTally``)."""
    return _module
