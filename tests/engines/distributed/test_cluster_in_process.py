"""A Dask worker inside the driver's own process (``LocalCluster(processes=False)``) is
refused with the reason and what to do: at ``init`` when the cluster has one, and in the
task when one joins later. Such a worker would have made a backend of its own, taken the
API and the process's one ``RefCounter`` from the driver's, and the driver's objects
were then never freed in the cluster (``cluster_worker.WORKER_IN_DRIVER``)."""

from __future__ import annotations

import pytest
from tests import support

from lightwork import exceptions

pytestmark = pytest.mark.lightwork_only
distributed = pytest.importorskip("distributed",
                                  reason="the cluster extra: pip install 'lightwork[cluster]'")


def _cluster(workers: int, processes: bool):
    import dask

    # allowed-failures=0, as the README asks (else init warns that a lost worker's tasks
    # are retried behind lightwork's back).
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        return distributed.LocalCluster(n_workers=workers, threads_per_worker=1,
                                        processes=processes, dashboard_address=None)


def test_init_refuses_a_cluster_with_a_worker_in_this_process(fresh_runtime):
    with _cluster(1, processes=False) as cluster, distributed.Client(cluster) as client:
        with pytest.raises(RuntimeError, match="processes of their own") as caught:
            fresh_runtime.init(address=client)
        assert "processes=True" in str(caught.value)
        assert "init() without an address" in str(caught.value)
        assert not fresh_runtime.is_initialized()
        assert client.status == "running"  # the program's client: left for it to close
    # Workers in processes of their own are fine.
    with _cluster(1, processes=True) as cluster, distributed.Client(cluster) as client:
        fresh_runtime.init(address=client)
        square = fresh_runtime.remote(lambda x: x * x)
        assert fresh_runtime.get(square.remote(7), timeout=60) == 49


def test_a_worker_joining_in_this_process_later_fails_its_task_saying_why(fresh_runtime):
    with _cluster(0, processes=False) as cluster, distributed.Client(cluster) as client:
        fresh_runtime.init(address=client)  # no worker yet: nothing to refuse
        backend = support.backend()
        cluster.scale(1)
        client.wait_for_workers(1, timeout=30)
        square = fresh_runtime.remote(lambda x: x * x)
        with pytest.raises(exceptions.RuntimeSystemError, match="processes of their own"):
            fresh_runtime.get(square.remote(3), timeout=30)
        # The driver's backend still serves the program (the worker did not take it).
        assert support.backend() is backend and backend.in_driver
