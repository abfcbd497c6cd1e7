"""Scheduler callbacks in Dask's shape, for Dask graphs and for plain lightwork tasks.

The protocol
------------
A :class:`Callback` has up to five hooks, with Dask's signatures::

    start(dsk)                                   before the run's state exists
    start_state(dsk, state)                      the state, once built
    pretask(key, dsk, state)                     a task became runnable and was handed on
    posttask(key, result, dsk, state, worker_id) a task ended; worker_id is lightwork's
    finish(dsk, state, failed)                   always, also when the run raised

given as keyword arguments or as ``_start``/``_start_state``/... methods of a subclass.
Two more, lightwork's (as Ray's Dask callbacks have), fire in a Dask graph run as the
scheduler hands each task to the runtime — not for aliases, which run on the driver, and
not in plain runs, whose tasks were submitted before the ``get``::

    presubmit(key, task, dependencies)           about to submit ``task`` (the graph node)
    postsubmit(key, task, dependencies, ref)     submitted; ``ref`` is its ObjectRef
``state`` has Dask's keys (``dependencies``, ``dependents``, ``waiting``,
``waiting_data``, ``cache``, ``ready``, ``running``, ``finished``, ``released``); its
``cache`` holds ObjectRefs (or literals), not values: values stay in the object store.

Which callbacks are active (thread safety)
------------------------------------------
Dask keeps one global set and empties it while a scheduler runs, so two threads that
compute at once lose or share each other's callbacks. Here:

* ``with cb:`` activates ``cb`` for the current thread (a ``ContextVar``): another
  thread's computation does not see it;
* ``cb.register()`` activates it for every thread until ``cb.unregister()``;
* a run does not fire the callbacks of a run already in progress in the same thread
  (Dask's "outermost scheduler only" rule), except callbacks passed explicitly.

Both forms also add the hooks to ``dask.callbacks.Callback.active`` when dask is
imported, so code that only changed its imports from ``dask.diagnostics`` still sees
progress under Dask's own schedulers; lightwork's ``get`` skips those entries (it has
its own record of them) and honours every other entry there, e.g. ``dask.diagnostics``
objects.

Runs of plain tasks
-------------------
While any callback is active, an observer sits on ``lightwork.get``/``wait`` (see
``lightwork.kernel.introspect.blocking_observers``). A ``get`` or ``wait`` with active
callbacks in its thread is one run: the graph is the requested refs' tasks and every
unfinished task they depend on (through top-level ref arguments); objects already
made (``put``, finished tasks) are data in ``cache``. ``pretask`` fires when a task's
dependencies are all finished (lightwork queued it then), ``posttask`` when the node
reports it ended, in the thread that saw the result (the runtime's I/O thread or the
blocked caller), serialized by the run's lock. ``finish`` fires in the caller's thread
as ``get`` returns, after every task that ended before it was accounted for, so a
progress bar reaches 100% exactly then.

Timing from the worker
----------------------
While ``posttask`` hooks run, :func:`current_task_record` returns the task's
``TaskRecord`` (start/finish times stamped by the worker, worker id); foreign hooks just
see Dask's arguments.

lightwork's own diagnostics (an extension of the protocol)
-----------------------------------------------------------
lightwork's runs know more than Dask's hooks can carry, and its own diagnostics use it
to cost (almost) nothing per task:

* ``_posttask_batch(items, dsk, state)``, an iterable of ``(key, task, worker_id,
  TaskRecord)``, replaces ``_pretask``/``_posttask`` under lightwork's schedulers: a run
  hands over ended tasks in batches (Dask's schedulers still call the per-task hooks).
  Every hook gets the same ``items``, which it may keep and read later, as often as it
  likes (``Profiler`` does): the runs make the tuples anew each time they are iterated
  (a plain run makes each item's key and graph entry only then);
* ``_start_progress(progress)`` replaces ``_start_state``: ``progress()`` returns
  ``(tasks ended, tasks in the run)`` at any moment, from any thread;
* ``_run_needs`` says what the run must build (see :class:`Callback`): a plain ``get``
  whose callbacks all say "tasks" keeps no Dask state (``ProgressBar``, ``Profiler``),
  one whose callbacks all say "nothing" not even a graph (``ResourceProfiler``).

Cost
----
See ``_plain.py`` for what each kind of plain run does per task; a Dask graph run keeps
its state anyway, so there the extensions only save the per-task calls.
"""

