"""ProgressBar, Profiler, ResourceProfiler, CacheProfiler, visualize."""

from __future__ import annotations

import io
import operator
import shutil
import subprocess
import sys
import time

from tests import helpers, support

import pytest

dask = pytest.importorskip("dask")

import lightwork  # noqa: E402
import lightwork.dask  # noqa: E402
from lightwork.diagnostics import (  # noqa: E402
    CacheProfiler,
    Callback,
    Profiler,
    ProgressBar,
    ResourceProfiler,
    format_time,
    visualize,
)

DSK = {"x": 1, "y": (operator.add, "x", 10), "z": (operator.mul, "y", 2)}


@pytest.fixture(scope="module", autouse=True)
def runtime(two_cpus):
    yield


@pytest.mark.parametrize("seconds", [0, 2e-7, 0.00012345, 0.001234, 0.5, 1, 1.234, 123.456,
                                     599, 1234.567, 7300, 12345.67, 123456.78, 1234567.89])
def test_format_time_is_dasks(seconds):
    from dask.utils import format_time as dask_format_time

    assert format_time(seconds) == dask_format_time(seconds)


def test_progress_bar_text_is_dasks():
    from dask.diagnostics import ProgressBar as DaskBar

    out = io.StringIO()
    with ProgressBar(out=out, dt=60, clock=helpers.FakeClock(1.234)):
        assert lightwork.dask.get(DSK, "z") == 22
    text = out.getvalue()
    assert text.endswith("\r[" + "#" * 40 + "] | 100% Completed | 1.23 s\n")
    dask_out = io.StringIO()
    DaskBar(out=dask_out)._draw_bar(1, 1.234)
    assert text.rstrip("\n").split("\r")[-1] == dask_out.getvalue().split("\r")[-1]


def test_progress_bar_width_minimum_and_last_duration():
    out = io.StringIO()
    bar = ProgressBar(width=10, out=out, dt=60, clock=helpers.FakeClock(2.5))
    with bar:
        lightwork.dask.get(DSK, "z")
    assert out.getvalue().endswith("[##########] | 100% Completed | 2.50 s\n")
    assert bar.last_duration == 2.5
    quiet = io.StringIO()
    with ProgressBar(minimum=10, out=quiet, clock=helpers.FakeClock(2.5)):
        lightwork.dask.get(DSK, "z")
    assert quiet.getvalue() == ""


def test_progress_bar_on_failure_ends_the_line():
    out = io.StringIO()

    def bad(v):
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        with ProgressBar(out=out, dt=60, clock=helpers.FakeClock(1.0)):
            lightwork.dask.get({"a": 1, "b": (bad, "a")}, "b")
    assert out.getvalue().endswith("\n") and "100%" not in out.getvalue()


def test_profiler_results_have_dasks_shape_and_worker_times():
    from dask.diagnostics.profile import TaskData as DaskTaskData

    graphs = []
    with Profiler() as prof, Callback(start=graphs.append):
        lightwork.dask.get(DSK, "z")
    assert prof.results[0]._fields == DaskTaskData._fields
    assert sorted(r.key for r in prof.results) == ["y", "z"]
    workers = support.worker_ids()
    for r in prof.results:
        assert prof.start_time <= r.start_time <= r.end_time <= prof.end_time
        assert r.worker_id in workers
        assert r.task is graphs[0][r.key]  # the graph entry the run's callbacks saw
    prof.clear()
    assert prof.results == [] and prof.start_time is None


def test_two_profilers_each_get_every_task_of_a_graph_and_of_plain_tasks():
    # A task that ended before the get began is data to that run, not one of its tasks
    # (as an existing key is in Dask): each task lasts long enough to still run then.
    @lightwork.remote
    def one():
        time.sleep(0.5)
        return 1

    for run, tasks in ((lambda: lightwork.dask.get(DSK, "z"), 2),  # y and z; x is data
                       (lambda: lightwork.get([one.remote() for _ in range(5)]), 5)):
        with Profiler() as outer, Profiler() as inner:
            run()
        assert len(outer.results) == tasks
        assert inner.results == outer.results
        assert [r.key for r in inner.results] == [r.key for r in outer.results]


