"""The error model: user exceptions, crashed workers and retries, lost objects,
cancellation, bad input. All on one shared 4-CPU runtime; after the failure tests the
runtime must still run tasks (a failure never takes the runtime down).

Attempts are counted with files in tmp_path (``count_attempt``), so "retried exactly N
times" and "crashed only on the first attempt" are structural facts.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import threading
import time

import cloudpickle
import pytest

import lightwork as ray
import lightwork.exceptions as exc
from tests.helpers import arrive_and_wait, attempts, count_attempt, still_running, wait_for_file
from tests.helpers import wait_until

pytestmark = pytest.mark.usefixtures("ray_start")

RAY_NAMES = [
    "RayError",
    "RayTaskError",
    "RayActorError",
    "ActorDiedError",
    "WorkerCrashedError",
    "ObjectLostError",
    "OwnerDiedError",
    "ObjectReconstructionFailedError",
    "ReferenceCountingAssertionError",
    "GetTimeoutError",
    "TaskCancelledError",
    "RaySystemError",
]


class CustomError(Exception):
    pass


def assert_runtime_healthy():
    @ray.remote
    def ping(x):
        return x

    assert ray.get([ping.remote(i) for i in range(8)], timeout=20) == list(range(8))


# ---- the hierarchy -----------------------------------------------------------------


@pytest.mark.parametrize("name", RAY_NAMES)
def test_ray_exception_names_exist_and_derive_from_rayerror(name):
    cls = getattr(exc, name)
    assert isinstance(cls, type) and issubclass(cls, Exception)
    assert issubclass(cls, exc.RayError)
    assert getattr(ray.exceptions, name) is cls


def test_exception_hierarchy_relations():
    assert issubclass(exc.GetTimeoutError, TimeoutError)
    assert issubclass(exc.ActorDiedError, exc.RayActorError)
    for lost in (
        exc.OwnerDiedError,
        exc.ObjectReconstructionFailedError,
        exc.ReferenceCountingAssertionError,
    ):
        assert issubclass(lost, exc.ObjectLostError)
    assert not issubclass(exc.WorkerCrashedError, exc.RayTaskError)


# ---- the user's code raised --------------------------------------------------------


def test_task_exception_is_both_raytaskerror_and_user_class():
    @ray.remote
    def explode_with_value_error(x):
        raise ValueError(f"bad value {x}")

    with pytest.raises(ValueError) as info:
        ray.get(explode_with_value_error.remote(17))
    err = info.value
    assert isinstance(err, exc.RayTaskError)
    message = str(err)
    assert "bad value 17" in message
    assert "explode_with_value_error" in message
    assert "Traceback" in message or "line " in message  # the remote traceback


def test_task_exception_of_user_defined_class():
    @ray.remote
    def custom():
        raise CustomError("mine")

    with pytest.raises(CustomError, match="mine") as info:
        ray.get(custom.remote())
    assert isinstance(info.value, exc.RayTaskError)


def test_except_clause_of_user_class_catches_only_matching_errors():
    @ray.remote
    def key_error():
        raise KeyError("k")

    ref = key_error.remote()
    with pytest.raises(KeyError):
        try:
            ray.get(ref)
        except ValueError:  # must not match
            pytest.fail("KeyError from a task was caught as ValueError")


def test_failed_dependency_propagates_and_dependent_never_runs(tmp_path):
    @ray.remote
    def fails_upstream():
        raise ValueError("upstream broke")

    @ray.remote
    def downstream(x, marker):
        open(marker, "w").close()
        return x

    marker = str(tmp_path / "downstream-ran")
    ref = downstream.remote(downstream.remote(fails_upstream.remote(), marker), marker)
    with pytest.raises(ValueError, match="upstream broke") as info:
        ray.get(ref, timeout=20)
    assert isinstance(info.value, exc.RayTaskError)
    assert not os.path.exists(marker)


def test_error_from_nested_task_propagates_through_parent():
    @ray.remote
    def inner_fails():
        raise ZeroDivisionError("inner")

    @ray.remote
    def outer():
        return ray.get(inner_fails.remote())

    with pytest.raises(ZeroDivisionError, match="inner"):
        ray.get(outer.remote(), timeout=20)


def test_exception_that_cannot_be_pickled_still_reaches_caller():
    class HoldsLock(Exception):
        def __init__(self, msg):
            super().__init__(msg)
            self.lock = threading.Lock()

    @ray.remote
    def raise_unpicklable():
        raise HoldsLock("lock-holding failure")

    with pytest.raises(Exception) as info:
        ray.get(raise_unpicklable.remote(), timeout=20)
    assert not isinstance(info.value, exc.GetTimeoutError)
    assert "lock-holding failure" in str(info.value)
    assert_runtime_healthy()


def test_application_errors_are_not_retried_by_default(tmp_path):
    @ray.remote(max_retries=3)
    def flaky(d):
        if count_attempt(d) == 0:
            raise ValueError("first attempt fails")
        return "ok"

    with pytest.raises(ValueError):
        ray.get(flaky.remote(str(tmp_path)), timeout=20)
    assert len(attempts(str(tmp_path))) == 1


def test_retry_exceptions_true_retries_application_errors(tmp_path):
    @ray.remote(max_retries=2, retry_exceptions=True)
    def flaky(d):
        if count_attempt(d) < 2:
            raise ValueError("not yet")
        return "third time lucky"

    assert ray.get(flaky.remote(str(tmp_path)), timeout=20) == "third time lucky"
    assert len(attempts(str(tmp_path))) == 3


def test_retry_exceptions_gives_up_after_max_retries(tmp_path):
    @ray.remote(max_retries=1, retry_exceptions=True)
    def always(d):
        count_attempt(d)
        raise ValueError("always")

    with pytest.raises(ValueError):
        ray.get(always.remote(str(tmp_path)), timeout=20)
    assert len(attempts(str(tmp_path))) == 2


def test_retry_exceptions_list_retries_only_listed_types(tmp_path):
    @ray.remote
    def flaky(d, error):
        if count_attempt(d) == 0:
            raise error("first")
        return "retried"

    retrying = flaky.options(max_retries=2, retry_exceptions=[KeyError])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert ray.get(retrying.remote(str(tmp_path / "a"), KeyError), timeout=20) == "retried"
    with pytest.raises(IndexError):
        ray.get(retrying.remote(str(tmp_path / "b"), IndexError), timeout=20)
    assert len(attempts(str(tmp_path / "b"))) == 1


# ---- the runtime broke: crashed workers --------------------------------------------


def test_worker_exit_on_first_attempt_is_retried_on_a_new_worker(tmp_path):
    @ray.remote
    def crash_once(d):
        if count_attempt(d) == 0:
            os._exit(3)
        return os.getpid()

    pid = ray.get(crash_once.remote(str(tmp_path)), timeout=30)
    first, second = attempts(str(tmp_path))
    assert pid == second and first != second
    wait_until(lambda: not still_running([first]), timeout=5, message="crashed pid gone")


def test_worker_sigkill_on_first_attempt_is_retried(tmp_path):
    @ray.remote(max_retries=1)
    def killed_once(d):
        if count_attempt(d) == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return "survived"

    assert ray.get(killed_once.remote(str(tmp_path)), timeout=30) == "survived"
    assert len(attempts(str(tmp_path))) == 2


def test_always_crashing_task_fails_after_default_three_retries(tmp_path):
    @ray.remote
    def always_exit(d):
        count_attempt(d)
        os._exit(3)

    with pytest.raises(exc.WorkerCrashedError):
        ray.get(always_exit.remote(str(tmp_path)), timeout=40)
    assert len(attempts(str(tmp_path))) == 4  # 1 attempt + max_retries=3


def test_crash_with_max_retries_zero_runs_once(tmp_path):
    @ray.remote(max_retries=0)
    def exit_now(d):
        count_attempt(d)
        os._exit(3)

    with pytest.raises(exc.WorkerCrashedError):
        ray.get(exit_now.remote(str(tmp_path)), timeout=20)
    assert len(attempts(str(tmp_path))) == 1


def test_worker_crashed_error_names_exit_code(tmp_path):
    """Spec (issue 2): the message names the exit code. Ray's message does not."""

    @ray.remote(max_retries=0)
    def exit_three():
        os._exit(3)

    with pytest.raises(exc.WorkerCrashedError) as info:
        ray.get(exit_three.remote(), timeout=20)
    message = str(info.value)
    assert re.search(r"exit(ed)?( with)?( code| status)?\D{0,5}3\b", message, re.I), message
    assert "exit_three" in message


