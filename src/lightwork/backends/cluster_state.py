"""The state API's listings on the distributed backend: actors, workers, objects,
memory and status, as the same rows ``_runtime/views.py`` makes on the embedded runtime.

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
  ``MAX_REFRESHED`` live tasks; later ones show ``SUBMITTED_TO_WORKER``). An actor call is ``SUBMITTED_TO_WORKER`` until its report
  arrives (calls bypass the scheduler).
* Objects are the refs this driver holds, with their size and the workers holding them
  (``location``: ``"worker tcp://…"``); the driver does not see refs held inside tasks.
  There is no object store or shared memory of lightwork's: those sums are 0 and
  ``store`` is None.
* Actors are those this driver created (a named actor made by another driver is found
  with ``get_actor``, not listed). ``restarts`` and ``RESTARTING`` come from the
  driver, which owns its actors' restarts (``cluster_actor_calls``).
"""

from __future__ import annotations

import itertools
import operator
import os
import time
from collections import Counter
from typing import Any

from lightwork._runtime.events import _FIELDS

ALIVE_STATUSES = ("running", "paused", "init")
_ACTOR_OF = operator.itemgetter(_FIELDS.index("actor_id"))  # of a frozen task record
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
        from lightwork.backends.cluster_worker import key_name

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
        from lightwork._runtime.views import _NO_USAGE

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

    def actor_rows(self, facts: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """This driver's actors (``facts``: the scheduler's, if already asked for the
        actors' keys)."""
        backend, log = self.backend, self.log
        with log.lock:
            actors = dict(log.actor_info)
            live = Counter(task.actor_id for task in log.tasks.values() if task.actor_id)
            done = Counter(filter(None, map(_ACTOR_OF, log.log.tasks)))  # (in C)
        futures = {actor_id: backend.futures.get(actor_id) for actor_id in actors}
        if facts is None:
            facts = self._facts(self.actor_keys())
        rows_of = self._worker_row_ids(facts["workers"])
        rows = []
        for actor_id, info in actors.items():
            future = futures[actor_id]
            fact = facts["tasks"].get(future.key) if future is not None else None
            where = (fact["who_has"] or [fact["processing_on"]])[0] if fact else None
            state, cause = _actor_state(backend, actor_id, future)
            restarts, max_restarts, restarting, dead = backend.actor_lifecycle(actor_id)
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
                "death_cause": cause,
            })
        return rows

    def object_rows(self) -> list[dict[str, Any]]:
        backend, log = self.backend, self.log
        with backend.lock:
            held = list(backend.futures.items())
            task_ids = dict(backend.task_ids)
        with log.lock:
            actors = set(log.actor_info)
            live_names = {task_id: task.record.name for task_id, task in log.tasks.items()}
            wanted = {t for t in task_ids.values() if t and t not in live_names}
            ended_names = log.log.ended_names(wanted) if wanted else {}
        keys = tuple(f.key for _, f in held if getattr(f, "key", None) is not None)
        facts = self._facts(keys)["tasks"]
        rows = []
        for object_id, future in held:
            key = getattr(future, "key", None)
            fact = facts.get(key) if key is not None else None
            task_id = task_ids.get(object_id, 0)
            handle = object_id in actors
            kinds = ["ACTOR_HANDLE"] if handle else []
            if fact and fact["pending_dependents"]:
                kinds.append("USED_BY_PENDING_TASK")
            kinds.append("LOCAL_REFERENCE")
            if key is None:  # an actor call's result: held by the actor's proxy here
                state = "READY" if future.done() else "PENDING"
                location = "driver" if future.done() else None
            else:
                state = _object_state(fact["state"] if fact else future.status)
                holders = fact["who_has"] if fact else []
                location = ", ".join(f"worker {a}" for a in holders) or None
            rows.append({
                "object_id": f"{object_id:020x}", "owner": "driver",
                "task_id": task_id or None,
                "task_name": "(actor handle)" if handle else (
                    live_names.get(task_id) or ended_names.get(task_id)) if task_id
                else "(put)",
                "state": state, "size": fact["nbytes"] if fact else 0,
                "location": location, "reference_kind": kinds[0], "reference_kinds": kinds,
                "holders": ["driver"], "pending_task_uses":
                    fact["pending_dependents"] if fact else 0,
                "contained_in": 0, "error": None, "key": key,
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
        self.refresh_live_states()
        log = self.log
        workers = self.worker_rows()
        actors = Counter(row["state"] for row in self.actor_rows())
        total, available = self.backend.resources()
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
                "total": total,
                "available": {k: max(0.0, available.get(k, 0.0)) for k in total},
                "used": {k: max(0.0, total[k] - available.get(k, 0.0)) for k in total},
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


def _dashboard_link(client: Any) -> str | None:
    """The Dask dashboard's URL, or None when the scheduler serves none."""
    try:
        services = client.scheduler_info().get("services") or {}
        return client.dashboard_link if "dashboard" in services else None
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


def _actor_state(backend: Any, actor_id: int, future: Any) -> tuple[str, str | None]:
    if backend._killed.get(actor_id):
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
