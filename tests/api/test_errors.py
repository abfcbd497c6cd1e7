"""The error model: user exceptions, crashed workers and retries, lost objects,
cancellation, bad input; and the transport of user exceptions: they reach the caller
whole, even when they cannot be rebuilt simply, and remote tracebacks
show the user's frames, not lightwork's (item 5).

The error-model tests share one 4-CPU runtime (``ray_start``); after the failure tests
the runtime must still run tasks (a failure never takes the runtime down). The transport
tests (the class at the end) run on a 2-CPU runtime of their own (``transport_runtime``).

Attempts are counted with files in tmp_path (``count_attempt``), so "retried exactly N
times" and "crashed only on the first attempt" are structural facts. An exception whose
``__init__`` takes two or more required arguments used to arrive as a ``TypeError`` from
the unpickler, with the message and the remote traceback lost.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time

import cloudpickle
import pytest

import lightwork as ray
import lightwork.exceptions as exc
from tests import support
from tests.helpers import arrive_and_wait, attempts, count_attempt, still_running, wait_for_file
from tests.helpers import wait_until

pytestmark = pytest.mark.usefixtures("ray_start")


@pytest.fixture(scope="module")
def transport_runtime(ray_start):
    """A 2-CPU runtime in place of the shared one. It asks for ``ray_start`` (which every
    test of the module has) so that one is set up first and never replaces this one."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2)
    yield
    ray.shutdown()


ON_TWO_CPUS = pytest.mark.usefixtures("transport_runtime")

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
    """Spec: the message names the exit code. Ray's message does not."""

    @ray.remote(max_retries=0)
    def exit_three():
        os._exit(3)

    with pytest.raises(exc.WorkerCrashedError) as info:
        ray.get(exit_three.remote(), timeout=20)
    message = str(info.value)
    assert re.search(r"exit(ed)?( with)?( code| status)?\D{0,5}3\b", message, re.I), message
    assert "exit_three" in message


def test_worker_crashed_error_names_signal(tmp_path):
    """Spec: the message names the signal. Ray's message does not."""

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


def test_a_ref_rebuilt_from_the_id_of_a_freed_object_raises_reference_counting_error():
    ref = ray.put("short-lived " * 1000)
    blob = cloudpickle.dumps(ref)  # pickled by the program: kept until shutdown, as in Ray
    hex_id = ray.put("freed").hex()  # only its id kept: freed with its last ref
    del ref
    gc.collect()
    time.sleep(0.2)
    assert ray.get(cloudpickle.loads(blob), timeout=10) == "short-lived " * 1000
    with pytest.raises(exc.ReferenceCountingAssertionError, match="from_hex"):
        ray.get(ray.ObjectRef.from_hex(hex_id), timeout=10)  # Ray: hangs here


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


# ---- the transport of user exceptions (on ``transport_runtime``) --------------------

RUNTIME_DIR = os.path.dirname(os.path.abspath(ray.__file__)) + os.sep


class TwoArgs(Exception):
    """Its args are (message,), so calling the class with its args fails."""

    def __init__(self, code, detail):
        super().__init__(f"code {code}: {detail}")
        self.code = code
        self.detail = detail


