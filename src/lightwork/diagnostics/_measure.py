"""What the advisor measures, kept apart from its rules.

* :class:`SlotTime`: slot-seconds of work done, in buckets of log time, from every task's
  and actor call's run (its span on the worker); a rule asks how busy the CPU slots were
  over a window. Windows count their edge buckets whole, so the answer errs towards
  "busy", and a rule that fires on idle slots errs towards silence.
* :func:`running_work`: the runs that have not ended yet (their records come later).
* :func:`most_at_once` and :func:`union`: interval arithmetic for the CPU-time rules.
* :func:`logged_at`: when the log received a record (the replay's order).
* :func:`plain` and :func:`restore`: records to plain JSON and back (timeline files).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from lightwork._runtime.events import DriverSpan, TaskRecord

BUSY_BUCKET_S = 0.05  # resolution of the record of how busy the slots were
BUSY_MAX_BUCKETS = 100_000  # past this, the older half is dropped


class SlotTime:
    """Slot-seconds of work done, in buckets of log time, to ask how busy slots were."""

    def __init__(self, width: float = BUSY_BUCKET_S) -> None:
        self.width = width
        self.buckets: dict[int, float] = defaultdict(float)

    def add_runs(
        self, records: Iterable[TaskRecord], stride: int = 0, long_s: float = math.inf,
    ) -> list[tuple[TaskRecord, int]]:
        """Add the runs of ended tasks, given as the log's records, in its order.

        The advisor's thread calls this for every record of a step, and its time is taken
        from the program, so the common case is kept to comparisons and one addition:
        consecutive runs inside one bucket (thousands per bucket in a flood of small
        tasks) are summed locally and added to the bucket once. (Measured on 5,000 no-op
        records: 0.36 µs per record with a bucket lookup each, 0.1 µs like this.)

        With ``stride``, the same pass also picks the records the advisor's live look
        reads in full, and returns them in order with the number of tasks each stands
        for: every ``stride``-th record (weight ``stride``), and any other with big
        arguments or a run of ``long_s`` or more from its arguments loaded to its end
        (weight 0: counted already). The records went cold in the time since the I/O
        thread wrote them, and a second pass over them cost about two thirds of this one
        (10,000-task batches: the advisor's thread 0.46-0.57 µs of CPU per task with
        two passes, see ``advisor.py``).
        """
        width, buckets = self.width, self.buckets
        low = high = 0.0  # the bucket being summed: [low, high)
        bucket, summed = 0, 0.0
        picked: list[tuple[TaskRecord, int]] = []
        to_next_sample = 1 if stride else 0  # counts down; 0: not picking
        for record in records:
            start, end = record.started, record.finished
            if to_next_sample:
                to_next_sample -= 1
                if not to_next_sample:
                    to_next_sample = stride
                    picked.append((record, stride))
                elif record.large_args or end - record.args_loaded >= long_s:
                    picked.append((record, 0))
            slots = 1.0 if record.actor_id or record.num_cpus < 1.0 else record.num_cpus
            if low <= start < end < high:
                summed += (end - start) * slots
                continue
            if not start or end <= start:
                continue  # never ran (cancelled, failed before starting)
            if summed:
                buckets[bucket] += summed
                summed = 0.0
            first = int(start // width)
            if first == int(end // width):
                bucket, low, high = first, first * width, (first + 1) * width
                summed = (end - start) * slots
            else:
                self.add(start, end, slots)
        if summed:
            buckets[bucket] += summed
        if len(buckets) > BUSY_MAX_BUCKETS:
            self._drop_older_half()
        return picked

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


def running_work(node: Any) -> list[tuple[float, float, TaskRecord]]:
    """(since, slots, record) of the tasks and actor calls running now (lock held)."""
    running = []
    # Read defensively: a backend whose workers look otherwise just has none to show.
    for conn in getattr(node, "workers", {}).values():
        actor = getattr(conn, "actor", None)
        if actor is not None:
            calls = list(getattr(actor, "inflight", {}).values())[:1]
        else:
            calls = list(getattr(getattr(conn, "slot", None), "inflight", ()))[:1]
        for task in calls:
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
