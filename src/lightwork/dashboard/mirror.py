"""The dashboard process's copy of a session, and every query the page makes of it.

:class:`Mirror` applies the driver's incremental syncs (``feed.sync``) and answers the
views. It is the only state of the dashboard process; one lock guards it (the HTTP
handlers read, the sync thread writes).

Ended tasks are kept as columns (``array`` of float64/int64/int32, names and states as
small-int indexes into tables), 121 bytes per task in the columns (about 1 kB as a dict
per task), and 52 more in the kept sort orders (4 bytes a row each) and the sort keys
derived from the columns; a million tasks measured about 300 MB of the dashboard
process. The copy keeps as many
as the session's event budget (the driver's ring holds no more); past that the oldest
go in chunks of a tenth and are counted in ``trimmed``. Row numbers are positions in the
columns, so a trim shifts them: the kept orders are renumbered, the caches dropped.

Queries stay fast at a million records because nothing walks every record per request:

* the task stream walks back from the newest record until the window's start, and keeps
  at most ``MAX_STREAM_SPANS`` rectangles (the page says when the cap cut some);
* the tasks table's default order (newest first) is the columns backwards: a page is
  ``page_size`` reads. A filter's matching row numbers are cached and extended with the
  rows that arrived since (at most ``MAX_FILTERS`` filters are kept); more than
  ``SCAN_ROWS`` rows to look at are read as slices of the kept orders below (the rows
  of one name, state or worker sit together there) instead of scanned. Every other sort
  order is kept for all rows, extended as records arrive (``orders.SortOrder``: the
  new rows are merged in, nothing is sorted whole at request time), by the sync thread
  after each sync (``refresh_orders``) or, for rows it has not reached, by the request.
  A filtered view of up to ``DIRECT_SORT_ROWS`` rows sorts them (cached, re-sorted as
  rows arrive); a larger one reads the column's kept order through the filter's mask.
  Scans and sort keys run in C (``map``/``compress`` over column slices,
  ``array.__getitem__`` keys);
* per-function counts, queued time and run times are kept as records arrive; the
  percentiles sort a function's run times when asked (cached until it gets more);
* history (tasks by state, finished count) is one point per sync, bounded.

Live tasks (queued and running) come whole with each sync, at most ``live_limit`` of
them (the page says when there are more).
"""

from __future__ import annotations

import array
import bisect
import collections
import functools
import itertools
import operator
import threading
import time
from collections import deque
from typing import Any

from lightwork.dashboard.orders import FilteredOrder, SortOrder
from lightwork.dashboard.wire import (
    FLOAT_COLUMNS,
    INT_COLUMNS,
    NAME_CODE,
    ROW_BYTES,
    STATE_CODE,
    attached_size,
)

MAX_STREAM_SPANS = 4_000
MAX_PAGE_SIZE = 200
HISTORY_POINTS = 3_600
MAX_DRIVER_SPANS = 100_000
PERCENTILE_REFRESH_S = 5.0
MAX_FILTERS = 16  # filters whose matching rows are kept (the oldest asked goes first)
DIRECT_SORT_ROWS = 20_000  # a filtered view up to this size sorts its rows itself
SCAN_ROWS = 50_000  # new rows a filter scans; past this it reads the kept orders
ENDED_STATES = ("FINISHED", "FAILED")
LIVE_STATES = ("PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "SUBMITTED_TO_WORKER",
               "RUNNING", "RUNNING_IN_RAY_GET", "RUNNING_IN_RAY_WAIT")
SORT_KEYS = ("submitted", "task_id", "run_s", "queued_s", "arg_size", "result_size",
             "worker_id", "name", "state")
KEPT_ORDERS = SORT_KEYS[2:]  # the first two are the columns' own order
TASK_COLUMNS = ("task_id", "name", "state", "worker_id", "pid", "actor_id", "attempt",
                "submitted_s", "queued_s", "run_s", "arg_size", "result_size", "retries", "error")


