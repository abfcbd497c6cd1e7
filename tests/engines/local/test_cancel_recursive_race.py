"""Recursive cancel racing a submission (``Node._cancel_ids``, ``cancelled_parents``).

A running task submits a child just as it is cancelled: the child's submission is still
in the socket when the cancel searches for children, so the search cannot find it. The
driver remembers the cancelled parent until it ends and cancels the child when its
submission arrives. The test makes the race certain by holding the node's lock (the I/O
thread cannot read the submission) while the parent submits and the cancel is made.
"""

from __future__ import annotations

import os
import time

import pytest
from tests.helpers import wait_for_file, wait_until
from tests import support

import lightwork as ray

pytestmark = pytest.mark.lightwork_only


@pytest.fixture(scope="module", autouse=True)
def runtime():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2)
    yield
    ray.shutdown()


@ray.remote
class Box:
    def __init__(self) -> None:
        self.items: list = []

    def add(self, item) -> None:
        self.items.append(item)

    def contents(self) -> list:
        return self.items


@ray.remote
def sleeper() -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "child finished"


@ray.remote
def parent(box, go: str, submitted: str) -> str:
    open(go + ".ready", "w").close()
    wait_for_file(go)
    box.add.remote([sleeper.remote()])
    open(submitted, "w").close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "parent finished"


def test_a_child_submitted_as_its_parent_is_cancelled_is_cancelled_on_arrival(tmp_path):

    node = support.driver_node()
    box = Box.remote()
    assert ray.get(box.contents.remote(), timeout=20) == []
    go, submitted = str(tmp_path / "go"), str(tmp_path / "submitted")
    ref = parent.remote(box, go, submitted)
    assert wait_for_file(go + ".ready", limit=20)
    with node.lock:  # the I/O thread cannot read the child's submission meanwhile
        open(go, "w").close()
        assert wait_for_file(submitted, limit=20)
        ray.cancel(ref)  # the lock is re-entrant: the cancel runs now, finding no child
        assert not support.task_table().nested_live  # the submission is still unread
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(ref, timeout=20)
    # The child's ref went out through an actor call, which the recursive cancel also
    # cancels (as in Ray): read the child's end from the state API instead.
    from lightwork.util.state import list_tasks

    def child_row():
        rows = [row for row in list_tasks() if row["name"].endswith("sleeper")]
        return rows[0] if rows and rows[0]["state"] != "RUNNING" else None

    row = wait_until(child_row, timeout=20, message="the child task to end")
    assert row["state"] == "FAILED", row
    assert "TaskCancelledError" in str(row), row
    assert not support.task_table().cancelled_parents  # forgotten once the parent ended
    assert os.path.exists(submitted)
