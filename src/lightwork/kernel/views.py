"""Read-only views of the driver's runtime state, as plain JSON-able rows.

Everything here runs when someone asks (``lightwork.state``, ``lightwork.timeline``,
``lightwork stack``, the command line through the control socket), never on the hot
path. Each view takes the node's lock only long enough to *copy* what it needs — a
shallow copy of the event log's rings and the fields of live tasks, workers, actors and
objects — and builds its rows after releasing it, so a large listing stalls the runtime
for about a millisecond per 100,000 records, not for the whole formatting.

Rows are dicts of str/int/float/bool/None/list only: the same rows travel over the
control socket as JSON and are returned by the Python API, so both read alike.

Task states follow Ray's vocabulary. Ended tasks are ``FINISHED`` or ``FAILED``
(from the log). Live tasks are derived from the scheduler's state:

=========================  ===========================================================
PENDING_ARGS_AVAIL         waiting for an argument (an ``ObjectRef``) to be ready
PENDING_NODE_ASSIGNMENT    ready, in the scheduler's queue (or an actor's queue)
SUBMITTED_TO_WORKER        sent to a worker, queued there behind a running task
RUNNING                    at the head of its worker (within an actor's concurrency):
                           the worker runs it, or has it in flight and starts it next
RUNNING_IN_RAY_GET         running, and its worker is blocked in a nested ``get``
RUNNING_IN_RAY_WAIT        running, and its worker is blocked in a nested ``wait``
=========================  ===========================================================

Filters (``filter_rows``) are ``(key, op, value)`` with op ``=`` or ``!=``; strings
compare case-insensitively with shell wildcards (``name=*work``; a function defined in
another one, ``outer.<locals>.f``, also matches ``f``), numbers as numbers,
and a list value (``reference_kinds``) matches when it contains the value.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import os
import threading
import time
from collections import Counter
from typing import Any

from lightwork.kernel import serialization
from lightwork.kernel.events import TaskRecord
from lightwork.kernel import tools

#: An engine's run record (``Backend.run_record``): these views read its tables by name.
Run = Any

DEFAULT_LIMIT = 100

ENDED_STATES = ("FINISHED", "FAILED")
LIVE_STATES = ("PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "SUBMITTED_TO_WORKER",
               "RUNNING", "RUNNING_IN_RAY_GET", "RUNNING_IN_RAY_WAIT")

TASK_KEYS = ("task_id", "name", "func_or_class_name", "type", "state", "actor_id", "attempt",
             "worker_id", "pid",
             "owner", "submitted_at", "queued_s", "run_s", "arg_size", "result_size",
             "rss_peak", "rss_change", "retries", "error", "is_debugger_paused")
ACTOR_KEYS = ("actor_id", "class_name", "name", "namespace", "state", "pid", "worker_id",
              "restarts", "max_restarts", "running", "queued", "calls_done", "methods_running",
              "max_concurrency", "detached", "death_cause")
WORKER_KEYS = ("worker_id", "pid", "kind", "state", "actor_id", "actor_class", "running",
               "task_id", "queued", "alive_s", "cpu_percent", "rss")
OBJECT_KEYS = ("object_id", "owner", "task_id", "task_name", "state", "size", "location",
               "reference_kind", "reference_kinds", "holders", "pending_task_uses",
               "contained_in", "error")
# Rows the state API makes from other calls' answers (``nodes()``, the placement groups).
NODE_KEYS = ("node_id", "state", "node_ip", "resources_total")
PLACEMENT_GROUP_KEYS = ("placement_group_id", "name", "state", "strategy", "bundles",
                        "bundles_to_node_id")
KEYS = {"tasks": TASK_KEYS, "actors": ACTOR_KEYS, "workers": WORKER_KEYS, "objects": OBJECT_KEYS,
        "nodes": NODE_KEYS, "placement_groups": PLACEMENT_GROUP_KEYS}

# ``TaskRecord`` fields, in the order the timeline's compact rows carry them.
RECORD_FIELDS = ("task_id", "name", "owner", "submitted", "attempt", "worker_id", "pid",
                 "deps_ready", "dispatched", "started", "args_loaded", "finished", "stored",
                 "seen", "arg_size", "result_size", "state", "error", "retries", "yields",
                 "rss_peak", "rss_change", "paused")


# ---------------------------------------------------------------------------- helpers
def _hex(object_id: int) -> str:
    return f"{object_id:020x}"


def _wall(node: Run, t: float) -> float | None:
    if not t:
        return None
    return node.log.started_at_wall + (t - node.log.started_at)


_TUPLES = ("retries", "yields", "paused")


def _record_row(record: TaskRecord) -> tuple[Any, ...]:
    return tuple(
        list(getattr(record, name)) if name in _TUPLES else getattr(record, name)
        for name in RECORD_FIELDS
    )


def _sidecar(node: Run) -> Any:
    """The node's control server (samples, known workers), or None."""
    return node.control


