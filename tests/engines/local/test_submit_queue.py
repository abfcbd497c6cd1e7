"""Submissions queued without the node's lock while every worker is busy (node_lock.py).

One worker (``num_cpus=1``) is held by a gated task, so a new task cannot run and its
submission queues it instead of taking the lock. Holding the lock in another thread
makes that observable: a submission that took the lock would wait for it. Whoever takes
the lock next registers the queued tasks before anything else, so every reader (the
state API, ``cancel``, ``get``, the release of a dropped ref) sees them.
"""

from __future__ import annotations

import threading

import pytest
from tests.helpers import returns_within, wait_for_file, wait_until

import lightwork as ray
from tests import support
from tests.support import driver_node
from lightwork import state

pytestmark = pytest.mark.lightwork_only  # the runtime's own lock and tables


@ray.remote
def hold(entered, release):
    open(entered, "w").close()
    return wait_for_file(release, limit=30)


@ray.remote
def inc(x):
    return x + 1


@pytest.fixture
def busy_worker(fresh_runtime, tmp_path):
    """A 1-CPU runtime whose only worker runs a task until ``release`` exists."""
    fresh_runtime.init(num_cpus=1)
    assert ray.get(inc.remote(0), timeout=20) == 1  # the worker is up
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    running = hold.remote(entered, release)
    assert wait_for_file(entered)
    yield running, release
    open(release, "w").close()


class LockHeld:
    """Holds the node's lock in a thread of its own until ``let_go``."""

    def __init__(self) -> None:
        self._taken = threading.Event()
        self._let_go = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)
        self._thread.start()
        assert self._taken.wait(10)

    def _hold(self) -> None:
        with driver_node().lock:
            self._taken.set()
            self._let_go.wait(30)

    def let_go(self) -> None:
        self._let_go.set()
        self._thread.join(10)


def _submit_in_a_thread(submit, limit: float = 10.0):
    """``submit()``'s result, failing the test if it blocks longer than ``limit``."""
    return returns_within(
        submit, limit, "the submission waited for the node's lock while every worker was busy")


def _submit_while_the_lock_is_held(submit):
    """``submit()``'s result, made while another thread holds the node's lock (so it
    must not wait for it), and how many tasks were queued when it returned."""
    lock = LockHeld()
    try:
        result = _submit_in_a_thread(submit)
        return result, len(driver_node().lock.queued)
    finally:
        lock.let_go()


def test_a_task_that_cannot_run_yet_is_submitted_without_waiting_for_the_lock(busy_worker):
    running, release = busy_worker
    refs, queued = _submit_while_the_lock_is_held(lambda: [inc.remote(i) for i in range(20)])
    assert queued == 20
    # The next taker of the lock registered them: the state API lists them, pending.
    listed = {row["task_id"]: row["state"] for row in state.list_tasks(limit=10_000)}
    ids = {ref.task_id() for ref in refs}
    assert ids <= set(listed)
    assert {listed[task_id] for task_id in ids} <= {"PENDING_NODE_ASSIGNMENT",
                                                    "SUBMITTED_TO_WORKER"}
    assert not driver_node().lock.queued
    open(release, "w").close()
    assert ray.get(running, timeout=20) is True
    assert ray.get(refs, timeout=20) == list(range(1, 21))


def test_queued_tasks_run_in_the_order_they_were_submitted(busy_worker):
    running, release = busy_worker
    first, _ = _submit_while_the_lock_is_held(lambda: [inc.remote(i) for i in range(10)])
    # Submitted with the lock free (registered at once, behind the queued ones).
    later = [inc.remote(i) for i in range(10, 20)]
    open(release, "w").close()
    assert ray.get(first + later, timeout=20) == list(range(1, 21))
    from lightwork import diagnostics

    by_task = {record.task_id: record for record in diagnostics.task_records()}
    dispatched = [by_task[ref.task_id()].dispatched for ref in first + later]
    assert dispatched == sorted(dispatched)


def test_a_dropped_ref_of_a_queued_task_is_freed_after_it_is_registered(busy_worker):
    running, release = busy_worker
    node = driver_node()
    object_id, queued = _submit_while_the_lock_is_held(
        lambda: inc.remote(1).id)  # the ref dies at once
    assert queued == 1
    open(release, "w").close()
    assert ray.get(running, timeout=20) is True

    def freed() -> bool:
        with node.lock:
            return object_id not in node.objects.entries

    # Registered first, then released: a release applied before the registration would
    # have found no entry and left the registered one held for ever.
    wait_until(freed, timeout=10, message="the dropped ref's object to be freed")


