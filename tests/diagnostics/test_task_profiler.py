"""The task profiler: every worker sampled, each sample under its task, the outputs.

Tasks spend a known split of their wall time in two CPU-bound functions (``busy_a``
3 parts, ``busy_b`` 1); the merged profile must give about that split, each function
under the task function that called it, with samples from every worker that ran one.
The collapsed output is read back by a parser written here to the format's
specification, not by the writer's code.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests import helpers, support
import lightwork
from lightwork.diagnostics.task_profiler import TaskProfile, profile_tasks

pytestmark = pytest.mark.lightwork_only

UNIT_S = 0.01


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def busy_a(seconds: float) -> None:
    spin(seconds)


def busy_b(seconds: float) -> None:
    spin(seconds)


@lightwork.remote
def split(unit: float) -> int:
    busy_a(3 * unit)
    busy_b(unit)
    return os.getpid()


@lightwork.remote
def only_b(unit: float) -> int:
    busy_b(unit)
    return os.getpid()


@lightwork.remote
class Spinner:
    def turn(self, unit: float) -> int:
        busy_a(unit)
        return os.getpid()


def parse_collapsed(text: str) -> dict[tuple[str, ...], int]:
    """Brendan Gregg's collapsed stacks: per line, frames joined by ';' (outermost
    first), one space, a positive integer count; the count follows the line's last
    space, so frames may hold spaces but no ';'. A stack may repeat (counts add)."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for number, line in enumerate(text.splitlines(), 1):
        stack, sep, count = line.rpartition(" ")
        assert sep and re.fullmatch(r"[1-9][0-9]*", count), f"line {number}: {line!r}"
        frames = tuple(stack.split(";"))
        assert all(frames), f"line {number} has an empty frame: {line!r}"
        stacks[frames] += int(count)
    return dict(stacks)


def under(stacks: dict[tuple[str, ...], int], task: str, function: str) -> int:
    """Samples of ``task`` whose innermost frames are in ``function`` (or what it calls)."""
    return sum(n for frames, n in stacks.items()
               if frames[0] == task and any(f.startswith(function + " (") for f in frames[1:]))


@pytest.fixture(scope="module")
def profiled(two_cpus):
    lightwork.get([split.remote(0.001) for _ in range(4)])  # both workers started
    spinner = Spinner.remote()
    lightwork.get(spinner.turn.remote(0.001))
    with profile_tasks() as prof:
        assert prof.total == 0  # filled when the block ends
        refs = [split.remote(UNIT_S) for _ in range(40)] + \
            [only_b.remote(UNIT_S) for _ in range(10)] + \
            [spinner.turn.remote(3 * UNIT_S) for _ in range(20)]
        pids = set(lightwork.get(refs))
    return prof, pids


def test_the_split_is_found_under_the_right_task(profiled):
    prof, _pids = profiled
    stacks = parse_collapsed(prof.collapsed())
    a, b = under(stacks, "split", "busy_a"), under(stacks, "split", "busy_b")
    assert a + b >= 100, prof.top()
    # 3:1 is 75%; a wrong attribution (1:1, swapped, or every sample to one) is far off.
    assert 0.63 <= a / (a + b) <= 0.87, prof.top()
    assert under(stacks, "only_b", "busy_b") > 0 and under(stacks, "only_b", "busy_a") == 0
    assert under(stacks, "Spinner.turn", "busy_a") > 0
    assert under(stacks, "Spinner.turn", "busy_b") == 0
    assert "(driver)" in prof.labels


def test_samples_come_from_every_worker(profiled):
    prof, pids = profiled
    sampled = {p["pid"] for p in prof.processes if p["worker_id"] and p["samples"]}
    assert pids <= sampled, (pids, prof.processes)
    assert len(prof.workers) >= 3  # two task workers and the actor's
    assert not prof.missing
    # Each sampler's own CPU time: some, and less than the profile lasted.
    for process in prof.processes:
        assert 0 < process["sampler_cpu"] < prof.duration, prof.processes
    assert "sampling threads: " in prof.top().splitlines()[1]


def test_collapsed_round_trips(profiled, tmp_path):
    prof, _ = profiled
    path = tmp_path / "profile.txt"
    text = prof.collapsed(str(path))
    assert path.read_text() == text
    stacks = parse_collapsed(text)
    assert sum(stacks.values()) == prof.total
    by_worker = parse_collapsed(prof.collapsed(by_worker=True))
    assert sum(by_worker.values()) == prof.total
    assert all(frames[1].startswith("worker ") for frames in by_worker)


