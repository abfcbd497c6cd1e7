"""kill() wins whatever state the actor is in.

Each test holds the actor at one point of its life with a gate the test controls (a file
the actor waits for, or the node's lock, which keeps the I/O thread from learning the
new process's pid), kills it there, and checks the whole contract: every pending and
later call raises ActorDiedError naming kill, the state API says DEAD with the cause, the
process is gone, and a name is free again. With ``no_restart=False`` and
``max_restarts``, kill restarts the actor as Ray does.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from tests.helpers import process_running, wait_for_file, wait_until
from tests import support

# The contract is Ray's (kill wins, calls fail with ActorDiedError), but these tests read
# lightwork's state rows (state, death_cause, worker of the actor) and hold the node's lock.
pytestmark = pytest.mark.lightwork_only

import lightwork as ray
from lightwork import exceptions as exc
from lightwork import state


@pytest.fixture(scope="module", autouse=True)
def runtime():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, resources={"slot": 1})
    yield
    ray.shutdown()


def _node():

    return support.driver_node()


def _row(handle):
    rows = [r for r in state.list_actors() if r["actor_id"] == handle._actor_id]
    assert len(rows) == 1, rows
    return rows[0]


def _actor_workers(handle):
    return [w for w in state.list_workers() if w["actor_id"] == handle._actor_id]




def _assert_killed(handle, pending=(), pid=None):
    """The whole contract of a kill with no restart."""
    for ref in pending:
        with pytest.raises(exc.ActorDiedError, match=r"kill\(\)"):
            ray.get(ref, timeout=10)
    with pytest.raises(exc.ActorDiedError, match=r"kill\(\)"):
        ray.get(handle.ping.remote(), timeout=10)
    row = _row(handle)
    assert row["state"] == "DEAD"
    assert "kill()" in row["death_cause"]
    if pid is not None:
        wait_until(lambda: not process_running(pid), timeout=10, message=f"actor pid {pid} to exit")
    wait_until(lambda: not _actor_workers(handle), timeout=10,
               message="the actor's worker to be gone")


class _Gated:
    def __init__(self, gate_dir: str = "", hold_init: bool = False):
        self.gate_dir = gate_dir
        if hold_init:
            open(os.path.join(gate_dir, "init-entered"), "w").close()
            wait_for_file(os.path.join(gate_dir, "init-release"), limit=30)

    def ping(self):
        return os.getpid()

    def hold(self):
        open(os.path.join(self.gate_dir, "call-entered"), "w").close()
        wait_for_file(os.path.join(self.gate_dir, "call-release"), limit=30)
        return "released"


Gated = ray.remote(_Gated)


def test_kill_right_after_remote_while_the_process_is_being_forked():
    node = _node()
    # Holding the node's lock keeps the I/O thread from reading the fork server's reply:
    # the actor's process exists (or is being forked) but its pid is not known yet.
    with node.lock:
        actor = Gated.remote()
        pending = [actor.ping.remote() for _ in range(3)]
        ray.kill(actor)
        assert _row(actor)["state"] == "DEAD"
    _assert_killed(actor, pending)


def test_kill_while_waiting_for_placement(tmp_path):
    holder = Gated.options(resources={"slot": 1}).remote(str(tmp_path))
    ray.get(holder.ping.remote(), timeout=20)
    waiting = Gated.options(resources={"slot": 1}).remote(str(tmp_path))
    pending = [waiting.ping.remote() for _ in range(2)]
    assert _row(waiting)["state"] == "PENDING_CREATION"
    ray.kill(waiting)
    _assert_killed(waiting, pending)
    ray.kill(holder)
    # The slot is free again: a new actor needing it is placed.
    again = Gated.options(resources={"slot": 1}).remote(str(tmp_path))
    assert ray.get(again.ping.remote(), timeout=20)
    ray.kill(again)


def test_kill_while_the_constructor_runs(tmp_path):
    actor = Gated.remote(str(tmp_path), hold_init=True)
    pending = [actor.ping.remote() for _ in range(2)]
    assert wait_for_file(str(tmp_path / "init-entered"), limit=20)
    pid = wait_until(lambda: _row(actor)["pid"], message="the actor's pid")
    assert _row(actor)["state"] == "STARTING"
    ray.kill(actor)
    _assert_killed(actor, pending, pid)


def test_kill_an_idle_actor_frees_its_name():
    actor = Gated.options(name="kill-me").remote()
    pid = ray.get(actor.ping.remote(), timeout=20)
    ray.kill(actor)
    _assert_killed(actor, (), pid)
    with pytest.raises(ValueError):
        ray.get_actor("kill-me")
    again = Gated.options(name="kill-me").remote()
    assert ray.get(again.ping.remote(), timeout=20) != pid
    ray.kill(again)


Threaded = ray.remote(max_concurrency=3)(_Gated)


@ray.remote
class Async:
    def __init__(self, gate_dir: str):
        self.gate_dir = gate_dir

    async def ping(self):
        return os.getpid()

    async def hold(self):
        open(os.path.join(self.gate_dir, "call-entered"), "w").close()  # noqa: ASYNC230
        while not os.path.exists(os.path.join(self.gate_dir, "call-release")):
            await asyncio.sleep(0.01)
        return "released"


@pytest.mark.parametrize("kind", ["sync", "threaded", "async"])
def test_kill_a_busy_actor_fails_the_running_and_queued_calls(tmp_path, kind):
    cls = {"sync": Gated, "threaded": Threaded, "async": Async}[kind]
    actor = cls.remote(str(tmp_path))
    pid = ray.get(actor.ping.remote(), timeout=20)
    running = actor.hold.remote()
    assert wait_for_file(str(tmp_path / "call-entered"), limit=20)
    queued = [actor.hold.remote(), actor.ping.remote()]
    ray.kill(actor)
    open(tmp_path / "call-release", "w").close()  # too late: the process is gone
    _assert_killed(actor, [running, *queued], pid)


def test_kill_with_no_restart_false_restarts_as_ray_does(tmp_path):
    actor = Gated.options(max_restarts=1).remote(str(tmp_path))
    first_pid = ray.get(actor.ping.remote(), timeout=20)
    running = actor.hold.remote()
    assert wait_for_file(str(tmp_path / "call-entered"), limit=20)
    ray.kill(actor, no_restart=False)
    # The call it was running dies with the process (max_task_retries=0) ...
    with pytest.raises(exc.ActorDiedError, match="kill"):
        ray.get(running, timeout=10)
    # ... and the actor comes back in a new process.
    second_pid = ray.get(actor.ping.remote(), timeout=20)
    assert second_pid != first_pid
    wait_until(lambda: not process_running(first_pid), message="the first process to exit")
    row = _row(actor)
    assert (row["state"], row["restarts"]) == ("ALIVE", 1)
    # max_restarts is used up: the next kill(no_restart=False) ends it for good.
    ray.kill(actor, no_restart=False)
    _assert_killed(actor, (), second_pid)


def test_kill_with_no_restart_true_ends_a_restartable_actor():
    actor = Gated.options(max_restarts=-1).remote()
    pid = ray.get(actor.ping.remote(), timeout=20)
    ray.kill(actor)  # no_restart=True is the default, as in Ray
    _assert_killed(actor, (), pid)


def test_kill_is_idempotent_and_checks_its_argument():
    actor = Gated.remote()
    ray.get(actor.ping.remote(), timeout=20)
    ray.kill(actor)
    ray.kill(actor)  # a dead actor: nothing to do, no error (as in Ray)
    with pytest.raises(TypeError, match="actor handle"):
        ray.kill("not a handle")


def test_a_call_in_flight_when_kill_lands_never_hangs(tmp_path):
    # Many calls in flight at once, killed mid-stream: each ends with a value or the
    # kill, none hangs.
    actor = Gated.remote(str(tmp_path))
    ray.get(actor.ping.remote(), timeout=20)
    refs = [actor.ping.remote() for _ in range(200)]
    ray.kill(actor)
    for ref in refs:
        try:
            ray.get(ref, timeout=10)
        except exc.ActorDiedError as error:
            assert "kill()" in str(error)
