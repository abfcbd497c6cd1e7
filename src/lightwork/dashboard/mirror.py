"""The dashboard process's copy of a session: the syncs applied, and the views read.

:class:`Mirror` is the only state of the dashboard process. Two kinds of thread use it:

* the sync thread (one at a time: ``apply`` is serialized) takes each sync in. It owns
  every piece of the mirror that grows with records: the columns, the kept sort orders
  and their keys (``orders``), the per-function figures (``functions``). The expensive
  part of a sync (merging the new rows into seven kept orders of up to a million rows,
  folding them into the per-function figures; renumbering after a trim) runs **off the
  lock**, on new arrays; the lock is held only to append the new rows' columns
  (``_stage``), to publish the results by swapping references (``_publish``), and to cut
  the oldest rows off the columns on a trim;
* the HTTP threads read, under the lock, only the rows published (``rows``: the
  columns may already hold more, staged but not yet in the orders). The tasks table's
  caches are theirs (``table.Table``).

So a request waits for the lock at most one stage or publish (a few ms) or the cut of
a trim's swap (its new columns, copies without the oldest tenth, are made off the lock,
where a ``del`` under it would move every row in memory), never for a sync's merge,
nor for a per-function recount (which a trim does not need). The price of the copies:
while a trim runs, the process holds the columns twice (about 140 bytes a row, for a
moment). Measured: see bench/HOTPATH.md, "The dashboard".

Ended tasks are kept as columns (``array`` of float64/int64/int32, names and states as
small-int indexes into tables), 121 bytes per task in the columns, and 52 more in the
kept sort orders (4 bytes a row each) and their keys; a million tasks measured about
300 MB of the dashboard process. The copy keeps as many as the session's event budget
(the driver's ring holds no more); past that the oldest go in chunks of a tenth and are
counted in ``trimmed``. Row numbers are positions in the columns, so a trim shifts them:
the kept orders are renumbered (off the lock), the table's caches dropped, and the
per-function figures lose the trimmed rows' counts (no recount).

Views that read little: the task stream walks back from the newest record until the
window's start and keeps at most ``MAX_STREAM_SPANS`` rectangles (the page says when the
cap cut some); the functions view reads each function's histograms; history is one point
per sync, bounded: live tasks by state, and the driver's cumulative counts of ended tasks
(finished, and failed or otherwise ended), so the rate between two points is right
however far apart they are (no sync runs while no page is open). Live tasks (queued and running)
come whole with each sync, at most ``live_limit`` of them (the page says when there are
more).
"""

from __future__ import annotations

import array
import bisect
import threading
import time
from collections import Counter, deque
from typing import Any, NamedTuple

from lightwork.dashboard import wire
from lightwork.dashboard.functions import FunctionStats
from lightwork.dashboard.orders import SortKeys, SortOrder, queued_times, run_times
from lightwork.dashboard.table import KEPT_ORDERS, MAX_PAGE_SIZE, SORT_KEYS, Table

MAX_STREAM_SPANS = 4_000
HISTORY_POINTS = 3_600
MAX_DRIVER_SPANS = 100_000
ENDED_STATES = ("FINISHED", "FAILED")


class _Staged(NamedTuple):
    """What a sync's records make, off the lock, for ``_publish`` to swap in."""

    orders: dict[str, array.array[int]]  # each kept order, with the new rows
    stats: FunctionStats  # the per-function figures, with them
    ended: Counter[int]  # the new rows by state index
    rows: int  # the rows published with them


