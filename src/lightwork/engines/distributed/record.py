"""The event log on the distributed backend: the cluster's tasks in lightwork's EventLog.

:class:`ClusterLog` is the driver's record of a cluster run: it keeps the log (the
driver's stamps, the workers' reports pulled and put on one clock, rows, listeners);
what it answers the ``lightwork`` command and the tools is its base class's
(``answers.py``). The workers' side of the log (:func:`note`, :func:`take`) is here too.

Who records what
----------------
* The driver stamps what it sees: a task's submission (name, call site, argument bytes)
  when ``.remote()`` hands it to distributed, and the spans it spends blocked in ``get``
  and ``wait`` (the advisor's get-in-loop rule reads those). A live record waits in
  :attr:`ClusterLog.tasks` until its worker's report arrives.
* Each worker process stamps its own side in the task wrapper (``cluster_worker.run_task``)
  and in the actor host (actor calls bypass the scheduler, so the actor records them):
  started, arguments loaded, finished, result stored, the retries it ran and the error,
  the result's size, and the fetches of its dependencies from other workers (source,
  bytes, start and stop: see ``cluster_worker``'s "The event log"). The driver keeps
  those transfers in :attr:`ClusterLog.transfers` (bounded by the event budget), not in
  the task records, and the timeline draws them on the receiving worker's row.
  :func:`note` appends one tuple to a bounded per-process ring (a few hundred ns; no
  message per task). Nothing else runs on the task's path.
* Drivers may share a cluster, one after another or at once: a worker keeps one ring per
  driver session (the tag is the driver backend's id prefix, ``session_tag``, which the
  task and actor headers carry, and a task's nested submissions inherit), each driver's
  pull takes only its own ring, and a driver's shutdown drops it. Rings of drivers that
  died without that are dropped oldest first past ``MAX_SESSIONS``.
* The driver pulls its rings with ``client.run(take)`` — one round trip to every worker,
  through the engine — whenever a diagnostic reads the log (:meth:`ClusterLog.sync`) and,
  so that memory stays flat on long runs, once a second from a daemon thread while tasks
  are in flight. A cancelled task's record ends when the driver cancels it. A worker that
  dies loses its unreported records. A task whose worker died on every try is ended
  as FAILED by the driver when a listener watched it (its future's ``error``, see
  ``returned``); otherwise it stays live in the listing (not done: watching every
  future costs a callback per task).

One clock
---------
Workers stamp ``time.time()``. Each pull also returns the worker's clock; the driver
takes the offset of every worker from the pull with the shortest round trip seen so far
(``offset = worker_now - midpoint of the round trip``: within half that round trip), and
puts the worker's times on the driver's ``time.monotonic`` scale, which the log and the
timeline use. Two more rules keep one worker's stamps true to each other:

* a start never precedes its submission: when one would, the worker's shift is lowered
  (all its later stamps move later), and that bound is kept for good, being causal;
* a later pull's better estimate may move the worker's stamps earlier, but a stamp
  taken after the last one placed is never put before it (it is held at that point
  until the new estimate passes it). Without this, calls that ran one after another
  (an actor's) could overlap when their stamps came in different pulls.

Rows
----
Each cluster worker (by address) and each actor on a worker gets a small row number, the
record's ``worker_id``, in order of first report (a restarted actor gets a new row on its
new worker, as a restarted actor's new process does locally); the timeline names the rows
by address and pid (``timeline_info``). Rows use synthetic trace pids, since pids of
different machines may collide.

Actor calls, as their caller sees them
--------------------------------------
An actor call's record ends with its actor's report, like a task's. The caller's side
adds what only it sees (``cluster_actor_calls``): a call failed there (its actor died,
``call_failed``) ends FAILED at once; a call sent again after a restart carries an
``actor restarted`` retry (``call_retried``), which the timeline draws as locally; and
when an actor's worker is lost (``actor_restarted``, ``actor_died``), the calls it had
answered whose reports died with it end FINISHED, at the time their answer came.

Listeners
---------
Dask-style callbacks (``diagnostics/_plain.py``) and ``lightwork.dask``'s scheduler
listen for ended tasks as they do on a node: ``add_task_listener`` (batches of
``TaskRecord``, in the pulling thread, outside the locks), ``task_graph_of`` (a get's
unfinished tasks, through the dependencies the driver noted at submission),
``ready_value`` and ``settle`` (a pull, so a run's end hears of every task that ended
before it). While a listener is on, pulls come every ``LISTENED_PULL_INTERVAL_S`` and
the end of every task submitted meanwhile wakes one at once (a done callback on its
future), so a graph's next tasks start one round trip after their inputs ended.

With ``init(event_budget=0)`` the driver still has this log, as a local session keeps its
node's control server: it records nothing (the task path has no ``recorder`` and
:meth:`ClusterLog.sync` pulls nothing), and what it answers without task records it
still answers (``answers.py``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, NamedTuple

from lightwork.kernel.calls import LARGE_ARGUMENT_BYTES, large_arguments
from lightwork.kernel.events import DriverSpan, EventLog, TaskRecord
from lightwork.engines.distributed.answers import ClusterAnswers

WORKER_RING = 100_000  # reports a worker keeps until the driver pulls them
PULL_INTERVAL_S = 1.0
LISTENED_PULL_INTERVAL_S = 0.1
SYNTHETIC_ROW = 4_000_000  # the timeline's synthetic pids (``timeline.SYNTHETIC_PID``)

# ------------------------------------------------------------------------- worker side
# One ring per session (the driver backend's id prefix, ``DistributedBackend.session``):
# drivers that share a cluster, one after another or at once, each pull only their own.
_reports: dict[int, deque[tuple[Any, ...]]] = {}
_dropped: dict[int, int] = {}
MAX_SESSIONS = 16  # rings of drivers that died without ending theirs: the oldest goes


def note(session: int, task_id: int, name: str, actor_id: int, started: float,
         loaded: float, finished: float, stored: float, error: str | None,
         retries: tuple[tuple[float, str], ...] = (), result_size: int = 0,
         transfers: tuple[tuple[float, float, str, int], ...] = ()) -> None:
    """One task or actor call of ``session`` ended in this worker process (wall-clock
    times; ``transfers``: (start, stop, source address, bytes) of its dependencies'
    fetches, ``cluster_worker.transfers_into``)."""
    ring = _reports.get(session)
    if ring is None:
        ring = _reports.setdefault(session, deque(maxlen=WORKER_RING))
        while len(_reports) > MAX_SESSIONS:
            oldest = next(iter(_reports))
            _reports.pop(oldest, None)
            _dropped.pop(oldest, None)
    if len(ring) == WORKER_RING:
        _dropped[session] = _dropped.get(session, 0) + 1
    ring.append((task_id, name, actor_id, started, loaded, finished, stored, error, retries,
                 result_size, transfers))


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def take(dask_worker: Any = None, session: int = 0) -> dict[str, Any]:
    """What this worker recorded for ``session`` since the last pull (``client.run``)."""
    taken = []
    ring = _reports.get(session)
    while ring:  # popleft is atomic: reports noted meanwhile stay for the next pull
        try:
            taken.append(ring.popleft())
        except IndexError:
            break
    dropped = _dropped.pop(session, 0)
    return {"pid": os.getpid(), "now": time.time(), "reports": taken, "dropped": dropped}


def forget(dask_worker: Any = None, session: int = 0) -> None:
    """Drop ``session``'s ring: its driver ended (``client.run`` at shutdown)."""
    _reports.pop(session, None)
    _dropped.pop(session, None)



