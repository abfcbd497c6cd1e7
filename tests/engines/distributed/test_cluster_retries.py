"""A cluster whose scheduler retries lost tasks itself (``allowed-failures`` above 0).

lightwork asks for ``allowed-failures=0`` (each lost worker is one of a task's tries); a
user's scheduler may not have it. ``init`` then warns once, naming the setting, and each
of the scheduler's failures counts ``allowed-failures + 1`` lost workers against the
task's ``max_retries``. The shared cluster's scheduler is switched for this module only.
"""

from __future__ import annotations

import os
import signal

import pytest
from tests.helpers import attempts, count_attempt
from tests import support

import lightwork
from lightwork import exceptions

pytestmark = pytest.mark.lightwork_only
distributed = pytest.importorskip("distributed", reason="the cluster extra: pip install "
                                  "'lightwork[cluster]'")


def _set_allowed_failures(cluster, value: int) -> None:
    with distributed.Client(scheduler_file=cluster.scheduler_file, timeout=30) as client:
        client.run_on_scheduler(lambda dask_scheduler: setattr(
            dask_scheduler, "allowed_failures", value))


@pytest.fixture
def lenient_scheduler(shared_dask_cluster):
    if lightwork.is_initialized():
        lightwork.shutdown()
    _set_allowed_failures(shared_dask_cluster, 1)
    try:
        yield shared_dask_cluster
    finally:
        if lightwork.is_initialized():
            lightwork.shutdown()
        _set_allowed_failures(shared_dask_cluster, 0)


@lightwork.remote
def die(directory):
    count_attempt(directory)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_scheduler_that_retries_lost_tasks_itself_is_warned_about_and_counted(
        lenient_scheduler, tmp_path):
    with pytest.warns(RuntimeWarning, match="allowed-failures=1.*allowed-failures=0"):
        lightwork.init(address=lenient_scheduler.scheduler_file)
    lenient_scheduler.wait_for_workers(support.cluster_client())
    # The scheduler ran it twice (two lost workers) before failing it: that is both of
    # the tries max_retries=1 allows, so lightwork does not submit it again.
    with pytest.raises(exceptions.WorkerCrashedError):
        lightwork.get(die.options(max_retries=1).remote(str(tmp_path)), timeout=50)
    assert len(attempts(str(tmp_path))) == 2