class _Snapshot:
    """What one view copied under the lock: ended records and live task facts."""

    def __init__(self, node: Run, with_records: bool = True) -> None:
        with node.lock:
            # The log's own records (read only): a copy of pointers under the lock.
            self.ended: list[TaskRecord] = node.log.ended_records() if with_records else []
            self.live = [
                (_record_row(task.record), live_task_state(node, task), task.actor_id,
                 _live_pid(node, task))
                for task in node.tasks.values()
            ]
            self.dropped_tasks = node.log.dropped_tasks
            self.now = time.monotonic()
            pauses = node.pauses  # calls paused in the debugger now
            since = pauses.open_windows() if pauses else {}
        self.paused: set[int] = set(since)
        if since:  # a pause not over yet shows up to now (the timeline marks it)
            at = RECORD_FIELDS.index("paused")
            for place, (values, *rest) in enumerate(self.live):
                if values[0] in since:
                    values = values[:at] + ([*values[at], (since[values[0]], self.now)],) \
                        + values[at + 1:]
                    self.live[place] = (values, *rest)


def live_task_state(node: Run, task: Any) -> str:
    """Ray's name for the state of a live task (lock held)."""
    state = task.state
    if state != "SUBMITTED_TO_WORKER":
        return state
    if task.actor_id:
        actor = node.actors.actors.get(task.actor_id)
        if actor is None or task.task_id not in actor.inflight:
            return state
        position = list(actor.inflight).index(task.task_id)
        if position >= max(1, actor.max_concurrency or 1):
            return state
        conn = actor.conn
        blocked = conn is not None and conn.slot.blocked > 0 and (actor.max_concurrency or 1) <= 1
        return _running_state(conn.slot) if blocked else "RUNNING"
    slot = task.worker
    if slot is None or not slot.inflight or slot.inflight[0] is not task:
        return state
    conn = node.workers.get(slot.worker_id)
    if conn is not None and not conn.pid:
        return state  # its worker is still starting: the task waits in its socket
    return _running_state(slot)


def _running_state(slot: Any) -> str:
    if slot.blocked <= 0:
        return "RUNNING"
    return "RUNNING_IN_RAY_WAIT" if slot.blocked_in == "wait" else "RUNNING_IN_RAY_GET"


def _live_pid(node: Run, task: Any) -> int:
    worker_id = task.record.worker_id
    conn = node.workers.get(worker_id) if worker_id > 0 else None
    return conn.pid if conn is not None else task.record.pid


