"""Which module globals a task's code rebinds, and whether a call rebound one.

The advisor's ``global-write`` finding (Ray's anti-pattern "using global variables to
share state between tasks and actors"): a task or actor method that assigns a module
global (``global counter; counter += 1``) changes the copy in its own worker process
only; the driver, the other workers and the actors never see it.

A worker reads a function's code once, as it loads it (:func:`watch_of`): the names its
``STORE_GLOBAL``/``DELETE_GLOBAL`` instructions bind, in its own code and the code
nested in it (comprehensions, inner functions, which share its globals), and the line of
each. A function whose code binds none (nearly every one) gets no watch, and its calls
pay nothing. For a function that has one, each call takes the identities of those
globals before it runs (:meth:`GlobalWatch.before`) and compares them after
(:meth:`GlobalWatch.changed`), in a wrapper (:func:`watched`) the worker puts in place of
the function: a task's in its function table, an actor method's as it looks it up.

What counts as a change is deliberately narrow, so a correct program is never named: a
global that held a value (present, not None) and was rebound to another object. A first
assignment, from missing or None, is the per-worker cache Ray's guides recommend
(``global model; if model is None: model = load()``) and is left out; so is a write that
binds the same object again. The worker stops watching a function once it reported it.
"""

from __future__ import annotations

import dis
import functools
import inspect
import types
from typing import Any

_UNSET = object()  # a global not defined before the call
_STORES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})


def written_globals(code: types.CodeType) -> dict[str, int]:
    """The globals ``code`` (and the code nested in it) binds or deletes, each with the
    first line that does."""
    found: dict[str, int] = {}
    pending = [code]
    while pending:
        current = pending.pop()
        if current.co_names:  # no name at all: no global can be stored
            for instruction in dis.get_instructions(current):
                if instruction.opname in _STORES and instruction.argval not in found:
                    positions = getattr(instruction, "positions", None)  # Python 3.11+
                    line = positions.lineno if positions is not None else None
                    found[instruction.argval] = line or current.co_firstlineno
        pending.extend(const for const in current.co_consts
                       if isinstance(const, types.CodeType))
    return found


class GlobalWatch:
    """The globals one function's code rebinds, in the namespace its calls run in."""

    __slots__ = ("namespace", "names", "lines", "filename", "function")

    def __init__(self, namespace: dict[str, Any], written: dict[str, int],
                 filename: str, function: str) -> None:
        self.namespace = namespace
        self.names = tuple(written)
        self.lines = written
        self.filename = filename
        self.function = function

    def before(self) -> list[Any]:
        """The objects the watched globals hold now (``_UNSET`` for a missing one)."""
        get = self.namespace.get
        return [get(name, _UNSET) for name in self.names]

    def changed(self, before: list[Any]) -> list[tuple[str, int]]:
        """(name, line) of each watched global a call rebound from a value it held."""
        get = self.namespace.get
        return [(name, self.lines[name]) for name, old in zip(self.names, before)
                if old is not _UNSET and old is not None and get(name, _UNSET) is not old]


def watch_of(fn: Any) -> GlobalWatch | None:
    """A :class:`GlobalWatch` for a plain function (or what a wrapper wraps) whose code
    rebinds a module global, else None."""
    while not isinstance(fn, types.FunctionType):
        inner = getattr(fn, "__func__", None) or getattr(fn, "__wrapped__", None)
        if inner is None or inner is fn:
            return None
        fn = inner
    try:
        written = written_globals(fn.__code__)
    except Exception:  # noqa: BLE001 - unreadable code is simply not watched
        return None
    if not written:
        return None
    code = fn.__code__
    return GlobalWatch(fn.__globals__, written, code.co_filename, fn.__qualname__)


def watches_of_class(cls: type) -> dict[str, GlobalWatch]:
    """Per method name, a watch for each method of ``cls`` (and its bases, but not
    ``object``'s) whose code rebinds a module global."""
    watches: dict[str, GlobalWatch] = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, member in vars(klass).items():
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, types.FunctionType):
                watch = watch_of(member)
                if watch is not None:
                    watches[name] = watch
                else:
                    watches.pop(name, None)  # overridden by a method that writes none
    return watches


def watched(fn: Any, watch: GlobalWatch, report: Any) -> Any:
    """``fn`` (a function, or a bound method) called between ``watch``'s two looks;
    ``report(watch, changed)`` once, at the first call that rebound a global, after
    which the calls go straight to ``fn``. A coroutine function's wrapper awaits it
    between the looks."""
    state: list[GlobalWatch | None] = [watch]

    def look(before: list[Any]) -> None:
        current = state[0]
        if current is not None:
            changed = current.changed(before)
            if changed:
                state[0] = None
                report(current, changed)

    if inspect.iscoroutinefunction(fn):
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            before = state[0].before() if state[0] is not None else []
            try:
                return await fn(*args, **kwargs)
            finally:
                look(before)

        return functools.wraps(fn)(call_async)

    def call(*args: Any, **kwargs: Any) -> Any:
        if state[0] is None:
            return fn(*args, **kwargs)
        before = state[0].before()
        try:
            return fn(*args, **kwargs)
        finally:
            look(before)

    return functools.wraps(fn)(call)
