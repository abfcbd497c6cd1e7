"""Async actors under every profile mode: a call is its coroutine's steps on the loop.

Calls of one async actor run side by side on its loop, each suspended at its awaits
while the others run. Each mode must give a call what its own coroutine did, before and
after its awaits, and nothing of what the others did meanwhile: the stack samples of
its steps under its method, cProfile's counts of the functions it called (and not the
time it spent suspended), each line's hits, and the memory its steps allocated.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import lightwork
from lightwork.diagnostics.task_profiler import profile_tasks

pytestmark = pytest.mark.lightwork_only

MB = 1 << 20
UNIT_S = 0.01


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def before_await(seconds: float) -> None:
    spin(seconds)


def after_await(seconds: float) -> None:
    spin(seconds)


def counted() -> int:
    return 1


@lightwork.remote
class Pipeline:
    def __init__(self) -> None:
        self.kept: list[bytearray] = []

    async def step(self, unit: float) -> int:
        before_await(unit)
        await asyncio.sleep(0.002)
        after_await(unit)
        return 1

    async def waits(self, calls: int) -> int:
        total = 0
        for _ in range(calls):
            total += counted()
            await asyncio.sleep(0.05)  # suspended: others run, none of it is this call's
            total += counted()
        return total

    async def hoards(self) -> int:
        block = bytearray(MB)
        await asyncio.sleep(0.01)
        self.kept.append(block)  # kept after the await: 1 MB a call
        return len(self.kept)

    async def churns(self) -> int:
        block = bytearray(16 * MB)  # held across the await, then freed
        await asyncio.sleep(0.02)
        return len(block)


@pytest.fixture(scope="module")
def pipeline(two_cpus):
    actor = Pipeline.options(max_concurrency=8).remote()
    lightwork.get(actor.step.remote(0.001))
    return actor


def test_samples_of_each_step_go_to_its_method(pipeline):
    with profile_tasks() as prof:
        lightwork.get([pipeline.step.remote(UNIT_S) for _ in range(30)])
    selfs = prof.self_samples("Pipeline.step")
    before = sum(n for f, n in selfs.items() if f.startswith(("spin", "before_await")))
    totals = prof.function_samples("Pipeline.step")
    a = sum(n for f, n in totals.items() if f.startswith("before_await ("))
    b = sum(n for f, n in totals.items() if f.startswith("after_await ("))
    assert before and a and b, prof.top()
    assert 0.5 <= a / b <= 2, prof.top()  # the same work on each side of the await
    assert not any("Steps" in frame for _l, _w, frames, _n in prof.stacks for frame in frames)


def test_cprofile_counts_a_coroutine_s_calls_and_not_its_waits(pipeline):
    with profile_tasks(mode="cprofile") as prof:
        results = lightwork.get([pipeline.waits.remote(4) for _ in range(6)])
    assert results == [8] * 6
    stats = prof.pstats().stats  # type: ignore[attr-defined]
    [(key, row)] = [(k, v) for k, v in stats.items() if k[2] == "counted"]
    assert row[1] == 6 * 8, row  # every call, before and after the awaits
    [waits] = [v for k, v in stats.items() if k[2] == "waits"]
    # 6 calls suspended 4 x 50 ms each (1.2 s): none of it is the coroutine's own time.
    assert waits[3] < 0.3, waits


def test_lines_after_an_await_are_timed(pipeline):
    with profile_tasks(lines=[Pipeline.waits, counted]) as prof:
        lightwork.get([pipeline.waits.remote(3) for _ in range(4)])
    by_name = {name.rsplit(".", 1)[-1]: {line - first: hits for line, hits, _t in rows}
               for _f, first, name, rows in prof.line_timings["timings"]}
    assert by_name["counted"][1] == 4 * 6
    waits = by_name["waits"]
    # (offsets from the def: 3 is the first `counted()`, 5 the one after the await)
    assert waits[3] == waits[5] == 4 * 3, waits


@pytest.mark.parametrize("mode", ["sample", "cprofile"])
def test_memory_of_each_call_is_its_own_steps(pipeline, mode):
    with profile_tasks(mode=mode, memory=True) as prof:
        lightwork.get([pipeline.hoards.remote() for _ in range(6)]
                      + [pipeline.churns.remote() for _ in range(6)])
    hoards, churns = prof.allocations["Pipeline.hoards"], prof.allocations["Pipeline.churns"]
    assert hoards["calls"] == 6 and churns["calls"] == 6
    assert 0.9 * MB <= hoards["kept"] / 6 <= 1.3 * MB, hoards
    # the 16 MB blocks of the churns beside it are not the hoards' peak
    assert hoards["peak"] < 4 * MB, hoards
    assert 15 * MB <= churns["peak"] <= 40 * MB and abs(churns["kept"]) < 6 * MB, churns


def test_memray_labels_a_coroutine_s_allocations(pipeline):
    pytest.importorskip("memray")
    with profile_tasks(memory="memray") as prof:
        lightwork.get([pipeline.hoards.remote() for _ in range(4)])
    left = sum(size for label, frames, size, _n in prof.memray_stacks(leaks=True)
               if label == "Pipeline.hoards" and frames[0][0] == "hoards")
    assert left >= 4 * MB, prof.memray_stacks(leaks=True)
