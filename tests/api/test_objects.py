"""Objects and references: put/get, ObjectRef behaviour, wait, timeouts, futures,
asyncio, large arrays in shared memory."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import glob
import os
import pickle
import time

import cloudpickle
import numpy as np
import pytest

import lightwork as ray
from tests.helpers import SHM_GLOB, wait_for_file
from tests import support

pytestmark = pytest.mark.usefixtures("ray_start")

gated = ray.remote(wait_for_file)


@pytest.fixture
def gate(tmp_path):
    """A gate file path; opened at teardown so no gated task outlives its test."""
    path = str(tmp_path / "gate")
    yield path
    open(path, "w").close()


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)


@pytest.mark.parametrize(
    "value",
    [None, 0, -1.5, "text", b"\x00bytes", [1, [2, [3]]], {"a": (1, 2), 3: None}, {1, 2}],
    ids=repr,
)
def test_put_get_roundtrip(value):
    assert ray.get(ray.put(value)) == value


def test_put_get_roundtrip_of_user_class_through_a_task():
    @ray.remote
    def move(p):
        return Point(p.x + 1, p.y)

    assert ray.get(move.remote(ray.put(Point(1, 2)))) == Point(2, 2)


def test_values_defined_in_main_and_lambdas_travel_by_value(monkeypatch):
    """The quick standard pickler would name ``__main__.Probe``, which the workers'
    ``__main__`` does not have; such values, and lambdas, go by value."""
    import sys

    probe = type("Probe", (), {"__eq__": lambda self, other: type(other).__name__ == "Probe",
                               "scale": lambda self, x: 3 * x})
    probe.__module__ = "__main__"
    monkeypatch.setattr(sys.modules["__main__"], "Probe", probe, raising=False)

    @ray.remote
    def use(obj):
        return type(obj).__name__, obj.scale(2)

    @ray.remote
    def call(fn):
        return fn(5)

    assert ray.get(use.remote(probe())) == ("Probe", 6)
    assert ray.get(use.remote(ray.put(probe()))) == ("Probe", 6)
    assert ray.get(call.remote(lambda x: x + 1)) == 6


def test_objectref_is_hashable_printable_and_distinct():
    a, b = ray.put(1), ray.put(1)
    assert a != b
    assert a == a and {a: "x"}[a] == "x"
    assert len({a, b, a}) == 2
    assert str(a) and repr(a)
    assert repr(a) != repr(b)


@pytest.mark.parametrize(
    "dumps,loads", [(pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)]
)
def test_objectref_pickle_roundtrip_while_alive(dumps, loads):
    ref = ray.put({"v": 7})
    copy = loads(dumps(ref))
    assert copy == ref and hash(copy) == hash(ref)
    assert ray.get(copy) == {"v": 7}


@ray.remote
def _seven():
    return 7


@pytest.mark.parametrize("make", [lambda: ray.put(7), lambda: _seven.remote()],
                         ids=["put", "task"])
def test_a_new_ref_and_its_copies_keep_the_object_until_the_last_is_gone(make):
    # A call's or put's ref is counted without the counter's lock (_object_ref.fresh_ref):
    # it must count as one, as any copy of it does.
    from lightwork import exceptions

    # (A copy made as the runtime makes one, from the id: a ref pickled by the program
    # would be kept until shutdown, as Ray keeps refs serialized out of band.)
    ref = make()
    copy = ray.ObjectRef(ref.id, _borrowed=True)
    del ref
    gc.collect()
    time.sleep(0.1)  # the release is applied at the runtime's next step
    assert ray.get(copy, timeout=10) == 7  # the copy alone keeps it
    orphan = copy.id
    del copy
    gc.collect()
    deadline = time.monotonic() + 10
    while True:  # then it is freed: a ref rebuilt from its id finds nothing
        try:
            ray.get(ray.ObjectRef(orphan, _borrowed=True), timeout=10)
        except exceptions.ReferenceCountingAssertionError:
            break
        assert time.monotonic() < deadline, "the object outlived its last ref"
        time.sleep(0.05)


@ray.remote
def _plus_one(x):
    return x + 1


@ray.remote
def _get_inside(refs):
    return ray.get(refs[0])


def test_a_plain_result_is_kept_as_its_bytes_and_read_like_any_value():
    # A plain task's small result is kept bare, outside the cycle collector (objects.py):
    # every reader still gets it, from the driver and from workers.
    ref = _seven.remote()
    assert ray.get(ref, timeout=10) == 7
    node = support.driver_node()
    with node.lock:
        entry = node.objects.entries[ref.id]
        kept = entry.serialized
        assert type(kept) is bytes and not gc.is_tracked(kept)
        assert entry.stored.path is None and entry.stored.size == len(kept) == entry.size
    assert ray.get(_plus_one.remote(ref), timeout=10) == 8  # an argument: sent to a worker
    assert ray.get(_get_inside.remote([ref]), timeout=10) == 7  # a worker's get of it
    assert ray.get([ref, ref], timeout=10) == [7, 7]


def test_get_list_with_duplicates_and_empty_list():
    a = ray.put("a")
    assert ray.get([a, a, ray.put("b")]) == ["a", "a", "b"]
    assert ray.get([]) == []


@pytest.mark.parametrize("bad", ["x", 1, [1], ["x"], None])
def test_get_rejects_non_refs(bad):
    with pytest.raises((TypeError, ValueError)):
        ray.get(bad)


@pytest.mark.parametrize("bad", ["x", [1], 3])
def test_wait_rejects_non_refs(bad):
    with pytest.raises((TypeError, ValueError)):
        ray.wait(bad)


def test_wait_rejects_duplicates():
    ref = ray.put(1)
    with pytest.raises(ValueError):
        ray.wait([ref, ref])


def test_wait_rejects_num_returns_larger_than_input():
    with pytest.raises(ValueError):
        ray.wait([ray.put(1)], num_returns=2)


def test_wait_returns_ready_and_not_ready_in_input_order(gate):
    slow1, slow2 = gated.remote(gate), gated.remote(gate)
    fast = [ray.put(i) for i in range(3)]
    refs = [slow1, fast[0], fast[1], slow2, fast[2]]
    ready, not_ready = ray.wait(refs, num_returns=3, timeout=10)
    assert ready == fast
    assert not_ready == [slow1, slow2]


def test_wait_default_returns_one(gate):
    refs = [gated.remote(gate), ray.put(1), ray.put(2)]
    ready, not_ready = ray.wait(refs)
    assert len(ready) == 1 and ready[0] in refs[1:]
    assert len(not_ready) == 2
    assert set(ready) | set(not_ready) == set(refs)


def test_wait_all_ready_keeps_order():
    refs = [ray.put(i) for i in range(6)]
    ready, not_ready = ray.wait(refs, num_returns=6)
    assert ready == refs and not_ready == []


def test_wait_timeout_zero_polls_without_blocking(gate):
    ref = gated.remote(gate)
    start = time.monotonic()
    assert ray.wait([ref], timeout=0) == ([], [ref])
    # Structural bound: had wait blocked, the gate (20 s limit) would not be the limit.
    assert time.monotonic() - start < 5


def test_wait_timeout_returns_partial_result(gate):
    ready_ref = ray.put("ready")
    slow = gated.remote(gate)
    ready, not_ready = ray.wait([slow, ready_ref], num_returns=2, timeout=0.3)
    assert ready == [ready_ref] and not_ready == [slow]


def test_wait_sees_task_completion(gate):
    ref = gated.remote(gate)
    assert ray.wait([ref], timeout=0)[0] == []
    open(gate, "w").close()
    ready, _ = ray.wait([ref], timeout=10)
    assert ready == [ref]


def test_wait_empty_list():
    assert ray.wait([]) == ([], [])


def test_get_timeout_raises_get_timeout_error(gate):
    ref = gated.remote(gate)
    start = time.monotonic()
    with pytest.raises(ray.exceptions.GetTimeoutError) as info:
        ray.get(ref, timeout=0.1)
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - start < 5
    with pytest.raises(TimeoutError):
        ray.get([ray.put(1), ref], timeout=0.1)
    # The task is unaffected by the timeout.
    open(gate, "w").close()
    assert ray.get(ref, timeout=10) is True


def test_get_timeout_zero_on_ready_object_returns_it():
    ref = ray.put(5)
    assert ray.get(ref, timeout=0) == 5


def test_objectref_future():
    @ray.remote
    def double(x):
        return 2 * x

    fut = double.remote(21).future()
    assert isinstance(fut, concurrent.futures.Future)
    assert fut.result(timeout=10) == 42
    futures = [double.remote(i).future() for i in range(4)]
    done, _ = concurrent.futures.wait(futures, timeout=10)
    assert len(done) == 4
    assert sorted(f.result() for f in futures) == [0, 2, 4, 6]


def test_objectref_future_carries_task_exception():
    @ray.remote
    def fail():
        raise KeyError("future-failure")

    fut = fail.remote().future()
    exc = fut.exception(timeout=10)
    assert isinstance(exc, KeyError)
    assert isinstance(exc, ray.exceptions.RayTaskError)


def test_objectref_is_awaitable_in_asyncio():
    @ray.remote
    def triple(x):
        return 3 * x

    async def main():
        one = await triple.remote(1)
        many = await asyncio.gather(*[triple.remote(i) for i in range(4)])
        wrapped = await asyncio.wait_for(asyncio.wrap_future(triple.remote(5).future()), 10)
        return one, many, wrapped

    assert asyncio.run(main()) == (3, [0, 3, 6, 9], 15)


def test_awaiting_a_failed_task_raises_in_asyncio():
    @ray.remote
    def fail():
        raise ValueError("async-failure")

    async def main():
        with pytest.raises(ValueError, match="async-failure"):
            await fail.remote()

    asyncio.run(main())


def test_large_numpy_array_roundtrip_is_read_only():
    array = np.arange(2_000_000, dtype=np.float64)  # 16 MB
    ref = ray.put(array)
    got = ray.get(ref)
    assert np.array_equal(got, array)
    assert got.flags.writeable is False
    with pytest.raises(ValueError):
        got[0] = 1.0
    # put copied the data: changing the original does not change the stored object.
    array[0] = -1
    assert ray.get(ref)[0] == 0


def test_large_numpy_array_returned_from_task_is_read_only():
    @ray.remote
    def make(n):
        return np.ones(n, dtype=np.int64)

    got = ray.get(make.remote(2_000_000))
    assert got.shape == (2_000_000,) and int(got.sum()) == 2_000_000
    assert got.flags.writeable is False


def test_large_numpy_argument_reaches_tasks_intact():
    array = np.random.default_rng(0).random(1_000_000)
    ref = ray.put(array)

    @ray.remote
    def stats(a):
        return float(a.sum()), a.shape, a.flags.writeable

    results = ray.get([stats.remote(ref) for _ in range(4)] + [stats.remote(array)])
    for total, shape, writeable in results:
        assert total == pytest.approx(array.sum()) and shape == array.shape
        assert writeable is False


def test_large_bytes_roundtrip():
    payload = os.urandom(8 * 1024 * 1024)

    @ray.remote
    def length(b):
        return len(b), b[:16]

    ref = ray.put(payload)
    assert ray.get(ref) == payload
    assert ray.get(length.remote(ref)) == (len(payload), payload[:16])


def test_large_array_inside_a_container():
    arrays = {"a": np.zeros((500, 1000)), "b": [np.full(300_000, 7, dtype=np.int32)]}
    got = ray.get(ray.put(arrays))
    assert got["a"].shape == (500, 1000) and not got["a"].any()
    assert int(got["b"][0].sum()) == 7 * 300_000


def _shm_bytes(directory: str | None = None) -> int:
    total = 0
    for root in [directory] if directory else glob.glob(SHM_GLOB):
        for dirpath, _, files in os.walk(root):
            for f in files:
                try:
                    total += os.stat(os.path.join(dirpath, f)).st_blocks * 512
                except FileNotFoundError:
                    pass
    return total


@pytest.mark.lightwork_only
def test_large_object_memory_is_returned_when_last_ref_dropped(wait_until):
    """Spec: objects are freed when no reference remains; their memory returns to the
    machine or waits, bounded, in the store's pool of segments for the next large value.
    Measured on lightwork's session directory (/dev/shm/lightwork-*)."""

    store = support.store()
    session_dir = support.driver_node().session.shm_dir  # this session's only: others may run too
    before = _shm_bytes(session_dir) - store.pooled_bytes
    ref = ray.put(np.ones(8_000_000, dtype=np.float64))  # 64 MB
    assert _shm_bytes(session_dir) - before >= 60_000_000, "large object not in /dev/shm"
    del ref
    gc.collect()
    wait_until(
        lambda: _shm_bytes(session_dir) - store.pooled_bytes - before < 8_000_000, timeout=5,
        message="64 MB to be freed")
    assert store.pooled_bytes <= store.pool_limit
    store.trim()
    assert _shm_bytes(session_dir) - before < 8_000_000