from __future__ import annotations

import contextvars
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from lightwork.kernel import introspect

__all__ = ["Callback", "add_callbacks", "current_task_record"]

HOOKS = ("_start", "_start_state", "_pretask", "_posttask", "_finish")
SUBMIT_HOOKS = ("_presubmit", "_postsubmit")  # lightwork's additions (Dask graph runs)

_lock = threading.Lock()
_registered: list[Callback] = []
_entered: contextvars.ContextVar[tuple[Callback, ...]] = contextvars.ContextVar(
    "lightwork_entered_callbacks", default=())
_in_run: contextvars.ContextVar[bool] = contextvars.ContextVar("lightwork_in_run", default=False)
_active_count = 0  # entered (any thread) + registered; the get/wait observer is on while > 0
_dask_tuples: dict[tuple[Any, ...], int] = {}  # our hook tuples put into dask's active set
_current = threading.local()


class Callback:
    """Hooks called as a computation runs; see the module docstring for the protocol."""

    # posttask hooks get the task's value unless they say they don't need it (fetching
    # every value to the driver would cost a copy per task).
    _posttask_needs_result = True
    # What a lightwork run must build for this callback: "state" (Dask's graph and
    # state, kept current task by task), "tasks" (the run's tasks and their ends only;
    # the hooks read neither ``dsk`` nor ``state``) or "nothing" (no graph at all).
    _run_needs = "state"

    def __init__(
        self,
        start: Callable[..., Any] | None = None,
        start_state: Callable[..., Any] | None = None,
        pretask: Callable[..., Any] | None = None,
        posttask: Callable[..., Any] | None = None,
        finish: Callable[..., Any] | None = None,
        *,
        presubmit: Callable[..., Any] | None = None,
        postsubmit: Callable[..., Any] | None = None,
    ) -> None:
        given = (start, start_state, pretask, posttask, finish, presubmit, postsubmit)
        for name, hook in zip(HOOKS + SUBMIT_HOOKS, given):
            if hook is not None:
                if not callable(hook):
                    raise TypeError(f"Callback({name[1:]}=...) must be callable, got {hook!r}")
                setattr(self, name, hook)

    @property
    def _callback(self) -> tuple[Callable[..., Any] | None, ...]:
        """Dask's 5-tuple form of these hooks."""
        return tuple(getattr(self, name, None) for name in HOOKS)

    def __enter__(self) -> Callback:
        _activate(self)
        _entered.set(_entered.get() + (self,))
        return self

    def __exit__(self, *exc: Any) -> None:
        current = _entered.get()
        if self in current:
            index = len(current) - 1 - current[::-1].index(self)
            _entered.set(current[:index] + current[index + 1:])
            _deactivate(self)

    def register(self) -> None:
        """Fire for every computation in every thread, until :meth:`unregister`."""
        with _lock:
            if any(cb is self for cb in _registered):
                return
            _registered.append(self)
        _activate(self)

    def unregister(self) -> None:
        with _lock:
            for index, cb in enumerate(_registered):
                if cb is self:
                    del _registered[index]
                    break
            else:
                return
        _deactivate(self)


class add_callbacks:  # noqa: N801 - Dask's name
    """Activate several callbacks (objects or Dask 5-tuples) for a ``with`` block."""

    def __init__(self, *callbacks: Callback | tuple[Any, ...]) -> None:
        self.callbacks = [as_callback(cb) for cb in callbacks]

    def __enter__(self) -> None:
        for cb in self.callbacks:
            cb.__enter__()

    def __exit__(self, *exc: Any) -> None:
        for cb in reversed(self.callbacks):
            cb.__exit__(*exc)


def as_callback(cb: Any) -> Callback:
    """A lightwork Callback for ``cb`` (ours, dask's, or a 5-tuple of hooks)."""
    if isinstance(cb, Callback):
        return cb
    if isinstance(cb, tuple):
        if len(cb) != 5:
            raise TypeError(f"a callback tuple has 5 hooks (start, start_state, pretask, "
                            f"posttask, finish), got {len(cb)}: {cb!r:.80}")
        return Callback(*cb)
    hooks = getattr(cb, "_callback", None)
    if isinstance(hooks, tuple) and len(hooks) == 5:
        return Callback(*hooks)
    raise TypeError(f"callbacks must be Callback objects or 5-tuples of hooks, got "
                    f"{type(cb).__name__}: {cb!r:.80}")


