"""The timeline: the always-on event log as Chrome trace events (Perfetto, chrome://tracing).

``timeline(filename=None)`` returns the list of trace events, or writes them to
``filename`` (JSON object format: ``traceEvents`` plus ``otherData`` with the session,
the event budget and what it dropped). ``lightwork timeline --output FILE`` writes the
same file from another terminal: the driver sends the raw material
(``views.timeline_data``) over the control socket and :func:`build_trace` runs in the
command's own process, so a large trace costs the running program one copy of its log.

Layout (pid/tid are integers, named by ``process_name``/``thread_name`` metadata):

* the driver (its pid): one row per thread with the time it spent blocked in ``get``
  and ``wait`` (a ``get`` inside a loop is a staircase of spans, each over one task) and
  its ``profile`` spans; a ``submit`` row holding the start of every flow arrow; an
  ``events`` row with instants for retries, crashes, failures, cancellations and the
  advisor's findings (``advice: get-in-loop`` at the time it was seen, with its title,
  evidence, fix and call site as args); the ``tasks`` counter (queued / running) and the
  session's total CPU and memory.
* every worker process (its pid; a synthetic pid above ``SYNTHETIC_PID`` when a pooled
  worker exited before its pid was seen): named by the functions it ran, or by its
  actor's class, and its pid. On a cluster, a worker's ``transfers`` rows hold the
  fetches of its tasks' dependencies from other workers (a ``transfer`` span each, with
  the bytes, the source worker and the task it fed as args), as Dask's task stream
  shows. Each task is a span ``[started, stored]`` with children ``load args``,
  ``execute``, ``store result``, preceded by a ``queued`` span for the
  part of its queueing that this row was free (the rest overlaps the previous task; the
  whole wait is in ``args.queued_ms``). Threaded and async actors run calls at once, so
  their calls are spread over as many ``tasks`` rows as were busy together: no two spans
  on a row overlap, they only nest. A generator task has a ``yield <i>`` instant on its
  row for each item it yielded. Per-process ``cpu %`` and ``memory MB`` counters.
* flow arrows from the submitting call (driver or the worker whose task submitted) to
  the execution, by task id.
* with a task profile's samples (``TaskProfile.timeline()``): a ``samples`` row in each
  sampled process, under its task rows, holding the samples as a flame chart, the way
  Perfetto draws a CPU profile: a span per frame, outermost (the task function, or
  ``(driver)``) at the top, each lasting from the sample that first showed it to the
  end of the last one in a row that did (a sample stands for one interval, ``1/hz``,
  and for at most two across a gap), so a function that ran 30 ms in a row is one
  30 ms box. Where one round sampled several threads of a process (a threaded actor,
  the driver's threads), the k-th stack of a round goes to the k-th ``samples`` row.

Times are microseconds since ``init`` on ``time.monotonic``, the clock of every process.
Counters are coalesced into at most ~20,000 points per series. The log is bounded by
the event budget (``init(event_budget=...)``): the oldest records go first, and the
trace says how many (driver's ``process_labels``, an instant at 0, ``otherData``).

The written file's ``otherData`` also carries the advisor's input (``advisor_input``:
every task record and blocked span the log held, as dicts, and the CPU count) and its
findings, so ``lightwork advise FILE`` re-runs the analysis offline and ``lightwork
dashboard --from FILE`` replays it; both read it back with :func:`read_saved`.

``profile(name, extra_data=None)`` records a custom span in the driver (a ring bounded
by the budget), a task or an actor (appended to the worker's file in the session
directory, see ``kernel/control.py``); it shows nested in the task that ran it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from types import TracebackType
from typing import Any

from lightwork.kernel import control

__all__ = ["build_trace", "profile", "timeline", "write_trace"]

SYNTHETIC_PID = 4_000_000  # above Linux's pid_max default (4,194,304 is its maximum)
SUBMIT_TID = 100_000
PROFILE_TID = 100_001
EVENTS_TID = 100_002
TRANSFERS_TID = 100_010  # a cluster worker's first ``transfers`` row (more when they overlap)
SAMPLES_TID = 100_100  # a process's first ``samples`` row (a task profile's, more per thread)
MAX_COUNTER_POINTS = 20_000


# ---------------------------------------------------------------------------- public API
def timeline(filename: str | None = None) -> list[dict[str, Any]] | None:
    """Chrome trace events of this session; written to ``filename`` if given (as Ray)."""
    from lightwork.state import query

    data = query("timeline_data")
    events = build_trace(data)
    if filename is None:
        return events
    write_trace(filename, events, data)
    return None


def read_saved(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A saved timeline file's ``otherData`` and the event log in it (``advisor_input``).

    Raises ``ValueError`` saying what is wrong (unreadable, not JSON, or a trace with no
    event log, such as one not written by lightwork) and what to do. JSON only: nothing
    in the file is unpickled.
    """
    try:
        with open(path) as f:
            trace = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read the timeline file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not a JSON timeline file ({exc})") from None
    other = trace.get("otherData") if isinstance(trace, dict) else None
    data = other.get("advisor_input") if isinstance(other, dict) else None
    if (not isinstance(other, dict) or not isinstance(data, dict)
            or not isinstance(data.get("tasks"), list)):
        raise ValueError(
            f"{path} carries no advisor input (the event log lightwork saves in a timeline): "
            "only timelines written by lightwork.timeline(FILE), `lightwork timeline -o "
            "FILE`, the demo or the dashboard's download can be read; write a new one from "
            "the running program")
    return other, data