class Mirror:
    """A session as the dashboard process knows it."""

    def __init__(self, session: str = "") -> None:
        self.lock = threading.Lock()  # readers, and the sync thread's short steps
        self._applying = threading.Lock()  # one sync applied at a time
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
        # Ended tasks, by column; requests read rows below ``rows`` (published).
        self.rows = 0
        self.floats = {name: array.array("d") for name in wire.FLOAT_COLUMNS}
        self.ints = {name: array.array("q") for name in wire.INT_COLUMNS}
        self.name_of = array.array("i")
        self.state_of = array.array("b")
        self.retries = array.array("i")
        self.errors: dict[int, str] = {}
        self.names: list[str] = []  # append-only tables
        self.name_index: dict[str, int] = {}
        self.states: list[str] = list(ENDED_STATES)
        self.state_index = {s: i for i, s in enumerate(self.states)}
        self.keys = SortKeys()
        self.keys.ranks["state"] = SortKeys.ranks_of(self.states)
        self.orders = {key: SortOrder() for key in KEPT_ORDERS}
        self.function_stats = FunctionStats()
        # Every task ended, by state: the driver's cumulative counts of its last sync
        # (a replay, which has none, counts the records it read).
        self.ended_counts: dict[str, int] = {}
        self.table = Table(self)
        self.driver_spans: deque[list[Any]] = deque(maxlen=MAX_DRIVER_SPANS)
        self.history: deque[list[Any]] = deque(maxlen=HISTORY_POINTS)
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
        return how many task records it carried. Its records are in every view when
        this returns; the lock was held only for the short steps (module docstring)."""
        with self._applying:
            tasks = reply["tasks"]
            count = int(tasks["count"])
            staged = self._add_tasks(tasks, attached) if count else None
            with self.lock:
                self._publish(reply, staged)
            if self.rows > self.budget + self.budget // 10:
                self._trim(self.rows - self.budget)
            return count

    def _add_tasks(self, tasks: dict[str, Any], attached: bytes) -> _Staged:
        """Decode, stage and merge a sync's records (the sync thread; off the lock but
        for the stage); ``_publish`` then shows them."""
        count = int(tasks["count"])
        floats, ints, name_codes, state_codes = wire.unpack(tasks, attached)
        # The reply's tables, as positions in ours (new names and states are added:
        # the tables only grow, and requests read them through published rows).
        names = [self._intern(self.names, self.name_index, str(n)) for n in tasks["names"]]
        states = [self._intern(self.states, self.state_index, str(n)) for n in tasks["states"]]
        try:
            name_of = array.array("i", map(names.__getitem__, name_codes))
            state_of = array.array("b", map(states.__getitem__, state_codes))
        except IndexError:
            raise ValueError("a sync's name or state code is outside its table") from None
        first = self.rows
        retries = array.array("i", bytes(4 * count))  # zeros; sparse below
        for i, n in tasks.get("retries", ()):
            retries[int(i)] = int(n)
        errors = {first + int(i): str(text) for i, text in tasks["errors"]}
        run_s, queued_s = run_times(floats), queued_times(floats)
        ranks, ranked_rows, new_ranks = {}, {}, {}
        column: array.array[Any]  # int columns and float ones, in turn
        for kind, labels, column, codes in (("name", self.names, self.name_of, name_of),
                                            ("state", self.states, self.state_of, state_of)):
            ranks[kind], ranked_rows[kind] = self.keys.ranks[kind], self.keys.ranked_rows[kind]
            if len(ranks[kind]) != len(labels):  # a new label moves every row's rank
                ranks[kind] = SortKeys.ranks_of(labels)
                ranked_rows[kind] = SortKeys.ranked(kind, ranks[kind], column[:first])
            new_ranks[kind] = SortKeys.ranked(kind, ranks[kind], codes)
        with self.lock:  # _stage: append (rows past ``rows`` are not read yet)
            for name, column in self.floats.items():
                column.extend(floats[name])
            for name, column in self.ints.items():
                column.extend(ints[name])
            self.name_of.extend(name_of)
            self.state_of.extend(state_of)
            self.retries.extend(retries)
            self.errors.update(errors)
            self.keys.run_s.extend(run_s)
            self.keys.queued_s.extend(queued_s)
            for kind in ("name", "state"):
                self.keys.ranks[kind] = ranks[kind]
                self.keys.ranked_rows[kind] = ranked_rows[kind]
                ranked_rows[kind].extend(new_ranks[kind])
        # Off the lock: merge the new rows into the kept orders, fold them into the
        # per-function figures. Nothing here changes what requests read.
        n = first + count
        try:
            return _Staged({sort: order.merged(n, self.sort_key(sort))
                            for sort, order in self.orders.items()},
                           self.function_stats.folded(
                               name_of, state_of, run_s,
                               _queued_for_stats(queued_s, floats["deps_ready"])),
                           Counter(state_of), n)
        except BaseException:
            with self.lock:  # unstage: the next sync's rows must follow the published ones
                for column in self._row_columns():
                    del column[first:]
                for row in errors:
                    self.errors.pop(row, None)
            raise

    def _row_columns(self) -> list[array.array[Any]]:
        """Every array with one value per ended task (cut and grown together)."""
        return [*self.floats.values(), *self.ints.values(), self.name_of, self.state_of,
                self.retries, *self.keys.columns()]

    def _publish(self, reply: dict[str, Any], staged: _Staged | None) -> None:
        """Show what the sync brought (lock held): swaps and small copies only."""
        self.session = reply["session"]
        self.base, self.base_wall = reply["base"], reply["base_wall"]
        self.now = reply["now"]
        self.budget = max(1, int(reply["budget"] or 1))
        self.driver_cost_s = float(reply.get("cost_s", 0.0))
        self.driver_fixed_cost_s = float(reply.get("fixed_cost_s", self.driver_cost_s))
        tasks = reply["tasks"]
        self.lost += int(tasks["lost"])
        if staged is not None:
            for sort, rows in staged.orders.items():
                self.orders[sort].rows = rows
            self.function_stats = staged.stats
            self.rows = staged.rows
        driver_counts = tasks.get("ended")
        if isinstance(driver_counts, dict):  # the driver's totals: right across any gap
            self.ended_counts = {str(k): int(v) for k, v in driver_counts.items()}
        elif staged is not None:  # a replay: the records it holds are all there is
            for state, n in staged.ended.items():
                name = self.states[state]
                self.ended_counts[name] = self.ended_counts.get(name, 0) + n
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
        finished = self.ended_counts.get("FINISHED", 0)
        self.history.append([self.now, dict(self.live["counts"]), finished,
                             sum(self.ended_counts.values()) - finished])
        self.synced_at = time.monotonic()
        self.syncs += 1
        self.generation += 1

    @staticmethod
    def _intern(labels: list[str], index: dict[str, int], label: str) -> int:
        position = index.get(label)
        if position is None:
            position = index[label] = len(labels)
            labels.append(label)
        return position

    def _trim(self, n: int) -> None:
        """Forget the oldest ``n`` ended records (the copy stays within the budget).
        Everything is made off the lock, as new arrays: the columns without those rows
        (copies of the rest: the sync thread, here, is their only writer, and requests
        read the old ones meanwhile), the renumbered orders, the per-function figures
        without them, the errors. The lock is held only to swap them in."""
        orders = {sort: order.without_oldest(n) for sort, order in self.orders.items()}
        stats = self.function_stats.folded(
            self.name_of[:n], self.state_of[:n], self.keys.run_s[:n],
            _queued_for_stats(self.keys.queued_s[:n], self.floats["deps_ready"][:n]), sign=-1)
        errors = {row - n: text for row, text in self.errors.items() if row >= n}
        floats = {name: _without_oldest(column, n) for name, column in self.floats.items()}
        ints = {name: _without_oldest(column, n) for name, column in self.ints.items()}
        name_of, state_of, retries = (_without_oldest(self.name_of, n),
                                      _without_oldest(self.state_of, n),
                                      _without_oldest(self.retries, n))
        keys = self.keys.without_oldest(n, _without_oldest)
        with self.lock:
            old = (self.floats, self.ints, self.keys, self.name_of, self.state_of,
                   self.retries, self.errors, self.function_stats,
                   [order.rows for order in self.orders.values()])
            self.floats, self.ints, self.keys = floats, ints, keys
            self.name_of, self.state_of, self.retries = name_of, state_of, retries
            for sort, rows in orders.items():
                self.orders[sort].rows = rows
            self.errors = errors
            self.function_stats = stats
            self.rows -= n
            self.trimmed += n
            self.table.forget()
            self.generation += 1
        del old  # the old arrays are freed here, off the lock (unmapping takes time)

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

    def sort_key(self, sort: str) -> Any:
        """A C-level key of a kept order: ``__getitem__`` of a column or of its key."""
        if sort in self.ints:
            return self.ints[sort].__getitem__
        return self.keys.key(sort)

    # ---------------------------------------------------------------- views
    def header(self) -> dict[str, Any]:
        """What every view carries: session, liveness, and the banners to show."""
        banners = []
        if self.lost:
            banners.append(f"{self.lost:,} task records left the session's event log (it "
                           f"keeps the newest {self.budget:,}) before the dashboard read "
                           "them, or while no page was open: the table and the task "
                           "stream lack them, the counts include them (keep more with "
                           "init(event_budget=...))")
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
                          "recorded": self.rows},
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
            row = self.rows - 1
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
            # (a live row's times are microseconds since the session began: ``feed``)
            running = [[r[3], r[1], (r[6] or r[5]) / 1e6, r[0], r[2]]
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
        """One page of the tasks table (``table``): arguments checked here."""
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
            return {**self.header(), **self.table.page(state, name, worker_id, sort,
                                                       descending, page, page_size)}

    def function_summary(self) -> dict[str, Any]:
        """Per function: counts by state (live tasks too), run and queued percentiles."""
        with self.lock:
            functions = self.function_stats.rows(self.names, self.states)
            live_by_name: dict[str, dict[str, int]] = {}
            counts: dict[str, int] | None
            for r in self.live["rows"]:
                counts = live_by_name.setdefault(r[1], {})
                counts[r[2]] = counts.get(r[2], 0) + 1
            for row in functions:
                counts = live_by_name.pop(row["name"], None)
                if counts:
                    row["state_counts"].update(counts)
                    row["count"] = sum(row["state_counts"].values())
            for name, counts in live_by_name.items():
                functions.append({"name": name, "count": sum(counts.values()),
                                  "state_counts": counts, "p50_run_s": None, "p95_run_s": None,
                                  "mean_run_s": None, "p50_queued_s": None,
                                  "p95_queued_s": None, "total_queued_s": None})
            functions.sort(key=lambda s: (-s["count"], s["name"]))
            return {**self.header(), "functions": functions}

    def actor_view(self) -> dict[str, Any]:
        with self.lock:
            return {**self.header(), "actors": self.actors, "total": self.actor_count}


def _without_oldest(column: array.array[Any], n: int) -> array.array[Any]:
    """A copy of ``column`` without its first ``n`` values, with the spare room an array
    keeps after growing (about 1/16), as ``del column[:n]`` would leave it: the next
    syncs' rows are appended under the lock, and must not move the whole column."""
    out = column[n:]  # exactly its size
    if column:
        out.append(column[0])  # grown: the array takes 1/16 more than asked ...
        del out[-1]  # ... and keeps it when it shrinks by less than 16 values
    return out


def _queued_for_stats(queued_s: Any, deps_ready: Any) -> list[float]:
    """Queued times for the per-function figures: -1.0 (left out) where the arguments
    were never ready (the sort key says 0.0 there)."""
    return [q if deps else -1.0 for q, deps in zip(queued_s, deps_ready)]


def _count(items: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def _rate(history: list[list[Any]], over_s: float) -> float | None:
    """Tasks ended per second over the last ``over_s`` seconds of history: from the
    newest point at least that old (or the oldest there is) to the last. The counts are
    cumulative, so a gap between points (no page was open) gives that gap's average."""
    if len(history) < 2:
        return None
    last = history[-1]
    times = [point[0] for point in history]
    first = history[max(0, min(len(history) - 2,
                               bisect.bisect_right(times, last[0] - over_s) - 1))]
    if last[0] <= first[0]:
        return None
    done = (last[2] + last[3]) - (first[2] + first[3])
    return round(done / (last[0] - first[0]), 1)


def _r(seconds: float) -> float:
    """To the microsecond (``round(x, 6)`` is ten times slower: it goes through text)."""
    return int(seconds * 1e6 + (0.5 if seconds >= 0 else -0.5)) / 1e6
