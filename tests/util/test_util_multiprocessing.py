"""``lightwork.util.multiprocessing.Pool``: the standard library's Pool interface."""

from __future__ import annotations

import itertools
import os
import time

import pytest

import lightwork
from lightwork.util.multiprocessing import Pool, TimeoutError


@pytest.fixture(scope="module")
def runtime(two_cpus):
    return two_cpus


def _square(x):
    return x * x


def _add(a, b, c=0):
    return a + b + c


def _pid(_):
    return os.getpid()


def _set_tag(tag):
    os.environ["POOL_TAG"] = tag  # the initializer's effect, seen by every call in the process


def _read_tag(_):
    return os.environ.get("POOL_TAG")


class PoolFailure(Exception):
    pass


def _fail_on_three(x):
    if x == 3:
        raise PoolFailure(f"item {x} failed")
    return x


def test_map_starmap_apply_and_imap_give_the_stdlib_results(runtime):
    with Pool(2) as pool:
        assert pool.map(_square, range(10)) == [x * x for x in range(10)]
        assert pool.map(_square, range(7), chunksize=3) == [x * x for x in range(7)]
        assert pool.map(_square, []) == []
        assert pool.starmap(_add, [(1, 2), (3, 4)]) == [3, 7]
        assert pool.apply(_add, (1, 2), {"c": 10}) == 13
        assert list(pool.imap(_square, range(6))) == [0, 1, 4, 9, 16, 25]
        assert list(pool.imap(_square, range(6), chunksize=4)) == [0, 1, 4, 9, 16, 25]
        assert sorted(pool.imap_unordered(_square, range(6))) == [0, 1, 4, 9, 16, 25]


def test_work_is_spread_over_the_processes(runtime):
    with Pool(2) as pool:
        pids = pool.map(_pid, range(8), chunksize=1)
    assert len(set(pids)) == 2 and os.getpid() not in pids


def test_initializer_runs_in_every_process(runtime):
    with Pool(2, initializer=_set_tag, initargs=("ready",)) as pool:
        assert set(pool.map(_read_tag, range(8), chunksize=1)) == {"ready"}


def test_maxtasksperchild_replaces_processes(runtime):
    with Pool(1, maxtasksperchild=2) as pool:
        pids = pool.map(_pid, range(6), chunksize=1)
    assert len(set(pids)) == 3  # 6 chunks, 2 per process
    assert pids[0] == pids[1] and pids[2] == pids[3] and pids[4] == pids[5]


def test_errors_come_back_as_the_users_type(runtime):
    with Pool(2) as pool:
        with pytest.raises(PoolFailure, match="item 3 failed") as caught:
            pool.map(_fail_on_three, range(6))
        assert type(caught.value) is PoolFailure
        result = pool.apply_async(_fail_on_three, (3,))
        result.wait(timeout=30)
        assert result.ready() and not result.successful()
        with pytest.raises(PoolFailure):
            result.get()


def test_async_results_ready_wait_get_timeout_and_callbacks(runtime):
    """Fails against Ray on purpose: Ray's map_async hands its callback the results in
    completion order; the standard library (and lightwork) in input order."""
    import threading

    answered = threading.Event()
    seen = []

    def remember(value):
        seen.append(value)
        answered.set()

    with Pool(2) as pool:
        slow = pool.apply_async(time.sleep, (0.5,))
        assert not slow.ready()
        with pytest.raises(ValueError):
            slow.successful()  # not ready yet: the stdlib raises ValueError
        with pytest.raises(TimeoutError):
            slow.get(timeout=0.01)
        slow.wait()
        assert slow.ready() and slow.successful() and slow.get() is None
        mapped = pool.map_async(_square, [1, 2, 3], callback=remember)
        assert mapped.get(timeout=30) == [1, 4, 9]
        assert answered.wait(10) and seen == [[1, 4, 9]]


def test_imap_next_with_timeout(runtime):
    with Pool(1) as pool:
        iterator = pool.imap(time.sleep, [0.5])
        with pytest.raises(TimeoutError):
            iterator.next(timeout=0.01)
        assert iterator.next(timeout=30) is None
        with pytest.raises(StopIteration):
            next(iterator)


def test_close_join_and_terminate(runtime):
    pool = Pool(2)
    pending = pool.map_async(_square, range(4))
    with pytest.raises(ValueError, match="still running"):
        pool.join()
    pool.close()
    with pytest.raises(ValueError, match="not running"):
        pool.map(_square, [1])
    pool.join()
    assert pending.get(timeout=1) == [0, 1, 4, 9]  # close lets outstanding work finish
    other = Pool(1)
    other.terminate()
    other.join()
    with pytest.raises(ValueError, match="not running"):
        other.apply(_square, (2,))


def test_bad_arguments_are_refused(runtime):
    with pytest.raises(ValueError):
        Pool(0)


@pytest.mark.lightwork_only
def test_bad_pool_options_name_the_option(runtime):
    """lightwork-only: the wording; Ray's Pool fails chunksize=0 with an AssertionError."""
    with pytest.raises(ValueError, match="processes"):
        Pool(0)
    with pytest.raises(ValueError, match="maxtasksperchild"):
        Pool(1, maxtasksperchild=0)
    with Pool(1) as pool:
        with pytest.raises(ValueError, match="chunksize"):
            pool.map(_square, [1], chunksize=0)
        with pytest.raises(TypeError, match="function"):
            pool.map(42, [1])


