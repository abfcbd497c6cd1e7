"""The scheduler: its decisions and its placement groups driven without processes, and
what a program sees of it on a real runtime.

* The state machine (``engines/local/scheduler.py``), fed tasks and workers by hand:
  where each task goes, the pipeline window, lending a blocked worker's CPU, a dead
  worker's tasks, infeasible shapes.
* Placement groups in the scheduler, also without processes: reservation, isolation,
  strategies on one node, removal.
* On a real runtime (``TestOnASmallRuntime``): scheduling respects num_cpus, fractional
  CPUs and custom resources; resources are reported and accounted; a request that can
  never fit fails at submission. It runs on its own small runtime (2 CPUs, one
  "widget") so limits are easy to reach. Exclusion is checked structurally: each task
  marks itself running in a directory and records whether it ever saw another task
  running at the same time.
"""

from __future__ import annotations

import glob
import os
import time

import pytest

import lightwork as ray
from lightwork.engines.local.scheduler import (  # the scheduler's own tests: their subject
    MAX_PIPELINE_DEPTH,
    PIPELINE_WINDOW_S,
    Scheduler,
    TaskSpec,
)
from lightwork.kernel.calls import EMPTY_ARGS
from lightwork.kernel.events import TaskRecord
from lightwork.kernel.resources import captured_shape, group_shape, make_shape
from tests.helpers import arrive_and_wait, wait_for_file, wait_until

# Lightwork-only as a whole: the module imports the scheduler, so conftest skips it under
# the Ray switch anyway (the runtime section's tests describe Ray's behaviour too).
pytestmark = pytest.mark.lightwork_only


@pytest.fixture(scope="module")
def small_runtime():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, resources={"widget": 1})
    yield
    ray.shutdown()


ON_THE_SMALL_RUNTIME = pytest.mark.usefixtures("small_runtime")


# ==== the state machine, without processes ============================================

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
    s.add_worker(2, gpu=True)
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


def test_tasks_a_blocked_worker_waits_for_run_before_the_others():
    s = Scheduler({"CPU": 1.0})
    queued = [task(i) for i in range(200)]
    for t in queued:
        s.make_ready(t)
    near_tail, deep, head = queued[198], queued[5], queued[0]
    s.run_first([near_tail, deep])  # the order of the get's refs is kept
    order = [t.task_id for t in s.ready[near_tail.shape]]
    assert order[:3] == [198, 5, 0] and len(order) == 200 == len(set(order))
    s.run_first([head])
    assert [t.task_id for t in s.ready[head.shape]][:3] == [0, 198, 5]


def test_a_waited_for_task_of_another_shape_gets_the_lent_cpu_first():
    s = Scheduler({"CPU": 2.0})
    s.add_worker(1)
    caller, waited = task(0, cpus=2.0), task(1)
    s.make_ready(caller)  # its shape's queue comes first in the pass order
    s.make_ready(waited)
    s.run_first([waited])
    assert s.schedule() == [waited]
    assert [t.task_id for t in s.ready[caller.shape]] == [0]


def test_run_first_leaves_tasks_that_are_not_queued_alone():
    s = Scheduler({"CPU": 1.0})
    s.add_worker(1)
    running, waiting, other_shape = task(0), task(1), task(2, cpus=0.5)
    s.make_ready(running)
    s.make_ready(task(3))
    [placed] = s.schedule()
    assert placed is running
    s.make_ready(other_shape)
    other_shape.state = "PENDING_ARGS_AVAIL"  # (as a task whose arguments are pending)
    s.run_first([running, waiting, other_shape])
    assert [t.task_id for t in s.ready[task(3).shape]] == [3]
    assert [t.task_id for t in s.ready[other_shape.shape]] == [2]


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


# ==== placement groups in the scheduler, without processes ============================

def task_of_shape(task_id, shape):
    return TaskSpec(task_id, b"f", "f", EMPTY_ARGS, (), (task_id + 1000,), 1, shape, 3, False, 0,
                    TaskRecord(task_id, "f", 0, 0.0))


def in_group(group, cpus, index=-1):
    return group_shape(make_shape({"CPU": cpus}), group.hex, index)


