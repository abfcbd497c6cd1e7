"""Actors: Ray's actor API, lifetimes and failures."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time

import psutil
import pytest

import lightwork as ray
import lightwork.util  # noqa: F401  (ActorPool)
from lightwork import exceptions as exc
from tests.helpers import still_running, wait_until


@pytest.fixture(scope="module", autouse=True)
def runtime(ray_start):
    yield


@ray.remote
class Counter:
    def __init__(self, start=0):
        self.value = start

    def inc(self, by=1):
        self.value += by
        return self.value

    def read(self):
        return self.value

    def pid(self):
        return os.getpid()

    def fail(self):
        raise KeyError("no such key")

    @ray.method(num_returns=2)
    def pair(self):
        return self.value, -self.value

    def context(self):
        ctx = ray.get_runtime_context()
        return ctx.get_actor_id(), ctx.get_task_id()

    def crash(self):
        os._exit(7)

    def put_something(self):
        return [ray.put(b"owned by the actor" * 50_000)]


def test_calls_from_one_caller_run_in_submission_order():
    counter = Counter.remote(10)
    refs = [counter.inc.remote() for _ in range(200)]
    assert ray.get(refs) == list(range(11, 211))
    assert ray.get(counter.read.remote()) == 210


def test_actor_runs_in_its_own_process():
    a, b = Counter.remote(), Counter.remote()
    pids = ray.get([a.pid.remote(), b.pid.remote()])
    assert len(set(pids)) == 2 and os.getpid() not in pids


def test_method_num_returns_and_ref_arguments():
    counter = Counter.remote(5)
    first, second = counter.pair.remote()
    assert ray.get([first, second]) == [5, -5]
    assert ray.get(counter.inc.remote(ray.put(3))) == 8


def test_method_error_is_users_type_and_actor_survives():
    counter = Counter.remote(1)
    with pytest.raises(KeyError) as info:
        ray.get(counter.fail.remote())
    assert isinstance(info.value, exc.RayTaskError)
    assert "no such key" in str(info.value)
    assert ray.get(counter.inc.remote()) == 2


def test_reading_an_attribute_through_a_handle_says_to_add_a_method():
    counter = Counter.remote()
    with pytest.raises(AttributeError, match="add a method"):
        counter.value


def test_calling_class_or_method_directly_is_typeerror():
    with pytest.raises(TypeError, match=r"\.remote\(\)"):
        Counter()
    with pytest.raises(TypeError, match=r"\.remote\(\)"):
        Counter.remote().inc()


def test_handles_can_be_passed_to_tasks_and_other_actors():
    counter = Counter.remote()

    @ray.remote
    def bump(handle, times):
        return ray.get([handle.inc.remote() for _ in range(times)])[-1]

    @ray.remote
    class Relay:
        def __init__(self, target):
            self.target = target

        def forward(self):
            return ray.get(self.target.inc.remote(100))

    assert ray.get(bump.remote(counter, 5)) == 5
    relay = Relay.remote(counter)
    assert ray.get(relay.forward.remote()) == 105


def test_constructor_error_makes_every_call_raise_actor_died_with_traceback():
    @ray.remote
    class Broken:
        def __init__(self):
            raise ValueError("bad config")

        def work(self):
            return 1

    broken = Broken.remote()
    for _ in range(2):
        with pytest.raises(exc.ActorDiedError, match="bad config"):
            ray.get(broken.work.remote(), timeout=10)


@ray.remote
def _sleeps_then_returns(seconds):
    time.sleep(seconds)
    return seconds


@ray.remote
class GetsInTurn:
    def gets(self, rounds):
        return [ray.get(_sleeps_then_returns.remote(0.2)) for _ in range(rounds)]

    def ping(self):
        return "pong"


def test_a_call_that_arrives_while_a_method_gets_is_kept_for_after_it():
    # The ping reaches the actor's process during one of the method's gets and waits in
    # its inbox; the next get used to bounce it like a task's queue, and the driver
    # ignores a bounced actor call: it was lost and this get hung.
    actor = GetsInTurn.remote()
    assert ray.get(actor.ping.remote(), timeout=20) == "pong"
    busy = actor.gets.remote(3)
    time.sleep(0.1)  # inside the first get (more rounds cover a late start)
    ping = actor.ping.remote()
    assert ray.get(busy, timeout=20) == [0.2, 0.2, 0.2]
    assert ray.get(ping, timeout=20) == "pong"


def test_crash_fails_pending_calls_with_actor_died_naming_the_cause():
    counter = Counter.remote()
    crash = counter.crash.remote()
    with pytest.raises(exc.ActorDiedError, match="exited with code 7"):
        ray.get(crash, timeout=10)
    with pytest.raises(exc.ActorDiedError):
        ray.get(counter.read.remote(), timeout=10)


def test_max_restarts_reruns_init_and_max_task_retries_resends_the_call(tmp_path):
    marker = str(tmp_path / "crashed-once")

    @ray.remote(max_restarts=1, max_task_retries=1)
    class Flaky:
        def __init__(self):
            self.started = time.time()

        def work(self):
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)
            return "done"

    flaky = Flaky.remote()
    assert ray.get(flaky.work.remote(), timeout=20) == "done"


def test_kill_ends_the_actor_and_later_calls_fail():
    counter = Counter.remote()
    pid = ray.get(counter.pid.remote())
    ray.kill(counter)
    wait_until(lambda: not still_running([pid]), timeout=5, message="actor process to die")
    with pytest.raises(exc.ActorDiedError, match="kill"):
        ray.get(counter.read.remote(), timeout=10)


def test_actor_process_ends_when_no_handle_remains():
    counter = Counter.remote()
    pid = ray.get(counter.pid.remote())
    del counter
    wait_until(lambda: not still_running([pid]), timeout=5, message="actor to exit")


def test_a_handle_keeps_its_methods_without_a_cycle_so_the_actor_ends_with_it():
    """``handle.method`` is made once and kept on the handle; it holds the actor's ref,
    not the handle, so dropping the last handle ends the actor by reference counting
    alone (a cycle would wait for the collector, here switched off)."""
    counter = Counter.remote()
    assert counter.inc is counter.inc
    assert ray.get([counter.inc.remote(1), counter.inc.options(name="again").remote(2)],
                   timeout=10) == [1, 3]
    pid = ray.get(counter.pid.remote())
    method = counter.read
    gc.disable()
    try:
        del counter
        assert ray.get(method.remote(), timeout=10) == 3  # a method alone keeps it alive
        del method
        wait_until(lambda: not still_running([pid]), timeout=5, message="actor to exit")
    finally:
        gc.enable()


def test_pending_calls_finish_even_if_the_handle_is_dropped():
    counter = Counter.remote()
    ref = counter.inc.remote(41)
    del counter
    assert ray.get(ref, timeout=10) == 41


def test_named_actor_lookup_and_detached_lifetime():
    original = Counter.options(name="shared-counter").remote(7)
    handle = ray.get_actor("shared-counter")
    assert ray.get(handle.read.remote()) == 7
    with pytest.raises(ValueError, match="no live actor"):
        ray.get_actor("no-such-actor")
    with pytest.raises(ValueError, match="already exists"):
        Counter.options(name="shared-counter").remote()
    same = Counter.options(name="shared-counter", get_if_exists=True).remote()
    assert ray.get(same.read.remote()) == 7
    # Named but not detached: like any actor, it ends when no handle remains.
    pid = ray.get(original.pid.remote())
    del original, handle, same
    wait_until(lambda: not still_running([pid]), timeout=5, message="named actor to exit")
    with pytest.raises(ValueError, match="no live actor"):
        ray.get_actor("shared-counter")

    detached = Counter.options(name="keeper", lifetime="detached").remote(3)
    pid = ray.get(detached.pid.remote())
    del detached
    time.sleep(0.3)
    assert still_running([pid]) == [pid]
    ray.kill(ray.get_actor("keeper"))
    wait_until(lambda: not still_running([pid]), timeout=5, message="detached actor to die")


def test_exit_actor_and_ray_terminate():
    @ray.remote
    class Quitter:
        def pid(self):
            return os.getpid()

        def quit(self):
            ray.actor.exit_actor()

    quitter = Quitter.remote()
    pid = ray.get(quitter.pid.remote())
    with pytest.raises(exc.ActorDiedError):
        ray.get(quitter.quit.remote(), timeout=10)
    wait_until(lambda: not still_running([pid]), timeout=5, message="actor to exit")

    counter = Counter.remote()
    pid = ray.get(counter.pid.remote())
    counter.__ray_terminate__.remote()
    wait_until(lambda: not still_running([pid]), timeout=5, message="terminated actor to exit")
    with pytest.raises(exc.ActorDiedError):
        ray.get(counter.read.remote(), timeout=10)


def test_threaded_actor_runs_calls_concurrently(tmp_path):
    @ray.remote(max_concurrency=3)
    class Barrier:
        def __init__(self):
            self.lock = threading.Lock()
            self.arrived = 0

        def meet(self):
            with self.lock:
                self.arrived += 1
            deadline = time.time() + 10
            while self.arrived < 3 and time.time() < deadline:
                time.sleep(0.01)
            return self.arrived

    barrier = Barrier.remote()
    assert ray.get([barrier.meet.remote() for _ in range(3)], timeout=15) == [3, 3, 3]


def test_async_actor_interleaves_calls_and_awaits_refs():
    @ray.remote
    def slow_value():
        time.sleep(0.1)
        return 5

    @ray.remote
    class AsyncWorker:
        def __init__(self):
            self.event = None

        async def wait_for_peer(self):
            if self.event is None:
                self.event = asyncio.Event()
                await asyncio.wait_for(self.event.wait(), 10)
                return "waited"
            self.event.set()
            return "released"

        async def fetch(self):
            return await slow_value.remote()

    worker = AsyncWorker.remote()
    first = worker.wait_for_peer.remote()
    second = worker.wait_for_peer.remote()
    # Whichever call starts first waits until the other runs: both finish only if the calls
    # interleave. As in Ray, an async actor does not promise which of the two starts first
    # (its calls are handed to the loop from a pool of threads).
    assert sorted(ray.get([first, second], timeout=15)) == ["released", "waited"]
    assert ray.get(worker.fetch.remote(), timeout=15) == 5


def test_runtime_context_inside_actor_names_it():
    counter = Counter.remote()
    actor_id, task_id = ray.get(counter.context.remote())
    assert actor_id == counter._actor_id
    assert task_id is not None


@pytest.mark.lightwork_only  # Ray leaves the actor pending: its calls wait forever
def test_an_infeasible_actor_warns_and_its_calls_raise():
    with pytest.warns(ray.exceptions.UnschedulableRequestWarning, match="64 CPU"):
        counter = Counter.options(num_cpus=64).remote()
    call = counter.inc.remote()
    assert ray.wait([call], timeout=0)[0] == [call]  # ready, with its error
    with pytest.raises(ray.exceptions.ActorUnschedulableError, match="Counter.*64 CPU"):
        ray.get(call, timeout=30)
    with pytest.raises(ValueError, match="max_restarts"):  # invalid input still refused
        Counter.options(max_restarts="3").remote()


def test_actor_pool_map_and_unordered():
    pool = ray.util.ActorPool([Counter.remote(0) for _ in range(3)])
    # Each value goes to a free actor; a Counter returns its running total.
    totals = list(pool.map(lambda actor, v: actor.inc.remote(v), [1, 10, 100, 1000]))
    assert sorted(totals)[0] in (1, 10, 100) and len(totals) == 4
    assert sum(ray.get([a.read.remote() for a in pool._idle])) == 1111
    unordered = list(pool.map_unordered(lambda actor, v: actor.read.remote(), range(6)))
    assert len(unordered) == 6 and sum(set(unordered)) == 1111
    assert pool.has_free()
    idle = pool.pop_idle()
    assert isinstance(idle, ray.ActorHandle)
    pool.push(idle)
    with pytest.raises(ValueError):
        pool.push(idle)
    pool.submit(lambda actor, v: actor.inc.remote(v), 10)
    assert pool.has_next()
    assert pool.get_next(timeout=10) >= 10
    assert not pool.has_next()


def test_many_actors_start_answer_and_leave_nothing_behind():
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    actors = [Counter.remote(i) for i in range(60)]
    assert ray.get([a.read.remote() for a in actors], timeout=60) == list(range(60))
    pids = ray.get([a.pid.remote() for a in actors])
    del actors
    wait_until(lambda: not still_running(pids), timeout=30, message="60 actors to exit")
    # Reaped too (a zombie is gone once the fork server reaps it, a moment later).
    wait_until(lambda: not set(pids) & {p.pid for p in me.children(recursive=True)},
               timeout=30, message="the 60 actors to be reaped")
    after = {p.pid for p in me.children(recursive=True)}
    # Actors may start in the pool's idle workers, which the pool then replaces: at
    # most one pool of fresh task workers, nothing per actor.
    assert len(after - before) <= int(ray.cluster_resources()["CPU"])


# -- __ray_invocation_decorator__ -------------------------------------------------------
def _sends_twice(invoke):
    """An invocation decorator: send the first argument twice, and hand the caller's
    keyword arguments back beside the ref instead of sending them."""
    def invocation(args, kwargs):
        return invoke([args[0], args[0]], {}), kwargs
    return invocation


def _adds_pair(method):
    """The matching execution side: the method runs with the pair's sum."""
    def execute(self, a, b):
        return method(self, a + b)
    execute.__ray_invocation_decorator__ = _sends_twice
    return execute


