"""The always-on event log: every task's life, complete and ordered, and bounded."""

from __future__ import annotations

import textwrap
import time

import pytest
from tests.helpers import run_script, write_script
from tests import support

import lightwork
from lightwork.kernel.events import freeze
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
    # The dependent task became ready only after its dependency's result was stored; the
    # other, with no dependency, was ready from its submission.
    assert ordered[1].deps_ready >= ordered[0].stored
    assert ordered[0].deps_ready == ordered[0].submitted
    assert ordered[0].result_size > 0 and ordered[1].arg_size > 0


def test_calls_without_dependencies_are_ready_from_their_submission(runtime):
    """Whether registered at once, queued while every worker was busy (``node_lock.py``)
    or an actor's call, with inline or large arguments; a call with a dependency that is
    already there is ready when registered."""

    @lightwork.remote
    def echo(x):
        return len(x) if isinstance(x, bytes) else x

    @lightwork.remote
    class Echo:
        def echo(self, x):
            return x

    actor = Echo.remote()
    done = lightwork.put(7)
    refs = [echo.remote(i) for i in range(30)]  # most queue: the workers are busy
    refs += [echo.remote(b"x" * 600_000), actor.echo.remote(3), echo.remote(done)]
    assert lightwork.get(refs) == [*range(30), 600_000, 3, 7]
    records = [r for r in task_records() if r.name.endswith("echo")]
    assert len(records) == 33
    with_dependency = [r for r in records if r.dep_tasks]
    assert len(with_dependency) == 1
    for record in records:
        if record in with_dependency:
            assert record.submitted < record.deps_ready <= record.dispatched, record
        else:
            assert record.deps_ready == record.submitted, record
            assert record.dispatched >= record.deps_ready, record


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
    assert support.driver_node().advisor is None
    lightwork.shutdown()
    with pytest.raises(ValueError, match="event_budget must be an int >= 0"):
        lightwork.init(event_budget=-1)


def test_records_are_kept_out_of_the_collector_and_readers_get_copies(runtime):
    """Task records are untracked from submission on (they hold only strings, numbers,
    None and tuples of those, so no cycle can run through one); the ring keeps them as
    they ended, and a read gives copies, equal to what the task lived through."""
    import gc

    @lightwork.remote
    def gate():
        time.sleep(0.5)

    @lightwork.remote
    def work(_, x):
        return x

    @lightwork.remote
    class Counter:
        def bump(self, _, by):
            return by

    counter = Counter.remote()
    opened = gate.remote()
    refs = [work.remote(opened, i) for i in range(20)]
    refs += [counter.bump.remote(opened, i) for i in range(5)]
    node = support.driver_node()
    with node.lock:  # waiting for the gate: pending, and not tracked
        live = [task.record for task in node.tasks.values()]
    assert len(live) >= 25 and not any(gc.is_tracked(record) for record in live)
    assert lightwork.get(refs) == list(range(20)) + list(range(5))
    with node.lock:
        ended = list(node.log.tasks)
    calls = [r for r in ended if r.actor_id]
    assert len(ended) == 26 and len(calls) == 5
    assert not any(gc.is_tracked(record) for record in ended)
    for record in ended:  # nothing that could lead back to a record
        for value in freeze(record):
            assert _atomic(value), (record.name, value)
    records = task_records(include_unfinished=False)
    assert len(records) == 26 and sum(r.name.endswith("work") for r in records) == 20
    assert all(r.state == "FINISHED" and r.finished >= r.started > 0 for r in records)
    assert {r.task_id for r in records} == {r.task_id for r in ended}
    records[0].state = "changed by a reader"
    with node.lock:
        assert all(r.state == "FINISHED" for r in node.log.tasks)


def _atomic(value: object) -> bool:
    if isinstance(value, tuple):
        return all(_atomic(item) for item in value)
    return value is None or isinstance(value, (str, int, float))


def test_records_made_elsewhere_are_untracked_when_they_end():
    import gc

    from lightwork.kernel.events import EventLog, TaskRecord

    log = EventLog(budget=3)
    record = TaskRecord(1, "rebuilt", 0, 1.0, callsite=("x.py", 3, "main"))
    assert gc.is_tracked(record)
    log.finish_task(record)
    assert not gc.is_tracked(record) and log.ended_records() == [record]


def test_the_rings_are_out_of_the_collector_and_keep_what_they_hold():
    import gc

    from lightwork.kernel.events import DriverSpan, EventLog, TaskRecord

    log = EventLog(budget=3)
    records = [TaskRecord(i, f"task{i}", 0, float(i), callsite=("x.py", i, "main"))
               for i in range(5)]
    for record in records:
        log.finish_task(record)
    span = DriverSpan("get", 1.0, 2.0, 1, 7, callsite=("x.py", 9, "main"))
    log.add_span(span)
    # A full collection does not walk the rings (nothing in them leads back to them)...
    assert not gc.is_tracked(log.tasks) and not gc.is_tracked(log.spans)
    assert not any(referrer is log.tasks for referrer in gc.get_referrers(records[-1]))
    assert not any(referrer is log.spans for referrer in gc.get_referrers(span))
    # ... and what only the rings hold lives on through collections (a tracked span too:
    # the ring's reference counts as one from outside), the oldest dropped as before.
    del records, span, record
    gc.collect()
    gc.collect()
    assert [r.name for r in log.ended_records()] == ["task2", "task3", "task4"]
    assert [(s.kind, s.end, s.callsite) for s in log.spans] == [("get", 2.0, ("x.py", 9, "main"))]
    assert log.dropped_tasks == 2


