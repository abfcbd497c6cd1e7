"""What the advisor measures, kept apart from its rules.

* :class:`SlotTime`: slot-seconds of work done, in buckets of log time, from every task's
  and actor call's run (its span on the worker); a rule asks how busy the CPU slots were
  over a window. Windows count their edge buckets whole, so the answer errs towards
  "busy", and a rule that fires on idle slots errs towards silence. A :class:`RunTally`
  fills it as the records end (the live advisor's, called by the event log with each
  read's records) or as a replay reads them.
* :func:`running_work`: the runs that have not ended yet (their records come later).
* :func:`most_at_once` and :func:`union`: interval arithmetic for the CPU-time rules.
* :func:`logged_at`: when the log received a record (the replay's order).
* :func:`plain` and :func:`restore`: records to plain JSON and back (timeline files).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from lightwork.kernel.collector import compiled_module
from lightwork.kernel.events import DriverSpan, TaskRecord

BUSY_BUCKET_S = 0.05  # resolution of the record of how busy the slots were

_compiled = compiled_module()
#: The compiled summer of records' runs (``_collector.c``'s ``RunSummer``), or None.
_sum_runs = None if _compiled is None else _compiled.RunSummer(
    TaskRecord, ("started", "finished", "num_cpus", "args_loaded", "large_args"))
BUSY_MAX_BUCKETS = 100_000  # past this, the older half is dropped


class SlotTime:
    """Slot-seconds of work done, in buckets of log time, to ask how busy slots were."""

    def __init__(self, width: float = BUSY_BUCKET_S) -> None:
        self.width = width
        self.buckets: dict[int, float] = defaultdict(float)

    def merge(self, buckets: dict[int, float]) -> None:
        """Add slot-seconds already summed by bucket (a :class:`RunTally`'s)."""
        ours = self.buckets
        for bucket, seconds in buckets.items():
            ours[bucket] += seconds
        if len(ours) > BUSY_MAX_BUCKETS:
            self._drop_older_half()

    def add(self, start: float, end: float, slots: float) -> None:
        width, buckets = self.width, self.buckets
        first, last = int(start // width), int(end // width)
        if first == last:
            buckets[first] += (end - start) * slots
        else:
            buckets[first] += ((first + 1) * width - start) * slots
            for bucket in range(first + 1, last):
                buckets[bucket] += width * slots
            buckets[last] += (end - last * width) * slots
        if len(buckets) > BUSY_MAX_BUCKETS:
            self._drop_older_half()

    def _drop_older_half(self) -> None:
        buckets = self.buckets
        for old in sorted(buckets)[: BUSY_MAX_BUCKETS // 2]:
            del buckets[old]

    def between(self, start: float, end: float) -> float:
        buckets = self.buckets
        return sum(buckets.get(bucket, 0.0)
                   for bucket in range(int(start // self.width), int(end // self.width) + 1))


class RunTally:
    """Sums the runs of ended tasks into a :class:`SlotTime`, as the records end; and
    says which records a sampling reader must read in full.

    Summing them at the advisor's look would read every record of a step once it has
    gone cold in the cache, on time taken from the program. The event log calls this
    instead with the records that ended in each read of the workers
    (``EventLog.watch``: the runtime's lock held, on the thread that wrote the records'
    times a moment before), while they are warm (measured: see bench/HOTPATH.md, "The
    diagnostics' costs").
    The live advisor takes what was summed at each look (:meth:`take`); an offline
    replay tallies the records straight into its own ``SlotTime`` (``into``).

    Consecutive runs inside one bucket (thousands per bucket in a flood of small tasks)
    are summed here and added to the bucket once: the common case (a run of one slot,
    a task's or an actor call's, inside the bucket) is a few comparisons and one
    addition.
    """

    __slots__ = ("into", "long_s", "_width", "_low", "_high", "_bucket", "_summed")

    def __init__(self, into: SlotTime | None = None, long_s: float = math.inf) -> None:
        self.into = SlotTime() if into is None else into
        self.long_s = float(long_s)
        self._width = self.into.width
        self._low = self._high = 0.0  # the bucket being summed here: [low, high)
        self._bucket = 0
        self._summed = 0.0

    def ended(self, records: Sequence[TaskRecord]) -> list[int]:
        """Add the runs of ``records``; return the places in it of those a reader that
        samples must still read (big by-value arguments, or a run of ``long_s`` or more
        from its arguments loaded to its end). The event log hands over the records that
        ended in one read of the workers together: a call per record cost as much as its
        work, and the sums stay in locals meanwhile. With the compiled module the common
        record (one slot, inside the bucket) is summed in C (``_sum_runs``: ~5 ns where
        this loop takes ~55, at its floor in Python), and the loop below takes each
        record the C leaves to it."""
        notable: list[int] = []
        if _sum_runs is None or type(records) is not list:
            self._tally_in_python(records, 0, len(records), notable)
            return notable
        place, count = 0, len(records)
        while place < count:
            part, place = _sum_runs(records, place, self._low, self._high, self.long_s,
                                    notable)
            self._summed += part
            if place < count:
                self._tally_in_python(records, place, place + 1, notable)
                place += 1
        return notable

    def _tally_in_python(self, records: Sequence[TaskRecord], first: int, stop: int,
                         notable: list[int]) -> None:
        """``ended``'s work on ``records[first:stop]``, in Python."""
        low, high, summed, long_s = self._low, self._high, self._summed, self.long_s
        for place in range(first, stop):
            record = records[place]
            start = record.started
            end = record.finished
            if low <= start and end < high and start < end and record.num_cpus == 1.0:
                summed += end - start  # one slot, whether a task's or an actor call's
            elif start and end > start:  # else it never ran (cancelled, failed to start)
                self._summed = summed
                self._add(start, end,
                          1.0 if record.actor_id or record.num_cpus < 1.0 else record.num_cpus)
                low, high, summed = self._low, self._high, self._summed
            if end - record.args_loaded >= long_s or record.large_args:
                notable.append(place)
        self._summed = summed

    def _add(self, start: float, end: float, slots: float) -> None:
        self.flush()
        width = self._width
        first = int(start // width)
        if first == int(end // width):
            self._bucket, self._low, self._high = first, first * width, (first + 1) * width
            self._summed = (end - start) * slots
        else:
            self.into.add(start, end, slots)

    def flush(self) -> None:
        """Add what is summed here to ``into``."""
        if self._summed:
            into = self.into
            into.buckets[self._bucket] += self._summed
            self._summed = 0.0
            if len(into.buckets) > BUSY_MAX_BUCKETS:
                into._drop_older_half()

    def take(self) -> dict[int, float]:
        """The slot-seconds tallied since the last take, by bucket; starts afresh."""
        self.flush()
        buckets, self.into = self.into.buckets, SlotTime(self._width)
        return buckets


def sample_places(count: int, stride: int, notable: list[int]) -> list[tuple[int, int]]:
    """(place, weight) of the records to read of ``count``, in order: every
    ``stride``-th from the first (weight ``stride``, the tasks it stands for; the last
    stands for those left, so the weights add up to ``count``) and those in ``notable``
    (ascending) besides (weight 0: counted already)."""
    places = [(place, stride) for place in range(0, count, stride)]
    if count % stride:
        places[-1] = (places[-1][0], count % stride)
    extra = [(place, 0) for place in notable if place % stride]
    if extra:
        places = sorted(places + extra)
    return places


def running_work(node: Any) -> list[tuple[float, float, TaskRecord]]:
    """(since, slots, record) of the tasks and actor calls running now (lock held)."""
    running = []
    for task in node.worker_heads(concurrent=False):  # (a run.RunRecord)
        record = getattr(task, "record", None)
        if not isinstance(record, TaskRecord):
            continue
        since = record.dispatched or record.submitted
        if since:
            running.append(
                (since, 1.0 if record.actor_id else max(1.0, record.num_cpus), record))
    return running


def most_at_once(intervals: Any) -> int:
    """The largest number of ``intervals`` that overlap at one time."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by ``intervals``."""
    total = 0.0
    end = float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def logged_at(record: TaskRecord) -> float:
    """When the log received ``record``: the driver saw the task end (or its last time)."""
    return (record.seen or record.stored or record.finished or record.dispatched
            or record.deps_ready or record.submitted)


def plain(record: TaskRecord | DriverSpan) -> dict[str, Any]:
    out = {}
    for f in fields(record):
        value = getattr(record, f.name)
        out[f.name] = _lists(value) if isinstance(value, tuple) else value
    return out


def _lists(value: Any) -> Any:
    return [_lists(v) for v in value] if isinstance(value, (tuple, list)) else value


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def restore(cls: Any, row: dict[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}  # ignore fields a newer lightwork added
    return cls(**{k: _tuples(v) if isinstance(v, list) else v
                  for k, v in row.items() if k in known})
