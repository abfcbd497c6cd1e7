"""Running one Dask graph on lightwork: Dask's scheduling policy, lightwork's workers.

The driver keeps Dask's state (``dask/local.py``'s names: ``dependencies``,
``dependents``, ``waiting``, ``waiting_data``, ``cache``, ``ready``, ``running``,
``finished``, ``released``) and hands each ready task to the runtime as a task
``run_graph_node(node, dep_keys, *dep_refs)``. Values never come to the driver: ``cache``
maps a key to the ObjectRef of its value (or, for a literal ``DataNode``, the value or
the ref of its ``put``), and dropping that ref when the key is released frees the value
in the object store as soon as no remaining task needs it.

Task selection: Dask's. Keys are prioritised with ``dask.order.order``; ``ready`` is a
stack, newly ready tasks pushed in reverse priority so the most urgent is popped first
(depth first: finish a branch and free its inputs before opening new ones). At most
``window`` tasks are in flight: enough to keep every worker busy while the driver
reacts to results, few enough that the order above still decides what runs. It starts
at ``2 * workers + 2`` and follows the tasks: a worker stays busy if, while its result
travels back and the next task travels out (the round trip), it has others queued, so
the window is ``workers * (1 + round trip / run time)`` of the latest batch, between
its start and ``MAX_WINDOW_PER_WORKER * workers``. Long tasks keep it small (the order
rules); tiny ones widen it (the round trip would rule).

Events: a task listener on the node (``add_task_listener``) receives batches of ended
tasks, in whichever thread applied them, and puts the ``TaskRecord`` of each task of
this run on its queue; the calling thread takes them off, updates the state and fires
the callbacks, so hooks run in the caller's thread as with Dask. A task can end before
``submit`` has told us its id; the listener parks such records in ``early`` under
``self.lock`` and the submitter collects them.

Aliases run on the driver (the alias's cache entry is its target's ref); their hooks
get the worker id of the task that made the target (``DRIVER_WORKER_ID`` for a literal),
never None. ``DataNode`` values are ``cache`` entries from the start, as in Dask, and no
hook fires for them.

Failure: the first task that fails ends the run; its error is fetched from the object
store, which re-raises the user's exception type with the remote traceback. Tasks still
in flight are abandoned (their refs dropped, so their results are freed on arrival).
``finish`` fires with ``failed=True``.

Progress: each run is in ``running_graphs`` while it runs; the live dashboard reads
``progress()`` of each (the numbers Dask's ``ProgressBar`` shows) from its own thread,
lengths of Dask's containers only, so it never blocks the run.

Inside a worker (a Dask ``get`` nested in a task) there is no node to listen to: the
graph is submitted at once in dependency order and the outputs fetched (no callbacks).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Hashable, Mapping
from typing import Any


from lightwork.api import core as _api
from lightwork.kernel.object_ref import ObjectRef
from lightwork.kernel import pickler
from lightwork.kernel import serialization
from lightwork.dask._execute import run_graph_node, run_task, without_function
from lightwork.dask._graph import needed_subgraph
from lightwork.diagnostics.callbacks import Hooks, dask_state, state_progress

MAX_WINDOW_PER_WORKER = 32
DRIVER_WORKER_ID = 0  # lightwork's workers are numbered from 1; 0 is the driver (owner 0)
_remote_by_name: dict[str, Any] = {}
_remote_lock = threading.Lock()
#: The graphs this process runs now, by id (read by the dashboard's feed).
running_graphs: dict[int, DaskRun] = {}


def _remote_for(name: str) -> Any:
    """The remote ``run_graph_node`` named after the task's key group (for timelines)."""
    remote = _remote_by_name.get(name)
    if remote is None:
        with _remote_lock:
            if not _remote_by_name:
                _remote_by_name[""] = _api.remote(run_graph_node)
            if len(_remote_by_name) > 4096:  # key groups are few; do not grow without bound
                base = _remote_by_name[""]
                _remote_by_name.clear()
                _remote_by_name[""] = base
            remote = _remote_by_name[""].options(name=name)
            _remote_by_name[name] = remote
    return remote