# ---------------------------------------------------------------------------- tasks
def task_rows(node: Run) -> list[dict[str, Any]]:
    """Live tasks first (submission order), then ended tasks, most recent first."""
    snap = _Snapshot(node)
    pids = known_pids(node)
    rows = []
    for values, state, actor_id, pid in snap.live:
        record = dict(zip(RECORD_FIELDS, values))
        row = _task_row(node, record, state, actor_id, pid or record["pid"], snap.now)
        if snap.paused and record["task_id"] in snap.paused:
            row["is_debugger_paused"] = True
        rows.append(row)
    for ended in reversed(snap.ended):
        fields = {name: getattr(ended, name) for name in RECORD_FIELDS}
        pid = ended.pid or pids.get(ended.worker_id, 0)
        rows.append(_task_row(node, fields, ended.state, ended.actor_id, pid, snap.now))
    return rows


def _task_row(node: Run, r: dict[str, Any], state: str, actor_id: int | None, pid: int,
              now: float) -> dict[str, Any]:
    queued_until = r["started"] or r["dispatched"] or r["finished"] or r["seen"] or now
    name = r["name"]
    is_actor = bool(actor_id) if actor_id is not None else "." in name.rsplit(">.", 1)[-1]
    return {
        "task_id": r["task_id"],
        "name": name,
        # Ray's key for the function (or Class.method) a task runs: here its name.
        "func_or_class_name": name,
        "type": "ACTOR_TASK" if is_actor else "NORMAL_TASK",
        "state": state,
        "actor_id": _hex(actor_id) if actor_id else None,
        "attempt": r["attempt"],
        "worker_id": r["worker_id"] if r["worker_id"] > 0 else None,
        "pid": pid or None,
        "owner": r["owner"],
        "submitted_at": _wall(node, r["submitted"]),
        "queued_s": max(0.0, queued_until - r["deps_ready"]) if r["deps_ready"] else 0.0,
        "run_s": (r["finished"] - r["args_loaded"]) if r["finished"] else None,
        "arg_size": r["arg_size"],
        "result_size": r["result_size"],
        # its worker's peak resident bytes in the call, and the change; None: not measured
        "rss_peak": r["rss_peak"] or None,
        "rss_change": r["rss_change"] if r["rss_peak"] else None,
        "retries": len(r["retries"]),
        "error": r["error"],
        "is_debugger_paused": False,  # (task_rows: True while it is)
    }


def summarize_tasks(node: Run) -> dict[str, Any]:
    """Per function: counts by state, run time mean/p50/p95/max, queued time mean/p95,
    and over its calls whose memory was measured, the worker's peak resident bytes (max)
    and the change across a call (mean; a steady rise is the advisor's likely leak).

    ``total_queued_s`` is the queued times summed over the function's tasks: task-seconds
    spent waiting, which exceeds the run's wall time as soon as tasks queue side by side;
    the mean and p95 say how long one task waited.
    """
    rows = task_rows(node)
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["name"], []).append(row)
    summary = []
    for name, group in groups.items():
        runs = sorted(r["run_s"] for r in group if r["run_s"] is not None)
        queued = sorted(r["queued_s"] for r in group)
        measured = [r for r in group if r["rss_peak"]]
        summary.append({
            "name": name,
            "type": group[0]["type"],
            "count": len(group),
            "state_counts": dict(Counter(r["state"] for r in group)),
            "mean_run_s": sum(runs) / len(runs) if runs else None,
            "p50_run_s": _percentile(runs, 0.50),
            "p95_run_s": _percentile(runs, 0.95),
            "max_run_s": runs[-1] if runs else None,
            "mean_queued_s": sum(queued) / len(queued),
            "p95_queued_s": _percentile(queued, 0.95),
            "total_queued_s": sum(queued),
            "max_rss_peak": max(r["rss_peak"] for r in measured) if measured else None,
            "mean_rss_change": (sum(r["rss_change"] for r in measured) / len(measured)
                                if measured else None),
        })
    summary.sort(key=lambda s: (-s["count"], s["name"]))
    with node.lock:
        dropped = node.log.dropped_tasks
    return {"total_tasks": len(rows), "dropped_records": dropped, "functions": summary}


