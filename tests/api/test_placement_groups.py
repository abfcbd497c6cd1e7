"""Placement groups on one machine: reservation, isolation, removal, strategies, errors."""

from __future__ import annotations

import os

import pytest
from tests.helpers import wait_for_file

import lightwork
from lightwork.util import get_current_placement_group, placement_group, placement_group_table, remove_placement_group
from lightwork.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@pytest.fixture(scope="module")
def runtime(two_cpus):
    return two_cpus


@lightwork.remote
def gated(path):
    wait_for_file(path)
    return os.getpid()


@lightwork.remote
def pid_of_task():
    return os.getpid()


@lightwork.remote
def current_group():
    group = get_current_placement_group()
    return None if group is None else group.id.hex()


def in_group(group, index=-1):
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)


def test_ready_resolves_and_the_reservation_leaves_the_free_pool(runtime, wait_until):
    group = placement_group([{"CPU": 1}], strategy="PACK")
    try:
        assert lightwork.get(group.ready(), timeout=30) == group
        assert group.wait(5)
        assert placement_group_table(group)["state"] == "CREATED"
        assert lightwork.available_resources().get("CPU", 0) == pytest.approx(1.0)
    finally:
        remove_placement_group(group)
    wait_until(lambda: lightwork.available_resources().get("CPU") == pytest.approx(2.0),
               message="the reservation to come back")  # Ray returns it asynchronously
    assert placement_group_table(group)["state"] == "REMOVED"


def test_tasks_outside_cannot_use_the_reservation(runtime):
    group = placement_group([{"CPU": 1}])
    assert group.wait(30)
    whole_machine = pid_of_task.options(num_cpus=2).remote()
    ready, _ = lightwork.wait([whole_machine], timeout=0.5)
    assert ready == []  # 1 CPU is reserved for the group
    remove_placement_group(group)
    assert isinstance(lightwork.get(whole_machine, timeout=30), int)


def test_tasks_inside_use_only_their_bundle(runtime, tmp_path):
    group = placement_group([{"CPU": 1}], strategy="STRICT_PACK")
    assert group.wait(30)
    gate = str(tmp_path / "gate")
    try:
        first = gated.options(scheduling_strategy=in_group(group, 0)).remote(gate)
        second = gated.options(scheduling_strategy=in_group(group)).remote(gate)
        outside = pid_of_task.remote()  # the free CPU is not the group's
        assert isinstance(lightwork.get(outside, timeout=30), int)
        ready, _ = lightwork.wait([first, second], num_returns=2, timeout=0.5)
        assert len(ready) <= 1  # one bundle CPU: they cannot both be running
        open(gate, "w").close()
        assert all(isinstance(pid, int) for pid in lightwork.get([first, second], timeout=30))
    finally:
        remove_placement_group(group)


def test_a_group_waits_until_its_resources_are_free(runtime, tmp_path):
    gate = str(tmp_path / "gate")
    busy = gated.options(num_cpus=2).remote(gate)
    group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="SPREAD")
    try:
        assert not group.wait(0.5)
        assert placement_group_table(group)["state"] == "PENDING"
        open(gate, "w").close()
        lightwork.get(busy, timeout=30)
        assert group.wait(30)
        assert placement_group_table(group)["state"] == "CREATED"
    finally:
        remove_placement_group(group)


def test_current_placement_group_inside_a_task(runtime):
    group = placement_group([{"CPU": 1}])
    try:
        assert lightwork.get(current_group.options(scheduling_strategy=in_group(group)).remote(),
                             timeout=30) == group.id.hex()
        assert lightwork.get(current_group.remote(), timeout=30) is None
        assert get_current_placement_group() is None  # the driver is in no group
    finally:
        remove_placement_group(group)


def test_a_task_submits_into_a_group(runtime):
    @lightwork.remote
    def submit_into(group):
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        return lightwork.get(current_group.options(scheduling_strategy=strategy).remote())

    group = placement_group([{"CPU": 1}])
    try:
        assert lightwork.get(submit_into.remote(group), timeout=30) == group.id.hex()
    finally:
        remove_placement_group(group)


def test_capture_child_tasks_places_nested_tasks_in_the_group(runtime):
    @lightwork.remote
    def parent():
        return lightwork.get(current_group.remote(), timeout=30)

    group = placement_group([{"CPU": 1}])
    try:
        capturing = PlacementGroupSchedulingStrategy(
            group, placement_group_capture_child_tasks=True)
        assert lightwork.get(parent.options(scheduling_strategy=capturing).remote(),
                             timeout=30) == group.id.hex()
        assert lightwork.get(parent.options(scheduling_strategy=in_group(group)).remote(),
                             timeout=30) is None  # without capture the child runs outside
    finally:
        remove_placement_group(group)


@lightwork.remote  # Ray's default: 1 CPU to be placed, none held, so its children fit
class GroupProbe:
    """Says which group it runs in, and which group the tasks and actors it makes run in."""

    def group(self):
        group = get_current_placement_group()
        return None if group is None else group.id.hex()

    def task_group(self):
        return lightwork.get(current_group.remote(), timeout=30)

    def child_actor_group(self):
        child = GroupProbe.remote()
        return lightwork.get(child.group.remote(), timeout=30)


@lightwork.remote(num_cpus=1)
def make_probe_and_ask():
    probe = GroupProbe.remote()
    return lightwork.get([probe.group.remote(), probe.task_group.remote()], timeout=30)


def capturing(group):
    return PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)


