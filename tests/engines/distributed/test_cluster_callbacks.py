"""Dask-style callbacks and profilers on the distributed backend, against a real cluster
(``dask scheduler`` plus two single-thread ``dask worker`` processes).

The runs hear of ended tasks from the cluster's event log (``ClusterLog``'s task
listeners, fed by the workers' own stamps): ``ProgressBar``, ``Profiler``,
``CacheProfiler``, user ``Callback`` hooks and ``visualize`` on plain lightwork tasks
and on ``lightwork.dask.get`` graphs; ``ResourceProfiler`` from each worker's own
CPU/RSS readings.
"""

from __future__ import annotations

import io
import os
import time

import psutil
import pytest
from tests.helpers import wait_until
from tests import support

import lightwork
from lightwork.diagnostics import (
    CacheProfiler,
    Callback,
    Profiler,
    ProgressBar,
    ResourceProfiler,
    visualize,
)

pytestmark = pytest.mark.lightwork_only
pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")


@pytest.fixture(autouse=True)
def no_listener_left(cluster):
    yield
    recorder = support.recorder()
    assert recorder.task_listeners == [], "a run left its listener on the cluster's log"


@lightwork.remote
def add_one(x):
    time.sleep(0.03)
    return x + 1


@lightwork.remote
def boom(x):
    raise ZeroDivisionError(f"boom {x}")


@lightwork.remote
def spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return seconds


def test_progress_bar_and_profiler_on_plain_tasks(cluster):
    out = io.StringIO()
    before = time.monotonic()
    with ProgressBar(out=out, dt=0.05), Profiler() as prof:
        refs = [add_one.remote(i) for i in range(8)]
        chained = add_one.remote(refs[0])  # a task waiting on another is in the run too
        assert lightwork.get(refs + [chained]) == list(range(1, 9)) + [2]
    text = out.getvalue()
    assert text.rstrip().endswith("| 100% Completed |" + text.rstrip().rsplit("|", 1)[1])
    assert "[" + "#" * 40 + "]" in text and text.endswith("\n")
    assert len(prof.results) == 9
    rows = {r.worker_id for r in lightwork.diagnostics.task_records()
            if r.name.endswith("add_one") and r.submitted >= before}
    for data in prof.results:
        assert data.key.startswith("add_one-")
        assert before <= data.start_time <= data.end_time <= time.monotonic()
        assert data.end_time - data.start_time >= 0.025  # the worker's own run time
        assert data.worker_id > 0
    # The workers that ran them, numbered as the event log numbers them (which workers
    # the scheduler chose is its business: on a loaded host one may take all nine).
    assert {d.worker_id for d in prof.results} == rows


def test_callback_hooks_follow_dependencies_with_results(cluster):
    events = []
    finished = []
    hooks = Callback(
        start=lambda dsk: events.append(("start", len(dsk))),
        pretask=lambda key, dsk, state: events.append(("pre", key)),
        posttask=lambda key, result, dsk, state, worker_id: events.append(
            ("post", key, result, worker_id)),
        finish=lambda dsk, state, failed: finished.append(failed))
    with hooks:
        first = add_one.remote(1)
        second = add_one.remote(first)
        assert lightwork.get(second) == 3
    assert events[0] == ("start", 2) and finished == [False]
    posts = [e for e in events if e[0] == "post"]
    assert [p[2] for p in posts] == [2, 3]  # the dependency first, with its value
    assert all(p[3] > 0 for p in posts)
    # Dask's order: a task's pretask once its input ended, after the input's posttask.
    keys = [p[1] for p in posts]
    assert [e[:2] for e in events[1:]] == [("pre", keys[0]), ("post", keys[0]),
                                           ("pre", keys[1]), ("post", keys[1])]


def test_a_failing_task_finishes_the_run_as_failed(cluster):
    finished = []
    out = io.StringIO()
    with Callback(finish=lambda dsk, state, failed: finished.append(failed)), \
            ProgressBar(out=out), pytest.raises(ZeroDivisionError, match="boom 3"):
        lightwork.get(boom.remote(3))
    assert finished == [True]
    assert out.getvalue().endswith("\n")  # the bar's line is finished, even on failure


