"""The scheduler's decisions, driven without processes."""

from __future__ import annotations

import pytest

from lightwork.kernel.calls import EMPTY_ARGS
from lightwork.kernel.events import TaskRecord
from lightwork.engines.local.scheduler import (
    MAX_PIPELINE_DEPTH,
    PIPELINE_WINDOW_S,
    Scheduler,
    TaskSpec,
)
from lightwork.kernel.resources import make_shape

pytestmark = pytest.mark.lightwork_only


def task(task_id, cpus=1.0, key=b"f", **resources):
    shape = make_shape({"CPU": cpus, **resources})
    return TaskSpec(task_id, key, "f", EMPTY_ARGS, (), (task_id + 1000,), 1, shape, 3, False, 0,
                    TaskRecord(task_id, "f", 0, 0.0))


def test_tasks_go_to_idle_workers_until_resources_run_out():
    s = Scheduler({"CPU": 2.0})
    for worker_id in (1, 2, 3):
        s.add_worker(worker_id)
    for i in range(4):
        s.make_ready(task(i))
    placed = s.schedule()
    assert [t.task_id for t in placed] == [0, 1]
    assert len({t.worker.worker_id for t in placed}) == 2
    assert s.available["CPU"] == 0
    assert s.queued_count() == 2


def test_finishing_gives_resources_back_and_the_next_task_runs():
    s = Scheduler({"CPU": 1.0})
    s.add_worker(1)
    first, second = task(0), task(1)
    s.make_ready(first)
    s.make_ready(second)
    [placed] = s.schedule()
    assert placed is first and s.schedule() == []
    s.finish(placed.worker, first, run_time=0.5)
    assert s.available["CPU"] == 1.0
    assert s.schedule() == [second]


def test_a_gpu_task_waiting_does_not_block_cpu_tasks_behind_it():
    s = Scheduler({"CPU": 2.0, "GPU": 1.0})
    s.add_worker(1)
    s.add_worker(2)
    s.make_ready(task(0, GPU=1.0))
    s.make_ready(task(1, GPU=1.0))
    s.make_ready(task(2))
    placed = [t.task_id for t in s.schedule()]
    assert placed == [0, 2]  # task 1 waits for the GPU; task 2 does not wait for task 1


def test_short_tasks_are_queued_behind_running_ones_long_ones_are_not():
    s = Scheduler({"CPU": 1.0})
    s.add_worker(1)
    s.mean_run_time[b"short"] = 0.0001
    s.mean_run_time[b"long"] = 0.5
    s.make_ready(task(0, key=b"short"))
    for i in range(1, 5):
        s.make_ready(task(i, key=b"short"))
    assert len(s.schedule()) == 5  # all on the one worker, pipelined
    s2 = Scheduler({"CPU": 1.0})
    s2.add_worker(1)
    s2.mean_run_time[b"long"] = 0.5
    for i in range(3):
        s2.make_ready(task(i, key=b"long"))
    assert len(s2.schedule()) == 1


def test_short_tasks_fill_the_least_loaded_busy_worker_up_to_each_functions_depth():
    """One pass queues short tasks behind running ones: always on the busy worker with
    the fewest queued, never past the function's pipeline depth (5 for a function of
    0.9 ms, MAX_PIPELINE_DEPTH for a tiny one)."""
    s = Scheduler({"CPU": 3.0})
    slots = [s.add_worker(worker_id) for worker_id in (1, 2, 3)]
    s.mean_run_time[b"short"] = 0.0009
    assert s.pipeline_depth(b"short") == 5
    s.mean_run_time[b"tiny"] = 1e-6
    for i in range(3):
        s.make_ready(task(i, key=b"short"))
    s.schedule()  # one on each worker
    for i in range(3, 18):
        s.make_ready(task(i, key=b"short"))
    placed = s.schedule()
    assert [t.worker.worker_id for t in placed] == [1, 2, 3] * 4  # fewest queued first
    assert [len(slot.inflight) for slot in slots] == [5, 5, 5]
    assert s.queued_count() == 3  # depth 5 reached everywhere
    for i in range(18, 18 + 3 * MAX_PIPELINE_DEPTH):
        s.make_ready(task(i, key=b"tiny"))
    assert s.schedule() == []  # the short ones wait at the head of the queue
    s.ready.clear()
    for i in range(200, 200 + 3 * MAX_PIPELINE_DEPTH):
        s.make_ready(task(i, key=b"tiny"))
    placed = s.schedule()
    assert len(placed) == 3 * (MAX_PIPELINE_DEPTH - 5)
    assert [len(slot.inflight) for slot in slots] == [MAX_PIPELINE_DEPTH] * 3
    # In one pass: the idle workers first, then short tasks queued behind them all.
    fresh = Scheduler({"CPU": 3.0})
    fresh_slots = [fresh.add_worker(worker_id) for worker_id in (1, 2, 3)]
    fresh.mean_run_time[b"short"] = 0.0009
    for i in range(16):
        fresh.make_ready(task(i, key=b"short"))
    assert len(fresh.schedule()) == 15
    assert [len(slot.inflight) for slot in fresh_slots] == [5, 5, 5]


def _held_per_worker(s, slots, first_id, key, now):
    """Offer 2,000 ``key`` tasks in a pass at ``now`` to workers busy with a short task
    each: how many tasks each worker then holds (its running one included: the depth)."""
    for i in range(2000):
        s.make_ready(task(first_id + i, key=key))
    s.schedule(now)
    return [len(slot.inflight) for slot in slots]


