"""The always-on event log: every task's life, complete and ordered, and bounded."""

from __future__ import annotations

import time

import pytest

import lightwork
from lightwork.diagnostics import blocked_spans, dropped_counts, task_records

pytestmark = pytest.mark.lightwork_only


@pytest.fixture
def runtime(fresh_runtime):
    lightwork.init(num_cpus=2, event_budget=50)
    yield
    lightwork.shutdown()


def _phases(record):
    return [record.submitted, record.deps_ready, record.dispatched, record.started,
            record.args_loaded, record.finished, record.stored, record.seen]


def test_records_are_complete_and_ordered(runtime):
    @lightwork.remote
    def work(x):
        time.sleep(0.01)
        return x * 2

    first = work.remote(10)
    second = work.remote(first)  # a dependency: second waits for first's result
    assert lightwork.get(second) == 40
    records = {r.task_id: r for r in task_records()}
    assert len(records) == 2
    for record in records.values():
        assert record.name.endswith("work")
        assert record.state in ("FINISHED", "FAILED")
        assert record.worker_id > 0
        times = _phases(record)
        assert all(t > 0 for t in times), record
        assert times == sorted(times), record  # each phase at or after the one before
        assert record.finished - record.args_loaded >= 0.009  # the task's sleep
    ordered = sorted(records.values(), key=lambda r: r.submitted)
    # The dependent task became ready only after its dependency's result was stored.
    assert ordered[1].deps_ready >= ordered[0].stored
    assert ordered[0].result_size > 0 and ordered[1].arg_size > 0


def test_failures_and_retries_are_recorded(runtime):
    @lightwork.remote(max_retries=1, retry_exceptions=True)
    def fails():
        raise KeyError("nope")

    with pytest.raises(KeyError):
        lightwork.get(fails.remote())
    [record] = [r for r in task_records() if r.name.endswith("fails")]
    assert record.state == "FAILED"
    assert "KeyError" in record.error
    assert record.attempt == 1 and len(record.retries) == 1


def test_blocked_get_is_a_driver_span(runtime):
    @lightwork.remote
    def slow():
        time.sleep(0.2)

    before = time.monotonic()
    lightwork.get(slow.remote())
    spans = [s for s in blocked_spans() if s.kind == "get" and s.start >= before]
    assert spans and spans[-1].end - spans[-1].start >= 0.15


def test_log_is_bounded_and_counts_what_it_dropped(runtime):
    @lightwork.remote
    def noop():
        return None

    lightwork.get([noop.remote() for _ in range(80)])
    finished = [r for r in task_records(include_unfinished=False)]
    assert len(finished) == 50  # the budget given to init
    assert dropped_counts()["tasks"] == 30
    seen = [r.seen for r in finished]
    assert seen == sorted(seen)  # kept in the order tasks ended; the oldest were dropped


def test_reading_the_log_without_a_runtime_says_what_to_do(fresh_runtime):
    with pytest.raises(RuntimeError, match="init"):
        task_records()


def test_a_zero_budget_turns_the_log_off(fresh_runtime):
    lightwork.init(num_cpus=1, event_budget=0)

    @lightwork.remote
    def noop():
        return 7

    assert lightwork.get([noop.remote() for _ in range(5)]) == [7] * 5
    assert task_records(include_unfinished=False) == []
    assert lightwork._api._node.advisor is None
    lightwork.shutdown()
    with pytest.raises(ValueError, match="event_budget must be an int >= 0"):
        lightwork.init(event_budget=-1)


def test_the_ring_costs_the_garbage_collector_nothing(runtime):
    """Ended records are kept as plain tuples, which the collector stops tracking; a
    read gives records back, equal to what the task lived through."""
    import gc

    @lightwork.remote
    def work(x):
        return x

    assert lightwork.get([work.remote(i) for i in range(20)]) == list(range(20))
    node = lightwork._api._node
    gc.collect()
    gc.collect()  # the first untracks the inner tuples (call site), the second the outer
    with node.lock:
        frozen = list(node.log.tasks)
    assert len(frozen) == 20 and not any(gc.is_tracked(values) for values in frozen)
    records = task_records(include_unfinished=False)
    assert len(records) == 20 and all(r.name.endswith("work") for r in records)
    assert all(r.state == "FINISHED" and r.finished >= r.started > 0 for r in records)
    assert {r.task_id for r in records} == {values[0] for values in frozen}


def test_a_watcher_takes_each_row_once_and_hears_of_rows_it_missed():
    # The advisor reads what was logged since its last look from the ring itself: each
    # ended task exactly once, in order; rows the ring dropped before a look are counted,
    # not silently skipped; nothing is handed out once it stops watching.
    from lightwork._runtime.events import EventLog, TaskRecord

    log = EventLog(budget=5)
    log.finish_task(TaskRecord(0, "before", 0, 1.0))
    assert log.take_fresh() == ([], [])  # not watching: nothing kept
    log.watch()
    for task_id in (1, 2, 3):
        log.finish_task(TaskRecord(task_id, "f", 0, float(task_id)))
    rows, spans = log.take_fresh()
    assert [TaskRecord(*row).task_id for row in rows] == [1, 2, 3] and spans == []
    assert log.take_fresh() == ([], [])
    for task_id in range(4, 12):  # 8 rows into a ring of 5: 3 are gone before the look
        log.finish_task(TaskRecord(task_id, "f", 0, float(task_id)))
    rows, _ = log.take_fresh()
    assert [TaskRecord(*row).task_id for row in rows] == [7, 8, 9, 10, 11]
    assert log.missed_rows == 3
    log.unwatch()
    log.finish_task(TaskRecord(12, "f", 0, 12.0))
    assert not log.watching and log.take_fresh() == ([], [])
