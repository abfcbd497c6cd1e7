"""A get inside an actor that can never return raises, naming the fix.

A method of a ``max_concurrency=1`` actor that gets a call on its own handle waits for a
call queued behind itself: Ray hangs there silently. lightwork raises
``ActorDeadlockError`` at the get (the actor, both methods, the call site, and the
fixes), reports it in the state API, and leaves the actor working. Threaded and async
actors may wait on their own calls while a slot is free; that must keep working.
"""

from __future__ import annotations

import io

import pytest
from tests.helpers import arrive_and_wait, wait_for_file, wait_until

import lightwork as ray
from lightwork import exceptions as exc
from lightwork import state
from lightwork.cli import print_status

pytestmark = pytest.mark.lightwork_only  # Ray hangs on these programs


@pytest.fixture(scope="module", autouse=True)
def runtime(two_cpus):
    return two_cpus


@ray.remote
class Single:
    def inner(self):
        return "inner"

    def outer(self, me):
        return ray.get(me.inner.remote())  # the line the error must name

    def outer_with_timeout(self, me):
        return ray.get(me.inner.remote(), timeout=0.2)

    def direct(self):
        return self.inner()


def _row(handle):
    [row] = [r for r in state.list_actors() if r["actor_id"] == handle._actor_id]
    return row


def test_a_sync_actor_getting_its_own_call_raises_instead_of_hanging():
    actor = Single.remote()
    with pytest.raises(exc.ActorDeadlockError) as info:
        ray.get(actor.outer.remote(actor), timeout=30)
    message = str(info.value)
    for part in ("Single.outer", "Single.inner", "Single", "test_actor_self_wait.py",
                 "max_concurrency", "async", "directly"):
        assert part in message, (part, message)
    # The actor goes on: the awaited call ran after the caller returned, and new calls run.
    assert ray.get(actor.direct.remote(), timeout=20) == "inner"
    row = _row(actor)
    assert row["state"] == "ALIVE" and row["deadlocks"] == 1
    [report] = [r for r in ray.state.status()["actor_deadlocks"]
                if r["actor_id"] == int(actor._actor_id, 16)]
    assert report["method"] == "Single.outer" and report["waits_for"] == ["Single.inner"]
    assert "test_actor_self_wait.py" in report["callsite"]
    text = io.StringIO()
    print_status(ray.state.status(), text)
    [line] = [line for line in text.getvalue().splitlines() if line.startswith("deadlocks")]
    assert "Single.outer waiting for Single.inner at" in line


def test_a_get_with_a_timeout_times_out_instead():
    actor = Single.remote()
    with pytest.raises(exc.GetTimeoutError):
        ray.get(actor.outer_with_timeout.remote(actor), timeout=30)
    assert _row(actor)["deadlocks"] == 0


@ray.remote(max_concurrency=2)
class Threaded:
    def inner(self):
        return "inner"

    def outer(self, me, barrier_dir, name, parties):
        assert arrive_and_wait(barrier_dir, name, parties)
        return ray.get(me.inner.remote())


@ray.remote
def answer():
    return "task"


@ray.remote
class Waiter:
    def inner(self):
        return "inner"

    def waits(self, me, num_returns, with_task):
        refs = [me.inner.remote()] + ([answer.remote()] if with_task else [])
        ready, _ = ray.wait(refs, num_returns=num_returns)  # the line the error must name
        return ray.get(ready)

    def waits_with_timeout(self, me):
        ready, not_ready = ray.wait([me.inner.remote()], timeout=0.2)
        return len(ready), len(not_ready)



@ray.remote
class AsyncWaiter:
    async def inner(self):
        return "inner"

    async def blocks_its_loop(self, me):
        ready, _ = ray.wait([me.inner.remote()])
        return ray.get(ready)


def test_a_wait_on_its_own_call_raises_like_get():
    actor = Waiter.remote()
    with pytest.raises(exc.ActorDeadlockError) as info:
        ray.get(actor.waits.remote(actor, 1, False), timeout=30)
    message = str(info.value)
    for part in ("wait()", "Waiter.waits", "Waiter.inner", "test_actor_self_wait.py",
                 "max_concurrency", "async", "directly", "timeout"):
        assert part in message, (part, message)
    assert _row(actor)["deadlocks"] == 1
    [report] = [r for r in ray.state.status()["actor_deadlocks"]
                if r["actor_id"] == int(actor._actor_id, 16)]
    assert report["method"] == "Waiter.waits" and report["waits_for"] == ["Waiter.inner"]
    # The actor goes on.
    assert ray.get(actor.inner.remote(), timeout=20) == "inner"


