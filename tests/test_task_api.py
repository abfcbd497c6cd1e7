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
