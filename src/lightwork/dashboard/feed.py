"""The driver's side of the dashboard: what one ``dashboard_sync`` request copies out.

This module runs inside the watched program (the handler ``init`` registers with the
control socket, ``lightwork.dashboard.register``, imports it on the first
dashboard request), in the control server's connection thread. Everything else of
the dashboard runs in its own process (``lightwork.dashboard.server``), so the program
pays only for these requests, about one a second while a page is open and none while
no page is open (the dashboard then asks nothing; the first request after the pause is
a summary sync, ``max_records`` 0, then the records follow).

A sync is incremental. The dashboard sends the cursors it reached, and gets:

* the task records that ended since ``task_cursor``. The event log's ring holds
  ``dropped_tasks + len(ring)`` records ever appended, so a cursor is that count; the
  new ones are the newest ``count - cursor`` of the ring, read from its right end (no
  walk over the older records). Those that fell out of the ring before they were read
  are counted in ``lost``. The records travel as bytes attached after the reply's JSON
  line (``control.Attached``; the layout is ``wire``'s): the fields the dashboard reads
  taken from each record by one ``attrgetter`` and packed by one ``Struct.pack`` call
  (the numbers as 8-byte words, then an error and a retries flag byte), and the names
  and states as codes into small tables (two dictionary look-ups), all in C: 0.6 µs a
  record (20,000 records in cache, quiet machine), against 1.8 µs for the same rows
  as base64 inside the JSON (measured: see bench/HOTPATH.md, "The dashboard").
  Packing runs in slices of ``PACK_SLICE`` rows, so the interpreter can hand the GIL to
  the driver's other threads between them. JSON and arrays of numbers only: nothing
  received is ever unpickled.
  ``max_records`` 0 asks for none (a summary-only sync: the cursors stay where they are);
* ``ended``: every task ended so far, by state (the event log's ``ended_counts``, kept
  whatever left the ring or was never read): the dashboard's totals, and its history and
  throughput, are differences of these, so they stay right across gaps between syncs
  (a dashboard with no page open does not sync at all);
* the driver's blocked ``get``/``wait`` spans since ``span_cursor`` (the same scheme);
* the live picture, small by construction: counts of live tasks by state, the first
  ``live_limit`` live tasks (submission order; their times as whole microseconds since
  the session began, 0 for not yet: JSON writes an integer in half the time of a
  float, and a thousand rows a sync made half of its fixed cost), what each worker runs now, actors,
  resources, the last CPU/RSS sample, the advisor's findings as it has them (its own
  thread keeps them current; nothing is analysed here) and the running ``get``/``wait``
  calls of the driver with how many of their objects are ready;
* ``cost_s``, the time this took, and ``fixed_cost_s``, the part of it not spent on the
  records, from which the dashboard spaces its requests so that their fixed part takes
  at most about 1% of the driver's time (the work per record is the same however they
  are spaced, so it must not space them; the dashboard never waits so long that the
  ring would overflow before its next request).

Progress of running ``get``/``wait`` calls comes from an observer on the blocking calls
(``introspect.blocking_observers``), installed by the first sync that asks for records
(a summary sync, ``max_records`` 0, does not: it comes with no page open) and removed by
itself once no such sync came for ``OBSERVER_IDLE_S``: while no page is open, ``get``
pays nothing.

Running Dask graphs (``lightwork.dask``) come with each sync too: finished and total
tasks of each, read from the run's own state (the ``ProgressBar``'s numbers), and only
if ``lightwork.dask`` was imported (the feed never imports it).

The session's end: a dashboard started from a terminal holds one connection with a
``dashboard_wait_end`` request on it, answered when the session starts closing (or
after ``timeout`` seconds, and then asked again). Its first request registers it (its
``watcher`` name) until it says ``dashboard_end_seen``: after its final sync, taken on
the same connection, or when it stops. The session waits for every registered
dashboard, at most ``FINAL_SYNC_WAIT_S`` (a stop hook of the control server, run before
anything is torn down), so the page shows the program's final state, not the one of up
to a second before. A session with no dashboard registered waits for nothing; one that
was killed without saying so costs the program's end ``FINAL_SYNC_WAIT_S`` once.

The feed reads the run only through its record (``kernel.run.RunRecord``): the event
log, lock and live tasks, and the record's methods for what an engine knows of itself
(the tasks at its workers' heads, resources in use, the store's facts, which objects
are still pending). A cluster session's record (``engines/distributed/dashboard.py``)
gives resources, workers, actors, store and findings at once in ``dashboard_facts``,
asked before the lock (it takes round trips to the cluster); the embedded runtime's
returns None there, and the feed builds them under the lock.

Actions (``dashboard_cancel``, ``dashboard_kill``) exist only for the dashboard's
``--allow-actions`` mode; the dashboard process checks the token and the origin first,
and this side refuses any action whose request does not carry ``allow_actions: true``
(which only a dashboard started with ``--allow-actions`` sends; see the trust model in
``kernel/control.py``).
"""

