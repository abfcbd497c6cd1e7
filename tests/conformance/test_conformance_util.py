"""ActorPool, ``util.multiprocessing.Pool``, ``available_resources`` and the definition
checks, on every backend: the behaviours Ray's own tests of these expect.
"""

# ruff: noqa: F811 - the tests take the imported ``backend`` fixture by its name

from __future__ import annotations

import time

import pytest
from tests.helpers import wait_for_file
from tests.conformance.test_conformance import _apply_gaps, backend  # noqa: F401

import lightwork
from lightwork.util import ActorPool
from lightwork.util.multiprocessing import JoinableQueue, Pool


@lightwork.remote
class Worker:
    def double(self, value):
        return 2 * value

    def slow(self, seconds):
        time.sleep(seconds)
        return seconds

    @lightwork.method(num_returns=2)
    def pair(self, value):
        return value, -value


# ---- ActorPool --------------------------------------------------------------------------
def test_map_submits_at_once_and_returns_a_generator(backend):
    pool = ActorPool([Worker.remote(), Worker.remote()])
    results = pool.map(lambda actor, value: actor.double.remote(value), range(4))
    assert pool.has_next()  # submitted before anything is read
    assert list(results) == [0, 2, 4, 6]


def test_map_does_not_wait_for_earlier_calls(backend):
    # (threaded actors: the map's calls may run beside the slow one, as Ray's test's
    # async actors do; a one-thread actor would run them after it either way)
    pool = ActorPool([Worker.options(max_concurrency=2).remote() for _ in range(2)])
    pool.submit(lambda actor, seconds: actor.slow.remote(seconds), 30)
    started = time.monotonic()
    assert sorted(pool.map_unordered(lambda actor, value: actor.double.remote(value),
                                     range(3))) == [0, 2, 4]
    assert time.monotonic() - started < 20


def test_a_call_returning_several_refs(backend):
    pool = ActorPool([Worker.remote()])
    for value in (1, 2):
        pool.submit(lambda actor, value: actor.pair.remote(value), value)
    assert pool.get_next(timeout=30) == [1, -1]
    assert pool.get_next_unordered(timeout=30) == [2, -2]
    assert not pool.has_next()


def test_timeouts_keep_or_drop_the_call(backend):
    pool = ActorPool([Worker.remote(), Worker.remote()])
    pool.submit(lambda actor, seconds: actor.slow.remote(seconds), 5)
    with pytest.raises(TimeoutError):
        pool.get_next(timeout=0.1)
    assert pool.has_next()  # still the next result
    with pytest.raises(TimeoutError, match="dropped"):
        pool.get_next(timeout=0.1, ignore_if_timedout=True)
    assert not pool.has_next() and pool.has_free()  # its actor is given back
    pool.submit(lambda actor, seconds: actor.slow.remote(seconds), 5)
    with pytest.raises(TimeoutError, match="dropped"):  # Ray 2.60 raises here too
        pool.get_next_unordered(timeout=0.1, ignore_if_timedout=True)
    assert not pool.has_next()


def test_bad_arguments_are_refused(backend):
    pool = ActorPool([Worker.remote()])
    with pytest.raises(TypeError, match="must return an ObjectRef"):
        pool.submit(lambda actor, value: value, 1)
    assert pool.has_free()  # the actor was given back
    with pytest.raises(ValueError, match="timeout"):
        pool.submit(lambda actor, value: actor.double.remote(value), 1)
        pool.get_next(timeout=-1)
    with pytest.raises(TypeError, match="iterable"):
        pool.map(lambda actor, value: actor.double.remote(value), 3)
    with pytest.raises(StopIteration):
        ActorPool([]).get_next()


# ---- multiprocessing --------------------------------------------------------------------
def _fail_on_two(value):
    if value == 2:
        raise KeyError(f"item {value}")
    return value


def _mark(path):
    open(path, "a").close()


