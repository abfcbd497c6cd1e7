"""The tasks table's kept sort orders (``dashboard/orders.py``) against brute force:
merged as records arrive, read through a filter's mask, trimmed with the budget."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tests.dashboard.test_dashboard import _synthetic_sync

from lightwork.dashboard import orders
from lightwork.dashboard import table as table_module
from lightwork.dashboard.mirror import Mirror
from lightwork.dashboard.orders import FilteredOrder, SortOrder
from lightwork.dashboard.table import KEPT_ORDERS, MAX_FILTERS

NAMES = ["a.load", "b.train", "c.save", "d.eval"]


def _brute(values: list[float], rows: range | list[int]) -> list[int]:
    return sorted(rows, key=lambda r: (values[r], r))


@pytest.mark.parametrize("distinct", [3, 1_000_000])  # many ties, or nearly none
def test_sort_order_merges_new_rows_like_a_full_sort(monkeypatch, distinct):
    monkeypatch.setattr(orders, "SMALL_ORDER", 100)  # bisection past 100 kept rows
    chooser = random.Random(distinct)
    values: list[float] = []
    order = SortOrder()
    # Batches that outnumber the kept rows take the Timsort merge, the others bisection.
    for batch in (500, 3, 1, 40, 2_000, 7, 0, 60):
        values.extend(chooser.randrange(distinct) / 7 for _ in range(batch))
        order.extend(len(values), values.__getitem__)
        assert order.rows.tolist() == _brute(values, range(len(values))), batch
    order.rows = order.without_oldest(600)  # the mirror trimmed its oldest rows
    order.rows = order.without_oldest(400)  # ... twice
    kept = values[1_000:]
    order.extend(len(kept), kept.__getitem__)
    assert order.rows.tolist() == _brute(kept, range(len(kept)))
    kept += [kept[0], kept[-1], kept[0], -1.0, kept[7]]  # ties go after the kept rows
    order.extend(len(kept), kept.__getitem__)
    assert order.rows.tolist() == _brute(kept, range(len(kept)))


def test_filtered_order_reads_every_page_like_a_brute_force_both_ways():
    chooser = random.Random(7)
    values = [chooser.random() for _ in range(3_000)]
    order = SortOrder()
    order.extend(len(values), values.__getitem__)
    mask = bytearray(chooser.random() < 0.3 for _ in values)
    matching = _brute(values, [r for r in range(len(values)) if mask[r]])
    through = FilteredOrder(order.rows, mask, len(matching))
    for page_size in (1, 7, 100):
        for descending, expected in ((False, matching), (True, matching[::-1])):
            view = through.reversed() if descending else through
            pages = [view.slice(start, start + page_size)
                     for start in range(0, len(matching) + page_size, page_size)]
            assert [r for page in pages for r in page] == expected, (page_size, descending)
    assert through.slice(len(matching), len(matching) + 5) == []
    assert FilteredOrder(order.rows, bytearray(len(values)), 0).slice(0, 10) == []


def _exact(mirror: Mirror, key: str, row: int) -> float:
    """A row's sort value, computed from the columns here (not by the mirror's keys)."""
    f, n = mirror.floats, mirror.ints
    if key == "run_s":
        return f["finished"][row] - f["args_loaded"][row] if f["args_loaded"][row] else -1.0
    if key == "queued_s":
        until = f["started"][row] or f["dispatched"][row] or f["finished"][row]
        return max(0.0, until - f["deps_ready"][row]) if f["deps_ready"][row] and until else 0.0
    if key == "name":
        return mirror.names[mirror.name_of[row]]  # type: ignore[return-value]
    if key == "state":
        return mirror.states[mirror.state_of[row]]  # type: ignore[return-value]
    return n[key][row]


def _expected(mirror: Mirror, key: str, descending: bool, keep: Any = None) -> list[int]:
    rows = [r for r in range(len(mirror.state_of)) if keep is None or keep(r)]
    ordered = sorted(rows, key=lambda r: (_exact(mirror, key, r), r))
    return [mirror.ints["task_id"][r] for r in (ordered[::-1] if descending else ordered)]


def _table(mirror: Mirror, page_size: int = 200, **query: Any) -> list[int]:
    ids, page = [], 0
    while True:
        rows = mirror.tasks(page=page, page_size=page_size, **query)["rows"]
        ids += [r["task_id"] for r in rows]
        if len(rows) < page_size:
            return ids
        page += 1


def test_every_kept_order_pages_like_a_brute_force_as_records_arrive(monkeypatch):
    monkeypatch.setattr(table_module, "DIRECT_SORT_ROWS", 50)  # the mask path, small
    monkeypatch.setattr(orders, "SMALL_ORDER", 100)
    mirror = Mirror()
    mirror.apply(*_synthetic_sync(0, 2_000, NAMES, 10.0, scattered=True))
    trains = mirror.name_of[1]  # b.train's code (the second name seen)
    for batch_first, batch in ((2_000, 30), (2_030, 1), (2_031, 400)):
        mirror.apply(*_synthetic_sync(batch_first, batch, NAMES, 10.0, scattered=True))
        for key in KEPT_ORDERS:
            descending = key != "state"
            assert _table(mirror, sort=key, descending=descending) == \
                _expected(mirror, key, descending), key
        for key, descending in (("run_s", False), ("queued_s", True), ("worker_id", True)):
            assert _table(mirror, 13, name="train", sort=key, descending=descending) == \
                _expected(mirror, key, descending,
                          lambda r: mirror.name_of[r] == trains), key
        assert _table(mirror, state="FAILED", worker="3", sort="run_s") == _expected(
            mirror, "run_s", True,
            lambda r: mirror.states[mirror.state_of[r]] == "FAILED"
            and mirror.ints["worker_id"][r] == 3)


def test_kept_orders_stay_right_when_the_budget_trims_the_oldest():
    mirror = Mirror()
    reply, attached = _synthetic_sync(0, 1_000, NAMES, 5.0, scattered=True)
    reply["budget"] = 1_000
    mirror.apply(reply, attached)
    reply, attached = _synthetic_sync(1_000, 150, NAMES, 5.0, scattered=True)
    reply["budget"] = 1_000
    mirror.apply(reply, attached)  # over budget + 10%: the oldest 150 go
    assert mirror.trimmed == 150 and len(mirror.state_of) == 1_000
    for key in ("run_s", "result_size", "name"):
        assert _table(mirror, sort=key, descending=False) == _expected(mirror, key, False)
    assert min(_table(mirror, sort="run_s")) == 150


def test_the_filter_cache_is_bounded_and_answers_stay_right_after_eviction():
    mirror = Mirror()
    mirror.apply(*_synthetic_sync(0, 400, NAMES, 1.0, scattered=True))
    first = _table(mirror, worker="1", sort="run_s")
    for worker in range(2, 2 + 2 * MAX_FILTERS):
        mirror.tasks(worker=str(worker), sort="run_s")
    assert len(mirror.table.filter_cache) <= MAX_FILTERS
    assert len(mirror.table.sort_cache) <= MAX_FILTERS
    assert _table(mirror, worker="1", sort="run_s") == first == _expected(
        mirror, "run_s", True, lambda r: mirror.ints["worker_id"][r] == 1)


@pytest.mark.parametrize("scan_rows", [0, 100_000])  # kept orders' slices, or a scan
def test_filters_read_from_the_kept_orders_match_a_brute_force(monkeypatch, scan_rows):
    monkeypatch.setattr(table_module, "SCAN_ROWS", scan_rows)
    mirror = Mirror()
    mirror.apply(*_synthetic_sync(0, 1_500, NAMES, 3.0, scattered=True))
    queries = [{"name": "e"}, {"name": "b.train", "state": "FAILED"},
               {"state": "FINISHED", "worker": "2"}, {"worker": "4", "name": "load"},
               {"name": "nothing"}, {"state": "FAILED"}]

    def brute(query: dict[str, str]) -> list[int]:
        keep = [r for r in range(len(mirror.state_of))
                if ("name" not in query or query["name"].lower()
                    in mirror.names[mirror.name_of[r]].lower())
                and ("state" not in query
                     or mirror.states[mirror.state_of[r]] == query["state"])
                and ("worker" not in query
                     or mirror.ints["worker_id"][r] == int(query["worker"]))]
        return [mirror.ints["task_id"][r] for r in keep]

    for first, batch in ((1_500, 0), (1_500, 40), (1_540, 700)):
        mirror.apply(*_synthetic_sync(first, batch, NAMES, 3.0, scattered=True))
        for query in queries:
            got = _table(mirror, sort="submitted", descending=False, **query)
            assert got == brute(query), (query, batch)
    assert mirror.tasks(name="nothing")["total"] == 0


def test_masks_of_big_and_small_filters_match_a_brute_force(monkeypatch):
    monkeypatch.setattr(table_module, "DIRECT_SORT_ROWS", 10)  # sorted through the mask
    mirror = Mirror()
    names = ["x.load", "x.load", "x.load", "y.train"]  # "load" is three rows in four
    mirror.apply(*_synthetic_sync(0, 800, names, 2.0, scattered=True))
    queries = [{"state": "FINISHED"}, {"name": "load"}, {"name": "x"},
               {"state": "FINISHED", "name": "load"}, {"state": "FINISHED", "worker": "2"},
               {"name": "train", "worker": "4"}]
    for first, batch in ((800, 0), (800, 333)):
        mirror.apply(*_synthetic_sync(first, batch, names, 2.0, scattered=True))
        for query in queries:
            filters = (query.get("state", ""), query.get("name", ""),
                       int(query["worker"]) if "worker" in query else None)
            matching = mirror.table.matching(*filters)
            mask = mirror.table.mask(filters)
            assert [r for r in range(len(mirror.state_of)) if mask[r]] == \
                list(matching.as_list()), query
            got = _table(mirror, 17, sort="run_s", descending=False, **query)
            assert got == _expected(mirror, "run_s", False, mask.__getitem__), query