def test_speedscope_follows_its_schema(profiled, tmp_path):
    prof, _ = profiled
    path = tmp_path / "profile.json"
    prof.speedscope(str(path))
    doc = json.loads(path.read_text())
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = doc["shared"]["frames"]
    assert all(isinstance(f["name"], str) for f in frames)
    names = [p["name"] for p in doc["profiles"]]
    assert names[0] == "all tasks" and {"split", "only_b", "Spinner.turn"} <= set(names)
    for profile in doc["profiles"]:
        assert profile["type"] == "sampled" and profile["unit"] == "seconds"
        assert len(profile["samples"]) == len(profile["weights"])
        assert all(0 <= i < len(frames) for stack in profile["samples"] for i in stack)
        assert profile["endValue"] == pytest.approx(sum(profile["weights"]))
    everything = doc["profiles"][0]
    assert sum(everything["weights"]) == pytest.approx(prof.total / prof.hz)


def test_flamegraph_is_self_contained(profiled, tmp_path):
    prof, _ = profiled
    path = tmp_path / "profile.html"
    prof.flamegraph(str(path))
    page = path.read_text()
    assert "<script>" in page and "src=" not in page and "http" not in page.replace(
        "https://www.speedscope.app", "")
    data = json.loads(page.split("const DATA = ", 1)[1].split(";\n", 1)[0])
    assert {"all tasks", "split", "only_b", "Spinner.turn"} <= set(data["trees"])
    assert data["trees"]["all tasks"]["value"] == prof.total


def test_top_names_self_and_total(profiled):
    prof, _ = profiled
    table = prof.top(8)
    section = table.split("split:", 1)[1].split("\n\n", 1)[0]
    rows = {line.split()[-2]: line.split() for line in section.splitlines()[2:]}
    assert list(rows)[0] == "spin", table  # the user's only function with self time
    # A sample may land after the function returned, in lightwork's storing of its
    # result: a row of lightwork's own, with its own file.
    users = {name for name, row in rows.items() if "test_task_profiler.py" in row[-1]}
    assert users == {"spin", "busy_a", "busy_b", "split"}, table
    rows = {name: row for name, row in rows.items() if name in users}
    total = {name: float(row[3].rstrip("%")) for name, row in rows.items()}
    assert total["split"] >= total["busy_a"] > total["busy_b"] > 0, table
    assert "Spinner.turn:" in table and "only_b:" in table


