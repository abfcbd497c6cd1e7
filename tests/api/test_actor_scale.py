"""Many actors, and actors that ask for more than the machine has.

* 200 actors on a 2-CPU runtime start, each answers from a process of its own, and
  everything goes away: the processes when the handles are dropped, then after
  ``shutdown()`` no actor process, no ``/dev/shm/lightwork-*`` directory of the session,
  and the driver's file descriptors back to where they were.
* A request that can never be met warns at creation; its calls raise, naming it.
* An actor holding both CPUs keeps a second such actor from being placed until the
  first is killed: checked by when the second one's constructor ran.

Each test starts its own 2-CPU runtime (``fresh_runtime``), like a user's laptop.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest

import lightwork as ray
from tests.conftest import AGAINST_RAY
from tests.helpers import descendants, shm_dirs, still_running, wait_until

MANY = 200
# Ray needs minutes to start 200 worker processes on 2 cores; lightwork forks them.
DEADLINE = 300.0 if AGAINST_RAY else 15.0


@ray.remote
class Member:
    def __init__(self):
        self.born = time.time()

    def pid(self):
        return os.getpid()

    def born_at(self):
        return self.born


def session_shm_dirs(before: set[str]) -> set[str]:
    """``/dev/shm/lightwork-*`` directories of this driver's sessions since ``before``
    (the name ends with the driver's pid; other test runs on the machine have theirs)."""
    return {d for d in shm_dirs() - before if d.endswith(f"_{os.getpid()}")}


def test_200_actors_start_answer_and_leave_nothing_behind(fresh_runtime):
    me = psutil.Process()
    fds_before = me.num_fds()
    shm_before = shm_dirs()
    procs_before = set(descendants())

    ray.init(num_cpus=2)
    if not AGAINST_RAY:
        assert session_shm_dirs(shm_before), "no /dev/shm/lightwork-* for the session"
    actors = [Member.remote() for _ in range(MANY)]
    pids = ray.get([a.pid.remote() for a in actors], timeout=DEADLINE)
    # Every actor answered from a process of its own (placed with 1 CPU, holding 0).
    assert len(set(pids)) == MANY and os.getpid() not in pids
    assert set(pids) <= set(descendants()) - procs_before or AGAINST_RAY

    del actors
    wait_until(
        lambda: not still_running(pids),
        timeout=DEADLINE,
        interval=0.1,
        message=f"the actor processes to exit once no handle remains "
        f"({len(still_running(pids))} of {MANY} still running)",
    )
    ray.shutdown()

    assert not still_running(pids)
    wait_until(
        lambda: not still_running(set(descendants()) - procs_before),
        timeout=10,
        message="every process of the session to exit after shutdown",
    )
    if not AGAINST_RAY:
        assert not session_shm_dirs(shm_before), session_shm_dirs(shm_before)
    # Sockets and pipes to 200 actors were closed, not leaked (a little slack for
    # descriptors the interpreter or pytest opens lazily).
    wait_until(
        lambda: me.num_fds() <= fds_before + 3,
        timeout=5,
        message=f"the driver's fds to return to {fds_before} (now {me.num_fds()})",
    )


@pytest.mark.lightwork_only  # Ray leaves the actor pending: its calls wait forever
def test_a_request_that_can_never_be_met_fails_its_calls(fresh_runtime):
    ray.init(num_cpus=2)
    with pytest.warns(ray.exceptions.UnschedulableRequestWarning):
        member = Member.options(num_cpus=1000).remote()
    with pytest.raises(ray.exceptions.ActorUnschedulableError) as info:
        ray.get(member.pid.remote(), timeout=30)
    message = str(info.value)
    # The message names what was asked for and what the runtime has.
    assert "1000 CPU" in message and "2 CPU in total" in message, message
    # The failed request left the runtime usable.
    assert ray.get(Member.remote().pid.remote(), timeout=30) != os.getpid()


def test_an_actor_holding_both_cpus_blocks_the_next_until_killed(fresh_runtime):
    ray.init(num_cpus=2)
    Big = Member.options(num_cpus=2)
    first = Big.remote()
    ray.get(first.pid.remote(), timeout=30)

    second = Big.remote()  # returns at once; the actor waits for 2 free CPUs
    born = second.born_at.remote()
    ready, _ = ray.wait([born], timeout=1.0)
    assert not ready, "a second 2-CPU actor was placed while the first held both CPUs"

    killed_at = time.time()
    ray.kill(first)
    # The second actor's constructor ran only after the kill freed the CPUs.
    assert ray.get(born, timeout=30) >= killed_at
