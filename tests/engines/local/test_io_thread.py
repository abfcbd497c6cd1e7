"""The driver's I/O thread and dropped refs (``node.py``: ``_loop``, ``_on_first_release``).

A ref the program drops is freed by the I/O thread even when the program makes no more
calls: an idle I/O thread is woken for it; a busy one (it had frames or wake-ups in the
last ``IO_BUSY_FOR_S``) drains it at its next short sleep, without a wake-up per ref.
Each test stretches the other sleep to a minute, so only the path under test can free
the object within the test's bound. ``RefCounter``'s wake-up requests are tested with
another thread's drain forced into the middle of a release.
"""

from __future__ import annotations

from collections import deque

import pytest
from tests import support

from lightwork.kernel.object_ref import RefCounter
from lightwork.engines.local import io_loop

pytestmark = pytest.mark.lightwork_only  # the embedded runtime's own threads


def _freed(node, object_id: int) -> bool:
    with node.lock:
        return object_id not in node.objects.entries


def test_an_idle_io_thread_is_woken_to_free_a_dropped_ref(fresh_runtime, monkeypatch,
                                                          wait_until):
    monkeypatch.setattr(io_loop, "IO_BUSY_FOR_S", 0.0)  # never busy
    monkeypatch.setattr(io_loop, "IO_IDLE_SLEEP_S", 60.0)
    fresh_runtime.init(num_cpus=1)
    node = support.driver_node()

    @fresh_runtime.remote
    def echo(value):
        return value

    # The worker is up (no start-up message will come to wake the thread by chance).
    ref = echo.remote(b"x" * 1000)
    assert fresh_runtime.get(ref, timeout=30) == b"x" * 1000
    object_id = ref.id
    wait_until(lambda: support.io_loop()._sleeps_long, timeout=10, message="an idle I/O thread")
    del ref  # no call follows: only the wake-up can get it freed
    wait_until(lambda: _freed(node, object_id), timeout=10, message="the object freed")


def test_a_busy_io_thread_frees_a_dropped_ref_at_its_next_short_sleep(fresh_runtime,
                                                                       monkeypatch,
                                                                       wait_until):
    monkeypatch.setattr(io_loop, "IO_BUSY_FOR_S", 60.0)  # busy after any event
    monkeypatch.setattr(io_loop, "IO_IDLE_SLEEP_S", 60.0)
    fresh_runtime.init(num_cpus=1)
    node = support.driver_node()

    @fresh_runtime.remote
    def echo(value):
        return value

    ref = echo.remote(b"y" * 1000)
    assert fresh_runtime.get(ref, timeout=30) == b"y" * 1000  # a frame: the thread is busy
    io = support.io_loop()
    wait_until(lambda: not io._sleeps_long and io._busy_until > 0, timeout=10,
               message="a busy I/O thread")
    object_id = ref.id
    del ref
    assert not io._sleeps_long
    wait_until(lambda: _freed(node, object_id), timeout=10, message="the object freed")


class _DrainedMeanwhile(deque):
    """A release queue where another thread's whole drain runs at the moment a
    release is appended: ``before`` the append, or ``after`` it."""

    def __init__(self, counter: RefCounter, when: str) -> None:
        super().__init__(counter._released)
        self.counter, self.when, self.gone = counter, when, []

    def append(self, object_id: int) -> None:
        if self.when == "before":
            self.gone += self.counter.drain()
        super().append(object_id)
        if self.when == "after":
            self.gone += self.counter.drain()


def _counter_with_wakes() -> tuple[RefCounter, list[int]]:
    counter, wakes = RefCounter(), []
    counter.on_first_release = lambda: wakes.append(len(counter._released))
    for object_id in (1, 2, 3):
        counter.add(object_id, borrowed=False)
    return counter, wakes


def test_a_release_queued_as_another_thread_drains_wakes_a_drainer():
    """The queue was not empty when the release looked, but a drain emptied it before
    the append: the release must ask for a wake-up, or it waits for the next drain."""
    counter, wakes = _counter_with_wakes()
    counter.release_later(1)
    assert len(wakes) == 1
    counter._released = queue = _DrainedMeanwhile(counter, "before")
    counter.release_later(2)
    assert queue.gone == [1]  # the other thread's drain took the first release
    assert len(wakes) == 2, "the second release, queued after that drain, woke no one"
    assert counter.drain() == [2]


def test_after_rearm_the_next_release_wakes_the_sleeper():
    """A drain that ran right after an append took the release, and the release then
    asked for a wake-up: nothing is queued, yet no later release would call again
    until a drain. ``rearm`` (the I/O thread, before it sleeps) ends that."""
    counter, wakes = _counter_with_wakes()
    counter._released = queue = _DrainedMeanwhile(counter, "after")
    counter.release_later(1)
    assert queue.gone == [1] and len(wakes) == 1
    queue.when = None
    assert counter.rearm() is False  # nothing queued: the I/O thread may sleep long
    counter.release_later(2)
    assert len(wakes) == 2
    assert counter.rearm() is True  # queued, not drained: the thread must not sleep
    assert counter.drain() == [2]


@pytest.mark.skipif(not __import__("os").path.exists("/proc/thread-self/schedstat"),
                    reason="no per-thread schedstat in /proc")
def test_the_driver_cpu_sample_reads_schedstat_keeping_the_gil():
    """``_read_schedstat`` (libc pread via ctypes.PyDLL) reads what os.pread reads, and a
    bad descriptor is an OSError (the sample then falls back to ``time.thread_time``)."""
    import os

    from lightwork.engines.local.driver_calls import _read_schedstat

    fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    try:
        ours = [int(x) for x in _read_schedstat(fd).split()]
        theirs = [int(x) for x in os.pread(fd, 64, 0).split()]
    finally:
        os.close(fd)
    assert len(ours) == len(theirs) == 3
    assert 0 < ours[0] <= theirs[0]  # CPU time only grows
    with pytest.raises(OSError):
        _read_schedstat(fd)  # closed now


@pytest.mark.parametrize("getter_leads", [True, False])
def test_frames_that_outgrow_a_busy_workers_socket_wait_for_room(fresh_runtime, getter_leads):
    """Frames the worker's socket buffer cannot take yet wait in the driver, and this
    thread's epoll is asked for room (the worker sockets are otherwise in an epoll of
    their own, which a leading getter mutes): every task still runs, whether a getter
    leads meanwhile or nobody waits."""
    import concurrent.futures
    import time

    fresh_runtime.init(num_cpus=1)
    asked = []
    io = support.io_loop()
    watch = io._watch_writable
    io._watch_writable = lambda conn: (asked.append(conn.worker_id), watch(conn))[-1]

    @fresh_runtime.remote
    def nap(seconds):
        time.sleep(seconds)
        return "rested"

    @fresh_runtime.remote
    def size(data):
        return len(data)

    busy = nap.remote(0.5)
    time.sleep(0.05)  # the worker is in the nap, not reading its socket
    refs = [size.remote(b"x" * 60_000) for _ in range(200)]  # inline: under 256 KiB
    if getter_leads:
        assert fresh_runtime.get(refs, timeout=30) == [60_000] * 200
    else:
        futures = [ref.future() for ref in refs]
        done, _ = concurrent.futures.wait(futures, timeout=30)
        assert len(done) == 200 and all(f.result() == 60_000 for f in futures)
    assert fresh_runtime.get(busy, timeout=30) == "rested"
    assert asked  # the test made the driver wait for room, or it tested nothing