def test_dask_graph_on_the_cluster_with_profilers(cluster, tmp_path):
    da = pytest.importorskip("dask.array")
    pytest.importorskip("bokeh")
    import lightwork.dask

    x = da.ones((40, 40), chunks=(10, 10))
    total = (x + x.T).sum()
    out = io.StringIO()
    with Profiler() as prof, CacheProfiler() as cache, ProgressBar(out=out):
        assert float(total.compute(scheduler=lightwork.dask.get)) == 3200.0
    graph_tasks = [k for k in dict(total.__dask_graph__())]
    assert 0 < len(prof.results) <= len(graph_tasks)
    workers = {r.worker_id for r in lightwork.diagnostics.task_records()}
    assert {d.worker_id for d in prof.results} <= workers | {0}
    assert all(d.start_time <= d.end_time for d in prof.results)
    assert len(cache.results) == len(prof.results)
    assert all(c.cache_time <= c.free_time for c in cache.results)
    assert "100% Completed" in out.getvalue()
    # the graph's tasks ran on the cluster's workers (their pids), not on the driver
    pids = {r.pid for r in lightwork.diagnostics.task_records() if r.worker_id in
            {d.worker_id for d in prof.results}}
    assert pids and pids <= set(cluster.worker_pids())
    layout = visualize([prof, cache], filename=str(tmp_path / "p.html"), show=False)
    assert layout is not None and (tmp_path / "p.html").stat().st_size > 1000


def test_a_graph_shows_its_progress_while_it_runs_on_the_cluster(cluster, tmp_path):
    """A chain of 8 held at its 6th task: the bar, the run's progress and the live
    dashboard's sync all say 5 of 8 done while it runs on the workers, then 100%."""
    dask = pytest.importorskip("dask")
    import threading

    import lightwork.dask
    from lightwork.dask import _scheduler

    gate = tmp_path / "gate"

    def link(previous, i, gate):
        deadline = time.monotonic() + 30
        while i == 5 and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)
        return previous + 1

    chain = 0
    for k in range(8):
        chain = dask.delayed(link)(chain, k, str(gate))
    out = io.StringIO()
    results = []

    def run():
        with ProgressBar(out=out, dt=0.05):
            results.append(chain.compute(scheduler=lightwork.dask.get))

    thread = threading.Thread(target=run)
    thread.start()
    try:
        [held] = wait_until(lambda: [g.progress() for g in list(_scheduler.running_graphs.values())
                                     if g.progress()["done"] == 5],
                            timeout=30, message="the graph held at 5 of 8")
        assert held["total"] == 8 and held["running"] == 1 and held["name"] == "link"
        wait_until(lambda: "| 62% Completed |" in out.getvalue(),  # 5 of 8, as Dask rounds
                   timeout=30, message="the bar at 62%")
        assert "100%" not in out.getvalue()
        log = support.recorder()  # what the live dashboard's sync shows
        [shown] = log.answer_query("dashboard_sync", {}).result["graphs"]
        assert (shown["done"], shown["total"], shown["running"]) == (5, 8, 1)
    finally:
        gate.touch()
        thread.join(30)
    assert results == [8] and not _scheduler.running_graphs
    assert out.getvalue().rstrip().split("\r")[-1].startswith("[" + "#" * 40 + "] | 100%")
    ended = [r for r in lightwork.diagnostics.task_records() if r.name.startswith("link")]
    assert len(ended) >= 8 and {r.pid for r in ended} <= set(cluster.worker_pids())


