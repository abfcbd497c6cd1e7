"""The functions view: per function, counts by state and run and queued time percentiles,
kept as records arrive, so the view answers in a few milliseconds at a million records.

Sorting a function's run times when the page asks (what the mirror did before) costs
about 0.1 s a million values, holding the GIL. Instead each function keeps:

* its counts by state (the mirror's state indexes);
* its run times and its queued times as histograms on log-spaced buckets (bucket ``b``
  holds the values in ``(GAMMA**(b-1), GAMMA**b]``; values at or below ``SMALLEST_S``
  share the lowest bucket), from which a percentile is read to within ``(GAMMA-1) /
  (GAMMA+1)``, 1%, of the exact one (the bucket's middle, as DDSketch does; the view
  rounds to the microsecond anyway). A histogram takes a few hundred buckets at most
  (from 0.1 µs to a day is about 1,250);
* the exact sums and counts behind the means and the total queued time.

Taking a batch of records in and taking the oldest out (the mirror's trim to its budget)
are the same counting with opposite signs, so a trim is exact and needs no recount. The
counting runs in C per record (``map`` of ``math.log``, a ``Counter`` of
(function, bucket) pairs); Python code runs per distinct pair and per record only for
the sums.

One owner: the mirror's sync thread builds the next :class:`FunctionStats` with
:meth:`FunctionStats.folded` (a copy of the functions a batch touches; the others are
shared), off the mirror's lock, and publishes it by swapping one reference; requests
read the published one under the lock and never change it.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import Counter
from collections.abc import Sequence
from typing import Any

GAMMA = 1.02  # a bucket's upper bound over its lower one: percentiles within 1%
SMALLEST_S = 1e-7  # run and queued times at or below this share the lowest bucket
_PER_LOG = 1.0 / math.log(GAMMA)


class _Times:
    """A histogram of times (see the module docstring), their count and their sum."""

    __slots__ = ("buckets", "n", "total")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}  # bucket -> how many times fell in it
        self.n = 0
        self.total = 0.0

    def copy(self) -> _Times:
        twin = _Times()
        twin.buckets, twin.n, twin.total = dict(self.buckets), self.n, self.total
        return twin

    def percentiles(self) -> tuple[float | None, float | None]:
        """p50 and p95 (nearest rank), each within 1% of the exact one."""
        if self.n <= 0 or not self.buckets:
            return None, None
        wanted = [max(0, math.ceil(q * self.n) - 1) for q in (0.5, 0.95)]  # 0-based ranks
        found: list[float | None] = []
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            while wanted and wanted[0] < seen:
                wanted.pop(0)
                found.append(_r(bucket_value(bucket)))
            if not wanted:
                break
        return found[0] if found else None, found[1] if len(found) > 1 else None

    def mean(self) -> float | None:
        return _r(self.total / self.n) if self.n > 0 else None


class _Function:
    """One function's figures: counts by state, run times, queued times."""

    __slots__ = ("states", "times")

    def __init__(self, states: dict[int, int] | None = None,
                 times: tuple[_Times, _Times] | None = None) -> None:
        self.states: dict[int, int] = states if states is not None else {}
        self.times = times if times is not None else (_Times(), _Times())  # run, queued

    def copy(self) -> _Function:
        return _Function(dict(self.states), (self.times[0].copy(), self.times[1].copy()))


class FunctionStats:
    """Every function's figures, by the mirror's name index. Never changed once
    published: :meth:`folded` makes the next one."""

    def __init__(self, functions: dict[int, _Function] | None = None) -> None:
        self.functions: dict[int, _Function] = functions or {}

    def folded(self, names: Sequence[int], states: Sequence[int], runs: Sequence[float],
               queued: Sequence[float], sign: int = 1) -> FunctionStats:
        """A copy with a batch of records added (``sign`` 1) or taken out (-1): their name
        and state indexes, run times (negative: never ran) and queued times (negative:
        never queued), all of the same length."""
        functions = dict(self.functions)
        touched: dict[int, _Function] = {}

        def entry(name: int) -> _Function:
            function = touched.get(name)
            if function is None:
                kept = functions.get(name)
                function = touched[name] = functions[name] = (
                    kept.copy() if kept is not None else _Function())
            return function

        for (name, state), n in Counter(zip(names, states)).items():
            counts = entry(name).states
            counts[state] = counts.get(state, 0) + sign * n
        for which, values in enumerate((runs, queued)):
            present = list(map(operator.le, itertools.repeat(0.0), values))
            of = list(itertools.compress(names, present))
            kept_values = list(itertools.compress(values, present))
            for (name, bucket), n in Counter(zip(of, _buckets(kept_values))).items():
                buckets = entry(name).times[which].buckets
                buckets[bucket] = buckets.get(bucket, 0) + sign * n
                if not buckets[bucket]:
                    del buckets[bucket]
            sums: dict[int, float] = {}
            for name, value in zip(of, kept_values):
                sums[name] = sums.get(name, 0.0) + value
            for name, n in Counter(of).items():
                times = entry(name).times[which]
                times.n += sign * n
                times.total += sign * sums[name]
        for name, function in touched.items():
            function.states = {s: n for s, n in function.states.items() if n}
            if not function.states:  # every record of it was taken out
                del functions[name]
        return FunctionStats(functions)

    def rows(self, names: Sequence[str], states: Sequence[str]) -> list[dict[str, Any]]:
        """The view's rows (no live tasks), unsorted."""
        out = []
        for index, function in self.functions.items():
            run, queued = function.times
            run_p50, run_p95 = run.percentiles()
            queued_p50, queued_p95 = queued.percentiles()
            out.append({
                "name": names[index],
                "count": sum(function.states.values()),
                "state_counts": {states[s]: n for s, n in function.states.items()},
                "p50_run_s": run_p50, "p95_run_s": run_p95, "mean_run_s": run.mean(),
                "p50_queued_s": queued_p50, "p95_queued_s": queued_p95,
                "total_queued_s": _r(max(0.0, queued.total)),
            })
        return out


def _buckets(values: Sequence[float]) -> Any:
    """Each value's bucket (in C: ``ceil(log(max(v, SMALLEST_S)) / log(GAMMA))``)."""
    clamped = map(max, values, itertools.repeat(SMALLEST_S))
    return map(math.ceil, map(operator.mul, map(math.log, clamped), itertools.repeat(_PER_LOG)))


def bucket_value(bucket: int) -> float:
    """The value a bucket stands for: within 1% of every value in it."""
    return 2.0 * GAMMA ** bucket / (GAMMA + 1.0)


def _r(seconds: float) -> float:
    """To the microsecond (``round(x, 6)`` is ten times slower: it goes through text)."""
    return int(seconds * 1e6 + (0.5 if seconds >= 0 else -0.5)) / 1e6
