"""One ``get``/``wait`` on ObjectRefs seen as a Dask-style run (see ``callbacks.py``).

Graph and keys
--------------
Each unfinished task is a key ``"<function name>-<task id>"`` (so Dask's ``key_split``
groups by function) whose graph entry is a :class:`RemoteCall`; an object that already
exists (``put``, or its task finished) is data: key ``"<name>-<object id>"`` in
``cache``. All unfinished tasks were already handed to the runtime, so ``ready`` stays
empty; ``running`` holds the tasks whose dependencies are finished (queued or running on
a worker — the driver cannot tell which), ``waiting`` the others.

Threads and lock
----------------
``_on_task`` runs in whichever thread applied a result (outside the runtime's lock);
``start`` and ``end`` run in the caller's thread. ``self.lock`` serializes them, so hooks
never run concurrently for one run. ``end`` sweeps the records of tasks that ended but
whose event has not been delivered yet (the node wakes ``get`` before it runs deferred
listeners), then closes the run; a late event finds it closed and is dropped.

Batching: with no per-task hook (``Hooks.per_task`` false), ended records are queued
and applied ``BATCH`` at a time (and at the end), so a progress bar or profiler costs
a list append per task on the runtime's thread, not a state update.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

from lightwork._runtime import introspect
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


class PlainRun:
    def __init__(self, node: Any, kind: str, refs: list[Any], hooks: Hooks) -> None:
        self.node = node
        self.kind = kind
        self.refs = refs
        self.hooks = hooks
        self.lock = threading.RLock()
        self.closed = False
        self.dsk: dict[str, Any] = {}
        self.state: dict[str, Any] = {}
        self.key_of_task: dict[int, str] = {}
        self.records: dict[str, Any] = {}
        self.return_ids: dict[str, tuple[int, ...]] = {}
        self.wanted: set[str] = set()
        self.ref_of: dict[str, Any] = {}
        self.pending: list[tuple[str, Any]] = []
        self.batch: list[tuple[str, Any, Any]] = []
        self.failed: set[str] = set()
        self.listening = False

    # -- the caller's thread ------------------------------------------------------------
    def start(self) -> None:
        if not self.hooks.uses_graph:
            # Every callback ignores the graph (e.g. ResourceProfiler): no per-task work.
            with self.lock:
                self.hooks.start(self.dsk)
                self.state = self._initial_state({})
            return
        objects, tasks = introspect.task_graph_of(self.node, [ref.id for ref in self.refs])
        key_of_task = self.key_of_task
        for task_id, view in tasks.items():
            key_of_task[task_id] = f"{view.name}-{task_id}"
        dsk = self.dsk
        records, return_ids = self.records, self.return_ids
        for task_id, view in tasks.items():
            key = key_of_task[task_id]
            deps = frozenset([key_of_task[t] for t in view.dep_task_ids]) if (
                view.dep_task_ids) else _NO_KEYS
            dsk[key] = RemoteCall(view.name, task_id, deps)
            records[key] = view.record
            return_ids[key] = view.return_ids
        cache: dict[str, Any] = {}
        for ref, obj in zip(self.refs, objects):
            key = key_of_task.get(obj.task_id)
            if key is None:
                key = f"{'put' if obj.task_id == 0 else 'object'}-{obj.object_id}"
                dsk[key] = ref
                cache[key] = ref
            self.wanted.add(key)
            self.ref_of.setdefault(key, ref)
        with self.lock:
            self.hooks.start(dsk)
            self.state = self._initial_state(cache)
            self.hooks.start_state(dsk, self.state)
            if self.hooks.follows_tasks and self.key_of_task:
                self.node.add_task_listener(self._on_task)
                self.listening = True
                for key in sorted(self.state["running"]) if self.hooks.pretask else ():
                    self.hooks.fire_pretask(key, dsk, self.state)
            self._sweep()

    def end(self, failed: bool) -> None:
        if self.listening:
            self.node.remove_task_listener(self._on_task)
        with self.lock:
            self._apply(self._take_pending())
            self._sweep()
            self.closed = True
            self.hooks.finish(self.dsk, self.state, failed)

    # -- any thread ----------------------------------------------------------------------
    def _on_task(self, event: str, record: Any) -> None:
        if event != "ended" or self.closed:
            return
        key = self.key_of_task.get(record.task_id)
        if key is None:
            return
        if not self.hooks.per_task:
            pending = self.pending
            pending.append((key, record))  # atomic; applied in batches
            if len(pending) < BATCH:
                return
        else:
            self.pending.append((key, record))
        with self.lock:
            if not self.closed:
                self._apply(self._take_pending())

    def _take_pending(self) -> list[tuple[str, Any]]:
        pending, self.pending = self.pending, []
        return pending

    # -- under self.lock -----------------------------------------------------------------
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

    def _apply(self, ended: list[tuple[str, Any]]) -> None:
        for key, record in ended:
            self._task_ended(key, record)
        self._flush_batch()

    def _flush_batch(self) -> None:
        if self.batch:
            batch, self.batch = self.batch, []
            self.hooks.fire_posttask_batch(batch, self.dsk, self.state)

    def _sweep(self) -> None:
        """Account for tasks that ended before their event reached this run."""
        state = self.state
        finished, failed = state["finished"], self.failed
        for key, record in self.records.items():
            if record.state in ENDED_STATES and key not in finished and key not in failed:
                self._task_ended(key, record)
        self._flush_batch()

    def _task_ended(self, key: str, record: Any) -> None:
        state = self.state
        if key in state["finished"] or key in self.failed:
            return
        if record.state != "FINISHED":
            # Dask fires no posttask for a task that raised; the error reaches the caller.
            self.failed.add(key)
            state["waiting"].pop(key, None)
            state["running"].discard(key)
            return
        # A task can end before one of its dependencies' events arrived (the runtime
        # delivers events in the order it applied them, but two threads may deliver).
        for dep in sorted(state["waiting"].get(key, ())):
            dep_record = self.records.get(dep)
            if dep_record is not None:
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
                values = [introspect.ready_value(self.node, oid)[1]
                          for oid in self.return_ids[key]]
                result = values[0] if len(values) == 1 else tuple(values)
            hooks.fire_posttask(key, result, dsk, state, record.worker_id, record)
        if hooks.posttask_batch:
            self.batch.append((key, record.worker_id, record))
        if hooks.pretask:
            for dependent in newly_running:
                hooks.fire_pretask(dependent, dsk, state)
