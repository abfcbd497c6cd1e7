"""Dask-style callbacks: signatures, state, scoping, threads, failures."""

from __future__ import annotations

import operator
import threading

import pytest
from tests import support

dask = pytest.importorskip("dask")

import lightwork  # noqa: E402
import lightwork.dask  # noqa: E402
from lightwork.diagnostics import Callback, Profiler, add_callbacks  # noqa: E402

STATE_KEYS = {"dependencies", "dependents", "waiting", "waiting_data", "cache", "ready",
              "running", "finished", "released"}
DSK = {"a": (operator.add, 1, 2), "b": (operator.add, 3, "a"), "c": (operator.mul, "a", "b")}


@pytest.fixture(scope="module", autouse=True)
def runtime(two_cpus):
    yield


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def _start(self, dsk):
        self.calls.append(("start", dict(dsk)))

    def _start_state(self, dsk, state):
        self.calls.append(("start_state", set(state)))

    def _pretask(self, key, dsk, state):
        self.calls.append(("pretask", key))

    def _posttask(self, key, result, dsk, state, worker_id):
        self.calls.append(("posttask", key, result, worker_id))

    def _finish(self, dsk, state, failed):
        self.calls.append(("finish", failed))


def test_subclass_hooks_fire_in_dask_order_with_dask_arguments():
    rec = Recorder()
    with rec:
        assert lightwork.dask.get(DSK, "c") == 18
    kinds = [c[0] for c in rec.calls]
    assert kinds[:2] == ["start", "start_state"] and kinds[-1] == "finish"
    assert set(rec.calls[0][1]) == {"a", "b", "c"}
    assert rec.calls[1][1] == STATE_KEYS
    pre = [c[1] for c in rec.calls if c[0] == "pretask"]
    post = {c[1]: c for c in rec.calls if c[0] == "posttask"}
    assert pre == ["a", "b", "c"]
    assert post["a"][2] == 3 and post["c"][2] == 18
    workers = support.worker_pids()
    assert all(isinstance(c[3], int) and c[3] > 0 for c in post.values())
    assert workers  # worker ids are lightwork worker ids, not driver threads
    assert rec.calls[-1] == ("finish", False)


def test_keyword_hooks_and_printkeys_from_the_guide(capsys):
    def printkeys(key, dask, state):
        print("Computing: {0}!".format(repr(key)))

    with Callback(pretask=printkeys):
        lightwork.dask.get(DSK, "c")
    assert capsys.readouterr().out == "Computing: 'a'!\nComputing: 'b'!\nComputing: 'c'!\n"


def test_finish_fires_with_failed_true_when_a_task_raises():
    flags = []

    def bad(x):
        raise KeyError("nope")

    with Callback(finish=lambda dsk, state, failed: flags.append(failed)):
        with pytest.raises(KeyError):
            lightwork.dask.get({"x": 1, "y": (bad, "x")}, "y")
    assert flags == [True]


def test_register_and_unregister():
    rec = Recorder()
    rec.register()
    try:
        lightwork.dask.get(DSK, "a")
    finally:
        rec.unregister()
    n = len(rec.calls)
    lightwork.dask.get(DSK, "a")
    assert n > 0 and len(rec.calls) == n


def test_explicit_callbacks_argument_replaces_active_ones():
    active, explicit = Recorder(), Recorder()
    with active:
        lightwork.dask.get(DSK, "a", callbacks=[explicit._callback])
    assert not active.calls and explicit.calls


def test_add_callbacks_with_tuples():
    seen = []
    with add_callbacks((None, None, lambda k, d, s: seen.append(k), None, None)):
        lightwork.dask.get(DSK, "b")
    assert seen == ["a", "b"]


def test_dask_diagnostics_fire_under_lightwork_get():
    from dask.diagnostics import Profiler as DaskProfiler

    with DaskProfiler() as prof:
        lightwork.dask.get(DSK, "c")
    assert sorted(r.key for r in prof.results) == ["a", "b", "c"]


def test_lightwork_callbacks_fire_under_dask_schedulers():
    """Code that only changed its imports keeps working with Dask's own schedulers."""
    import dask.array as da

    with Profiler() as prof:
        da.ones(10, chunks=5).sum().compute(scheduler="sync")
    assert prof.results and all(r.start_time <= r.end_time for r in prof.results)


def test_two_threads_computing_at_once_keep_their_own_callbacks():
    results: dict[int, list] = {}
    errors = []
    barrier = threading.Barrier(2)

    def work(n):
        try:
            dsk = {f"t{n}-{i}": (operator.add, i, n) for i in range(30)}
            barrier.wait()
            with Profiler() as prof:
                out = lightwork.dask.get(dsk, list(dsk))
            assert list(out) == [i + n for i in range(30)]
            results[n] = prof.results
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for n in (1, 2):
        assert sorted(r.key for r in results[n]) == sorted(f"t{n}-{i}" for i in range(30))


def test_nested_run_does_not_fire_outer_callbacks():
    rec = Recorder()

    def post(key, result, dsk, state, worker_id):
        if key == "a":
            lightwork.dask.get({"z": (operator.add, 1, 1)}, "z")

    with rec, Callback(posttask=post):
        lightwork.dask.get(DSK, "b")
    assert [c[1] for c in rec.calls if c[0] == "pretask"] == ["a", "b"]


def test_bad_callback_objects_are_rejected():
    with pytest.raises(TypeError):
        Callback(pretask=42)
    with pytest.raises(TypeError):
        add_callbacks((None, None))
    with pytest.raises(TypeError, match="presubmit"):
        Callback(presubmit="not callable")


def test_submit_hooks_see_each_submitted_task_and_its_ref():
    pre, post = [], []
    cb = Callback(presubmit=lambda key, task, deps: pre.append((key, set(deps))),
                  postsubmit=lambda key, task, deps, ref: post.append((key, task, ref)))
    with cb:
        assert lightwork.dask.get({**DSK, "d": "c"}, "d") == 18  # "d" is an alias
    assert pre == [("a", set()), ("b", {"a"}), ("c", {"a", "b"})]
    assert [key for key, _, _ in post] == ["a", "b", "c"]
    assert all(isinstance(ref, lightwork.ObjectRef) for _, _, ref in post)
    assert lightwork.get(post[-1][2]) == 18  # the hook's ref names the task's result
    assert post[0][1].dependencies == frozenset()  # the graph node itself


def test_submit_hooks_do_not_fire_for_plain_tasks():
    @lightwork.remote
    def one():
        return 1

    seen = []
    with Callback(presubmit=lambda *args: seen.append(args),
                  postsubmit=lambda *args: seen.append(args)):
        assert lightwork.get(one.remote()) == 1
    assert seen == []
