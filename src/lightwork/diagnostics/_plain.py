"""One ``get``/``wait`` on ObjectRefs seen as a Dask-style run (see ``callbacks.py``).

Graph and keys
--------------
Each unfinished task is a key ``"<function name>-<task id>"`` (so Dask's ``key_split``
groups by function) whose graph entry is a :class:`RemoteCall`; an object that already
exists (``put``, or its task finished) is data: key ``"<name>-<object id>"`` in
``cache``. All unfinished tasks were already handed to the runtime, so ``ready`` stays
empty; ``running`` holds the tasks whose dependencies are finished (queued or running on
a worker — the driver cannot tell which), ``waiting`` the others.

Three kinds of run, by what the callbacks need (``Hooks.run_needs``)
-------------------------------------------------------------------
* ``"nothing"`` (only ``ResourceProfiler``-like callbacks): ``start`` and ``finish``
  with an empty graph; no graph is looked up, nothing happens per task.
* ``"tasks"`` (lightwork's ``ProgressBar``/``Profiler``, which say they read neither the
  graph nor the state): :class:`TaskRun` finds the run's unfinished tasks and keeps the
  records of those that end, in end order — one membership test and one append per
  task. Progress is ``(ended, total)`` from those; the ended tasks' batch for
  ``_posttask_batch`` is handed over as the run finishes, and their keys and graph
  entries are made only as a hook reads it (:class:`FinishedItems`).
* ``"state"`` (any other callback — a user's ``PrintKeys``, ``CacheProfiler``):
  :class:`StateRun` also builds the Dask graph and state and keeps them current task by
  task, firing ``pretask``/``posttask`` as Dask would.

Threads and lock
----------------
The node tells a run of ended tasks in batches (``node.add_task_listener``), in
whichever thread applied them (outside the runtime's lock); ``start`` and ``end`` run in
the caller's thread. ``self.lock`` serializes them, so hooks never run concurrently for
one run. ``start`` registers the listener before it looks the graph up (under the
lock), so no task can end unheard after the lookup; ends of tasks outside the graph
(they were already data) are ignored. ``end`` sweeps the records of tasks that ended but
whose batch has not been delivered yet (the node wakes ``get`` before it runs deferred
listeners), then closes the run; a late batch finds it closed and is dropped.

In a ``StateRun`` with no per-task hook (``Hooks.per_task`` false), ended records are
queued and applied ``BATCH`` at a time (and at the end).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from lightwork.kernel import introspect
from lightwork.diagnostics.callbacks import Hooks, dask_state

ENDED_STATES = ("FINISHED", "FAILED")
BATCH = 256
_NO_KEYS: frozenset[str] = frozenset()


class RemoteCall(NamedTuple):
    """The graph entry of a plain lightwork task: what it runs and what it waits on."""

    name: str
    task_id: int
    dependencies: frozenset[str]

    def __repr__(self) -> str:
        deps = ", ".join(sorted(self.dependencies))
        return f"{self.name}({deps})"


def start_run(node: Any, refs: list[Any], hooks: Hooks) -> Callable[[bool], None]:
    """Start the run of one ``get``/``wait`` on ``refs``; returns its ``end``."""
    needs = hooks.run_needs
    if needs == "nothing":
        hooks.start({})
        return lambda failed: hooks.finish({}, {}, failed)
    run = (TaskRun if needs == "tasks" else StateRun)(node, refs, hooks)
    run.start()
    return run.end


class TaskRun:
    """The run's unfinished tasks and the records of those that ended (end order)."""

    def __init__(self, node: Any, refs: list[Any], hooks: Hooks) -> None:
        self.node = node
        self.refs = refs
        self.hooks = hooks
        self.lock = threading.RLock()
        self.closed = False
        self.tasks: dict[int, Any] = {}  # unfinished task id -> its live TaskRecord
        self.return_ids: dict[int, tuple[int, ...]] = {}  # per task, if a hook reads results
        self.made_by: list[int] = []  # per ref: its task id, 0 for a put, -1 if freed
        self.ended: list[Any] = []  # TaskRecords of the run's tasks, as they ended
        self.dsk: dict[str, Any] = {}
        self.state: dict[str, Any] = {}

    # -- the caller's thread ------------------------------------------------------------
    def start(self) -> None:
        node = self.node
        node.add_task_listener(self._on_ended)
        ids = [ref._id for ref in self.refs]  # (not .id: the property costs 4x)
        with self.lock:
            self.made_by, self.tasks, self.return_ids = node.task_graph_of(
                ids, self.reads_results())
            self._begin()

    def reads_results(self) -> bool:
        """Whether a hook takes the tasks' results (so their ids are looked up)."""
        return False

    def _begin(self) -> None:
        self.hooks.start(self.dsk)
        self.hooks.start_progress(self.progress)

    def end(self, failed: bool) -> None:
        try:
            self.node.settle()  # a cluster run: hear of the tasks that ended by now
        except Exception:  # noqa: BLE001, S110 - the sweep below still ends the run
            pass
        self.node.remove_task_listener(self._on_ended)
        with self.lock:
            self._sweep()
            self.closed = True
            self._close(failed)

    def _close(self, failed: bool) -> None:
        hooks = self.hooks
        if hooks.posttask_batch and self.ended:
            hooks.fire_posttask_batch(FinishedItems(self.ended, self.tasks), self.dsk,
                                      self.state)
        hooks.finish(self.dsk, self.state, failed)

    def progress(self) -> tuple[int, int]:
        """(tasks of the run that ended, tasks in the run)."""
        return len(self.ended), len(self.tasks)

    # -- any thread ----------------------------------------------------------------------
    def _on_ended(self, records: list[Any]) -> None:
        with self.lock:
            if self.closed:
                return
            tasks = self.tasks
            mine = [record for record in records if record.task_id in tasks]
            if mine:
                self._heard(mine)

    # -- under self.lock -----------------------------------------------------------------
    def _heard(self, records: list[Any]) -> None:
        self.ended.extend(records)

    def _sweep(self) -> None:
        """Account for tasks that ended before their batch reached this run."""
        heard = {record.task_id for record in self.ended}
        if len(heard) == len(self.tasks):
            return
        late = [record for task_id, record in self.tasks.items()
                if task_id not in heard and record.state in ENDED_STATES]
        if late:
            late.sort(key=lambda record: record.finished)
            self._heard(late)