def test_registered_profiler_sets_start_and_end_time():
    prof = Profiler()
    prof.register()
    try:
        lightwork.dask.get(DSK, "z")
    finally:
        prof.unregister()
    assert prof.start_time is not None and prof.end_time is not None
    assert prof.start_time <= prof.results[0].start_time


def test_cache_profiler_shape_metric_and_release_order():
    from dask.diagnostics.profile import CacheData as DaskCacheData

    with CacheProfiler() as cprof:
        lightwork.dask.get(DSK, "z")
    assert cprof.results[0]._fields == DaskCacheData._fields
    by_key = {r.key: r for r in cprof.results}
    assert set(by_key) == {"y", "z"} and all(r.metric == 1 for r in cprof.results)
    assert by_key["y"].cache_time <= by_key["y"].free_time <= by_key["z"].free_time
    with CacheProfiler(metric=lambda v: v * 100, metric_name="hundreds") as sized:
        lightwork.dask.get(DSK, "z")
    assert {r.key: r.metric for r in sized.results} == {"y": 1100, "z": 2200}
    assert sized._metric_name == "hundreds"


def test_resource_profiler_shape_and_no_zero_first_sample():
    import dask.array as da
    from dask.diagnostics.profile import ResourceData as DaskResourceData

    x = da.random.default_rng(0).random((600, 600), chunks=(200, 200))
    with ResourceProfiler(dt=0.01) as rprof:
        (x @ x.T).sum().compute(scheduler=lightwork.dask.get)
    assert rprof.results and rprof.results[0]._fields == DaskResourceData._fields
    assert rprof.start_time <= rprof.results[0].time <= rprof.end_time
    assert all(r.mem > 0 for r in rprof.results)
    # mem is summed over the driver and every worker: more than the driver alone
    import psutil

    driver_mb = psutil.Process().memory_info().rss / 1e6
    assert rprof.results[-1].mem > driver_mb
    # The first sample, long before the sampler's first scan of /proc (RESCAN_S), counts
    # the runtime's workers already: they were taken from the runtime when it began.
    assert rprof.results[0].mem > driver_mb
    assert rprof._sampler is None  # stopped with the block


def test_resource_profiler_leaves_the_switch_interval_as_it_found_it():
    """Entering and leaving lower Python's switch interval for a moment (profilers.py,
    _prompt_gil); the process's own value comes back, also with profilers entered and
    left in two threads at once."""
    import threading

    ours = 0.0123
    before = sys.getswitchinterval()
    sys.setswitchinterval(ours)
    try:
        def profile() -> None:
            for _ in range(20):
                with ResourceProfiler(dt=0.005) as rprof:
                    assert lightwork.dask.get(DSK, "z") == 22
                assert rprof.results

        threads = [threading.Thread(target=profile) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sys.getswitchinterval() == pytest.approx(ours)
    finally:
        sys.setswitchinterval(before)


def test_resource_profiler_registered_collects_only_during_runs():
    rprof = ResourceProfiler(dt=0.01)
    rprof.register()
    try:
        lightwork.dask.get(DSK, "z")
    finally:
        rprof.unregister()
    assert rprof.results and rprof._sampler is None
    with pytest.raises(ValueError):
        ResourceProfiler(dt=0)


def test_visualize_stacks_the_three_profilers(tmp_path):
    pytest.importorskip("bokeh")
    import dask.array as da

    a = da.random.default_rng(2).random((400, 50), chunks=(100, 50))
    q, r = da.linalg.qr(a)
    with Profiler() as prof, ResourceProfiler(dt=0.01) as rprof, CacheProfiler() as cprof:
        q.dot(r).compute(scheduler=lightwork.dask.get)
    path = tmp_path / "profile.html"
    layout = visualize([prof, rprof, cprof], filename=str(path), show=False)
    assert path.exists() and "Cache Size (count)" in path.read_text()
    assert len(layout.children) == 3
    single = prof.visualize(filename=str(tmp_path / "p.html"), show=False)
    colors = set(single.renderers[0].data_source.data["color"])
    groups = set(single.renderers[0].data_source.data["group"])
    assert len(colors) <= len(groups) < len(prof.results)  # one colour per function


def test_visualize_html_renders_in_a_real_browser(tmp_path):
    """The written file, opened in headless Chromium: BokehJS (inlined, so no network)
    builds the three plots without a script error."""
    pytest.importorskip("bokeh")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no Chromium on this machine (make test installs it when it runs as root)")
    with Profiler() as prof, ResourceProfiler(dt=0.01) as rprof, CacheProfiler() as cprof:
        lightwork.dask.get(DSK, "z")
    path = tmp_path / "profile.html"
    visualize([prof, rprof, cprof], filename=str(path), show=False, mode="inline")
    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=5000", "--window-size=900,1200",
         f"--screenshot={shot}", path.as_uri()],
        capture_output=True, text=True, timeout=60)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert any("document idle" in line for line in console), done.stderr[-2000:]
    assert not [line for line in console if "Error" in line or "Uncaught" in line], console
    assert shot.stat().st_size > 10_000  # a blank page is a few kB


