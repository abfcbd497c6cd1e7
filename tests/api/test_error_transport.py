"""User exceptions reach the caller whole, even when they cannot be rebuilt simply
(issue 12, item 2), and remote tracebacks show the user's frames, not lightwork's
(item 5).

An exception whose ``__init__`` takes two or more required arguments used to arrive as a
``TypeError`` from the unpickler, with the message and the remote traceback lost.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from tests import support

import lightwork as ray
import lightwork.exceptions as exc

pytestmark = pytest.mark.usefixtures("two_cpus")

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


def test_called_process_error_from_check_true_is_rebuilt():
    with pytest.raises(subprocess.CalledProcessError) as info:
        ray.get(run_failing_command.remote(), timeout=30)
    error = info.value
    assert isinstance(error, exc.RayTaskError)
    assert error.returncode == 3
    assert "returned non-zero exit status 3" in str(error)
    _assert_user_traceback(error, "run_failing_command")


@pytest.mark.lightwork_only
def test_exception_with_two_required_args_is_rebuilt_with_its_attributes():
    """Stricter than Ray on purpose: Ray 2.60 raises UnserializableException here."""
    with pytest.raises(TwoArgs) as info:
        ray.get(raise_two_args.remote(), timeout=30)
    error = info.value
    assert isinstance(error, exc.RayTaskError)
    assert (error.code, error.detail) == (7, "disk full")
    assert "code 7: disk full" in str(error)
    _assert_user_traceback(error, "raise_two_args")


@pytest.mark.lightwork_only
def test_exception_that_cannot_be_pickled_keeps_type_name_message_and_traceback():
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
    _assert_user_traceback(error, "raise_holds_lock")


@pytest.mark.lightwork_only
def test_exception_that_cannot_be_rebuilt_in_the_caller_becomes_unserializable():
    with pytest.raises(exc.UnserializableException) as info:
        ray.get(raise_only_in_workers.remote(), timeout=30)
    error = info.value
    assert error.type_name.endswith("OnlyInWorkers")
    assert error.message == "worker-only failure"
    assert "cannot be rebuilt in the driver" in error.reason
    _assert_user_traceback(error, "raise_only_in_workers")


@ray.remote
class Runner:
    def check(self):
        subprocess.run([sys.executable, "-c", "raise SystemExit(5)"], check=True)

    def two(self):
        raise TwoArgs(1, "actor")

    def ping(self):
        return "alive"


def test_actor_method_raising_called_process_error():
    runner = Runner.remote()
    with pytest.raises(subprocess.CalledProcessError) as info:
        ray.get(runner.check.remote(), timeout=30)
    assert info.value.returncode == 5
    _assert_user_traceback(info.value, "check")
    assert ray.get(runner.ping.remote(), timeout=30) == "alive"


@pytest.mark.lightwork_only
def test_actor_method_raising_a_two_argument_exception():
    """Stricter than Ray on purpose: Ray 2.60 raises UnserializableException here."""
    runner = Runner.remote()
    with pytest.raises(TwoArgs) as info:
        ray.get(runner.two.remote(), timeout=30)
    assert info.value.code == 1
    assert ray.get(runner.ping.remote(), timeout=30) == "alive"


@pytest.mark.lightwork_only
def test_actor_method_with_unpicklable_exception():
    @ray.remote
    class Locker:
        def fail(self):
            raise HoldsLock("from an actor")

    with pytest.raises(exc.UnserializableException) as info:
        ray.get(Locker.remote().fail.remote(), timeout=30)
    assert info.value.message == "from an actor"
    assert "Locker.fail" in str(info.value)


def test_nested_called_process_error_reaches_the_driver():
    @ray.remote
    def parent():
        return ray.get(run_failing_command.remote())

    with pytest.raises(subprocess.CalledProcessError) as info:
        ray.get(parent.remote(), timeout=30)
    assert info.value.returncode == 3
    assert "parent" in str(info.value)


@pytest.mark.lightwork_only
def test_nested_task_errors_are_rebuilt_through_the_parent():
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
def test_nested_unpicklable_error_reaches_the_driver_with_its_name():
    @ray.remote
    def parent():
        return ray.get(raise_holds_lock.remote())

    with pytest.raises(exc.UnserializableException) as info:
        ray.get(parent.remote(), timeout=30)
    assert info.value.type_name.endswith("HoldsLock")
    assert "lock-holding failure" in str(info.value)


def test_chained_exception_traceback_keeps_both_user_frames():
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


def test_runtime_is_healthy_after_the_failures():
    @ray.remote
    def ok():
        return 1

    assert ray.get([ok.remote() for _ in range(4)], timeout=30) == [1] * 4


def test_code_pickled_by_value_keeps_its_file_name():
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
