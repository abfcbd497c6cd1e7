"""Sort orders of the dashboard's tasks table, kept up to date as records arrive.

A full sort of a million row numbers by a column costs about a second in CPython, and
``list.sort`` holds the GIL for all of it, so the dashboard never sorts everything when
a page asks. Instead the mirror keeps, for every sortable column, a :class:`SortOrder`:
the row numbers ascending by (value, row), 4 bytes a row, extended with each sync's
new rows. A descending order is the same array read backwards (ties newest first).

Extending sorts only the new rows, then merges them in. New rows have larger row
numbers than every kept one, so a new row goes after the kept rows of equal value:
``bisect_right`` on the column finds its place, and the merge copies the kept array in
slices between those places (O(k log n) key reads, about 1.4 µs a new row on a loaded
host, and a memory copy). Only while the order is small, or the new rows outnumber the
kept, one Timsort of the kept run and the sorted new run does it instead: that makes a
list of every row (36 bytes each), which at 100,000 rows would be most of the
process's growth.

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


class SortOrder:
    """Row numbers ascending by (``key(row)``, row), covering rows ``0 .. len(rows)``."""

    def __init__(self) -> None:
        self.rows: array.array[int] = array.array("i")
        self._to_drop = 0  # oldest rows forgotten, not yet taken out (``drop_oldest``)

    def __len__(self) -> int:
        return len(self.rows)

    def extend(self, n: int, key: Callable[[int], Any]) -> None:
        """Take rows ``len(self) .. n`` in (``key`` reads a row's value, in C); call it
        before reading ``rows`` (it also carries out ``drop_oldest``)."""
        if self._to_drop:
            n_drop, self._to_drop = self._to_drop, 0
            kept = itertools.compress(self.rows,
                                      map(functools.partial(operator.le, n_drop), self.rows))
            self.rows = array.array("i", map(functools.partial(operator.add, -n_drop), kept))
        kept = self.rows
        first = len(kept)
        if first >= n:
            return
        new = sorted(range(first, n), key=key)  # stable: ties stay in row order
        if first < SMALL_ORDER or n - first >= first:
            merged = kept.tolist()
            merged.extend(new)
            merged.sort(key=key)  # two sorted runs: Timsort merges them
            self.rows = array.array("i", merged)
            return
        out = array.array("i")
        done = 0  # kept rows copied so far
        for row in new:
            at = bisect.bisect_right(kept, key(row), done, first, key=key)
            if at > done:
                out += kept[done:at]
                done = at
            out.append(row)
        out += kept[done:]
        self.rows = out

    def drop_oldest(self, n: int) -> None:
        """Forget rows below ``n`` and renumber the rest (the mirror trimmed them), at
        the next ``extend``: a pass over every row, so the mirror's trim does not make
        one per order while holding its lock (``refresh_orders`` takes one at a time)."""
        self._to_drop += n


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
