"""The state API's listings on the distributed backend: actors, workers, objects,
memory and status, as the same rows ``kernel/views.py`` makes on the embedded runtime.

Where each fact comes from
--------------------------
* The cluster's scheduler, in one ``client.run_on_scheduler`` round trip
  (:func:`scheduler_facts`): every worker (address, pid, threads, resources, the keys it
  is processing, the bytes it holds, and its own CPU/memory metrics, which each worker
  measures and sends with its heartbeats), and the state, size and holders of the keys
  this driver asked about.
* The workers themselves, through ``client.run`` (:func:`worker_started`): when each
  worker process started, for ``alive_s``.
* The driver's own tables (``DistributedBackend``: the refs it holds, its actors) and
  the event log (``ClusterLog``: live and ended tasks).

Fields mean what they mean locally; where the cluster differs:

* ``worker_id`` is the row number the event log gives each cluster worker (the
  ``worker_id`` of its tasks in ``list_tasks``), ``pid`` the worker process's pid on its
  machine, and every row carries the worker's ``address``. A Dask worker runs tasks and
  actors alike, so its ``kind`` is ``"task"``; actors are listed by ``list_actors`` with
  the ``pid``/``worker_id`` of their worker.
* Live task states come from the scheduler: ``waiting`` (for an argument) is
  ``PENDING_ARGS_AVAIL``; ``processing`` (sent to a worker) is ``RUNNING`` when the
  worker runs it (its ``executing``, from the worker's heartbeats, or no more tasks sent
  to it than it has threads), ``RUNNING_IN_RAY_GET`` when it seceded (blocked in a
  nested ``get``/``wait``), and ``SUBMITTED_TO_WORKER`` while it waits there for a
  thread; other pre-run states are ``PENDING_NODE_ASSIGNMENT`` (for the oldest
  ``MAX_REFRESHED`` live tasks; later ones show ``SUBMITTED_TO_WORKER``). An actor
  call is ``SUBMITTED_TO_WORKER`` until its report arrives (calls bypass the scheduler).
* Objects are this session's: the refs the driver holds, and those its tasks and
  actors hold on the workers, asked of each worker process in one ``client.run``
  (``cluster_worker.held_refs``). A worker process serves every driver of the cluster,
  so its refs are tagged with the session of the task or actor call that made or
  borrowed them (``cluster_worker.SessionFutures``: in the actor's constructor and calls,
  and in a task, whose arguments' refs are tagged once unpickled). Each row has its
  ``owner`` (the process that made the ref, from the id's process prefix: ``driver`` or
  ``worker N``, N as ``list_workers`` numbers the cluster workers), its ``holders``,
  its size and the workers storing it (``location``: ``"worker tcp://…"``). The refs
  inside a task's result that the task's worker keeps with the result's key
  (``cluster_plugin.ExportedRefs``) are listed too, as ``CAPTURED_IN_OBJECT`` with
  ``contained_in`` counting those results (no holder, if nothing else holds them); a
  generator's items read by a task are tagged with that task's session by its consumer
  thread. Not listed: refs held only by a ``put`` value, one of several returns, a
  generator's item or an actor result that contains them (``cluster_holds``), refs in a
  worker that does not answer, and other drivers' objects (a session lists its own). There is no object store or shared memory of
  lightwork's: those sums are 0 and ``store`` is None.
* Actors are this session's: those the driver created (``owner`` "driver") and those
  its tasks and actors created on the workers (``owner`` "worker N", while a handle to
  them lives in that process; their ``running``/``queued`` are None: their callers'
  calls in flight are not in the driver's log). A named actor of another driver is
  found with ``get_actor``, not listed. ``restarts`` and ``RESTARTING`` come from the
  owner, which decides its actors' restarts (``cluster_actor_calls``).
"""

from __future__ import annotations

import itertools
import operator
import os
import time
from collections import Counter
from typing import Any

from lightwork.kernel.object_ref import PROCESS_ID_SHIFT

