"""The hot path's promises that are behaviour, not speed.

Calls to a busy actor wait on the driver and go together in one frame once the actor
sends again (``actors.py``); a worker reads its CPU clock only for functions whose last
run took ``worker.CPU_CLOCK_MIN_S`` or more, leaving 0.0 ("not measured") on the records
of the rest (``worker.py``). Speed itself is never asserted here: ``bench/`` has it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from tests.helpers import wait_for_file, wait_until

import lightwork as ray
from lightwork import diagnostics
from tests import support
from tests.support import driver_node
from lightwork.engines.local import protocol as p
from lightwork.engines.local.objects import PENDING
from lightwork.engines.local.worker import CPU_CLOCK_MIN_S

pytestmark = pytest.mark.lightwork_only  # the runtime's own frames and records


@pytest.fixture(scope="module", autouse=True)
def runtime(two_cpus):
    return two_cpus


@ray.remote
class Gated:
    def hold(self, entered, release):
        open(entered, "w").close()
        return wait_for_file(release, limit=30)

    def echo(self, value):
        return value


def _record(ref):
    node = driver_node()
    with node.lock:
        wanted = node.objects.entries[ref.id].task_id if ref.id in node.objects.entries else None
    for record in diagnostics.task_records(include_unfinished=False):
        if record.task_id == wanted:
            return record
    raise AssertionError(f"no finished record for {ref}")


def test_calls_to_a_busy_actor_go_in_one_frame_and_run_in_order(tmp_path, monkeypatch):
    actor = Gated.remote()
    assert ray.get(actor.echo.remote("up"), timeout=20) == "up"
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    busy = actor.hold.remote(entered, release)
    assert wait_for_file(entered)  # the actor's only slot is taken now
    node = driver_node()
    frames: list[int] = []
    original = node._send

    def counting_send(conn, messages):
        if conn.actor is not None:
            frames.append(sum(1 for m in messages if m[0] == p.TASK))
        original(conn, messages)

    monkeypatch.setattr(node, "_send", counting_send)
    refs = [actor.echo.remote(i) for i in range(50)]
    assert frames == []  # nothing is sent while the actor is busy
    open(release, "w").close()
    assert ray.get(busy, timeout=20) is True
    assert ray.get(refs, timeout=20) == list(range(50))
    assert sum(frames) == 50 and len(frames) == 1, frames


@ray.remote(max_restarts=1, max_task_retries=0)
class Restarting:
    def __init__(self):
        self.started = time.time()

    def hold(self, entered, release):
        open(entered, "w").close()
        return wait_for_file(release, limit=30)

    def pid(self):
        return os.getpid()

    def echo(self, value):
        return value, self.started


def test_calls_queued_on_the_driver_when_the_actor_dies_run_on_its_restart(tmp_path):
    """As in Ray with max_task_retries=0: the call the dead process was running fails;
    calls still queued on the driver (the actor was busy, so none was sent) were never
    attempted, and run on the restarted actor, in order."""
    actor = Restarting.remote()
    first_pid = ray.get(actor.pid.remote(), timeout=20)
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    running = actor.hold.remote(entered, release)
    assert wait_for_file(entered)
    queued = [actor.echo.remote(i) for i in range(5)]
    os.kill(first_pid, signal.SIGKILL)
    with pytest.raises(ray.exceptions.ActorDiedError):
        ray.get(running, timeout=20)
    answers = ray.get(queued, timeout=20)
    assert [value for value, _ in answers] == list(range(5))
    assert len({started for _, started in answers}) == 1  # all on the one restarted actor
    assert ray.get(actor.pid.remote(), timeout=20) != first_pid


def test_a_queued_call_to_a_busy_actor_is_cancelled_before_it_runs(tmp_path):
    actor = Gated.remote()
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    busy = actor.hold.remote(entered, release)
    assert wait_for_file(entered)
    queued = actor.echo.remote("never")
    ray.cancel(queued)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(queued, timeout=20)
    open(release, "w").close()
    assert ray.get(busy, timeout=20) is True
    assert ray.get(actor.echo.remote("after"), timeout=20) == "after"


@ray.remote
def spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return os.getpid()


@ray.remote
def tiny():
    return os.getpid()


def test_the_cpu_clock_is_read_for_long_runs_and_skipped_after_a_tiny_one():
    long_runs = [spin.remote(0.05) for _ in range(2)]
    ray.get(long_runs, timeout=30)
    for ref in long_runs:  # the first is measured (never run before), the next as well
        assert _record(ref).cpu_time >= 0.04
    first = tiny.remote()
    pid = ray.get(first, timeout=20)
    # The next tiny call on the same worker skips the clock: its last run was short.
    for _ in range(20):
        ref = tiny.remote()
        if ray.get(ref, timeout=20) == pid:
            break
    else:
        pytest.skip("no second tiny call landed on the first one's worker")
    record = _record(ref)
    assert record.finished - record.args_loaded < CPU_CLOCK_MIN_S
    assert record.cpu_time == 0.0


@ray.remote
def quick(x):
    return x + 1


@ray.remote
def slow_echo(x, seconds):
    time.sleep(seconds)
    return x


def test_a_muted_io_thread_leaves_the_workers_results_to_the_leader():
    """Muting (one call on the gate, node.py) really keeps the I/O thread from reading
    the workers: a result that has reached the driver's socket stays unread until it is
    unmuted, then arrives."""
    node = driver_node()
    assert ray.get(quick.remote(0), timeout=20) == 1  # a worker is up
    io = support.io_loop()
    assert io.watch_workers(False)
    try:
        ref = quick.remote(1)
        # The leader's own epoll (nobody leads now) sees the result waiting on a socket.
        wait_until(lambda: any(key.data != "wake" for key, _ in io._leader_selector.select(0)),
                   timeout=10, message="the result to reach the driver's socket")
        time.sleep(0.2)  # time the I/O thread would take to read it, were it watching
        with node.lock:
            assert node.objects.entries[ref.id].state == PENDING
    finally:
        assert io.watch_workers(True)
    assert ref.future().result(timeout=20) == 2


@pytest.mark.parametrize("spare", [True, False], ids=["io-thread-muted", "both-watch"])
def test_results_reach_every_waiter_whether_the_io_thread_watches_the_workers_or_not(
        spare, monkeypatch):
    """A leading getter mutes the I/O thread's view of the workers (when the machine has
    cores to spare) and applies every result itself meanwhile; once it stops, the I/O
    thread takes over again (io_loop.py)."""
    import concurrent.futures

    from lightwork.engines.local import io_loop

    monkeypatch.setattr(io_loop, "cores_to_spare", lambda now: spare)
    assert [ray.get(quick.remote(i)) for i in range(50)] == list(range(1, 51))
    # Another thread waits for quick results while the main thread leads a long get.
    slow = slow_echo.remote("slow", 1.0)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        others = pool.submit(lambda: [ray.get(quick.remote(i), timeout=20) for i in range(20)])
        assert ray.get(slow, timeout=20) == "slow"
        assert others.result(timeout=20) == list(range(1, 21))
    # No getter now: a future's result comes through the I/O thread alone.
    future = quick.remote(41).future()
    assert future.result(timeout=20) == 42
    time.sleep(0.1)  # the I/O thread idles; a result must still wake it
    assert slow_echo.remote(7, 0.05).future().result(timeout=20) == 7


def test_one_waiter_is_held_bare_more_go_in_a_list_and_each_leaves_on_its_timeout(tmp_path):
    """A get registers one bound method on every entry it waits for, held without a list
    while it is an entry's only waiter (objects.py): no object per pending entry. A
    second waiter makes a list; a timed-out get or a finished wait takes its own waiter
    away in either form, and every waiter still there is woken."""
    import concurrent.futures

    node = driver_node()
    gate = str(tmp_path / "gate")
    refs = [slow_gated.remote(gate, i) for i in range(3)]

    def waiters_of(ref):
        with node.lock:
            return node.objects.entries[ref.id].waiters

    def as_list(waiters):
        return waiters if isinstance(waiters, list) else [] if waiters is None else [waiters]

    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(refs, timeout=0.05)
    assert [waiters_of(ref) for ref in refs] == [None, None, None]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(ray.get, refs, timeout=20)
        wait_until(lambda: all(waiters_of(ref) is not None for ref in refs), timeout=10,
                   message="the first get to wait")
        held = [waiters_of(ref) for ref in refs]
        assert not isinstance(held[0], list) and all(w is held[0] for w in held)
        second = pool.submit(ray.get, refs[0], timeout=20)
        wait_until(lambda: isinstance(waiters_of(refs[0]), list), timeout=10,
                   message="the second get to wait")
        assert ray.wait(refs, num_returns=1, timeout=0.05) == ([], refs)
        assert as_list(waiters_of(refs[0])) == [held[0], as_list(waiters_of(refs[0]))[1]]
        assert as_list(waiters_of(refs[1])) == [held[1]]  # the wait's own waiter left
        open(gate, "w").close()
        assert first.result(timeout=20) == [0, 1, 2]
        assert second.result(timeout=20) == 0
    assert [waiters_of(ref) for ref in refs] == [None, None, None]


@ray.remote
def slow_gated(gate, value):
    wait_for_file(gate, limit=30)
    return value