def test_timeline_carries_the_samples_under_their_process(profiled, tmp_path):
    prof, pids = profiled
    path = tmp_path / "trace.json"
    prof.timeline(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    samples = [e for e in events if e.get("cat") == "sample"]
    rows: dict[tuple[int, int], list[dict]] = {}
    for event in samples:
        rows.setdefault((event["pid"], event["tid"]), []).append(event)
    # Each row's spans nest (Perfetto draws no overlaps): a span begins after the last
    # one at its depth or more ended, or inside the one it is under.
    for row in rows.values():
        stack: list[float] = []  # ends of the open spans
        for event in sorted(row, key=lambda e: (e["ts"], -e["dur"])):
            while stack and event["ts"] >= stack[-1] - 1e-3:
                stack.pop()
            assert not stack or event["ts"] + event["dur"] <= stack[-1] + 1e-3, event
            stack.append(event["ts"] + event["dur"])
    # Every sample once at the top of its row's chart: the task function (or the
    # driver), with the task's own frames under it, in the process that ran the task.
    roots = [e for e in samples if e["name"] in prof.labels]
    assert sum(e["args"]["samples"] for e in roots) == len(prof.timed) == prof.total
    tasks = {(e["pid"], e["name"]) for e in events if e.get("cat") == "task"}
    split_rows = {e["pid"] for e in roots if e["name"] == "split"}
    assert split_rows and split_rows <= pids and all((pid, "split") in tasks
                                                      for pid in split_rows)
    names = {e["name"].split(" (")[0] for e in samples if e["pid"] in split_rows}
    assert {"split", "busy_a", "busy_b", "spin"} <= names
    threads = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert "samples (100 Hz)" in threads


def test_short_tasks_are_sampled_for_their_time(two_cpus):
    # 60 tasks of 10 ms: 0.6 s at 100 Hz is about 60 samples. A sampler that waits out
    # the GIL's switch interval on a fixed beat lands between tasks for half its rounds
    # or locks onto their boundaries (about 20 of 60 when measured that way).
    lightwork.get([only_b.remote(0.001) for _ in range(4)])
    with profile_tasks() as prof:
        lightwork.get([only_b.remote(UNIT_S) for _ in range(60)])
    stacks = parse_collapsed(prof.collapsed())
    expected = 60 * UNIT_S * prof.hz
    assert under(stacks, "only_b", "busy_b") >= 0.65 * expected, prof.top()


def test_one_profile_at_a_time_and_workers_stop(two_cpus):
    with profile_tasks(hz=50):
        with pytest.raises(ValueError, match="already running"):
            with profile_tasks():
                pass
    with pytest.raises(ValueError, match="no task profile is running"):
        lightwork.state.query("sample_stop")
    # After the block no worker samples: each wrote its final counts, then nothing more
    # (a running sampler rewrites its file every second).
    files = glob.glob(os.path.join(support.session_directory(), "sample-w*.json"))
    assert files
    assert all(json.load(open(path))["final"] for path in files)
    written = {path: os.stat(path).st_mtime_ns for path in files}
    lightwork.get([split.remote(0.3) for _ in range(4)])
    assert {path: os.stat(path).st_mtime_ns for path in files} == written


@lightwork.remote
class AsyncSpinner:
    async def turn(self, unit: float) -> int:
        busy_a(unit)
        return os.getpid()


def test_an_async_actor_counts_its_coroutines_once(two_cpus):
    spinner = AsyncSpinner.remote()
    lightwork.get(spinner.turn.remote(0.001))
    with profile_tasks() as prof:
        lightwork.get([spinner.turn.remote(UNIT_S) for _ in range(30)])
    stacks = parse_collapsed(prof.collapsed())
    busy = under(stacks, "AsyncSpinner.turn", "busy_a")
    waiting = sum(n for frames, n in stacks.items() if frames[0] == "AsyncSpinner.turn") - busy
    assert busy > 0, prof.top()
    # 30 calls of 10 ms: about 30 samples; the pool threads waiting for the loop add none.
    assert busy + waiting <= 3 * 30 * UNIT_S * prof.hz, prof.top()


def test_an_empty_profile_prints(two_cpus):
    prof = TaskProfile({"hz": 100, "started": 0, "ended": 1, "processes": [], "missing": []})
    assert "0 samples" in prof.top() and prof.collapsed() == ""


DRIVER = """
import os, sys, time
import lightwork
from tests import support
from tests.diagnostics.test_task_profiler import split

lightwork.init(num_cpus=2)
print("SOCKET", os.path.join(support.session_directory(), "control.sock"), flush=True)
gate = sys.argv[1]
while not os.path.exists(gate):
    lightwork.get([split.remote(0.01) for _ in range(4)])
lightwork.shutdown()
print("DONE", flush=True)
"""


def test_cli_profiles_a_running_program(tmp_path):
    info = helpers.start_session_driver(DRIVER)
    try:
        out = tmp_path / "profile.txt"
        done = subprocess.run(
            [sys.executable, "-m", "lightwork", "profile", "--seconds", "1.5", "-o", str(out)],
            env=info["env"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "collapsed stacks" in done.stdout
        stacks = parse_collapsed(out.read_text())
        assert under(stacks, "split", "busy_a") > under(stacks, "split", "busy_b") > 0
        trace = tmp_path / "trace.json"
        printed = subprocess.run(
            [sys.executable, "-m", "lightwork", "profile", "--seconds", "0.5", "--top", "5",
             "--timeline", str(trace)],
            env=info["env"], capture_output=True, text=True, timeout=60)
        assert printed.returncode == 0, printed.stderr
        assert "split:" in printed.stdout and "busy_a" in printed.stdout
        events = json.loads(trace.read_text())["traceEvents"]
        sampled = {e["pid"] for e in events if e.get("cat") == "sample" and e["name"] == "split"}
        ran = {e["pid"] for e in events if e.get("cat") == "task" and e["name"] == "split"}
        assert sampled and sampled <= ran, (sampled, ran)
    finally:
        helpers.stop_session_driver(info)