def current_task_record() -> Any:
    """The ``TaskRecord`` of the task whose ``posttask`` hooks are running, else None."""
    return getattr(_current, "record", None)


# -- activation ---------------------------------------------------------------------------
def _activate(cb: Callback) -> None:
    global _active_count
    with _lock:
        _active_count += 1
        if _active_count == 1 and _observe_blocking not in introspect.blocking_observers:
            introspect.blocking_observers.append(_observe_blocking)
        dask_active = _dask_active_set()
        if dask_active is not None:
            hooks = cb._callback
            _dask_tuples[hooks] = _dask_tuples.get(hooks, 0) + 1
            dask_active.add(hooks)


def _deactivate(cb: Callback) -> None:
    global _active_count
    with _lock:
        _active_count = max(0, _active_count - 1)
        if _active_count == 0 and _observe_blocking in introspect.blocking_observers:
            introspect.blocking_observers.remove(_observe_blocking)
        hooks = cb._callback
        count = _dask_tuples.get(hooks, 0)
        if count:
            if count == 1:
                del _dask_tuples[hooks]
                dask_active = _dask_active_set()
                if dask_active is not None:
                    dask_active.discard(hooks)
            else:
                _dask_tuples[hooks] = count - 1


def _dask_active_set() -> set[Any] | None:
    if "dask" not in sys.modules:
        return None  # no dask scheduler can run without dask imported; never import it here
    try:
        from dask.callbacks import Callback as DaskCallback
    except ImportError:
        return None
    return DaskCallback.active


def active_callbacks(explicit: Iterable[Any] | None = None) -> list[Callback]:
    """The callbacks a run starting now in this thread fires, in activation order.

    ``explicit`` (Dask's ``callbacks=`` argument) replaces the active ones, as in Dask.
    """
    if explicit is not None:
        return [as_callback(cb) for cb in explicit]
    chosen: list[Callback] = []
    if _in_run.get():
        return chosen
    seen = {id(cb) for cb in chosen}
    with _lock:
        candidates = list(_registered)
        ours = set(_dask_tuples)
    candidates += _entered.get()
    for cb in candidates:
        if id(cb) not in seen:
            seen.add(id(cb))
            chosen.append(cb)
    dask_active = _dask_active_set()
    if dask_active:
        for hooks in tuple(dask_active):
            if hooks not in ours:
                chosen.append(Callback(*hooks))
    return chosen


# -- firing -------------------------------------------------------------------------------
def dask_state(
    dependencies: dict[Any, Any], dependents: dict[Any, Any], waiting: dict[Any, set[Any]],
    cache: dict[Any, Any], ready: list[Any], running: set[Any],
) -> dict[str, Any]:
    """The ``state`` a run hands to callbacks, with Dask's keys (one shape for both runs)."""
    return {
        "dependencies": dependencies,
        "dependents": dependents,
        "waiting": waiting,
        "waiting_data": {key: set(dents) for key, dents in dependents.items() if dents},
        "cache": cache,
        "ready": ready,
        "running": running,
        "finished": set(),
        "released": set(),
    }


def state_progress(state: dict[str, Any] | None) -> tuple[int, int]:
    """(tasks finished, tasks in the run) of a Dask-shaped ``state``."""
    if not state:
        return 0, 0
    done = len(state["finished"])
    return done, done + len(state["ready"]) + len(state["waiting"]) + len(state["running"])


#: What a lightwork run builds for its callbacks, least first (``Callback._run_needs``).
RUN_NEEDS = ("nothing", "tasks", "state")


