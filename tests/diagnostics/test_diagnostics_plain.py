"""Callbacks and profilers for plain lightwork tasks: a get/wait is one run."""

from __future__ import annotations

import io
import time

from tests import helpers, support
import pytest

import lightwork
from lightwork.kernel import introspect
from lightwork.diagnostics import (
    CacheProfiler,
    Callback,
    Profiler,
    ProgressBar,
    ResourceProfiler,
)
from lightwork.diagnostics._plain import RemoteCall

STATE_KEYS = {"dependencies", "dependents", "waiting", "waiting_data", "cache", "ready",
              "running", "finished", "released"}


@pytest.fixture(scope="module", autouse=True)
def runtime(two_cpus):
    yield


@lightwork.remote
def square(x):
    return x * x


@lightwork.remote
def add(a, b):
    return a + b


@lightwork.remote
def nap(seconds):
    time.sleep(seconds)
    return seconds


def test_progress_bar_reaches_100_percent_as_get_returns():
    out = io.StringIO()
    refs = [square.remote(i) for i in range(40)]
    with ProgressBar(out=out, dt=60, clock=helpers.FakeClock(0.5)):
        assert lightwork.get(refs) == [i * i for i in range(40)]
    assert out.getvalue().endswith("\r[" + "#" * 40 + "] | 100% Completed | 500.00 ms\n")


def test_hooks_state_and_dependency_order():
    calls = []
    seen_state = {}

    def start_state(dsk, state):
        seen_state.update(state)

    a = square.remote(nap.remote(0.2))  # a's chain is unfinished when get starts
    b = add.remote(a, 1)
    c = add.remote(b, a)
    cb = Callback(start=lambda dsk: calls.append(("start", sorted(dsk))),
                  start_state=start_state,
                  pretask=lambda key, dsk, state: calls.append(("pre", key)),
                  posttask=lambda key, res, dsk, state, wid: calls.append(("post", key, res)),
                  finish=lambda dsk, state, failed: calls.append(("finish", failed)))
    with cb:
        assert lightwork.get(c) == pytest.approx(1.08)
    assert set(seen_state) == STATE_KEYS
    post = [c for c in calls if c[0] == "post"]
    # a value nobody holds a ref to may be freed before posttask sees it: then None
    assert post[0][2] in (0.2, None)
    assert [p[2] for p in post[1:]] == [pytest.approx(0.04), pytest.approx(1.04), pytest.approx(1.08)]
    keys = [p[1] for p in post]
    assert keys[0].startswith("nap-") and keys[3].startswith("add-")
    assert calls[-1] == ("finish", False)
    order = [c[:2] for c in calls]
    for earlier, later in zip(keys, keys[1:]):  # each is readied only after its input ended
        assert order.index(("post", earlier)) < order.index(("pre", later))


def test_profiler_uses_worker_times_and_ids():
    refs = [nap.remote(0.01) for _ in range(6)]
    with Profiler() as prof:
        lightwork.get(refs)
    assert len(prof.results) == 6
    node = support.driver_node()
    records = {r.task_id: r for r in node.log.ended_records()}
    for data in prof.results:
        record = records[int(data.key.rsplit("-", 1)[1])]
        assert (data.start_time, data.end_time, data.worker_id) == (
            record.started, record.finished, record.worker_id)
        assert data.end_time - data.start_time >= 0.009


def test_failed_task_makes_finish_failed_true():
    @lightwork.remote
    def fail():
        raise ValueError("no")

    flags = []
    with Callback(finish=lambda dsk, state, failed: flags.append(failed)):
        with pytest.raises(ValueError):
            lightwork.get(fail.remote())
    assert flags == [True]


def test_wait_is_one_run_and_done_refs_are_data():
    done = lightwork.put(5)
    refs = [square.remote(i) for i in range(4)]
    lightwork.get(refs)
    starts = []
    with Callback(start_state=lambda dsk, state: starts.append(
            (len(state["cache"]), len(state["running"]) + len(state["waiting"])))):
        ready, _ = lightwork.wait(refs + [done], num_returns=5)
    assert len(ready) == 5 and starts == [(5, 0)]


