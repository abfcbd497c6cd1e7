"""What the cluster run's record answers: the ``lightwork`` command's and the tools'
questions (the base class of ``record.ClusterLog``).

:class:`ClusterAnswers` is the cluster engine's side of ``kernel.run.RunRecord``: what
``record.ClusterLog`` keeps (its event log and rows, the driver's futures through its
backend) read the way each question asks.

* ``answer_query`` answers the diagnostics operations (``control.OPS``), which the
  control socket also calls (``cluster_control``): tasks, their summary, the timeline
  data and the advisor read the event log after a pull (``sync``); actors, workers,
  objects, memory and status come from ``state.ClusterState``; ``logs`` and
  ``debug_paused`` from what the driver keeps of the workers' output and of the calls
  paused in the debugger; ``stacks`` from every worker in one ``client.run``
  (:func:`dump_stacks`); the profile operations from Dask's own sampler
  (``profiling.py``); the live dashboard's, registered by it, through
  ``control.extra_op`` (its facts: ``dashboard_facts``, ``cluster_dashboard``). Before any
  but ``ping``, ``check_reachable`` fails at once, saying why, if the cluster cannot
  answer.
* As a run record it answers the tools' questions about the engine's parts the cluster's
  way: pending objects are the driver's futures not done, the store's facts are the
  futures it holds, and the workers' CPU and memory come from one ``client.run``
  (``remote_process_usage``: :func:`process_usage` in each worker, what
  ``ResourceProfiler`` samples). It has no worker processes on this machine, no worker
  queues to look into, no shared-memory store and no live advisor: those answers are the
  base class's "none", and a tool that needs the embedded runtime's own state is refused
  (``live_state_missing``).
* With ``init(event_budget=0)`` the log records nothing, but the state API's workers,
  actors, objects, memory and status, ``stack`` and the ``lightwork`` command answer;
  what reads task records (tasks, summary, timeline, advisor) says that the log is off.

The answers run on the thread that asks (a control connection's, the dashboard's, the
user's), holding the record's ``lock`` only while they copy what they read (``stacks``
also while it numbers a worker's row); :func:`dump_stacks` and :func:`process_usage` run in the workers' processes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from lightwork.kernel import control, exceptions
from lightwork.kernel.driver_output import answer_logs
from lightwork.kernel import tools
from lightwork.kernel.run import RunRecord, StoreFacts

if TYPE_CHECKING:
    from collections import deque

    from lightwork.engines.distributed.record import Transfer

PULL_TIMEOUT_S = 10.0
# The operations that read task records, which a session with event_budget=0 has none of.
_READS_THE_LOG = {"summarize_tasks": "summarize_tasks", "timeline_data": "the timeline",
                  "advise": "the advisor"}


# ------------------------------------------------------------------------- worker side
def dump_stacks(dask_worker: Any = None) -> dict[str, Any]:
    """The Python stack of every thread of this worker process (run by ``client.run``)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    threads = []
    for ident, frame in sys._current_frames().items():
        frames = [[f.filename, f.lineno, f.name] for f in traceback.extract_stack(frame)]
        threads.append({"id": ident, "name": names.get(ident, ""), "frames": frames,
                        "notes": []})
    return {"pid": os.getpid(), "threads": threads}


_process: list[Any] = []  # this worker's psutil.Process, its CPU counter primed


def process_usage(dask_worker: Any = None) -> tuple[int, float, int]:
    """(pid, CPU % since the last call, RSS bytes) of this worker process, read by the
    process itself with psutil (a dependency of distributed); run by ``client.run``.
    The first call primes the CPU counter and reports 0 %."""
    import psutil

    if not _process:
        _process.append(psutil.Process())
    process = _process[0]
    with process.oneshot():
        return os.getpid(), process.cpu_percent(None), process.memory_info().rss


