"""The always-on event log: the life of every task, and the driver's blocked time.

Each task owns one :class:`TaskRecord` from submission on. The scheduler stamps the
driver-side times (submitted, dependencies ready, dispatched, seen by the driver); the
worker stamps its own (started, arguments loaded, finished, result stored) and sends
them back on the result frame. All times are ``time.monotonic()`` seconds, which on
Linux is one clock for every process of the machine, so driver and worker times line up.

When a task ends, its record moves into a bounded ring (``deque(maxlen=budget)``): memory
stays flat on long runs and the oldest records are dropped first, counted in
``dropped``. Appending is one deque append, so the log is never switched off.
Beside the ring, ``ended_counts`` counts every task that ever ended, by state (one
counter bumped per task, about 40 ns): totals that stay right whatever left the ring,
which the dashboard's history and throughput are built from.

Records are kept out of the cycle collector (:func:`keep_out_of_collector`, CPython's
``PyObject_GC_UnTrack``). A record holds only strings, numbers, ``None`` and tuples of
those, so it can never be part of a reference cycle: reference counting frees it, and
the collector has nothing to find in it. Tracked, it would cost the collector twice:
every young collection would walk its 29 fields while its task is pending, and every
full collection would walk all of the ring's. The rings themselves are untracked as
well: a tracked ring makes every full collection visit each record it holds (the
visit reads the record's header, a cache miss on a record long gone cold). A span
holds a kind, numbers and a call site, so it cannot lead back to its ring either;
spans themselves stay tracked and are walked in their generations like any object,
which is correct for an object only an untracked container references (the collector
counts that reference as one from outside). The ring keeps the record itself, not a
frozen tuple of its values: that copy read 29 fields of a record gone cold, per task.
Untracking costs ~6 ns (``lightwork._collector``) or 0.17 µs (its ``ctypes``
fallback), once, when the record is made (``collector.py`` has the rules for what may
leave the collector, and the fallbacks). The ring's records are never changed again;
readers that change or keep them take copies (``lightwork.diagnostics.task_records``,
made from :func:`freeze`). Driver spans (time blocked in ``get`` and ``wait``) go to a
second ring of the same kind.

Readers take the ring's records with :meth:`EventLog.ended_records` under the runtime's
lock (iterating a deque is safe against appends only if it is not mutated meanwhile):
a copy of the ring's pointers, a few milliseconds for 200,000, where copying the
records themselves would stall the whole runtime for far longer. Whatever readers do with the
records then, they do after the lock is released.

Measured: see bench/HOTPATH.md, "The cyclic collector".

A watcher (the advisor) takes the records logged since its last look
(:meth:`EventLog.take_fresh`) and may give :meth:`EventLog.watch` a tally, called with
the records that ended in each read of the workers (``tally_now``): the only per-record
work a watcher adds to the hot path, done while the records are warm (see
``diagnostics._measure.RunTally`` for what it saved).
"""

from __future__ import annotations

import gc
import operator
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from lightwork.kernel.collector import keep_out_of_collector

DEFAULT_BUDGET = 200_000
#: The most records ended between two calls of a watcher's tally (``EventLog.tally_now``;
#: the ring's size if smaller), so none leaves the ring untallied.
TALLY_AT_MOST = 1024


