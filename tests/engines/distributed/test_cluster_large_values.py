"""Large arguments on a real Dask cluster: their buffers go straight to a worker.

A task's arguments whose out-of-band buffers (numpy arrays) reach ``SCATTER_MIN`` are
not sent with the task through the scheduler: one copy of those buffers is scattered
to a worker, and the task depends on that key. These tests read the scheduler's own
tables to see which way a value went, and check what must hold either way: the values
arrive intact (arrays in containers, next to refs and keyword arguments), as they were
when passed, and a task whose scattered value was lost with its worker runs again
unless the program cancelled it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from tests import support
from tests import helpers
from tests.helpers import wait_for_file

import lightwork
from lightwork import exceptions

pytestmark = pytest.mark.lightwork_only
np = pytest.importorskip("numpy")
pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")

from lightwork.engines.distributed.replies import PUSH_MAX  # noqa: E402
from lightwork.engines.distributed.tasks import SCATTER_MIN  # noqa: E402


def _dependencies(key):
    """The scheduler's (key, nbytes) of each dependency of task ``key``, once the
    scheduler has the task (a submission travels on the client's batched stream)."""
    def read(dask_scheduler, key=key):
        task = dask_scheduler.tasks.get(key)
        return sorted((str(d.key), d.nbytes) for d in task.dependencies) if task else None

    def known():
        dependencies = support.cluster_client().run_on_scheduler(read)
        return None if dependencies is None else [dependencies]

    return helpers.wait_until(known, timeout=10, message=f"the scheduler to have {key}")[0]


def _key(ref):
    return support.backend().future_of(ref.id).key


@lightwork.remote
def describe(arrays, scale, *, offset=0):
    return {name: float(a.sum()) * scale + offset for name, a in arrays.items()}


@lightwork.remote
def writeable(array):
    return array.flags.writeable


@lightwork.remote
def hold_until(gate, array):
    wait_for_file(gate, 30)
    return float(array.sum())


def test_a_large_argument_goes_to_a_worker_on_its_own(cluster, tmp_path):
    big = np.arange(SCATTER_MIN // 8 + 1024, dtype=np.float64)
    gate = str(tmp_path / "gate")
    ref = hold_until.remote(gate, big)
    [(key, nbytes)] = _dependencies(_key(ref))
    assert nbytes >= big.nbytes  # the one scattered copy the task waits on
    open(gate, "w").close()
    assert lightwork.get(ref, timeout=30) == float(big.sum())


def test_a_small_argument_travels_with_its_task(cluster, tmp_path):
    small = np.arange(1000, dtype=np.float64)
    gate = str(tmp_path / "gate")
    ref = hold_until.remote(gate, small)
    assert _dependencies(_key(ref)) == []
    open(gate, "w").close()
    assert lightwork.get(ref, timeout=30) == float(small.sum())


def test_arrays_in_a_container_next_to_refs_and_keywords_arrive_intact(cluster):
    arrays = {"a": np.arange(SCATTER_MIN // 8, dtype=np.float64),
              "b": np.ones((300, 301), dtype=np.int32),  # an odd size: the next is realigned
              "c": np.full(SCATTER_MIN // 4, 3, dtype=np.int16)}
    scale = lightwork.put(2.0)
    got = lightwork.get(describe.remote(arrays, scale, offset=lightwork.put(1.0)), timeout=30)
    assert got == {name: float(a.sum()) * 2.0 + 1.0 for name, a in arrays.items()}


def test_a_large_argument_is_read_only_as_in_ray_and_a_small_one_is_not(cluster):
    assert lightwork.get(writeable.remote(np.ones(SCATTER_MIN // 8 * 2))) is False
    assert lightwork.get(writeable.remote(np.ones(100))) is True


def test_the_task_sees_the_array_as_it_was_passed(cluster, tmp_path):
    array = np.ones(SCATTER_MIN // 8 * 2)
    gate = str(tmp_path / "gate")
    ref = hold_until.remote(gate, array)
    array[:] = 5.0  # after the call: the task's copy is the value at the call
    open(gate, "w").close()
    assert lightwork.get(ref, timeout=30) == float(len(array))


@lightwork.remote
def pid_and_sum(array):
    return os.getpid(), float(array.sum())


@lightwork.remote
def pid_and_sum_kept_on_the_worker(array):
    # (beyond the size a worker sends its driver: the result lives on the worker alone)
    return os.getpid(), float(array.sum()), bytes(PUSH_MAX + 1)


def _kill_and_wait_for_the_loss(pid, wait_until):
    client = support.cluster_client()
    before = set(client.scheduler_info()["workers"])
    os.kill(pid, signal.SIGKILL)

    def gone():
        workers = client.scheduler_info()["workers"]
        return all(w.get("pid") != pid for w in workers.values()) or None

    wait_until(gone, timeout=30, message="the scheduler to see the worker gone")
    return before


def test_a_result_lost_with_the_worker_that_held_its_scattered_argument_is_computed_again(
        cluster, wait_until):
    array = np.arange(SCATTER_MIN // 8 * 2, dtype=np.float64)
    ref = pid_and_sum_kept_on_the_worker.options(max_retries=0).remote(array)
    pid, total, _ = lightwork.get(ref, timeout=30)
    # The result and the argument's only copy were on that worker: the scheduler forgets
    # the task (it cannot run it again), and lightwork submits it again from its copy.
    _kill_and_wait_for_the_loss(pid, wait_until)
    again, total_again, _ = lightwork.get(ref, timeout=60)
    assert (again != pid, total_again) == (True, total)
    assert lightwork.wait([ref], timeout=10) == ([ref], [])


def test_a_cancelled_task_with_a_large_argument_stays_cancelled(cluster, tmp_path):
    gate = str(tmp_path / "gate")
    ref = hold_until.remote(gate, np.ones(SCATTER_MIN // 8 * 2))
    time.sleep(0.2)
    lightwork.cancel(ref)
    try:
        with pytest.raises(exceptions.TaskCancelledError):
            lightwork.get(ref, timeout=30)
        assert lightwork.wait([ref], timeout=5) == ([ref], [])
    finally:
        open(gate, "w").close()


@lightwork.remote
def sum_in_a_child(length):
    # (a task's own submission: the block stays with this worker, which may run the child
    # or hand the block on to the other one)
    return lightwork.get(pid_and_sum.remote(np.ones(length)), timeout=30)[1]


def test_a_task_passes_a_large_argument_to_its_child(cluster):
    length = SCATTER_MIN // 8 * 2
    assert lightwork.get(sum_in_a_child.remote(length), timeout=60) == float(length)


@lightwork.remote
class Keeper:
    def describe(self, arrays, *, scale=1.0):
        return {name: (float(a.sum()) * scale, a.flags.writeable) for name, a in arrays.items()}


def test_an_actor_call_takes_large_arrays_as_they_were_passed(cluster):
    keeper = Keeper.remote()
    large = np.arange(SCATTER_MIN // 8 * 2, dtype=np.float64)
    small = np.ones(4)
    expected = float(large.sum())
    ref = keeper.describe.remote({"large": large, "small": small}, scale=2.0)
    large[:] = 0  # after the call: it has its copy of the value as it was
    # Its large buffer came as a frame of its own, viewed read-only (as a task's does).
    assert lightwork.get(ref, timeout=30) == {"large": (expected * 2, False),
                                              "small": (8.0, True)}
