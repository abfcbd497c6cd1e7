"""The state API: tasks in Ray's states, actors, workers, objects and their summaries.

States are reached structurally (gate files, resource requests that cannot fit yet),
never by timing.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests import helpers, support
import lightwork
from lightwork import state
from lightwork.kernel import views  # the state API's views (their percentile helper)

pytestmark = pytest.mark.lightwork_only


@pytest.fixture(scope="module")
def runtime(two_cpus):
    yield


def _by_id(rows):
    return {row["task_id"]: row for row in rows}


def test_live_and_ended_task_states(runtime, tmp_path):
    gate = str(tmp_path / "gate")

    @lightwork.remote
    def blocked(path):
        return helpers.wait_for_file(path)

    @lightwork.remote
    def after(value):
        return value

    @lightwork.remote
    def nested(path):
        return lightwork.get(blocked.remote(path))

    @lightwork.remote
    def broken():
        raise KeyError("x")

    first = blocked.remote(gate)
    waiting = after.remote(first)
    outer = nested.remote(gate)
    big = blocked.options(num_cpus=2).remote(gate)  # cannot fit while the others run
    ids = {support.driver_node().task_id_of(r.id): r for r in (first, waiting, outer, big)}

    def states():
        rows = _by_id(state.list_tasks(limit=None))
        return {tid: rows[tid]["state"] for tid in ids}

    expected = {"RUNNING", "PENDING_ARGS_AVAIL", "RUNNING_IN_RAY_GET", "PENDING_NODE_ASSIGNMENT"}
    helpers.wait_until(lambda: set(states().values()) == expected, message=str(states))
    running = state.list_tasks(state="RUNNING")
    assert all(row["state"] == "RUNNING" for row in running) and running[0]["pid"]
    open(gate, "w").close()
    assert lightwork.get([first, waiting, outer, big]) == [True, True, True, True]
    with pytest.raises(KeyError):
        lightwork.get(broken.remote())
    rows = _by_id(state.list_tasks(limit=None))
    assert {rows[tid]["state"] for tid in ids} == {"FINISHED"}
    [failed] = state.list_tasks(name="broken", state="FAILED")
    assert "KeyError" in failed["error"] and failed["type"] == "NORMAL_TASK"
    assert failed["worker_id"] and failed["pid"] and failed["run_s"] is not None


def test_a_task_blocked_in_a_nested_wait_is_running_in_ray_wait(runtime, tmp_path):
    gate = str(tmp_path / "gate")

    @lightwork.remote
    def blocked(path):
        return helpers.wait_for_file(path)

    @lightwork.remote
    def waits(path):
        ready, _ = lightwork.wait([blocked.remote(path)], timeout=30)
        return len(ready)

    ref = waits.remote(gate)
    task_id = support.driver_node().task_id_of(ref.id)

    def state_of():
        return _by_id(state.list_tasks(limit=None)).get(task_id, {}).get("state")

    helpers.wait_until(lambda: state_of() == "RUNNING_IN_RAY_WAIT", message="nested wait")
    open(gate, "w").close()
    assert lightwork.get(ref) == 1


def test_filters_limits_and_bad_filters(runtime):
    @lightwork.remote
    def ping(i):
        return i

    lightwork.get([ping.remote(i) for i in range(5)])
    assert len(state.list_tasks(name="ping")) >= 5
    assert len(state.list_tasks(name="*pi*", limit=2)) == 2
    assert all(r["name"].endswith("ping") for r in state.list_tasks(filters=["name=ping"]))
    others = state.list_tasks(filters=[("name", "!=", "ping")], limit=None)
    assert all(not r["name"].endswith("ping") for r in others)
    assert state.list_tasks(filters={"state": "finished"}, name="ping")  # case-insensitive
    with pytest.raises(ValueError, match="unknown filter key 'colour'.*valid keys: task_id"):
        state.list_tasks(colour="red")
    with pytest.raises(ValueError, match="operator"):
        state.list_tasks(filters=[("state", ">", "x")])
    with pytest.raises(ValueError, match="key=value"):
        state.list_tasks(filters=["no-operator"])
    with pytest.raises(ValueError, match="limit"):
        state.list_tasks(limit=0)


def test_rays_func_or_class_name_key_filters_tasks_and_actor_calls(runtime):
    @lightwork.remote
    class Counter:
        def bump(self):
            return 1

    @lightwork.remote
    def lone():
        return 0

    counter = Counter.remote()
    lightwork.get([counter.bump.remote(), lone.remote()])
    calls = state.list_tasks(filters=[("func_or_class_name", "=", "Counter.bump")])
    assert [r["func_or_class_name"].split(".<locals>.")[-1] for r in calls] == ["Counter.bump"]
    assert [r["type"] for r in state.list_tasks(func_or_class_name="lone")] == ["NORMAL_TASK"]
    assert not state.list_tasks(func_or_class_name="Counter.nothing")


def test_actors_and_workers(runtime):
    @lightwork.remote
    class Keeper:
        def pid(self):
            return os.getpid()

    keeper = Keeper.options(name="keeper").remote()
    pid = lightwork.get(keeper.pid.remote())
    [row] = state.list_actors(name="keeper")
    assert row["class_name"].endswith("Keeper") and row["state"] == "ALIVE"
    assert row["pid"] == pid and row["calls_done"] == 1
    [call] = [t for t in state.list_tasks(limit=None) if t["name"].endswith("Keeper.pid")]
    assert call["type"] == "ACTOR_TASK" and call["state"] == "FINISHED"
    assert call["actor_id"] == row["actor_id"]  # an ended call still names its actor
    workers = state.list_workers(limit=None)
    assert workers[0]["kind"] == "driver" and workers[0]["pid"] == os.getpid()
    [actor_worker] = state.list_workers(kind="actor", pid=pid)
    assert actor_worker["actor_class"].endswith("Keeper") and actor_worker["state"] == "IDLE"
    assert state.list_workers(kind="task")
    lightwork.kill(keeper)
    helpers.wait_until(lambda: state.list_actors(name="keeper", state="DEAD"))
    [dead] = state.list_actors(name="keeper")
    assert "kill" in dead["death_cause"]


def test_objects_by_reference_kind_and_memory_summary(runtime, tmp_path):
    gate = str(tmp_path / "gate")

    @lightwork.remote
    def hold(value, path):
        return helpers.wait_for_file(path)

    array = lightwork.put(np.ones(200_000))  # 1.6 MB: shared memory
    view = lightwork.get(array)  # zero-copy: the driver maps the segment
    small = lightwork.put(1)
    outer = lightwork.put([small])  # small is captured in outer
    used = lightwork.put("arg")
    pending = hold.remote(used, gate)
    rows = {row["object_id"]: row for row in state.list_objects(limit=None)}
    big = rows[array.hex()]
    assert big["location"] == "shared memory" and big["size"] >= 1_600_000
    assert "PINNED_IN_MEMORY" in big["reference_kinds"] and big["owner"] == "driver"
    assert "CAPTURED_IN_OBJECT" in rows[small.hex()]["reference_kinds"]
    assert rows[used.hex()]["reference_kind"] == "USED_BY_PENDING_TASK"
    assert rows[outer.hex()]["reference_kind"] == "LOCAL_REFERENCE"
    assert rows[pending.hex()]["state"] == "PENDING" and rows[pending.hex()]["task_name"].endswith("hold")
    assert state.list_objects(limit=1)[0]["size"] >= big["size"]  # largest first
    assert state.list_objects(reference_kinds="CAPTURED_IN_OBJECT")
    summary = state.memory_summary()
    assert summary["shared_memory_bytes"] >= 1_600_000 and summary["objects"] >= 5
    kinds = {k["kind"] for k in summary["by_reference_kind"]}
    assert {"PINNED_IN_MEMORY", "USED_BY_PENDING_TASK", "LOCAL_REFERENCE"} <= kinds
    assert summary["largest"][0]["object_id"] == big["object_id"]
    open(gate, "w").close()
    assert lightwork.get(pending) is True
    del view


def test_summarize_tasks(runtime):
    @lightwork.remote
    def unit(i):
        return i

    lightwork.get([unit.remote(i) for i in range(20)])
    summary = state.summarize_tasks()
    [row] = [f for f in summary["functions"] if f["name"].endswith("unit")]
    assert row["count"] == 20 and row["state_counts"] == {"FINISHED": 20}
    assert row["p50_run_s"] <= row["p95_run_s"] <= row["max_run_s"]
    assert row["mean_run_s"] is not None and row["total_queued_s"] >= 0
    assert summary["total_tasks"] >= 20 and summary["dropped_records"] == 0


def test_status(runtime):
    s = state.status()
    assert s["resources"]["total"]["CPU"] == 2 and s["driver_pid"] == os.getpid()
    assert s["worker_count"] >= 2 and s["event_log"]["budget"] > 0


def test_state_from_inside_a_task_goes_through_the_control_socket(runtime):
    @lightwork.remote
    def look():
        from lightwork import state as inner

        return [row["name"] for row in inner.list_tasks(state="RUNNING")]

    assert any(name.endswith("look") for name in lightwork.get(look.remote()))


def test_no_runtime(fresh_runtime):
    with pytest.raises(RuntimeError, match="lightwork.init"):
        state.list_tasks()


def test_percentile_and_parse_filters_units():
    assert views._percentile([], 0.5) is None
    assert views._percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert views._percentile([float(i) for i in range(1, 101)], 0.95) == 95.0
    assert views.parse_filters(["a!=b", "c = d"]) == [("a", "!=", "b"), ("c", "=", "d")]
    assert views.parse_filters({"state": "RUNNING"}) == [("state", "=", "RUNNING")]
    rows = [{"task_id": 1, "name": "x", "retries": 0, "error": None}]
    assert views.filter_rows("tasks", rows, [("error", "=", "none")])[1] == 1
    assert views.filter_rows("tasks", rows, [("task_id", "=", "1.0")])[1] == 1
    assert views.filter_rows("tasks", rows, [("task_id", "=", "one")])[1] == 0


def test_a_task_whose_worker_is_still_starting_is_not_yet_running():
    # The frame waits in the socket of a worker the fork server has not reported yet:
    # there is no process to run it (nor to dump its stack), so it is not RUNNING.
    from collections import deque
    from types import SimpleNamespace

    from lightwork.engines.local.scheduler import WorkerSlot

    task = SimpleNamespace(state="SUBMITTED_TO_WORKER", actor_id=0)
    task.worker = WorkerSlot(7, inflight=deque([task]))
    starting = SimpleNamespace(workers={7: SimpleNamespace(pid=0)})
    started = SimpleNamespace(workers={7: SimpleNamespace(pid=4242)})
    assert views.live_task_state(starting, task) == "SUBMITTED_TO_WORKER"
    assert views.live_task_state(started, task) == "RUNNING"
    task.worker.blocked, task.worker.blocked_in = 1, "get"
    assert views.live_task_state(started, task) == "RUNNING_IN_RAY_GET"


def test_placement_groups_by_id_and_state(runtime):
    from lightwork.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 1}], strategy="SPREAD")
    assert group.wait(10)
    row = state.get_placement_group(group.id.hex())
    assert (row.state, row.strategy, row.bundles) == ("CREATED", "SPREAD", {0: {"CPU": 1.0}})
    remove_placement_group(group)
    [removed] = [r for r in state.list_placement_groups(state="REMOVED")
                 if r.placement_group_id == group.id.hex()]
    assert removed.state == "REMOVED"
    assert state.get_placement_group("0" * 16 + "ff") is None


def test_an_integer_filter_is_exact_for_64_bit_ids():
    """Two task ids 1 apart near 2**62 are one float: a filter must still tell them apart."""
    rows = [{"task_id": 6075748422973915202}, {"task_id": 6075748422973915203}]
    for wanted in (6075748422973915203, "6075748422973915203"):
        matched, _ = views.filter_rows("tasks", rows, [("task_id", "=", wanted)], None)
        assert matched == [rows[1]]
    matched, _ = views.filter_rows("tasks", [{"task_id": 2}], [("task_id", "=", "2.0")], None)
    assert matched == [{"task_id": 2}]