def _busy(workers):
    """A scheduler whose workers each run a short task."""
    s = Scheduler({"CPU": float(workers)})
    slots = [s.add_worker(worker_id) for worker_id in range(1, workers + 1)]
    s.mean_run_time[b"short"] = 2 ** -12  # 244 µs (exact in binary): 20 in 5 ms
    s.mean_run_time[b"tiny"] = 1e-6
    for i in range(workers):
        s.make_ready(task(i, key=b"short"))
    s.schedule()
    return s, slots


def test_the_pipeline_window_follows_the_gap_between_passes():
    """Passes far apart (the I/O thread starved of the GIL) queue as much work as the
    gap lasts, up to MAX_WINDOW_S; passes close together queue the base window's."""
    s, slots = _busy(2)
    s.schedule(10.0)
    assert _held_per_worker(s, slots, 100, b"short", 10 + 2 ** -10) == [20, 20]  # 1 ms: base
    s, slots = _busy(2)
    s.schedule(10.0)
    assert _held_per_worker(s, slots, 100, b"short", 10 + 2 ** -5) == [128, 128]  # 31 ms
    s.schedule(10 + 2 ** -5 + 2 ** -10)  # the next pass soon after: back to the base window
    assert s.window_s == PIPELINE_WINDOW_S
    s, slots = _busy(2)
    s.schedule(10.0)
    assert _held_per_worker(s, slots, 100, b"short", 70.0) == [409, 409]  # 0.1 s: capped
    # The depth cap of tiny tasks grows with the window, in proportion.
    s, slots = _busy(2)
    s.schedule(10.0)
    assert _held_per_worker(s, slots, 100, b"tiny", 10 + 2 ** -5) == [
        int(MAX_PIPELINE_DEPTH * 2 ** -5 / PIPELINE_WINDOW_S)] * 2  # 200 for a 31 ms gap
    # Untimed passes (no clock given) keep the window they had: the base one at first,
    # a wide one after a far-apart timed pass.
    s, slots = _busy(2)
    assert _held_per_worker(s, slots, 100, b"short", None) == [20, 20]
    s.schedule(10.0)
    s.schedule(10 + 2 ** -5)
    s.schedule()
    assert s.window_s == 2 ** -5


def test_a_program_submitting_in_a_loop_gets_the_widest_window_at_once():
    """The node flags a run of submissions queued while every worker was busy: the next
    pass queues MAX_WINDOW_S of work however recent the last pass, then the flag is spent."""
    s, slots = _busy(2)
    s.schedule(10.0)
    s.submitting = True
    assert _held_per_worker(s, slots, 100, b"short", 10 + 2 ** -10) == [409, 409]
    assert not s.submitting
    s.schedule(10.002)
    assert s.window_s == PIPELINE_WINDOW_S


def test_short_tasks_never_wait_behind_a_long_or_unknown_running_task():
    """A short task queued behind a long one would wait for its end while other slots
    free up: only workers running a short task take a queue."""
    s = Scheduler({"CPU": 3.0})
    for worker_id in (1, 2, 3):
        s.add_worker(worker_id)
    s.mean_run_time[b"short"] = 0.0002
    s.mean_run_time[b"long"] = 2.0
    first = [task(0, key=b"long"), task(1, key=b"unknown"), task(2, key=b"short")]
    for t in first:
        s.make_ready(t)
    running = {t.task_id: t.worker for t in s.schedule(1.0)}
    for i in range(3, 403):
        s.make_ready(task(i, key=b"short"))
    placed = s.schedule(1.05)  # a 50 ms window: 250 deep
    assert {t.worker.worker_id for t in placed} == {running[2].worker_id}
    assert [len(running[i].inflight) for i in (0, 1, 2)] == [1, 1, 250]
    # The long task ends: its worker takes the next short task, then a queue behind it.
    s.finish(running[0], first[0], 2.0)
    placed = s.schedule(1.051)
    assert {t.worker.worker_id for t in placed} == {running[0].worker_id}
    assert len(running[0].inflight) == 25  # 5 ms deep: the passes are close again


def test_blocked_worker_lends_its_cpu_and_takes_it_back():
    s = Scheduler({"CPU": 1.0})
    slot = s.add_worker(1)
    parent = task(0)
    s.make_ready(parent)
    s.schedule()
    assert s.available["CPU"] == 0
    s.block(slot)
    assert s.available["CPU"] == 1.0
    s.unblock(slot)
    assert s.available["CPU"] == 0


def test_dead_worker_returns_its_tasks_and_resources():
    s = Scheduler({"CPU": 1.0})
    slot = s.add_worker(1)
    s.mean_run_time[b"f"] = 0.0001
    for i in range(3):
        s.make_ready(task(i))
    s.schedule()
    returned = s.remove_worker(slot)
    assert [t.task_id for t in returned] == [0, 1, 2]
    assert s.available["CPU"] == 1.0 and not s.workers


def test_infeasible_shapes_are_explained():
    s = Scheduler({"CPU": 2.0, "GPU": 0.0})
    assert s.check_feasible(make_shape({"CPU": 2.0})) is None
    assert "3 CPU" in s.check_feasible(make_shape({"CPU": 3.0}))
    assert "custom" in s.check_feasible(make_shape({"CPU": 1.0, "custom": 1.0}))

