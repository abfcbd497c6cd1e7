"""lightwork.dask.get: Dask's get contract, collections, errors, memory."""

from __future__ import annotations

import operator
import sys

import pytest
from tests import support

dask = pytest.importorskip("dask")
np = pytest.importorskip("numpy")

import lightwork  # noqa: E402
import lightwork.dask  # noqa: E402
from dask.utils_test import GetFunctionTestMixin, inc  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def runtime(two_cpus):
    yield


class TestConformance(GetFunctionTestMixin):
    """Dask's published suite for foreign get functions."""

    get = staticmethod(lightwork.dask.get)


def test_array_reductions_match_sync():
    import dask.array as da

    x = da.random.default_rng(0).random((400, 300), chunks=(100, 100))
    y = (x + x.T[:300, :300].sum(axis=0)).mean(axis=1)
    expected = y.compute(scheduler="sync")
    np.testing.assert_allclose(y.compute(scheduler=lightwork.dask.get), expected)


def test_qr_then_dot_matches_sync():
    import dask.array as da

    a = da.random.default_rng(1).random((1000, 100), chunks=(100, 100))
    q, r = da.linalg.qr(a)
    a2 = q.dot(r)
    got = a2.compute(scheduler=lightwork.dask.get)
    np.testing.assert_allclose(got, a2.compute(scheduler="sync"))
    np.testing.assert_allclose(got, a.compute(scheduler="sync"))


def test_bag_matches_sync():
    import dask.bag as db

    b = db.from_sequence(range(100), npartitions=7).map(lambda v: v * v).filter(lambda v: v % 3)
    assert b.sum().compute(scheduler=lightwork.dask.get) == b.sum().compute(scheduler="sync")
    assert sorted(b.frequencies().compute(scheduler=lightwork.dask.get)) == sorted(
        b.frequencies().compute(scheduler="sync"))


def test_dataframe_matches_sync():
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")

    frame = pd.DataFrame({"k": [i % 5 for i in range(200)], "v": range(200)})
    df = dd.from_pandas(frame, npartitions=4)
    result = df.groupby("k").v.sum()
    pd.testing.assert_series_equal(result.compute(scheduler=lightwork.dask.get),
                                   result.compute(scheduler="sync"))


def test_compute_many_collections_and_kwargs():
    import dask.array as da

    x = da.arange(100, chunks=10)
    s, m = dask.compute(x.sum(), x.max(), scheduler=lightwork.dask.get, optimize_graph=False)
    assert (s, m) == (4950, 99)


def test_enable_sets_and_restores_the_scheduler():
    import dask.array as da

    before = dask.config.get("scheduler", None)
    with lightwork.dask.enable():
        assert dask.config.get("scheduler") is lightwork.dask.get
        assert da.ones(10, chunks=5).sum().compute() == 10
    assert dask.config.get("scheduler", None) == before


def test_task_spec_nodes():
    from dask._task_spec import Alias, DataNode, Task, TaskRef

    graph = {
        "a": DataNode("a", 10),
        "b": Task("b", operator.add, TaskRef("a"), 5),
        "c": Alias("c", "b"),
        "d": Task("d", operator.mul, TaskRef("c"), TaskRef("a")),
    }
    assert lightwork.dask.get(graph, ["d", ["c", "a"]]) == (150, (15, 10))


def test_collection_object_as_graph():
    import dask.array as da

    x = da.ones(6, chunks=3) + 1
    keys = x.__dask_keys__()
    parts = lightwork.dask.get(x, keys)
    assert [p.tolist() for p in parts] == [[2.0] * 3, [2.0] * 3]


def test_tuple_keys_and_nested_tasks():
    dsk = {("x", 0): 1, ("x", 1): (inc, ("x", 0)), "y": (sum, [("x", 0), (inc, ("x", 1))])}
    assert lightwork.dask.get(dsk, [("x", 1), "y"]) == (2, 4)


def test_user_error_reraised_with_its_type():
    def fail(v):
        raise ZeroDivisionError(f"bad {v}")

    with pytest.raises(ZeroDivisionError, match="bad 1") as info:
        lightwork.dask.get({"a": 1, "b": (fail, "a"), "c": (inc, "b")}, "c")
    assert "fail" in str(info.value)  # the remote traceback names the user's function


def test_bad_inputs_have_clear_errors():
    with pytest.raises(TypeError, match="Dask graph"):
        lightwork.dask.get(42, "x")
    with pytest.raises(KeyError, match="not in the graph"):
        lightwork.dask.get({"x": 1}, "nope")
    from dask._task_spec import Task, TaskRef

    with pytest.raises(ValueError, match="missing dependency"):
        lightwork.dask.get({"b": Task("b", inc, TaskRef("zz"))}, "b")
    with pytest.raises(ValueError, match="num_workers"):
        lightwork.dask.get({"x": 1}, "x", num_workers=0)


def test_a_task_function_that_cannot_be_pickled_is_named():
    import threading

    lock = threading.Lock()

    def locked_inc(x):
        with lock:
            return x + 1

    with pytest.raises(TypeError, match=r"Dask task 'b'.*lock"):
        lightwork.dask.get({"a": 1, "b": (locked_inc, "a")}, "b")
    assert lightwork.dask.get({"a": 1, "b": (inc, "a")}, "b") == 2  # the runtime goes on


def test_dask_missing_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "dask" or m.startswith("dask.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "dask", None)
    with pytest.raises(ImportError, match=r"lightwork\[dask\]"):
        lightwork.dask.get({"x": 1}, "x")
    with pytest.raises(ImportError, match=r"lightwork\[dask\]"):
        lightwork.dask.enable()


def test_intermediates_are_released_as_soon_as_unused():
    from lightwork.diagnostics import Callback

    node = support.driver_node()
    live_during: list[int] = []
    seen: dict[str, object] = {}

    def posttask(key, result, dsk, state, worker_id):
        if key == "d":
            with node.lock:
                live_during.append(sum(1 for e in node.objects.entries.values() if e.state == 1))

    def finish(dsk, state, failed):
        seen.update(state)

    big = lambda n: np.ones(n)  # noqa: E731
    dsk = {"a": (big, 100_000), "b": (np.sum, "a"), "c": (inc, "b"), "d": (inc, "c")}
    with Callback(posttask=posttask, finish=finish):
        assert lightwork.dask.get(dsk, "d") == 100_002
    assert {"a", "b", "c"} <= seen["released"]
    assert set(seen["cache"]) == {"d"}
    with node.lock:
        pending_or_ready = [e for e in node.objects.entries.values() if e.state != 2]
    assert live_during and len(pending_or_ready) <= live_during[0]


def test_nested_get_inside_a_task():
    @lightwork.remote
    def inner():
        import lightwork.dask as ld

        return ld.get({"x": 1, "y": (inc, "x"), "z": (operator.add, "x", "y")}, ["z", "y"])

    assert lightwork.get(inner.remote()) == (3, 2)


def test_a_by_value_function_travels_once_per_worker_not_per_task():
    """A local function with a big closure would make every task carry 300 KB."""
    from lightwork.diagnostics import task_records

    table = bytes(range(256)) * 1200  # ~300 KB, captured by value

    def lookup(i):
        return table[i]

    graph = {("t", i): (lookup, i) for i in range(40)}
    graph["total"] = (sum, [("t", i) for i in range(40)])
    assert lightwork.dask.get(graph, "total") == sum(range(40))
    sizes = [r.arg_size for r in task_records() if r.name.startswith("t")][-40:]
    assert len(sizes) == 40 and max(sizes) < 4096, sizes