def scheduler_with_workers(cpus, workers=4):
    s = Scheduler({"CPU": float(cpus)})
    for worker_id in range(1, workers + 1):
        s.add_worker(worker_id)
    return s


def test_a_group_reserves_its_bundles_and_outside_tasks_cannot_use_them():
    s = scheduler_with_workers(3)
    group = s.add_group(1, "aa", "", [{"CPU": 1}, {"CPU": 1}], "PACK")
    assert group.state == "CREATED"
    assert s.available["CPU"] == 1.0
    for i in range(3):
        s.make_ready(task_of_shape(i, make_shape({"CPU": 1})))
    assert [t.task_id for t in s.schedule()] == [0]  # only the unreserved CPU
    assert s.queued_count() == 2


def test_tasks_inside_use_only_the_bundle():
    s = scheduler_with_workers(4)
    group = s.add_group(1, "aa", "", [{"CPU": 1}, {"CPU": 1}], "SPREAD")
    s.make_ready(task_of_shape(0, in_group(group, 1, index=0)))
    s.make_ready(task_of_shape(1, in_group(group, 1, index=0)))  # bundle 0 is taken by task 0
    s.make_ready(task_of_shape(2, in_group(group, 1)))  # any bundle: bundle 1 is free
    placed = [t.task_id for t in s.schedule()]
    assert placed == [0, 2]
    assert s.available["CPU"] == 2.0  # the group used its own reservation only


def test_a_group_waits_for_free_resources_then_is_reserved_in_order():
    s = scheduler_with_workers(2)
    s.make_ready(task_of_shape(0, make_shape({"CPU": 2})))
    [running] = s.schedule()
    slot = running.worker
    first = s.add_group(1, "aa", "", [{"CPU": 1}], "STRICT_PACK")
    second = s.add_group(2, "bb", "", [{"CPU": 2}], "PACK")
    assert (first.state, second.state) == ("PENDING", "PENDING")
    s.finish(slot, running, run_time=1.0)
    s.schedule()
    assert (first.state, second.state) == ("CREATED", "PENDING")
    s.remove_group(1)
    s.schedule()
    assert second.state == "CREATED" and s.available["CPU"] == 0.0


@pytest.mark.parametrize("bundles, strategy, problem", [
    ([{"CPU": 1}, {"CPU": 1}], "STRICT_SPREAD", "STRICT_SPREAD puts each of its 2 bundles"),
    ([{"CPU": 8}], "PACK", "bundle 0 .* needs 8 CPU but the runtime has 2"),
    ([{"CPU": 2}, {"CPU": 1}], "SPREAD", "together can never be reserved"),
    ([{"GPU": 1}], "PACK", "needs 1 GPU"),
    ([{"CPU": 1}], "CLOSE", "strategy must be one of"),
])
def test_impossible_groups_fail_at_creation(bundles, strategy, problem):
    s = scheduler_with_workers(2)
    with pytest.raises(ValueError, match=problem):
        s.add_group(1, "aa", "", bundles, strategy)
    assert s.available == {"CPU": 2.0} and not s.groups


def test_strict_spread_of_one_bundle_is_fine():
    s = scheduler_with_workers(2)
    assert s.add_group(1, "aa", "", [{"CPU": 1}], "STRICT_SPREAD").state == "CREATED"


def test_removal_gives_resources_back_and_orphans_queued_tasks():
    s = scheduler_with_workers(2)
    group = s.add_group(1, "aa", "", [{"CPU": 1}], "PACK")
    s.make_ready(task_of_shape(0, in_group(group, 1)))
    s.make_ready(task_of_shape(1, in_group(group, 1)))
    [running] = s.schedule()
    slot = running.worker
    s.remove_group(1)
    assert [t.task_id for t in s.orphaned] == [1]
    assert s.available["CPU"] == 2.0  # the reservation is back at once
    s.finish(slot, running, run_time=0.1)  # the running task gives back into the dead name
    assert s.available["CPU"] == 2.0
    assert s.available["CPU_group_aa"] <= 0.0
    late = task_of_shape(2, in_group(group, 1))  # became ready after the removal
    s.make_ready(late)
    s.orphaned.clear()
    assert s.schedule() == [] and s.orphaned == [late]
    assert s.check_feasible(late.shape) is not None


