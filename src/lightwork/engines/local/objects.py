"""The driver's object table: every object of the session and who keeps it alive.

Plain state: the node mutates it while holding its lock and carries out what it returns
(waking waiters). A freed value's segment goes back to ``release_segment`` (the store's
``release``: recycled or unlinked).

An entry is PENDING until its creating task finishes, then READY (``serialized`` holds
the serialized value) or FAILED (``error`` holds the exception to raise). A plain task's
result is kept as its pickle's bytes alone when that is all it is (``serialization.bare``:
inline, no out-of-band buffers, no refs inside), not in a ``Stored``: ``bytes`` are no
object of the cycle collector's, and a batch's results wait through dozens of its
collections before they are read (measured: see bench/HOTPATH.md, "The cyclic
collector"). Readers take the value as ``stored``,
a ``Stored`` either way, and its segment as ``path``; the hot paths (the result's store,
``get``, freeing) and the walks over every entry read ``serialized`` or ``path``, which
make nothing. It stays in the table while anything holds it:

* ``driver_holds``: a live ``ObjectRef`` in the driver process;
* ``holders``: ids of workers that hold a ref (their own result refs, puts, borrows);
* ``task_uses``: pending tasks that take it as an argument or carry it inside one;
* ``containers``: stored objects whose value contains a ref to it;
* ``stream_pinned``: a streaming generator's item (or placeholder) that its consumer
  has not taken yet (``streams.py`` owns the list of pins; this flag only keeps the
  entry alive). Unlike ``task_uses`` it does not mean anyone is reading the value, so
  a pinned item can still be spilled.

A dead worker's objects are adopted by the driver (``owner`` becomes 0): their values
live here or in ``/dev/shm``, never only in the worker. A value whose segment vanished
is rebuilt from ``lineage`` where it can be (see ``lineage.py``).

When all five are empty the entry is freed: its segment is released and the ids it
contained lose a container. A later lookup of a freed id raises
``ReferenceCountingAssertionError``; ids are never reused, so a freed id is detectable
by being lower than the owner's counter and absent from the table.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lightwork.kernel.collector import maker, track_again, untrack_hot
from lightwork.kernel.serialization import Stored, unbare


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


PENDING = 0
READY = 1
FAILED = 2


@dataclass(slots=True)
class ObjectEntry:
    object_id: int
    owner: int  # 0 = driver, else the worker id whose call created it
    task_id: int = 0  # creating task, 0 for put
    # when its put() or task submission registered it (4th: the table passes it by
    # position, a keyword costs a search of the parameters per call)
    created_at: float = 0.0
    state: int = PENDING
    serialized: Stored | bytes | None = None  # (read it as ``stored``: module docstring)
    error: BaseException | Stored | None = None
    driver_holds: bool = False
    # Created on first use: most objects never have a holder or a waiter, and fewer
    # containers per object means less work for the garbage collector.
    holders: set[int] | None = None
    task_uses: int = 0
    containers: int = 0
    stream_pinned: bool = False  # an unread item of a generator's stream (streams.py)
    # One waiter is held as it is, two or more in a list: a get registers the same bound
    # method on every entry it waits for, so a pending entry costs no object of its own
    # (a list and a bound method per entry outlived the young collections and reached the
    # oldest generation: 20,000 a 10,000-task batch, a full collection each batch).
    waiters: Callable[[ObjectEntry], None] | list[Callable[[ObjectEntry], None]] | None = None
    ready_at: float = 0.0  # when it became READY or FAILED (time.monotonic)
    # The finished task that made it, kept so a lost value can be rebuilt (lineage.py);
    # None for puts, actor results, and tasks that cannot be re-run.
    lineage: Any = None
    orphaned_by: int = 0  # the dead worker that owned it before the driver adopted it

    @property
    def stored(self) -> Stored | None:
        """The value as a ``Stored`` (made for a value kept bare: off the hot path)."""
        serialized = self.serialized
        # (mypy narrows only the bytes branch of a type() test, and is Stored first
        # would add a check per call: this runs per dependency in the dispatch loop)
        return unbare(serialized) if type(serialized) is bytes else serialized  # type: ignore[return-value]

    @stored.setter
    def stored(self, stored: Stored | None) -> None:
        self.serialized = stored

    @property
    def path(self) -> str | None:
        """The segment its value lives in; None for a value inline or not there."""
        serialized = self.serialized
        return serialized.path if type(serialized) is Stored else None

    def held(self) -> bool:
        return bool(self.driver_holds or self.holders or self.task_uses or self.containers
                    or self.stream_pinned)

    def add_holder(self, worker_id: int) -> None:
        if self.holders is None:
            self.holders = {worker_id}
        else:
            self.holders.add(worker_id)

    def discard_holder(self, worker_id: int) -> None:
        if self.holders:
            self.holders.discard(worker_id)

    def add_waiter(self, waiter: Callable[[ObjectEntry], None]) -> None:
        waiters = self.waiters
        if waiters is None:
            self.waiters = waiter
        elif type(waiters) is list:
            waiters.append(waiter)
        else:
            # (one waiter, not a list: mypy narrows only the list branch of a type() test)
            self.waiters = [waiters, waiter]  # type: ignore[list-item]

    def remove_waiter(self, waiter: Callable[[ObjectEntry], None]) -> None:
        waiters = self.waiters
        if type(waiters) is list:
            if waiter in waiters:
                waiters.remove(waiter)
        elif waiters is not None and waiters == waiter:
            self.waiters = None

    @property
    def size(self) -> int:
        serialized = self.serialized
        if serialized is None:
            return 0
        return serialized.size if type(serialized) is Stored else len(serialized)


#: A new entry, out of the collector until an error (collector.py) where that pays.
make_entry = maker(ObjectEntry, untrack_hot)


class ObjectTable:
    def __init__(
        self,
        release_segment: Callable[[str], None] = unlink_quietly,
        track_segment: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.entries: dict[int, ObjectEntry] = {}
        self.release_segment = release_segment
        self.track_segment = track_segment  # a value's segment now belongs to an object
        # Ids of actor handle objects; freeing one calls ``on_actor_freed`` (set by the node).
        self.actor_handles: set[int] = set()
        self.on_actor_freed: Callable[[int], None] | None = None
        self.bytes_in_segments = 0
        self.freed_count = 0

    def create(self, object_id: int, owner: int, task_id: int = 0,
               at: float | None = None) -> ObjectEntry:
        """A new PENDING entry, created ``at`` (a ``time.monotonic()`` the caller already
        took, shared with the task's record: one float less per queued task) or now."""
        if at is None:
            at = time.monotonic()
        if owner == 0:
            entry = make_entry(object_id, 0, task_id, at, PENDING, None, None, True)
        else:
            entry = make_entry(object_id, owner, task_id, at)
            entry.holders = {owner}
        self.entries[object_id] = entry
        return entry

    def get(self, object_id: int) -> ObjectEntry | None:
        return self.entries.get(object_id)

    def discard(self, object_ids: tuple[int, ...]) -> None:
        """Forget the entries a failed submission created (no ref to them was made)."""
        for object_id in object_ids:
            self.entries.pop(object_id, None)

    def add_actor_handle(self, entry: ObjectEntry) -> None:
        """``entry`` is an actor's handle object: freeing it ends the actor."""
        self.actor_handles.add(entry.object_id)

    def resolve(self, entry: ObjectEntry, stored: Stored | bytes | None,
                error: Any = None, at: float = 0.0) -> Sequence[Callable]:
        """Make ``entry`` READY with ``stored`` (a ``Stored``, or a bare value's bytes:
        the module docstring) or FAILED with ``error``, ``at`` a clock reading the caller
        took (or now); return the waiters to call."""
        if entry.state != PENDING:
            return []
        entry.ready_at = at or time.monotonic()
        if error is not None:
            entry.state = FAILED
            entry.error = error
            track_again(entry)  # a traceback's frames may lead back to it (collector.py)
        elif type(stored) is bytes:  # inline, nothing inside: nothing else to account
            entry.state = READY
            entry.serialized = stored
        else:
            assert type(stored) is Stored
            entry.state = READY
            entry.serialized = stored
            if stored.path is not None:
                self.bytes_in_segments += stored.size
                if self.track_segment is not None:
                    self.track_segment(stored.path, stored.size, entry.object_id)
            for contained_id in stored.contained:
                inner = self.entries.get(contained_id)
                if inner is not None:
                    inner.containers += 1
        waiters = entry.waiters
        if waiters is None:
            return ()
        entry.waiters = None
        return waiters if type(waiters) is list else (waiters,)  # type: ignore[return-value]

    def lose(self, entry: ObjectEntry, error: BaseException) -> Sequence[Callable]:
        """The object's value is gone (its owner died): from now on it raises ``error``."""
        stored = entry.stored
        if stored is not None:
            self._drop_value(stored)
        entry.stored = None
        entry.state = PENDING
        return self.resolve(entry, None, error)

    def forget_value(self, entry: ObjectEntry) -> list[ObjectEntry]:
        """A READY entry's value vanished and will be rebuilt: make it PENDING again.

        Return the entries its value contained refs to, for the caller to release once
        the rebuilding task holds what it needs.
        """
        inner: list[ObjectEntry] = []
        if entry.stored is not None:
            inner = self._drop_value(entry.stored)
        entry.stored = None
        entry.state = PENDING
        return inner

    def _drop_value(self, stored: Stored) -> list[ObjectEntry]:
        """Release the value's segment; return the entries it contained refs to."""
        if stored.path is not None:
            self.bytes_in_segments -= stored.size
            self.release_segment(stored.path)
        inner_entries = []
        for contained_id in stored.contained:
            inner = self.entries.get(contained_id)
            if inner is not None:
                inner.containers -= 1
                inner_entries.append(inner)
        return inner_entries

    def release_driver_holds(self, object_ids: list[int],
                             still_held: Callable[[int], bool]) -> None:
        """The driver dropped its refs to ``object_ids``: each is freed if nothing else
        holds it, unless ``still_held(object_id)`` (a ref to it was made again since).
        In a batch these are results just read, which keep nothing else alive: they are
        freed here, in one pass over the ids; anything more through ``release_if_unheld``."""
        entries = self.entries
        actor_handles = self.actor_handles
        freed = 0
        for object_id in object_ids:
            entry = entries.get(object_id)
            if entry is None or still_held(object_id):
                continue
            entry.driver_holds = False
            if entry.held():
                continue
            serialized = entry.serialized
            if (serialized is None or type(serialized) is bytes) and object_id not in actor_handles:
                del entries[object_id]
                freed += 1
            else:
                self.release_if_unheld(entry)
        self.freed_count += freed

    def release_if_unheld(self, entry: ObjectEntry) -> None:
        """Free ``entry`` (and, transitively, what only it kept) if nothing holds it.

        (One ``held()`` per entry and no list for a value that keeps nothing else alive:
        this runs for every ref dropped and every actor call ended.)"""
        others: list[ObjectEntry] | None = None  # entries only freed values kept
        current = entry
        while True:
            if not current.held() and self.entries.get(current.object_id) is current:
                del self.entries[current.object_id]
                self.freed_count += 1
                if current.object_id in self.actor_handles:
                    self.actor_handles.discard(current.object_id)
                    if self.on_actor_freed is not None:
                        self.on_actor_freed(current.object_id)
                stored = current.serialized
                if type(stored) is Stored and (
                        stored.path is not None or stored.contained):
                    inner = self._drop_value(stored)
                    if others is None:
                        others = inner
                    else:
                        others.extend(inner)
            if not others:
                return
            current = others.pop()

    def unlink_all(self) -> None:
        for entry in self.entries.values():
            path = entry.path
            if path is not None:
                unlink_quietly(path)
        self.entries.clear()