def test_cache_profiler_on_plain_tasks():
    a = nap.remote(0.2)  # still running when get starts: part of the run
    b = add.remote(a, 1)
    with CacheProfiler() as cprof:
        lightwork.get(b)
    by_group = {r.key.split("-")[0]: r for r in cprof.results}
    assert set(by_group) == {"nap", "add"}
    assert by_group["nap"].free_time <= by_group["add"].free_time


def test_no_observer_left_once_callbacks_end():
    with Profiler():
        pass
    assert not introspect.blocking_observers


def test_a_finished_progress_bar_keeps_no_cycle_with_its_run():
    """Freed as soon as the program drops it: the run (its tasks' records) with it."""
    import gc
    import weakref

    bar = ProgressBar(out=io.StringIO())
    with bar:
        lightwork.get([square.remote(i) for i in range(5)])
    gone = weakref.ref(bar)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del bar
        # A thread telling listeners of ended tasks (the cluster's record pulls reports)
        # may hold the run for a moment after get returned; with the collector off, a
        # cycle would hold it for good.
        deadline = time.monotonic() + 5
        while gone() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gone() is None
    finally:
        if was_enabled:
            gc.enable()


def test_progress_bar_moves_as_tasks_end():
    out = io.StringIO()
    refs = [nap.remote(0.15) for _ in range(6)]  # 3 rounds on 2 CPUs
    with ProgressBar(out=out, dt=0.01):
        lightwork.get(refs)
    shown = [int(part.split("%")[0].rsplit("|", 1)[1]) for part in out.getvalue().split("\r")
             if "% Completed" in part]
    assert shown == sorted(shown) and shown[-1] == 100
    assert any(0 < percent < 100 for percent in shown), shown


def test_profiler_task_names_its_dependencies_in_the_run():
    a = nap.remote(0.2)
    b = add.remote(a, 1)
    with Profiler() as prof:
        lightwork.get(b)
    by_group = {r.key.split("-")[0]: r for r in prof.results}
    assert set(by_group) == {"nap", "add"}
    call = by_group["add"].task
    assert isinstance(call, RemoteCall) and call.name == "add"
    assert call.dependencies == {by_group["nap"].key}
    assert by_group["nap"].end_time <= by_group["add"].start_time


def test_a_put_argument_is_not_a_dependency_in_the_run():
    a = nap.remote(0.2)
    b = add.remote(a, a)
    c = add.remote(b, lightwork.put(1))  # a put is data, not a task of the run
    with Profiler() as prof:
        lightwork.get(c)
    by_key = {r.key: r.task for r in prof.results}
    calls = sorted(by_key.values(), key=lambda call: call.task_id)
    assert [call.name for call in calls] == ["nap", "add", "add"]
    keys = {call.task_id: key for key, call in by_key.items()}
    assert calls[1].dependencies == {keys[calls[0].task_id]}
    assert calls[2].dependencies == {keys[calls[1].task_id]}


def test_task_graph_walks_back_to_unfinished_tasks_with_their_records():
    node = support.driver_node()
    a = nap.remote(0.3)
    b = add.remote(a, a)  # a dependency passed twice is one dependency
    done = lightwork.put(5)
    graph = introspect.task_graph_of(node, [b.id, done.id])
    assert graph.made_by[1] == 0 and graph.made_by[0] in graph.records
    assert sorted(record.name for record in graph.records.values()) == ["add", "nap"]
    assert graph.return_ids == {}  # only looked up when asked for
    asked = introspect.task_graph_of(node, [b.id], with_return_ids=True)
    assert asked.return_ids[asked.made_by[0]] == (b.id,)
    b_record = graph.records[graph.made_by[0]]
    a_task = next(i for i, record in graph.records.items() if record.name == "nap")
    assert introspect.unfinished_deps(b_record, graph.records) == (a_task,)
    assert lightwork.get(b) == pytest.approx(0.6)


