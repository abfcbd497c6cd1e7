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
