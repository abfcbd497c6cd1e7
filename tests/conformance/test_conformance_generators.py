"""Generators called with a fixed ``num_returns``, on every backend.

A generator task or method called with ``num_returns=k`` fills its k refs in yield
order, as Ray does: k items are the result whatever follows (one more yield, or an
error after the k-th, is only logged); fewer items leave the refs past them raising
why. ``num_returns="dynamic"`` needs a generator, and a retried dynamic generator's
items are all the retry's.
"""

# ruff: noqa: F811 - the tests take the imported ``backend`` fixture by its name

from __future__ import annotations

import pytest
from tests.helpers import attempts, count_attempt
from tests.conformance.test_conformance import _apply_gaps, backend, gap  # noqa: F401

import lightwork
from lightwork import exceptions


class Flaky(Exception):
    """The error a generator raises on its first attempt only: a class of this test
    module, which a cluster's scheduler cannot import (retry_exceptions reach the
    workers without it unpickling them)."""


@lightwork.remote(max_retries=0)
def produce(count, fail_at=None):
    for index in range(count):
        if index == fail_at:
            raise KeyError(f"no item {index}")
        yield [index]


@lightwork.remote
class Producer:
    def produce(self, count, fail_at=None):
        for index in range(count):
            if index == fail_at:
                raise KeyError(f"no item {index}")
            yield -index


def test_exactly_k_items_fill_k_refs(backend):
    refs = produce.options(num_returns=3).remote(3)
    assert len(refs) == 3
    assert lightwork.get(refs, timeout=30) == [[0], [1], [2]]


def test_one_item_too_many_keeps_the_first_k(backend):
    assert lightwork.get(produce.options(num_returns=2).remote(5), timeout=30) == [[0], [1]]


def test_an_error_after_the_last_ref_is_not_raised(backend):
    refs = produce.options(num_returns=2).remote(4, fail_at=2)
    assert lightwork.get(refs, timeout=30) == [[0], [1]]


def test_fewer_items_fail_the_refs_past_them_with_a_value_error(backend):
    first, second, third = produce.options(num_returns=3).remote(1)
    assert lightwork.get(first, timeout=30) == [0]
    for ref in (second, third):
        with pytest.raises(exceptions.TaskError) as caught:
            lightwork.get(ref, timeout=30)
        assert isinstance(caught.value.as_instanceof_cause(), ValueError)
        assert "num_returns=3" in str(caught.value) and "yielded 1 item" in str(caught.value)
    with pytest.raises(ValueError, match="num_returns=3"):
        lightwork.get([first, second], timeout=30)


def test_an_error_mid_way_keeps_the_items_before_it(backend):
    first, second, third = produce.options(num_returns=3).remote(3, fail_at=1)
    assert lightwork.get(first, timeout=30) == [0]
    for ref in (second, third):
        with pytest.raises(KeyError, match="no item 1"):
            lightwork.get(ref, timeout=30)


def test_num_returns_one_gives_the_first_item_not_a_stream(backend):
    ref = produce.options(num_returns=1).remote(1)
    assert isinstance(ref, lightwork.ObjectRef)
    assert lightwork.get(ref, timeout=30) == [0]
    # Without num_returns the same function streams.
    assert [lightwork.get(r, timeout=30) for r in produce.remote(2)] == [[0], [1]]


def test_generator_methods_fill_a_fixed_num_returns(backend):
    producer = Producer.remote()
    assert lightwork.get(producer.produce.options(num_returns=1).remote(3), timeout=30) == 0
    assert lightwork.get(producer.produce.options(num_returns=2).remote(3), timeout=30) == [0, -1]
    first, second = producer.produce.options(num_returns=2).remote(2, fail_at=1)
    assert lightwork.get(first, timeout=30) == 0
    with pytest.raises(KeyError, match="no item 1"):
        lightwork.get(second, timeout=30)
    with pytest.raises(ValueError, match="num_returns=3"):
        lightwork.get(producer.produce.options(num_returns=3).remote(1), timeout=30)
    assert lightwork.get(producer.produce.options(num_returns=1).remote(1), timeout=30) == 0


@lightwork.remote(num_returns="dynamic")
def returns_a_list(count):
    return list(range(count))


def test_dynamic_needs_a_generator(backend):
    with pytest.raises(TypeError, match="generator function"):
        lightwork.get(returns_a_list.remote(3), timeout=30)


@lightwork.remote(max_retries=1)
def flaky_items(path, count):
    first = count_attempt(path) == 0
    for index in range(count):
        yield index
        if first:
            raise Flaky("first attempt")


def test_a_retried_dynamic_generator_gives_the_retrys_items(backend, tmp_path):
    path = str(tmp_path)
    retried = flaky_items.options(num_returns="dynamic", retry_exceptions=[Flaky])
    refs = list(lightwork.get(retried.remote(path, 3), timeout=60))
    assert lightwork.get(refs, timeout=30) == [0, 1, 2]
    assert len(attempts(path)) == 2


def test_without_retry_exceptions_the_error_is_the_last_item(backend, tmp_path):
    path = str(tmp_path)
    refs = list(lightwork.get(flaky_items.options(num_returns="dynamic").remote(path, 3),
                              timeout=60))
    assert len(refs) == 2 and lightwork.get(refs[0], timeout=30) == 0
    with pytest.raises(Flaky):
        lightwork.get(refs[1], timeout=30)
    assert len(attempts(path)) == 1


def test_a_static_generator_is_retried_as_a_whole(backend, tmp_path):
    path = str(tmp_path)
    retried = flaky_items.options(num_returns=3, retry_exceptions=True)
    assert lightwork.get(retried.remote(path, 3), timeout=60) == [0, 1, 2]
    assert len(attempts(path)) == 2


@lightwork.remote
class Rendezvous:
    """Its one async method is an async generator: that alone makes it an async actor,
    whose calls run at once on its event loop."""

    def __init__(self):
        import asyncio

        self.arrived = 0
        self.all_here = asyncio.Event()

    async def meet(self, expected):
        import asyncio

        self.arrived += 1
        if self.arrived == expected:
            self.all_here.set()
        # Calls run one after another would leave the first waiting here alone.
        await asyncio.wait_for(self.all_here.wait(), timeout=20)
        for index in range(2):
            yield index


@gap("distributed", "an actor's async generator methods do not stream on distributed: "
     "its calls end with no items")
def test_async_generator_calls_of_one_actor_run_concurrently(backend):
    actor = Rendezvous.remote()
    streams = [actor.meet.remote(3) for _ in range(3)]
    assert [[lightwork.get(ref, timeout=30) for ref in stream] for stream in streams] == \
        [[0, 1]] * 3