def test_a_queued_task_can_be_cancelled_before_it_runs(busy_worker):
    running, release = busy_worker
    ref, queued = _submit_while_the_lock_is_held(lambda: inc.remote(1))
    assert queued == 1  # queued, so the cancel meets it as the lock's next taker registers it
    ray.cancel(ref)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(ref, timeout=20)
    open(release, "w").close()
    assert ray.get(running, timeout=20) is True
    assert ray.get(inc.remote(5), timeout=20) == 6


def test_tasks_queued_when_the_runtime_shuts_down_end_with_it(busy_worker):
    running, release = busy_worker
    refs, queued = _submit_while_the_lock_is_held(lambda: [inc.remote(i) for i in range(5)])
    assert queued == 5
    node = driver_node()
    ray.shutdown()
    assert node.closed and not node.lock.queued
    with pytest.raises(ray.exceptions.SessionEndedError):
        ray.get(refs, timeout=5)


def test_a_task_queued_while_a_result_frees_the_worker_is_sent_by_that_poll(busy_worker):
    """The race the queue must not lose (node_lock.py): the I/O thread holds the lock,
    applying the result that frees the only worker, when a submission looks for an idle
    worker, finds none, and queues. The dispatch that ends the same poll registers it."""
    running, release = busy_worker
    node = driver_node()
    submitted: list = []
    left_queued: list[int] = []
    io = support.io_loop()
    original_read, original_dispatch = io.read_worker, node._dispatch

    def submit_before_reading(conn):
        if not submitted and threading.current_thread() is io.thread:
            submitted.append(_submit_in_a_thread(lambda: inc.remote(1)))
        original_read(conn)

    def dispatch_then_look():
        original_dispatch()
        if submitted and not left_queued:
            left_queued.append(len(node.lock.queued))

    io.read_worker, node._dispatch = submit_before_reading, dispatch_then_look
    try:
        open(release, "w").close()
        wait_until(lambda: left_queued, timeout=10, message="the I/O thread's poll")
    finally:
        del io.read_worker, node._dispatch
    assert left_queued == [0]
    assert ray.get(running, timeout=20) is True
    assert ray.get(submitted[0], timeout=20) == 2


def test_a_task_submitted_while_a_worker_idles_is_sent_at_once(fresh_runtime):
    """The other side of the queue: with a worker free, submit registers and sends the
    task itself, so a synchronous call never waits for the I/O thread."""
    fresh_runtime.init(num_cpus=1)
    assert ray.get(inc.remote(0), timeout=20) == 1
    node = driver_node()
    wait_until(lambda: node.scheduler.idle, timeout=10, message="the worker to idle")
    senders: list[int] = []
    original = node._send_assignments

    def recording(assignments):
        senders.extend(threading.get_ident() for _ in assignments)
        original(assignments)

    node._send_assignments = recording
    try:
        ref = inc.remote(41)
        # Sent by the submitting call itself, before it returned.
        assert senders == [threading.get_ident()] and not node.lock.queued
        assert ray.get(ref, timeout=20) == 42
    finally:
        del node._send_assignments


@ray.remote
class Gated:
    def __init__(self):
        self.seen = []

    def hold(self, entered, release):
        open(entered, "w").close()
        return wait_for_file(release, limit=30)

    def echo(self, value):
        self.seen.append(value)
        return value

    def order(self):
        return self.seen


def test_calls_to_a_busy_actor_are_queued_without_the_lock_and_run_in_order(fresh_runtime,
                                                                              tmp_path):
    fresh_runtime.init(num_cpus=1)
    actor = Gated.remote()
    assert ray.get(actor.echo.remote("up"), timeout=20) == "up"
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    running = actor.hold.remote(entered, release)
    assert wait_for_file(entered)  # the actor's only slot is taken
    queued, count = _submit_while_the_lock_is_held(
        lambda: [actor.echo.remote(i) for i in range(10)])
    assert count == 10
    later = [actor.echo.remote(i) for i in range(10, 15)]  # with the lock free
    open(release, "w").close()
    assert ray.get(running, timeout=20) is True
    assert ray.get(queued + later, timeout=20) == list(range(15))
    assert ray.get(actor.order.remote(), timeout=20) == ["up", *range(15)]  # run in order


