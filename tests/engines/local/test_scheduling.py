"""Scheduling respects num_cpus, fractional CPUs and custom resources; resources are
reported and accounted; a request that can never fit fails at submission.

Runs on its own small runtime (2 CPUs, one "widget") so limits are easy to reach.
Exclusion is checked structurally: each task marks itself running in a directory and
records whether it ever saw another task running at the same time.
"""

from __future__ import annotations

import glob
import os
import time

import pytest

import lightwork as ray
from tests.helpers import arrive_and_wait, wait_for_file, wait_until


@pytest.fixture(scope="module", autouse=True)
def small_runtime():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, resources={"widget": 1})
    yield
    ray.shutdown()


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


def test_cluster_resources_report_init_arguments():
    resources = ray.cluster_resources()
    assert resources["CPU"] == pytest.approx(2)
    assert resources["widget"] == pytest.approx(1)
    assert resources.get("GPU", 0) == 0


def test_two_cpu_tasks_never_overlap_on_two_cpus(tmp_path):
    task = ray.remote(num_cpus=2)(overlapped)
    assert ray.get([task.remote(str(tmp_path)) for _ in range(3)], timeout=30) == [False] * 3


def test_one_cpu_tasks_overlap_on_two_cpus(tmp_path):
    task = ray.remote(arrive_and_wait)
    assert ray.get([task.remote(str(tmp_path), str(i), 2) for i in range(2)], timeout=30) == [
        True,
        True,
    ]


def test_fractional_cpus_pack_several_tasks_per_cpu(tmp_path):
    task = ray.remote(num_cpus=0.5)(arrive_and_wait)
    refs = [task.remote(str(tmp_path), str(i), 4) for i in range(4)]
    assert ray.get(refs, timeout=30) == [True] * 4


def test_custom_resource_limits_concurrency(tmp_path):
    task = ray.remote(num_cpus=0, resources={"widget": 1})(overlapped)
    assert ray.get([task.remote(str(tmp_path)) for _ in range(3)], timeout=30) == [False] * 3


def test_available_resources_drop_while_a_task_holds_them(tmp_path):
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


def test_infeasible_cpu_request_fails_at_submission():
    """Spec (issue 2): a clear error instead of a hang. Ray only warns and leaves the
    task pending, so this fails against Ray."""

    @ray.remote(num_cpus=64)
    def greedy():
        return 1

    with pytest.raises(ValueError, match="CPU"):
        greedy.remote()


def test_infeasible_custom_resource_fails_at_submission():
    """Spec (issue 2): fails against Ray (Ray leaves infeasible tasks pending)."""

    @ray.remote
    def needs_gadget():
        return 1

    with pytest.raises(ValueError, match="gadget"):
        needs_gadget.options(resources={"gadget": 1}).remote()
    with pytest.raises(ValueError, match="widget"):
        needs_gadget.options(resources={"widget": 5}).remote()


def test_gpu_request_without_gpus_fails_at_submission():
    """Spec (issue 2): fails against Ray (Ray leaves infeasible tasks pending)."""

    @ray.remote(num_gpus=1)
    def needs_gpu():
        return 1

    with pytest.raises(ValueError, match="GPU"):
        needs_gpu.remote()


def test_runtime_still_schedules_after_infeasible_requests():
    @ray.remote
    def ok():
        return "ok"

    assert ray.get(ok.remote(), timeout=10) == "ok"


@pytest.mark.parametrize("bad", [-1, -0.5])
def test_negative_num_cpus_is_valueerror(bad):
    def f():
        return 1

    with pytest.raises(ValueError, match="num_cpus"):
        ray.remote(num_cpus=bad)(f).remote()
    with pytest.raises(ValueError, match="num_cpus"):
        ray.remote(f).options(num_cpus=bad).remote()


def test_non_numeric_num_cpus_is_valueerror():
    """Spec (issue 2) asks for ValueError; Ray raises TypeError, so this fails against Ray."""

    def f():
        return 1

    with pytest.raises(ValueError, match="num_cpus"):
        ray.remote(num_cpus="two")(f).remote()


def test_negative_custom_resource_is_valueerror():
    def f():
        return 1

    with pytest.raises(ValueError):
        ray.remote(resources={"widget": -1})(f).remote()


def test_nested_gets_do_not_deadlock_with_more_parents_than_cpus():
    @ray.remote
    def child(i):
        return -i

    @ray.remote
    def parent(i):
        return ray.get(child.remote(i))

    # 8 parents on 2 CPUs: each blocked parent must lend its slot to a child.
    assert ray.get([parent.remote(i) for i in range(8)], timeout=40) == [-i for i in range(8)]


def test_crashed_task_releases_its_resources():
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