class Mirror:
    """A session as the dashboard process knows it."""

    def __init__(self, session: str = "") -> None:
        self.lock = threading.Lock()
        self.session = session
        self.ended = False
        self.end_reason = ""
        self.synced_at = 0.0  # monotonic time of the last sync (driver clock = ours)
        self.syncs = 0
        self.generation = 0  # bumps when the data changes
        self.base = 0.0
        self.base_wall = 0.0
        self.now = 0.0
        self.budget = 200_000
        self.task_cursor = 0
        self.span_cursor = 0
        self.lost = 0  # records that left the driver's ring before we read them
        self.trimmed = 0  # records we dropped to stay within the budget
        self.driver_cost_s = 0.0  # the driver's time spent on the last sync
        self.driver_fixed_cost_s = 0.0  # ... less the part spent on its records
        # Ended tasks, by column.
        self.floats = {name: array.array("d") for name in FLOAT_COLUMNS}
        self.ints = {name: array.array("q") for name in INT_COLUMNS}
        self.name_of = array.array("i")
        self.state_of = array.array("b")
        self.retries = array.array("i")
        self.errors: dict[int, str] = {}
        self.names: list[str] = []
        self._name_index: dict[str, int] = {}
        self.states: list[str] = list(ENDED_STATES)
        self._state_index = {s: i for i, s in enumerate(self.states)}
        # Per function: [counts by state index, queued total, run times].
        self.functions: dict[int, list[Any]] = {}
        self._percentiles: dict[int, tuple[int, Any, Any, Any, float]] = {}
        self.ended_counts: dict[str, int] = {}
        self.driver_spans: deque[list[Any]] = deque(maxlen=MAX_DRIVER_SPANS)
        self.history: deque[list[Any]] = deque(maxlen=HISTORY_POINTS)
        # Row numbers as int32 arrays (4 bytes a row; a list of ints takes 36).
        self._filter_cache: dict[Any, list[Any]] = {}  # [rows scanned, rows, mask]
        self._orders = {key: SortOrder() for key in KEPT_ORDERS}
        self._sort_cache: dict[Any, tuple[int, array.array[int]]] = {}
        self._derived: dict[str, list[Any]] = {}  # sort keys derived from the columns
        # The live picture, replaced whole by every sync.
        self.live: dict[str, Any] = {"counts": {}, "rows": [], "total": 0}
        self.resources: dict[str, list[float]] = {}
        self.workers: list[dict[str, Any]] = []
        self.known_workers: dict[str, Any] = {}
        self.actors: list[dict[str, Any]] = []
        self.actor_count = 0
        self.store: dict[str, Any] = {}
        self.findings: list[dict[str, Any]] | None = None
        self.progress: list[dict[str, Any]] = []
        self.graphs: list[dict[str, Any]] = []  # running Dask graphs

    # ---------------------------------------------------------------- applying syncs
    def apply(self, reply: dict[str, Any], attached: bytes = b"") -> int:
        """Take one sync reply in (with the bytes attached to it, ``wire``'s layout);
        return how many task records it carried."""
        with self.lock:
            self.session = reply["session"]
            self.base, self.base_wall = reply["base"], reply["base_wall"]
            self.now = reply["now"]
            self.budget = max(1, int(reply["budget"] or 1))
            self.driver_cost_s = float(reply.get("cost_s", 0.0))
            self.driver_fixed_cost_s = float(reply.get("fixed_cost_s", self.driver_cost_s))
            tasks = reply["tasks"]
            self.lost += int(tasks["lost"])
            count = int(tasks["count"])
            if count:
                self._add_tasks(tasks, attached)
            self.task_cursor = int(tasks["cursor"])
            spans = reply["spans"]
            self.driver_spans.extend(spans["rows"])
            self.span_cursor = int(spans["cursor"])
            self.live = reply["live"]
            self.resources = reply["resources"]
            self.workers = reply["workers"]
            self.known_workers.update(reply["known_workers"])
            for row in self.workers:
                if row["worker_id"]:
                    info = self.known_workers.setdefault(str(row["worker_id"]), {})
                    info.update(pid=row["pid"], actor_class=row["actor_class"],
                                actor_id=row["actor_id"])
            self.actors = reply["actors"]
            self.actor_count = reply["actor_count"]
            self.store = reply["store"]
            self.findings = reply["findings"]
            self.progress = reply["progress"]
            self.graphs = reply.get("graphs") or []
            self.history.append([self.now, dict(self.live["counts"]),
                                 self.ended_counts.get("FINISHED", 0),
                                 self.ended_counts.get("FAILED", 0)])
            self.synced_at = time.monotonic()
            self.syncs += 1
            self.generation += 1
            if len(self.state_of) > self.budget + self.budget // 10:
                self._trim(len(self.state_of) - self.budget)
            return count

    def mark_ended(self, reason: str, replace: bool = False) -> None:
        """The session ended; ``replace`` rewrites the reason of one already marked."""
        with self.lock:
            if not self.ended:
                self.ended, self.end_reason = True, reason
                self.live = {"counts": {}, "rows": [], "total": 0}
                self.progress = []
                self.graphs = []
                self.generation += 1
            elif replace and self.end_reason != reason:
                self.end_reason = reason
                self.generation += 1

    def _add_tasks(self, tasks: dict[str, Any], attached: bytes) -> None:
        first = len(self.state_of)
        count = int(tasks["count"])
        if len(attached) != attached_size(count):
            raise ValueError(f"a sync's attached records ({len(attached)} bytes) do not match "
                             f"its count ({count})")
        rows_end = count * ROW_BYTES
        # Rows of ROW_FORMAT: view the rows as doubles and as int64s (no copy), and take
        # each column with a strided slice (in C; one column's bytes at a time).
        width = len(self.floats) + len(self.ints)
        rows = memoryview(attached)[:rows_end]
        as_floats, as_ints = rows.cast("d"), rows.cast("q")
        for k, float_column in enumerate(self.floats.values()):  # FLOAT_COLUMNS order
            float_column.frombytes(as_floats[k::width].tobytes())
        for k, int_column in enumerate(self.ints.values(), start=len(self.floats)):
            int_column.frombytes(as_ints[k::width].tobytes())
        name_codes = array.array(NAME_CODE, attached[rows_end:rows_end + 4 * count])
        state_codes = array.array(STATE_CODE, attached[rows_end + 4 * count:])
        # The reply's tables, as positions in ours (new names and states are added).
        names = [self._name_index.get(n) if n in self._name_index else self._intern_name(n)
                 for n in map(str, tasks["names"])]
        states = [self._state_index.get(n) if n in self._state_index else self._intern_state(n)
                  for n in map(str, tasks["states"])]
        try:
            self.name_of.extend(map(names.__getitem__, name_codes))
            self.state_of.extend(map(states.__getitem__, state_codes))
        except IndexError:
            raise ValueError("a sync's name or state code is outside its table") from None
        self.retries.extend(array.array("i", bytes(4 * count)))  # zeros; sparse below
        for i, n in tasks.get("retries", ()):
            self.retries[first + int(i)] = int(n)
        for i, text in tasks["errors"]:
            self.errors[first + int(i)] = str(text)
        self._account(first)
        for code, n in _count(state_codes).items():
            state_name = tasks["states"][code]
            self.ended_counts[state_name] = self.ended_counts.get(state_name, 0) + n

    def _intern_name(self, name: str) -> int:
        self._name_index[name] = len(self.names)
        self.names.append(name)
        return self._name_index[name]

    def _intern_state(self, state: str) -> int:
        self._state_index[state] = len(self.states)
        self.states.append(state)
        return self._state_index[state]

    def _trim(self, n: int) -> None:
        """Forget the oldest ``n`` ended records (the copy stays within the budget)."""
        columns: list[array.array[Any]] = [*self.floats.values(), *self.ints.values(),
                                            self.name_of, self.state_of, self.retries]
        for column in columns:
            del column[:n]
        self.errors = {row - n: text for row, text in self.errors.items() if row >= n}
        self.trimmed += n
        self._filter_cache.clear()
        self._sort_cache.clear()
        self._derived.clear()
        for order in self._orders.values():
            order.drop_oldest(n)
        # Per-function figures describe the records kept: recount them.
        self.functions.clear()
        self._percentiles.clear()
        self._account(0)

    def _account(self, first: int) -> None:
        """Add rows ``first`` onwards to the per-function counts, queued and run times."""
        loaded, finished = self.floats["args_loaded"], self.floats["finished"]
        deps, begun = self.floats["deps_ready"], self.floats["started"]
        dispatched = self.floats["dispatched"]
        for row in range(first, len(self.state_of)):
            group = self.functions.get(self.name_of[row])
            if group is None:
                group = self.functions[self.name_of[row]] = [{}, 0.0, array.array("d")]
            state = self.state_of[row]
            group[0][state] = group[0].get(state, 0) + 1
            if deps[row]:
                until = begun[row] or dispatched[row] or finished[row]
                group[1] += max(0.0, until - deps[row]) if until else 0.0
            if finished[row] and loaded[row]:
                group[2].append(finished[row] - loaded[row])

    # ---------------------------------------------------------------- views
    def header(self) -> dict[str, Any]:
        """What every view carries: session, liveness, and the banners to show."""
        banners = []
        if self.lost:
            banners.append(f"{self.lost:,} task records left the session's event log before "
                           "the dashboard read them (budget "
                           f"{self.budget:,}; raise it with init(event_budget=...))")
        if self.trimmed:
            banners.append(f"the dashboard keeps the newest {self.budget:,} task records "
                           f"(the event budget); {self.trimmed:,} older ones are not shown")
        if self.live["total"] > len(self.live["rows"]):
            banners.append(f"{self.live['total']:,} tasks are queued or running; the table "
                           f"lists the first {len(self.live['rows']):,} of them")
        if self.actor_count > len(self.actors):
            banners.append(f"{self.actor_count:,} actors; the actors view lists the first "
                           f"{len(self.actors):,}")
        return {"session": self.session, "ended": self.ended, "end_reason": self.end_reason,
                "synced_ago_s": round(time.monotonic() - self.synced_at, 1)
                if self.synced_at else None,
                "generation": self.generation, "banners": banners}

    def overview(self, history_s: float = 300.0) -> dict[str, Any]:
        with self.lock:
            since = self.now - history_s
            history = [point for point in self.history if point[0] >= since]
            throughput = _rate(history, 10.0)
            return {
                **self.header(),
                "uptime_s": self.now - self.base if self.base else 0.0,
                "resources": self.resources,
                "workers": self.workers,
                "tasks": {"live": self.live["counts"], "ended": self.ended_counts,
                          "recorded": len(self.state_of)},
                "history": [[round(t - self.base, 3), live, done, failed]
                            for t, live, done, failed in history],
                "throughput": throughput,
                "actors": _count(row["state"] for row in self.actors),
                "actor_count": self.actor_count,
                "store": self.store,
                "findings": self.findings,
                "progress": [{**call, "since": round(self.now - call["since"], 3)}
                             for call in self.progress],
                "graphs": [{**graph, "since": round(self.now - graph["since"], 3)}
                           for graph in self.graphs],
                "driver_cost_s": self.driver_cost_s,
            }

    def stream(self, window_s: float = 30.0, max_spans: int = MAX_STREAM_SPANS) -> dict[str, Any]:
        """The last ``window_s`` seconds: task spans per worker row, the driver's blocked
        spans, running tasks; times in seconds since the session began."""
        window_s = min(max(1.0, window_s), 3600.0)
        with self.lock:
            end = self.now
            start = end - window_s
            base = self.base
            f = self.floats
            begun, loaded, finished, stored = (f["started"], f["args_loaded"], f["finished"],
                                               f["stored"])
            worker_of, task_ids = self.ints["worker_id"], self.ints["task_id"]
            spans: list[list[Any]] = []
            capped = False
            row = len(self.state_of) - 1
            # Records arrive in the order the driver saw them end; a task that ended
            # long before its record came back still sits near its neighbours, so the
            # walk stops a little past the window's start.
            stop_at = start - 5.0
            while row >= 0:
                done = stored[row] or finished[row]
                if not done:  # cancelled before it ran: nothing to draw
                    row -= 1
                    continue
                if done < stop_at:
                    break
                if done >= start:
                    if len(spans) >= max_spans:
                        capped = True
                        break
                    opened = begun[row] or loaded[row] or done
                    spans.append([worker_of[row], self.name_of[row], _r(opened - base),
                                  _r(done - base), task_ids[row], _r(loaded[row] - base),
                                  _r(finished[row] - base), self.state_of[row]])
                row -= 1
            running = [[r[3], r[1], _r((r[6] or r[5]) - base), r[0], r[2]]
                       for r in self.live["rows"] if str(r[2]).startswith("RUNNING")]
            driver = [[kind, _r(s - base), _r(e - base), count, where]
                      for kind, s, e, count, _thread, where in self.driver_spans if e >= start]
            rows = self._stream_rows({s[0] for s in spans} | {r[0] for r in running})
            return {**self.header(), "start": _r(start - base), "end": _r(end - base),
                    "names": self.names, "states": self.states, "rows": rows, "spans": spans,
                    "running": running, "driver": driver, "capped": capped,
                    "max_spans": max_spans}

    def _stream_rows(self, worker_ids: set[Any]) -> list[dict[str, Any]]:
        live = {row["worker_id"] for row in self.workers}
        rows = []
        for worker_id in sorted(worker_ids | (live - {0})):
            info = self.known_workers.get(str(worker_id), {})
            label = info.get("label") or (  # a cluster run labels its rows (address, pid)
                f"{info['actor_class']} (actor)" if info.get("actor_class")
                else f"worker {worker_id}")
            rows.append({"worker_id": worker_id, "label": label, "pid": info.get("pid"),
                         "alive": worker_id in live})
        return rows

    def tasks(self, state: str = "", name: str = "", worker: str = "", sort: str = "submitted",
              descending: bool = True, page: int = 0, page_size: int = 100) -> dict[str, Any]:
        if sort not in SORT_KEYS:
            raise ValueError(f"cannot sort tasks by {sort!r}; choose one of {', '.join(SORT_KEYS)}")
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be between 1 and {MAX_PAGE_SIZE}, got {page_size}")
        if page < 0:
            raise ValueError(f"page must be >= 0, got {page}")
        worker_id = None
        if worker:
            try:
                worker_id = int(worker)
            except ValueError:
                raise ValueError(f"worker must be a worker id (an integer), got {worker!r}") from None
        with self.lock:
            live = [r for r in self.live["rows"]
                    if (not state or r[2] == state) and (not name or _name_matches(r[1], name))
                    and (worker_id is None or r[3] == worker_id)]
            if sort in ("submitted", "task_id"):
                live.sort(key=lambda r: r[0], reverse=descending)
            ended = self._matching(state, name, worker_id)
            order = self._ordered(ended, (state, name, worker_id), sort, descending)
            total = len(live) + len(order)
            first = page * page_size
            rows = [self._live_row(r) for r in live[first:first + page_size]]
            wanted = page_size - len(rows)
            start = max(0, first - len(live))
            if wanted > 0:
                rows += [self._ended_row(i) for i in order.slice(start, start + wanted)]
            return {**self.header(), "rows": rows, "total": total, "page": page,
                    "page_size": page_size, "recorded": len(self.state_of) + self.live["total"],
                    "columns": list(TASK_COLUMNS), "names": sorted(set(self.names)),
                    "states": list(LIVE_STATES) + [s for s in self.states if s not in LIVE_STATES]}

    def _matching(self, state: str, name: str, worker_id: int | None) -> _Rows:
        """Row numbers of ended tasks matching the filters, oldest first (cached).

        Up to ``SCAN_ROWS`` rows not seen yet are scanned, in C: a ``map`` per filter over
        a slice of its column gives booleans, ``compress`` keeps the matching row numbers.
        More (a new filter on many records) are read from the kept sort orders instead:
        the rows of one value sit together there, oldest first, so each filter's rows
        are a slice found by bisection; the smallest is tested against the other filters.
        """
        n = len(self.state_of)
        if not state and not name and worker_id is None:
            return _Rows(None, n)
        if state and state not in self._state_index:
            return _Rows([], n)
        key = (state, name, worker_id)
        cached = self._filter_cache.pop(key, None)  # and put back last: the newest asked
        if cached is None:
            cached = [0, array.array("i"), None]
            while len(self._filter_cache) >= MAX_FILTERS:
                oldest = next(iter(self._filter_cache))
                del self._filter_cache[oldest]
                for sort in KEPT_ORDERS:
                    self._sort_cache.pop((oldest, sort), None)
        self._filter_cache[key] = cached
        scanned, rows = cached[0], cached[1]
        if scanned < n:
            # (column, a C callable: value -> bool, the sort key, the values wanted)
            tests: list[tuple[Any, Any, str, set[int]]] = []
            if name:
                wanted = self._names_matching(name)
                only = next(iter(wanted)) if len(wanted) == 1 else None
                tests.append((self.name_of, wanted.__contains__ if only is None
                              else functools.partial(operator.eq, only), "name", wanted))
            if state:
                code = self._state_index[state]
                tests.append((self.state_of, functools.partial(operator.eq, code), "state",
                              {code}))
            if worker_id is not None:
                tests.append((self.ints["worker_id"], functools.partial(operator.eq, worker_id),
                              "worker_id", {worker_id}))
            if n - scanned > SCAN_ROWS:
                slices = [self._rows_with(sort, values, scanned) for _, _, sort, values in tests]
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
        return _Rows(rows, n)

    def _rows_with(self, sort: str, values: set[int], since: int) -> array.array[int]:
        """Rows from ``since`` on whose ``sort`` column (a name or state index for those)
        is one of ``values``, ascending: slices of the column's kept order."""
        ranges = self._ranges(sort, values)  # first: it brings the order up to date
        rows = self._orders[sort].rows
        pieces = []
        for low, high in ranges:
            piece = rows[low:high]  # rows of one value: ascending
            pieces.append(piece[bisect.bisect_left(piece, since):] if since else piece)
        if len(pieces) == 1:
            return pieces[0]
        return array.array("i", sorted(itertools.chain.from_iterable(pieces)))

    def _ranges(self, sort: str, values: set[int]) -> list[tuple[int, int]]:
        """Where the rows whose ``sort`` column is one of ``values`` sit in its kept order
        (brought up to date first), as ascending (start, stop) positions."""
        order, key = self._orders[sort], self._sort_key(sort)
        order.extend(len(self.state_of), key)
        if sort in ("name", "state"):  # the order is by alphabetical rank
            ranks = self._derived[sort][1]
            values = {ranks[v] for v in values}
        ranges = []
        for value in sorted(values):
            low = bisect.bisect_left(order.rows, value, key=key)
            high = bisect.bisect_right(order.rows, value, low, key=key)
            if high > low:
                ranges.append((low, high))
        return ranges

    def _mask(self, filters: Any) -> bytes | bytearray:
        """One byte a row, 1 where the row matches ``filters`` (after ``_matching``).

        Marking the matching rows one by one costs a C call each; when they are more
        than half the rows, each filter's mask is made apart, cheaper (a state's with
        ``bytes.translate``; a name's or a worker's by marking the fewer of its rows or
        of the others, slices of the kept order), and the masks are and-ed as integers.
        """
        cached = self._filter_cache[filters]
        if cached[2] is None:
            n, rows = cached[0], cached[1]
            if 2 * len(rows) <= n:
                mask: bytes | bytearray = _marked(bytearray(n), [rows], 1)
            else:
                state, name, worker_id = filters
                masks: list[bytes | bytearray] = []
                if state:
                    table = bytearray(256)
                    table[self._state_index[state]] = 1
                    masks.append(self.state_of.tobytes().translate(table))
                if name:
                    masks.append(self._value_mask("name", self._names_matching(name)))
                if worker_id is not None:
                    masks.append(self._value_mask("worker_id", {worker_id}))
                mask = masks[0]
                if len(masks) > 1:
                    both = functools.reduce(operator.and_, (int.from_bytes(m, "little")
                                                             for m in masks))
                    mask = both.to_bytes(n, "little")
            cached[2] = mask
        return cached[2]

    def _value_mask(self, sort: str, values: set[int]) -> bytearray:
        """1 for the rows whose ``sort`` column is one of ``values``."""
        ranges = self._ranges(sort, values)
        rows = self._orders[sort].rows
        if 2 * sum(high - low for low, high in ranges) <= len(rows):
            return _marked(bytearray(len(rows)), [rows[low:high] for low, high in ranges], 1)
        stops = [0] + [edge for pair in ranges for edge in pair] + [len(rows)]
        others = [rows[stops[k]:stops[k + 1]] for k in range(0, len(stops), 2)]
        return _marked(bytearray(b"\x01") * len(rows), others, 0)

    def _names_matching(self, name: str) -> set[int]:
        return {i for i, full in enumerate(self.names) if _name_matches(full, name)}

    def refresh_orders(self) -> None:
        """Merge the rows that arrived into every kept sort order (the sync thread calls
        this after a sync; the lock is taken per order, so a request waits for one)."""
        for sort, order in self._orders.items():
            with self.lock:
                order.extend(len(self.state_of), self._sort_key(sort))

    def _ordered(self, matched: _Rows, filters: Any, sort: str,
                 descending: bool) -> _Rows | FilteredOrder:
        if sort in ("submitted", "task_id"):  # the columns' own order, near enough
            return matched.reversed() if descending else matched
        order = self._orders[sort]
        order.extend(len(self.state_of), self._sort_key(sort))
        if matched.rows is None:
            every = _Rows(order.rows, len(order))
            return every.reversed() if descending else every
        count = len(matched)
        if count > DIRECT_SORT_ROWS:
            through = FilteredOrder(order.rows, self._mask(filters), count)
            return through.reversed() if descending else through
        key = (filters, sort)
        cached = self._sort_cache.get(key)
        if cached is None or cached[0] != count:
            rows = matched.as_list()
            if cached is not None and cached[0] < count:
                merged = [*cached[1], *rows[cached[0]:]]  # a sorted run and the new tail
            else:
                merged = list(rows)
            merged.sort(key=self._sort_key(sort))
            cached = self._sort_cache[key] = (count, array.array("i", merged))
        ordered = _Rows(cached[1], len(cached[1]))
        return ordered.reversed() if descending else ordered

    def _sort_key(self, sort: str) -> Any:
        """A C-level key: ``__getitem__`` of a column, or of a derived column kept up to
        date with the rows (run and queued times; name and state by alphabetical rank)."""
        if sort in self.ints:
            return self.ints[sort].__getitem__
        n = len(self.state_of)
        derived = self._derived.get(sort)
        if sort in ("name", "state"):
            labels = self.names if sort == "name" else self.states
            of = self.name_of if sort == "name" else self.state_of
            if derived is None or derived[0] != len(labels):  # a new label moves the ranks
                ranks = [0] * len(labels)
                for rank, index in enumerate(sorted(range(len(labels)), key=labels.__getitem__)):
                    ranks[index] = rank
                # A state's rank fits a byte (they are few): 1 byte a row, not 4.
                derived = self._derived[sort] = [len(labels), ranks,
                                                 array.array("i" if sort == "name" else "b")]
            values = derived[2]
            if len(values) < n:
                values.extend(map(derived[1].__getitem__, of[len(values):n]))
            return values.__getitem__
        if derived is None:
            derived = self._derived[sort] = [0, None, array.array("d")]
        values = derived[2]
        if len(values) < n:
            first = len(values)
            if sort == "run_s":
                f = self.floats
                loaded = f["args_loaded"][first:n]
                values.extend(map(operator.sub, f["finished"][first:n], loaded))
                # Never started (cancelled, failed before running): first when ascending.
                for i in itertools.compress(range(first, n), map(operator.not_, loaded)):
                    values[i] = -1.0
            else:  # queued_s
                values.extend(self._queued(i) for i in range(first, n))
        return values.__getitem__

    def _queued(self, row: int) -> float:
        f = self.floats
        deps = f["deps_ready"][row]
        if not deps:
            return 0.0
        until = f["started"][row] or f["dispatched"][row] or f["finished"][row]
        return max(0.0, until - deps) if until else 0.0

    def _ended_row(self, i: int) -> dict[str, Any]:
        f, n = self.floats, self.ints
        run = f["finished"][i] - f["args_loaded"][i] if f["finished"][i] and f["args_loaded"][i] \
            else None
        return {"task_id": n["task_id"][i], "name": self.names[self.name_of[i]],
                "state": self.states[self.state_of[i]],
                "worker_id": n["worker_id"][i] if n["worker_id"][i] > 0 else None,
                "pid": n["pid"][i] or self.known_workers.get(str(n["worker_id"][i]), {}).get("pid"),
                "actor_id": f"{n['actor_id'][i]:020x}" if n["actor_id"][i] else None,
                "attempt": n["attempt"][i],
                "submitted_s": _r(f["submitted"][i] - self.base),
                "queued_s": _r(self._queued(i)), "run_s": _r(run) if run is not None else None,
                "arg_size": n["arg_size"][i], "result_size": n["result_size"][i],
                "retries": self.retries[i], "error": self.errors.get(i)}

    def _live_row(self, r: list[Any]) -> dict[str, Any]:
        task_id, name, state, worker_id, actor_id, submitted, _dispatched, attempt = r
        return {"task_id": task_id, "name": name, "state": state,
                "worker_id": worker_id if worker_id > 0 else None, "pid": None,
                "actor_id": f"{actor_id:020x}" if actor_id else None, "attempt": attempt,
                "submitted_s": _r(submitted - self.base), "queued_s": None, "run_s": None,
                "arg_size": None, "result_size": None, "retries": 0, "error": None,
                "live": True}

    def function_summary(self) -> dict[str, Any]:
        with self.lock:
            live_by_name: dict[str, dict[str, int]] = {}
            for r in self.live["rows"]:
                counts = live_by_name.setdefault(r[1], {})
                counts[r[2]] = counts.get(r[2], 0) + 1
            functions = []
            for index, (by_state, queued, runs) in self.functions.items():
                name = self.names[index]
                p50, p95, mean = self._run_percentiles(index, runs)
                counts = {self.states[s]: c for s, c in by_state.items()}
                counts.update(live_by_name.pop(name, {}))
                functions.append({"name": name, "count": sum(counts.values()),
                                  "state_counts": counts, "p50_run_s": p50, "p95_run_s": p95,
                                  "mean_run_s": mean,
                                  "total_queued_s": _r(queued)})
            for name, counts in live_by_name.items():
                functions.append({"name": name, "count": sum(counts.values()),
                                  "state_counts": counts, "p50_run_s": None, "p95_run_s": None,
                                  "mean_run_s": None, "total_queued_s": None})
            functions.sort(key=lambda s: (-s["count"], s["name"]))
            return {**self.header(), "functions": functions}

    def _run_percentiles(self, index: int, runs: array.array) -> tuple[Any, Any, Any]:
        """p50, p95 and mean of a function's run times: computed again when it has more,
        at most every ``PERCENTILE_REFRESH_S`` (a million times cost a sort of ~0.1 s)."""
        cached = self._percentiles.get(index)
        now = time.monotonic()
        if cached is not None and (cached[0] == len(runs)
                                   or now - cached[4] < PERCENTILE_REFRESH_S):
            return cached[1], cached[2], cached[3]
        ordered = sorted(runs)
        p50, p95 = _percentile(ordered, 0.5), _percentile(ordered, 0.95)
        mean = _r(sum(ordered) / len(ordered)) if ordered else None
        self._percentiles[index] = (len(runs), p50, p95, mean, now)
        return p50, p95, mean

    def actor_view(self) -> dict[str, Any]:
        with self.lock:
            return {**self.header(), "actors": self.actors, "total": self.actor_count}