def test_profiler_gives_the_same_results_with_a_state_keeping_callback():
    """Profiler alone keeps no Dask state; next to a pretask hook the run keeps it."""
    def keys_of(extra):
        a = nap.remote(0.1)
        refs = [add.remote(a, i) for i in range(3)]
        with Profiler() as prof, extra:
            lightwork.get(refs)
        return sorted(r.key.split("-")[0] for r in prof.results), len(
            {r.key for r in prof.results})

    pretask_keys = []
    with_state = keys_of(Callback(pretask=lambda key, dsk, state: pretask_keys.append(key)))
    assert keys_of(ResourceProfiler(dt=5)) == with_state == (["add", "add", "add", "nap"], 4)
    assert len(pretask_keys) == 4


def test_profiler_results_do_not_keep_objects_alive(wait_until):
    node = support.driver_node()
    gate = nap.remote(0.3)  # holds all 50 back: each is still unfinished when get starts
    refs = [add.remote(gate, i) for i in range(50)]
    ids = [ref.id for ref in refs] + [gate.id]
    with Profiler() as prof:
        lightwork.get(refs)
    del refs, gate
    assert wait_until(lambda: not any(i in node.objects.entries for i in ids), timeout=10)
    assert len(prof.results) == 51  # read after the objects are gone
    assert sorted({r.task.name for r in prof.results}) == ["add", "nap"]


def test_a_failing_task_listener_does_not_stop_the_runtime(monkeypatch):
    seen = []
    monkeypatch.setattr("sys.unraisablehook", lambda args: seen.append(args.exc_value))

    def broken(records):
        raise RuntimeError("diagnostics bug")

    node = support.driver_node()
    node.add_task_listener(broken)
    try:
        assert lightwork.get([square.remote(i) for i in range(5)]) == [0, 1, 4, 9, 16]
    finally:
        node.remove_task_listener(broken)
    assert lightwork.get(square.remote(3)) == 9
    assert seen and all(str(exc) == "diagnostics bug" for exc in seen)


def test_a_listener_removed_before_it_was_told_hears_of_what_ended_meanwhile():
    """The thread that ends a task tells the listeners after letting go of the lock; a
    listener removed in between is told at its removal, once."""
    from lightwork.kernel.events import TaskRecord

    heard = []
    node = support.driver_node()
    node.add_task_listener(heard.append)
    ended = TaskRecord(10**12, "ended-meanwhile", 0, 0.0)
    with node.lock:  # as _end_task leaves it: noted, the telling still to come
        support.task_table().unheard.append(ended)
    node.remove_task_listener(heard.append)
    assert heard == [[ended]]
    node.remove_task_listener(heard.append)  # removing twice tells nothing again
    assert heard == [[ended]]
    with node.lock:
        support.task_table().unheard.remove(ended)


def test_a_failing_blocking_observer_does_not_break_get(monkeypatch):
    seen = []
    monkeypatch.setattr("sys.unraisablehook", lambda args: seen.append(args))

    def broken(kind, refs):
        raise RuntimeError("observer bug")

    monkeypatch.setattr(introspect, "blocking_observers", [broken])
    support.patch_blocking_observers(monkeypatch, introspect.blocking_observers)
    assert lightwork.get(square.remote(4)) == 16
    assert [str(args.exc_value) for args in seen] == ["observer bug"]
    assert "blocking-call observer" in seen[0].err_msg


def test_a_diagnostics_bug_is_printed_by_default_and_get_goes_on(tmp_path):
    """Python's default unraisable hook accepts only its own argument type."""
    path = helpers.write_script(str(tmp_path), "observer_bug.py", """
import lightwork
from lightwork.kernel import introspect  # the callbacks' hook into get/wait and graphs

lightwork.init(num_cpus=1)

def broken(kind, refs):
    raise RuntimeError("observer bug")

introspect.blocking_observers.append(broken)

@lightwork.remote
def three():
    return 3

print("got", lightwork.get(three.remote()))
""")
    done = helpers.run_script(path)
    assert done.returncode == 0, done.stderr
    assert "got 3" in done.stdout
    assert "Exception ignored in lightwork blocking-call observer" in done.stderr
    assert "RuntimeError: observer bug" in done.stderr