def test_dask_graph_failure_raises_the_users_error(cluster):
    dask = pytest.importorskip("dask")
    import lightwork.dask

    def divide(a, b):
        return a / b

    finished = []
    bad = dask.delayed(divide)(dask.delayed(divide)(1, 1), 0)
    with Callback(finish=lambda dsk, state, failed: finished.append(failed)), \
            pytest.raises(ZeroDivisionError):
        bad.compute(scheduler=lightwork.dask.get)
    assert finished == [True]


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_resource_profiler_reads_each_workers_own_usage(cluster):
    """Each worker's samples integrate to the CPU time that worker used, read from its
    process independently. No CPU % is assumed: on a loaded host a worker gets a small
    share of a core, and its 0.8 s of CPU take longer (it failed that way at load 28)."""
    pids = support.cluster_client().run(os.getpid)  # address -> pid
    assert sorted(pids.values()) == sorted(cluster.worker_pids())
    before = {address: _cpu_seconds(pid) for address, pid in pids.items()}
    with ResourceProfiler(dt=0.1) as rprof:
        # Different amounts on the two workers (one CPU slot each): a worker's samples
        # must show its own use, not the other's, the driver's or the machine's.
        assert lightwork.get([spin.remote(0.8), spin.remote(0.3)]) == [0.8, 0.3]
    used = {address: _cpu_seconds(pid) - before[address] for address, pid in pids.items()}
    # (the kernel counts CPU time in 10 ms ticks; spin reads a finer clock)
    assert sorted(used.values())[0] >= 0.28 and sorted(used.values())[1] >= 0.78, used
    addresses = {a for a in rprof.per_worker if a != "driver"}
    assert addresses == {str(a) for a in pids} and all(a.startswith("tcp://") for a in addresses)
    assert "driver" in rprof.per_worker and len(rprof.results) >= 3
    for address in addresses:
        samples = rprof.per_worker[address]
        assert all(s.mem > 10 for s in samples)  # a Python process's RSS, in MB
        times = [rprof.start_time] + [s.time for s in samples]
        intervals = [t - before for t, before in zip(times[1:], times)]
        cpu_seconds = sum(s.cpu / 100 * interval for s, interval in zip(samples, intervals))
        # A worker's CPU % covers the time between its own readings, but a sample is
        # stamped when the reply reaches the driver. A reply's delay is at most its
        # interval less dt (its request left dt after the previous reply; the last one,
        # sent at stop, at most its interval), so the integral is off by at most each
        # delay times the change of CPU % across it (summation by parts).
        delays = [max(0.0, interval - 0.1) for interval in intervals[:-1]] + [intervals[-1]]
        cpus = [0.0] + [s.cpu / 100 for s in samples] + [0.0]
        off_by = delays[0] * cpus[1] + sum(
            delay * abs(cpus[i + 1] - cpus[i + 2]) for i, delay in enumerate(delays))
        # plus the CPU used outside the sampled span (the priming request, the last reply)
        allowed = off_by + 0.05 + 0.05 * used[address]
        assert abs(cpu_seconds - used[address]) <= allowed, (cpu_seconds, used[address], allowed)
    last = rprof.results[-1]
    assert last.mem == pytest.approx(sum(v[-1].mem for v in rprof.per_worker.values()))


def test_a_graph_whose_task_kills_its_worker_every_time_fails_fast(cluster):
    """The task's worker dies on each try (the nanny restarts it), so no worker ever
    reports it: the run must end with WorkerCrashedError instead of waiting forever."""
    dask = pytest.importorskip("dask")
    import os
    import signal

    import lightwork.dask
    from lightwork import exceptions

    def die(x):
        os.kill(os.getpid(), signal.SIGKILL)

    finished = []
    graph = dask.delayed(die)(dask.delayed(int)(1))
    start = time.monotonic()
    with Callback(finish=lambda dsk, state, failed: finished.append(failed)), \
            pytest.raises(exceptions.WorkerCrashedError):
        graph.compute(scheduler=lightwork.dask.get)
    assert finished == [True] and time.monotonic() - start < 45
    until_both_workers_back = time.monotonic() + 30
    while len(cluster.worker_pids()) < 2 and time.monotonic() < until_both_workers_back:
        time.sleep(0.2)
    assert lightwork.get(add_one.remote(1)) == 2  # the cluster goes on


@lightwork.remote
class Tally:
    def __init__(self):
        self.n = 0

    def bump(self):
        time.sleep(0.01)
        self.n += 1
        return self.n


def test_progress_and_profiler_follow_actor_calls(cluster):
    tally = Tally.remote()
    out = io.StringIO()
    with ProgressBar(out=out, dt=0.05), Profiler() as prof:
        assert lightwork.get([tally.bump.remote() for _ in range(6)]) == [1, 2, 3, 4, 5, 6]
    assert "| 100% Completed |" in out.getvalue()
    assert len(prof.results) == 6 and all(d.key.startswith("Tally.bump-") for d in prof.results)
    starts = sorted(d.start_time for d in prof.results)
    ends = sorted(d.end_time for d in prof.results)
    assert all(end <= start for end, start in zip(ends, starts[1:]))  # one at a time, in order