@pytest.mark.lightwork_only
def test_errors_carry_the_remote_traceback_and_reach_error_callbacks(runtime, wait_until):
    """lightwork-only: the traceback as the standard library attaches it (Ray's Pool
    attaches none, and hands error callbacks its own PoolTaskError wrapper). As in Ray,
    imap yields a failed item's error in its place instead of raising it."""
    errors = []
    with Pool(2) as pool:
        with pytest.raises(PoolFailure) as caught:
            pool.map(_fail_on_three, range(6))
        assert "_fail_on_three" in str(caught.value.__cause__)
        results = list(pool.imap(_fail_on_three, range(6)))
        assert isinstance(results[3], PoolFailure) and results[:3] == [0, 1, 2]
        assert "_fail_on_three" in str(results[3].__cause__)
        pool.apply_async(_fail_on_three, (3,), error_callback=errors.append).wait(30)
        wait_until(lambda: errors, message="the error callback")
    assert len(errors) == 1 and isinstance(errors[0], PoolFailure)


@pytest.mark.lightwork_only
def test_an_initializer_that_raises_names_the_error(runtime):
    """lightwork-only: the standard library respawns such processes forever (a hang)."""

    def broken():
        raise RuntimeError("no database")

    with pytest.raises(lightwork.exceptions.ActorDiedError, match="no database"):
        Pool(1, initializer=broken)  # as in Ray, Pool() waits for its processes to start


def _wait_for_file(path):
    while not os.path.exists(path):
        time.sleep(0.01)
    return path


def test_callbacks_share_one_results_thread_not_one_thread_per_call(runtime, tmp_path):
    """Regression: every apply_async with a callback started a thread of its own, so
    10,000 calls made 10,000 blocked threads. The pool has one results handler."""
    import threading

    gate = str(tmp_path / "gate")
    answered = []
    with Pool(2) as pool:
        before = threading.active_count()
        results = [pool.apply_async(_wait_for_file, (gate,), callback=answered.append)
                   for _ in range(60)]
        assert threading.active_count() - before <= 2  # the handler (and nothing per call)
        open(gate, "w").close()
        assert [result.get(timeout=30) for result in results] == [gate] * 60
        pool.close()
        pool.join()  # as in the standard library: the callbacks have run by now
        assert answered == [gate] * 60


def _unpickled_in_driver():
    # On sys: the worker may pickle _count_unpickling by value, so a global of this module
    # would be a different list after unpickling.
    import sys

    return sys.__dict__.setdefault("_lightwork_test_unpickled", [])


def _count_unpickling(payload):
    _unpickled_in_driver().append(payload)
    return _Counted(payload)


class _Counted:
    def __init__(self, payload):
        self.payload = payload

    def __reduce__(self):
        return _count_unpickling, (self.payload,)


def _counted(x):
    return _Counted(x)


def test_results_are_unpickled_once_and_not_to_count_them(runtime):
    """Regression: the pool counted finished chunks through ref.future(), which unpickled
    every chunk's result on the runtime's I/O thread, and again for the caller."""
    del _unpickled_in_driver()[:]
    with Pool(2) as pool:
        assert [c.payload for c in pool.map(_counted, range(8))] == list(range(8))
        pool.close()
        pool.join()  # every chunk has been counted by now
    assert sorted(_unpickled_in_driver()) == list(range(8))  # once each, by map() itself


def _endless():
    yield from itertools.count()


def test_imap_reads_an_endless_input_lazily(runtime):
    """Regression: imap called list(iterable), so an endless generator hung."""
    with Pool(2) as pool:
        assert list(itertools.islice(pool.imap(_square, _endless()), 5)) == [0, 1, 4, 9, 16]
        assert list(itertools.islice(pool.imap(_square, _endless(), chunksize=3), 7)) == [
            x * x for x in range(7)]
        firsts = list(itertools.islice(pool.imap_unordered(_square, _endless()), 6))
        assert len(firsts) == 6 and all(int(x ** 0.5) ** 2 == x for x in firsts)


def _input_failing_after_two():
    yield 1
    yield 2
    raise PoolFailure("the input broke")


def test_an_input_that_fails_raises_after_the_items_before_it(runtime):
    with Pool(2) as pool:
        results = pool.imap(_square, _input_failing_after_two())
        assert next(results) == 1 and next(results) == 4
        with pytest.raises(PoolFailure, match="the input broke"):
            next(results)
        with pytest.raises(StopIteration):
            next(results)


def test_a_callback_that_raises_does_not_stop_the_others(runtime, caplog):
    answered = []

    def broken(_value):
        raise RuntimeError("callback bug")

    with Pool(2) as pool:
        pool.apply_async(_square, (2,), callback=broken).get(timeout=30)
        pool.apply_async(_square, (3,), callback=answered.append).get(timeout=30)
        pool.close()
        pool.join()
    assert answered == [9]
    assert "callback bug" in caplog.text
