"""The advisor's memory-growth finding: a function whose worker grows call after call.

Real workers, real memory: a task that keeps 10 MB a call is named, with its numbers;
a task that allocates 50 MB and frees it is not, however big its peak; and the rule
holds on records built by hand, where a few rising calls among flat ones are no leak.
"""

from __future__ import annotations

import time

import pytest

import lightwork
from lightwork.diagnostics.advisor import KINDS, Advisor
from lightwork.kernel.events import TaskRecord

pytestmark = pytest.mark.lightwork_only

MB = 1 << 20
_kept: list[bytearray] = []


def _touch(n: int) -> bytearray:
    block = bytearray(n)
    for i in range(0, n, 4096):
        block[i] = 1
    return block


@lightwork.remote
def leaky(mb: int) -> None:
    _kept.append(_touch(mb * MB))
    time.sleep(0.002)


@lightwork.remote
def tidy(mb: int) -> None:
    block = _touch(mb * MB)
    del block
    time.sleep(0.002)


def test_a_leak_of_10_mb_a_call_is_named(fresh_runtime):
    lightwork.init(num_cpus=1)
    lightwork.get([leaky.remote(10) for _ in range(8)])
    findings = [f for f in lightwork.advise(print_report=False) if f.kind == "memory-growth"]
    assert len(findings) == 1, findings
    [finding] = findings
    assert finding.evidence["function"] == "leaky"
    assert 9.5 * MB <= finding.evidence["per_call_bytes"] <= 12 * MB, finding.evidence
    assert finding.evidence["calls"] >= 5
    assert "leaky grows its worker's memory call after call" in finding.title
    assert "+10.0 MB a call" in finding.title or "+10.1 MB a call" in finding.title
    assert finding.callsite is not None and finding.callsite[0].endswith(__file__.rsplit("/", 1)[1])
    assert "memory-growth" in KINDS


def test_allocating_and_freeing_is_not_a_leak(fresh_runtime):
    lightwork.init(num_cpus=1)
    lightwork.get([tidy.remote(50) for _ in range(12)])
    assert not [f for f in lightwork.advise(print_report=False) if f.kind == "memory-growth"]


def _call(task_id: int, change: int, worker_id: int = 1, peak: int = 500 * MB) -> TaskRecord:
    return TaskRecord(task_id, "f", 0, 1000.0 + task_id, started=1000.0 + task_id,
                      args_loaded=1000.0 + task_id, finished=1000.5 + task_id,
                      stored=1000.5 + task_id, seen=1000.5 + task_id, state="FINISHED",
                      worker_id=worker_id, rss_peak=peak, rss_change=change,
                      callsite=("program.py", 3, "<module>"))


def _growth(records: list[TaskRecord]) -> list:
    advisor = Advisor(cpus=2, cores=2)
    advisor.feed(records, [])
    return [f for f in advisor.findings if f.kind == "memory-growth"]


def test_a_few_rising_calls_among_flat_ones_are_no_leak():
    # 60 MB in all, but from 3 calls of 20: the allocator's steps, not a trend
    steps, peak = [], 500 * MB
    for i in range(1, 21):
        change = 20 * MB if i % 7 == 0 else 0
        peak += change
        steps.append(_call(i, change, peak=peak))
    assert _growth(steps) == []
    # the same growth spread over every call is one
    rising = [_call(i, 4 * MB, peak=500 * MB + 4 * MB * i) for i in range(1, 21)]
    [finding] = _growth(rising)
    assert finding.evidence["rising_calls"] == finding.evidence["calls"] >= 5
    assert finding.evidence["per_call_bytes"] == 4 * MB


def test_memory_that_goes_with_the_call_is_no_leak():
    # Every call ends 30 MB up (it read a big argument from shared memory), but the
    # argument is unmapped after it: the next call begins where the last began.
    reads = [_call(i, 30 * MB, peak=530 * MB) for i in range(1, 21)]
    assert _growth(reads) == []


def test_calls_on_different_workers_are_not_added_together():
    # each worker grows twice: never five calls of one worker
    spread = [_call(i, 12 * MB, worker_id=i % 4, peak=500 * MB + 12 * MB * i)
              for i in range(1, 9)]
    assert _growth(spread) == []


def test_unmeasured_calls_say_nothing():
    assert _growth([_call(i, 0, peak=0) for i in range(1, 30)]) == []