def test_worker_crashed_error_names_signal(tmp_path):
    """Spec (issue 2): the message names the signal. Ray's message does not."""

    @ray.remote(max_retries=0)
    def sigkill_self():
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(exc.WorkerCrashedError) as info:
        ray.get(sigkill_self.remote(), timeout=20)
    message = str(info.value)
    assert "SIGKILL" in message or re.search(r"signal\D{0,5}9\b", message, re.I), message


def test_crashed_worker_is_replaced_and_all_slots_still_usable(tmp_path):
    @ray.remote(max_retries=0)
    def die():
        os._exit(3)

    refs = [die.remote() for _ in range(4)]
    for ref in refs:
        with pytest.raises(exc.WorkerCrashedError):
            ray.get(ref, timeout=30)
    meet = ray.remote(arrive_and_wait)
    assert ray.get([meet.remote(str(tmp_path), str(i), 4) for i in range(4)], timeout=30) == [
        True
    ] * 4
    assert ray.cluster_resources()["CPU"] == pytest.approx(4)
    assert_runtime_healthy()


def test_crash_of_a_dependency_fails_the_dependent():
    @ray.remote(max_retries=0)
    def die():
        os._exit(3)

    @ray.remote
    def use(x):
        return x

    with pytest.raises(exc.WorkerCrashedError):
        ray.get(use.remote(die.remote()), timeout=20)


