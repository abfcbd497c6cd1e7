"""Generator tasks and methods: streaming ObjectRefGenerator, and num_returns="dynamic"."""

from __future__ import annotations

import asyncio
import gc
import os

import pytest
from tests.helpers import attempts, count_attempt, wait_for_file

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
    # An error mid-way is the last item (Ray's behaviour): the items before it are fine.
    refs = list(lightwork.get(numbers.options(num_returns="dynamic").remote(3, fail_at=2)))
    assert [lightwork.get(ref) for ref in refs[:2]] == [0, 10]
    with pytest.raises(StreamFailure, match="failed at item 2"):
        lightwork.get(refs[2], timeout=30)


def test_dynamic_returns_on_actor_methods(runtime):
    @lightwork.remote
    class Splitter:
        def __init__(self):
            self.calls = 0

        @lightwork.method(num_returns="dynamic")
        def split(self, text):
            self.calls += 1
            yield from text.split()

        def numbers(self, count, fail_at=None):
            for i in range(count):
                if i == fail_at:
                    raise StreamFailure(f"failed at item {i}")
                yield i * self.calls

        def calls_made(self):
            return self.calls

    splitter = Splitter.remote()
    ref = splitter.split.remote("a b c")
    assert isinstance(ref, lightwork.ObjectRef)  # one ref, to a generator of refs
    refs = lightwork.get(ref, timeout=30)
    assert len(refs) == 3
    assert [lightwork.get(item) for item in refs] == ["a", "b", "c"]
    # .options() turns a streaming generator method into a dynamic one, on the same actor.
    refs = lightwork.get(splitter.numbers.options(num_returns="dynamic").remote(3), timeout=30)
    assert [lightwork.get(item) for item in refs] == [0, 1, 2]
    assert lightwork.get(splitter.calls_made.remote(), timeout=30) == 1
    assert list(lightwork.get(splitter.split.remote(""), timeout=30)) == []
    # An error mid-way is the last item, as in Ray: the items before it are fine.
    refs = list(lightwork.get(
        splitter.numbers.options(num_returns="dynamic").remote(3, fail_at=1), timeout=30))
    assert len(refs) == 2 and lightwork.get(refs[0]) == 0
    with pytest.raises(StreamFailure, match="failed at item 1"):
        lightwork.get(refs[1], timeout=30)


@pytest.mark.lightwork_only  # Ray refuses an async generator with num_returns="dynamic"
def test_dynamic_returns_on_an_async_actor_and_an_error_mid_way(runtime):
    @lightwork.remote
    class AsyncSource:
        async def items(self, count, fail_at=None):
            for i in range(count):
                await asyncio.sleep(0)
                if i == fail_at:
                    raise StreamFailure(f"failed at item {i}")
                yield -i

    source = AsyncSource.remote()
    refs = lightwork.get(source.items.options(num_returns="dynamic").remote(3), timeout=30)
    assert [lightwork.get(item) for item in refs] == [0, -1, -2]
    refs = list(lightwork.get(
        source.items.options(num_returns="dynamic").remote(3, fail_at=1), timeout=30))
    assert len(refs) == 2 and lightwork.get(refs[0]) == 0
    with pytest.raises(StreamFailure, match="failed at item 1"):
        lightwork.get(refs[1], timeout=30)


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


def _object_ids():
    return {row["object_id"] for row in lightwork.state.list_objects(limit=None)}


@pytest.mark.lightwork_only
def test_an_item_the_consumer_dropped_is_freed_before_the_next_is_asked_for(
        runtime, wait_until):
    """lightwork-only: reads the object table through the state API. Ray frees an
    item once its consumer drops the ref; so must we, without a further ``next``."""
    stream = numbers.remote(3)
    lightwork.get(stream.completed(), timeout=30)
    first = next(stream)
    first_hex = first.hex()
    assert lightwork.get(first) == 0
    del first
    wait_until(lambda: first_hex not in _object_ids(), message="the dropped item to be freed")
    kept = next(stream)
    assert lightwork.get(kept) == 10
    assert kept.hex() in _object_ids()  # an item still referenced stays
    assert [lightwork.get(ref) for ref in stream] == [20]


@pytest.mark.lightwork_only
def test_an_item_a_task_consumer_dropped_is_freed_before_the_next_is_asked_for(runtime):
    """lightwork-only: the consumer is a task; the driver's table must drop the item as
    soon as the task's ref to it is gone, while the task still holds the stream."""

    @lightwork.remote
    def read_one_then_look(count):
        import time as _time

        stream = numbers.remote(count)
        lightwork.get(stream.completed())
        first = next(stream)
        first_hex = first.hex()
        lightwork.get(first)
        del first
        deadline = _time.monotonic() + 10
        while _time.monotonic() < deadline:
            lightwork.get(lightwork.put(None))  # a worker's releases go with its next message
            if first_hex not in {row["object_id"]
                                 for row in lightwork.state.list_objects(limit=None)}:
                return [lightwork.get(ref) for ref in stream]
            _time.sleep(0.05)
        return "the item stayed"

    assert lightwork.get(read_one_then_look.remote(3), timeout=60) == [10, 20]


def test_a_crash_mid_stream_ends_it_with_the_crash(runtime):
    @lightwork.remote(max_retries=0)
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


@lightwork.remote(max_retries=2)
def crashes_once_after_item_1(attempts_dir):
    """Yields (run, i) for i in 0..4; the first run dies right after yielding item 1."""
    run = count_attempt(attempts_dir) + 1
    for i in range(5):
        yield run, i
        if i == 1 and run == 1:
            os._exit(3)  # the yield above reached the driver: it is a round trip