class _Rows:
    """Row numbers, without building the list when it is every row (``rows is None``)."""

    def __init__(self, rows: Any, n: int, backwards: bool = False) -> None:
        self.rows, self.n, self.backwards = rows, n, backwards

    def __len__(self) -> int:
        return self.n if self.rows is None else len(self.rows)

    def reversed(self) -> _Rows:
        return _Rows(self.rows, self.n, not self.backwards)

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


def _name_matches(full: str, wanted: str) -> bool:
    """A function matches by its full name or its last part (``module.f`` matches ``f``)."""
    return full == wanted or full.rsplit(".", 1)[-1] == wanted or wanted.lower() in full.lower()


def _marked(mask: bytearray, pieces: list[Any], value: int) -> bytearray:
    """``mask`` with ``value`` at every row of ``pieces`` (in C: a ``map`` of setitem)."""
    for rows in pieces:
        collections.deque(map(mask.__setitem__, rows, itertools.repeat(value)), maxlen=0)
    return mask


def _count(items: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def _rate(history: list[list[Any]], over_s: float) -> float | None:
    """Tasks ended per second over the last ``over_s`` seconds of history."""
    if len(history) < 2:
        return None
    last = history[-1]
    times = [point[0] for point in history]
    first = history[max(0, bisect.bisect_left(times, last[0] - over_s) - 0)]
    if last[0] <= first[0]:
        return None
    done = (last[2] + last[3]) - (first[2] + first[3])
    return round(done / (last[0] - first[0]), 1)


def _percentile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    index = min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))
    return _r(ordered[index])


def _r(seconds: float) -> float:
    """To the microsecond (``round(x, 6)`` is ten times slower: it goes through text)."""
    return int(seconds * 1e6 + (0.5 if seconds >= 0 else -0.5)) / 1e6