def _percentile(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not ordered:
        return None
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


# ---------------------------------------------------------------------------- actors
def actor_rows(node: Run) -> list[dict[str, Any]]:
    with node.lock:
        rows = []
        deadlocks = Counter(report["actor_id"] for report in node.actors.deadlocks)
        for actor in node.actors.actors.values():
            conn = actor.conn
            # Calls sent to the process run in order on its slots; the rest of the sent
            # ones wait in the process behind them: queued, not running.
            running = [task.name.rsplit(".", 1)[-1]
                       for task in itertools.islice(actor.inflight.values(), actor.slots)]
            rows.append({
                "actor_id": _hex(actor.actor_id),
                "class_name": actor.class_name,
                "name": actor.name,
                "namespace": actor.namespace,
                "state": actor.state,
                "pid": (conn.pid or None) if conn is not None else None,
                "worker_id": conn.worker_id if conn is not None else None,
                "restarts": actor.restarts,
                "max_restarts": actor.max_restarts,
                "running": len(running),
                "queued": len(actor.queue) + len(actor.inflight) - len(running),
                "waiting_in_get": len(actor.waits),
                "deadlocks": deadlocks.get(actor.actor_id, 0),
                "calls_done": actor.calls_done,
                "methods_running": running,
                "max_concurrency": actor.max_concurrency or 1,
                "detached": actor.detached,
                "death_cause": actor.death_cause or None,
            })
    return rows


# ---------------------------------------------------------------------------- workers
def worker_rows(node: Run) -> list[dict[str, Any]]:
    """The driver (worker 0), then every live worker process."""
    now = time.monotonic()
    usage = _last_usage(node)
    rows = [{
        "worker_id": 0, "pid": os.getpid(), "kind": "driver", "state": "ALIVE",
        "actor_id": None, "actor_class": None, "running": None, "task_id": None, "queued": 0,
        "alive_s": now - node.log.started_at, **usage.get(os.getpid(), _NO_USAGE),
    }]
    with node.lock:
        for conn in node.workers.values():
            actor = conn.actor
            if actor is not None:
                calls = list(actor.inflight.values())
                head = calls[0] if calls else None
                queued = len(actor.queue)
            else:
                head = conn.slot.inflight[0] if conn.slot.inflight else None
                queued = max(0, len(conn.slot.inflight) - 1)
            if conn.dead or conn.eof_at:
                state = "EXITING"
            elif not conn.pid:
                state = "STARTING"
            elif head is None:
                state = "IDLE"
            elif conn.slot.blocked:
                state = "BLOCKED"
            else:
                state = "RUNNING"
            rows.append({
                "worker_id": conn.worker_id,
                "pid": conn.pid or None,
                "kind": "actor" if actor is not None else "task",
                "state": state,
                "actor_id": _hex(actor.actor_id) if actor is not None else None,
                "actor_class": actor.class_name if actor is not None else None,
                "running": head.name if head is not None else None,
                "task_id": head.task_id if head is not None else None,
                "queued": queued,
                "alive_s": now - conn.started_at,
                **usage.get(conn.pid, _NO_USAGE),
            })
    return rows


_NO_USAGE: dict[str, Any] = {"cpu_percent": None, "rss": None}


def _last_usage(node: Run) -> dict[int, dict[str, Any]]:
    sidecar = _sidecar(node)
    if sidecar is None:
        return {}
    sample = sidecar.last_sample()
    if sample is None:
        return {}
    return {pid: {"cpu_percent": cpu, "rss": rss} for pid, cpu, rss in sample[1]}


def known_pids(node: Run) -> dict[int, int]:
    """worker id -> pid for every worker seen, including those that have exited."""
    sidecar = _sidecar(node)
    pids = {wid: info["pid"] for wid, info in sidecar.known_workers().items()} if sidecar else {}
    with node.lock:
        for conn in node.workers.values():
            if conn.pid:
                pids[conn.worker_id] = conn.pid
    return pids


# ---------------------------------------------------------------------------- objects
_KIND_PRIORITY = ("ACTOR_HANDLE", "PINNED_IN_MEMORY", "USED_BY_PENDING_TASK",
                  "CAPTURED_IN_OBJECT", "LOCAL_REFERENCE")
_OBJECT_STATES = {0: "PENDING", 1: "READY", 2: "FAILED"}


def object_rows(node: Run) -> list[dict[str, Any]]:
    """Every object in the table, largest first.

    Reference kinds (Ray's names): LOCAL_REFERENCE (an ``ObjectRef`` in the driver or a
    worker: see ``holders``), USED_BY_PENDING_TASK (an argument of a task not yet
    ended), CAPTURED_IN_OBJECT (a ref inside another stored object), PINNED_IN_MEMORY
    (its shared-memory segment is mapped in the driver, so values read without a copy,
    such as numpy arrays, may point into it), ACTOR_HANDLE (the object naming an actor).
    """
    with node.lock:
        table = node.objects
        live_names = {task.task_id: task.name for task in node.tasks.values()}
        copied = [
            (e.object_id, e.owner, e.task_id, e.state, e.size,
             e.path, e.driver_holds,
             sorted(e.holders or ()), e.task_uses, e.containers,
             e.path is not None and e.path in serialization.MAPS,
             e.object_id in table.actor_handles, e.error)
            for e in table.entries.values()
        ]
        spilled = set(node.store.spilled)
        wanted = {c[2] for c in copied if c[2] and c[2] not in live_names}
        ended_names = node.log.ended_names(wanted) if wanted else {}
    rows = []
    for (object_id, owner, task_id, state, size, path, driver_holds, holders, uses,
         containers, pinned, handle, error) in copied:
        kinds = []
        if handle:
            kinds.append("ACTOR_HANDLE")
        if pinned:
            kinds.append("PINNED_IN_MEMORY")
        if uses:
            kinds.append("USED_BY_PENDING_TASK")
        if containers:
            kinds.append("CAPTURED_IN_OBJECT")
        if driver_holds or holders:
            kinds.append("LOCAL_REFERENCE")
        primary = next((k for k in _KIND_PRIORITY if k in kinds), None)
        rows.append({
            "object_id": _hex(object_id),
            "owner": "driver" if owner == 0 else f"worker {owner}",
            "task_id": task_id or None,
            "task_name": (live_names.get(task_id) or ended_names.get(task_id)) if task_id
            else ("(actor handle)" if handle else "(put)"),
            "state": _OBJECT_STATES.get(state, str(state)),
            "size": size,
            "location": ("spilled" if path in spilled else "shared memory") if path
            else ("inline" if state == 1 else None),
            "reference_kind": primary,
            "reference_kinds": kinds,
            "holders": (["driver"] if driver_holds else []) + [f"worker {h}" for h in holders],
            "pending_task_uses": uses,
            "contained_in": containers,
            "error": None if error is None else _short_error(error),
        })
    rows.sort(key=lambda row: (-row["size"], row["object_id"]))
    return rows


def _short_error(error: Any) -> str:
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"[:200]
    return "error (serialized; get() the object to see it)"


def memory_summary(node: Run, top: int = 10) -> dict[str, Any]:
    rows = object_rows(node)
    by_owner: dict[str, list[int]] = {}
    by_kind: dict[str, list[int]] = {}
    for row in rows:
        for key, groups in ((row["owner"], by_owner), (row["reference_kind"] or "NONE", by_kind)):
            group = groups.setdefault(key, [0, 0])
            group[0] += 1
            group[1] += row["size"]
    with node.lock:
        shm_bytes = node.objects.bytes_in_segments
        freed = node.objects.freed_count
    store = node.store.summary()
    return {
        "objects": len(rows),
        "total_bytes": sum(row["size"] for row in rows),
        "shared_memory_bytes": shm_bytes,
        "freed_objects": freed,
        "store": store,
        "by_owner": [
            {"owner": k, "count": c, "bytes": b} for k, (c, b) in sorted(by_owner.items())
        ],
        "by_reference_kind": [
            {"kind": k, "count": c, "bytes": b}
            for k, (c, b) in sorted(by_kind.items(), key=lambda item: -item[1][1])
        ],
        "largest": rows[:top],
    }


# ---------------------------------------------------------------------------- status
def status(node: Run) -> dict[str, Any]:
    snap = _Snapshot(node, with_records=False)
    states = Counter(state for _, state, _, _ in snap.live)
    workers = worker_rows(node)
    with node.lock:
        total = {k: v for k, v in node.scheduler.total.items() if v or k == "CPU"}
        available = {k: node.scheduler.available.get(k, 0.0) for k in total}
        actors = Counter(actor.state for actor in node.actors.actors.values())
        objects = len(node.objects.entries)
        object_bytes = sum(entry.size for entry in node.objects.entries.values())
        shm_bytes = node.objects.bytes_in_segments
        deadlocks = list(node.actors.deadlocks)
        log = node.log
        ended = Counter(log.ended_states())
        log_facts = {"task_records": len(log.tasks), "budget": log.budget,
                     "dropped_tasks": log.dropped_tasks, "dropped_spans": log.dropped_spans}
    return {
        "session": node.session.name,
        "session_dir": node.session.directory,
        "driver_pid": os.getpid(),
        "uptime_s": snap.now - node.log.started_at,
        "resources": {
            "total": total,
            "available": {k: max(0.0, v) for k, v in available.items()},
            "used": {k: max(0.0, total[k] - available[k]) for k in total},
        },
        "workers": dict(Counter(row["state"] for row in workers[1:])),
        "worker_count": len(workers) - 1,
        "actors": dict(actors),
        "actor_deadlocks": deadlocks,  # gets answered with ActorDeadlockError (actors.py)
        "tasks": {
            "waiting_for_args": states["PENDING_ARGS_AVAIL"],
            "queued": states["PENDING_NODE_ASSIGNMENT"] + states["SUBMITTED_TO_WORKER"],
            "running": sum(v for k, v in states.items() if k.startswith("RUNNING")),
            "finished": ended["FINISHED"],
            "failed": ended["FAILED"],
        },
        "objects": {"count": objects, "bytes": object_bytes, "shared_memory_bytes": shm_bytes},
        "store": node.store.summary(),
        "event_log": log_facts,
    }


# ---------------------------------------------------------------------------- filters
def parse_filters(filters: Any) -> list[tuple[str, str, str]]:
    """Normalize ``[(key, op, value)]``, ``{key: value}`` or ``["key=value"]`` filters."""
    if not filters:
        return []
    if isinstance(filters, dict):
        return [(str(k), "=", v) for k, v in filters.items()]
    out = []
    for item in filters:
        if isinstance(item, str):
            op = "!=" if "!=" in item else "="
            key, sep, value = item.partition(op)
            if not sep or not key.strip():
                raise ValueError(f"filter {item!r} is not of the form key=value or key!=value")
            out.append((key.strip(), op, value.strip()))
        elif isinstance(item, (list, tuple)) and len(item) == 3:
            key, op, value = item
            if op not in ("=", "!="):
                raise ValueError(f"filter operator {op!r} is not supported; use '=' or '!='")
            out.append((str(key), op, value))
        else:
            raise ValueError(
                f"filter {item!r} is not understood; give (key, '=', value) tuples, "
                "'key=value' strings or a {key: value} dict")
    return out


def filter_rows(kind: str, rows: list[dict[str, Any]], filters: Any,
                limit: int | None = DEFAULT_LIMIT) -> tuple[list[dict[str, Any]], int]:
    """Rows matching every filter, at most ``limit`` of them; and how many matched."""
    valid = KEYS[kind]
    parsed = parse_filters(filters)
    for key, _, _ in parsed:
        if key not in valid:
            raise ValueError(
                f"unknown filter key {key!r} for {kind}; valid keys: {', '.join(valid)}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    matched = [row for row in rows if all(_matches(row.get(k), op, v) for k, op, v in parsed)]
    total = len(matched)
    return (matched if limit is None else matched[:limit]), total


def _matches(actual: Any, op: str, wanted: Any) -> bool:
    if isinstance(actual, list):
        hit = any(_equal(item, wanted) for item in actual)
    else:
        hit = _equal(actual, wanted)
    return hit if op == "=" else not hit


def _equal(actual: Any, wanted: Any) -> bool:
    if actual is None:
        return wanted is None or str(wanted).lower() in ("none", "null", "")
    if isinstance(actual, bool):
        return str(wanted).lower() in (("true", "1", "yes") if actual else ("false", "0", "no"))
    if isinstance(actual, int) and not isinstance(wanted, float):
        try:  # exactly: 64-bit task ids as floats would match their neighbours
            return actual == int(str(wanted).strip())
        except ValueError:
            pass  # "2.0" for an int field: compared as floats below
    if isinstance(actual, (int, float)):
        try:
            return float(actual) == float(wanted)
        except (TypeError, ValueError):
            return False
    text, pattern = str(actual).lower(), str(wanted).lower()
    # Functions defined inside functions are named "outer.<locals>.f": "f" matches too.
    short = text.split(".<locals>.")[-1]
    return fnmatch.fnmatchcase(text, pattern) or fnmatch.fnmatchcase(short, pattern)


# ---------------------------------------------------------------------------- timeline
def timeline_data(node: Run) -> dict[str, Any]:
    """The raw material of the timeline, compact (rows are lists, keys listed once).

    Also the advisor's findings (instants on the timeline) and its input: every task
    record and blocked span in full, as dicts, bounded by the event budget like the log.
    """
    advisor = tools.advisor()

    sidecar = _sidecar(node)
    if sidecar is not None:
        sidecar.sample_now()
    snap = _Snapshot(node)
    with node.lock:
        span_records = list(node.log.spans)
        dropped_spans = node.log.dropped_spans
        budget = node.log.budget
        live_workers = node.worker_infos()
    spans = [(s.kind, s.start, s.end, s.object_count, s.thread_id) for s in span_records]
    workers = dict(sidecar.known_workers()) if sidecar is not None else {}
    workers.update(live_workers)
    threads = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
    profile, dropped_profile = sidecar.profile_events() if sidecar is not None else ([], 0)
    samples, dropped_samples = sidecar.samples() if sidecar is not None else ([], 0)
    return {
        "session": node.session.name,
        "driver_pid": os.getpid(),
        "forkserver_pid": node.forkserver.process.pid,
        "base": node.log.started_at,
        "base_wall": node.log.started_at_wall,
        "now": snap.now,
        "budget": budget,
        "record_fields": list(RECORD_FIELDS),
        "tasks": [_record_row(record) for record in snap.ended],
        "live": [list(values) + [state, actor_id, pid]
                 for values, state, actor_id, pid in snap.live],
        "spans": spans,
        "threads": {str(ident): name for ident, name in threads.items()},
        "workers": {str(wid): info for wid, info in workers.items()},
        "profile": profile,
        "samples": samples,
        "dropped": {"tasks": snap.dropped_tasks, "spans": dropped_spans,
                    "profile": dropped_profile, "samples": dropped_samples},
        "findings": [f.as_dict() for f in advisor.current_findings(node, snap.ended, span_records)],
        # The log as the advisor reads it, so ``lightwork advise FILE`` can re-run it.
        "advisor_input": advisor.analysis_input(node, snap.ended, span_records),
    }


def advice(node: Run) -> dict[str, Any]:
    """The advisor's findings (its live ones, or a one-off analysis of the whole log)."""
    advisor = tools.advisor()

    findings = advisor.current_findings(node)
    return {"session": node.session.name, "live": node.advisor is not None,
            "findings": [finding.as_dict() for finding in findings]}