def _key_of(tasks: dict[int, Any], task_id: int) -> str:
    return f"{tasks[task_id].name}-{task_id}"


def _call_of(record: Any, tasks: dict[int, Any], key_of: Callable[[int], str]) -> RemoteCall:
    """The graph entry of a task of ``tasks``, its dependencies named by ``key_of``."""
    dep_ids = introspect.unfinished_deps(record, tasks)
    deps = frozenset(map(key_of, dep_ids)) if dep_ids else _NO_KEYS
    # tuple.__new__: RemoteCall(...) would run namedtuple's Python-level __new__
    return tuple.__new__(RemoteCall, (record.name, record.task_id, deps))


class FinishedItems:
    """The ``_posttask_batch`` items of a run's finished tasks, made each time they are
    read: each hook may keep them and read them later (``Profiler`` does), and until then
    they cost a list of records (out of the collector) and the run's task dict, not four
    objects a task. They hold records and names, never ObjectRefs."""

    __slots__ = ("ended", "tasks")

    def __init__(self, ended: list[Any], tasks: dict[int, Any]) -> None:
        self.ended = ended
        self.tasks = tasks

    def __iter__(self) -> Iterator[tuple[str, RemoteCall, int, Any]]:
        tasks = self.tasks
        keys: dict[int, str] = {}  # a dependency's key is made once, not once per dependent

        def key_of(task_id: int) -> str:
            key = keys.get(task_id)
            if key is None:
                key = keys[task_id] = _key_of(tasks, task_id)
            return key

        for record in self.ended:
            if record.state == "FINISHED":
                yield key_of(record.task_id), _call_of(record, tasks, key_of), \
                    record.worker_id, record


