"""Placement groups in the scheduler, driven without processes: reservation, isolation,
strategies on one node, removal."""

from __future__ import annotations

import pytest

from lightwork.kernel.calls import EMPTY_ARGS
from lightwork.kernel.events import TaskRecord
from lightwork.engines.local.scheduler import (
    Scheduler,
    TaskSpec,
)
from lightwork.kernel.resources import captured_shape, group_shape, make_shape

pytestmark = pytest.mark.lightwork_only


def task(task_id, shape):
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
        s.make_ready(task(i, make_shape({"CPU": 1})))
    assert [t.task_id for t in s.schedule()] == [0]  # only the unreserved CPU
    assert s.queued_count() == 2


def test_tasks_inside_use_only_the_bundle():
    s = scheduler_with_workers(4)
    group = s.add_group(1, "aa", "", [{"CPU": 1}, {"CPU": 1}], "SPREAD")
    s.make_ready(task(0, in_group(group, 1, index=0)))
    s.make_ready(task(1, in_group(group, 1, index=0)))  # bundle 0 is taken by task 0
    s.make_ready(task(2, in_group(group, 1)))  # any bundle: bundle 1 is free
    placed = [t.task_id for t in s.schedule()]
    assert placed == [0, 2]
    assert s.available["CPU"] == 2.0  # the group used its own reservation only


def test_a_group_waits_for_free_resources_then_is_reserved_in_order():
    s = scheduler_with_workers(2)
    s.make_ready(task(0, make_shape({"CPU": 2})))
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
    s.make_ready(task(0, in_group(group, 1)))
    s.make_ready(task(1, in_group(group, 1)))
    [running] = s.schedule()
    slot = running.worker
    s.remove_group(1)
    assert [t.task_id for t in s.orphaned] == [1]
    assert s.available["CPU"] == 2.0  # the reservation is back at once
    s.finish(slot, running, run_time=0.1)  # the running task gives back into the dead name
    assert s.available["CPU"] == 2.0
    assert s.available["CPU_group_aa"] <= 0.0
    late = task(2, in_group(group, 1))  # became ready after the removal
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
