"""Small results sent by the worker straight to the driver (``engines/distributed/replies``).

The first tests drive the listener and the sender alone, in this process (no cluster):
a reply is taken only from a worker that knows the session's key, only for a task the
driver awaits, and a driver that cannot be reached costs the worker nothing but the
reply. The rest run on the shared cluster and check what the program sees: a small
result comes by the reply, a large one through the scheduler as before, a reply that
came stays the object's value when its worker is lost (the driver owns it, as in Ray),
and a driver the workers cannot reach still gets every result.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest
from tests import support

import lightwork

pytestmark = pytest.mark.lightwork_only
pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")

from lightwork.engines.distributed import replies  # noqa: E402


class _Pending:
    """A stand-in for a distributed future that never finishes."""

    def done(self) -> bool:
        return False

    def add_done_callback(self, callback) -> None:
        pass


@pytest.fixture
def listener():
    made = replies.Replies(None, "127.0.0.1", 1024)
    try:
        yield made
    finally:
        made.close()


def test_a_reply_from_a_worker_with_the_key_is_taken(listener):
    listener.expect(7)
    assert replies.send_reply(listener.reply_to, 7, {"value": 1}, 10)
    assert listener.take([7], [_Pending()], time.monotonic() + 10) == {0: {"value": 1}}
    assert listener.came(7) and listener.received == 1


def test_a_reply_for_a_task_not_awaited_is_dropped(listener):
    listener.expect(8)
    assert replies.send_reply(listener.reply_to, 9, "stray", 5)  # sent, then dropped
    assert replies.send_reply(listener.reply_to, 8, "mine", 4)
    assert listener.take([8], [_Pending()], time.monotonic() + 10) == {0: "mine"}
    assert not listener.came(9) and listener.received == 1


def test_a_sender_without_the_key_is_refused(listener):
    listener.expect(1)
    host, port, _key, push_max = listener.reply_to
    assert replies.send_reply((host, port, b"not the key", push_max), 1, "forged", 6)
    assert listener.take([1], [_Pending()], time.monotonic() + 0.3) == {}
    assert listener.received == 0


def test_a_large_result_is_not_sent(listener):
    listener.expect(2)
    assert not replies.send_reply(listener.reply_to, 2, b"x" * 2048, 2048)
    # (its size as stored understated: the pickle's own length is checked too)
    assert not replies.send_reply(listener.reply_to, 2, b"x" * 2048, 10)
    assert listener.received == 0


def test_a_take_wakes_when_the_future_is_done_first(listener):
    listener.expect(3)

    class Finishing(_Pending):
        finished = False

        def done(self) -> bool:
            return self.finished

        def add_done_callback(self, callback) -> None:
            def finish() -> None:
                self.finished = True
                callback(self)
            threading.Timer(0.05, finish).start()

    assert listener.take([3], [Finishing()], time.monotonic() + 10) == {}


def test_a_driver_that_cannot_be_reached_costs_only_the_reply(monkeypatch):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once closed
    connects = []
    connect = replies._connect
    monkeypatch.setattr(replies, "_connect",
                        lambda *args: connects.append(args) or connect(*args))
    assert not replies.send_reply(("127.0.0.1", port, b"k" * 32, 1024), 1, "lost", 4)
    assert not replies.send_reply(("127.0.0.1", port, b"k" * 32, 1024), 2, "lost", 4)
    # Refused once, then marked unreachable: the second reply tries no connection.
    assert len(connects) == 1 and replies._senders[("127.0.0.1", port)] is None


# -- on the shared cluster ------------------------------------------------------------------
@lightwork.remote
def pid_and(value):
    return os.getpid(), value


@lightwork.remote
def fail(message):
    raise KeyError(message)


def _listener():
    return support.backend().replies


def test_a_small_result_comes_by_its_reply_and_a_large_one_through_the_scheduler(cluster):
    before = _listener().received
    assert lightwork.get(pid_and.remote(1), timeout=30)[1] == 1
    assert _listener().received == before + 1
    large = b"x" * (replies.PUSH_MAX + 1)
    assert lightwork.get(pid_and.remote(large), timeout=30)[1] == large
    assert _listener().received == before + 1
    with pytest.raises(KeyError, match="sent back"):  # an error comes by its reply too
        lightwork.get(fail.remote("sent back"), timeout=30)
    assert _listener().received == before + 2


def test_a_result_that_came_stays_when_its_worker_is_lost(cluster, wait_until):
    ref = pid_and.options(max_retries=0).remote("kept")
    pid, value = lightwork.get(ref, timeout=30)
    client = support.cluster_client()
    [address] = [a for a, p in client.run(os.getpid).items() if p == pid]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: address not in client.scheduler_info()["workers"] or None,
               timeout=30, message="the scheduler to see the worker gone")
    assert lightwork.get(ref, timeout=30) == (pid, "kept")
    assert lightwork.wait([ref], timeout=10) == ([ref], [])
    client.wait_for_workers(2, timeout=60)  # (its nanny starts it again, for what follows)


def test_results_come_through_the_scheduler_when_the_driver_cannot_be_reached(cluster):
    listener = _listener()
    reply_to = listener.reply_to
    with socket.socket() as closed:
        closed.bind((reply_to[0], 0))
        port = closed.getsockname()[1]
    listener.reply_to = (reply_to[0], port, *reply_to[2:])
    try:
        before = listener.received
        refs = [pid_and.remote(i) for i in range(4)]
        assert [value for _pid, value in lightwork.get(refs, timeout=30)] == [0, 1, 2, 3]
        assert listener.received == before
    finally:
        listener.reply_to = reply_to


def test_the_drivers_stream_to_the_scheduler_waits_at_most_its_own_interval(cluster):
    # (a sync call's release would otherwise hold the next submission for distributed's
    # 10 ms: see the backend's docstring, *Where a call's time goes*)
    from lightwork.engines.distributed.backend import CLIENT_STREAM_INTERVAL_S

    assert support.cluster_client().scheduler_comm.interval == CLIENT_STREAM_INTERVAL_S < 0.01
