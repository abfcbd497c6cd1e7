"""The tasks view: one page of the table, filtered and sorted on the server.

A :class:`Table` answers for one :class:`~lightwork.dashboard.mirror.Mirror`: it reads
the mirror's columns, its kept sort orders and their keys (the rows the mirror has
published, ``mirror.rows``), and owns only its caches. Every call runs under the
mirror's lock, taken by the mirror's ``tasks``.

Nothing walks every record per request, so a page stays fast at a million records:

* the default order (newest first) is the columns backwards: a page is ``page_size``
  reads;
* a filter's matching row numbers are cached and extended with the rows that arrived
  since (at most ``MAX_FILTERS`` filters are kept, the least recently asked goes
  first). Up to ``SCAN_ROWS`` new rows are scanned in C (``map`` of a comparison over a
  column's slice, ``compress``); more (a new filter on many records) are read as slices
  of the kept orders, where the rows of one name, state or worker sit together, found
  by bisection;
* every other order is a kept order (``orders.SortOrder``, merged as records arrive by
  the mirror's sync thread, never sorted whole here). A filtered view of up to
  ``DIRECT_SORT_ROWS`` rows sorts its own rows (cached, merged with the rows that came
  since); a larger one reads the kept order through the filter's mask (``orders.
  FilteredOrder``: a byte a row).

Live tasks (queued and running) come first, from the sync's live rows; they carry no
run time yet.
"""

from __future__ import annotations

import array
import bisect
import collections
import functools
import itertools
import operator
from typing import TYPE_CHECKING, Any

from lightwork.dashboard.orders import FilteredOrder

if TYPE_CHECKING:
    from lightwork.dashboard.mirror import Mirror

MAX_PAGE_SIZE = 200
MAX_FILTERS = 16  # filters whose matching rows are kept (the oldest asked goes first)
DIRECT_SORT_ROWS = 20_000  # a filtered view up to this size sorts its rows itself
SCAN_ROWS = 50_000  # new rows a filter scans; past this it reads the kept orders
LIVE_STATES = ("PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "SUBMITTED_TO_WORKER",
               "RUNNING", "RUNNING_IN_RAY_GET", "RUNNING_IN_RAY_WAIT")
SORT_KEYS = ("submitted", "task_id", "run_s", "queued_s", "arg_size", "result_size",
             "worker_id", "name", "state")
KEPT_ORDERS = SORT_KEYS[2:]  # the first two are the columns' own order
TASK_COLUMNS = ("task_id", "name", "state", "worker_id", "pid", "actor_id", "attempt",
                "submitted_s", "queued_s", "run_s", "arg_size", "result_size", "rss_peak",
                "rss_change", "retries", "error")