class Hooks:
    """The hooks of one run's callbacks, called in Dask's order with Dask's arguments."""

    def __init__(self, callbacks: list[Callback]) -> None:
        self.callbacks = callbacks
        # lightwork's own profilers take ended tasks in batches (``_posttask_batch``):
        # lightwork's runs call neither their ``_pretask`` nor their ``_posttask``.
        batched = [cb for cb in callbacks if getattr(cb, "_posttask_batch", None) is not None]
        self.posttask_batch = [cb._posttask_batch for cb in batched]  # type: ignore[attr-defined]
        per_task = [cb for cb in callbacks if not any(cb is b for b in batched)]
        self.pretask = [h for cb in per_task if (h := getattr(cb, "_pretask", None))]
        posttask = [(h, cb._posttask_needs_result) for cb in per_task
                    if (h := getattr(cb, "_posttask", None))]
        self.posttask = [h for h, _ in posttask]
        self.posttask_needs_result = any(needs for _, needs in posttask)
        self.per_task = bool(self.pretask or self.posttask)
        self.presubmit = [h for cb in callbacks if (h := getattr(cb, "_presubmit", None))]
        self.postsubmit = [h for cb in callbacks if (h := getattr(cb, "_postsubmit", None))]
        self.run_needs = max((getattr(cb, "_run_needs", "state") for cb in callbacks),
                             key=RUN_NEEDS.index, default="nothing")
        self.started: list[Callback] = []
        self._token: contextvars.Token[bool] | None = None

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def start(self, dsk: Any) -> None:
        self._token = _in_run.set(True)
        for cb in self.callbacks:
            hook = getattr(cb, "_start", None)
            if hook is not None:
                hook(dsk)
            self.started.append(cb)

    def start_state(self, dsk: Any, state: dict[str, Any]) -> None:
        """``_start_state``, or ``_start_progress`` with the state's progress if defined."""
        for cb in self.callbacks:
            if getattr(cb, "_start_progress", None) is not None:
                cb._start_progress(lambda: state_progress(state))  # type: ignore[attr-defined]
                continue
            hook = getattr(cb, "_start_state", None)
            if hook is not None:
                hook(dsk, state)

    def start_progress(self, progress: Callable[[], tuple[int, int]]) -> None:
        """For a run that keeps no Dask state: ``_start_progress`` hooks only."""
        for cb in self.callbacks:
            hook = getattr(cb, "_start_progress", None)
            if hook is not None:
                hook(progress)

    def fire_pretask(self, key: Any, dsk: Any, state: dict[str, Any]) -> None:
        for hook in self.pretask:
            hook(key, dsk, state)

    def fire_presubmit(self, key: Any, task: Any, dependencies: tuple[Any, ...]) -> None:
        for hook in self.presubmit:
            hook(key, task, dependencies)

    def fire_postsubmit(self, key: Any, task: Any, dependencies: tuple[Any, ...],
                        ref: Any) -> None:
        for hook in self.postsubmit:
            hook(key, task, dependencies, ref)

    def fire_posttask(self, key: Any, result: Any, dsk: Any, state: dict[str, Any],
                      worker_id: Any, record: Any = None) -> None:
        _current.record = record
        try:
            for hook in self.posttask:
                hook(key, result, dsk, state, worker_id)
        finally:
            _current.record = None

    def fire_posttask_batch(self, items: Iterable[tuple[Any, Any, Any, Any]], dsk: Any,
                            state: dict[str, Any]) -> None:
        for hook in self.posttask_batch:
            hook(items, dsk, state)

    def finish(self, dsk: Any, state: dict[str, Any], failed: bool) -> None:
        try:
            for cb in self.started:
                hook = getattr(cb, "_finish", None)
                if hook is not None:
                    hook(dsk, state, failed)
        finally:
            if self._token is not None:
                try:
                    _in_run.reset(self._token)
                except ValueError:  # finished in another context than it started
                    _in_run.set(False)
                self._token = None


def _observe_blocking(kind: str, refs: list[Any]) -> Callable[[bool], None] | None:
    callbacks = active_callbacks()
    if not callbacks:
        return None
    from lightwork.api import core as _api

    # On the cluster this is its event log (``cluster_record.ClusterLog``); on a backend
    # that records no run it raises UnsupportedOnBackend, which the hook reports on
    # stderr: the callbacks never silently show nothing.
    node = _api.run_record("Dask-style callbacks (ProgressBar, Profiler, ...)")
    if node is None:
        return None  # inside a worker: the driver's callbacks do not follow nested calls
    from lightwork.diagnostics._plain import start_run

    return start_run(node, refs, Hooks(callbacks))