from __future__ import annotations

import array
import itertools
import operator
import struct
import sys
import threading
import time
import weakref
from collections import Counter
from typing import Any

from lightwork.kernel import control
from lightwork.kernel import views
from lightwork.kernel.events import TaskRecord
from lightwork.kernel.run import RunRecord
from lightwork.dashboard import CONTROL_OPS
from lightwork.dashboard.wire import (
    DEFAULT_MAX_RECORDS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    MAX_ERROR_CHARS,
    NAME_CODE,
    STATE_CODE,
)

OPS = CONTROL_OPS
PACK_SLICE = 2_000  # rows packed per C call (about 0.5 ms: the GIL can move between them)
DEFAULT_LIVE_LIMIT = 1_000
MAX_ACTORS = 2_000
MAX_PROGRESS_OBJECTS = 100_000  # larger get/wait calls report their size, not progress
OBSERVER_IDLE_S = 30.0
MAX_END_WAIT_S = 25.0  # one dashboard_wait_end (the connection's idle timeout is 30 s)
FINAL_SYNC_WAIT_S = 2.0  # the session waits this long at most for the final syncs
MAX_WATCHERS = 64  # dashboards registered for a final sync (more are not waited for)
MAX_GRAPHS = 100


class FeedTotals:
    """What this program's feed has done so far (bumped under the node's lock, once per
    sync): how a test, or a curious user, sees that no page open costs no sync."""

    syncs = 0  # dashboard_sync requests answered
    records = 0  # task records packed for them


def dispatch(node: RunRecord, op: str, args: dict[str, Any]) -> Any:
    if op == "dashboard_sync":
        reply, attached = sync(node, _int_arg(args, "task_cursor", 0),
                               _int_arg(args, "span_cursor", 0),
                               _int_arg(args, "max_records", DEFAULT_MAX_RECORDS),
                               _int_arg(args, "live_limit", DEFAULT_LIVE_LIMIT))
        return control.Attached(reply, attached)
    if op in ("dashboard_wait_end", "dashboard_end_seen"):
        watcher = args.get("watcher")
        if not isinstance(watcher, str) or not 0 < len(watcher) <= 64:
            raise ValueError(f"watcher must be the dashboard's name for itself (a string of 1 "
                             f"to 64 characters), got {watcher!r}")
        if op == "dashboard_end_seen":
            _end_watch(node).seen(watcher)
            return {}
        timeout = args.get("timeout", MAX_END_WAIT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
                0 < timeout <= MAX_END_WAIT_S):
            raise ValueError(f"timeout must be a number of seconds in (0, {MAX_END_WAIT_S:g}],"
                             f" got {timeout!r}")
        return {"closing": _end_watch(node).wait(watcher, float(timeout))}
    if op in ("dashboard_cancel", "dashboard_kill") and args.get("allow_actions") is not True:
        raise PermissionError(f"{op} refused: actions are off; only a dashboard started with "
                              "`lightwork dashboard --allow-actions` may cancel tasks or kill "
                              "actors")
    if op == "dashboard_cancel":
        return cancel_task(node, _int_arg(args, "task_id", -1), bool(args.get("force", False)))
    if op == "dashboard_kill":
        return kill_actor(node, str(args.get("actor_id", "")))
    raise ValueError(f"unknown dashboard operation {op!r}; known: {', '.join(OPS)}")


