"""Actor backpressure: ``max_pending_calls`` refuses call N+1 at once, and accepts calls
again as earlier ones complete. The actor blocks on a gate file, so "N pending" is exact.
"""

from __future__ import annotations

import os
import time

import pytest

import lightwork as ray
import lightwork.exceptions as exc
from tests.helpers import call_bounded, wait_until

pytestmark = pytest.mark.usefixtures("ray_start")


@ray.remote
class Gate:
    def wait_for(self, path: str) -> str:
        while not os.path.exists(path):
            time.sleep(0.005)
        return path

    def ping(self) -> str:
        return "pong"


def test_call_beyond_max_pending_calls_is_refused_at_once(tmp_path):
    actor = Gate.options(max_pending_calls=3).remote()
    gates = [str(tmp_path / f"gate{i}") for i in range(3)]
    refs = [actor.wait_for.remote(gate) for gate in gates]
    # Refused, not queued: the gates stay shut until the refusal, so a call that waited
    # for a free slot would block until call_bounded's hang limit and fail the test.
    with pytest.raises(exc.PendingCallsLimitExceeded, match=r"Gate.*max_pending_calls=3"):
        call_bounded(actor.ping.remote, what="call 4 with max_pending_calls=3")
    open(gates[0], "w").close()
    assert ray.get(refs[0], timeout=10) == gates[0]
    ping = actor.ping.remote()  # one slot free again
    with pytest.raises(exc.PendingCallsLimitExceeded):
        actor.ping.remote()
    for gate in gates[1:]:
        open(gate, "w").close()
    assert ray.get(refs[1:] + [ping], timeout=10) == gates[1:] + ["pong"]
    assert ray.get([actor.ping.remote() for _ in range(3)], timeout=10) == ["pong"] * 3
    ray.kill(actor)


def test_without_a_limit_calls_queue_freely():
    actor = Gate.remote()
    assert ray.get([actor.ping.remote() for _ in range(500)], timeout=20) == ["pong"] * 500
    ray.kill(actor)


@pytest.mark.lightwork_only
def test_call_from_a_task_beyond_the_limit_fails_its_result(tmp_path):
    actor = Gate.options(max_pending_calls=1).remote()
    gate = str(tmp_path / "gate")
    first = actor.wait_for.remote(gate)

    @ray.remote
    def call_again(handle) -> str:
        try:
            return ray.get(handle.ping.remote(), timeout=10)
        except exc.PendingCallsLimitExceeded as err:
            return f"refused: {err}"

    assert ray.get(call_again.remote(actor), timeout=20).startswith("refused: actor Gate")
    open(gate, "w").close()
    assert ray.get(first, timeout=10) == gate
    wait_until(lambda: ray.get(call_again.remote(actor), timeout=20) == "pong", timeout=10,
               message="the actor to accept calls again")
    ray.kill(actor)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3"])
def test_max_pending_calls_is_validated(bad):
    with pytest.raises(ValueError, match="max_pending_calls must be a positive int"):
        Gate.options(max_pending_calls=bad).remote()
