"""Sort orders of the dashboard's tasks table, kept up to date as records arrive.

A full sort of a million row numbers by a column costs about a second in CPython, and
``list.sort`` holds the GIL for all of it, so the dashboard never sorts everything when
a page asks. Instead the mirror keeps, for every sortable column, a :class:`SortOrder`:
the row numbers ascending by (value, row), 4 bytes a row, extended with each sync's
new rows. A descending order is the same array read backwards (ties newest first).

Extending sorts only the new rows, then merges them in. New rows have larger row
numbers than every kept one, so a new row goes after the kept rows of equal value:
``bisect_right`` on the column finds its place, and the merge copies the kept array in
slices between those places (O(k log n) key reads, and a memory copy). The new rows are
sorted, so each place is after the last one, and they spread over the kept rows about
``n / k`` apart: each search looks in the next ``2 n / k`` kept rows first (a few probes),
in the rest only past them (measured: see bench/HOTPATH.md, "The dashboard"). Only
while the order is small, or the new rows outnumber the kept, one Timsort of the kept
run and the sorted new run does it instead: that makes a list of every row (36 bytes
each), which at 100,000 rows would be most of the process's growth.

A filtered view reads the column's order and keeps the rows of the filter (a mask of
one byte a row) lazily, up to the page asked for: it walks from whichever end of the
order is nearer the page, so a page costs at most half the order, in C.
"""

from __future__ import annotations

import array
import bisect
import functools
import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any

# Merged by one Timsort while the kept rows are fewer than this, or than the new ones;
# by bisection past that (it makes no list of every row: the process stays small).
SMALL_ORDER = 4_096
RENUMBER_SLICE = 65_536  # rows renumbered per C pass after a trim (a few ms each)