class HoldsLock(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


class OnlyInWorkers(Exception):
    """Pickles and loads in a worker, but cannot be rebuilt in the driver."""

    def __reduce__(self):
        return (_rebuild_only_in_workers, (str(self),))


def _rebuild_only_in_workers(message):
    if support.current_worker() is None:
        raise RuntimeError("this exception cannot be rebuilt in the driver")
    return OnlyInWorkers(message)


@ray.remote(max_retries=0)
def run_failing_command():
    subprocess.run([sys.executable, "-c", "raise SystemExit(3)"], check=True,
                   capture_output=True)


@ray.remote
def raise_two_args():
    raise TwoArgs(7, "disk full")


@ray.remote
def raise_holds_lock():
    raise HoldsLock("lock-holding failure")


@ray.remote
def raise_only_in_workers():
    raise OnlyInWorkers("worker-only failure")


def _assert_user_traceback(error: BaseException, function: str) -> None:
    """The message names the task and shows the user's frame, none of the runtime's."""
    message = str(error)
    assert function in message
    assert __file__ in message  # the user's frame, with its file
    assert RUNTIME_DIR not in message, message  # no worker loop, no serialization


@ray.remote
class Runner:
    def check(self):
        subprocess.run([sys.executable, "-c", "raise SystemExit(5)"], check=True)

    def two(self):
        raise TwoArgs(1, "actor")

    def ping(self):
        return "alive"


class TestExceptionsThatCannotBeRebuiltSimply:
    """User exceptions reach the caller whole, and tracebacks show the user's frames."""

    pytestmark = ON_TWO_CPUS

    def test_called_process_error_from_check_true_is_rebuilt(self):
        with pytest.raises(subprocess.CalledProcessError) as info:
            ray.get(run_failing_command.remote(), timeout=30)
        error = info.value
        assert isinstance(error, exc.RayTaskError)
        assert error.returncode == 3
        assert "returned non-zero exit status 3" in str(error)
        _assert_user_traceback(error, "run_failing_command")

    @pytest.mark.lightwork_only
    def test_exception_with_two_required_args_is_rebuilt_with_its_attributes(self):
        """Stricter than Ray on purpose: Ray 2.60 raises UnserializableException here."""
        with pytest.raises(TwoArgs) as info:
            ray.get(raise_two_args.remote(), timeout=30)
        error = info.value
        assert isinstance(error, exc.RayTaskError)
        assert (error.code, error.detail) == (7, "disk full")
        assert "code 7: disk full" in str(error)
        _assert_user_traceback(error, "raise_two_args")

    @pytest.mark.lightwork_only
    def test_exception_that_cannot_be_pickled_keeps_type_name_message_and_traceback(self):
        with pytest.raises(exc.UnserializableException) as info:
            ray.get(raise_holds_lock.remote(), timeout=30)
        error = info.value
        assert isinstance(error, exc.RayTaskError)
        assert error.type_name.endswith("HoldsLock")
        assert error.message == "lock-holding failure"
        assert "lock" in error.reason
        message = str(error)
        assert "HoldsLock: lock-holding failure" in message
        assert "UnserializableException" in message  # says how to catch it
        # The stand-in's own message says why the original did not travel, as Ray's does.
        assert "isn't serializable" in str(error.cause) and "lock" in str(error.cause)
        _assert_user_traceback(error, "raise_holds_lock")

    @pytest.mark.lightwork_only
    def test_exception_that_cannot_be_rebuilt_in_the_caller_becomes_unserializable(self):
        with pytest.raises(exc.UnserializableException) as info:
            ray.get(raise_only_in_workers.remote(), timeout=30)
        error = info.value
        assert error.type_name.endswith("OnlyInWorkers")
        assert error.message == "worker-only failure"
        assert "cannot be rebuilt in the driver" in error.reason
        _assert_user_traceback(error, "raise_only_in_workers")

    def test_actor_method_raising_called_process_error(self):
        runner = Runner.remote()
        with pytest.raises(subprocess.CalledProcessError) as info:
            ray.get(runner.check.remote(), timeout=30)
        assert info.value.returncode == 5
        _assert_user_traceback(info.value, "check")
        assert ray.get(runner.ping.remote(), timeout=30) == "alive"

    @pytest.mark.lightwork_only
    def test_actor_method_raising_a_two_argument_exception(self):
        """Stricter than Ray on purpose: Ray 2.60 raises UnserializableException here."""
        runner = Runner.remote()
        with pytest.raises(TwoArgs) as info:
            ray.get(runner.two.remote(), timeout=30)
        assert info.value.code == 1
        assert ray.get(runner.ping.remote(), timeout=30) == "alive"

    @pytest.mark.lightwork_only
    def test_actor_method_with_unpicklable_exception(self):
        @ray.remote
        class Locker:
            def fail(self):
                raise HoldsLock("from an actor")

        with pytest.raises(exc.UnserializableException) as info:
            ray.get(Locker.remote().fail.remote(), timeout=30)
        assert info.value.message == "from an actor"
        assert "Locker.fail" in str(info.value)

    def test_nested_called_process_error_reaches_the_driver(self):
        @ray.remote
        def parent():
            return ray.get(run_failing_command.remote())

        with pytest.raises(subprocess.CalledProcessError) as info:
            ray.get(parent.remote(), timeout=30)
        assert info.value.returncode == 3
        assert "parent" in str(info.value)

    @pytest.mark.lightwork_only
    def test_nested_task_errors_are_rebuilt_through_the_parent(self):
        """Stricter than Ray on purpose: Ray 2.60 raises UnserializableException here."""
        @ray.remote
        def parent():
            return ray.get(raise_two_args.remote())

        with pytest.raises(TwoArgs) as info:
            ray.get(parent.remote(), timeout=30)
        assert info.value.detail == "disk full"
        message = str(info.value)
        assert "parent" in message and "raise_two_args" in message

    @pytest.mark.lightwork_only
    def test_nested_unpicklable_error_reaches_the_driver_with_its_name(self):
        @ray.remote
        def parent():
            return ray.get(raise_holds_lock.remote())

        with pytest.raises(exc.UnserializableException) as info:
            ray.get(parent.remote(), timeout=30)
        assert info.value.type_name.endswith("HoldsLock")
        assert "lock-holding failure" in str(info.value)

    def test_chained_exception_traceback_keeps_both_user_frames(self):
        @ray.remote
        def chained():
            try:
                {}["missing"]
            except KeyError as error:
                raise ValueError("lookup failed") from error

        with pytest.raises(ValueError) as info:
            ray.get(chained.remote(), timeout=30)
        message = str(info.value)
        assert "KeyError" in message and "lookup failed" in message
        assert RUNTIME_DIR not in message

    def test_a_nested_gets_traceback_shows_only_the_users_frames(self):
        """A task that gets a failed task's result: the error it passes on names the
        user's two functions, and none of lightwork's frames (the API's ``get`` among
        them) between them."""
        @ray.remote
        def inner():
            raise ValueError("inner failed")

        @ray.remote
        def outer():
            return ray.get(inner.remote())

        with pytest.raises(ValueError) as info:
            ray.get(outer.remote(), timeout=30)
        message = str(info.value)
        assert "in outer" in message and "in inner" in message
        assert RUNTIME_DIR not in message

    def test_runtime_is_healthy_after_the_failures(self):
        @ray.remote
        def ok():
            return 1

        assert ray.get([ok.remote() for _ in range(4)], timeout=30) == [1] * 4

    def test_code_pickled_by_value_keeps_its_file_name(self):
        """cloudpickle >= 3.1.3 writes "<dynamic-code>" as the file of code it pickles by value,
        which would take the user's file and source lines out of remote tracebacks."""
        import pickle

        from lightwork.kernel import pickler

        def nested():
            return lambda: 1 / 0

        loaded = pickle.loads(pickler.dumps(nested))
        assert loaded.__code__.co_filename == __file__
        with pytest.raises(ZeroDivisionError) as info:
            loaded()()
        assert str(info.traceback[-1].path) == __file__


class TwoFields(Exception):
    def __init__(self, first, second):
        super().__init__(first, second)
        self.first, self.second = first, second


def test_a_task_error_built_by_hand_pickles_as_both_of_its_types():
    """Ray's ``RayTaskError(function_name=, traceback_str=, cause=)`` and its
    ``make_dual_exception_instance()``: the dual error survives pickling with the cause's
    fields, so it can be sent on."""
    error = exc.RayTaskError(function_name="load", traceback_str="Traceback: ...",
                             cause=TwoFields("a", 2))
    dual = error.make_dual_exception_instance()
    back = cloudpickle.loads(cloudpickle.dumps(dual))
    assert isinstance(back, exc.RayTaskError) and isinstance(back, TwoFields)
    assert (back.first, back.second) == ("a", 2)
    assert "load" in str(back)


class Sealed(Exception):
    def __init_subclass__(cls, **kwargs):
        raise TypeError("Sealed cannot be subclassed")


@ray.remote
def raise_sealed():
    raise Sealed("from the task")


def test_an_exception_class_that_cannot_be_subclassed_comes_back_as_the_task_error(caplog):
    """The error cannot also be a ``Sealed``: it is the TaskError, with the exception as its
    cause, and a warning says why ``except Sealed`` does not catch it."""
    with caplog.at_level("WARNING", logger="lightwork.exceptions"):
        with pytest.raises(exc.TaskError) as info:
            ray.get(raise_sealed.remote(), timeout=30)
    assert not isinstance(info.value, Sealed)
    assert isinstance(info.value.cause, Sealed) and str(info.value.cause) == "from the task"
    assert "Sealed cannot be subclassed" in caplog.text and ".cause" in caplog.text
    # Ray's wording, which a program may match
    assert ("This exception is raised as RayTaskError only. You can use "
            "`ray_task_error.cause` to access the user exception.") in caplog.text