@dataclass(slots=True)
class TaskRecord:
    """Timestamps and facts about one attempt-spanning task.

    Every field holds a string, a number, ``None`` or a tuple of those, nothing that
    could lead back to the record: it is kept out of the cycle collector
    (:func:`keep_out_of_collector`, module docstring). Keep it so.
    """

    task_id: int
    name: str
    owner: int
    submitted: float
    # Next, the fields set when a task is submitted: the driver passes them by position
    # (a keyword costs a search of the 29 parameters: 0.2 µs a record).
    deps_ready: float = 0.0
    arg_size: int = 0
    callsite: tuple[str, int, str] | None = None  # (file, line, function) of the .remote()
    num_cpus: float = 1.0  # the CPUs the task asked for
    actor_id: int = 0  # the actor whose method this call is, or 0 for a task
    attempt: int = 0
    worker_id: int = -1
    pid: int = 0
    dispatched: float = 0.0
    started: float = 0.0
    args_loaded: float = 0.0
    finished: float = 0.0
    stored: float = 0.0
    seen: float = 0.0
    result_size: int = 0
    state: str = "PENDING_ARGS_AVAIL"
    error: str | None = None
    retries: tuple[tuple[float, str], ...] = ()  # (time, reason); a tuple: no GC tracking
    # CPU seconds its worker process used while running it; 0.0: not measured (a call of
    # a function whose previous run on that worker took under 1 ms: worker.CPU_CLOCK_MIN_S)
    cpu_time: float = 0.0
    # Its worker's peak resident bytes during the call, and the change across it; measured
    # for the calls cpu_time is (rss_peak 0: not measured; engines/local/task_memory.py)
    rss_peak: int = 0
    rss_change: int = 0
    # (identity, nbytes) of big by-value arguments; (identity, nbytes, 1) for one that
    # points into the object store (a value get returned, passed back by value)
    large_args: tuple[tuple[int, ...], ...] = ()
    copy_s: float = 0.0  # time .remote() spent copying big arguments (only those: 0 else)
    dep_tasks: tuple[int, ...] = ()  # the tasks making the refs it took as arguments
    yields: tuple[float, ...] = ()  # when a generator task yielded each item
    # The driver's main thread's time so far running or ready to run (CPU time plus
    # waiting for a core: what it spent working) when it submitted this task; sampled
    # at most every DRIVER_BUSY_SAMPLE_S of submissions (0.0: not sampled).
    driver_busy: float = 0.0
    driver_cpu: float = 0.0  # ... and of that, its CPU time alone
    # (start, end) of each time the call sat paused in the debugger (kernel/debugger.py):
    # the user's time, which the advisor counts neither as work nor as waiting.
    paused: tuple[tuple[float, float], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class DriverSpan:
    """The driver (or a worker) blocked in ``get``/``wait`` from ``start`` to ``end``,
    or (``kind`` "put") copying a big value into the object store in ``put``, or
    (``kind`` "define") pickling a remote function or actor class (``callsite``: where
    it is defined)."""

    kind: str
    start: float
    end: float
    object_count: int
    thread_id: int
    first_object_id: int = 0
    callsite: tuple[str, int, str] | None = None  # (file, line, function) of the call
    first_task_id: int = 0  # the task that makes the first object waited on
    ready_before: int = 0  # objects already ready when the call began
    first_ready: float = 0.0  # when the first of the others became ready
    last_ready: float = 0.0  # ... and the last
    shortest: float = 0.0  # of the others, the least time from creation to ready
    longest: float = 0.0  # ... and the most
    # A "define" span (a remote function or actor class pickled at its first call):
    # the pickle's size, and the biggest value it captured when it is big. A "get"
    # span: the bytes of the values it returned, when the store held many (else 0).
    nbytes: int = 0
    note: str = ""


_is_tracked = gc.is_tracked

_FIELDS = tuple(f.name for f in fields(TaskRecord))
#: A record's field values as one exact tuple (attrgetter builds it in C): what a copy
#: is made from (``TaskRecord(*freeze(record))``, ``diagnostics.task_records``).
freeze = operator.attrgetter(*_FIELDS)


class FreshRecords(Sequence[TaskRecord]):
    """The records logged since a watcher's last take, read in the ring itself: valid
    only while the runtime's lock is held (the ring moves as tasks end). A look at a
    flood of tasks reads a sample of them; copying them all out would cost a look a
    cache miss per record header (measured: see bench/HOTPATH.md, "The diagnostics'
    costs")."""

    __slots__ = ("_ring", "_first", "_count")

    def __init__(self, ring: deque[TaskRecord], count: int) -> None:
        self._ring = ring
        self._first = len(ring) - count  # (indexing walks from the nearer end: the right)
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, place: int) -> TaskRecord:  # type: ignore[override]
        if not 0 <= place < self._count:
            raise IndexError(place)
        return self._ring[self._first + place]

    def __iter__(self) -> Iterator[TaskRecord]:
        copied = list(islice(reversed(self._ring), self._count))
        copied.reverse()
        return iter(copied)


