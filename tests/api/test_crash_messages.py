"""Crash messages give advice that fits the case.

* WorkerCrashedError's "a SIGKILL often means out of memory" hint appears only when the
  worker was killed by SIGKILL;
* an actor that died although it had ``max_restarts`` set is not told to set it.

The wording is lightwork's (Ray's messages differ), so the module is lightwork-only.
"""

from __future__ import annotations

import os
import signal

import pytest

import lightwork as ray
import lightwork.exceptions as exc

pytestmark = [pytest.mark.usefixtures("two_cpus"), pytest.mark.lightwork_only]

OOM_HINT = "out of memory"


@ray.remote(max_retries=0)
def die_by(how):
    if how == "exit":
        os._exit(3)
    os.kill(os.getpid(), getattr(signal, how))


def _crash_message(how: str) -> str:
    with pytest.raises(exc.WorkerCrashedError) as info:
        ray.get(die_by.remote(how), timeout=30)
    return str(info.value)


def test_sigkill_crash_mentions_memory():
    message = _crash_message("SIGKILL")
    assert "SIGKILL" in message
    assert OOM_HINT in message


@pytest.mark.parametrize("how", ["exit", "SIGTERM", "SIGSEGV"])
def test_other_crashes_do_not_mention_memory(how):
    message = _crash_message(how)
    assert "die_by" in message
    assert OOM_HINT not in message
    assert "SIGKILL" not in message


@ray.remote
class Fragile:
    def crash(self):
        os._exit(1)

    def ping(self):
        return "pong"


def test_actor_without_max_restarts_is_told_about_it():
    actor = Fragile.remote()
    assert ray.get(actor.ping.remote(), timeout=30) == "pong"
    with pytest.raises(exc.ActorDiedError) as info:
        ray.get(actor.crash.remote(), timeout=30)
    assert "set max_restarts" in str(info.value)


def test_actor_that_used_up_its_restarts_is_not_told_to_set_max_restarts():
    actor = Fragile.options(max_restarts=1).remote()
    with pytest.raises(exc.ActorDiedError) as first:
        ray.get(actor.crash.remote(), timeout=30)  # dies, restarts; the call is not retried
    message = str(first.value)
    assert "restarted" in message and "max_task_retries" in message
    assert "set max_restarts" not in message
    assert ray.get(actor.ping.remote(), timeout=30) == "pong"  # the restarted actor
    with pytest.raises(exc.ActorDiedError) as second:
        ray.get(actor.crash.remote(), timeout=30)  # dies for good
    with pytest.raises(exc.ActorDiedError) as later:
        ray.get(actor.ping.remote(), timeout=30)
    for error in (second.value, later.value):
        message = str(error)
        assert "set max_restarts" not in message
        assert "max_restarts=1" in message and "restarted 1 time" in message


def test_killed_actor_is_not_told_to_set_max_restarts():
    actor = Fragile.options(max_restarts=2).remote()
    assert ray.get(actor.ping.remote(), timeout=30) == "pong"
    ray.kill(actor)
    with pytest.raises(exc.ActorDiedError) as info:
        ray.get(actor.ping.remote(), timeout=30)
    message = str(info.value)
    assert "kill()" in message
    assert "max_restarts" not in message