def test_a_capturing_task_places_its_children_in_its_group():
    plain = make_shape({"CPU": 1})
    parent = group_shape(plain, "aa", 0, capture=True)
    child = captured_shape(plain, parent)
    assert dict(child) == {"CPU_group_aa": 1.0, "capture_group_aa": 0.001}
    assert captured_shape(plain, group_shape(plain, "aa", 0)) == plain  # no capture
    elsewhere = group_shape(plain, "bb", -1)
    assert captured_shape(elsewhere, parent) == elsewhere  # a child naming its own group
    s = scheduler_with_workers(2)
    s.add_group(1, "aa", "", [{"CPU": 1}], "PACK")
    assert s.check_feasible(child) is None


# ==== on a real runtime ===============================================================

def overlapped(directory: str, hold: float = 0.3) -> bool:
    """Run for ``hold`` s; True if another such task was running at any time meanwhile."""
    me = os.path.join(directory, f"running-{os.getpid()}-{time.time_ns()}")
    open(me, "w").close()
    seen = False
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        if len(glob.glob(os.path.join(directory, "running-*"))) > 1:
            seen = True
        time.sleep(0.01)
    os.remove(me)
    return seen


class TestOnASmallRuntime:
    """num_cpus, fractional CPUs and custom resources on a real runtime."""

    pytestmark = ON_THE_SMALL_RUNTIME

    def test_cluster_resources_report_init_arguments(self):
        resources = ray.cluster_resources()
        assert resources["CPU"] == pytest.approx(2)
        assert resources["widget"] == pytest.approx(1)
        assert resources.get("GPU", 0) == 0

    def test_two_cpu_tasks_never_overlap_on_two_cpus(self, tmp_path):
        task = ray.remote(num_cpus=2)(overlapped)
        assert ray.get([task.remote(str(tmp_path)) for _ in range(3)], timeout=30) == [False] * 3

    def test_one_cpu_tasks_overlap_on_two_cpus(self, tmp_path):
        task = ray.remote(arrive_and_wait)
        assert ray.get([task.remote(str(tmp_path), str(i), 2) for i in range(2)], timeout=30) == [
            True,
            True,
        ]

    def test_fractional_cpus_pack_several_tasks_per_cpu(self, tmp_path):
        task = ray.remote(num_cpus=0.5)(arrive_and_wait)
        refs = [task.remote(str(tmp_path), str(i), 4) for i in range(4)]
        assert ray.get(refs, timeout=30) == [True] * 4

    def test_custom_resource_limits_concurrency(self, tmp_path):
        task = ray.remote(num_cpus=0, resources={"widget": 1})(overlapped)
        assert ray.get([task.remote(str(tmp_path)) for _ in range(3)], timeout=30) == [False] * 3

    def test_available_resources_drop_while_a_task_holds_them(self, tmp_path):
        gate = str(tmp_path / "go")
        hold = ray.remote(num_cpus=2, resources={"widget": 1})(wait_for_file)
        ref = hold.remote(gate)
        try:
            wait_until(
                lambda: ray.available_resources().get("CPU", 0) == 0
                and ray.available_resources().get("widget", 0) == 0,
                timeout=10,
                message="CPU and widget to be in use",
            )
            assert ray.cluster_resources()["CPU"] == pytest.approx(2)
        finally:
            open(gate, "w").close()
        assert ray.get(ref, timeout=10) is True
        wait_until(
            lambda: ray.available_resources().get("CPU", 0) == 2
            and ray.available_resources().get("widget", 0) == 1,
            timeout=10,
            message="resources to be released",
        )

    def test_fractional_amounts_taken_and_given_back_leave_exactly_the_total(self, tmp_path):
        """Float sums drift: 2.0 - 0.8474 - 0.0283 + 0.8474 + 0.0283 is
        2.0000000000000004. Two tasks holding those amounts at once, the first given back
        first, leave exactly the total reported free."""
        first = ray.remote(overlapped).options(num_cpus=0.8474).remote(str(tmp_path), 0.3)
        second = ray.remote(overlapped).options(num_cpus=0.0283).remote(str(tmp_path), 0.8)
        assert ray.get([first, second], timeout=30) == [True, True]  # they did overlap
        wait_until(lambda: ray.available_resources().get("CPU") == 2.0, timeout=10,
                   message="exactly 2 CPUs free again")

    def test_infeasible_cpu_request_warns_and_its_get_raises_at_once(self):
        """Ray warns and leaves the task pending (its get waits forever); lightwork warns,
        and the ref's get raises at once, naming the resource and what the session has."""

        @ray.remote(num_cpus=64)
        def greedy():
            return 1

        with pytest.warns(ray.exceptions.UnschedulableRequestWarning, match="64 CPU") as caught:
            ref = greedy.remote()
        assert caught[0].filename == __file__  # at the user's line, not lightwork's
        started = time.monotonic()
        with pytest.raises(ray.exceptions.TaskUnschedulableError,
                           match=r"greedy.*64 CPU.*2 CPU in total.*options\(\)"):
            ray.get(ref, timeout=30)
        assert time.monotonic() - started < 20  # at once: not a hang cut by the timeout
        ready, pending = ray.wait([ref], timeout=0)
        assert ready == [ref] and pending == []  # ready, with its error

    def test_infeasible_request_warns_once_per_shape(self, recwarn):
        @ray.remote(num_cpus=32)
        def greedy():
            return 1

        refs = [greedy.remote() for _ in range(3)]
        other = greedy.options(num_cpus=33).remote()
        told = [w for w in recwarn if w.category is ray.exceptions.UnschedulableRequestWarning]
        assert ["32 CPU" in str(w.message) for w in told] == [True, False]
        for ref in [*refs, other]:
            with pytest.raises(ray.exceptions.TaskUnschedulableError):
                ray.get(ref, timeout=30)

    def test_infeasible_custom_resource_names_the_resource(self):
        @ray.remote
        def needs_gadget():
            return 1

        with pytest.warns(ray.exceptions.UnschedulableRequestWarning, match="gadget"):
            missing = needs_gadget.options(resources={"gadget": 1}).remote()
        with pytest.warns(ray.exceptions.UnschedulableRequestWarning, match="5 widget"):
            too_many = needs_gadget.options(resources={"widget": 5}).remote()
        with pytest.raises(ray.exceptions.TaskUnschedulableError, match="1 gadget"):
            ray.get(missing, timeout=30)
        with pytest.raises(ray.exceptions.TaskUnschedulableError, match="1 widget in total"):
            ray.get(too_many, timeout=30)

    def test_gpu_request_without_gpus_fails_its_refs(self):
        @ray.remote(num_gpus=1, num_returns=2)
        def needs_gpu():
            return 1, 2

        with pytest.warns(ray.exceptions.UnschedulableRequestWarning, match="GPU"):
            first, second = needs_gpu.remote()
        for ref in (first, second):
            with pytest.raises(ray.exceptions.TaskUnschedulableError, match="1 GPU"):
                ray.get(ref, timeout=30)

    def test_a_task_depending_on_an_infeasible_one_fails_with_its_error(self):
        @ray.remote(num_cpus=16)
        def greedy():
            return 1

        @ray.remote
        def plus_one(x):
            return x + 1

        with pytest.warns(ray.exceptions.UnschedulableRequestWarning):
            ref = greedy.remote()
        with pytest.raises(ray.exceptions.TaskUnschedulableError, match="greedy"):
            ray.get(plus_one.remote(ref), timeout=30)

    def test_a_nested_infeasible_task_fails_inside_its_parent(self):
        @ray.remote
        def needs_tape():
            return 1

        @ray.remote
        def parent():
            ref = needs_tape.options(resources={"tape": 2}).remote()
            try:
                ray.get(ref, timeout=30)
            except ray.exceptions.TaskUnschedulableError as error:
                return str(error)
            return "ran"

        assert "2 tape" in ray.get(parent.remote(), timeout=60)

    def test_runtime_still_schedules_after_infeasible_requests(self):
        @ray.remote
        def ok():
            return "ok"

        assert ray.get(ok.remote(), timeout=10) == "ok"

    @pytest.mark.parametrize("bad", [-1, -0.5])
    def test_negative_num_cpus_is_valueerror(self, bad):
        def f():
            return 1

        with pytest.raises(ValueError, match="num_cpus"):
            ray.remote(num_cpus=bad)(f).remote()
        with pytest.raises(ValueError, match="num_cpus"):
            ray.remote(f).options(num_cpus=bad).remote()

    def test_non_numeric_num_cpus_is_valueerror(self):
        """Spec asks for ValueError; Ray raises TypeError, so this fails against Ray."""

        def f():
            return 1

        with pytest.raises(ValueError, match="num_cpus"):
            ray.remote(num_cpus="two")(f).remote()

    def test_negative_custom_resource_is_valueerror(self):
        def f():
            return 1

        with pytest.raises(ValueError):
            ray.remote(resources={"widget": -1})(f).remote()

    def test_nested_gets_do_not_deadlock_with_more_parents_than_cpus(self):
        @ray.remote
        def child(i):
            return -i

        @ray.remote
        def parent(i):
            return ray.get(child.remote(i))

        # 8 parents on 2 CPUs: each blocked parent must lend its slot to a child.
        assert ray.get([parent.remote(i) for i in range(8)], timeout=40) == [-i for i in range(8)]

    def test_callers_blocked_on_nested_calls_do_not_each_take_a_worker(self):
        """A thousand callers of a nested chain on one CPU: each blocked caller lends
        its CPU, and the task it waits for runs next rather than the next caller, so
        the workers started stay few (in a FIFO queue every caller, then every middle
        task, got a worker of its own: about two per caller)."""
        @ray.remote
        def leaf():
            return 1

        @ray.remote
        def middle():
            return ray.get(leaf.remote()) + 1

        @ray.remote(num_cpus=2)  # one at a time on the small runtime's two CPUs
        def caller(i):
            return ray.get(middle.remote()) + i

        from tests import support

        before = support.worker_ids()
        assert ray.get([caller.remote(i) for i in range(300)], timeout=60) == [
            i + 2 for i in range(300)]
        assert len(support.worker_ids() - before) < 30

    def test_crashed_task_releases_its_resources(self):
        @ray.remote(num_cpus=2, resources={"widget": 1}, max_retries=0)
        def crash():
            os._exit(3)

        with pytest.raises(ray.exceptions.WorkerCrashedError):
            ray.get(crash.remote(), timeout=20)
        wait_until(
            lambda: ray.available_resources().get("CPU", 0) == 2
            and ray.available_resources().get("widget", 0) == 1,
            timeout=10,
            message="resources of the crashed task to be released",
        )

        @ray.remote(num_cpus=2, resources={"widget": 1})
        def whole_node():
            return "fits"

        assert ray.get(whole_node.remote(), timeout=20) == "fits"