def test_without_the_c_api_records_stay_tracked_and_the_log_still_works(tmp_path):
    # Where neither lightwork._collector (forced off here) nor ctypes can reach
    # PyObject_GC_UnTrack, keep_out_of_collector does nothing: the same log, with the
    # collector's cost back.
    script = write_script(str(tmp_path), "driver.py", textwrap.dedent("""
        import ctypes, gc
        del ctypes.pythonapi  # as on an interpreter without CPython's C API
        import lightwork
        from tests import support
        import lightwork.diagnostics

        @lightwork.remote
        def double(x):
            return 2 * x

        lightwork.init(num_cpus=2)
        assert lightwork.get([double.remote(i) for i in range(30)]) == list(range(0, 60, 2))
        node = support.driver_node()
        with node.lock:
            ended = list(node.log.tasks)
        assert len(ended) == 30 and all(gc.is_tracked(r) for r in ended)
        copies = lightwork.diagnostics.task_records(include_unfinished=False)
        assert sorted(r.task_id for r in copies) == sorted(r.task_id for r in ended)
        lightwork.shutdown()
        print("ok")
    """))
    result = run_script(script, timeout=60, env={"LIGHTWORK_PURE_PYTHON": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def test_a_watcher_takes_each_row_once_and_hears_of_rows_it_missed():
    # The advisor reads what was logged since its last look from the ring itself: each
    # ended task exactly once, in order; rows the ring dropped before a look are counted,
    # not silently skipped; nothing is handed out once it stops watching.
    from lightwork.kernel.events import EventLog, TaskRecord

    log = EventLog(budget=5)
    log.finish_task(TaskRecord(0, "before", 0, 1.0))
    assert log.take_fresh() == ([], [], [])  # not watching: nothing kept
    log.watch()
    for task_id in (1, 2, 3):
        log.finish_task(TaskRecord(task_id, "f", 0, float(task_id)))
    records, spans, _ = log.take_fresh()
    assert [record.task_id for record in records] == [1, 2, 3] and spans == []
    assert log.take_fresh() == ([], [], [])
    for task_id in range(4, 12):  # 8 rows into a ring of 5: 3 are gone before the look
        log.finish_task(TaskRecord(task_id, "f", 0, float(task_id)))
    records, _, _ = log.take_fresh()
    assert [record.task_id for record in records] == [7, 8, 9, 10, 11]
    assert log.missed_rows == 3
    log.unwatch()
    log.finish_task(TaskRecord(12, "f", 0, 12.0))
    assert not log.watching and log.take_fresh() == ([], [], [])


def test_a_watchers_tally_gets_the_records_that_ended_together_in_one_call():
    # The node hands a read's records to the tally at the read's end (tally_now), one
    # call for all; without it, every TALLY_AT_MOST records (the ring's size if smaller)
    # and at each take_fresh, so no record leaves the ring untallied.
    from lightwork.kernel.events import TALLY_AT_MOST, EventLog, TaskRecord

    calls: list[list[int]] = []

    def tally(records):
        calls.append([r.task_id for r in records])
        return [place for place, r in enumerate(records) if r.task_id % 500 == 7]

    log = EventLog(budget=10_000)
    log.watch(tally)
    for task_id in range(5):
        log.finish_task(TaskRecord(task_id, "f", 0, 1.0))
    log.tally_now()
    log.tally_now()  # nothing new: no call
    assert calls == [[0, 1, 2, 3, 4]]
    for task_id in range(5, 5 + 2 * TALLY_AT_MOST + 10):
        log.finish_task(TaskRecord(task_id, "f", 0, 1.0))
    assert [len(c) for c in calls[1:]] == [TALLY_AT_MOST, TALLY_AT_MOST]
    fresh = log.take_fresh()  # tallies the last 10 first
    assert sum(len(c) for c in calls) == 5 + 2 * TALLY_AT_MOST + 10
    assert [c[0] for c in calls] == [0, 5, 5 + TALLY_AT_MOST, 5 + 2 * TALLY_AT_MOST]
    assert [fresh.records[place].task_id for place in fresh.notable] == [7, 507, 1007, 1507, 2007]

    small = EventLog(budget=3)
    calls.clear()
    small.watch(tally)
    for task_id in range(7):
        small.finish_task(TaskRecord(task_id, "f", 0, 1.0))
    small.take_fresh()
    assert calls == [[0, 1, 2], [3, 4, 5], [6]]  # before the ring of 3 drops any


def test_records_logged_together_match_records_logged_one_by_one():
    # A read's plain tasks reach the log in one call (EventLog.finish_tasks): the ring,
    # its drop count, the counts by state and a watcher's rows must be as if each had
    # been logged alone, including when the batch overflows the ring.
    from lightwork.kernel.events import EventLog, TaskRecord

    def finished(task_id):
        record = TaskRecord(task_id, "f", 0, float(task_id))
        record.state = "FINISHED"
        return record

    tallied = {"one": [], "batch": []}
    one, batch = EventLog(budget=5), EventLog(budget=5)
    one.watch(lambda records: tallied["one"].extend(r.task_id for r in records) or [])
    batch.watch(lambda records: tallied["batch"].extend(r.task_id for r in records) or [])
    for ids in ([1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11]):
        for task_id in ids:
            one.finish_task(finished(task_id))
        batch.finish_tasks([finished(task_id) for task_id in ids])
        one.tally_now()
        batch.tally_now()
        assert [r.task_id for r in batch.tasks] == [r.task_id for r in one.tasks]
        assert batch.dropped_tasks == one.dropped_tasks
        assert dict(batch.ended_counts) == dict(one.ended_counts)
    assert [r.task_id for r in batch.tasks] == [7, 8, 9, 10, 11]
    assert batch.dropped_tasks == 6 and batch.ended_counts["FINISHED"] == 11
    assert tallied["batch"] == tallied["one"] == list(range(1, 12))  # none dropped untallied
    fresh = [[r.task_id for r in log.take_fresh().records] for log in (one, batch)]
    assert fresh == [[7, 8, 9, 10, 11]] * 2
    assert batch.missed_rows == one.missed_rows == 6


def test_the_log_keeps_the_order_tasks_ended_in_when_a_read_mixes_plain_and_other_tasks(
        fresh_runtime):
    # One worker runs them one after another, and their results come back many to a
    # read: the plain tasks' records go to the log together, a two-return task's alone
    # in between; the ring must still hold them in the order they finished.
    lightwork.init(num_cpus=1)
    try:
        @lightwork.remote
        def one(i):
            return i

        @lightwork.remote(num_returns=2)
        def two(i):
            return i, -i

        refs = []
        for i in range(300):
            refs.extend(two.remote(i) if i % 7 == 3 else [one.remote(i)])
        lightwork.get(refs, timeout=60)
        records = [r for r in task_records() if r.name.split(".")[-1] in ("one", "two")]
        assert len(records) == 300 and {r.state for r in records} == {"FINISHED"}
        twos = sum(r.name.endswith(".two") for r in records)
        assert twos == len([i for i in range(300) if i % 7 == 3])
        finished = [r.finished for r in records]
        assert finished == sorted(finished)
    finally:
        lightwork.shutdown()


def test_an_actors_calls_are_logged_in_order_and_let_go_of_its_handle(fresh_runtime):
    # An actor's plain calls that end in one read are logged together and drop their
    # holds on the handle together (ActorManager.on_messages); a two-return call in
    # between goes the general way. Order, counts and the handle's uses must add up.
    from tests.support import driver_node

    lightwork.init(num_cpus=1)
    try:
        @lightwork.remote
        class Counter:
            def one(self, i):
                return i

            @lightwork.method(num_returns=2)
            def two(self, i):
                return i, -i

        counter = Counter.remote()
        refs = []
        for i in range(300):
            refs.extend(counter.two.remote(i) if i % 7 == 3 else [counter.one.remote(i)])
        values = lightwork.get(refs, timeout=60)
        assert values[:4] == [0, 1, 2, 3] and values[4] == -3
        records = [r for r in task_records() if r.name.split(".")[-1] in ("one", "two")]
        assert len(records) == 300 and {r.state for r in records} == {"FINISHED"}
        finished = [r.finished for r in records]
        assert finished == sorted(finished)
        node = driver_node()
        with node.lock:
            actor_id = counter._ref.id
            assert node.actors.actors[actor_id].calls_done == 300
            assert node.objects.entries[actor_id].task_uses == 0  # no call holds it any more
    finally:
        lightwork.shutdown()


def test_a_watcher_reads_its_fresh_records_in_the_ring_itself():
    # take_fresh hands out a view of the ring's newest records (FreshRecords), not a
    # copy: in log order by place and by iteration, bounded on both sides.
    from lightwork.kernel.events import EventLog, FreshRecords, TaskRecord

    log = EventLog(budget=6)
    log.watch()
    for task_id in range(1, 5):
        log.finish_task(TaskRecord(task_id, "f", 0, float(task_id)))
    log.take_fresh()
    for task_id in range(5, 9):  # the ring (6) now holds 3..8; 5..8 are fresh
        log.finish_task(TaskRecord(task_id, "f", 0, float(task_id)))
    fresh = log.take_fresh()
    assert isinstance(fresh.records, FreshRecords) and len(fresh.records) == 4
    assert [fresh.records[place].task_id for place in range(4)] == [5, 6, 7, 8]
    assert [record.task_id for record in fresh.records] == [5, 6, 7, 8]
    for outside in (-1, 4):
        with pytest.raises(IndexError):
            fresh.records[outside]
    assert log.take_fresh().records == []  # nothing new: an empty list