# ---- lost objects ------------------------------------------------------------------


def test_unpickled_ref_to_a_freed_object_raises_reference_counting_error():
    ref = ray.put("short-lived " * 1000)
    blob = cloudpickle.dumps(ref)
    del ref
    gc.collect()
    time.sleep(0.2)
    revived = cloudpickle.loads(blob)
    with pytest.raises(exc.ReferenceCountingAssertionError):
        ray.get(revived, timeout=10)  # Ray: hangs here (GetTimeoutError), unlike the spec


# ---- cancellation ------------------------------------------------------------------


def test_cancel_running_task(tmp_path):
    gate = str(tmp_path / "never-opened")

    @ray.remote
    def blocked(d):
        count_attempt(d)
        return wait_for_file(gate, limit=30)

    ref = blocked.remote(str(tmp_path))
    wait_until(lambda: attempts(str(tmp_path)), timeout=10, message="task to start")
    ray.cancel(ref)
    with pytest.raises(exc.TaskCancelledError):
        ray.get(ref, timeout=15)
    assert len(attempts(str(tmp_path))) == 1  # cancelled tasks are never retried
    assert_runtime_healthy()


def test_force_cancel_running_task_is_not_retried(tmp_path):
    gate = str(tmp_path / "never-opened")

    @ray.remote(max_retries=3)
    def blocked(d):
        count_attempt(d)
        return wait_for_file(gate, limit=30)

    ref = blocked.remote(str(tmp_path))
    wait_until(lambda: attempts(str(tmp_path)), timeout=10, message="task to start")
    ray.cancel(ref, force=True)
    with pytest.raises((exc.TaskCancelledError, exc.WorkerCrashedError)):
        ray.get(ref, timeout=15)
    time.sleep(0.5)
    assert len(attempts(str(tmp_path))) == 1
    assert_runtime_healthy()


def test_cancel_pending_task_never_runs(tmp_path):
    gate = str(tmp_path / "gate")
    work = tmp_path / "work"
    work.mkdir()
    hold = ray.remote(wait_for_file)
    blockers = [hold.remote(gate) for _ in range(4)]  # all 4 CPUs busy

    @ray.remote
    def queued(d):
        count_attempt(d)
        return "ran"

    try:
        ref = queued.remote(str(work))
        ray.cancel(ref)
    finally:
        open(gate, "w").close()
    with pytest.raises(exc.TaskCancelledError):
        ray.get(ref, timeout=15)
    assert ray.get(blockers, timeout=15) == [True] * 4
    assert attempts(str(work)) == []


def test_cancel_finished_task_is_harmless():
    @ray.remote
    def done():
        return "done"

    ref = done.remote()
    assert ray.get(ref) == "done"
    ray.cancel(ref)
    assert ray.get(ref, timeout=5) == "done"


# ---- bad input ---------------------------------------------------------------------


def test_unpicklable_argument_fails_at_remote_naming_the_type():
    @ray.remote
    def take(x):
        return x

    with pytest.raises(Exception) as info:
        take.remote(threading.Lock())
    assert "lock" in str(info.value).lower()
    with pytest.raises(Exception) as info:
        take.remote([1, {"deep": threading.Lock()}])
    assert "lock" in str(info.value).lower()
    assert_runtime_healthy()


def test_unpicklable_result_fails_at_get_naming_the_type():
    @ray.remote
    def give_lock():
        return threading.Lock()

    with pytest.raises(Exception) as info:
        ray.get(give_lock.remote(), timeout=20)
    assert not isinstance(info.value, exc.GetTimeoutError)
    assert "lock" in str(info.value).lower()
    assert_runtime_healthy()


def test_num_returns_mismatch_is_an_error_from_get():
    @ray.remote(num_returns=2)
    def three_values():
        return 1, 2, 3

    @ray.remote(num_returns=2)
    def not_iterable():
        return 5

    for refs in (three_values.remote(), not_iterable.remote()):
        assert len(refs) == 2
        with pytest.raises(Exception) as info:
            ray.get(list(refs), timeout=20)
        assert not isinstance(info.value, exc.GetTimeoutError)
    assert_runtime_healthy()
