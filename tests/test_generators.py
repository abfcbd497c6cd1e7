"""Generator tasks and methods: streaming ObjectRefGenerator, and num_returns="dynamic"."""

from __future__ import annotations

import asyncio
import gc
import os

import pytest
from helpers import wait_for_file

import lightwork


@pytest.fixture(scope="module")
def runtime(two_cpus):
    return two_cpus


class StreamFailure(Exception):
    pass


@lightwork.remote
def numbers(count, fail_at=None):
    for i in range(count):
        if i == fail_at:
            raise StreamFailure(f"failed at item {i}")
        yield i * 10


@lightwork.remote
def gated_numbers(count, gate):
    """Yields 0, then waits for ``gate`` before the rest: item 0 is readable meanwhile."""
    for i in range(count):
        yield i
        if i == 0:
            wait_for_file(gate)


def test_a_generator_task_returns_an_object_ref_generator(runtime):
    stream = numbers.remote(4)
    assert isinstance(stream, lightwork.ObjectRefGenerator)
    first = next(stream)
    assert isinstance(first, lightwork.ObjectRef)
    assert lightwork.get(first) == 0
    assert [lightwork.get(ref) for ref in stream] == [10, 20, 30]
    with pytest.raises(StopIteration):
        next(stream)
    assert lightwork.get(stream.completed(), timeout=30) is None


def test_items_are_ready_while_the_task_still_runs(runtime, tmp_path):
    gate = str(tmp_path / "gate")
    stream = gated_numbers.remote(3, gate)
    first = next(stream)
    assert lightwork.get(first, timeout=30) == 0  # the task is blocked on the gate
    ready, _ = lightwork.wait([stream.completed()], timeout=0.2)
    assert ready == []
    open(gate, "w").close()
    assert [lightwork.get(ref, timeout=30) for ref in stream] == [1, 2]


def test_an_exception_mid_stream_surfaces_at_its_item(runtime):
    stream = numbers.remote(5, fail_at=2)
    refs = list(stream)
    assert len(refs) == 3  # two items, then the error, then the end
    assert lightwork.get(refs[:2]) == [0, 10]
    with pytest.raises(StreamFailure, match="failed at item 2"):
        lightwork.get(refs[2])
    assert lightwork.get(stream.completed()) is None  # the error was the stream's, as in Ray


def test_an_error_before_the_first_item_and_an_empty_generator(runtime):
    failing = numbers.remote(3, fail_at=0)
    with pytest.raises(StreamFailure):
        lightwork.get(next(failing))
    with pytest.raises(StopIteration):
        next(failing)
    assert list(numbers.remote(0)) == []


def test_async_for_over_a_stream(runtime):
    async def consume():
        return [await ref async for ref in numbers.remote(3)]

    assert asyncio.run(consume()) == [0, 10, 20]


def test_dynamic_returns_give_a_ref_to_a_generator_of_refs(runtime):
    @lightwork.remote(num_returns="dynamic")
    def split(text):
        yield from text.split()

    refs = lightwork.get(split.remote("a b c"))
    assert [lightwork.get(ref) for ref in refs] == ["a", "b", "c"]


def test_actor_generator_methods_stream(runtime):
    @lightwork.remote
    class Source:
        def __init__(self):
            self.base = 100

        def items(self, count):
            for i in range(count):
                yield self.base + i

    @lightwork.remote
    class AsyncSource:
        async def items(self, count):
            for i in range(count):
                await asyncio.sleep(0)
                yield -i

    source = Source.remote()
    assert [lightwork.get(ref) for ref in source.items.remote(3)] == [100, 101, 102]
    assert [lightwork.get(ref) for ref in AsyncSource.remote().items.remote(3)] == [0, -1, -2]


def test_a_stream_can_be_consumed_inside_a_task(runtime):
    @lightwork.remote
    def total(count):
        return sum(lightwork.get(ref) for ref in numbers.remote(count))

    assert lightwork.get(total.remote(4), timeout=30) == 60


@pytest.mark.lightwork_only
def test_a_consumer_that_stops_early_releases_what_it_did_not_read(runtime, tmp_path, wait_until):
    """lightwork-only: reads the object table through the state API."""
    stream = numbers.remote(6)
    first = next(stream)
    lightwork.get(stream.completed(), timeout=30)  # all six items exist now
    owned = {row["object_id"] for row in lightwork.state.list_objects(limit=None)}
    assert first.hex() in owned and len(owned) >= 7  # the items and the stream's head
    del stream
    gc.collect()

    def released():
        left = {row["object_id"] for row in lightwork.state.list_objects(limit=None)}
        return left if left == {first.hex()} else None

    wait_until(released, message="the unread items to be released")
    assert lightwork.get(first) == 0  # the item that was read is still there


@pytest.mark.lightwork_only
def test_a_crash_mid_stream_ends_it_with_the_crash(runtime):
    """lightwork-only: generators are not retried by default here (a retry would yield
    the items again); Ray re-runs them and skips what was already yielded."""
    @lightwork.remote
    def dies_after_one():
        yield 1
        os._exit(3)

    stream = dies_after_one.remote()
    refs = list(stream)
    assert lightwork.get(refs[0]) == 1
    with pytest.raises(lightwork.exceptions.WorkerCrashedError):
        lightwork.get(refs[1], timeout=30)
    with pytest.raises(lightwork.exceptions.WorkerCrashedError):
        lightwork.get(stream.completed(), timeout=30)


@pytest.mark.lightwork_only
def test_each_yield_is_an_instant_in_the_timeline(runtime):
    assert [lightwork.get(ref) for ref in numbers.remote(3)] == [0, 10, 20]
    yields = [e for e in lightwork.timeline() if e.get("cat") == "yield"]
    assert [e["name"] for e in yields[-3:]] == ["yield 0", "yield 1", "yield 2"]
    assert all(e["ph"] == "i" for e in yields)


def test_cancelling_a_stream_ends_it_with_the_cancel(runtime, tmp_path):
    stream = gated_numbers.remote(3, str(tmp_path / "never"))
    assert lightwork.get(next(stream), timeout=30) == 0  # the task waits on the gate now
    lightwork.cancel(stream)
    with pytest.raises(lightwork.exceptions.TaskCancelledError):
        lightwork.get(next(stream), timeout=30)
    with pytest.raises(StopIteration):
        next(stream)