ALIVE_STATUSES = ("running", "paused", "init")
_ACTOR_OF = operator.attrgetter("actor_id")
MAX_REFRESHED = 20_000  # live tasks whose state one listing asks the scheduler for


def scheduler_facts(dask_scheduler: Any = None, keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """What the scheduler knows of its workers and of ``keys`` (run on the scheduler)."""
    workers = {}
    for address, ws in dask_scheduler.workers.items():
        metrics = dict(getattr(ws, "metrics", None) or {})
        processing = [str(ts.key) for ts in list(ws.processing)[:8]]
        # Threads taken by tasks that ask for no CPU resource (num_cpus <= 1, see
        # cluster_tasks): they count as one CPU each, as the driver submitted them.
        # (A seceded task, blocked in a nested get, holds no thread.)
        unrestricted = sum(1 for ts in itertools.islice(ws.processing, 4 * ws.nthreads + 8)
                           if "CPU" not in (ts.resource_restrictions or {})
                           and ts not in ws.long_running)
        workers[address] = {
            "pid": getattr(ws, "pid", 0), "nthreads": ws.nthreads,
            "status": str(getattr(ws.status, "name", ws.status)),
            "resources": dict(ws.resources), "processing": processing,
            "processing_count": len(ws.processing), "nbytes": ws.nbytes,
            "cpu": metrics.get("cpu"), "memory": metrics.get("memory"),
            "used_resources": {k: float(v) for k, v in ws.used_resources.items() if v},
            "unrestricted_busy": min(unrestricted, ws.nthreads),
        }
    tasks = {}
    for key in keys:
        ts = dask_scheduler.tasks.get(key)
        if ts is None:
            continue
        ws = ts.processing_on
        processing_on = ws.address if ws is not None else None
        state = ts.state
        if ws is not None:  # sent to a worker: does it run, or wait there for a thread?
            if ts in ws.long_running:
                state = "seceded"  # blocked in a nested get/wait (cluster_fetch)
            elif not (ts in getattr(ws, "executing", ()) or len(ws.processing) <= ws.nthreads):
                state = "assigned"  # (executing comes with the worker's heartbeats)
        tasks[key] = {
            "state": state, "nbytes": ts.nbytes if ts.nbytes and ts.nbytes > 0 else 0,
            "who_has": sorted(ws.address for ws in ts.who_has or ()),
            "processing_on": processing_on,
            "pending_dependents": sum(1 for d in ts.dependents
                                      if d.state not in ("memory", "erred", "forgotten")),
        }
    return {"workers": workers, "tasks": tasks}


def worker_started(dask_worker: Any = None) -> tuple[int, float]:
    """(pid, process start time) of this worker (run by ``client.run``)."""
    import psutil

    return os.getpid(), psutil.Process().create_time()



def resource_use(workers: dict[str, Any]) -> dict[str, list[float]]:
    """``{name: [used, total]}`` over the workers of :func:`scheduler_facts`.

    A worker offers its declared resources, and ``CPU`` as many as its threads unless it
    declares ``CPU``. What its running tasks take: their resource restrictions, plus one
    CPU per thread running a task that asks for no CPU resource (``num_cpus <= 1`` takes
    a thread, not a declared CPU: see ``cluster_tasks``), as the driver submitted it.
    Both ``available_resources()`` and the dashboard read this, so they agree."""
    used: dict[str, float] = {"CPU": 0.0}
    total: dict[str, float] = {"CPU": 0.0}
    for info in workers.values():
        declared = {"CPU": float(info["nthreads"]), **info["resources"]}
        taken = dict(info.get("used_resources") or {})
        taken["CPU"] = taken.get("CPU", 0.0) + info.get("unrestricted_busy", 0)
        for name, amount in declared.items():
            total[name] = total.get(name, 0.0) + float(amount)
            used[name] = used.get(name, 0.0) + min(float(amount), float(taken.get(name, 0.0)))
    return {name: [used[name], amount] for name, amount in total.items()
            if amount or name == "CPU"}

class ClusterState:
    """Builds the state API's rows for one ``ClusterLog`` (see the module docstring)."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.backend = log.backend

    # -- gathering ---------------------------------------------------------------------
    def _facts(self, keys: tuple[str, ...] = ()) -> dict[str, Any]:
        client = self.backend.client
        return client.run_on_scheduler(scheduler_facts, keys=keys)

    def _worker_row_ids(self, workers: dict[str, Any]) -> dict[str, int]:
        log = self.log
        with log.lock:
            return {address: log._row(address, info["pid"], 0)
                    for address, info in sorted(workers.items())}

    def live_keys(self, limit: int = MAX_REFRESHED) -> list[tuple[Any, str]]:
        """(live task, its cluster key) of the oldest ``limit`` live tasks (not actor
        calls: they bypass the scheduler)."""
        from lightwork.engines.distributed.worker import key_name

        log = self.log
        with log.lock:
            return [(task, f"{key_name(task.record.name)}-{task.record.task_id:x}")
                    for task in itertools.islice(log.tasks.values(), limit)
                    if not task.actor_id]

    def refresh_live_states(self) -> None:
        """Live tasks' states (and where they run) from the scheduler, for list_tasks."""
        live = self.live_keys()  # the oldest first, as listed
        if live:
            self.apply_live_states(live, self._facts(tuple(key for _, key in live)))

    def apply_live_states(self, live: list[tuple[Any, str]], facts: dict[str, Any]) -> None:
        """Set the states of ``live`` (from :meth:`live_keys`) from ``facts`` (the
        scheduler's, which asked for their keys). A task seen running for the first time
        is dispatched now, as far as the driver can tell (its worker's report, later,
        sets the true start)."""
        rows = self._worker_row_ids(facts["workers"])
        now = time.monotonic()
        with self.log.lock:
            for task, key in live:
                fact = facts["tasks"].get(key)
                if fact is None:
                    continue
                state = _task_state(fact["state"])
                record = task.record
                if state == "RUNNING" and task.state != "RUNNING" and (
                        record.dispatched <= record.submitted):
                    record.dispatched = now
                task.state = state
                where = fact["processing_on"]
                if where is not None and where in rows:
                    record.worker_id = rows[where]
                    record.pid = facts["workers"][where]["pid"]

    # -- listings ----------------------------------------------------------------------
    def worker_rows(self, facts: dict[str, Any] | None = None,
                    driver: Any = None) -> list[dict[str, Any]]:
        """The driver's row and one per cluster worker (``facts``: the scheduler's, if
        already asked; ``driver``: a psutil Process of this one whose CPU counter is
        primed, else it is measured over 50 ms now)."""
        from lightwork.kernel.views import _NO_USAGE

        if facts is None:
            facts = self._facts()
        workers = facts["workers"]
        rows_of = self._worker_row_ids(workers)
        started = self._started(workers)
        now, wall = time.monotonic(), time.time()
        log = self.log
        import psutil

        me = driver if driver is not None else psutil.Process()
        rows = [{
            "worker_id": 0, "pid": os.getpid(), "kind": "driver", "state": "ALIVE",
            "actor_id": None, "actor_class": None, "running": None, "task_id": None,
            "queued": 0, "alive_s": now - log.log.started_at, "address": None,
            "cpu_percent": me.cpu_percent(None if driver is not None else 0.05),
            "rss": me.memory_info().rss,
        }]
        for address, info in sorted(workers.items()):
            processing = info["processing"]
            busy = min(info["processing_count"], info["nthreads"])
            if info["status"] not in ALIVE_STATUSES:
                state = "EXITING"
            else:
                state = "RUNNING" if processing else "IDLE"
            rows.append({
                "worker_id": rows_of[address], "pid": info["pid"] or None, "kind": "task",
                "state": state, "actor_id": None, "actor_class": None,
                "running": _task_name(processing[0]) if processing else None,
                "task_id": _task_id(processing[0]) if processing else None, "queued": max(0, info["processing_count"] - busy),
                "alive_s": wall - started[address] if address in started else None,
                "address": address, "nthreads": info["nthreads"],
                "resources": info["resources"], "stored_bytes": info["nbytes"],
                **(_NO_USAGE if info["cpu"] is None else
                   {"cpu_percent": info["cpu"], "rss": info["memory"]}),
            })
        return rows

    def _started(self, workers: dict[str, Any]) -> dict[str, float]:
        """When each worker process started, asked once per process (kept in the log)."""
        known = self.log.worker_started
        if any((address, info["pid"]) not in known for address, info in workers.items()):
            try:
                replies = self.backend.client.run(worker_started, on_error="ignore")
            except Exception:  # noqa: BLE001 - alive_s is then unknown, the rest still lists
                replies = {}
            for address, (pid, created) in replies.items():
                known[(str(address), pid)] = created
        return {address: known[(address, info["pid"])] for address, info in workers.items()
                if (address, info["pid"]) in known}

    def actor_keys(self) -> tuple[str, ...]:
        """The cluster keys of this driver's actors."""
        backend, log = self.backend, self.log
        with log.lock:
            actors = list(log.actor_info)
        futures = [backend.futures.get(actor_id) for actor_id in actors]
        return tuple(f.key for f in futures if f is not None and f.key is not None)

    def actor_rows(self, facts: dict[str, Any] | None = None,
                   on_workers: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The actors of this session: those the driver created (``owner`` "driver") and
        those its tasks and actors created on the workers (``owner`` "worker N", from
        ``on_workers``: :meth:`held_on_workers`, asked now if None). ``facts``: the
        scheduler's, if already asked for all those actors' keys."""
        backend, log = self.backend, self.log
        with log.lock:
            actors = dict(log.actor_info)
            live = Counter(task.actor_id for task in log.tasks.values() if task.actor_id)
            done = Counter(filter(None, map(_ACTOR_OF, log.log.tasks)))  # (in C)
        futures = {actor_id: backend.futures.get(actor_id) for actor_id in actors}
        if on_workers is None:
            on_workers = self.held_on_workers()
        owned_elsewhere = [(address, actor) for address, reply in sorted(on_workers.items())
                           for actor in reply["actors"] if actor["actor_id"] not in actors]
        if facts is None:
            facts = self._facts(self.actor_keys() + tuple(
                actor["key"] for _, actor in owned_elsewhere if actor["key"] is not None))
        rows_of = self._worker_row_ids(facts["workers"])
        labels = self._worker_labels(on_workers)
        rows = []
        for actor_id, info in actors.items():
            future = futures[actor_id]
            fact = facts["tasks"].get(future.key) if future is not None else None
            where = (fact["who_has"] or [fact["processing_on"]])[0] if fact else None
            state, cause = _actor_state(backend, actor_id, future)
            restarts, max_restarts, restarting, dead = backend.actors.actor_lifecycle(actor_id)
            if restarting:
                state, cause = "RESTARTING", None
            elif dead:
                state, cause = "DEAD", dead
            worker = facts["workers"].get(where) if where else None
            queued = live.get(actor_id, 0)
            running = min(queued, info["max_concurrency"]) if state == "ALIVE" else 0
            rows.append({
                "actor_id": f"{actor_id:020x}", "class_name": info["class_name"],
                "name": info["name"], "namespace": info["namespace"], "state": state,
                "pid": worker["pid"] if worker else None,
                "worker_id": rows_of.get(where) if where else None, "address": where,
                "restarts": restarts, "max_restarts": max_restarts, "running": running,
                "queued": queued - running, "waiting_in_get": 0, "deadlocks": 0,
                "calls_done": done.get(actor_id, 0), "methods_running": [],
                "max_concurrency": info["max_concurrency"], "detached": info["detached"],
                "death_cause": cause, "owner": "driver",
            })
        for address, actor in owned_elsewhere:
            fact = facts["tasks"].get(actor["key"]) if actor["key"] is not None else None
            where = (fact["who_has"] or [fact["processing_on"]])[0] if fact else None
            worker = facts["workers"].get(where) if where else None
            state, cause = _owned_state(actor)
            rows.append({
                "actor_id": f"{actor['actor_id']:020x}", "class_name": actor["class_name"],
                "name": None, "namespace": None, "state": state,
                "pid": worker["pid"] if worker else None,
                "worker_id": rows_of.get(where) if where else None, "address": where,
                "restarts": actor["restarts"], "max_restarts": actor["max_restarts"],
                # Its calls from other processes are not in this driver's log while they run.
                "running": None, "queued": None, "waiting_in_get": 0, "deadlocks": 0,
                "calls_done": done.get(actor["actor_id"], 0), "methods_running": [],
                "max_concurrency": None, "detached": False, "death_cause": cause,
                "owner": labels[address],
            })
        return rows

    def held_on_workers(self, with_refs: bool = True) -> dict[str, dict[str, Any]]:
        """What this session's tasks and actors hold on each worker (``held_refs``, one
        ``client.run``: the actors they created, and their refs unless not
        ``with_refs``), by address; a worker that does not answer is left out."""
        from lightwork.engines.distributed.worker import held_refs

        try:
            replies = self.backend.client.run(held_refs, session=self.backend.session_tag,
                                              with_refs=with_refs, on_error="ignore")
        except Exception:  # noqa: BLE001 - the driver's own still list
            return {}
        return {str(address): reply for address, reply in replies.items()}

    def _worker_labels(self, on_workers: dict[str, dict[str, Any]]) -> dict[str, str]:
        log = self.log
        with log.lock:
            return {address: f"worker {log._row(address, reply['pid'], 0)}"
                    for address, reply in on_workers.items()}

    def object_rows(self) -> list[dict[str, Any]]:
        """The objects of this session: the refs the driver holds and those its tasks and
        actors hold on the workers, each with its owner (the process that made the ref:
        ``driver`` or ``worker N``, as ``list_workers`` numbers them) and its holders."""
        backend, log = self.backend, self.log
        backend._drain()  # refs this driver dropped since its last call are not listed
        with backend.lock:
            held = list(backend.futures.items())
            task_ids = dict(backend.task_ids)
        on_workers = self.held_on_workers()
        labels = self._worker_labels(on_workers)
        owners = {backend._prefix: "driver"}
        # object id -> [key, task id, done (None: ask its future), future, holders]
        entries: dict[int, list[Any]] = {
            object_id: [getattr(future, "key", None), task_ids.get(object_id, 0), None,
                        future, ["driver"]]
            for object_id, future in held}
        worker_actors: set[int] = set()
        captured: dict[int, int] = {}  # object id -> results it is inside
        for address, reply in sorted(on_workers.items()):
            label = labels[address]
            if reply["prefix"]:
                owners[reply["prefix"]] = label
            for object_id, key, task_id, done in reply["refs"]:
                entry = entries.get(object_id)
                if entry is None:
                    entry = entries[object_id] = [key, task_id, done, None, []]
                entry[1] = entry[1] or task_id
                entry[4].append(label)
            for object_id, key, task_id, _outer in reply.get("captured", ()):
                entry = entries.get(object_id)
                if entry is None:  # held by nothing but the result it is inside
                    entry = entries[object_id] = [key, task_id, True, None, []]
                entry[1] = entry[1] or task_id
                captured[object_id] = captured.get(object_id, 0) + 1
            worker_actors.update(actor["actor_id"] for actor in reply["actors"])
        with log.lock:
            actors = set(log.actor_info) | worker_actors
            live_names = {task_id: task.record.name for task_id, task in log.tasks.items()}
            wanted = {e[1] for e in entries.values() if e[1] and e[1] not in live_names}
            ended_names = log.log.ended_names(wanted) if wanted else {}
        keys = tuple({e[0] for e in entries.values() if e[0] is not None})
        facts = self._facts(keys)["tasks"]
        rows = []
        for object_id, (key, task_id, done, future, holders) in entries.items():
            fact = facts.get(key) if key is not None else None
            handle = object_id in actors
            kinds = ["ACTOR_HANDLE"] if handle else []
            if fact and fact["pending_dependents"]:
                kinds.append("USED_BY_PENDING_TASK")
            if captured.get(object_id):
                kinds.append("CAPTURED_IN_OBJECT")
            if holders or not captured.get(object_id):
                kinds.append("LOCAL_REFERENCE")
            if key is None:  # an actor call's result: with its caller
                ready = future.done() if future is not None else bool(done)
                state = "READY" if ready else "PENDING"
                location = holders[0] if ready else None
            else:
                status = fact["state"] if fact else (
                    future.status if future is not None else "forgotten")
                state = _object_state(status)
                where = fact["who_has"] if fact else []
                location = ", ".join(f"worker {a}" for a in where) or None
            owner = owners.get(object_id >> PROCESS_ID_SHIFT << PROCESS_ID_SHIFT,
                               "a process that left the cluster")
            rows.append({
                "object_id": f"{object_id:020x}", "owner": owner,
                "task_id": task_id or None,
                # (a task submitted on a worker is named by its key while it runs)
                "task_name": "(actor handle)" if handle else (
                    live_names.get(task_id) or ended_names.get(task_id)
                    or (_task_name(key) if key else None)) if task_id
                else "(put)",
                "state": state, "size": fact["nbytes"] if fact else 0,
                "location": location, "reference_kind": kinds[0], "reference_kinds": kinds,
                "holders": holders, "pending_task_uses":
                    fact["pending_dependents"] if fact else 0,
                "contained_in": captured.get(object_id, 0), "error": None, "key": key,
            })
        rows.sort(key=lambda row: (-row["size"], row["object_id"]))
        return rows

    def memory_summary(self, top: int = 10) -> dict[str, Any]:
        rows = self.object_rows()
        by_owner: dict[str, list[int]] = {}
        by_kind: dict[str, list[int]] = {}
        for row in rows:
            for key, groups in ((row["owner"], by_owner), (row["reference_kind"], by_kind)):
                group = groups.setdefault(key, [0, 0])
                group[0] += 1
                group[1] += row["size"]
        workers = self._facts()["workers"]
        return {
            "objects": len(rows),
            "total_bytes": sum(row["size"] for row in rows),
            "shared_memory_bytes": 0,
            "freed_objects": 0,
            "store": None,
            "by_owner": [{"owner": k, "count": c, "bytes": b}
                         for k, (c, b) in sorted(by_owner.items())],
            "by_reference_kind": [{"kind": k, "count": c, "bytes": b}
                                  for k, (c, b) in sorted(by_kind.items(),
                                                          key=lambda item: -item[1][1])],
            "largest": rows[:top],
            # What each worker holds in memory (all clients' data, not only ours).
            "cluster_workers": [{"address": a, "stored_bytes": w["nbytes"],
                                 "rss": w["memory"]} for a, w in sorted(workers.items())],
        }

    def status(self) -> dict[str, Any]:
        # One round trip for the live tasks' states, the workers' rows and the resources.
        live = self.live_keys()
        facts = self._facts(tuple(key for _, key in live))
        if live:
            self.apply_live_states(live, facts)
        log = self.log
        workers = self.worker_rows(facts)
        actors = Counter(row["state"] for row in self.actor_rows())
        use = resource_use(facts["workers"])
        with log.lock:
            states = Counter(task.state for task in log.tasks.values())
            ended = Counter(log.log.ended_states())
            facts = {"task_records": len(log.log.tasks), "budget": log.log.budget,
                     "dropped_tasks": log.log.dropped_tasks,
                     "dropped_spans": log.log.dropped_spans}
        objects = self.object_rows()
        return {
            "session": log.session.name,
            "session_dir": log.session.directory,
            "driver_pid": os.getpid(),
            "uptime_s": time.monotonic() - log.log.started_at,
            "backend": "distributed",
            "address": self.backend.address(),
            "dask_dashboard": _dashboard_link(self.backend.client),
            "resources": {
                "total": {name: total for name, (_, total) in use.items()},
                "available": {name: max(0.0, total - used) for name, (used, total) in use.items()},
                "used": {name: used for name, (used, _) in use.items()},
            },
            "workers": dict(Counter(row["state"] for row in workers[1:])),
            "worker_count": len(workers) - 1,
            "actors": dict(actors),
            "actor_deadlocks": [],
            "tasks": {
                "waiting_for_args": states["PENDING_ARGS_AVAIL"],
                "queued": states["PENDING_NODE_ASSIGNMENT"] + states["SUBMITTED_TO_WORKER"],
                "running": sum(v for k, v in states.items() if k.startswith("RUNNING")),
                "finished": ended["FINISHED"],
                "failed": ended["FAILED"],
            },
            "objects": {"count": len(objects), "bytes": sum(row["size"] for row in objects),
                        "shared_memory_bytes": 0},
            "store": None,
            "event_log": facts,
        }


def serves_dashboard(dask_scheduler: Any = None) -> bool:
    """Whether the scheduler serves Dask's dashboard pages (run on the scheduler).

    Its HTTP server always runs (health, metrics) and is always listed as the
    ``"dashboard"`` service, even under ``dask scheduler --no-dashboard``; the pages are
    the Bokeh application added to it only when the dashboard is on."""
    application = getattr(dask_scheduler, "http_application", None)
    return bool(getattr(application, "applications", None))


def _dashboard_link(client: Any) -> str | None:
    """The Dask dashboard's URL, or None when the scheduler serves none."""
    try:
        return client.dashboard_link if client.run_on_scheduler(serves_dashboard) else None
    except Exception:  # noqa: BLE001 - only a hint in the status
        return None


def _task_state(scheduler_state: str) -> str:
    """Ray's name for a live task's state (``scheduler_facts``'s refined state)."""
    if scheduler_state == "processing":
        return "RUNNING"
    if scheduler_state == "seceded":
        return "RUNNING_IN_RAY_GET"
    if scheduler_state == "assigned":
        return "SUBMITTED_TO_WORKER"  # on a worker, waiting for one of its threads
    if scheduler_state == "waiting":
        return "PENDING_ARGS_AVAIL"
    if scheduler_state in ("memory", "erred"):
        return "SUBMITTED_TO_WORKER"  # ended; its report is on its way
    return "PENDING_NODE_ASSIGNMENT"  # released, queued, no-worker


def _object_state(status: str) -> str:
    if status in ("memory", "finished"):
        return "READY"
    if status in ("erred", "error", "cancelled", "lost", "forgotten"):
        return "FAILED"
    return "PENDING"


def _task_name(key: str) -> str:
    """A cluster key ``"<task name>-<id hex>"`` as the task's name."""
    return key.rsplit("-", 1)[0] if "-" in key else key


def _task_id(key: str) -> int | None:
    """The task id in a cluster key ``"<task name>-<id hex>"`` (None if it has none)."""
    try:
        return int(key.rsplit("-", 1)[1], 16)
    except (IndexError, ValueError):
        return None


def _owned_state(actor: dict[str, Any]) -> tuple[str, str | None]:
    """State and death cause of an actor a worker process owns (``held_refs``'s entry)."""
    if actor["killed"]:
        return "DEAD", "killed (lightwork.kill)"
    if actor["restarting"]:
        return "RESTARTING", None
    if actor["dead"]:
        return "DEAD", actor["dead"]
    status = actor["status"]
    if status == "pending":
        return "PENDING_CREATION", None
    if status == "finished":
        return "ALIVE", None
    return "DEAD", f"its cluster key is {status}"


def _actor_state(backend: Any, actor_id: int, future: Any) -> tuple[str, str | None]:
    if backend.actors.was_killed(actor_id):
        return "DEAD", "killed (lightwork.kill)"
    if future is None:
        return "DEAD", "its handle was released"
    status = future.status
    if status == "pending":
        return "PENDING_CREATION", None
    if status == "finished":
        return "ALIVE", None
    if status == "error":
        return "DEAD", f"its constructor raised or its worker was lost ({status})"
    return "DEAD", f"its cluster key is {status}"
