"""The object store's shared memory: recycled segments never change a value a reader holds."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from tests.helpers import arrive_and_wait
from tests import support

import lightwork as ray
from lightwork.kernel import serialization  # the segments the store recycles: its subject

MB = 1_000_000


@pytest.fixture(autouse=True)
def runtime(two_cpus):
    yield


def _store():
    return support.store()


def _churn(fill: int, count: int = 12, size: int = 2 * MB) -> None:
    """Write ``count`` large objects at once (so every pooled segment is taken), in the
    driver and in workers, read them, and free them."""

    @ray.remote
    def make(n, value):
        return np.full(n, value, dtype=np.uint8)

    @ray.remote
    def first(a):
        return int(a[0])

    for _ in range(2):
        refs = [ray.put(np.full(size, fill, dtype=np.uint8)) for _ in range(count)]
        refs += [make.remote(size, fill) for _ in range(count // 2)]
        assert ray.get([first.remote(ref) for ref in refs]) == [fill] * len(refs)
        by_value = [first.remote(np.full(size, fill, dtype=np.uint8)) for _ in range(count)]
        assert ray.get(by_value) == [fill] * count
        del refs, by_value
        gc.collect()


def test_freed_segments_are_reused():
    before = _store().recycled_count
    _churn(3, count=4)
    assert _store().recycled_count > before, "no segment was recycled"


def test_a_large_value_written_into_a_pooled_segment_is_bit_exact():
    """From 16 MB the driver copies a buffer in two halves on two threads."""
    size = serialization._SPLIT_COPY_MIN + 4097  # halves that are not a page multiple
    rng = np.random.default_rng(5)
    ray.put(rng.integers(0, 256, size + 8192, dtype=np.uint8))  # freed: its segment is pooled
    gc.collect()
    before = _store().recycled_count
    value = rng.integers(0, 256, size, dtype=np.uint8)
    ref = ray.put(value)
    assert _store().recycled_count > before, "the put did not take the pooled segment"
    assert np.array_equal(ray.get(ref), value)


def test_view_held_in_driver_survives_reuse():
    ref = ray.put(np.full(2 * MB, 7, dtype=np.uint8))
    held = ray.get(ref)
    path = support.stored_path(ref)
    del ref
    gc.collect()
    before = _store().recycled_count
    _churn(9)
    assert _store().recycled_count > before
    assert path not in [segment.path for segment in _store().free]
    assert held.min() == held.max() == 7
    assert not held.flags.writeable


def test_task_result_view_held_in_driver_survives_reuse():
    @ray.remote
    def make():
        return np.full(2 * MB, 5, dtype=np.uint8)

    ref = make.remote()
    held = ray.get(ref)
    del ref
    gc.collect()
    _churn(9)
    assert held.min() == held.max() == 5


def test_view_held_in_actor_survives_reuse():
    @ray.remote
    class Keeper:
        def keep(self, array):
            self.array = array  # a view into the argument's segment, kept past the call
            return int(array[0])

        def look(self, array):
            return int(array[0])

        def kept(self):
            return int(self.array.min()), int(self.array.max())

    keeper = Keeper.remote()
    assert ray.get(keeper.keep.remote(np.full(2 * MB, 7, dtype=np.uint8))) == 7
    for _ in range(8):  # by-value arguments the actor reads and lets go: these recycle
        assert ray.get(keeper.look.remote(np.full(2 * MB, 9, dtype=np.uint8))) == 9
    _churn(9)
    assert ray.get(keeper.kept.remote()) == (7, 7)


def test_view_held_in_task_worker_survives_reuse(tmp_path):
    @ray.remote
    def keep(array):
        import sys

        sys.lightwork_test_kept = array  # stays in the worker process after the task
        return int(array[0])

    @ray.remote
    def kept(directory, name):
        import sys

        # Both workers at once (a barrier), so one of them is the worker that kept it:
        # which worker takes a lone task is the scheduler's business.
        assert arrive_and_wait(directory, name, 2)
        value = getattr(sys, "lightwork_test_kept", None)
        return None if value is None else (int(value.min()), int(value.max()))

    assert ray.get(keep.remote(np.full(2 * MB, 7, dtype=np.uint8))) == 7
    _churn(9)
    seen = set(ray.get([kept.remote(str(tmp_path), name) for name in ("a", "b")])) - {None}
    assert seen == {(7, 7)}


def test_mapping_table_reports_closing_only_unviewed():
    segments = serialization.MappedSegments()
    ref = ray.put(np.full(2 * MB, 1, dtype=np.uint8))
    path = support.stored_path(ref)
    data, buffers = segments.parts(path)
    view = np.frombuffer(buffers[0], dtype=np.uint8)
    del data, buffers
    assert segments.release_unused() == []
    assert path in segments
    del view
    assert segments.release_unused() == [path]
    assert path not in segments


def test_a_reader_sent_the_old_path_finds_the_spill_file(tmp_path):
    """The spiller moved a segment while a reader was on its way to it: the reader opens
    the spill file of the same name (the race the spiller leaves open on purpose)."""
    shm, disk = tmp_path / "shm", tmp_path / "disk"
    shm.mkdir()
    disk.mkdir()
    stored = serialization.serialize(np.arange(100_000), str(shm / "s1"))
    assert stored.path == str(shm / "s1")
    os.rename(stored.path, disk / "s1")  # what the spiller's copy-then-unlink leaves
    maps = serialization.MappedSegments()
    maps.spill_dir = str(disk)
    old = serialization.MAPS
    serialization.MAPS = maps
    try:
        value = serialization.loads(stored)
        assert int(value.sum()) == sum(range(100_000))
        maps.spill_dir = None
        del value
        maps.clear()
        with pytest.raises(FileNotFoundError):
            serialization.loads(stored)
    finally:
        serialization.MAPS = old


def test_an_idle_pool_gives_its_memory_back(monkeypatch):
    from tests.helpers import wait_until

    store = _store()
    monkeypatch.setattr(store, "pool_idle_s", 0.3)
    refs = [ray.put(np.full(2 * MB, 1, dtype=np.uint8)) for _ in range(3)]
    paths = [support.stored_path(ref) for ref in refs]
    del refs
    gc.collect()
    wait_until(lambda: store.pooled_bytes > 0, message="freed segments pooled")
    # Nothing writes now: after the idle time the pool is empty and its files are gone
    # (the spill thread empties the pool, then unlinks each file: wait for both; reading
    # the pool empty, then the files, raced the last unlink, seen once).
    wait_until(lambda: store.pooled_bytes == 0 and not store.free
               and not [path for path in paths if os.path.exists(path)], timeout=10,
               message="the idle pool trimmed and its files unlinked")
    # A busy pool is kept: a segment reused within the idle time is not trimmed.
    monkeypatch.setattr(store, "pool_idle_s", 60.0)
    ref = ray.put(np.full(2 * MB, 2, dtype=np.uint8))
    del ref
    gc.collect()
    wait_until(lambda: store.pooled_bytes > 0, message="the segment pooled again")
    import time

    time.sleep(0.6)  # twice the idle time that emptied the pool above
    assert store.pooled_bytes > 0, "a segment idle for less than pool_idle_s was trimmed"
