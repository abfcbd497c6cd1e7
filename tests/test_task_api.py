"""Task-side API that Ray programs rely on (issue 12): ``retry_exceptions`` matching an
exception that could not travel as itself, recursive ``cancel``, ``max_calls``, the
``memory`` resource, nested tasks inheriting their parent's ``runtime_env``, and GPU ids
inside placement-group bundles.

Each test passes against Ray too (``LIGHTWORK_TEST_AGAINST_RAY=1``) unless its docstring
says lightwork is stricter there on purpose.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

import lightwork as ray
from helpers import attempts, count_attempt, wait_until


@pytest.fixture(scope="module", autouse=True)
def runtime():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2)
    yield
    ray.shutdown()


# -- retry_exceptions -----------------------------------------------------------------
class TwoArgError(Exception):
    """Its __init__ needs two arguments: pickle's default rebuild (args=(message,)) fails."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}: {detail}")
        self.code = code


class RetryBase(Exception):
    pass


class UnpicklableError(RetryBase):
    """Holds a lock: it can be pickled neither as itself nor as its state."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def _fail_then_succeed(directory: str, failures: int, make_error):
    if count_attempt(directory) < failures:
        raise make_error()
    return "done"


def test_retry_exceptions_retries_an_error_whose_init_takes_two_arguments(tmp_path):
    task = ray.remote(max_retries=3, retry_exceptions=[TwoArgError])(_fail_then_succeed)
    ref = task.remote(str(tmp_path), 2, lambda: TwoArgError(7, "flaky"))
    assert ray.get(ref, timeout=30) == "done"
    assert len(attempts(str(tmp_path))) == 3


def test_retry_exceptions_matches_an_unpicklable_error_by_its_class_hierarchy(tmp_path):
    """The error arrives as UnserializableException; its base class still matches."""
    task = ray.remote(max_retries=3, retry_exceptions=[RetryBase])(_fail_then_succeed)
    ref = task.remote(str(tmp_path), 2, lambda: UnpicklableError("flaky"))
    assert ray.get(ref, timeout=30) == "done"
    assert len(attempts(str(tmp_path))) == 3


def test_retry_exceptions_does_not_retry_an_unpicklable_error_of_another_class(tmp_path):
    task = ray.remote(max_retries=3, retry_exceptions=[TwoArgError])(_fail_then_succeed)
    ref = task.remote(str(tmp_path), 5, lambda: UnpicklableError("not retried"))
    with pytest.raises(Exception, match="not retried") as info:
        ray.get(ref, timeout=30)
    assert isinstance(info.value, ray.exceptions.RayTaskError)
    assert len(attempts(str(tmp_path))) == 1


def test_retry_exceptions_gives_up_after_max_retries_for_an_unpicklable_error(tmp_path):
    task = ray.remote(max_retries=2, retry_exceptions=[UnpicklableError])(_fail_then_succeed)
    ref = task.remote(str(tmp_path), 10, lambda: UnpicklableError("always"))
    with pytest.raises(Exception, match="always"):
        ray.get(ref, timeout=30)
    assert len(attempts(str(tmp_path))) == 3


# -- recursive cancel -----------------------------------------------------------------
@ray.remote
class Box:
    """Collects the refs that nested tasks send out, so the driver can get them."""

    def __init__(self) -> None:
        self.items: list = []

    def add(self, item) -> None:
        self.items.append(item)

    def contents(self) -> list:
        return self.items


@ray.remote
def _nested(box, depth: int, sleep_s: float) -> str:
    """Submit one task of ``depth - 1`` (its ref goes to ``box``), then sleep."""
    if depth > 0:
        box.add.remote([_nested.remote(box, depth - 1, sleep_s)])
    time.sleep(sleep_s)
    return f"finished at depth {depth}"


def _nested_refs(box, count: int) -> list:
    refs = wait_until(lambda: (lambda c: c if len(c) >= count else None)(
        ray.get(box.contents.remote(), timeout=10)), timeout=20, message=f"{count} nested refs")
    return [item[0] for item in refs]


@pytest.mark.parametrize("force", [False, True])
def test_recursive_cancel_cancels_running_and_pending_descendants(force):
    """With 2 CPUs the parent and its child run and the grandchild waits for a slot:
    cancelling the parent cancels both (Ray's default, recursive=True)."""
    box = Box.remote()
    parent = _nested.remote(box, 2, 60.0)
    child, grandchild = _nested_refs(box, 2)
    ray.cancel(parent, force=force)
    for ref in (parent, child, grandchild):
        with pytest.raises((ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError)):
            ray.get(ref, timeout=20)


def test_cancel_with_recursive_false_leaves_children_running():
    box = Box.remote()
    parent = _nested.remote(box, 1, 1.0)
    (child,) = _nested_refs(box, 1)
    ray.cancel(parent, recursive=False)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(parent, timeout=20)
    assert ray.get(child, timeout=20) == "finished at depth 0"


def test_recursive_cancel_of_a_finished_task_leaves_its_children_alone():
    @ray.remote
    def submit_and_return(box):
        box.add.remote([_nested.remote(box, 0, 1.0)])
        return "parent done"

    box = Box.remote()
    parent = submit_and_return.remote(box)
    assert ray.get(parent, timeout=20) == "parent done"
    (child,) = _nested_refs(box, 1)
    ray.cancel(parent)
    assert ray.get(child, timeout=20) == "finished at depth 0"


# -- max_calls --------------------------------------------------------------------------
def _pid_and_square(x: int) -> tuple[int, int]:
    return os.getpid(), x * x


def test_max_calls_replaces_the_worker_after_n_calls():
    """Each worker process runs at most 2 calls of the function, one call at a time."""
    task = ray.remote(max_calls=2, max_retries=0)(_pid_and_square)
    results = [ray.get(task.remote(i), timeout=20) for i in range(8)]
    assert [square for _, square in results] == [i * i for i in range(8)]
    pids = [pid for pid, _ in results]
    assert max(pids.count(pid) for pid in set(pids)) <= 2
    assert len(set(pids)) >= 4
    finished = [pid for pid in set(pids) if pids.count(pid) == 2]
    assert finished  # a worker that ran its 2 calls exits
    wait_until(lambda: not any(_process_alive(pid) for pid in finished), timeout=15,
               message="the retired workers to exit")


def test_max_calls_under_a_burst_keeps_every_result_and_the_limit():
    """Many short calls at once: calls queued on a retiring worker run elsewhere."""
    task = ray.remote(max_calls=3, max_retries=0)(_pid_and_square)
    results = ray.get([task.remote(i) for i in range(60)], timeout=60)
    assert [square for _, square in results] == [i * i for i in range(60)]
    pids = [pid for pid, _ in results]
    assert max(pids.count(pid) for pid in set(pids)) <= 3


def test_max_calls_counts_only_its_own_function():
    limited = ray.remote(max_calls=1)(_pid_and_square)
    free = ray.remote(_pid_and_square)
    free_pids = {ray.get(free.remote(1), timeout=20)[0] for _ in range(6)}
    limited_pids = [ray.get(limited.remote(2), timeout=20)[0] for _ in range(4)]
    assert len(set(limited_pids)) == 4
    assert len(free_pids) < 6  # plain calls keep reusing the pool's processes


def test_max_calls_counts_calls_that_raise():
    def fail_with_pid():
        raise ValueError(f"pid {os.getpid()}")

    task = ray.remote(max_calls=1, max_retries=0)(fail_with_pid)
    pids = set()
    for _ in range(3):
        with pytest.raises(ValueError, match="pid") as info:
            ray.get(task.remote(), timeout=20)
        pids.add(str(info.value).split("pid ")[1].split()[0])
    assert len(pids) == 3


def test_max_calls_cannot_be_set_in_options():
    with pytest.raises(ValueError, match="max_calls"):
        ray.remote(_pid_and_square).options(max_calls=2)


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
