"""The live dashboard on a cluster run: what a ``dashboard_sync`` needs beyond the log.

The dashboard process reads a cluster session as it reads a local one: through the
driver's control socket (``cluster_control``), whose ``ClusterLog.answer_query`` hands
the ``dashboard_*`` operations to ``lightwork.dashboard.feed``, as the embedded
runtime's control server does. The feed reads the event log as on a node (new task
records, the driver's blocked spans, live tasks by state, running ``get``/``wait``
calls); the rest a node knows of itself, a cluster driver asks its scheduler, in
:func:`facts` (the feed calls ``ClusterLog.dashboard_facts`` before taking the log's lock):

* one pull of the workers' new stamps (``ClusterLog.sync``, one ``client.run``), so the
  task stream and the tasks table are current to the request;
* one ``client.run`` for the actors this session's tasks created on the workers
  (``cluster_worker.held_refs`` without the refs);
* one ``run_on_scheduler`` round trip (``cluster_state.scheduler_facts``) for the
  workers (their rows: address, pid, state, running task, the CPU and memory they
  measure themselves), the states of the oldest ``live_limit`` live tasks (the page's
  live rows) and where the session's actors are;
* when each worker process started, asked once per process (``client.run``) and kept.

Resources are ``cluster_state.resource_use``'s, as ``available_resources()`` counts them:
CPU is the workers' declared ``CPU`` (their threads where none is declared), used by
restricted tasks plus one per thread running a task that asks for no CPU resource.

The rows of the task stream are the event log's (``ClusterLog._row``): one per cluster
worker and one per actor, labelled with the address and pid (``known_workers``).

The advisor's findings: a cluster run has no live advisor, so the first sync feeds an
offline :class:`~lightwork.diagnostics.advisor.Advisor` the whole log, and each sync
after it the records added since (``EventLog.take_fresh``). Once no sync came for
``IDLE_S`` the log stops keeping spans for it (checked by the log's pull thread,
``ClusterLog.dashboard_idle``), and the next sync starts over from the whole log.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from lightwork.engines.distributed.state import resource_use

IDLE_S = 30.0  # no dashboard sync for this long: stop keeping fresh records for it
MAX_ACTORS = 2_000  # as the feed's


class DashboardFacts:
    """What one cluster run's dashboard syncs keep between them (one per ``ClusterLog``)."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self._lock = threading.Lock()  # one sync at a time builds the findings
        self._advisor: Any = None
        self._last_sync = 0.0
        self._driver: Any = None  # this process (psutil), its CPU counter primed

    def facts(self, live_limit: int) -> dict[str, Any]:
        """The feed's picture of the cluster (see the module docstring); no lock held."""
        from lightwork.engines.distributed.state import ClusterState

        log = self.log
        log.check_reachable()
        log.sync()
        state = ClusterState(log)
        live = state.live_keys(live_limit)
        on_workers = state.held_on_workers(with_refs=False)  # actors its tasks created
        keys = tuple(key for _, key in live) + state.actor_keys() + tuple(
            actor["key"] for reply in on_workers.values() for actor in reply["actors"]
            if actor["key"] is not None)
        scheduler = state._facts(keys)
        state.apply_live_states(live, scheduler)
        workers = state.worker_rows(scheduler, driver=self._driver_process())
        actors = state.actor_rows(scheduler, on_workers)
        workers += _actor_rows(log, actors)
        with log.lock:
            known = {str(row): {"pid": info["pid"], "actor_class": info["actor_class"],
                                "actor_id": info["actor_id"], "label": _label(key, info)}
                     for key, row in log.rows.items()
                     for info in (log.row_info[row],)}
            actor_count = len(log.actor_info)
        store = log.store_facts()
        store["cluster_bytes"] = sum(info["nbytes"] for info in scheduler["workers"].values())
        return {
            "resources": resource_use(scheduler["workers"]),
            "workers": workers,
            "known_workers": known,
            "actors": actors[:MAX_ACTORS],
            "actor_count": actor_count,
            "store": store,
            "findings": self.findings(),
        }

    def _driver_process(self) -> Any:
        if self._driver is None:
            import psutil

            self._driver = psutil.Process()
            self._driver.cpu_percent(None)  # primes it: the next reading is since now
        return self._driver

    def findings(self) -> list[dict[str, Any]]:
        """The advisor's findings on the records so far (see the module docstring)."""
        from lightwork.kernel import tools

        Advisor = tools.advisor().Advisor

        log = self.log
        with self._lock:
            self._last_sync = time.monotonic()
            with log.lock:
                if self._advisor is None or not log.log.watching:
                    tasks, spans = log.log.ended_records(), list(log.log.spans)
                    log.log.watch()
                    fresh = None
                else:
                    fresh = log.log.take_fresh()
                    fresh = fresh._replace(records=list(fresh.records))  # (read under the lock)
            if fresh is None:
                cpus = log.cpu_total()
                self._advisor = Advisor(None, watch=False, cpus=cpus,
                                        started_at=log.log.started_at)
                self._advisor.feed(tasks, spans)
            elif fresh.records or fresh.spans:
                # The log's records: the advisor only reads them.
                self._advisor.feed(fresh.records, fresh.spans)
            with self._advisor._lock:
                return [finding.as_dict() for finding in self._advisor.findings]

    def idle(self) -> None:
        """Called by the log's pull thread: stop keeping fresh records nobody takes."""
        if self._advisor is not None and time.monotonic() - self._last_sync > IDLE_S:
            log = self.log
            with log.lock:
                log.log.unwatch()
            self._advisor = None


def _actor_rows(log: Any, actors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A worker-table row per placed actor, numbered as its row of the task stream (an
    actor lives in a cluster worker's process: pid and address are that worker's; its
    CPU and memory are the worker's, in the worker's row)."""
    rows = []
    for actor in actors[:MAX_ACTORS]:
        address = actor["address"]
        if not address:
            continue
        actor_id = int(actor["actor_id"], 16)
        with log.lock:
            row = log._row(address, actor["pid"] or 0, actor_id)
        rows.append({
            "worker_id": row, "pid": actor["pid"], "kind": "actor", "state": actor["state"],
            "actor_id": actor["actor_id"], "actor_class": actor["class_name"],
            "running": None, "task_id": None, "queued": actor["queued"], "alive_s": None,
            "address": address, "cpu_percent": None, "rss": None})
    return rows


def _label(key: Any, info: dict[str, Any]) -> str:
    """A task-stream row's label, short enough for its column: a worker's host:port, an
    actor's class."""
    if info["actor_class"]:
        return f"{info['actor_class'].split('.<locals>.')[-1]} (actor)"
    return str(key).split("://")[-1]