def _alias_target(node: Any) -> Hashable:
    """The key an ``Alias`` names (dask 2024.11–2024.12.0 hold it as a ``TaskRef``)."""
    from dask._task_spec import TaskRef

    target = node.target
    return target.key if isinstance(target, TaskRef) else target


def _group_name(key: Hashable) -> str:
    from dask.utils import key_split

    try:
        return str(key_split(key))
    except Exception:  # noqa: BLE001 - an odd key only loses its pretty name
        return "dask-task"


class DaskRun:
    def __init__(self, node: Any, graph: dict[Hashable, Any], wanted: list[Hashable],
                 hooks: Hooks, workers: int, cache: Mapping[Hashable, Any] | None = None) -> None:
        self.node = node
        self.core = _api._core()
        self.graph = graph
        self.wanted = wanted
        self.results = set(wanted)
        self.hooks = hooks
        self.workers = max(1, workers)
        self.min_window = 2 * self.workers + 2
        self.window = self.min_window
        self.given_cache = dict(cache or {})
        self.state: dict[str, Any] = {}
        self.priority: dict[Hashable, int] = {}
        self.lock = threading.Lock()
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.key_of_task: dict[int, Hashable] = {}
        self.early: dict[int, Any] = {}
        self.worker_of: dict[Hashable, int] = {}  # the worker that made each finished key
        self.inflight: dict[Hashable, ObjectRef] = {}
        # Task functions seen, by id (kept alive here): (function, pickled by value?).
        self.by_value: dict[int, tuple[Any, bool]] = {}
        # (key group, id of a by-value function) -> run_task bound to it, as a remote.
        self.remotes: dict[tuple[str, int], Any] = {}
        self.listening = False
        self.started_at = 0.0

    def progress(self) -> dict[str, Any]:
        """What the run has done so far (any thread: it only reads lengths)."""
        state = self.state
        done, total = state_progress(state)
        return {"name": _group_name(self.wanted[0]) if self.wanted else "dask",
                "keys": len(self.wanted), "done": done, "total": total,
                "running": len(state.get("running", ())), "since": self.started_at}

    # -- the calling thread --------------------------------------------------------------
    def run(self) -> dict[Hashable, Any]:
        hooks, dsk = self.hooks, self.graph
        failed = True
        try:
            hooks.start(dsk)
            needed = needed_subgraph(self.graph, self.wanted)
            self.state = self._initial_state(needed)
            self.started_at = time.monotonic()
            running_graphs[id(self)] = self
            hooks.start_state(dsk, self.state)
            self.node.add_task_listener(self._on_tasks)
            self.listening = True
            state = self.state
            while state["waiting"] or state["ready"] or self.inflight:
                self._fire_tasks()
                if not self.inflight:
                    if state["waiting"] and not state["ready"]:
                        raise ValueError(
                            "found no task that can run in the Dask graph: "
                            f"{len(state['waiting'])} task(s) wait on each other (a cycle?)")
                    continue
                records = [self.queue.get()]
                while True:
                    try:
                        records.append(self.queue.get_nowait())
                    except queue.Empty:
                        break
                keys = [self._task_ended(record) for record in records]
                self._resize_window(records)
                if hooks.posttask_batch:
                    hooks.fire_posttask_batch(EndedBatch(keys, records, dsk), dsk, state)
            values = self._fetch_results()
            failed = False
            return values
        finally:
            running_graphs.pop(id(self), None)
            if self.listening:
                self.node.remove_task_listener(self._on_tasks)
            self.inflight.clear()
            hooks.finish(dsk, self.state, failed)

    def _initial_state(self, needed: dict[Hashable, Any]) -> dict[str, Any]:
        from dask._task_spec import DataNode
        from dask.order import order

        dependencies = {key: set(node.dependencies) for key, node in needed.items()}
        dependents: dict[Hashable, set[Hashable]] = {key: set() for key in needed}
        for key, deps in dependencies.items():
            for dep in deps:
                dependents[dep].add(key)
        cache: dict[Hashable, Any] = {}
        for key, node in needed.items():
            if key in self.given_cache:
                value = self.given_cache[key]
            elif isinstance(node, DataNode):
                value = node()
            else:
                continue
            dependencies[key] = set()
            # A literal read by tasks is stored once, not pickled into every reader.
            cache[key] = _api._core().put(value) if dependents[key] and not isinstance(
                value, ObjectRef) else value
        # (dask types graph keys as its Key union; this module, as Hashable)
        self.priority = order(needed, dependencies=dependencies) if len(needed) > 1 else {  # type: ignore[arg-type, assignment]
            key: 0 for key in needed}
        waiting: dict[Hashable, set[Hashable]] = {}
        ready = []
        for key, deps in dependencies.items():
            if key in cache:
                continue
            pending = deps - cache.keys()
            if pending:
                waiting[key] = pending
            else:
                ready.append(key)
        ready.sort(key=self.priority.__getitem__, reverse=True)
        return dask_state(dependencies, dependents, waiting, cache, ready, set())

    def _fire_tasks(self) -> None:
        from dask._task_spec import Alias

        state, graph, hooks = self.state, self.graph, self.hooks
        ready, cache = state["ready"], state["cache"]
        while ready and len(self.inflight) < self.window:
            key = ready.pop()
            state["running"].add(key)
            hooks.fire_pretask(key, graph, state)
            node = graph[key]
            if isinstance(node, Alias):
                target = _alias_target(node)
                cache[key] = cache[target]
                # The alias's value is its target's: so is its worker (the driver's
                # id when the target is a literal), never None, as Dask gives a thread.
                worker_id = self.worker_of[key] = self.worker_of.get(target, DRIVER_WORKER_ID)
                self._finish_task(key)
                hooks.fire_posttask(key, self._result(key), graph, state, worker_id)
                hooks.fire_posttask_batch([(key, node, worker_id, None)], graph, state)
                continue
            dep_keys = tuple(node.dependencies)
            hooks.fire_presubmit(key, node, dep_keys)
            remote, shipped = self._remote_of(key, node)
            ref = remote.remote(shipped, dep_keys, *[cache[d] for d in dep_keys])
            self.inflight[key] = ref
            hooks.fire_postsubmit(key, node, dep_keys, ref)
            task_id = ref.task_id()
            with self.lock:
                self.key_of_task[task_id] = key
                record = self.early.pop(task_id, None)
            if record is not None:
                self.queue.put(record)

    def _remote_of(self, key: Hashable, node: Any) -> tuple[Any, Any]:
        """The remote function that runs ``node``, and what to send it as the node."""
        from dask._task_spec import Task

        name = _group_name(key)
        if type(node) is not Task:
            return _remote_for(name), node
        func = node.func
        by_value = self.by_value.get(id(func))
        if by_value is None:
            by_value = self.by_value[id(func)] = (
                func, serialization.dumps_by_reference(func) is None)
        if not by_value[1]:
            return _remote_for(name), node
        remote = self.remotes.get((name, id(func)))
        if remote is None:
            try:  # once per function: say which task's function it is if it cannot go
                pickler.dumps(func)
            except Exception as exc:
                raise serialization.SerializationError(
                    f"the function of Dask task {key!r} cannot be sent to the workers: "
                    + serialization.describe_unpicklable(func, exc)) from exc
            remote = _api.remote(functools.partial(run_task, func)).options(name=name)
            self.remotes[(name, id(func))] = remote
        return remote, without_function(node)

    def _resize_window(self, records: list[Any]) -> None:
        run = trip = 0.0
        for record in records:
            run += record.finished - record.started
            trip += (record.seen - record.submitted) - (record.finished - record.started)
        wanted = self.workers * (1 + trip / max(run, 1e-6))
        self.window = int(min(max(wanted, self.min_window),
                              MAX_WINDOW_PER_WORKER * self.workers))

    def _task_ended(self, record: Any) -> Hashable:
        """Apply the end of a task of this run; its key."""
        key = self.key_of_task.pop(record.task_id)
        ref = self.inflight.pop(key)
        state = self.state
        if record.state != "FINISHED":
            self.core.get([ref.id], None)  # raises the task's error, with its traceback
            raise RuntimeError(f"Dask task {key!r} failed: {record.error}")
        state["cache"][key] = ref
        self.worker_of[key] = record.worker_id
        self._finish_task(key)
        if self.hooks.posttask:
            self.hooks.fire_posttask(key, self._result(key), self.graph, state,
                                     record.worker_id, record)
        return key

    def _finish_task(self, key: Hashable) -> None:
        """Dask's bookkeeping for a finished task: ready its dependents, release inputs."""
        state = self.state
        waiting, ready = state["waiting"], state["ready"]
        for dependent in sorted(state["dependents"][key], key=self.priority.__getitem__,
                                reverse=True):
            pending = waiting[dependent]
            pending.discard(key)
            if not pending:
                del waiting[dependent]
                ready.append(dependent)
        waiting_data = state["waiting_data"]
        for dep in state["dependencies"][key]:
            users = waiting_data.get(dep)
            if users is not None:
                users.discard(key)
                if not users and dep not in self.results:
                    del waiting_data[dep]
                    state["released"].add(dep)
                    state["cache"].pop(dep, None)  # the last ref: the store frees the value
        state["finished"].add(key)
        state["running"].discard(key)

    def _result(self, key: Hashable) -> Any:
        if not (self.hooks.posttask and self.hooks.posttask_needs_result):
            return None
        value = self.state["cache"].get(key)
        if isinstance(value, ObjectRef):
            return self.core.get([value.id], None)[0]
        return value

    def _fetch_results(self) -> dict[Hashable, Any]:
        cache = self.state["cache"]
        refs = {key: cache[key] for key in self.results if isinstance(cache[key], ObjectRef)}
        fetched = self.core.get([ref.id for ref in refs.values()], None) if refs else []
        values = dict(zip(refs, fetched))
        for key in self.results:
            if key not in values:
                values[key] = cache[key]
        return values

    # -- any thread ----------------------------------------------------------------------
    def _on_tasks(self, records: list[Any]) -> None:
        with self.lock:
            key_of_task = self.key_of_task
            for record in records:
                if record.task_id in key_of_task:
                    self.queue.put(record)
                elif self.listening:
                    self.early[record.task_id] = record