def _int_arg(args: dict[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be an integer >= 0, got {value!r}")
    return value


# ---------------------------------------------------------------------------- sync
def sync(node: RunRecord, task_cursor: int, span_cursor: int, max_records: int,
         live_limit: int) -> tuple[dict[str, Any], list[Any]]:
    """The reply (JSON) and the bytes of its task records (``wire``'s layout)."""
    began = time.perf_counter()
    if max_records:  # a page looks (a summary sync may come with none open: no observer)
        _progress.touch(node)
    # A cluster run's log (engines/distributed/dashboard.py) asks its scheduler for what a node
    # knows of itself: before the lock, as it takes round trips.
    facts = node.dashboard_facts(live_limit)
    with node.lock:
        log = node.log
        task_total = log.dropped_tasks + len(log.tasks)
        new_tasks, task_lost, task_next = _newest(log.tasks, task_total, task_cursor, max_records)
        span_total = log.dropped_spans + len(log.spans)
        new_spans, span_lost, span_next = _newest(log.spans, span_total, span_cursor, max_records)
        ended = dict(log.ended_counts)
        FeedTotals.syncs += 1
        FeedTotals.records += len(new_tasks)
        live_counts = _live_counts(node)
        base = log.started_at
        pauses = node.pauses  # calls paused in the debugger now
        paused = pauses.task_ids() if pauses else ()
        live = [
            (task.task_id, task.name, views.live_task_state(node, task), task.record.worker_id,
             task.actor_id, int((task.record.submitted - base) * 1e6),
             int((task.record.dispatched - base) * 1e6) if task.record.dispatched else 0,
             task.record.attempt, task.task_id in paused)
            for task in itertools.islice(node.tasks.values(), live_limit)
        ]
        if facts is None:
            resources = node.resource_use()
            store = node.store_facts()
            actor_count = len(node.actors.actors)
        progress = _progress.snapshot(node)
        now = time.monotonic()
    graphs = _dask_graphs()
    if facts is None:
        sidecar = node.control
        known = sidecar.known_workers() if sidecar is not None else {}
        facts = {"resources": resources, "workers": views.worker_rows(node),
                 "known_workers": {str(wid): info for wid, info in known.items()},
                 "actors": views.actor_rows(node)[:MAX_ACTORS], "actor_count": actor_count,
                 "store": store, "findings": _findings(node)}
    packing = time.perf_counter()
    task_facts, attached = pack(new_tasks)
    packing = time.perf_counter() - packing
    reply = {
        "session": node.session.name,
        "now": now,
        "base": node.log.started_at,
        "base_wall": node.log.started_at_wall,
        "budget": node.log.budget,
        "tasks": {"cursor": task_next, "lost": task_lost, "ended": ended, **task_facts},
        "spans": {"cursor": span_next, "lost": span_lost,
                  "rows": [[s.kind, s.start, s.end, s.object_count, s.thread_id,
                            _where(s.callsite)] for s in new_spans]},
        "live": {"counts": dict(live_counts), "rows": live, "total": sum(live_counts.values())},
        **facts,  # resources, workers, known_workers, actors, actor_count, store, findings
        "progress": progress,
        "graphs": graphs,
    }
    reply["cost_s"] = time.perf_counter() - began
    reply["fixed_cost_s"] = max(0.0, reply["cost_s"] - packing)
    return reply, attached


_STATE_OF = operator.attrgetter("state")


def _live_counts(node: RunRecord) -> Counter[str]:
    """Live tasks by Ray's state name (lock held), without a Python step per task.

    The scheduler's states are counted in C; only the tasks at the head of a worker
    (its running task, or an actor's running calls) can be in a RUNNING state, so only
    they are looked at one by one.
    """
    counts = Counter(map(_STATE_OF, node.tasks.values()))
    for task in node.worker_heads():
        state = views.live_task_state(node, task)
        if state != task.state:
            counts[task.state] -= 1
            counts[state] += 1
    return +counts  # drops the states counted down to zero


def _newest(ring: Any, total: int, cursor: int, limit: int) -> tuple[list[Any], int, int]:
    """The ring's items appended since ``cursor`` (at most ``limit``, oldest first), how
    many of them left the ring unread, and the next cursor. ``limit`` 0 reads nothing
    and moves nothing (the lost ones are counted when they are asked for)."""
    if cursor > total:  # a cursor from another session, or the log was reset
        cursor = 0
    if limit == 0:
        return [], 0, cursor
    available = len(ring)
    first_kept = total - available
    lost = max(0, first_kept - cursor)
    start = max(cursor, first_kept)
    wanted = min(limit, total - start)
    if wanted <= 0:
        return [], lost, total
    # Read from the right end, skipping the newest items past the ``wanted`` (in C);
    # the older part of the ring is never walked.
    newest = list(itertools.islice(reversed(ring), total - start - wanted, total - start))
    newest.reverse()
    return newest, lost, start + wanted


# What of a record the dashboard reads, taken by one attrgetter (in C): the numbers as
# float64 ("d") and int64 ("q"), then whether it has an error and retries, a byte each
# ("?": ``Struct`` takes any object's truth). Native alignment and the "0q" pad make a row
# a whole number of 8-byte words: the dashboard reads a column as a strided slice of the
# rows viewed as words (``wire``). The flag bytes are 1 exactly for the records that have
# one, so the rare rows are found in the packed bytes (a strided slice, in C), not by a
# second look at every record.
_PACKED_OF = operator.attrgetter(*FLOAT_COLUMNS, *INT_COLUMNS, "error", "retries")
_RECORD = struct.Struct("@" + "d" * len(FLOAT_COLUMNS) + "q" * len(INT_COLUMNS) + "??0q")
_WORDS = {name: word for word, name in enumerate(FLOAT_COLUMNS + INT_COLUMNS)}
_ERROR_BYTE = 8 * len(_WORDS)
_RETRIES_BYTE = _ERROR_BYTE + 1
_NAME_OF = operator.attrgetter("name")


def pack(records: list[TaskRecord]) -> tuple[dict[str, Any], list[Any]]:
    """Ended task records as ``wire`` sends them: (JSON facts, attached buffers).

    Everything per record runs in C (``map``, ``starmap``); Python code runs per slice of
    ``PACK_SLICE`` records (each pass over a slice while its records are in the cache),
    per distinct name or state, and for the records with an error or retries (found by
    their flag bytes in the packed rows).
    """
    if not records:
        return {"count": 0}, []
    names, states = _Table(), _Table()
    name_codes, state_codes = array.array(NAME_CODE), array.array(STATE_CODE)
    packed: list[bytes]
    retried: list[int]
    failed: list[int]
    packed, retried, failed = [], [], []
    size = _RECORD.size
    for first in range(0, len(records), PACK_SLICE):
        piece = records[first:first + PACK_SLICE]
        block = b"".join(itertools.starmap(_RECORD.pack, map(_PACKED_OF, piece)))
        packed.append(block)
        name_codes.extend(map(names.__getitem__, map(_NAME_OF, piece)))
        state_codes.extend(map(states.__getitem__, map(_STATE_OF, piece)))
        for flag_byte, found in ((_RETRIES_BYTE, retried), (_ERROR_BYTE, failed)):
            flags = block[flag_byte::size]  # one byte per row: 1 where it has one
            if flags.count(0) != len(piece):
                found.extend(itertools.compress(range(first, first + len(piece)), flags))
    facts = {
        "count": len(records), "names": list(names), "states": list(states),
        "row_bytes": _RECORD.size, "columns": _WORDS,
        "retries": [[i, len(records[i].retries)] for i in retried],
        "errors": [[i, str(records[i].error)[:MAX_ERROR_CHARS]] for i in failed],
    }
    return facts, [*packed, name_codes, state_codes]


class _Table(dict[str, int]):
    """Positions of the values seen, a new value taking the next one."""

    def __missing__(self, value: str) -> int:
        position = self[value] = len(self)
        return position


def _where(callsite: Any) -> str | None:
    if not callsite:
        return None
    filename, line, function = callsite
    return f"{filename}:{line} in {function}"


def _findings(node: RunRecord) -> list[dict[str, Any]] | None:
    """The live advisor's findings as it has them (None when the advisor is off)."""
    advisor = node.advisor
    if advisor is None:
        return None
    with advisor._lock:
        findings = list(advisor.findings)
    return [finding.as_dict() for finding in findings]


# ---------------------------------------------------------------------------- progress
class _BlockingCalls:
    """The driver's running ``get``/``wait`` calls, while a dashboard is attached."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # [kind, refs, since, thread, ids still pending at the last snapshot or None]
        self._calls: dict[int, list[Any]] = {}
        self._last_sync = 0.0
        self._serial = itertools.count(1)

    def touch(self, node: RunRecord) -> None:
        """A dashboard asked: observe get/wait until it stops asking or the session ends."""
        from lightwork.kernel import introspect

        sidecar = node.control
        if sidecar is None or sidecar.stopped:
            return  # a request still being answered as the session ends
        self._last_sync = time.monotonic()
        if self.detach not in sidecar.stop_hooks:
            sidecar.stop_hooks.append(self.detach)  # the session ends: stop observing
        if self._observe not in introspect.blocking_observers:
            introspect.blocking_observers.append(self._observe)

    def detach(self) -> None:
        from lightwork.kernel import introspect

        try:
            introspect.blocking_observers.remove(self._observe)
        except ValueError:
            pass
        with self._lock:
            self._calls.clear()

    def _observe(self, kind: str, refs: list[Any]) -> Any:
        if time.monotonic() - self._last_sync > OBSERVER_IDLE_S:
            self.detach()  # nobody looks any more: stop costing anything
            return None
        key = next(self._serial)
        thread = threading.current_thread().name
        with self._lock:
            self._calls[key] = [kind, refs, time.monotonic(), thread, None]

        def end(failed: bool) -> None:
            with self._lock:
                self._calls.pop(key, None)

        return end

    def snapshot(self, node: RunRecord) -> list[dict[str, Any]]:
        """Each running call: kind, thread, since, objects and how many are ready (node
        lock held; snapshots never run at once). An object once ready stays so for the
        bar (a lost one rebuilt is not counted again), so each snapshot looks only at
        the objects still pending at the one before: over a call, about one look per
        object, not one per object per second."""
        with self._lock:
            calls = list(self._calls.values())
        out = []
        for call in calls:
            kind, refs, since, thread, pending = call
            ready = None
            if len(refs) <= MAX_PROGRESS_OBJECTS:
                still = node.pending_objects(_ids_of(refs) if pending is None else pending)
                if still is not None:
                    call[4] = pending = still
                    ready = len(refs) - len(still)
            out.append({"kind": kind, "thread": thread, "since": since, "objects": len(refs),
                        "ready": ready})
        return out


_OBJECT_ID = operator.attrgetter("_id")  # ObjectRef's slot (``id`` is a Python property)


def _ids_of(refs: list[Any]) -> list[int]:
    """The object ids of ``refs``, in C when all are ObjectRefs."""
    try:
        return list(map(_OBJECT_ID, refs))
    except AttributeError:  # not all ObjectRefs: the slow way
        return [getattr(ref, "id", -1) for ref in refs]


_progress = _BlockingCalls()


def _dask_graphs() -> list[dict[str, Any]]:
    """The running ``lightwork.dask`` graphs' progress (none unless it was imported)."""
    scheduler = sys.modules.get("lightwork.dask._scheduler")
    running = getattr(scheduler, "running_graphs", None)  # None while it is imported
    if not running:
        return []
    return [run.progress() for run in list(running.values())[:MAX_GRAPHS]]


# ---------------------------------------------------------------------------- the end
class _EndWatch:
    """The dashboards registered for one session's end, and their final syncs."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._closing = False
        self._watchers: set[str] = set()  # registered, final sync not taken yet

    def wait(self, watcher: str, timeout: float) -> bool:
        """In a connection thread: register ``watcher``, then wait until the session
        closes (True) or ``timeout`` (False)."""
        with self._changed:
            if len(self._watchers) < MAX_WATCHERS:
                self._watchers.add(watcher)
            return bool(self._changed.wait_for(lambda: self._closing, timeout))

    def seen(self, watcher: str) -> None:
        """``watcher`` has its final sync, or needs none (it stops)."""
        with self._changed:
            self._watchers.discard(watcher)
            self._changed.notify_all()

    def close(self, wait: bool = True) -> None:
        """The session closes (a stop hook): wake the waiting dashboards and give them
        ``FINAL_SYNC_WAIT_S`` at most for their last sync."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
            if wait:
                self._changed.wait_for(lambda: not self._watchers, FINAL_SYNC_WAIT_S)


#: One per session, by its control server (an entry goes with its server).
_end_watches: weakref.WeakKeyDictionary[Any, _EndWatch] = weakref.WeakKeyDictionary()
_end_watches_lock = threading.Lock()


def _end_watch(node: RunRecord) -> _EndWatch:
    sidecar = node.control
    with _end_watches_lock:
        watch = _end_watches.get(sidecar)
        if watch is None:
            watch = _end_watches[sidecar] = _EndWatch()
            sidecar.stop_hooks.append(watch.close)
            if sidecar.stopped:  # it closed as we registered: the hook may have run
                watch.close(wait=False)
    return watch


# ---------------------------------------------------------------------------- actions
def cancel_task(node: RunRecord, task_id: int, force: bool) -> dict[str, Any]:
    with node.lock:
        task = node.tasks.get(task_id)
        return_ids = list(task.return_ids) if task is not None else None
    if return_ids is None:
        raise ValueError(f"task {task_id} is not running or queued (it ended, or the id is "
                         "wrong); refresh the table and pick a live task")
    node.cancel(return_ids, force)
    return {"cancelled": task_id}


def kill_actor(node: RunRecord, actor_hex: str) -> dict[str, Any]:
    try:
        actor_id = int(actor_hex, 16)
    except ValueError:
        raise ValueError(f"actor_id must be the actor's hex id, got {actor_hex!r}") from None
    with node.lock:
        known = node.knows_actor(actor_id)
    if not known:
        raise ValueError(f"no actor {actor_hex} in this session; refresh the actors view")
    node.kill_actor(actor_id)
    return {"killed": actor_hex}