class StateRun(TaskRun):
    """A :class:`TaskRun` that also keeps Dask's graph and state, task by task."""

    def __init__(self, node: Any, refs: list[Any], hooks: Hooks) -> None:
        super().__init__(node, refs, hooks)
        self.key_of_task: dict[int, str] = {}
        self.wanted: set[str] = set()
        self.ref_of: dict[str, Any] = {}
        self.pending: list[Any] = []
        self.batch: list[tuple[str, Any, Any, Any]] = []
        self.failed: set[str] = set()

    def _begin(self) -> None:
        key_of_task, dsk, tasks = self.key_of_task, self.dsk, self.tasks
        for task_id in tasks:
            key_of_task[task_id] = _key_of(tasks, task_id)
        for task_id, record in tasks.items():
            dsk[key_of_task[task_id]] = _call_of(record, tasks, key_of_task.__getitem__)
        cache: dict[str, Any] = {}
        for ref, task_id in zip(self.refs, self.made_by):
            key = key_of_task.get(task_id)
            if key is None:
                key = f"{'put' if task_id == 0 else 'object'}-{ref.id}"
                dsk[key] = ref
                cache[key] = ref
            self.wanted.add(key)
            self.ref_of.setdefault(key, ref)
        hooks = self.hooks
        hooks.start(dsk)
        self.state = self._initial_state(cache)
        hooks.start_state(dsk, self.state)
        for key in sorted(self.state["running"]) if hooks.pretask else ():
            hooks.fire_pretask(key, dsk, self.state)

    def reads_results(self) -> bool:
        return self.hooks.posttask_needs_result

    def _close(self, failed: bool) -> None:
        self.hooks.finish(self.dsk, self.state, failed)

    # -- under self.lock -----------------------------------------------------------------
    def _heard(self, records: list[Any]) -> None:
        self.pending.extend(records)
        if self.hooks.per_task or len(self.pending) >= BATCH:
            self._apply_pending()

    def _sweep(self) -> None:
        self._apply_pending()
        super()._sweep()
        self._apply_pending()

    def _apply_pending(self) -> None:
        pending, self.pending = self.pending, []
        self._apply(pending)

    def _initial_state(self, cache: dict[str, Any]) -> dict[str, Any]:
        dependencies: dict[str, Any] = dict.fromkeys(cache, _NO_KEYS)
        dependents: dict[str, Any] = dict.fromkeys(self.dsk, _NO_KEYS)
        waiting: dict[str, set[str]] = {}
        for key, call in self.dsk.items():
            if isinstance(call, RemoteCall):
                deps = call.dependencies
                dependencies[key] = deps
                if deps:
                    waiting[key] = set(deps)
                    for dep in deps:
                        if dependents[dep] is _NO_KEYS:
                            dependents[dep] = set()
                        dependents[dep].add(key)
        running = {key for key in self.key_of_task.values() if key not in waiting}
        return dask_state(dependencies, dependents, waiting, cache, [], running)

    def _apply(self, ended: list[Any]) -> None:
        key_of_task = self.key_of_task
        for record in ended:
            self._task_ended(key_of_task[record.task_id], record)
        if self.batch:
            batch, self.batch = self.batch, []
            self.hooks.fire_posttask_batch(batch, self.dsk, self.state)

    def _task_ended(self, key: str, record: Any) -> None:
        state = self.state
        if key in state["finished"] or key in self.failed:
            return
        self.ended.append(record)
        if record.state != "FINISHED":
            # Dask fires no posttask for a task that raised; the error reaches the caller.
            self.failed.add(key)
            state["waiting"].pop(key, None)
            state["running"].discard(key)
            return
        # A task can end before one of its dependencies' batch arrived (the runtime
        # delivers ends in the order it applied them, but two threads may deliver).
        for dep in sorted(state["waiting"].get(key, ())):
            dep_record = self.tasks[self.dsk[dep].task_id]
            if dep_record.state in ENDED_STATES:
                self._task_ended(dep, dep_record)
        dsk = self.dsk
        state["waiting"].pop(key, None)
        if key not in state["running"]:
            state["running"].add(key)
            self.hooks.fire_pretask(key, dsk, state)
        state["running"].discard(key)
        state["finished"].add(key)
        state["cache"][key] = self.ref_of.get(key)
        newly_running = []
        for dependent in sorted(state["dependents"].get(key, ())):
            pending = state["waiting"].get(dependent)
            if pending is not None:
                pending.discard(key)
                if not pending:
                    del state["waiting"][dependent]
                    state["running"].add(dependent)
                    newly_running.append(dependent)
        for dep in state["dependencies"].get(key, ()):
            users = state["waiting_data"].get(dep)
            if users is not None:
                users.discard(key)
                if not users and dep not in self.wanted:
                    del state["waiting_data"][dep]
                    state["released"].add(dep)
                    state["cache"].pop(dep, None)
        hooks = self.hooks
        if hooks.posttask:
            result = None
            if hooks.posttask_needs_result:
                values = [self.node.ready_value(oid)[1]
                          for oid in self.return_ids[record.task_id]]
                result = values[0] if len(values) == 1 else tuple(values)
            hooks.fire_posttask(key, result, dsk, state, record.worker_id, record)
        if hooks.posttask_batch:
            self.batch.append((key, dsk[key], record.worker_id, record))
        if hooks.pretask:
            for dependent in newly_running:
                hooks.fire_pretask(dependent, dsk, state)