def test_visualize_without_bokeh_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "bokeh", None)
    monkeypatch.setitem(sys.modules, "bokeh.plotting", None)
    with pytest.raises(ImportError, match=r"lightwork\[viz\]"):
        visualize(Profiler(), show=False, save=False)


def test_profiler_gives_alias_tasks_a_worker_id():
    """A dask.array run has many Alias tasks (resolved on the driver): each gets the
    worker that made its target, so sorting the worker ids works (it once met None)."""
    import dask.array as da
    from dask._task_spec import Alias, DataNode, Task, TaskRef

    x = da.ones((40, 40), chunks=(10, 10))
    with Profiler() as prof:
        (x + x.T).sum().compute(scheduler=lightwork.dask.get)
    workers = support.worker_ids()
    ids = sorted({r.worker_id for r in prof.results})  # once a TypeError: None among ints
    assert all(isinstance(worker_id, int) for worker_id in ids) and set(ids) <= workers

    graph = {"a": DataNode("a", 10), "b": Task("b", operator.add, TaskRef("a"), 5),
             "c": Alias("c", "b"), "d": Alias("d", "a")}
    seen = []
    with Profiler() as prof, Callback(posttask=lambda key, r, dsk, s, wid: seen.append(
            (key, wid))):
        assert lightwork.dask.get(graph, ["c", "d"]) == (15, 10)
    by_key = {r.key: r.worker_id for r in prof.results}
    assert by_key["c"] == by_key["b"] in workers  # the alias's target's worker
    assert by_key["d"] == 0  # the target is a literal: the driver (worker 0)
    assert dict(seen) == by_key  # posttask hooks get the same ids


def test_resource_profiler_plots_plain_tuples_as_dask_does():
    """Dask's own tests set results to plain (time, mem, cpu) tuples."""
    pytest.importorskip("bokeh")
    import warnings

    rprof = ResourceProfiler(dt=0.01)
    for results in ([], [(1.0, 0, 0)], [(0.2, 100.0, 50.0), (0.8, 120.0, 150.0)]):
        rprof.results = results
        rprof.start_time, rprof.end_time = 0.0, 1.0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plot = rprof.visualize(show=False, save=False)
        assert not caught
        assert (plot.x_range.start, plot.x_range.end) == (0, 1)
    assert plot.y_range.end == 150.0  # the largest CPU figure of the tuples


def test_visualize_file_path_warns_like_dask(tmp_path):
    pytest.importorskip("bokeh")
    with Profiler() as prof:
        lightwork.dask.get(DSK, "z")
    path = tmp_path / "old-name.html"
    with pytest.warns(FutureWarning, match="filename"):
        prof.visualize(file_path=str(path), show=False, save=True)
    assert path.exists()