def test_a_retried_generator_yields_each_item_once(runtime, tmp_path):
    """The re-run's first two yields are skipped: the consumer sees items 0 and 1 of the
    first run once, then the rest from the re-run (which run made an item is visible
    here only because this generator is deliberately not deterministic)."""
    stream = crashes_once_after_item_1.remote(str(tmp_path))
    items = [lightwork.get(ref, timeout=30) for ref in stream]
    assert items == [(1, 0), (1, 1), (2, 2), (2, 3), (2, 4)]
    assert lightwork.get(stream.completed(), timeout=30) is None
    assert len(attempts(str(tmp_path))) == 2


@pytest.mark.lightwork_only
def test_a_generator_that_raises_a_retriable_exception_is_retried(runtime, tmp_path):
    """As in Ray: with ``retry_exceptions``, a generator that raises one of them mid-
    stream runs again, and the consumer sees each item once and then the end, not the
    error."""

    @lightwork.remote(retry_exceptions=[StreamFailure], max_retries=2)
    def flaky(marker):
        for i in range(4):
            if i == 2 and count_attempt(marker) == 0:
                raise StreamFailure("first run only")
            yield i

    marker = str(tmp_path)
    assert [lightwork.get(ref, timeout=30) for ref in flaky.remote(marker)] == [0, 1, 2, 3]
    assert len(attempts(marker)) == 2  # the first run, which raised, and the re-run


def test_a_generator_out_of_retries_ends_with_its_error(runtime, tmp_path):
    """The retries are used up (or the exception is not listed): the error is the
    stream's last item, as without retries."""

    @lightwork.remote(retry_exceptions=[StreamFailure], max_retries=1)
    def always_fails(marker):
        count_attempt(marker)
        yield 0
        raise StreamFailure("every run")

    marker = str(tmp_path / "always")
    os.mkdir(marker)
    stream = always_fails.remote(marker)
    assert lightwork.get(next(stream), timeout=30) == 0
    with pytest.raises(StreamFailure, match="every run"):
        lightwork.get(next(stream), timeout=30)
    with pytest.raises(StopIteration):
        next(stream)
    assert len(attempts(marker)) == 2

    @lightwork.remote(retry_exceptions=[KeyError], max_retries=3)
    def other_error(marker):
        count_attempt(marker)
        yield 0
        raise StreamFailure("not listed")

    marker = str(tmp_path / "other")
    os.mkdir(marker)
    refs = list(other_error.remote(marker))
    with pytest.raises(StreamFailure):
        lightwork.get(refs[1], timeout=30)
    assert len(attempts(marker)) == 1


def test_a_retried_generator_has_one_yield_instant_per_item(runtime, tmp_path):
    """lightwork-only: the timeline has one yield instant per item, not per attempt."""
    items = [lightwork.get(ref, timeout=30)
             for ref in crashes_once_after_item_1.remote(str(tmp_path))]
    assert len(items) == 5
    task = [e for e in lightwork.timeline() if e.get("cat") == "yield"][-5:]
    assert [e["name"] for e in task] == [f"yield {i}" for i in range(5)]


@lightwork.remote(max_restarts=1, max_task_retries=1)
class RestartingStreamer:
    def numbers(self, attempts_dir):
        run = count_attempt(attempts_dir) + 1
        for i in range(4):
            yield i
            if i == 1 and run == 1:
                os._exit(3)


def test_an_actor_generator_retried_after_a_restart_yields_each_item_once(runtime, tmp_path):
    actor = RestartingStreamer.remote()
    items = [lightwork.get(ref, timeout=30) for ref in actor.numbers.remote(str(tmp_path))]
    assert items == [0, 1, 2, 3]
    assert len(attempts(str(tmp_path))) == 2


@lightwork.remote
def gated_start(gate):
    wait_for_file(gate)
    yield "first"
    yield "second"


def test_wait_takes_a_generator_ready_when_next_would_not_block(runtime, tmp_path):
    gate = str(tmp_path / "gate")
    stream = gated_start.remote(gate)
    other = lightwork.put("other")
    ready, not_ready = lightwork.wait([stream, other], num_returns=2, timeout=0)
    assert ready == [other] and not_ready == [stream]  # nothing yielded yet
    open(gate, "w").close()
    ready, not_ready = lightwork.wait([stream, other], num_returns=2, timeout=30)
    assert ready == [stream, other] and not_ready == []
    assert lightwork.get(next(stream)) == "first"  # waiting did not advance it
    assert lightwork.get(next(stream)) == "second"
    ready, _ = lightwork.wait([stream], timeout=30)  # the end is ready too
    assert ready == [stream]
    with pytest.raises(StopIteration):
        next(stream)
    assert lightwork.wait([stream], timeout=0) == ([stream], [])


def test_wait_on_a_generator_whose_task_crashed_is_ready(runtime):
    @lightwork.remote(max_retries=0)
    def dies_first():
        os._exit(3)
        yield 1

    stream = dies_first.remote()
    ready, _ = lightwork.wait([stream], timeout=30)
    assert ready == [stream]
    with pytest.raises(lightwork.exceptions.WorkerCrashedError):
        lightwork.get(next(stream), timeout=30)


@pytest.mark.lightwork_only
def test_get_of_a_generator_says_to_iterate_it(runtime):
    """lightwork-only: the wording of the messages is ours."""
    stream = numbers.remote(1)
    with pytest.raises((TypeError, ValueError)) as info:
        lightwork.get([stream])
    message = str(info.value)
    assert "an ObjectRefGenerator" in message and "a ObjectRefGenerator" not in message
    assert "iterate" in message
    with pytest.raises((TypeError, ValueError), match="iterate"):
        lightwork.get(stream)
    with pytest.raises((TypeError, ValueError), match="wrap a single"):
        lightwork.wait(stream)
    assert [lightwork.get(ref) for ref in stream] == [0]