# ------------------------------------------------------------------------- driver side
class Transfer(NamedTuple):
    """A task's dependency fetched from another worker before it ran (Dask's
    ``startstops`` action "transfer"): the timeline draws it on the receiving row."""

    task_id: int  # the task it was fetched for
    worker_id: int  # the receiving worker's row (the task's ``worker_id``)
    source: str  # the address of the worker it came from
    nbytes: int  # the bytes moved (distributed's count: 0 if its log no longer had it)
    start: float  # driver's monotonic clock, like every record's times
    stop: float


class _Live:
    """A submitted task not yet reported (what ``views`` reads of a live task)."""

    __slots__ = ("actor_id", "record", "return_ids", "state")
    worker = None

    def __init__(self, record: TaskRecord, actor_id: int) -> None:
        self.record = record
        self.actor_id = actor_id
        self.return_ids: tuple[int, ...] = ()
        self.state = "SUBMITTED_TO_WORKER"  # refined from the scheduler when listed

    @property
    def task_id(self) -> int:
        return self.record.task_id

    @property
    def name(self) -> str:
        return self.record.name


class ClusterLog(ClusterAnswers):
    """The driver's record of a cluster run, read by the diagnostics like a ``Node``'s."""

    #: The in-task debugger's driver side (``cluster_debugging``), its calls paused now,
    #: and what the workers printed, kept per call (``cluster_output``).
    debugging: Any = None
    pauses: Any = None
    output: Any = None

    def __init__(self, backend: Any, budget: int) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        self.log = EventLog(budget)
        self.tasks: dict[int, _Live] = {}  # submitted, not reported yet (oldest first)
        self.workers: dict[int, Any] = {}  # no embedded worker processes (views read it)
        self.actors = SimpleNamespace(actors={}, deadlocks=[])
        self.advisor = None
        self.control: Any = None  # the control socket's server, once serve() ran
        self.closed = False
        self.session = SimpleNamespace(name=f"distributed-{os.getpid()}", directory=None)
        self.rows: dict[Any, int] = {}  # address, or ("actor", id, address) -> row number
        self.worker_started: dict[tuple[str, int], float] = {}  # (address, pid) -> wall time
        self.dashboard: Any = None  # cluster_dashboard.DashboardFacts, once one attached
        self.row_info: dict[int, dict[str, Any]] = {}
        self._offsets: dict[str, tuple[float, float]] = {}  # address -> (rtt, offset)
        self._shift_caps: dict[str, float] = {}  # address -> the most its shift can be
        self._last_stamp: dict[str, tuple[float, float]] = {}  # address -> (raw, placed)
        self._actor_classes: dict[int, str] = {}
        self.actor_info: dict[int, dict[str, Any]] = {}  # actors this driver created
        self._ended_early: dict[int, None] = {}  # cancelled tasks, oldest first (bounded)
        self._lost: dict[int, None] = {}  # tasks whose future failed in the engine
        self._answered: dict[int, float] = {}  # actor calls answered, not yet reported
        # Dependencies fetched from another worker, oldest first (bounded like the log).
        self.transfers: deque[Transfer] = deque(maxlen=max(1, budget))
        self._pull_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a watched future ended: pull now
        self._thread: threading.Thread | None = None
        # Told of ended tasks, in batches (``Node.add_task_listener``'s contract).
        self.task_listeners: list[Callable[[list[TaskRecord]], None]] = []

    # -- driver stamps ---------------------------------------------------------------------
    def submitted(self, task_id: int, name: str, callsite: Any, arg_size: int,
                  actor_id: int = 0, num_cpus: float = 1.0,
                  dep_tasks: tuple[int, ...] = (), call: tuple[tuple, dict] = ((), {})) -> None:
        """A task or actor call was sent; ``call`` is its (args, kwargs), read only when
        they pickled to a megabyte or more (the advisor's large-arg-repeated rule)."""
        now = time.monotonic()
        record = TaskRecord(task_id, name, 0, now, deps_ready=now, dispatched=now,
                            arg_size=arg_size, callsite=callsite, actor_id=actor_id,
                            num_cpus=num_cpus, state="SUBMITTED_TO_WORKER",
                            dep_tasks=dep_tasks)
        if arg_size >= LARGE_ARGUMENT_BYTES:
            record.large_args = large_arguments(*call)
        with self.lock:
            self.tasks[task_id] = _Live(record, actor_id)
            if len(self.tasks) > self.log.budget:  # never reported: drop the oldest
                del self.tasks[next(iter(self.tasks))]
                self.log.dropped_tasks += 1
        if self._thread is None:
            self._start_pulling()

    def returned(self, task_id: int, object_ids: list[int], future: Any) -> None:
        """The task's return refs are made (``future``: its distributed future).

        While a listener is on, the future's end wakes the pull, so a listener hears of
        the task one round trip after it ended instead of at the next periodic pull.
        """
        live = self.tasks.get(task_id)
        if live is not None:
            live.return_ids = tuple(object_ids)
        if self.task_listeners and future is not None:
            future.add_done_callback(lambda done: self._task_done(task_id, done))

    def _task_done(self, task_id: int, future: Any) -> None:
        """A watched task's future ended: pull now. An ``error`` status is the engine's
        own failure (a task's exception is stored as a value): its worker died on every
        try, so no report will ever come, and the next pull ends the record itself."""
        if future.status == "error":
            with self.lock:
                self._lost[task_id] = None
        self._wake.set()

    def _end_lost(self) -> list[TaskRecord]:
        """End the records of tasks whose workers died on every try (see ``_task_done``)."""
        now = time.monotonic()
        ended = []
        with self.lock:
            lost, self._lost = self._lost, {}
            for task_id in lost:
                live = self.tasks.pop(task_id, None)
                if live is None:
                    continue  # reported after all
                record = live.record
                record.state, record.seen = "FAILED", now
                record.error = ("WorkerCrashedError: its worker died on every try the "
                                "scheduler allows")
                self.log.finish_task(record)
                ended.append(record)
        return ended

    def cancelled(self, task_ids: list[int]) -> None:
        """Tasks cancelled by the driver end now; a later report of one that ran anyway
        (cancel without force of a running task) is then ignored."""
        self._end_early(task_ids, "TaskCancelledError: cancelled by the driver")

    def _end_early(self, task_ids: list[int], error: str | None) -> None:
        """End live records from the driver's side (FAILED with ``error``, or FINISHED if
        it is None); a report of one of them that still comes is then ignored."""
        now = time.monotonic()
        ended = []
        with self.lock:
            for task_id in task_ids:
                live = self.tasks.pop(task_id, None)
                answered = self._answered.pop(task_id, None)
                if live is None:
                    continue
                record = live.record
                record.seen = answered or now
                if error is None:
                    record.state, record.finished = "FINISHED", record.seen
                else:
                    record.state, record.error = "FAILED", error
                self.log.finish_task(record)
                ended.append(record)
                self._ended_early[task_id] = None
                if len(self._ended_early) > 10_000:
                    del self._ended_early[next(iter(self._ended_early))]
        self._tell_listeners(ended)

    # -- actor calls, as their caller sees them (see the module docstring) -------------
    def call_answered(self, task_id: int) -> None:
        """An actor call's result reached its caller (its report may come later)."""
        self._answered[task_id] = time.monotonic()

    def call_failed(self, task_id: int, error: BaseException) -> None:
        """An actor call failed at its caller (its actor died): no report will come."""
        self._end_early([task_id], error_text(error))

    def call_retried(self, task_id: int, reason: str) -> None:
        """An actor call in flight when its actor's worker died is sent again."""
        with self.lock:
            live = self.tasks.get(task_id)
            if live is not None:
                live.record.retries += ((time.monotonic(), reason),)

    def actor_restarted(self, actor_id: int, how: str) -> None:
        """The owner restarts ``actor_id`` (``how``: why it was lost): the calls its lost
        worker answered end now, as their reports died with it."""
        self._end_answered(actor_id)

    def actor_died(self, actor_id: int, how: str) -> None:
        """``actor_id`` is dead for good (``how``: why); as for a restart."""
        self._end_answered(actor_id)

    def _end_answered(self, actor_id: int) -> None:
        with self.lock:
            answered = [task_id for task_id in self._answered
                        if (live := self.tasks.get(task_id)) is not None
                        and live.actor_id == actor_id]
        self._end_early(answered, None)

    def actor_created(self, actor_id: int, class_name: str, name: str | None = None,
                      namespace: str | None = None, detached: bool = False,
                      max_concurrency: int = 1) -> None:
        self._actor_classes[actor_id] = class_name
        with self.lock:
            self.actor_info[actor_id] = {
                "class_name": class_name, "name": name, "namespace": namespace,
                "detached": detached, "max_concurrency": max(1, max_concurrency or 1)}

    def blocked(self, kind: str, start: float, ids: list[int], callsite: Any,
                first_task_id: int) -> None:
        span = DriverSpan(kind, start, time.monotonic(), len(ids), threading.get_ident(),
                          ids[0] if ids else 0, callsite, first_task_id)
        with self.lock:
            self.log.add_span(span)

    # -- pulling the workers' reports ------------------------------------------------------
    def _start_pulling(self) -> None:
        with self._pull_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._pull_loop, daemon=True,
                                                name="lightwork-cluster-log")
                self._thread.start()

    def _pull_loop(self) -> None:
        while not self._stop.is_set():
            # Faster while someone listens (a progress bar, a Dask graph run).
            self._wake.wait(LISTENED_PULL_INTERVAL_S if self.task_listeners else PULL_INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self.tasks:
                try:
                    self.sync()
                except Exception:  # noqa: BLE001, S110 - a diagnostic never breaks the run; retried
                    pass
            if self.dashboard is not None:
                self.dashboard.idle()

    def serve(self) -> None:
        """Serve the ``lightwork`` command from another terminal (``cluster_control``)."""
        from lightwork.engines.distributed import control as cluster_control

        self.control = cluster_control.serve(self)

    def stop(self) -> None:
        """The session ends: its workers drop what they still keep of it. The control
        server closes first: a dashboard attached takes its final sync then, while the
        workers still keep the session's last stamps."""
        self.closed = True
        self._stop.set()
        self._wake.set()
        if self.control is not None:
            from lightwork.engines.distributed import control as cluster_control

            # (kept on the log while it closes: the final syncs read it)
            cluster_control.close(self, self.control)
            self.control = None
        client = self.backend.client
        if getattr(client, "status", None) == "running":
            try:
                client.run(forget, session=self.backend.session_tag, on_error="ignore")
            except Exception:  # noqa: BLE001, S110 - the cluster may be going away
                pass

    def sync(self) -> None:
        """Pull every worker's reports into the log (one ``client.run`` round trip), then
        tell the listeners of the tasks that ended. Nothing with the log off."""
        self.check_reachable()
        if not self.log.enabled:
            return
        client = self.backend.client
        ended: list[TaskRecord] = []
        with self._pull_lock:
            sent = time.time()
            replies = client.run(take, session=self.backend.session_tag, on_error="ignore")
            came = time.time()
            for address, reply in replies.items():
                ended += self._merge(str(address), reply, sent, came)
            if self._lost:
                ended += self._end_lost()
        self._tell_listeners(ended)

    settle = sync  # what a run's end calls to hear of every task that ended before it

    # -- listeners (the Dask-style callbacks and lightwork.dask's scheduler) ------------
    def add_task_listener(self, listener: Callable[[list[TaskRecord]], None]) -> None:
        with self.lock:
            self.task_listeners.append(listener)
        if self._thread is None:
            self._start_pulling()

    def remove_task_listener(self, listener: Callable[[list[TaskRecord]], None]) -> None:
        with self.lock:
            if listener in self.task_listeners:
                self.task_listeners.remove(listener)

    def _tell_listeners(self, ended: list[TaskRecord]) -> None:
        """Outside every lock, in the pulling thread, as the node does."""
        if not ended or not self.task_listeners:
            return
        from lightwork.kernel.introspect import report_unraisable

        for listener in tuple(self.task_listeners):
            try:
                listener(ended)
            except Exception as exc:  # noqa: BLE001 - a diagnostics bug must not stop pulls
                report_unraisable(exc, "Exception ignored in lightwork task listener",
                                  listener)

    def task_graph_of(self, object_ids: list[int], with_return_ids: bool = False) -> Any:
        """``introspect.task_graph_of`` on the cluster: per object, the task making it
        (0 for a put, -1 if freed), and the unfinished tasks they depend on."""
        from lightwork.kernel.introspect import walk_task_graph

        task_ids, futures = self.backend.task_ids, self.backend.futures
        with self.lock:
            made_by = [task_ids.get(i, 0) if i in futures else -1 for i in object_ids]
            return walk_task_graph(made_by, self.tasks, with_return_ids)

    def ready_value(self, object_id: int) -> tuple[bool, Any]:
        """``introspect.ready_value`` on the cluster."""
        future = self.backend.futures.get(object_id)
        if future is None or not (future.done() or self.backend.fetch.came(object_id)):
            return False, None
        try:
            return True, self.backend.get([object_id], None)[0]
        except Exception:  # noqa: BLE001 - an error value, or freed meanwhile
            return False, None

    def _merge(self, address: str, reply: dict[str, Any], sent: float,
               came: float) -> list[TaskRecord]:
        rtt, offset = came - sent, reply["now"] - (sent + came) / 2
        best = self._offsets.get(address)
        if best is None or rtt < best[0]:
            self._offsets[address] = best = (rtt, offset)
        log = self.log
        shift = best[1] + log.started_at_wall - log.started_at  # worker wall -> monotonic
        pid = reply["pid"]
        reports = reply["reports"]
        ended = []
        with self.lock:
            log.dropped_tasks += reply["dropped"]
            # No start precedes its submission: a bound on the shift that holds for good.
            cap = self._shift_caps.get(address, math.inf)
            for report in reports:
                live = self.tasks.get(report[0])
                if live is not None:
                    cap = min(cap, report[3] - live.record.submitted)
            if cap < math.inf:
                self._shift_caps[address] = cap
            shift = min(shift, cap)
            # One worker's stamps keep their order across pulls whose estimates differ:
            # a stamp after the last one placed never lands before it (see "One clock").
            last_raw, last_placed = self._last_stamp.get(address, (-math.inf, -math.inf))

            def place(t: float) -> float:
                return max(t - shift, last_placed) if t >= last_raw else t - shift

            for (task_id, name, actor_id, started, loaded, finished, stored, error,
                 retries, *sized) in reports:
                live = self.tasks.pop(task_id, None)
                if live is None and task_id in self._ended_early:
                    continue  # ended by the driver already (cancelled, or its actor lost)
                if actor_id:
                    self._answered.pop(task_id, None)
                raw_end = stored
                started, loaded = place(started), place(loaded)
                finished, stored = place(finished), place(stored)
                record = live.record if live is not None else TaskRecord(
                    task_id, name, 0, started, actor_id=actor_id)
                if raw_end > self._last_stamp.get(address, (-math.inf,))[0]:
                    self._last_stamp[address] = (raw_end, stored)
                record.started, record.args_loaded = started, loaded
                record.finished, record.stored, record.seen = finished, stored, stored
                record.deps_ready = min(record.deps_ready or started, started)
                record.dispatched = min(record.dispatched or started, started)
                record.worker_id = self._row(address, pid, actor_id)
                record.pid = pid
                record.error = error
                # The driver's own (an actor call sent again after a restart) come first.
                record.retries += tuple((place(t), reason) for t, reason in retries)
                record.attempt = len(record.retries)
                if sized:  # (reports made before sizes were recorded have none)
                    result_size, transfers = sized
                    record.result_size = result_size
                    for start, stop, source, nbytes in transfers:  # on the receiving row
                        self.transfers.append(Transfer(task_id, record.worker_id, source,
                                                       nbytes, place(start), place(stop)))
                record.state = "FAILED" if error else "FINISHED"
                if self.pauses:  # a pause whose end is not heard of yet ends with its call
                    self.debugging.call_ended(record)
                log.finish_task(record)
                ended.append(record)
        return ended

    def _row(self, address: str, pid: int, actor_id: int) -> int:
        # An actor's row is per worker: a restarted actor's calls get a row of their own.
        key: Any = ("actor", actor_id, address) if actor_id else address
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = len(self.rows) + 1
            if actor_id:
                cls = self._actor_classes.get(actor_id, "actor")
                self.row_info[row] = {
                    "pid": pid, "row": SYNTHETIC_ROW + row, "actor_class": cls,
                    "actor_id": f"{actor_id:020x}", "max_concurrency": 1,
                    "label": f"actor {cls.split('.<locals>.')[-1]} on {address} (pid {pid})"}
            else:
                self.row_info[row] = {"pid": pid, "row": SYNTHETIC_ROW + row,
                                      "actor_class": None, "actor_id": None,
                                      "max_concurrency": 1,
                                      "label": f"worker {address} (pid {pid})"}
        return row
