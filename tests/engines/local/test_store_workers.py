"""Workers' own writes (results, puts, generator items) under the store's budget and
through its pool of recycled segments (``store.py``, ``worker_calls.SharedMemoryWriter``)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from tests.helpers import call_bounded, wait_until
from tests import support

import lightwork as ray
from lightwork.exceptions import ObjectStoreFullError

MB = 1_000_000


def _store():
    return support.store()


@ray.remote
def make(n: int, value: int):
    return np.full(n, value, dtype=np.uint8)


def _pool_some(count: int, size: int = 2 * MB) -> None:
    """Leave ``count`` freed segments of ``size`` bytes in the pool."""
    refs = [ray.put(np.full(size, 1, dtype=np.uint8)) for _ in range(count)]
    del refs
    gc.collect()
    wait_until(lambda: len(_store().free) >= count, message="segments pooled")


def _path_of(ref) -> str:
    return support.stored_path(ref)


def test_worker_results_and_puts_reuse_pooled_segments(fresh_runtime):
    ray.init(num_cpus=1, object_store_memory=64 * MB)

    @ray.remote
    def put_inside(n):
        return [ray.put(np.full(n, 4, dtype=np.uint8))]

    _pool_some(3)
    before = _store().recycled_count
    result = make.remote(2 * MB, 3)
    inner = ray.get(put_inside.remote(2 * MB))[0]
    assert ray.get(result).min() == 3 and ray.get(inner).max() == 4
    assert _store().recycled_count >= before + 2
    pooled_names = {os.path.basename(_path_of(result)), os.path.basename(_path_of(inner))}
    # The store's own names (s<n>), not the objects' ids: the pooled files were reused.
    assert all(name.startswith("s") for name in pooled_names), pooled_names
    assert not _store().reserved


def test_worker_writes_never_show_through_a_view_the_driver_holds(fresh_runtime):
    ray.init(num_cpus=2, object_store_memory=64 * MB)
    held = ray.get(make.remote(2 * MB, 7))
    ref = make.remote(2 * MB, 8)
    kept_in_driver = ray.get(ref)
    del ref
    gc.collect()
    before = _store().recycled_count
    for round_ in range(3):  # only workers write: they take every pooled segment
        refs = [make.remote(2 * MB, 100 + round_) for _ in range(6)]
        assert [int(a[0]) for a in ray.get(refs)] == [100 + round_] * 6
        del refs
        gc.collect()
    assert _store().recycled_count > before, "the workers' writes recycled nothing"
    assert held.min() == held.max() == 7
    assert kept_in_driver.min() == kept_in_driver.max() == 8


def test_worker_writes_never_show_through_a_view_another_worker_holds(fresh_runtime):
    ray.init(num_cpus=2, object_store_memory=64 * MB)

    @ray.remote
    class Keeper:
        def keep(self, array):
            self.array = array  # a view into the object's segment, kept past the call
            return int(array[0])

        def kept(self):
            return int(self.array.min()), int(self.array.max())

    keeper = Keeper.remote()
    ref = make.remote(2 * MB, 7)
    assert ray.get(keeper.keep.remote(ref)) == 7
    del ref
    gc.collect()
    before = _store().recycled_count
    for round_ in range(3):
        refs = [make.remote(2 * MB, 50 + round_) for _ in range(4)]
        assert [int(a[-1]) for a in ray.get(refs)] == [50 + round_] * 4
        del refs
        gc.collect()
    assert _store().recycled_count > before
    assert ray.get(keeper.kept.remote()) == (7, 7)


def test_worker_writes_are_counted_before_they_are_written(fresh_runtime):
    """The store's used bytes never pass the budget when a worker's result arrives: the
    spiller moved older objects out before the worker wrote (before, the worker wrote
    first and the spiller caught up after)."""
    ray.init(num_cpus=1, object_store_memory=16 * MB)
    objects = support.driver_node().objects
    seen: list[int] = []
    track = objects.track_segment

    def tracking(path, size, object_id):
        track(path, size, object_id)
        store = _store()
        seen.append(store.live_bytes + store.pooled_bytes)

    objects.track_segment = tracking
    olds = [ray.put(np.full(3 * MB, i, dtype=np.uint8)) for i in range(4)]  # 12 MB
    results = [make.remote(3 * MB, 10 + i) for i in range(4)]
    assert [int(ray.get(r)[0]) for r in results] == [10, 11, 12, 13]
    assert [int(ray.get(r)[0]) for r in olds] == [0, 1, 2, 3]  # spilled, then read back
    assert seen and max(seen) <= 16 * MB, seen
    assert _store().summary()["spilled_total"] >= 1
    assert _store().wanted == 0  # no write waits: the spiller is not asked for more


def test_worker_write_past_a_budget_of_objects_in_use_fails_fast(fresh_runtime):
    """Everything in memory is read (by the task itself): the worker's put raises
    ObjectStoreFullError inside the task, promptly (no deadlock), as a driver put does."""
    ray.init(num_cpus=1, object_store_memory=8 * MB)

    @ray.remote(max_retries=0)
    def hoard(count):
        held = []
        for i in range(count):  # each view keeps its object mapped, so unspillable
            ref = ray.put(np.full(2 * MB, i, dtype=np.uint8))
            held.append((ref, ray.get(ref)))
        return len(held)

    with pytest.raises(ObjectStoreFullError, match="in use"):
        call_bounded(lambda: ray.get(hoard.remote(6)), 20, "a worker put past the budget")
    wait_until(lambda: not _store().reserved and _store().live_bytes == 0, timeout=15,
               message="the failed task's objects freed")
    assert _store().wanted == 0
    assert ray.get(make.remote(2 * MB, 5))[0] == 5  # the store still works


def test_a_reservation_of_a_worker_that_dies_is_dropped(fresh_runtime):
    ray.init(num_cpus=1, object_store_memory=32 * MB)

    @ray.remote(max_retries=0)
    def reserve_and_die():
        me = support.current_worker()
        path, _ = me.room(4 * MB, f"{me.shm_dir}/dying")
        open(path, "wb").close()
        os._exit(1)

    with pytest.raises(ray.exceptions.WorkerCrashedError):
        ray.get(reserve_and_die.remote(), timeout=20)
    wait_until(lambda: not _store().reserved and _store().live_bytes == 0,
               message="the dead worker's reservation dropped")
    assert not [name for name in os.listdir(_store().shm_dir) if name == "dying"]


@ray.remote
def total(a) -> int:
    return int(a.sum())


def test_arguments_a_task_writes_for_its_children_are_counted(fresh_runtime, tmp_path):
    """A by-value argument that a task writes for a nested call goes through the store's
    room request like a result: it counts against the budget while the child runs (the
    pool is reused for it), and is given back when the child ends."""
    ray.init(num_cpus=2, object_store_memory=64 * MB)
    store = _store()
    gate = str(tmp_path / "child-may-end")

    @ray.remote
    def child(a, gate_path):
        import time

        deadline = time.monotonic() + 20
        while not os.path.exists(gate_path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return int(a.sum())

    @ray.remote
    def parent(gate_path):
        return ray.get(child.remote(np.ones(8 * MB, dtype=np.uint8), gate_path))

    ref = parent.remote(gate)
    # While the child waits, its argument's segment is live in the store, counted, and
    # no longer the parent's reservation: the submission took it over.
    wait_until(lambda: not store.reserved
               and any(s.capacity >= 8 * MB for s in list(store.live.values())),
               message="the child's argument segment counted as live")
    open(gate, "w").close()
    assert ray.get(ref, timeout=20) == 8 * MB
    wait_until(lambda: store.live_bytes == 0, message="the argument's segment given back")


def test_a_childs_argument_past_the_budget_fails_in_the_parent(fresh_runtime):
    """An argument bigger than the whole budget is refused when the parent writes it
    (ObjectStoreFullError in the parent, as for a driver's by-value argument), instead
    of being written past the budget."""
    ray.init(num_cpus=1, object_store_memory=16 * MB)

    @ray.remote(max_retries=0)
    def parent():
        try:
            total.remote(np.ones(24 * MB, dtype=np.uint8))
        except ObjectStoreFullError as error:
            return f"refused: {error}"
        return "written"

    answer = call_bounded(lambda: ray.get(parent.remote()), 20, "a child's argument past the budget")
    assert answer.startswith("refused"), answer
    assert _store().live_bytes == 0 and not _store().reserved