def test_imap_yields_a_failed_items_error_in_its_place(backend):
    with Pool(2) as pool:
        results = list(pool.imap(_fail_on_two, range(4)))
        assert results[:2] == [0, 1] and results[3] == 3
        assert isinstance(results[2], KeyError)
        unordered = list(pool.imap_unordered(_fail_on_two, range(4), chunksize=2))
        assert sorted(r for r in unordered if isinstance(r, int)) == [0, 1, 3]
        with pytest.raises(KeyError):
            pool.map(_fail_on_two, range(4))


def test_apply_async_calls_its_callbacks(backend):
    got, errors = [], []
    with Pool(2) as pool:
        pool.apply_async(_fail_on_two, (1,), callback=got.append).wait(30)
        pool.apply_async(_fail_on_two, (2,), error_callback=errors.append).wait(30)
        pool.map_async(_fail_on_two, [0, 1, 3], callback=got.append).wait(30)
        deadline = time.monotonic() + 30
        while (len(got) < 2 or not errors) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert got == [1, [0, 1, 3]] and len(errors) == 1 and isinstance(errors[0], KeyError)


def test_pool_starts_its_processes_and_checks_their_count(backend, tmp_path):
    pool = Pool(2, initializer=_mark, initargs=(str(tmp_path / "ran"),))
    try:
        assert (tmp_path / "ran").exists()  # the initializer ran before Pool() returned
    finally:
        pool.terminate()
    cpus = int(lightwork.cluster_resources()["CPU"])
    with pytest.raises(ValueError, match=f"needs {cpus + 1} CPUs"):
        Pool(cpus + 1)


def test_joinable_queue_is_the_standard_librarys():
    import multiprocessing

    assert JoinableQueue is multiprocessing.JoinableQueue


# ---- resources and definitions ------------------------------------------------------------
@lightwork.remote(num_cpus=1)
def free_resources():
    return lightwork.available_resources()


def test_a_task_sees_what_is_free_now(backend):
    total = lightwork.cluster_resources()["CPU"]
    assert lightwork.get(free_resources.remote(), timeout=30)["CPU"] == total - 1


@lightwork.remote(num_cpus=1)
def hold_a_cpu(gate):
    wait_for_file(gate, 60)


def test_exhausted_resources_are_left_out(backend, tmp_path):
    gate = str(tmp_path / "gate")
    total = int(lightwork.cluster_resources()["CPU"])
    holders = [hold_a_cpu.remote(gate) for _ in range(total)]
    try:
        deadline = time.monotonic() + 30
        while "CPU" in lightwork.available_resources() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "CPU" not in lightwork.available_resources()
        assert all(amount > 0 for amount in lightwork.available_resources().values())
    finally:
        open(gate, "w").close()
    lightwork.get(holders, timeout=60)
    deadline = time.monotonic() + 20  # (the cluster's count follows its workers' reports)
    while "CPU" not in lightwork.available_resources() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert lightwork.available_resources()["CPU"] > 0


def test_an_oversized_function_is_refused_at_its_first_call(backend, monkeypatch):
    monkeypatch.setenv("FUNCTION_SIZE_ERROR_THRESHOLD", str(10**6))
    captured = b"x" * (2 * 10**6)

    @lightwork.remote
    def uses_it():
        return len(captured)

    @lightwork.remote
    class UsesIt:
        def size(self):
            return len(captured)

    with pytest.raises(ValueError, match="remote function .*uses_it is too large"):
        uses_it.remote()
    with pytest.raises(ValueError, match="actor UsesIt is too large"):
        UsesIt.remote()


def test_option_types_and_ranges_use_rays_messages():
    def task():
        return 1

    with pytest.raises(TypeError, match="The type of keyword 'max_retries' must be"):
        lightwork.remote(max_retries=0.5)(task)
    with pytest.raises(ValueError, match="The keyword 'num_returns' only accepts None"):
        lightwork.remote(num_returns=-2)(task)
    with pytest.raises(ValueError, match="precision of the fractional quantity of resource gpu"):
        lightwork.remote(resources={"gpu": 0.00001})(task)
    assert lightwork.remote(max_retries=None)(task) is not None  # None: the default
