"""The dashboard's mirror as the sync thread and the HTTP threads share it: the per-function
figures kept as records arrive and leave (``dashboard/functions.py``) against brute force,
and requests that never wait for a sync's merge or a trim's renumbering."""

from __future__ import annotations

import math
import random
import threading
from typing import Any

from tests import helpers
import pytest

from lightwork.kernel.events import TaskRecord  # records built by hand: the mirror's input
from lightwork.dashboard import feed, functions, orders
from lightwork.dashboard.mirror import Mirror

NAMES = ["etl.load", "etl.train", "etl.save"]


def _sync(first: int, count: int, budget: int = 1_000_000,
          seed: int = 0) -> tuple[dict[str, Any], bytes]:
    """A sync reply of ``count`` ended tasks with run and queued times spread over four
    orders of magnitude; some never ran (cancelled), some never had their arguments."""
    chooser = random.Random(seed * 1_000_003 + first)
    rows = []
    for i in range(first, first + count):
        t = 100.0 + i * 1e-3
        run = 10 ** chooser.uniform(-5, -1)
        queued = 10 ** chooser.uniform(-5, -1)
        cancelled = i % 37 == 0
        no_args = i % 41 == 0
        deps = 0.0 if no_args else t + 1e-4
        started = deps + queued if deps else t + 2e-4
        rows.append(TaskRecord(
            i, NAMES[i % 3], 0, t, worker_id=i % 3 + 1, deps_ready=deps,
            dispatched=started - 1e-6, started=0.0 if cancelled else started,
            args_loaded=0.0 if cancelled else started + 1e-6,
            finished=started + 1e-6 + run, stored=started + 2e-6 + run,
            state="FAILED" if i % 10 == 0 else "FINISHED"))
    facts, attached = feed.pack(rows)
    return helpers.sync_reply(facts, first + count, now=100.0 + (first + count) * 1e-3,
                              base=100.0, budget=budget), b"".join(attached)


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _brute(mirror: Mirror) -> dict[str, dict[str, Any]]:
    """Each function's figures, computed here from the columns of the rows kept."""
    f = mirror.floats
    out: dict[str, dict[str, Any]] = {}
    for row in range(mirror.rows):
        name = mirror.names[mirror.name_of[row]]
        figures = out.setdefault(name, {"states": {}, "runs": [], "queued": []})
        state = mirror.states[mirror.state_of[row]]
        figures["states"][state] = figures["states"].get(state, 0) + 1
        if f["args_loaded"][row]:
            figures["runs"].append(f["finished"][row] - f["args_loaded"][row])
        if f["deps_ready"][row]:
            until = f["started"][row] or f["dispatched"][row] or f["finished"][row]
            figures["queued"].append(max(0.0, until - f["deps_ready"][row]))
    return out


def _assert_like_brute_force(mirror: Mirror) -> None:
    summary = {row["name"]: row for row in mirror.function_summary()["functions"]}
    expected = _brute(mirror)
    assert set(summary) == set(expected)
    within = (functions.GAMMA - 1) / (functions.GAMMA + 1) + 1e-6  # 1%, and the rounding
    for name, figures in expected.items():
        row = summary[name]
        assert row["state_counts"] == figures["states"], name
        assert row["count"] == sum(figures["states"].values())
        for key, values in (("run", figures["runs"]), ("queued", figures["queued"])):
            for q in (0.5, 0.95):
                got = row[f"p{round(q * 100)}_{key}_s"]
                if not values:
                    assert got is None, (name, key)
                    continue
                exact = _nearest_rank(values, q)
                assert abs(got - exact) <= within * exact + 1e-6, (name, key, q, got, exact)
        assert row["mean_run_s"] == (pytest.approx(
            sum(figures["runs"]) / len(figures["runs"]), rel=1e-6, abs=1e-6)
            if figures["runs"] else None)
        assert row["total_queued_s"] == pytest.approx(sum(figures["queued"]), rel=1e-6, abs=1e-5)


def test_function_figures_match_a_brute_force_as_records_arrive_and_are_trimmed():
    mirror = Mirror()
    first = 0
    for count in (1, 700, 3_000, 0, 1_200):
        mirror.apply(*_sync(first, count, budget=4_000))
        first += count
        _assert_like_brute_force(mirror)
    assert mirror.trimmed > 0  # 4,901 records with a budget of 4,000: the oldest went
    assert mirror.rows == 4_000 - (4_901 - 4_000 - mirror.trimmed)


def test_a_function_whose_records_all_leave_leaves_the_view():
    mirror = Mirror()
    reply, attached = _sync(0, 30, budget=100)
    reply["tasks"]["names"] = ["gone.early"] * len(reply["tasks"]["names"])  # one function
    mirror.apply(reply, attached)
    for first in range(30, 230, 50):
        mirror.apply(*_sync(first, 50, budget=100))
    assert "gone.early" not in {row["name"] for row in mirror.function_summary()["functions"]}
    _assert_like_brute_force(mirror)


