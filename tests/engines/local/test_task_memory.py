"""Memory per task: the worker's peak resident memory in a call, and its change.

A task that keeps 10 MB a call must show +10 MB each call; a task that allocates 50 MB
and frees it must show its peak about 50 MB above where it began and about no change;
a no-op function is measured on its first run only (its record says "not measured",
None in the rows, afterwards). The probe itself must report a call's own peak, not the
process's, also where ``getrusage`` reports a stale figure.
"""

from __future__ import annotations

import mmap
import os
import time

import pytest

import lightwork
from lightwork.engines.local.task_memory import MemoryProbe

pytestmark = pytest.mark.lightwork_only

MB = 1 << 20
_kept: list[bytearray] = []


def _touch(n: int) -> bytearray:
    block = bytearray(n)
    for i in range(0, n, 4096):  # resident: every page written
        block[i] = 1
    return block


@lightwork.remote
def keeps(mb: int) -> int:
    _kept.append(_touch(mb * MB))
    time.sleep(0.002)
    return os.getpid()


@lightwork.remote
def churns(mb: int) -> int:
    block = _touch(mb * MB)
    del block
    time.sleep(0.002)
    return os.getpid()


@lightwork.remote
def noop() -> int:
    return 0


def _rows(name: str) -> list[dict]:
    rows = lightwork.state.list_tasks(filters=[("name", "=", name)], limit=1000)
    return sorted(rows, key=lambda r: r["task_id"])


def test_a_call_that_keeps_memory_shows_its_growth(fresh_runtime):
    lightwork.init(num_cpus=1)
    lightwork.get([keeps.remote(10) for _ in range(5)])
    rows = _rows("keeps")
    assert len(rows) == 5
    for row in rows:
        assert 9.5 * MB <= row["rss_change"] <= 12 * MB, row
        assert row["rss_peak"] >= 10 * MB
    # one worker: each call's peak is the last one's plus what it kept
    peaks = [r["rss_peak"] for r in rows]
    assert peaks == sorted(peaks) and peaks[-1] - peaks[0] >= 38 * MB, peaks
    summary = {s["name"]: s for s in lightwork.state.summarize_tasks()["functions"]}
    assert summary["keeps"]["mean_rss_change"] >= 9.5 * MB
    assert summary["keeps"]["max_rss_peak"] == peaks[-1]


def test_a_call_that_frees_shows_its_peak_and_no_growth(fresh_runtime):
    lightwork.init(num_cpus=1)
    lightwork.get([churns.remote(50) for _ in range(4)])
    rows = _rows("churns")
    for row in rows[1:]:  # (the first may leave the allocator some pages)
        assert abs(row["rss_change"]) < 2 * MB, row
    before = rows[-1]["rss_peak"] - 50 * MB
    assert before > 0
    # the peak is the call's, not the process's since it started: about 50 MB above
    assert all(r["rss_peak"] >= 50 * MB for r in rows)


def test_short_calls_are_measured_once(fresh_runtime):
    lightwork.init(num_cpus=1)
    lightwork.get(noop.remote())
    lightwork.get([noop.remote() for _ in range(20)])
    rows = _rows("noop")
    assert rows[0]["rss_peak"] > 0 and rows[0]["rss_change"] is not None
    assert all(r["rss_peak"] is None and r["rss_change"] is None for r in rows[1:]), rows[1:]
    summary = {s["name"]: s for s in lightwork.state.summarize_tasks()["functions"]}
    assert summary["noop"]["max_rss_peak"] == rows[0]["rss_peak"]


def test_actor_calls_carry_memory_too(fresh_runtime):
    lightwork.init(num_cpus=1)

    @lightwork.remote
    class Keeper:
        def __init__(self) -> None:
            self.kept: list[bytearray] = []

        def keep(self, mb: int) -> None:
            self.kept.append(_touch(mb * MB))
            time.sleep(0.002)

    keeper = Keeper.remote()
    lightwork.get([keeper.keep.remote(8) for _ in range(3)])
    rows = _rows("Keeper.keep")
    assert [r["rss_change"] >= 7.5 * MB for r in rows] == [True] * 3, rows


def _fresh_pages(n: int) -> mmap.mmap:
    """``n`` bytes of pages new to the process (a long-lived process's allocator may
    hand out pages it already holds), every one written."""
    block = mmap.mmap(-1, n)
    for i in range(0, n, 4096):
        block[i] = 1
    return block


def test_the_probe_reads_a_calls_own_peak():
    probe = MemoryProbe(os.getpid())
    held = _fresh_pages(120 * MB)  # the process's peak so far: not this call's
    held.close()
    before = probe.before()
    block = _fresh_pages(20 * MB)
    peak, change = probe.after(before)
    block.close()
    assert 19 * MB <= peak - before <= 30 * MB, (peak, before)
    assert 19 * MB <= change <= 22 * MB


def test_the_probe_sees_past_a_stale_getrusage_figure():
    # Where the kernel keeps a figure for exited threads (or the program before an
    # exec) above the reset mark, getrusage reports it: the probe reads VmHWM instead.
    probe = MemoryProbe(os.getpid())
    stale = type("Usage", (), {"ru_maxrss": 64 << 30 >> 10})()  # 64 GiB, in kB
    probe._getrusage = lambda who: stale
    before = probe.before()
    block = _fresh_pages(20 * MB)
    peak, _change = probe.after(before)
    block.close()
    assert 19 * MB <= peak - before <= 30 * MB, (peak, before)