class Table:
    """The tasks view of one mirror, and its caches (see the module docstring)."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        # Row numbers as int32 arrays (4 bytes a row; a list of ints takes 36).
        self.filter_cache: dict[Any, list[Any]] = {}  # [rows scanned, rows, mask]
        self.sort_cache: dict[Any, tuple[int, array.array[int]]] = {}

    def forget(self) -> None:
        """The mirror renumbered its rows (a trim): every cached row number is stale."""
        self.filter_cache.clear()
        self.sort_cache.clear()

    def page(self, state: str, name: str, worker_id: int | None, sort: str,
             descending: bool, page: int, page_size: int) -> dict[str, Any]:
        """One page (arguments checked by the mirror, its lock held)."""
        m = self.mirror
        live = [r for r in m.live["rows"]
                if (not state or r[2] == state) and (not name or name_matches(r[1], name))
                and (worker_id is None or r[3] == worker_id)]
        if sort in ("submitted", "task_id"):
            live.sort(key=lambda r: r[0], reverse=descending)
        ended = self.matching(state, name, worker_id)
        order = self.ordered(ended, (state, name, worker_id), sort, descending)
        total = len(live) + len(order)
        first = page * page_size
        rows = [self.live_row(r) for r in live[first:first + page_size]]
        wanted = page_size - len(rows)
        start = max(0, first - len(live))
        if wanted > 0:
            rows += [self.ended_row(i) for i in order.slice(start, start + wanted)]
        return {"rows": rows, "total": total, "page": page, "page_size": page_size,
                "recorded": m.rows + m.live["total"], "columns": list(TASK_COLUMNS),
                "names": sorted(set(m.names)),
                "states": list(LIVE_STATES) + [s for s in m.states if s not in LIVE_STATES]}

    # ---------------------------------------------------------------- filters
    def matching(self, state: str, name: str, worker_id: int | None) -> Rows:
        """Row numbers of ended tasks matching the filters, oldest first (cached).

        Up to ``SCAN_ROWS`` rows not seen yet are scanned, in C: a ``map`` per filter over
        a slice of its column gives booleans, ``compress`` keeps the matching row numbers.
        More (a new filter on many records) are read from the kept sort orders instead:
        the rows of one value sit together there, oldest first, so each filter's rows
        are a slice found by bisection; the smallest is tested against the other filters.
        """
        m = self.mirror
        n = m.rows
        if not state and not name and worker_id is None:
            return Rows(None, n)
        if state and state not in m.state_index:
            return Rows([], n)
        key = (state, name, worker_id)
        cached = self.filter_cache.pop(key, None)  # and put back last: the newest asked
        if cached is None:
            cached = [0, array.array("i"), None]
            while len(self.filter_cache) >= MAX_FILTERS:
                oldest = next(iter(self.filter_cache))
                del self.filter_cache[oldest]
                for sort in KEPT_ORDERS:
                    self.sort_cache.pop((oldest, sort), None)
        self.filter_cache[key] = cached
        scanned, rows = cached[0], cached[1]
        if scanned < n:
            # (column, a C callable: value -> bool, the sort key, the values wanted)
            tests: list[tuple[Any, Any, str, set[int]]] = []
            if name:
                wanted = self.names_matching(name)
                only = next(iter(wanted)) if len(wanted) == 1 else None
                tests.append((m.name_of, wanted.__contains__ if only is None
                              else functools.partial(operator.eq, only), "name", wanted))
            if state:
                code = m.state_index[state]
                tests.append((m.state_of, functools.partial(operator.eq, code), "state",
                              {code}))
            if worker_id is not None:
                tests.append((m.ints["worker_id"], functools.partial(operator.eq, worker_id),
                              "worker_id", {worker_id}))
            if n - scanned > SCAN_ROWS:
                slices = [self.rows_with(sort, values, scanned) for _, _, sort, values in tests]
                smallest = min(range(len(tests)), key=lambda k: len(slices[k]))
                found: Any = slices[smallest]
                tests.pop(smallest)
            else:  # the first test scans the new rows
                column, test, _, _ = tests.pop(0)
                found = list(itertools.compress(range(scanned, n), map(test, column[scanned:n])))
            for column, test, _, _ in tests:  # each next one only the survivors
                if not found:
                    break
                values = ((column[found[0]],) if len(found) == 1
                          else operator.itemgetter(*found)(column))
                found = list(itertools.compress(found, map(test, values)))
            rows.extend(found)
            cached[0] = n
            cached[2] = None  # the mask is made again when asked for
        return Rows(rows, n)

    def rows_with(self, sort: str, values: set[int], since: int) -> array.array[int]:
        """Rows from ``since`` on whose ``sort`` column (a name or state index for those)
        is one of ``values``, ascending: slices of the column's kept order."""
        rows = self.mirror.orders[sort].rows
        pieces = []
        for low, high in self.ranges(sort, values):
            piece = rows[low:high]  # rows of one value: ascending
            pieces.append(piece[bisect.bisect_left(piece, since):] if since else piece)
        if len(pieces) == 1:
            return pieces[0]
        return array.array("i", sorted(itertools.chain.from_iterable(pieces)))

    def ranges(self, sort: str, values: set[int]) -> list[tuple[int, int]]:
        """Where the rows whose ``sort`` column is one of ``values`` sit in its kept order,
        as ascending (start, stop) positions."""
        m = self.mirror
        rows, key = m.orders[sort].rows, m.sort_key(sort)
        if sort in ("name", "state"):  # the order is by alphabetical rank
            ranks = m.keys.ranks[sort]
            values = {ranks[v] for v in values}
        ranges = []
        for value in sorted(values):
            low = bisect.bisect_left(rows, value, key=key)
            high = bisect.bisect_right(rows, value, low, key=key)
            if high > low:
                ranges.append((low, high))
        return ranges

    def mask(self, filters: Any) -> bytes | bytearray:
        """One byte a row, 1 where the row matches ``filters`` (after ``matching``).

        Marking the matching rows one by one costs a C call each; when they are more
        than half the rows, each filter's mask is made apart, cheaper (a state's with
        ``bytes.translate``; a name's or a worker's by marking the fewer of its rows or
        of the others, slices of the kept order), and the masks are and-ed as integers.
        """
        m = self.mirror
        cached = self.filter_cache[filters]
        if cached[2] is None:
            n, rows = cached[0], cached[1]
            if 2 * len(rows) <= n:
                mask: bytes | bytearray = _marked(bytearray(n), [rows], 1)
            else:
                state, name, worker_id = filters
                masks: list[bytes | bytearray] = []
                if state:
                    table = bytearray(256)
                    table[m.state_index[state]] = 1
                    masks.append(m.state_of[:n].tobytes().translate(table))
                if name:
                    masks.append(self.value_mask("name", self.names_matching(name)))
                if worker_id is not None:
                    masks.append(self.value_mask("worker_id", {worker_id}))
                mask = masks[0]
                if len(masks) > 1:
                    both = functools.reduce(operator.and_, (int.from_bytes(m, "little")
                                                             for m in masks))
                    mask = both.to_bytes(n, "little")
            cached[2] = mask
        return cached[2]

    def value_mask(self, sort: str, values: set[int]) -> bytearray:
        """1 for the rows whose ``sort`` column is one of ``values``."""
        ranges = self.ranges(sort, values)
        rows = self.mirror.orders[sort].rows
        if 2 * sum(high - low for low, high in ranges) <= len(rows):
            return _marked(bytearray(len(rows)), [rows[low:high] for low, high in ranges], 1)
        stops = [0] + [edge for pair in ranges for edge in pair] + [len(rows)]
        others = [rows[stops[k]:stops[k + 1]] for k in range(0, len(stops), 2)]
        return _marked(bytearray(b"\x01") * len(rows), others, 0)

    def names_matching(self, name: str) -> set[int]:
        return {i for i, full in enumerate(self.mirror.names) if name_matches(full, name)}

    # ---------------------------------------------------------------- orders
    def ordered(self, matched: Rows, filters: Any, sort: str,
                descending: bool) -> Rows | FilteredOrder:
        if sort in ("submitted", "task_id"):  # the columns' own order, near enough
            return matched.reversed() if descending else matched
        order = self.mirror.orders[sort]
        if matched.rows is None:
            every = Rows(order.rows, len(order))
            return every.reversed() if descending else every
        count = len(matched)
        if count > DIRECT_SORT_ROWS:
            through = FilteredOrder(order.rows, self.mask(filters), count)
            return through.reversed() if descending else through
        key = (filters, sort)
        cached = self.sort_cache.get(key)
        if cached is None or cached[0] != count:
            rows = matched.as_list()
            if cached is not None and cached[0] < count:
                merged = [*cached[1], *rows[cached[0]:]]  # a sorted run and the new tail
            else:
                merged = list(rows)
            merged.sort(key=self.mirror.sort_key(sort))
            cached = self.sort_cache[key] = (count, array.array("i", merged))
        ordered = Rows(cached[1], len(cached[1]))
        return ordered.reversed() if descending else ordered

    # ---------------------------------------------------------------- rows
    def ended_row(self, i: int) -> dict[str, Any]:
        m = self.mirror
        f, n = m.floats, m.ints
        run = m.keys.run_s[i]
        return {"task_id": n["task_id"][i], "name": m.names[m.name_of[i]],
                "state": m.states[m.state_of[i]],
                "worker_id": n["worker_id"][i] if n["worker_id"][i] > 0 else None,
                "pid": n["pid"][i] or m.known_workers.get(str(n["worker_id"][i]), {}).get("pid"),
                "actor_id": f"{n['actor_id'][i]:020x}" if n["actor_id"][i] else None,
                "attempt": n["attempt"][i],
                "submitted_s": _r(f["submitted"][i] - m.base),
                "queued_s": _r(m.keys.queued_s[i]),
                "run_s": _r(run) if f["finished"][i] and f["args_loaded"][i] else None,
                "arg_size": n["arg_size"][i], "result_size": n["result_size"][i],
                # its worker's peak resident bytes and their change (None: not measured)
                "rss_peak": n["rss_peak"][i] or None,
                "rss_change": n["rss_change"][i] if n["rss_peak"][i] else None,
                "retries": m.retries[i], "error": m.errors.get(i)}

    def live_row(self, r: list[Any]) -> dict[str, Any]:
        task_id, name, state, worker_id, actor_id, submitted, _dispatched, attempt = r[:8]
        return {"task_id": task_id, "name": name, "state": state,
                "is_debugger_paused": bool(r[8]) if len(r) > 8 else False,
                "worker_id": worker_id if worker_id > 0 else None, "pid": None,
                "actor_id": f"{actor_id:020x}" if actor_id else None, "attempt": attempt,
                "submitted_s": submitted / 1e6, "queued_s": None,  # (µs since the start)
                "run_s": None, "arg_size": None, "result_size": None, "rss_peak": None,
                "rss_change": None, "retries": 0, "error": None, "live": True}