def test_object_kept_alive_while_a_task_result_holds_it(wait_until):
    @ray.remote
    def wrap(x):
        return [x]

    inner = ray.put(np.ones(1_000_000))
    outer = wrap.remote([inner])  # the result holds a reference to inner
    del inner
    gc.collect()
    time.sleep(0.2)
    [[inner_again]] = ray.get(outer)
    assert ray.get(inner_again).sum() == 1_000_000


def test_pending_task_keeps_its_argument_alive(gate):
    @ray.remote
    def after_gate(ready, value):
        return value

    value = ray.put(np.arange(500_000))
    ref = after_gate.remote(gated.remote(gate), value)
    del value
    gc.collect()
    time.sleep(0.2)
    open(gate, "w").close()
    assert int(ray.get(ref, timeout=10).sum()) == sum(range(500_000))


def test_ref_inside_a_stored_object_keeps_it_alive():
    inner = ray.put("inner value")
    outer = ray.put({"inner": inner})
    del inner
    gc.collect()
    time.sleep(0.2)
    assert ray.get(ray.get(outer)["inner"], timeout=10) == "inner value"


def test_wait_accepts_fetch_local_false():
    refs = [ray.put(1), ray.put(2)]
    assert ray.wait(refs, num_returns=2, fetch_local=False, timeout=5) == (refs, [])


def test_put_of_unpicklable_value_names_it():
    import threading

    with pytest.raises(Exception) as info:
        ray.put(threading.Lock())
    assert "lock" in str(info.value).lower()

