"""Streaming generators: what a running generator task has yielded, for its consumer.

A task (or actor method) whose function returns a generator streams, as Ray's do since
2.8: the worker runs the generator, and sends each item to the driver as it is yielded
(a ``("stream", "yield", head, index, object_id, stored)`` request, ``index`` counting
the yields of this run; ``Worker.stream_items``).
The caller gets an ``ObjectRefGenerator`` holding the task's one return ref, the *head*:
it resolves when the task ends (to None, or to the task's error). A stream is keyed by
its head's id.

The consumer asks for item ``i`` (``"item"``) and gets one of:

* ``("item", id)``: item ``i`` was yielded and is the object ``id``;
* ``("wait", id)``: not yet; ``id`` is a *placeholder*, a pending object that becomes
  item ``i`` when it is yielded (or resolves when the task ends): the consumer waits on
  it with the ordinary ``wait`` and asks again;
* ``("error", head)``: the task failed after ``i`` items (its worker crashed, it was
  cancelled): getting the head raises why. An exception raised by the generator itself
  is not this: the worker sends it as the last item (a failed object), as Ray does, and
  the task succeeds;
* ``("end", None)``: the stream ended before item ``i``.

Retries. A generator task re-run after a crash (``max_retries``, or an actor's
``max_task_retries`` after a restart) starts its generator again from the top. As in
Ray, the consumer sees each item once: the re-run's first ``len(stream.items)`` yields
are the items the stream already has and are skipped. The reply to a yield says how
many items the stream holds, and the worker stops serializing and sending yields below
that count, so only the re-run's first yield travels in vain (the driver drops it, by
its index). So the items at the indices the first run sent are the first run's and the
later ones the re-run's: a generator that yields different items when re-run gives a
mix of both, which is the user's non-determinism (as in Ray). An exception the
generator raises is a retry too when the task's ``retry_exceptions`` takes it and tries
are left: the driver answers its yield with ``STREAM_RETRY`` instead of making it the
last item, and the worker lets it fail the task, which the node then runs again.

Pins. The driver creates each item's object with no holder but the stream (the entry's
``stream_pinned``; ``pinned`` below lists them), so an item nobody has read yet stays
alive. The pin is not a read: spilling may move an unread item to disk. The pin of a
yielded item goes as soon as the consumer's hold on it registers (``on_consumer_hold``:
the driver's borrow of the ref it was given, or a worker's borrow message), so an item
whose ref the consumer drops is freed then, as in Ray, not when it asks for the next.
A placeholder keeps its pin while it is pending: the consumer may drop its ref to it
(a ``next`` with a timeout that passed) and ask for the same index again. Asking for
item ``i`` also unpins the items before it (the consumer holds refs to those it took:
its borrow reached the driver first, as requests are ordered). When the head is freed — the
consumer dropped the generator — or the stream is released, every remaining pin goes,
so a consumer that stops early releases what it did not read. Items yielded after the
head is gone are dropped at once (and the stream released, with its pins). The task
itself runs to its end, as in Ray.

Yield times are kept on the task's record (``TaskRecord.yields``) for the timeline.

State here is the node's: methods run under its lock. ``streams`` is empty unless
generators are in use, so the node's hooks (task end, freed refs) cost one truth test.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightwork.kernel import serialization
from lightwork.engines.local.objects import FAILED, PENDING, ObjectEntry
from lightwork.engines.local.protocol import STREAM_RETRY
from lightwork.kernel.serialization import Stored

if TYPE_CHECKING:
    from lightwork.engines.local.node import Node


@dataclass(slots=True, eq=False)
class Stream:
    head: int
    items: list[int] = field(default_factory=list)  # object ids, in yield order
    placeholders: dict[int, int] = field(default_factory=dict)  # index -> pending object id
    pinned: list[int] = field(default_factory=list)  # ids still pinned by the stream
    finished: bool = False
    failed: bool = False  # finished by an error, after ``len(items)`` items


class StreamTable:
    """Every live stream of the session, by head id (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.streams: dict[int, Stream] = {}

    # -- requests ------------------------------------------------------------------------
    def request(self, op: str, *args: Any) -> Any:
        if op == "yield":
            return self.on_yield(*args)
        if op == "item":
            return self.item(*args)
        if op == "release":
            self.release(args[0])
            return None
        raise ValueError(f"unknown stream request {op!r}")

    def on_yield(self, head: int, index: int, object_id: int, stored: Stored | None,
                 error: Stored | None = None) -> int | None:
        """A running task's ``index``-th yield of this run was ``stored`` (or it raised
        ``error``, its last item). Return how many items the stream now has (the worker
        need not send yields below that: a retry's), None if nobody consumes it, or
        ``STREAM_RETRY`` for an error the task is retried for."""
        node = self.node
        head_entry = node.objects.entries.get(head)
        if head_entry is None:  # the consumer dropped the generator: drop the item
            self.release(head)
            self._drop(stored)
            return None
        stream = self._stream(head)
        if index < len(stream.items):  # a re-run yields again what the stream has
            self._drop(stored)
            return len(stream.items)
        if error is not None:
            task = node.tasks.get(head_entry.task_id)
            if task is not None and node._should_retry_error(task, error):
                return STREAM_RETRY  # the task fails with it, and runs again
        placeholder = stream.placeholders.pop(index, None)
        if placeholder is not None and placeholder in node.objects.entries:
            entry = node.objects.entries[placeholder]
        else:
            entry = self._pinned_entry(stream, object_id, head_entry)
        stream.items.append(entry.object_id)
        node._resolve(entry, stored, error)
        task = node.tasks.get(head_entry.task_id)
        if task is not None:
            task.record.yields += (time.monotonic(),)
        return len(stream.items)

    def _drop(self, stored: Stored | None) -> None:
        if stored is not None and stored.path is not None:
            self.node.store.release(stored.path)

    def item(self, head: int, index: int) -> tuple[str, int | None]:
        node = self.node
        stream = self.streams.get(head)
        if stream is None:
            head_entry = node.lookup(head)  # a freed head raises, naming the problem
            if head_entry.state != PENDING:  # ended without yielding anything
                return ("error", head) if head_entry.state == FAILED and index == 0 else ("end", None)
            stream = self._stream(head)
        self._unpin_before(stream, index)
        if index < len(stream.items):
            object_id = stream.items[index]
            entry = node.objects.entries.get(object_id)
            if entry is not None and (entry.driver_holds or entry.holders):
                # The consumer holds it already (its ref to the placeholder that became
                # this item): no borrow will register again, so the pin goes now.
                self.on_consumer_hold(entry)
            return "item", object_id
        if stream.finished:
            # Final answer: the consumer's waits are over, so placeholder pins can go
            # (its own refs to them were registered before this request).
            items = set(stream.items)
            self._unpin([i for i in stream.pinned if i not in items])
            stream.pinned = [i for i in stream.pinned if i in items]
            if stream.failed and index == len(stream.items):
                return "error", head
            return "end", None
        placeholder = stream.placeholders.get(index)
        if placeholder is None:
            entry = self._pinned_entry(stream, node.next_object_id(), node.objects.entries[head])
            placeholder = stream.placeholders[index] = entry.object_id
        return "wait", placeholder

    # -- hooks from the node -------------------------------------------------------------
    def on_task_end(self, head: int) -> None:
        """The generator task ended: wake placeholders (its error, or the end)."""
        stream = self.streams.get(head)
        if stream is None:
            return
        node = self.node
        head_entry = node.objects.entries.get(head)
        if head_entry is None:
            self.release(head)
            return
        stream.finished = True
        stream.failed = head_entry.state == FAILED
        end = len(stream.items)
        for index, placeholder in sorted(stream.placeholders.items()):
            entry = node.objects.entries.get(placeholder)
            if entry is None:
                continue
            if stream.failed and index == end:
                node._resolve(entry, None, head_entry.error)
            else:
                node._resolve(entry, serialization.serialize(None, None))
        stream.placeholders.clear()

    def release_unconsumed(self) -> None:
        """Release the streams whose head was freed (their consumer dropped them)."""
        entries = self.node.objects.entries
        for head in [head for head in self.streams if head not in entries]:
            self.release(head)

    def release(self, head: int) -> None:
        stream = self.streams.pop(head, None)
        if stream is not None:
            self._unpin(stream.pinned)
            stream.pinned = []

    # -- pins ----------------------------------------------------------------------------
    @staticmethod
    def on_consumer_hold(entry: ObjectEntry) -> None:
        """A consumer's hold on ``entry`` registered (the caller has recorded it): a
        yielded item's pin goes, so the item lives exactly as long as the consumer's refs.

        Only the entry's flag changes (the driver's borrow hook runs without the node's
        lock, as its ``driver_holds`` write does); the id stays in ``stream.pinned`` until
        the next unpin pass, which finds the flag already down."""
        if entry.stream_pinned and entry.state != PENDING:
            entry.stream_pinned = False

    def _stream(self, head: int) -> Stream:
        stream = self.streams.get(head)
        if stream is None:
            stream = self.streams[head] = Stream(head)
        return stream

    def _pinned_entry(self, stream: Stream, object_id: int, head_entry: ObjectEntry) -> ObjectEntry:
        entry = self.node.objects.create(object_id, 0, head_entry.task_id)
        entry.driver_holds = False  # held by the stream's pin until the consumer takes it
        entry.stream_pinned = True
        stream.pinned.append(object_id)
        return entry

    def _unpin_before(self, stream: Stream, index: int) -> None:
        taken = set(stream.items[:index])
        if not taken or not stream.pinned:
            return
        keep = [object_id for object_id in stream.pinned if object_id not in taken]
        if len(keep) != len(stream.pinned):
            self._unpin([object_id for object_id in stream.pinned if object_id in taken])
            stream.pinned = keep

    def _unpin(self, object_ids: list[int]) -> None:
        objects = self.node.objects
        for object_id in object_ids:
            entry = objects.entries.get(object_id)
            if entry is not None:
                entry.stream_pinned = False
                objects.release_if_unheld(entry)