@ray.remote
class _Decorated:
    @_adds_pair
    def plus_one(self, x):
        return x + 1

    def plain(self, x):
        return x


def test_an_invocation_decorator_rewrites_the_call_on_the_caller_side():
    actor = _Decorated.remote()
    ref, kept = actor.plus_one.remote(5, tag="t")
    assert isinstance(ref, ray.ObjectRef) and kept == {"tag": "t"}
    assert ray.get(ref, timeout=20) == 11  # (5 + 5) + 1
    ref, _ = actor.plus_one.options(name="renamed").remote(2)
    assert ray.get(ref, timeout=20) == 5
    assert ray.get(actor.plain.remote(3), timeout=20) == 3  # other methods untouched


def test_an_invocation_decorator_travels_with_the_handle():
    @ray.remote
    def call_through(handle):
        ref, _ = handle.plus_one.remote(1)
        return ray.get(ref)

    assert ray.get(call_through.remote(_Decorated.remote()), timeout=20) == 3


def test_an_invocation_decorator_on_a_remote_function():
    def doubled(invoke):
        return lambda args, kwargs: invoke([a * 2 for a in args], kwargs)

    def identity(x):
        return x
    identity.__ray_invocation_decorator__ = doubled
    remote_identity = ray.remote(identity)
    assert ray.get(remote_identity.remote(21), timeout=20) == 42