def write_trace(filename: str, events: list[dict[str, Any]], data: dict[str, Any]) -> None:
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "lightwork",
            "session": data.get("session"),
            "started_at_unix_s": data.get("base_wall"),
            "event_budget": data.get("budget"),
            "dropped": data.get("dropped", {}),
            "findings": data.get("findings", []),
            "advisor_input": data.get("advisor_input"),
        },
    }
    with open(filename, "w") as f:
        json.dump(trace, f, separators=(",", ":"))


class profile:
    """``with profile("load data", extra_data={"rows": n}):`` — a span on the timeline.

    Works in the driver, in tasks and in actor methods; outside a runtime it does nothing.
    ``extra_data`` values show as the span's args (non-JSON values as their repr).
    """

    __slots__ = ("name", "extra_data", "start")

    def __init__(self, name: str, extra_data: dict[str, Any] | None = None) -> None:
        self.name = str(name)
        self.extra_data = extra_data
        self.start = 0.0

    def __enter__(self) -> profile:
        self.start = time.monotonic()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        end = time.monotonic()
        extra = _jsonable(self.extra_data)
        if kind is not None:
            extra["error"] = f"{kind.__name__}: {value}"[:200]
        _record_profile(self.name, self.start, end, extra)


def _jsonable(extra: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (extra or {}).items():
        ok = isinstance(value, (str, int, float, bool)) or value is None
        out[str(key)] = value if ok else repr(value)[:200]
    return out


def _record_profile(name: str, start: float, end: float, extra: dict[str, Any]) -> None:
    from lightwork.api import core as _api

    backend = _api._backend
    if backend is not None and not backend.closed and backend.in_driver:
        record = backend.run_record()
        if record is not None:
            record.add_profile([name, start, end, os.getpid(), threading.get_ident(), None, extra])
        return
    writer = control.worker_profile_writer()  # set in the embedded runtime's workers
    backend = _api._backend
    if writer is not None and backend is not None and not backend.in_driver:
        task_id = backend.runtime_context()["task_id"]
        writer.write([name, start, end, os.getpid(), threading.get_ident(), task_id, extra])


# ---------------------------------------------------------------------------- building
def short_name(name: str) -> str:
    """``test_x.<locals>.work`` -> ``work``; ``Counter.incr`` stays."""
    return name.split(".<locals>.")[-1]


class _Builder:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.base = float(data["base"])
        self.driver = int(data["driver_pid"])
        self.workers = {int(k): v for k, v in data.get("workers", {}).items()}
        self.events: list[dict[str, Any]] = []
        self.process_names: dict[int, str] = {self.driver: f"driver (pid {self.driver})"}
        self.process_order: dict[int, int] = {self.driver: 0}
        self.thread_names: dict[tuple[int, int], str] = {}
        self.functions: dict[int, dict[str, int]] = {}
        self.lanes: dict[int, list[float]] = {}  # pid -> end of the last span on each lane
        self.task_rows: dict[int, tuple[int, int]] = {}  # task id -> (pid, tid) it ran on
        self.submits: dict[tuple[int, int], list[tuple[float, int]]] = {}
        self.flow_ends: dict[int, tuple[int, int, float]] = {}  # task id -> (pid, tid, ts)
        self.driver_tids: dict[int, int] = {}  # thread ident -> tid

    def us(self, t: float) -> float:
        return round((t - self.base) * 1e6, 3)

    def add(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def span(self, name: str, cat: str, pid: int, tid: int, start: float, end: float,
             args: dict[str, Any] | None = None) -> dict[str, Any]:
        event = {"name": name, "cat": cat, "ph": "X", "ts": start,
                 "dur": round(max(0.0, end - start), 3), "pid": pid, "tid": tid}
        if args:
            event["args"] = args
        self.add(event)
        return event

    def instant(self, name: str, pid: int, tid: int, ts: float, args: dict[str, Any],
                cat: str = "event") -> None:
        self.add({"name": name, "cat": cat, "ph": "i", "s": "t", "ts": ts, "pid": pid,
                  "tid": tid, "args": args})

    def worker_pid(self, worker_id: int, pid: int = 0) -> int:
        info = self.workers.get(worker_id, {})
        real = pid or info.get("pid") or 0
        # A cluster backend gives each row its own trace pid ("row") and title ("label"):
        # pids of different machines may collide, and an actor shares its worker's pid.
        process = info.get("row") or real or SYNTHETIC_PID + worker_id
        if process not in self.process_names:
            self.process_order[process] = worker_id
            if info.get("label"):
                self.process_names[process] = info["label"]
            elif info.get("actor_class"):
                actor = short_name(info["actor_class"])
                self.process_names[process] = f"actor {actor} (pid {real or '?'})"
            else:
                self.process_names[process] = f"worker {worker_id} (pid {real or '?'})"
        return process

    def driver_thread(self, ident: int) -> int:
        """A small row number for a driver thread, in order of first appearance."""
        tid = self.driver_tids.get(ident)
        if tid is None:
            tid = self.driver_tids[ident] = len(self.driver_tids) + 1
            name = self.data.get("threads", {}).get(str(ident), f"thread {ident:#x}")
            self.thread_names[(self.driver, tid)] = name
        return tid

    # -- tasks ---------------------------------------------------------------------------
    def tasks(self) -> None:
        fields = self.data["record_fields"]
        width = len(fields)
        records = [dict(zip(fields, row)) for row in self.data.get("tasks", [])]
        for row in self.data.get("live", []):
            record = dict(zip(fields, row[:width]))
            record["live_state"], record["actor_id"], record["live_pid"] = row[width:width + 3]
            records.append(record)
        self.counters(records)
        runs = []
        for record in records:
            if record["started"] and record["stored"]:
                runs.append((self.us(record["started"]), self.us(record["stored"]), record))
            elif str(record.get("live_state", "")).startswith("RUNNING") and record["dispatched"]:
                now = self.us(self.data["now"])
                runs.append((self.us(record["dispatched"]), now, record))
            self.task_instants(record)
        runs.sort(key=lambda run: (run[0], -run[1]))
        for start, end, record in runs:
            self.task_span(start, end, record)
        self.flows()

    def transfers(self) -> None:
        """A cluster's dependency fetches, on the receiving worker's ``transfers`` rows
        (``cluster_record.Transfer``: task id, row, source, bytes, start, stop)."""
        lanes: dict[int, list[float]] = {}  # pid -> end of the last transfer on each row
        for task_id, worker_id, source, nbytes, start, stop in sorted(
                self.data.get("transfers", ()), key=lambda transfer: transfer[4]):
            pid = self.worker_pid(worker_id)
            begin, end = self.us(start), self.us(stop)
            ends = lanes.setdefault(pid, [])
            lane = next((i for i, lane_end in enumerate(ends) if lane_end <= begin), len(ends))
            if lane == len(ends):
                ends.append(end)
            ends[lane] = max(end, begin)
            tid = TRANSFERS_TID + lane
            self.thread_names[(pid, tid)] = "transfers" if lane == 0 else f"transfers #{lane + 1}"
            self.span("transfer", "transfer", pid, tid, begin, end,
                      {"task_id": task_id, "bytes": nbytes, "from": source})

    def task_span(self, start: float, end: float, record: dict[str, Any]) -> None:
        pid = self.worker_pid(record["worker_id"], record.get("live_pid") or record["pid"])
        live = "live_state" in record
        lanes = self.lanes.setdefault(pid, [])
        if live:  # started is unknown until it ends: begin after what the row shows
            start = min(end, max([start] + lanes[:1]))
        lane = next((i for i, lane_end in enumerate(lanes) if lane_end <= start), len(lanes))
        previous_end = lanes[lane] if lane < len(lanes) else None
        if lane == len(lanes):
            lanes.append(end)
        lanes[lane] = end
        tid = lane + 1
        self.thread_names[(pid, tid)] = "tasks" if lane == 0 else f"tasks #{lane + 1}"
        name = short_name(record["name"])
        self.functions.setdefault(pid, {}).setdefault(name, 0)
        self.functions[pid][name] += 1
        ready = record["deps_ready"] or record["submitted"]
        queued_from = self.us(ready)
        if previous_end is not None:
            queued_from = max(queued_from, previous_end)
        if queued_from < start:
            self.span("queued", "queue", pid, tid, queued_from, start,
                      {"task_id": record["task_id"]})
        began = record["started"] or record["dispatched"]
        args = {
            "task_id": record["task_id"], "name": record["name"], "attempt": record["attempt"],
            "worker_id": record["worker_id"], "owner": record["owner"],
            "arg_size": record["arg_size"], "result_size": record["result_size"],
            "queued_ms": round(max(0.0, began - ready) * 1e3, 3),
            "state": record.get("live_state") or record["state"],
        }
        if record["error"]:
            args["error"] = record["error"]
        if live:
            args["note"] = "still running when the trace was taken; it began at or after this"
        self.span(name, "task", pid, tid, start, end, args)
        for index, when in enumerate(record.get("yields") or ()):  # a generator's items
            self.instant(f"yield {index}", pid, tid, self.us(when),
                         {"task_id": record["task_id"], "index": index}, cat="yield")
        if not live:
            loaded, finished = self.us(record["args_loaded"]), self.us(record["finished"])
            for phase, a, b in (("load args", start, loaded), ("execute", loaded, finished),
                                ("store result", finished, end)):
                if b > a:
                    self.span(phase, "phase", pid, tid, a, b)
        for began_pause, ended_pause in record.get("paused") or ():  # in the debugger
            a = max(start, self.us(began_pause))
            b = min(end, self.us(ended_pause))
            if b > a:
                self.span("paused in the debugger", "debugger", pid, tid, a, b,
                          {"task_id": record["task_id"],
                           "paused_ms": round((ended_pause - began_pause) * 1e3, 3)})
        self.task_rows[record["task_id"]] = (pid, tid)
        owner = record["owner"]
        submitter = self.driver if owner == 0 else self.worker_pid(owner)
        if record["task_id"] not in self.flow_ends:  # one submit per task: a task run again
            # (its result lost with a worker, on a cluster) has one arrow, to its last run
            self.submits.setdefault((submitter, SUBMIT_TID), []).append(
                (self.us(record["submitted"]), record["task_id"]))
        self.thread_names[(submitter, SUBMIT_TID)] = "submit"
        self.flow_ends[record["task_id"]] = (pid, tid, round(start + (end - start) / 2, 3))

    def flows(self) -> None:
        ends = self.flow_ends
        for (pid, tid), submits in self.submits.items():
            submits.sort()
            points = sorted({ts for ts, _ in submits})
            anchor_dur = {}
            for i, ts in enumerate(points):
                following = points[i + 1] if i + 1 < len(points) else ts + 1.0
                anchor_dur[ts] = round(min(1.0, following - ts), 3)
            counts: dict[float, int] = {}
            for ts, _ in submits:
                counts[ts] = counts.get(ts, 0) + 1
            for ts in points:
                self.span("submit", "submit", pid, tid, ts, ts + anchor_dur[ts],
                          {"tasks": counts[ts]})
            for ts, task_id in submits:
                end_pid, end_tid, end_ts = ends[task_id]
                flow = {"name": "task", "cat": "flow", "id": task_id}
                self.add({**flow, "ph": "s", "pid": pid, "tid": tid, "ts": ts + anchor_dur[ts] / 2})
                self.add({**flow, "ph": "f", "bp": "e", "pid": end_pid, "tid": end_tid,
                          "ts": end_ts})

    def task_instants(self, record: dict[str, Any]) -> None:
        name = short_name(record["name"])
        base = {"task_id": record["task_id"], "name": record["name"]}
        for t, reason in record["retries"] or ():
            kind = "worker crashed" if str(reason).startswith("worker crashed") else "retry"
            if str(reason).startswith("actor restarted"):
                kind = "actor restarted"
            self.instant(f"{kind}: {name}", self.driver, EVENTS_TID, self.us(t),
                         {**base, "reason": reason})
        error = record["error"]
        if error:
            times = ("submitted", "deps_ready", "dispatched", "finished", "seen")
            when = max(record[k] or 0.0 for k in times)
            kind = "cancelled" if "Cancelled" in error else "failed"
            self.instant(f"{kind}: {name}", self.driver, EVENTS_TID, self.us(when),
                         {**base, "error": error, "worker_id": record["worker_id"]})

    def counters(self, records: list[dict[str, Any]]) -> None:
        now = self.data["now"]
        changes: list[tuple[float, int, int]] = []
        for r in records:
            live = "live_state" in r
            if r["deps_ready"]:
                is_running = str(r.get("live_state", "")).startswith("RUNNING")
                began = r["started"] or (r["dispatched"] if is_running else 0.0)
                until = began or r["finished"] or r["seen"] or (now if live else r["deps_ready"])
                changes += [(r["deps_ready"], 1, 0), (until, -1, 0)]
                if began:
                    changes += [(began, 0, 1), (r["stored"] or r["finished"] or now, 0, -1)]
        if not changes:
            return
        changes.sort()
        extent = self.us(changes[-1][0]) - self.us(changes[0][0])
        resolution = max(1.0, extent / MAX_COUNTER_POINTS)
        queued = running = 0
        bucket_ts: float | None = None
        for i, (t, dq, dr) in enumerate(changes):
            queued += dq
            running += dr
            ts = self.us(t)
            if bucket_ts is None:
                bucket_ts = ts
            last = i + 1 == len(changes)
            if last or self.us(changes[i + 1][0]) - bucket_ts >= resolution:
                self.add({"name": "tasks", "cat": "counter", "ph": "C", "ts": bucket_ts,
                          "pid": self.driver, "tid": 0,
                          "args": {"queued": queued, "running": running}})
                bucket_ts = None

    # -- driver --------------------------------------------------------------------------
    def driver_spans(self) -> None:
        for kind, start, end, count, ident in self.data.get("spans", []):
            tid = self.driver_thread(int(ident))
            note = ("lightwork copied a big value into the object store" if kind == "put"
                    else "lightwork pickled a remote function or actor class"
                    if kind == "define" else f"the driver was blocked in {kind}()")
            self.span(kind, "driver", self.driver, tid, self.us(start), self.us(end),
                      {"objects": count, "note": note})

    def profile_spans(self) -> None:
        spans = sorted(self.data.get("profile", []), key=lambda p: (p[1], -p[2]))
        free_lanes: dict[int, list[float]] = {}
        for name, start, end, pid, ident, task_id, extra in spans:
            ts, te = self.us(start), self.us(end)
            if pid == self.driver:
                tid = self.driver_thread(int(ident))
            elif task_id is not None and task_id in self.task_rows:
                pid, tid = self.task_rows[task_id]
            else:
                pid = self._pid_for_process(pid)
                lanes = free_lanes.setdefault(pid, [])
                lane = next((i for i, e in enumerate(lanes) if e <= ts), len(lanes))
                if lane == len(lanes):
                    lanes.append(te)
                lanes[lane] = te
                tid = PROFILE_TID + 10 * lane
                self.thread_names[(pid, tid)] = "profile" if lane == 0 else f"profile #{lane + 1}"
            self.span(str(name), "profile", pid, tid, ts, te, {**(extra or {}), "task_id": task_id})

    def _pid_for_process(self, pid: int) -> int:
        for worker_id, info in self.workers.items():
            if info.get("pid") == pid:
                return self.worker_pid(worker_id, pid)
        self.process_names.setdefault(pid, f"process {pid}")
        return pid

    def findings(self) -> None:
        """The advisor's findings, on the driver's events row when each was seen."""
        for finding in self.data.get("findings", []):
            callsite = finding.get("callsite")
            where = f"{callsite[0]}:{callsite[1]} in {callsite[2]}" if callsite else None
            args = {"kind": finding["kind"], "title": finding["title"],
                    "evidence": finding.get("evidence", {}),
                    "suggestion": finding.get("suggestion"), "callsite": where}
            ts = max(0.0, self.us(float(finding.get("seen_at") or self.base)))
            self.instant(f"advice: {finding['kind']}", self.driver, EVENTS_TID, ts, args,
                         cat="advice")

    # -- resources ----------------------------------------------------------------------
    def usage(self) -> None:
        forkserver = self.data.get("forkserver_pid")
        pid_rows = {}
        for worker_id, info in self.workers.items():
            if info.get("pid"):
                pid_rows[info["pid"]] = worker_id
        for t, readings in self.data.get("samples", []):
            ts = self.us(t)
            total_cpu = total_rss = 0.0
            for pid, cpu, rss in readings:
                total_cpu += cpu
                total_rss += rss
                if pid == self.driver:
                    row = pid
                elif pid in pid_rows:
                    row = self.worker_pid(pid_rows[pid], pid)
                elif pid == forkserver:
                    row = pid
                    self.process_names.setdefault(pid, f"fork server (pid {pid})")
                    self.process_order.setdefault(pid, 1_000_000)
                else:
                    continue
                self.add({"name": "cpu %", "cat": "usage", "ph": "C", "ts": ts, "pid": row,
                          "tid": 0, "args": {"cpu": cpu}})
                self.add({"name": "memory MB", "cat": "usage", "ph": "C", "ts": ts, "pid": row,
                          "tid": 0, "args": {"rss": round(rss / 2**20, 2)}})
            self.add({"name": "session cpu %", "cat": "usage", "ph": "C", "ts": ts,
                      "pid": self.driver, "tid": 0, "args": {"cpu": round(total_cpu, 1)}})
            self.add({"name": "session memory MB", "cat": "usage", "ph": "C", "ts": ts,
                      "pid": self.driver, "tid": 0, "args": {"rss": round(total_rss / 2**20, 2)}})

    # -- a task profile's samples -------------------------------------------------------
    def samples(self, timed: list[tuple[float, int, int, str, tuple[str, ...]]],
                hz: float) -> None:
        """``timed``: ``(monotonic time, worker id (0: driver), pid, label, frames)``."""
        rows: dict[tuple[int, int], list[tuple[float, tuple[str, ...]]]] = {}
        lane_of: dict[tuple[int, float], int] = {}  # (process, round's time) -> next lane
        for t, worker_id, pid, label, frames in sorted(timed, key=lambda s: s[0]):
            process = self.driver if worker_id == 0 else self.worker_pid(worker_id, pid)
            lane = lane_of.get((process, t), 0)
            lane_of[(process, t)] = lane + 1
            rows.setdefault((process, SAMPLES_TID + lane), []).append((t, (label, *frames)))
        period = 1.0 / hz
        for (process, tid), row in rows.items():
            lane = tid - SAMPLES_TID
            self.thread_names[(process, tid)] = f"samples ({hz:g} Hz)" + (
                f" {lane + 1}" if lane else "")
            self._flame_chart(process, tid, row, period)

    def _flame_chart(self, process: int, tid: int,
                     row: list[tuple[float, tuple[str, ...]]], period: float) -> None:
        opened: list[list[Any]] = []  # [name, start, samples], outermost first
        last_end = 0.0

        def close(depth: int, at: float) -> None:
            while len(opened) > depth:
                name, start, count = opened.pop()
                self.span(name, "sample", process, tid, self.us(start), self.us(at),
                          {"samples": count})

        for i, (t, stack) in enumerate(row):
            end = min(row[i + 1][0], t + 2 * period) if i + 1 < len(row) else t + period
            if opened and t > last_end:
                close(0, last_end)  # a gap: nothing ran here in between
            same = 0
            while same < len(opened) and same < len(stack) and opened[same][0] == stack[same]:
                same += 1
            close(same, t)
            for depth, name in enumerate(stack):
                if depth < same:
                    opened[depth][2] += 1
                else:
                    opened.append([name, t, 1])
            last_end = end
        close(0, last_end)

    # -- metadata ------------------------------------------------------------------------
    def metadata(self) -> list[dict[str, Any]]:
        dropped = self.data.get("dropped", {})
        budget = self.data.get("budget")
        parts = [f"{n} {what}" for what, n in (
            ("task records", dropped.get("tasks", 0)), ("blocked spans", dropped.get("spans", 0)),
            ("profile spans", dropped.get("profile", 0)),
            ("usage samples", dropped.get("samples", 0)),
        ) if n]
        note = (f"event budget {budget}: dropped the oldest " + ", ".join(parts)) if parts \
            else f"event budget {budget}: nothing dropped"
        meta: list[dict[str, Any]] = [
            {"name": "process_labels", "ph": "M", "pid": self.driver, "tid": 0,
             "args": {"labels": note}},
        ]
        if parts:
            self.instant("events dropped", self.driver, EVENTS_TID, 0.0,
                         {"note": note, **{k: v for k, v in dropped.items()}})
        if any(e.get("tid") == EVENTS_TID for e in self.events):
            self.thread_names[(self.driver, EVENTS_TID)] = "events"
        for pid, name in self.process_names.items():
            functions = self.functions.get(pid)
            if functions and name.startswith("worker"):  # "worker 3: f, g (pid 123)"
                top = sorted(functions, key=lambda f: -functions[f])[:3]
                head, _, tail = name.partition(" (")
                name = f"{head}: {', '.join(top)} ({tail}"
            meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                         "args": {"name": name}})
            meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                         "args": {"sort_index": self.process_order.get(pid, 0)}})
        for (pid, tid), name in self.thread_names.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                         "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                         "args": {"sort_index": tid}})
        return meta


def build_trace(data: dict[str, Any],
                samples: list[tuple[float, int, int, str, tuple[str, ...]]] | None = None,
                hz: float = 100.0) -> list[dict[str, Any]]:
    """Trace events (metadata first, then by time) from ``views.timeline_data``, with a
    task profile's timed ``samples`` at ``hz`` (``_Builder.samples``) if given."""
    builder = _Builder(data)
    if samples:
        builder.samples(samples, hz)
    builder.driver_spans()
    builder.tasks()
    builder.transfers()
    builder.profile_spans()
    builder.findings()
    builder.usage()
    meta = builder.metadata()
    builder.events.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    return meta + builder.events
