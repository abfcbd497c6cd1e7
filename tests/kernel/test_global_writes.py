"""Which globals a function's code rebinds, and the wrapper that watches its calls."""

from __future__ import annotations

import asyncio

from lightwork.kernel import global_writes

count = 0
model = None
table: dict[str, int] = {}


def bumps():
    global count
    count += 1


def builds_once():
    global model
    if model is None:
        model = [1]
    return model


def fills_in_place(key):
    table[key] = 1  # a change in place: no global is rebound


def bumps_through_an_inner_function():
    def inner():
        global count
        count += 1

    inner()


def calls_a_helper_that_bumps():
    bumps()  # the helper's own code: watched when it is a remote function itself


async def bumps_after_awaiting():
    global count
    await asyncio.sleep(0)
    count += 1


def test_only_functions_that_assign_a_global_are_watched():
    assert global_writes.watch_of(fills_in_place) is None
    assert global_writes.watch_of(calls_a_helper_that_bumps) is None
    assert global_writes.watch_of(bumps_through_an_inner_function).names == ("count",)
    watch = global_writes.watch_of(bumps)
    assert watch is not None and watch.names == ("count",)
    assert watch.lines["count"] == bumps.__code__.co_firstlineno + 2


def test_a_rebinding_is_reported_once_and_a_first_assignment_never():
    global model
    reports = []
    model = None
    cached = global_writes.watched(builds_once, global_writes.watch_of(builds_once),
                                   lambda watch, changed: reports.append(changed))
    cached(), cached()
    assert reports == []  # None -> a value: a per-worker cache
    counted = global_writes.watched(bumps, global_writes.watch_of(bumps),
                                    lambda watch, changed: reports.append(changed))
    counted(), counted(), counted()
    assert reports == [[("count", bumps.__code__.co_firstlineno + 2)]]


def test_a_coroutine_is_watched_across_its_awaits():
    reports = []
    wrapped = global_writes.watched(bumps_after_awaiting,
                                    global_writes.watch_of(bumps_after_awaiting),
                                    lambda watch, changed: reports.append(changed))
    asyncio.run(wrapped())
    assert [name for name, _ in reports[0]] == ["count"]


def test_a_method_that_writes_none_overrides_one_that_does():
    class Base:
        def step(self):
            global count
            count += 1

        def other(self):
            global count
            count = 0

    class Child(Base):
        def step(self):
            return 1

    assert set(global_writes.watches_of_class(Base)) == {"step", "other"}
    assert set(global_writes.watches_of_class(Child)) == {"other"}
