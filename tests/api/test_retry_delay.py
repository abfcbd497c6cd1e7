"""The wait before a task is retried for one of its ``retry_exceptions`` (1 s by default,
as in Ray), set by the environment that starts the runtime."""

from __future__ import annotations

import pytest
from tests.helpers import attempts, count_attempt, wait_until

import lightwork
from lightwork import exceptions

pytestmark = pytest.mark.lightwork_only  # the variable and its reading are lightwork's


class Transient(Exception):
    pass


@lightwork.remote(retry_exceptions=[Transient], max_retries=2)
def flaky(directory):
    if count_attempt(directory) < 2:
        raise Transient("not yet")
    return "third time"


def test_a_retry_waits_and_a_cancel_during_the_wait_ends_it(fresh_runtime, monkeypatch,
                                                             tmp_path):
    monkeypatch.setenv("LIGHTWORK_TASK_RETRY_DELAY_MS", "60000")
    lightwork.init(num_cpus=1)
    ref = flaky.remote(str(tmp_path))
    wait_until(lambda: attempts(str(tmp_path)), timeout=20, message="the first attempt")
    ready, _ = lightwork.wait([ref], timeout=0.3)
    assert not ready and len(attempts(str(tmp_path))) == 1  # waiting, not re-run
    lightwork.cancel(ref)
    with pytest.raises(exceptions.TaskCancelledError):
        lightwork.get(ref, timeout=10)
    assert len(attempts(str(tmp_path))) == 1


def test_no_delay_retries_at_once(fresh_runtime, monkeypatch, tmp_path):
    monkeypatch.setenv("LIGHTWORK_TASK_RETRY_DELAY_MS", "0")
    lightwork.init(num_cpus=1)
    assert lightwork.get(flaky.remote(str(tmp_path)), timeout=20) == "third time"
    assert len(attempts(str(tmp_path))) == 3


def test_a_delay_that_is_no_number_is_refused_naming_the_variable(monkeypatch):
    from lightwork.engines.local.worker_requests import retry_delay_from_env

    monkeypatch.delenv("LIGHTWORK_TASK_RETRY_DELAY_MS")
    monkeypatch.setenv("RAY_task_retry_delay_ms", "soon")
    with pytest.raises(ValueError, match="RAY_task_retry_delay_ms='soon'"):
        retry_delay_from_env()
    monkeypatch.setenv("RAY_task_retry_delay_ms", "250")
    assert retry_delay_from_env() == 0.25
    monkeypatch.delenv("RAY_task_retry_delay_ms")
    assert retry_delay_from_env() == 1.0
