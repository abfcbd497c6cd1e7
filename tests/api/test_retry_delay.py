"""The wait before a task is retried for one of its ``retry_exceptions`` (1 s by default,
as in Ray), set by the environment of the driver that starts the runtime, on both
backends: the cluster's workers take it from each task."""

from __future__ import annotations

import os

import pytest
from tests.helpers import arrive_and_wait, attempts, count_attempt, wait_until
from tests import support

import lightwork
from lightwork import exceptions

pytestmark = pytest.mark.lightwork_only  # the variable and its reading are lightwork's

BACKENDS = os.environ.get("LIGHTWORK_TEST_BACKENDS", "local,distributed").split(",")


class Transient(Exception):
    pass


@lightwork.remote(retry_exceptions=[Transient], max_retries=2)
def flaky(directory):
    if count_attempt(directory) < 2:
        raise Transient("not yet")
    return "third time"


@lightwork.remote
def together(directory, name, parties):
    return arrive_and_wait(directory, name, parties, limit=10)


@lightwork.remote
def submits_flaky(directory):
    return lightwork.get(flaky.remote(directory))


@pytest.fixture(params=BACKENDS)
def start(request, fresh_runtime, monkeypatch):
    """Starts the runtime under test with ``LIGHTWORK_TASK_RETRY_DELAY_MS`` as given."""
    if request.param == "distributed":
        cluster = request.getfixturevalue("shared_dask_cluster")

    def start_with(delay_ms: str) -> None:
        monkeypatch.setenv("LIGHTWORK_TASK_RETRY_DELAY_MS", delay_ms)
        if request.param == "local":
            lightwork.init(num_cpus=2)
        else:
            lightwork.init(address=cluster.scheduler_file)
            cluster.wait_for_workers(support.cluster_client())

    return start_with


def _attempt_times(directory: str) -> list[float]:
    names = sorted(n for n in os.listdir(directory) if n.startswith("attempt-"))
    return [int(n.split("-")[1]) / 1e9 for n in names]


def test_a_retry_waits_and_a_cancel_during_the_wait_ends_it(start, tmp_path):
    start("60000")
    ref = flaky.remote(str(tmp_path))
    wait_until(lambda: attempts(str(tmp_path)), timeout=20, message="the first attempt")
    ready, _ = lightwork.wait([ref], timeout=0.3)
    assert not ready and len(attempts(str(tmp_path))) == 1  # waiting, not re-run
    lightwork.cancel(ref)
    with pytest.raises(exceptions.TaskCancelledError):
        lightwork.get(ref, timeout=10)
    # The wait ended with the cancel: both slots run new work together again.
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    assert lightwork.get([together.remote(str(barrier), str(i), 2) for i in range(2)],
                         timeout=30) == [True, True]
    assert len(attempts(str(tmp_path))) == 1


def test_the_retries_are_the_delay_apart(start, tmp_path):
    start("400")
    assert lightwork.get(flaky.remote(str(tmp_path)), timeout=30) == "third time"
    times = _attempt_times(str(tmp_path))
    assert len(times) == 3
    assert all(later - earlier >= 0.38 for earlier, later in zip(times, times[1:])), times


def test_a_tasks_own_submissions_wait_the_drivers_delay(start, tmp_path):
    start("400")
    assert lightwork.get(submits_flaky.remote(str(tmp_path)), timeout=30) == "third time"
    times = _attempt_times(str(tmp_path))
    assert len(times) == 3 and times[1] - times[0] >= 0.38, times


def test_no_delay_retries_at_once(start, tmp_path):
    start("0")
    assert lightwork.get(flaky.remote(str(tmp_path)), timeout=20) == "third time"
    assert len(attempts(str(tmp_path))) == 3


def test_a_delay_that_is_no_number_is_refused_naming_the_variable(monkeypatch):
    from lightwork.kernel.environ import retry_delay_from_env

    monkeypatch.delenv("LIGHTWORK_TASK_RETRY_DELAY_MS")
    monkeypatch.setenv("RAY_task_retry_delay_ms", "soon")
    with pytest.raises(ValueError, match="RAY_task_retry_delay_ms='soon'"):
        retry_delay_from_env()
    monkeypatch.setenv("RAY_task_retry_delay_ms", "250")
    assert retry_delay_from_env() == 0.25
    monkeypatch.delenv("RAY_task_retry_delay_ms")
    assert retry_delay_from_env() == 1.0


def test_init_on_a_cluster_refuses_a_bad_delay_before_it_connects(fresh_runtime, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setenv("LIGHTWORK_TASK_RETRY_DELAY_MS", "-5")
    with pytest.raises(ValueError, match="LIGHTWORK_TASK_RETRY_DELAY_MS must be >= 0"):
        lightwork.init(address="tcp://198.18.255.254:8786")  # never reached
    assert not lightwork.is_initialized()