def test_a_task_that_needs_a_gpu_never_runs_on_a_worker_of_cpu_tasks():
    s = Scheduler({"CPU": 2.0, "GPU": 1.0})
    s.add_worker(1)
    s.make_ready(task(0))
    assert [t.worker.worker_id for t in s.schedule()] == [1]
    s.finish(s.workers[1], s.workers[1].inflight[0], 0.01)
    s.make_ready(task(1, GPU=1.0))
    assert s.schedule() == []  # worker 1 is idle, but of the CPU kind
    assert s.starving == 1 and s.take_starving_gpu() == 1 and s.take_starving_gpu() == 0
    assert not s.may_queue or not s.idle_gpu
    s.add_worker(2, gpu=True)
    assert not s.may_queue  # a GPU worker is idle: a driver's submit must not wait
    gpu_task = s.schedule()[0]
    assert gpu_task.worker.worker_id == 2
    s.make_ready(task(2))  # a CPU task while the GPU worker is busy: the CPU worker
    assert [t.worker.worker_id for t in s.schedule()] == [1]
    s.finish(s.workers[2], gpu_task, 0.01)
    assert 2 in s.idle_gpu and 2 not in s.idle
    s.make_ready(task(3, GPU=0.5))  # a fractional GPU is the GPU kind too
    assert [t.worker.worker_id for t in s.schedule()] == [2]


def test_a_dead_gpu_worker_leaves_its_own_idle_set():
    s = Scheduler({"CPU": 1.0, "GPU": 1.0})
    s.add_worker(1)
    gpu_slot = s.add_worker(2, gpu=True)
    assert not s.may_queue
    assert s.remove_worker(gpu_slot) == []
    assert 2 not in s.idle_gpu and s.may_queue