def test_a_wait_that_other_objects_can_satisfy_is_not_a_deadlock():
    actor = Waiter.remote()
    # num_returns=1 of [own call, a task]: the task's result is enough.
    assert ray.get(actor.waits.remote(actor, 1, True), timeout=30) == ["task"]
    # num_returns=2 needs the own call too: that one can never start.
    with pytest.raises(exc.ActorDeadlockError, match="wait"):
        ray.get(actor.waits.remote(actor, 2, True), timeout=30)


def test_a_wait_with_a_timeout_never_counts():
    actor = Waiter.remote()
    assert ray.get(actor.waits_with_timeout.remote(actor), timeout=30) == (0, 1)
    assert _row(actor)["deadlocks"] == 0


def test_an_async_actor_blocking_its_loop_in_wait_raises():
    actor = AsyncWaiter.remote()
    with pytest.raises(exc.ActorDeadlockError, match="event loop"):
        ray.get(actor.blocks_its_loop.remote(actor), timeout=30)


def test_a_threaded_actor_with_a_free_slot_may_get_its_own_call(tmp_path):
    actor = Threaded.remote()
    assert ray.get(actor.outer.remote(actor, str(tmp_path), "only", 1), timeout=30) == "inner"


def test_a_threaded_actor_whose_slots_all_wait_on_its_own_calls_raises_once(tmp_path):
    actor = Threaded.remote()
    # Both slots enter outer (the barrier proves it) before either submits inner.
    refs = [actor.outer.remote(actor, str(tmp_path), f"caller-{i}", 2) for i in range(2)]
    outcomes = []
    for ref in refs:
        try:
            outcomes.append(ray.get(ref, timeout=30))
        except exc.ActorDeadlockError as error:
            assert "slot" in str(error)
            outcomes.append("deadlock")
    # The second get closed the cycle and raised; that freed a slot for the first one.
    assert sorted(outcomes) == ["deadlock", "inner"]


@ray.remote
class Async:
    async def inner(self):
        return "inner"

    async def blocks_its_loop(self, me):
        return ray.get(me.inner.remote())

    async def awaits(self, me):
        return await me.inner.remote()


def test_an_async_actor_blocking_its_loop_on_its_own_coroutine_raises():
    actor = Async.remote()
    assert ray.get(actor.awaits.remote(actor), timeout=30) == "inner"
    with pytest.raises(exc.ActorDeadlockError, match="event loop"):
        ray.get(actor.blocks_its_loop.remote(actor), timeout=30)
    assert ray.get(actor.awaits.remote(actor), timeout=30) == "inner"


@ray.remote
class Ping:
    def ask(self, other, me):
        return ray.get(other.answer.remote(me))

    def answer(self, asker):
        return ray.get(asker.final.remote())

    def final(self):
        return "final"


def test_a_cycle_through_two_actors_raises():
    a, b = Ping.remote(), Ping.remote()
    with pytest.raises(exc.ActorDeadlockError, match="cycle"):
        ray.get(a.ask.remote(b, a), timeout=30)
    assert ray.get(a.final.remote(), timeout=20) == "final"
    # No cycle: a asks b, which asks a third actor.
    c = Ping.remote()
    assert ray.get(a.ask.remote(b, c), timeout=30) == "final"


@ray.remote
class Held:
    def hold(self, entered, release):
        open(entered, "w").close()
        wait_for_file(release, limit=30)
        return "held"

    def ping(self):
        return "pong"


def test_list_actors_counts_one_running_call_and_the_rest_queued(tmp_path):
    actor = Held.remote()
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    first = actor.hold.remote(entered, release)
    queued = [actor.ping.remote() for _ in range(2)]
    assert wait_for_file(entered, limit=20)
    wait_until(lambda: _row(actor)["queued"] == 2, message="two queued calls")
    row = _row(actor)
    assert (row["running"], row["queued"], row["methods_running"]) == (1, 2, ["hold"])
    open(release, "w").close()
    assert ray.get([first, *queued], timeout=20) == ["held", "pong", "pong"]