def test_threads_submitting_at_once_while_workers_churn_lose_nothing(fresh_runtime):
    """Four threads submit bursts (queued or sent at once, as the workers free up), drop
    some refs unread and read the rest; every result is right and every dropped one is
    freed: no task lost between the queue and the tables, none registered twice."""
    fresh_runtime.init(num_cpus=2)
    node = driver_node()
    errors: list[BaseException] = []

    def submitter(seed: int) -> None:
        try:
            for burst in range(15):
                refs = [inc.remote(seed * 10_000 + burst * 100 + i) for i in range(60)]
                kept = refs[::2]  # the others are dropped unread
                del refs
                assert ray.get(kept, timeout=30) == [
                    seed * 10_000 + burst * 100 + i + 1 for i in range(0, 60, 2)]
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=submitter, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a submitter hung"
    assert not errors, errors

    def all_freed() -> bool:
        with node.lock:
            return not node.objects.entries and not node.tasks and not node.lock.queued

    wait_until(all_freed, timeout=10, message="every object and task to be freed")


def _count_passes(node) -> list[int]:
    """Count ``node``'s submitter passes (the instance's attribute shadows the method)."""
    passes = [0]
    io = support.io_loop()
    original = io.submitter_pass

    def counted() -> None:
        passes[0] += 1
        original()

    io.submitter_pass = counted
    return passes


def test_a_loop_submitting_past_busy_workers_reads_and_dispatches_itself(fresh_runtime):
    # Every SUBMITTER_PASS_EVERY queued submissions the submitting thread reads the
    # workers and dispatches (IOLoop.submitter_pass), the I/O thread muted.
    from lightwork.engines.local.driver_calls import SUBMITTER_PASS_EVERY

    fresh_runtime.init(num_cpus=2)
    node = driver_node()
    assert ray.get([inc.remote(i) for i in range(4)], timeout=20) == [1, 2, 3, 4]
    passes = _count_passes(node)
    refs = [inc.remote(i) for i in range(20 * SUBMITTER_PASS_EVERY)]
    assert passes[0] >= 1
    assert ray.get(refs, timeout=60) == [i + 1 for i in range(20 * SUBMITTER_PASS_EVERY)]
    assert not support.io_loop()._submitter_muted  # the getter took the gate over, unmuted


def test_results_are_read_when_a_submitting_loop_stops_without_a_get(fresh_runtime):
    # The loop muted the I/O thread's watch of the workers; once it stops (here: it
    # sleeps, no get), the I/O thread watches them again and applies every result.
    fresh_runtime.init(num_cpus=2)
    node = driver_node()
    assert ray.get([inc.remote(i) for i in range(4)], timeout=20) == [1, 2, 3, 4]
    passes = _count_passes(node)
    refs = [inc.remote(i) for i in range(3_000)]
    assert passes[0] >= 1

    def all_ended() -> bool:
        with node.lock:
            return (not node.tasks and not node.lock.queued
                    and not support.io_loop()._submitter_muted)

    wait_until(all_ended, timeout=20, message="every task to end without a get")
    with node.lock:
        assert all(node.objects.entries[ref.id].state == 1 for ref in refs)  # READY
    assert ray.get(refs[-1], timeout=5) == 3_000


def test_a_getter_in_another_thread_is_answered_while_a_loop_submits(fresh_runtime):
    # One thread submits long bursts (its passes mute the I/O thread) while another
    # makes synchronous calls: the second's results come from the first's passes or
    # the I/O thread, never left unread.
    fresh_runtime.init(num_cpus=2)
    assert ray.get(inc.remote(0), timeout=20) == 1
    stop = threading.Event()
    errors: list[BaseException] = []
    synchronous: list[int] = []

    def caller() -> None:
        try:
            while not stop.is_set():
                value = len(synchronous)
                synchronous.append(ray.get(inc.remote(value), timeout=10) - value)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    try:
        for burst in range(6):
            refs = [inc.remote(burst * 1_000 + i) for i in range(800)]
            assert ray.get(refs, timeout=60) == [burst * 1_000 + i + 1 for i in range(800)]
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive() and not errors, errors
    assert synchronous and set(synchronous) == {1}