def test_percentiles_come_from_the_buckets_within_one_percent():
    for value in (1e-7, 3.3e-6, 0.01, 0.0123456, 1.0, 86_400.0):
        (bucket,) = functions._buckets([value])
        assert abs(functions.bucket_value(bucket) - value) <= 0.0100001 * value, value


class _Parked:
    """Makes one method of ``orders.SortOrder`` (or of another class of ``orders``) wait,
    in the sync thread, until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, method: str,
                 owner: type = orders.SortOrder) -> None:
        self.reached, self.release = threading.Event(), threading.Event()
        original = getattr(owner, method)

        def parked(this: Any, *args: Any) -> Any:
            self.reached.set()
            assert self.release.wait(10), "the test never released the sync thread"
            return original(this, *args)

        monkeypatch.setattr(owner, method, parked)


def _apply_in_thread(mirror: Mirror, reply: dict[str, Any], attached: bytes) -> threading.Thread:
    thread = threading.Thread(target=mirror.apply, args=(reply, attached), daemon=True)
    thread.start()
    return thread


def _answers_within(call: Any, timeout: float = 5.0) -> Any:
    """``call()`` from another thread; fails if it waits longer than ``timeout``."""
    return helpers.returns_within(call, timeout, "the request waited for the sync thread")


def test_requests_do_not_wait_for_a_sync_merging_its_rows(monkeypatch):
    mirror = Mirror()
    mirror.apply(*_sync(0, 5_000))
    parked = _Parked(monkeypatch, "merged")
    sync = _apply_in_thread(mirror, *_sync(5_000, 2_000))
    assert parked.reached.wait(10)
    # The new rows are staged in the columns but not published: every view shows the
    # 5,000 rows it had, consistently.
    page = _answers_within(lambda: mirror.tasks(sort="run_s", page_size=200))
    assert page["total"] == 5_000 and max(r["task_id"] for r in page["rows"]) < 5_000
    filtered = _answers_within(lambda: mirror.tasks(name="train", state="FINISHED"))
    assert all(r["task_id"] < 5_000 for r in filtered["rows"])
    summary = _answers_within(mirror.function_summary)
    assert sum(row["count"] for row in summary["functions"]) == 5_000
    assert _answers_within(mirror.overview)["tasks"]["recorded"] == 5_000
    assert all(span[4] < 5_000 for span in _answers_within(mirror.stream)["spans"])
    parked.release.set()
    sync.join(10)
    assert mirror.tasks(sort="run_s")["total"] == 7_000
    _assert_like_brute_force(mirror)


@pytest.mark.parametrize("step", ["renumbering the orders", "copying the columns"])
def test_requests_do_not_wait_for_a_trim(monkeypatch, step):
    mirror = Mirror()
    mirror.apply(*_sync(0, 2_000, budget=2_000))
    # The orders are renumbered first; the sort keys are copied last of the columns.
    parked = (_Parked(monkeypatch, "without_oldest") if step == "renumbering the orders"
              else _Parked(monkeypatch, "without_oldest", orders.SortKeys))
    sync = _apply_in_thread(mirror, *_sync(2_000, 300, budget=2_000))  # 2,300 > 2,200
    assert parked.reached.wait(10)
    page = _answers_within(lambda: mirror.tasks(sort="queued_s", descending=False))
    assert page["total"] == 2_300  # published, not yet trimmed
    parked.release.set()
    sync.join(10)
    assert mirror.trimmed == 300 and mirror.tasks()["total"] == 2_000
    assert {len(column) for column in mirror._row_columns()} == {2_000}
    ascending = [r["queued_s"] for r in mirror.tasks(sort="queued_s", descending=False,
                                                     page_size=200)["rows"]]
    assert ascending == sorted(ascending)
    assert min(r["task_id"] for r in mirror.tasks(sort="run_s", page_size=200)["rows"]) >= 300
    _assert_like_brute_force(mirror)


def test_a_sync_that_fails_half_way_leaves_the_mirror_as_it_was(monkeypatch):
    mirror = Mirror()
    mirror.apply(*_sync(0, 500))
    original = orders.SortOrder.merged

    def broken(order: orders.SortOrder, *args: Any) -> Any:
        raise MemoryError("merging failed")

    monkeypatch.setattr(orders.SortOrder, "merged", broken)
    with pytest.raises(MemoryError):
        mirror.apply(*_sync(500, 300))
    assert mirror.rows == 500 and all(
        len(column) == 500 for column in mirror._row_columns())
    monkeypatch.setattr(orders.SortOrder, "merged", original)
    mirror.apply(*_sync(500, 300))  # the same records again: they follow the first 500
    assert [r["task_id"] for r in mirror.tasks(sort="task_id", descending=False,
                                               page=2, page_size=200)["rows"]] == \
        list(range(400, 600))
    _assert_like_brute_force(mirror)