def test_an_actor_made_by_a_capturing_task_runs_in_the_group(runtime):
    group = placement_group([{"CPU": 1}])
    try:
        in_it = group.id.hex()
        # The actor, and the task its method submits, run in the parent task's group.
        assert lightwork.get(make_probe_and_ask.options(scheduling_strategy=capturing(group))
                             .remote(), timeout=30) == [in_it, in_it]
        # Without capture the actor is placed outside the group, as in Ray.
        assert lightwork.get(make_probe_and_ask.options(scheduling_strategy=in_group(group))
                             .remote(), timeout=30) == [None, None]
    finally:
        remove_placement_group(group)


def test_a_capturing_actor_places_its_tasks_and_actors_in_the_group(runtime):
    group = placement_group([{"CPU": 1}])
    try:
        probe = GroupProbe.options(scheduling_strategy=capturing(group)).remote()
        in_it = group.id.hex()
        assert lightwork.get(probe.group.remote(), timeout=30) == in_it
        assert lightwork.get(probe.task_group.remote(), timeout=30) == in_it
        assert lightwork.get(probe.child_actor_group.remote(), timeout=30) == in_it
        plain = GroupProbe.options(scheduling_strategy=in_group(group)).remote()
        assert lightwork.get(plain.group.remote(), timeout=30) == in_it
        assert lightwork.get(plain.task_group.remote(), timeout=30) is None  # no capture
    finally:
        remove_placement_group(group)


def test_actors_run_in_a_group(runtime):
    @lightwork.remote(num_cpus=1)
    class Counter:
        def __init__(self):
            self.count = 0

        def add(self):
            self.count += 1
            return self.count

    group = placement_group([{"CPU": 1}])
    try:
        counter = Counter.options(scheduling_strategy=in_group(group, 0)).remote()
        assert lightwork.get([counter.add.remote() for _ in range(3)], timeout=30) == [1, 2, 3]
    finally:
        remove_placement_group(group)


@pytest.mark.lightwork_only
def test_removal_kills_its_actors_and_fails_its_waiting_tasks(runtime, tmp_path):
    """lightwork-only: the error wording."""
    @lightwork.remote
    class Echo:
        def echo(self, value):
            return value

    group = placement_group([{"CPU": 1}, {"CPU": 1}])
    assert group.wait(30)
    gate = str(tmp_path / "gate")
    running = gated.options(scheduling_strategy=in_group(group, 0)).remote(gate)
    waiting = gated.options(scheduling_strategy=in_group(group, 0)).remote(gate)
    actor = Echo.options(scheduling_strategy=in_group(group, 1)).remote()
    assert lightwork.get(actor.echo.remote(1), timeout=30) == 1
    remove_placement_group(group)
    with pytest.raises(lightwork.exceptions.TaskPlacementGroupRemoved, match="removed"):
        lightwork.get(waiting, timeout=30)
    with pytest.raises(lightwork.exceptions.ActorDiedError, match="placement group was removed"):
        lightwork.get(actor.echo.remote(2), timeout=30)
    open(gate, "w").close()
    assert isinstance(lightwork.get(running, timeout=30), int)  # running tasks finish
    with pytest.raises(lightwork.exceptions.TaskPlacementGroupRemoved, match="was removed"):
        gated.options(scheduling_strategy=in_group(group)).remote(gate)


@pytest.mark.lightwork_only
@pytest.mark.parametrize("bundles, strategy, message", [
    ([{"CPU": 1}, {"CPU": 1}], "STRICT_SPREAD", "STRICT_SPREAD puts each of its 2 bundles"),
    ([{"CPU": 16}], "PACK", "bundle 0 .* needs 16 CPU but the runtime has 2"),
    ([{"CPU": 2}, {"CPU": 2}], "PACK", "together can never be reserved"),
])
def test_impossible_groups_fail_fast(runtime, bundles, strategy, message):
    """lightwork-only: Ray leaves such groups pending forever on one node."""
    with pytest.raises(ValueError, match=message):
        placement_group(bundles, strategy=strategy)


@pytest.mark.lightwork_only
def test_a_call_larger_than_its_bundle_fails_at_remote(runtime):
    """lightwork-only: Ray leaves such a task pending forever."""
    group = placement_group([{"CPU": 1}])
    try:
        with pytest.raises(ValueError, match="reserves less"):
            current_group.options(num_cpus=2, scheduling_strategy=in_group(group)).remote()
    finally:
        remove_placement_group(group)


@pytest.mark.lightwork_only
def test_bad_arguments_are_refused(runtime):
    with pytest.raises(ValueError, match="non-empty list"):
        placement_group([])
    with pytest.raises(ValueError, match="reserves nothing"):
        placement_group([{}])
    with pytest.raises(ValueError, match="strategy must be one of"):
        placement_group([{"CPU": 1}], strategy="TIGHT")
    with pytest.raises(TypeError, match="dict"):
        placement_group(["CPU"])
    with pytest.raises(TypeError, match="PlacementGroup"):
        PlacementGroupSchedulingStrategy("not a group")
    group = placement_group([{"CPU": 1}])
    try:
        with pytest.raises(ValueError, match="out of range"):
            in_group(group, 1)
        with pytest.raises(ValueError, match="not one of Ray's strategies"):
            current_group.options(scheduling_strategy="NEAREST")
    finally:
        remove_placement_group(group)
    with pytest.raises(TypeError, match="PlacementGroup"):
        remove_placement_group("abc")