# ------------------------------------------------------------------------- driver side
class ClusterAnswers(RunRecord):
    """The cluster run's answers (see the module docstring); ``record.ClusterLog`` keeps
    what they read."""

    live_state_missing = "it needs the embedded runtime's own state"
    processes_elsewhere = True
    # What ``ClusterLog`` keeps that the answers read.
    backend: Any
    debugging: Any
    output: Any
    dashboard: Any
    row_info: dict[int, dict[str, Any]]
    actor_info: dict[int, dict[str, Any]]
    transfers: deque[Transfer]

    if TYPE_CHECKING:
        def _row(self, address: str, pid: int, actor_id: int) -> int: ...

    def resources(self) -> tuple[dict[str, float], dict[str, float]]:
        return self.backend.resources()

    def executing_calls(self) -> list[Any]:
        """The session's tasks running on the cluster now (``cluster_stuck``)."""
        from lightwork.engines.distributed import stuck as cluster_stuck

        self.check_reachable()
        return cluster_stuck.executing_calls(self)

    # -- queries ---------------------------------------------------------------------------
    def check_reachable(self) -> None:
        """Fail at once, saying why, when the cluster cannot answer (instead of waiting
        for the client's reconnection timeout and then a ``ConnectionPool is closed``)."""
        client = self.backend.client
        status = getattr(client, "status", "running")
        if status != "running":
            try:
                where = f" at {client.scheduler.address}"
            except Exception:  # noqa: BLE001 - only for the message
                where = ""
            raise exceptions.RuntimeSystemError(
                f"the Dask cluster{where} does not answer (its client is {status!r}): the "
                "scheduler may have stopped or the network is down. Restart the scheduler "
                "(workers reconnect), or call lightwork.shutdown() and init() again")

    def answer_query(self, op: str, args: dict[str, Any]) -> Any:
        """The diagnostics operations this log can answer (see the module docstring)."""
        from lightwork.kernel import views

        if op != "ping":
            self.check_reachable()
        if not self.log.enabled and (op in _READS_THE_LOG or (
                op == "list" and args.get("kind") == "tasks")):
            raise exceptions.UnsupportedOnBackend(
                f"{_READS_THE_LOG.get(op, 'listing tasks')} is not available on the "
                "distributed backend in this session: its event log is off "
                "(init(event_budget=0)); leave event_budget at its default to have it. The "
                "workers, actors, objects, status and stacks are still there")
        from lightwork.engines.distributed.state import ClusterState

        state = ClusterState(self)
        if op == "ping":
            return {"session": self.session.name, "driver_pid": os.getpid(),
                    "backend": "distributed"}
        if op == "list" and args.get("kind") in ("actors", "workers", "objects"):
            self.sync()
            listers = {"actors": state.actor_rows, "workers": state.worker_rows,
                       "objects": state.object_rows}
            kind = args["kind"]
            limit = args.get("limit", views.DEFAULT_LIMIT)
            rows, total = views.filter_rows(kind, listers[kind](), args.get("filters"), limit)
            return {"rows": rows, "total": total}
        if op == "memory_summary":
            return state.memory_summary()
        if op == "logs":  # `lightwork logs`: what calls printed, as the driver kept it
            return answer_logs(self.output, self.session.name, args)
        if op == "debug_paused":  # `lightwork debug`: the calls paused in the debugger
            return {"session": self.session.name,
                    "paused": self.debugging.rows() if self.debugging is not None else []}
        if op == "status":
            self.sync()
            return state.status()
        if op == "list" and args.get("kind") == "tasks":
            self.sync()
            state.refresh_live_states()
            limit = args.get("limit", views.DEFAULT_LIMIT)
            rows, total = views.filter_rows("tasks", views.task_rows(self),
                                            args.get("filters"), limit)
            return {"rows": rows, "total": total}
        if op == "summarize_tasks":
            self.sync()
            return views.summarize_tasks(self)
        if op == "timeline_data":
            self.sync()
            return self.timeline_data()
        if op == "advise":
            advisor = tools.advisor()

            self.sync()
            return {"session": self.session.name, "live": False,
                    "findings": [f.as_dict() for f in advisor.current_findings(self)]}
        if op == "stacks":
            timeout = float(args.get("timeout", PULL_TIMEOUT_S))
            if not 0 < timeout <= 60:
                raise ValueError(f"the stack timeout must be in (0, 60] seconds, got {timeout}")
            return self.stacks(timeout)
        if op in ("sample_start", "sample_stop", "sample"):  # Dask's own sampler
            from lightwork.engines.distributed import profiling

            return profiling.answer(self, op, args)
        if op == "list":
            raise ValueError(f"cannot list {args.get('kind')!r}; choose one of tasks, "
                             "actors, workers, objects")
        handler = control.extra_op(op)  # the live dashboard's, registered by it
        if handler is not None:
            return handler(self, op, args)
        raise ValueError(f"unknown operation {op!r} on the distributed backend")

    # -- the live dashboard (lightwork.dashboard.feed reads these; see cluster_dashboard) -
    def dashboard_facts(self, live_limit: int) -> dict[str, Any]:
        if self.dashboard is None:
            from lightwork.engines.distributed.dashboard import DashboardFacts

            self.dashboard = DashboardFacts(self)
        return self.dashboard.facts(live_limit)

    def object_ready(self, object_id: int) -> bool:
        """Whether the object is there (or freed): a running get's progress."""
        future = self.backend.futures.get(object_id)
        # A small result sent straight here is ready before its future hears of it.
        return future is None or bool(future.done()) or self.backend.fetch.came(object_id)

    def remote_process_usage(self) -> dict[str, tuple[int, float, int]]:
        try:
            replies = self.backend.client.run(process_usage, on_error="ignore")
        except Exception:  # noqa: BLE001 - the cluster went away: no sample this time
            return {}
        return {str(address): reply for address, reply in replies.items()}

    def pending_objects(self, object_ids: list[int]) -> list[int] | None:
        return [object_id for object_id in object_ids if not self.object_ready(object_id)]

    def store_facts(self) -> StoreFacts:
        """What the driver holds (its futures); the values live in the workers' memory,
        which the scheduler reports (``dashboard_facts``' ``cluster_bytes``)."""
        return StoreFacts(objects=len(self.backend.futures), shared_memory_bytes=0,
                          freed_objects=None)

    def cancel(self, object_ids: list[int], force: bool) -> None:
        self.backend.cancel(object_ids, force, recursive=False)

    def kill_actor(self, actor_id: int) -> None:
        self.backend.kill_actor(actor_id, True)

    def knows_actor(self, actor_id: int) -> bool:
        return actor_id in self.actors.actors or actor_id in self.actor_info

    def timeline_data(self) -> dict[str, Any]:
        """``views.timeline_data`` for a cluster run: one row per worker and per actor."""
        from lightwork.kernel import views
        advisor = tools.advisor()

        with self.lock:
            ended = self.log.ended_records()
            live = [views._record_row(task.record) + (task.state, task.actor_id, 0)
                    for task in self.tasks.values()]
            span_records = list(self.log.spans)
            rows = {str(row): dict(info) for row, info in self.row_info.items()}
            transfers = [list(transfer) for transfer in self.transfers]
        spans = [(s.kind, s.start, s.end, s.object_count, s.thread_id) for s in span_records]
        threads = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
        return {
            "session": self.session.name,
            "driver_pid": os.getpid(),
            "forkserver_pid": None,
            "base": self.log.started_at,
            "base_wall": self.log.started_at_wall,
            "now": time.monotonic(),
            "budget": self.log.budget,
            "record_fields": list(views.RECORD_FIELDS),
            "tasks": [views._record_row(record) for record in ended],
            "live": [list(row) for row in live],
            "spans": spans,
            "transfers": transfers,
            "threads": {str(ident): name for ident, name in threads.items()},
            "workers": rows,
            "profile": [],
            "samples": [],
            "dropped": {"tasks": self.log.dropped_tasks, "spans": self.log.dropped_spans,
                        "profile": 0, "samples": 0},
            "findings": [f.as_dict() for f in advisor.current_findings(
                self, ended, span_records)],
            "advisor_input": advisor.analysis_input(self, ended, span_records),
        }

    def stacks(self, timeout: float) -> dict[str, Any]:
        """``control.collect_stacks``'s reply, with every cluster worker's threads."""
        from lightwork.engines.distributed.record import error_text  # (record imports this)
        from lightwork.kernel.control import driver_threads

        client = self.backend.client
        replies = client.run(dump_stacks, on_error="return")
        workers = []
        for address, reply in sorted(replies.items()):
            pid = 0 if isinstance(reply, BaseException) else reply["pid"]
            with self.lock:  # the row number of the worker's tasks, as list_workers shows
                row = self._row(str(address), pid, 0)
            entry = {"worker_id": row, "label": str(address), "status": "ok",
                     "note": None, "text": "", "doing": "dask worker"}
            if isinstance(reply, BaseException):
                entry.update(pid=0, status="error", note=error_text(reply), threads=[])
            else:
                entry.update(pid=reply["pid"], threads=reply["threads"])
            workers.append(entry)
        return {"driver": {"pid": os.getpid(), "threads": driver_threads()},
                "workers": workers, "timeout": timeout}
