"""The run record's typed questions (``kernel.run.RunRecord``) on every backend.

The tools read a run only through its record, so each question must have an answer on
each engine: the embedded runtime's from its own parts, the cluster's its own way or a
plain "none" (no worker processes here, no worker queues to look into).
"""

# ruff: noqa: F811 - the tests take the imported ``backend`` fixture by its name

from __future__ import annotations

import os

import pytest
from tests import support
from tests.helpers import wait_for_file
from tests.conformance.test_conformance import _apply_gaps, backend  # noqa: F401

import lightwork
from lightwork import exceptions
from lightwork.diagnostics import profile_tasks


@lightwork.remote
def parked(path: str) -> str:
    wait_for_file(path)
    return "released"


@lightwork.remote
def square(x: int) -> int:
    return x * x


def test_the_record_tells_which_objects_are_still_pending(backend, tmp_path, wait_until):
    gate = str(tmp_path / "gate")
    done = square.remote(3)
    assert lightwork.get(done, timeout=60) == 9
    waiting = parked.remote(gate)
    record = support.run_record()
    never_made = 10**15  # an id no object has: as a freed one, it counts as ready
    try:
        with record.lock:
            assert record.pending_objects([done.id, waiting.id, never_made]) == [waiting.id]
    finally:
        open(gate, "w").close()
    assert lightwork.get(waiting, timeout=60) == "released"
    with record.lock:
        assert record.pending_objects([waiting.id, done.id]) == []


def test_the_record_counts_the_runs_cpus_and_its_stored_objects(backend):
    record = support.run_record()
    assert record.cpu_total() == 2.0  # the suite's two one-CPU slots
    kept = [lightwork.put(i) for i in range(3)]
    with record.lock:
        facts = record.store_facts()
    assert facts["objects"] >= len(kept)
    assert facts["shared_memory_bytes"] >= 0


def test_the_record_names_the_processes_a_profiler_samples(backend):
    record = support.run_record()
    lightwork.get([square.remote(i) for i in range(4)], timeout=60)  # the workers are up
    if backend == "local":
        assert not record.processes_elsewhere
        pids = record.runtime_pids()
        assert support.worker_pids() <= set(pids)
        assert support.forkserver().process.pid in pids
        assert os.getpid() not in pids  # the driver samples itself apart
        assert record.remote_process_usage() == {}
    else:
        assert record.processes_elsewhere
        assert record.runtime_pids() is None  # none of its workers runs from here
        usage = record.remote_process_usage()
        assert len(usage) == 2  # one reply per cluster worker
        assert all(pid > 0 and rss > 0 for pid, _cpu, rss in usage.values())


def test_a_running_task_is_at_its_workers_head_where_the_record_sees_queues(backend,
                                                                            tmp_path,
                                                                            wait_until):
    gate = str(tmp_path / "gate")
    waiting = parked.remote(gate)
    record = support.run_record()
    try:
        if backend == "local":
            def heads():
                with record.lock:
                    return [task.task_id for task in record.worker_heads()]
            wait_until(lambda: support.task_id_of(waiting) in heads(), timeout=30,
                       message="the parked task at its worker's head")
        else:  # the driver of a cluster run cannot see its workers' queues
            with record.lock:
                assert record.worker_heads() == []
    finally:
        open(gate, "w").close()
    assert lightwork.get(waiting, timeout=60) == "released"


def test_a_tool_that_needs_the_live_runtime_is_refused_where_the_record_has_none(backend):
    if backend == "local":
        assert support.run_record("a live tool", live=True) is support.driver_node()
        return
    with pytest.raises(exceptions.UnsupportedOnBackend,
                       match=r"a live tool is not supported on the distributed backend: "
                             r"it needs the embedded runtime's own state"):
        support.run_record("a live tool", live=True)
    # A task profile samples through Dask there, in sampling mode only.
    with pytest.raises(exceptions.UnsupportedOnBackend, match="embedded runtime's workers"):
        with profile_tasks(mode="cprofile"):
            pass
