"""``lightwork.util.queue.Queue``: Ray's actor-held queue, from the driver, tasks and actors."""

from __future__ import annotations

import queue as stdlib_queue

import pytest

import lightwork
from lightwork.util.queue import Empty, Full, Queue


@pytest.fixture(scope="module")
def runtime(two_cpus):
    return two_cpus


def test_put_get_in_order_with_sizes(runtime):
    q = Queue(maxsize=3)
    assert q.empty() and not q.full() and q.size() == 0
    q.put("a")
    q.put_nowait("b")
    q.put("c", block=False)
    assert (q.size(), q.qsize(), len(q), q.full()) == (3, 3, 3, True)
    assert [q.get(), q.get_nowait(), q.get(block=False)] == ["a", "b", "c"]
    assert q.empty()


def test_full_and_empty_are_the_standard_library_exceptions(runtime):
    q = Queue(maxsize=1)
    q.put(1)
    with pytest.raises(Full):
        q.put_nowait(2)
    with pytest.raises(stdlib_queue.Full):  # code written for queue.Queue keeps working
        q.put(2, timeout=0.05)
    assert q.get(timeout=1) == 1
    with pytest.raises(Empty):
        q.get_nowait()
    with pytest.raises(stdlib_queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(Empty):
        q.get(block=False)


def test_batches_are_all_or_nothing(runtime):
    q = Queue(maxsize=3)
    q.put_nowait_batch([1, 2])
    with pytest.raises(Full):
        q.put_nowait_batch([3, 4])
    assert q.size() == 2  # nothing of the refused batch went in
    with pytest.raises(Empty):
        q.get_nowait_batch(3)
    assert q.size() == 2  # nothing was taken out either
    assert q.get_nowait_batch(2) == [1, 2]
    assert q.get_nowait_batch(0) == []


def test_a_batch_size_that_is_no_count_is_a_type_error(runtime):
    q = Queue()
    q.put_nowait_batch(["x", "y"])
    for wrong in ("2", 2.0, None):
        with pytest.raises(TypeError, match="num_items must be an int"):
            q.get_nowait_batch(wrong)
    with pytest.raises(ValueError, match=">= 0"):
        q.get_nowait_batch(-1)
    assert q.get_nowait_batch(2) == ["x", "y"]  # the refused calls took nothing
    with pytest.raises(TypeError, match="maxsize must be an int"):
        Queue(maxsize="10")
    with pytest.raises(ValueError, match="maxsize must be >= 0"):
        Queue(maxsize=-1)


def test_a_blocked_get_wakes_on_a_put_from_a_task(runtime):
    q = Queue()

    @lightwork.remote
    def produce(queue, count):
        for i in range(count):
            queue.put(i)
        return count

    produced = produce.remote(q, 4)
    waiting = [q.get(timeout=30) for _ in range(4)]
    assert waiting == [0, 1, 2, 3]
    assert lightwork.get(produced) == 4


def test_an_actor_consumes_what_tasks_produce(runtime):
    q = Queue(maxsize=2)  # smaller than the work: producers block until the actor takes

    @lightwork.remote
    def produce(queue, start):
        for i in range(start, start + 3):
            queue.put(i, timeout=30)

    @lightwork.remote
    class Summer:
        def take(self, queue, count):
            return sum(queue.get(timeout=30) for _ in range(count))

    summer = Summer.remote()
    total = summer.take.remote(q, 6)
    lightwork.get([produce.remote(q, 0), produce.remote(q, 10)])
    assert lightwork.get(total) == (0 + 1 + 2) + (10 + 11 + 12)


def test_async_put_and_get(runtime):
    import asyncio

    q = Queue()

    async def main():
        await q.put_async("x")
        await q.put_async("y", block=False)
        first = await q.get_async()
        second = await q.get_async(block=False)
        with pytest.raises(Empty):
            await q.get_async(timeout=0.05)
        return first, second

    assert asyncio.run(main()) == ("x", "y")


def test_bad_timeouts_are_refused_at_the_call(runtime):
    q = Queue()
    with pytest.raises(ValueError, match="non-negative"):
        q.put(1, timeout=-1)
    with pytest.raises(ValueError, match="non-negative"):
        q.get(timeout=-1)


@pytest.mark.lightwork_only
def test_a_bad_maxsize_is_refused(runtime):
    """lightwork-only: Ray's Queue accepts a negative maxsize (asyncio treats it as 0)."""
    with pytest.raises(ValueError, match="maxsize"):
        Queue(maxsize=-1)


@pytest.mark.lightwork_only
def test_shutdown_ends_the_actor_and_later_use_says_so(runtime):
    """lightwork-only: Ray's Queue fails with an AttributeError on None after shutdown."""
    q = Queue()
    q.put(1)
    actor = q.actor
    q.shutdown()
    with pytest.raises(lightwork.exceptions.ActorDiedError):
        lightwork.get(actor.qsize.remote(), timeout=10)
    with pytest.raises(RuntimeError, match="shut down"):
        q.put(2)
    q.shutdown()  # twice is fine
    forced = Queue()
    forced.shutdown(force=True)
    with pytest.raises(RuntimeError, match="shut down"):
        forced.get_nowait()


@pytest.mark.lightwork_only
def test_errors_raised_are_plain_not_task_errors(runtime):
    """lightwork-only: Ray raises these from inside a RayTaskError wrapper."""
    q = Queue(maxsize=1)
    q.put(1)
    with pytest.raises(Full) as caught:
        q.put_nowait(2)
    assert not isinstance(caught.value, lightwork.exceptions.TaskError)
    assert "full" in str(caught.value)
