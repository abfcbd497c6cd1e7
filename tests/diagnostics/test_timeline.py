"""The timeline: Chrome trace events that open in Perfetto, checked against the format.

Every trace these tests produce goes through ``check_trace`` (also used by
test_cli.py): required fields per phase, integer pid/tid, names for every process and
thread that carries events, complete events on one row either disjoint or nested (never
partly overlapping), and flow starts and ends that pair up inside a span of their row.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import defaultdict
from typing import Any

import pytest

from tests import helpers, support
import lightwork
from lightwork.diagnostics.timeline import build_trace, profile, timeline

pytestmark = pytest.mark.lightwork_only

REQUIRED = {"X": ("name", "ts", "dur", "pid", "tid"), "i": ("name", "ts", "pid", "tid", "s"),
            "C": ("name", "ts", "pid", "args"), "M": ("name", "pid", "args"),
            "s": ("name", "cat", "id", "ts", "pid", "tid"), "f": ("name", "cat", "id", "ts", "pid", "tid")}
METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def check_trace(events: list[dict[str, Any]]) -> None:
    """Fail with a list of problems if ``events`` break the trace event format."""
    problems: list[str] = []
    named_processes, named_threads = set(), set()
    rows: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    flows: dict[tuple[str, str, Any], dict[str, dict]] = defaultdict(dict)
    for event in events:
        phase = event.get("ph")
        if phase not in REQUIRED:
            problems.append(f"unknown phase {phase!r}: {event}")
            continue
        missing = [key for key in REQUIRED[phase] if key not in event]
        if missing:
            problems.append(f"{phase} event without {missing}: {event}")
            continue
        for key in ("pid", "tid"):
            if key in event and type(event[key]) is not int:
                problems.append(f"{key} is not an integer: {event}")
        if phase != "M" and not isinstance(event["ts"], (int, float)):
            problems.append(f"ts is not a number: {event}")
        if phase == "M":
            if event["name"] not in METADATA:
                problems.append(f"unknown metadata {event['name']}")
            if event["name"] == "process_name":
                named_processes.add(event["pid"])
            if event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
        elif phase == "X":
            if event["dur"] < 0:
                problems.append(f"negative duration: {event}")
            rows[(event["pid"], event["tid"])].append((event["ts"], event["ts"] + event["dur"], event["name"]))
        elif phase in "sf":
            key = (event["cat"], event["name"], event["id"])
            if phase in flows[key]:
                problems.append(f"flow {key} has two {phase} events")
            flows[key][phase] = event
        elif phase == "C":
            if not all(isinstance(v, (int, float)) for v in event["args"].values()):
                problems.append(f"counter values must be numbers: {event}")
    used = {(e["pid"], e["tid"]) for e in events if e.get("ph") in ("X", "i", "s", "f")}
    for pid, tid in used:
        if pid not in named_processes:
            problems.append(f"process {pid} has events but no process_name")
        if (pid, tid) not in named_threads:
            problems.append(f"row ({pid}, {tid}) has events but no thread_name")
    for row, spans in rows.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[tuple[float, float, str]] = []
        for start, end, name in spans:
            # ts are microseconds with nanosecond decimals: a float sum may be off by less
            while stack and stack[-1][1] <= start + 1e-4:
                stack.pop()
            if stack and end > stack[-1][1] + 1e-4:
                problems.append(f"row {row}: {name} [{start}, {end}] overlaps "
                                f"{stack[-1][2]} [{stack[-1][0]}, {stack[-1][1]}]")
            stack.append((start, end, name))
    for key, pair in flows.items():
        if set(pair) != {"s", "f"}:
            problems.append(f"flow {key} is not a start/end pair: {sorted(pair)}")
            continue
        if pair["f"]["ts"] < pair["s"]["ts"]:
            problems.append(f"flow {key} ends before it starts")
        for point in pair.values():
            inside = any(a <= point["ts"] <= b for a, b, _ in rows[(point["pid"], point["tid"])])
            if not inside:
                problems.append(f"flow {key} {point['ph']} at {point['ts']} is in no span of its row")
    assert not problems, "\n".join(problems[:20])


def load_trace(path: str) -> list[dict[str, Any]]:
    """Open a written trace file, check it, return its events."""
    with open(path) as f:
        trace = json.load(f)
    assert set(trace) >= {"traceEvents", "otherData"}
    check_trace(trace["traceEvents"])
    return trace["traceEvents"]


def traced(tmp_path) -> list[dict[str, Any]]:
    path = str(tmp_path / f"trace-{time.monotonic_ns()}.json")
    assert timeline(path) is None
    return load_trace(path)


def spans(events, name=None, cat=None, pid=None):
    return [e for e in events if e["ph"] == "X" and (name is None or e["name"] == name)
            and (cat is None or e.get("cat") == cat) and (pid is None or e["pid"] == pid)]


def process_names(events) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}


def thread_names(events) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"}


@pytest.fixture(scope="module")
def runtime():
    helpers_runtime = lightwork.init(num_cpus=2)
    yield helpers_runtime
    lightwork.shutdown()


def test_get_in_a_loop_is_a_staircase_on_the_driver_row(runtime, tmp_path):
    @lightwork.remote
    def step(i):
        time.sleep(0.01)
        return i

    with profile("ex1"):
        for i in range(4):
            lightwork.get(step.remote(i))
    events = traced(tmp_path)
    driver = os.getpid()
    [ex1] = spans(events, "ex1", pid=driver)
    gets = sorted((s for s in spans(events, "get", pid=driver)
                   if ex1["ts"] <= s["ts"] and s["ts"] + s["dur"] <= ex1["ts"] + ex1["dur"]),
                  key=lambda s: s["ts"])
    steps = sorted(spans(events, "step", cat="task"), key=lambda s: s["ts"])[-4:]
    assert len(gets) == 4 and gets[0]["tid"] == ex1["tid"]
    assert thread_names(events)[(driver, ex1["tid"])] == "MainThread"
    for i, (get, task) in enumerate(zip(gets, steps)):
        assert task["ts"] + task["dur"] <= get["ts"] + get["dur"]  # its result ended this get
        if i:
            assert task["ts"] >= gets[i - 1]["ts"] + gets[i - 1]["dur"]  # one stair at a time


def test_rows_phases_args_and_flows(runtime, tmp_path):
    @lightwork.remote
    def square(x):
        return x * x

    @lightwork.remote
    class Counter:
        def add(self, n):
            return n

    counter = Counter.remote()
    lightwork.get([square.remote(i) for i in range(6)] + [counter.add.remote(1)])
    events = traced(tmp_path)
    names = process_names(events)
    assert names[os.getpid()].startswith("driver")
    [actor_pid] = [pid for pid, name in names.items() if name.startswith("actor Counter")]
    workers = {pid for pid, name in names.items() if name.startswith("worker")}
    assert workers and all("(pid " in names[pid] for pid in workers)
    for task in spans(events, "square", cat="task"):
        assert task["pid"] in workers
        assert {"task_id", "name", "attempt", "arg_size", "result_size", "queued_ms"} <= set(task["args"])
        phases = [s for s in spans(events, cat="phase", pid=task["pid"])
                  if s["tid"] == task["tid"] and task["ts"] <= s["ts"] <= task["ts"] + task["dur"]]
        assert {p["name"] for p in phases} >= {"execute"}
    [call] = spans(events, "Counter.add", cat="task")
    assert call["pid"] == actor_pid
    starts = {e["id"] for e in events if e["ph"] == "s"}
    ran = {s["args"]["task_id"] for s in spans(events, cat="task")}
    assert ran <= starts  # every execution has its arrow from the submitting call


def test_threaded_actor_calls_get_a_row_each(runtime, tmp_path):
    @lightwork.remote(max_concurrency=2)
    class Pair:
        def meet(self, directory, name):
            return helpers.arrive_and_wait(directory, name, 2)

    pair = Pair.remote()
    assert lightwork.get([pair.meet.remote(str(tmp_path), n) for n in "ab"]) == [True, True]
    events = traced(tmp_path)
    calls = spans(events, "Pair.meet", cat="task")
    assert len(calls) == 2 and calls[0]["pid"] == calls[1]["pid"]
    assert calls[0]["tid"] != calls[1]["tid"]  # they overlapped, so two rows
    assert {thread_names(events)[(c["pid"], c["tid"])] for c in calls} == {"tasks", "tasks #2"}


def test_retries_crashes_and_cancellations_are_instants(runtime, tmp_path):
    @lightwork.remote(max_retries=1)
    def crash_once(directory):
        if helpers.count_attempt(directory) == 0:
            os._exit(3)
        return "ok"

    @lightwork.remote(max_retries=1, retry_exceptions=True)
    def flaky():
        raise ValueError("always")

    @lightwork.remote
    def gate(started, path):
        open(started, "w").close()
        return helpers.wait_for_file(path)

    assert lightwork.get(crash_once.remote(str(tmp_path))) == "ok"
    with pytest.raises(ValueError):
        lightwork.get(flaky.remote())
    started = str(tmp_path / "started")
    ref = gate.remote(started, str(tmp_path / "never"))
    helpers.wait_until(lambda: os.path.exists(started), timeout=20)  # inside the function
    assert [t["state"] for t in _state().list_tasks(name="gate")] == ["RUNNING"]
    lightwork.cancel(ref)
    with pytest.raises(lightwork.exceptions.TaskCancelledError):
        lightwork.get(ref)
    events = traced(tmp_path)
    instants = [e["name"] for e in events if e["ph"] == "i"]
    assert "worker crashed: crash_once" in instants
    assert "retry: flaky" in instants and "failed: flaky" in instants
    assert "cancelled: gate" in instants


def _state():
    from lightwork import state

    return state


def test_counters_for_tasks_cpu_and_memory(runtime, tmp_path):
    @lightwork.remote
    def spin():
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            pass

    lightwork.get([spin.remote() for _ in range(4)])
    node = support.driver_node()
    helpers.wait_until(lambda: len(node.control.samples()[0]) >= 2, timeout=10)
    events = traced(tmp_path)
    counters = {(e["name"], e["pid"]) for e in events if e["ph"] == "C"}
    driver = os.getpid()
    assert ("tasks", driver) in counters
    assert ("session cpu %", driver) in counters and ("session memory MB", driver) in counters
    names = process_names(events)
    assert any(n == "cpu %" and names.get(pid, "").startswith("worker") for n, pid in counters)
    task_counts = [e["args"] for e in events if e["ph"] == "C" and e["name"] == "tasks"]
    assert max(c["running"] for c in task_counts) >= 1 and task_counts[-1]["running"] == 0


def test_profile_spans_nest_in_the_task_that_ran_them(runtime, tmp_path):
    @lightwork.remote
    def load(n):
        with profile("parse", extra_data={"rows": n, "obj": object()}):
            time.sleep(0.005)
        return n

    @lightwork.remote
    class Model:
        def fit(self):
            with profile("fit-inner"):
                return 1

    assert lightwork.get(load.remote(7)) == 7
    assert lightwork.get(Model.remote().fit.remote()) == 1
    events = traced(tmp_path)
    [parse] = spans(events, "parse", cat="profile")
    assert parse["args"]["rows"] == 7 and parse["args"]["obj"].startswith("<object")
    [task] = [s for s in spans(events, "load", cat="task") if s["args"]["task_id"] == parse["args"]["task_id"]]
    assert (parse["pid"], parse["tid"]) == (task["pid"], task["tid"])
    assert task["ts"] <= parse["ts"] and parse["ts"] + parse["dur"] <= task["ts"] + task["dur"]
    [inner] = spans(events, "fit-inner", cat="profile")
    assert process_names(events)[inner["pid"]].startswith("actor Model")


def test_returns_events_without_a_filename(runtime):
    events = timeline()
    assert isinstance(events, list) and events
    check_trace(events)


def test_budget_drops_the_oldest_and_the_trace_says_so(fresh_runtime, tmp_path):
    lightwork.init(num_cpus=1, event_budget=5)

    @lightwork.remote
    def tick(i):
        return i

    for i in range(12):
        lightwork.get(tick.remote(i))
    path = str(tmp_path / "budget.json")
    timeline(path)
    events = load_trace(path)
    with open(path) as f:
        other = json.load(f)["otherData"]
    assert other["dropped"]["tasks"] == 7 and other["event_budget"] == 5
    assert len(spans(events, "tick", cat="task")) == 5
    [labels] = [e for e in events if e["ph"] == "M" and e["name"] == "process_labels"]
    assert "dropped the oldest 7 task records" in labels["args"]["labels"]
    assert any(e["ph"] == "i" and e["name"] == "events dropped" for e in events)


def test_timeline_needs_a_runtime_and_profile_does_not(fresh_runtime):
    with pytest.raises(RuntimeError, match="init"):
        timeline()
    with profile("nothing running"):  # no runtime: a no-op, never an error
        pass


def test_build_trace_from_raw_data_without_processes():
    """Unit test on the raw shape: an exited worker whose pid was never seen, a live
    running task, a nested submission, dense counters; all valid and named."""
    fields = ["task_id", "name", "owner", "submitted", "attempt", "worker_id", "pid",
              "deps_ready", "dispatched", "started", "args_loaded", "finished", "stored",
              "seen", "arg_size", "result_size", "state", "error", "retries"]
    base = 100.0

    def record(task_id, owner, worker, t0, pid=0):
        return [task_id, "mod.<locals>.f", owner, t0, 0, worker, pid, t0, t0 + 0.001, t0 + 0.002,
                t0 + 0.003, t0 + 0.004, t0 + 0.005, t0 + 0.006, 10, 20, "FINISHED", None, []]

    data = {
        "session": "s", "driver_pid": 10, "forkserver_pid": 11, "base": base, "base_wall": 0.0,
        "now": base + 1.0, "budget": 100, "record_fields": fields,
        "tasks": [record(1, 0, 5, base + 0.1), record(2, 5, 6, base + 0.1025, pid=66)]
                 + [record(10 + i, 0, 6, base + 0.2 + i * 0.01, pid=66) for i in range(50)],
        "live": [record(3, 0, 6, base + 0.9, pid=66)[:16] + ["SUBMITTED_TO_WORKER", None, None]
                 + ["RUNNING", 0, 66]],
        "spans": [["get", base + 0.1, base + 0.2, 1, 777]], "threads": {"777": "MainThread"},
        "workers": {"6": {"pid": 66, "actor_class": None}},
        "profile": [["p", base + 0.15, base + 0.16, 10, 777, None, {}]],
        "samples": [[base + 0.5, [[10, 50.0, 1 << 20], [11, 0.0, 1 << 20], [66, 99.0, 1 << 21]]]],
        "dropped": {"tasks": 0, "spans": 0, "profile": 0, "samples": 0},
    }
    data["live"][0] = data["live"][0][:16] + ["SUBMITTED_TO_WORKER", None, None, "RUNNING", 0, 66]
    events = build_trace(data)
    check_trace(events)
    names = process_names(events)
    assert names[4_000_005].startswith("worker 5") and "pid ?" in names[4_000_005]
    assert names[11].startswith("fork server") and names[66].startswith("worker 6: f")
    [running] = [s for s in spans(events, "f", cat="task") if s["args"]["task_id"] == 3]
    assert running["args"]["state"] == "RUNNING" and "note" in running["args"]
    nested = [e for e in events if e["ph"] == "s" and e["id"] == 2]
    assert nested[0]["pid"] == 4_000_005  # the arrow starts at the submitting worker


def test_stopping_a_worker_does_not_break_the_trace(fresh_runtime, tmp_path):
    """A worker SIGKILLed mid-task: its pid stays known, the crash is an instant."""
    lightwork.init(num_cpus=1)

    @lightwork.remote(max_retries=0)
    def victim(path):
        return helpers.wait_for_file(path)

    ref = victim.remote(str(tmp_path / "never"))
    node = support.driver_node()
    helpers.wait_until(lambda: any(c.pid and c.slot.inflight for c in node.workers.values()))
    [conn] = [c for c in node.workers.values() if c.slot.inflight]
    node.control.sample_now()
    os.kill(conn.pid, signal.SIGKILL)
    with pytest.raises(lightwork.exceptions.WorkerCrashedError):
        lightwork.get(ref)
    events = traced(tmp_path)
    assert any(e["ph"] == "i" and e["name"] == "failed: victim" for e in events)