class EndedBatch:
    """The ``_posttask_batch`` items of tasks that ended together, ``(key, task,
    worker_id, record)`` each, made each time they are read: a hook may keep them and
    read them later (``Profiler`` does), and until then they cost two lists, not a
    tuple a task that the cyclic collector walks while the graph runs (20,000 tasks
    under a ``Profiler``: two more full collections a run)."""

    __slots__ = ("keys", "records", "graph")

    def __init__(self, keys: list[Hashable], records: list[Any], graph: Any) -> None:
        self.keys = keys
        self.records = records
        self.graph = graph

    def __iter__(self) -> Any:
        graph = self.graph
        for key, record in zip(self.keys, self.records):
            yield key, graph[key], record.worker_id, record


def run_nested(graph: dict[Hashable, Any], wanted: list[Hashable]) -> dict[Hashable, Any]:
    """Inside a worker: submit the needed graph in dependency order, fetch the outputs."""
    from dask._task_spec import Alias, DataNode

    core = _api._core()
    needed = needed_subgraph(graph, wanted)
    cache: dict[Hashable, Any] = {}
    visiting: set[Hashable] = set()
    for root in wanted:
        stack: list[tuple[Hashable, bool]] = [(root, False)]
        while stack:
            key, expanded = stack.pop()
            if key in cache:
                continue
            node = needed[key]
            if not expanded:
                if key in visiting:
                    raise ValueError(f"the Dask graph has a cycle through {key!r}")
                visiting.add(key)
                stack.append((key, True))
                stack.extend((dep, False) for dep in node.dependencies if dep not in cache)
                continue
            visiting.discard(key)
            if isinstance(node, DataNode):
                cache[key] = node()
            elif isinstance(node, Alias):
                cache[key] = cache[_alias_target(node)]
            else:
                dep_keys = tuple(node.dependencies)
                cache[key] = _remote_for(_group_name(key)).remote(
                    node, dep_keys, *[cache[d] for d in dep_keys])
    refs = {key: cache[key] for key in set(wanted) if isinstance(cache[key], ObjectRef)}
    fetched = core.get([ref.id for ref in refs.values()], None) if refs else []
    values = dict(zip(refs, fetched))
    for key in wanted:
        values.setdefault(key, cache[key])
    return values