class Rows:
    """Row numbers, without building the list when it is every row (``rows is None``)."""

    def __init__(self, rows: Any, n: int, backwards: bool = False) -> None:
        self.rows, self.n, self.backwards = rows, n, backwards

    def __len__(self) -> int:
        return self.n if self.rows is None else len(self.rows)

    def reversed(self) -> Rows:
        return Rows(self.rows, self.n, not self.backwards)

    def as_list(self) -> Any:
        """The row numbers (a list, or the cache's array: do not change it)."""
        return list(range(self.n)) if self.rows is None else self.rows

    def slice(self, start: int, stop: int) -> list[int]:
        size = len(self)
        stop = min(stop, size)
        if start >= stop:
            return []
        if self.backwards:
            positions = range(size - 1 - start, size - 1 - stop, -1)
        else:
            positions = range(start, stop)
        if self.rows is None:
            return list(positions)
        return [self.rows[p] for p in positions]


def name_matches(full: str, wanted: str) -> bool:
    """A function matches by its full name or its last part (``module.f`` matches ``f``)."""
    return full == wanted or full.rsplit(".", 1)[-1] == wanted or wanted.lower() in full.lower()


def _marked(mask: bytearray, pieces: list[Any], value: int) -> bytearray:
    """``mask`` with ``value`` at every row of ``pieces`` (in C: a ``map`` of setitem)."""
    for rows in pieces:
        collections.deque(map(mask.__setitem__, rows, itertools.repeat(value)), maxlen=0)
    return mask


def _r(seconds: float) -> float:
    """To the microsecond (``round(x, 6)`` is ten times slower: it goes through text)."""
    return int(seconds * 1e6 + (0.5 if seconds >= 0 else -0.5)) / 1e6