class SortOrder:
    """Row numbers ascending by (``key(row)``, row), covering rows ``0 .. len(rows)``.

    ``rows`` is never changed in place: :meth:`merged` and :meth:`without_oldest` make the
    next array, which the owner (the mirror's sync thread) builds off the mirror's lock
    and publishes by assigning ``rows``; a request reading the old array is unaffected.
    """

    def __init__(self) -> None:
        self.rows: array.array[int] = array.array("i")

    def __len__(self) -> int:
        return len(self.rows)

    def extend(self, n: int, key: Callable[[int], Any]) -> None:
        """Take rows ``len(self) .. n`` in (``merged``, published at once)."""
        self.rows = self.merged(n, key)

    def merged(self, n: int, key: Callable[[int], Any]) -> array.array[int]:
        """The order of rows ``0 .. n``: this one with rows ``len(self) .. n`` merged in
        (``key`` reads a row's value, in C)."""
        kept = self.rows
        first = len(kept)
        if first >= n:
            return kept
        new = sorted(range(first, n), key=key)  # stable: ties stay in row order
        if first < SMALL_ORDER or n - first >= first:
            merged = kept.tolist()
            merged.extend(new)
            merged.sort(key=key)  # two sorted runs: Timsort merges them
            return array.array("i", merged)
        out = array.array("i")
        done = 0  # kept rows copied so far
        # The new rows spread over the kept ones about ``gap`` apart: look in the next
        # ``2 * gap`` kept rows first (a few probes), in all the rest only past them.
        gap = 2 * max(1, first // len(new))
        for row in new:
            value = key(row)
            edge = done + gap
            if edge < first and key(kept[edge]) <= value:  # its place is past the window
                at = bisect.bisect_right(kept, value, edge + 1, first, key=key)
            else:
                at = bisect.bisect_right(kept, value, done, min(edge, first), key=key)
            if at > done:
                out += kept[done:at]
                done = at
            out.append(row)
        out += kept[done:]
        return out

    def without_oldest(self, n: int) -> array.array[int]:
        """This order without rows below ``n``, the rest renumbered (the mirror trimmed
        its oldest rows), in slices of ``RENUMBER_SLICE`` rows: each is one C pass, and
        the GIL can go to a request between them."""
        drop, shift = functools.partial(operator.le, n), functools.partial(operator.add, -n)
        out = array.array("i")
        rows = self.rows
        for start in range(0, len(rows), RENUMBER_SLICE):
            piece = rows[start:start + RENUMBER_SLICE]
            out.extend(map(shift, itertools.compress(piece, map(drop, piece))))
        return out


class SortKeys:
    """The values the kept orders of ``run_s``, ``queued_s``, ``name`` and ``state`` sort
    by, one per row (the other kept orders read a column of the mirror as it is).

    Run and queued times are computed from the columns once, as rows arrive; a name and a
    state sort by their alphabetical rank among the names (states) known, kept per row
    (a state's rank in 1 byte, a name's in 4). A new name moves the ranks: every row's is
    made again (:meth:`ranked`), and the kept order by name stays right as it is, since
    the old names keep their relative order.

    The mirror's sync thread is the only writer: it appends under the mirror's lock (or
    swaps in a re-ranked array); requests read rows below the mirror's published count.
    """

    def __init__(self) -> None:
        self.run_s: array.array[float] = array.array("d")  # -1.0: never ran
        self.queued_s: array.array[float] = array.array("d")  # 0.0: never queued
        # Per kind ("name", "state"): the rank of each label index, and each row's rank.
        self.ranks: dict[str, list[int]] = {"name": [], "state": []}
        self.ranked_rows: dict[str, array.array[int]] = {"name": array.array("i"),
                                                         "state": array.array("b")}

    def columns(self) -> list[array.array[Any]]:
        """Every array with one value per row (the mirror cuts them with its columns)."""
        return [self.run_s, self.queued_s, *self.ranked_rows.values()]

    def without_oldest(self, n: int, cut: Callable[[Any, int], Any]) -> SortKeys:
        """New keys without rows below ``n`` (``cut(column, n)`` copies each column:
        these stay as they are)."""
        keys = SortKeys()
        keys.run_s, keys.queued_s = cut(self.run_s, n), cut(self.queued_s, n)
        keys.ranks = dict(self.ranks)
        keys.ranked_rows = {kind: cut(rows, n) for kind, rows in self.ranked_rows.items()}
        return keys

    def key(self, sort: str) -> Callable[[int], Any]:
        if sort in self.ranked_rows:
            return self.ranked_rows[sort].__getitem__
        return self.run_s.__getitem__ if sort == "run_s" else self.queued_s.__getitem__

    @staticmethod
    def ranks_of(labels: Sequence[str]) -> list[int]:
        """Each label's alphabetical rank, by its index."""
        ranks = [0] * len(labels)
        for rank, index in enumerate(sorted(range(len(labels)), key=labels.__getitem__)):
            ranks[index] = rank
        return ranks

    @staticmethod
    def ranked(kind: str, ranks: list[int], indexes: array.array[int]) -> array.array[int]:
        """Each row's rank from its label index, in slices of ``RENUMBER_SLICE`` (a C pass
        each, so the GIL can go to a request between them)."""
        out = array.array("i" if kind == "name" else "b")
        for start in range(0, len(indexes), RENUMBER_SLICE):
            out.extend(map(ranks.__getitem__, indexes[start:start + RENUMBER_SLICE]))
        return out


def run_times(floats: dict[str, Any]) -> array.array[float]:
    """Run time per row (finished - args_loaded; -1.0 for a task that never ran)."""
    loaded = floats["args_loaded"]
    out = array.array("d", map(operator.sub, floats["finished"], loaded))
    for i in itertools.compress(range(len(loaded)), map(operator.not_, loaded)):
        out[i] = -1.0
    return out


def queued_times(floats: dict[str, Any]) -> array.array[float]:
    """Queued time per row: from its arguments ready until it started (or was dispatched,
    or ended: the first known); 0.0 when its arguments were never ready."""
    return array.array("d", [
        (max(0.0, until - deps) if (until := started or dispatched or finished) else 0.0)
        if deps else 0.0
        for deps, started, dispatched, finished in zip(
            floats["deps_ready"], floats["started"], floats["dispatched"], floats["finished"])])


class FilteredOrder:
    """The rows of a filter (``mask[row]`` true) in a :class:`SortOrder`'s order, read a
    page at a time (``total`` rows match); ``backwards`` reads it descending."""

    def __init__(self, rows: Sequence[int], mask: bytearray | bytes, total: int,
                 backwards: bool = False) -> None:
        self.rows, self.mask, self.total, self.backwards = rows, mask, total, backwards

    def __len__(self) -> int:
        return self.total

    def reversed(self) -> FilteredOrder:
        return FilteredOrder(self.rows, self.mask, self.total, not self.backwards)

    def slice(self, start: int, stop: int) -> list[int]:
        stop = min(stop, self.total)
        if start >= stop:
            return []
        # The page as positions in the ascending order.
        low, high = (self.total - stop, self.total - start) if self.backwards else (start, stop)
        if low <= self.total - high:  # nearer the start: walk forwards
            page = list(itertools.islice(self._walk(iter), low, high))
        else:
            page = list(itertools.islice(self._walk(reversed),
                                         self.total - high, self.total - low))
            page.reverse()
        if self.backwards:
            page.reverse()
        return page

    def _walk(self, direction: Callable[[Any], Any]) -> Any:
        """The rows of the filter, in the order ``direction(self.rows)`` reads them
        (lazily, in C: two readers of the same array, one tested against the mask)."""
        return itertools.compress(direction(self.rows),
                                  map(self.mask.__getitem__, direction(self.rows)))
