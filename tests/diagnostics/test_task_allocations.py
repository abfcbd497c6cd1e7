"""profile_tasks(memory=True): tracemalloc around every call, merged by task function.

A task that keeps a known list each call must show what it kept a call and the line
that allocated it; a task that allocates and frees must show its peak and nothing
kept. Both with stack sampling and with cProfile, on every worker; and tracing stops
with the profile.
"""

from __future__ import annotations

import os
import time

import pytest

import lightwork
from lightwork.diagnostics.task_profiler import profile_tasks

pytestmark = pytest.mark.lightwork_only

MB = 1 << 20
_kept: list[list[int]] = []


@lightwork.remote
def keeps() -> int:
    _kept.append([0] * 125_000)  # 1 MB of pointers a call: the line to find
    time.sleep(0.002)
    return os.getpid()





@lightwork.remote
def frees() -> int:
    scratch = bytearray(20 * MB)
    del scratch
    return os.getpid()


@lightwork.remote
def tracing() -> bool:
    import tracemalloc

    return tracemalloc.is_tracing()


@pytest.mark.parametrize("mode", ["sample", "cprofile"])
def test_memory_per_call_by_task_function(two_cpus, mode):
    lightwork.get([keeps.remote() for _ in range(4)])
    with profile_tasks(mode=mode, memory=True) as prof:
        lightwork.get([keeps.remote() for _ in range(12)] + [frees.remote() for _ in range(6)])
    kept, freed = prof.allocations["keeps"], prof.allocations["frees"]
    assert kept["calls"] == 12 and freed["calls"] == 6
    assert 0.9 * MB <= kept["kept"] / 12 <= 1.2 * MB, kept
    assert 19 * MB <= freed["peak"] <= 22 * MB, freed
    assert abs(freed["kept"]) < 0.1 * MB * 6, freed
    [file, line, size, _count] = kept["sites"][0]
    assert file == __file__ and size >= 0.9 * MB * kept["site_calls"]
    assert open(file).read().splitlines()[line - 1].strip().startswith("_kept.append(")
    table = prof.memory_top()
    assert "keeps: 12 calls" in table and f"{os.path.basename(__file__)}:{line}" in table
    # tracing was the profile's: it stopped with it
    assert lightwork.get([tracing.remote() for _ in range(4)]) == [False] * 4


def test_without_memory_nothing_is_traced(two_cpus):
    with profile_tasks() as prof:
        lightwork.get(keeps.remote())
    assert prof.allocations == {}
    assert "profile_tasks(memory=True)" in prof.memory_top()


def test_snapshots_compared_only_while_they_pay():
    """In one process, no workers: a function whose calls are far shorter than a
    snapshot compares one call, a long one its first SITE_CALLS; the sites found
    are the lines that kept memory, grouped as tracemalloc's own statistics group."""
    import tracemalloc

    from lightwork.engines.local import call_profiler

    assert not tracemalloc.is_tracing()
    tracer = call_profiler.MemoryTracer()
    tracer.start()
    held = []
    try:
        for _ in range(call_profiler.SITE_CALLS + 5):
            for label, spent in (("quick", 1e-9), ("slow", 10.0)):
                began, snapshot, _clock = tracer.before(label)
                held.append(bytearray(4096))  # the line to find
                size = tracemalloc.get_traced_memory()[0]
                tracer.add_call(label, size - began, size - began, snapshot, spent)
        snapshot = tracemalloc.take_snapshot()
        assert call_profiler._by_line(snapshot) == {
            (s.traceback[0].filename, s.traceback[0].lineno): (s.size, s.count)
            for s in snapshot.statistics("lineno")}
    finally:
        tracer.stop()
    assert not tracemalloc.is_tracing()
    result = tracer.result()
    assert result["quick"]["calls"] == result["slow"]["calls"] == call_profiler.SITE_CALLS + 5
    assert result["quick"]["site_calls"] == 1
    assert result["slow"]["site_calls"] == call_profiler.SITE_CALLS
    [file, line, size, count] = result["slow"]["sites"][0]
    assert file == __file__ and count >= call_profiler.SITE_CALLS  # (and the list's growth)
    assert size >= 4096 * call_profiler.SITE_CALLS
    assert "held.append(bytearray(4096))" in open(file).read().splitlines()[line - 1]


def test_counts_are_not_rewritten_during_a_traced_call(tmp_path, monkeypatch):
    """A sampler beside tracemalloc rewrites its counts file only between calls: a
    rewrite inside one showed the JSON encoder among the lines the call kept."""
    import json

    from tests import helpers
    from lightwork.engines.local import sampler

    class Calls:  # a memory profile's CallProfiler, as its sampler sees it
        memory = object()
        in_call = {1}

        def stop(self, write: bool = True) -> None:
            pass

        def memory_result(self) -> dict:
            return {}

        lines_result = memray_result = memory_result

    monkeypatch.setattr(sampler, "FLUSH_EVERY_S", 0.02)
    sampler._write_switch(str(tmp_path), "on tok 100 sample memory")
    path = tmp_path / "sample-w1.json"
    calls = Calls()
    running = sampler.Sampler("tok", 100, 1, str(path), calls=calls)
    running.start()
    try:
        helpers.wait_until(lambda: running.samples >= 20, timeout=10,
                           message="20 rounds, a rewrite due at each")
        assert not path.exists()  # a call was in progress all along
        calls.in_call = set()
        helpers.wait_until(path.exists, timeout=10, message="a rewrite between calls")
        assert json.loads(path.read_text())["final"] is False
    finally:
        running.stop()
        assert running.done.acquire(timeout=10)
    assert json.loads(path.read_text())["final"] is True