class Fresh(NamedTuple):
    """What ``EventLog.take_fresh`` hands a watcher."""

    records: Sequence[TaskRecord]  # a FreshRecords, or [] when there is none
    spans: list[DriverSpan]
    notable: list[int]  # places in records of those the watcher's tally asked for


class EventLog:
    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        if budget < 0:
            raise ValueError(f"the event budget must be >= 0 (0 turns the log off), got {budget}")
        self.budget = budget
        self.enabled = budget > 0
        self.tasks: deque[TaskRecord] = deque(maxlen=budget)  # ended: never changed again
        self.spans: deque[DriverSpan] = deque(maxlen=budget)
        # The rings leave the collector too (module docstring): what they hold cannot lead
        # back to them, and a tracked ring made every full collection touch each of its
        # records, one cache miss apiece.
        keep_out_of_collector(self.tasks)
        keep_out_of_collector(self.spans)
        self.dropped_tasks = 0
        self.dropped_spans = 0
        # Every task ended so far, by state (the ring's and those dropped from it).
        self.ended_counts: defaultdict[str, int] = defaultdict(int)
        self.started_at = time.monotonic()
        self.started_at_wall = time.time()
        # A watcher (the advisor) reads the rows appended since its last look from the
        # ring itself: ``_taken`` is how many had been appended then (None: nobody
        # watches). Spans are few; those not yet taken are kept in a list.
        self._taken: int | None = None
        self.fresh_spans: list[DriverSpan] | None = None
        self.missed_rows = 0  # rows the ring dropped before a watcher took them
        # The watcher's tally, called with the records that ended together (see watch), and the
        # places in the ring (counted from the first record ever appended) of the
        # records it asked to read in full, not yet taken.
        self._tally: Callable[[list[TaskRecord]], list[int]] | None = None
        self._notable: list[int] = []
        self._untallied = 0  # records ended since the tally last had them
        self._tally_at_most = max(1, min(TALLY_AT_MOST, budget))  # (a small ring: sooner)

    def finish_task(self, record: TaskRecord) -> None:
        if not self.enabled:
            return
        if len(self.tasks) == self.budget:
            self.dropped_tasks += 1
        self.ended_counts[record.state] += 1
        if _is_tracked(record):  # made off the hot path (nested, rebuilt, cluster, tests)
            keep_out_of_collector(record)
        self.tasks.append(record)
        if self._tally is not None:
            self._untallied += 1
            if self._untallied >= self._tally_at_most:  # (else the read's end: tally_now)
                self.tally_now()

    def finish_tasks(self, records: list[TaskRecord]) -> None:
        """``finish_task`` for each of ``records`` in turn, all of them FINISHED and made
        out of the collector (the driver's plain tasks that ended in one read of a
        worker: ``WorkerRequests._on_task_messages``). A watcher's tally still gets
        every ``TALLY_AT_MOST`` records, before the ring could drop them."""
        if not self.enabled:
            return
        self.ended_counts[records[0].state] += len(records)
        while records:
            part = records
            if self._tally is not None:
                take = self._tally_at_most - self._untallied  # >= 1: tally_now resets it
                if take < len(records):
                    part, records = records[:take], records[take:]
                else:
                    records = []
                self._untallied += len(part)
            else:
                records = []
            room = self.budget - len(self.tasks)
            if len(part) > room:
                self.dropped_tasks += len(part) - room
            self.tasks.extend(part)
            if self._untallied >= self._tally_at_most:
                self.tally_now()

    def tally_now(self) -> None:
        """Hand the records ended since the last call to the watcher's tally (see
        ``watch``; the runtime's lock held). The node calls it at the end of each read
        of a worker's results, while they are warm; ``take_fresh`` and every
        ``TALLY_AT_MOST`` records call it too, so none leaves the ring untallied."""
        count = self._untallied  # (it grows only while a tally is set: finish_task)
        if not count:
            return
        self._untallied = 0
        count = min(count, len(self.tasks))
        records = list(islice(reversed(self.tasks), count))
        records.reverse()
        # (set while _untallied counts: see finish_task; no check on this path)
        notable = self._tally(records)  # type: ignore[misc]
        if notable:
            first = len(self.tasks) + self.dropped_tasks - count
            self._notable.extend(first + place for place in notable)

    def add_span(self, span: DriverSpan) -> None:
        if not self.enabled:
            return
        if len(self.spans) == self.budget:
            self.dropped_spans += 1
        self.spans.append(span)
        if self.fresh_spans is not None:
            self.fresh_spans.append(span)

    def ended_records(self) -> list[TaskRecord]:
        """The ring's records, oldest first (call under the lock): a list of the records
        themselves, so the lock is held for a copy of pointers (about 1 ms for 200,000),
        not of records. They are never changed again: read them after the lock is gone,
        and copy one (``TaskRecord(*freeze(record))``) before changing it."""
        return list(self.tasks)

    def ended_states(self) -> dict[str, int]:
        """How many ended tasks in the ring finished, failed, ... (call under the lock)."""
        counts: dict[str, int] = {}
        for record in self.tasks:
            counts[record.state] = counts.get(record.state, 0) + 1
        return counts

    def ended_names(self, task_ids: set[int]) -> dict[int, str]:
        """The names of those of ``task_ids`` that are in the ring (call under the lock)."""
        return {record.task_id: record.name for record in self.tasks
                if record.task_id in task_ids}

    @property
    def watching(self) -> bool:
        return self._taken is not None

    def watch(self, tally: Callable[[list[TaskRecord]], list[int]] | None = None) -> None:
        """Start handing out, with ``take_fresh``, what is logged from now on.

        ``tally``, if given, is called with the records that ended together (in one read
        of a worker's results: ``tally_now``), under the runtime's lock, while they are
        still warm in the cache from being written: a watcher that would otherwise read
        every record long after (the advisor's slot-time sums) does its per-record work
        there, and samples the rest. It returns the places (in the list it was given) of
        the records the watcher must read in full even so: ``take_fresh`` says which."""
        self._taken = len(self.tasks) + self.dropped_tasks
        self.fresh_spans = []
        self._tally, self._notable, self._untallied = tally, [], 0

    def unwatch(self) -> None:
        self._taken = self.fresh_spans = self._tally = None
        self._notable = []
        self._untallied = 0

    def take_fresh(self) -> Fresh:
        """The records and the spans logged since the last call, oldest first (call with
        the runtime's lock held, and read the records before letting go of it: a
        ``FreshRecords``), and the places in ``records`` of those the tally asked for.
        The records are the ring's own: read them, never change them. Reading them
        from the ring keeps the hot path free of the watcher: nothing is kept for it
        (but the few places), and the records leave the ring as they would without it.
        Records the ring dropped before they were taken (more than ``budget`` tasks
        between two looks) are counted in ``missed_rows``."""
        if self._taken is None:
            return Fresh([], [], [])
        self.tally_now()
        appended = len(self.tasks) + self.dropped_tasks
        new = appended - self._taken
        self._taken = appended
        if new > len(self.tasks):
            self.missed_rows += new - len(self.tasks)
            new = len(self.tasks)
        records: Sequence[TaskRecord] = FreshRecords(self.tasks, new) if new else []
        spans, self.fresh_spans = self.fresh_spans or [], []
        first = appended - new  # the place of records[0]
        notable = [place - first for place in self._notable if place >= first]
        self._notable = []
        return Fresh(records, spans, notable)
