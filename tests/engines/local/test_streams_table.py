"""The driver's stream table (``lightwork.engines.local.streams``) on a stand-in node: the
pins it takes and gives back, and what it does with a retried task's repeated yields.
These paths race with the consumer in a real session; here each is driven directly."""

from __future__ import annotations

import itertools

from lightwork.kernel import serialization
from lightwork.engines.local.objects import ObjectTable
from lightwork.engines.local.streams import StreamTable

HEAD = 1


class StandInStore:
    def __init__(self) -> None:
        self.released: list[str] = []

    def release(self, path: str) -> None:
        self.released.append(path)


class StandInNode:
    """What ``StreamTable`` uses of the node."""

    def __init__(self) -> None:
        self.objects = ObjectTable()
        self.store = StandInStore()
        self.tasks: dict = {}
        self._ids = itertools.count(100)

    def next_object_id(self) -> int:
        return next(self._ids)

    def lookup(self, object_id: int):
        return self.objects.entries[object_id]

    def _resolve(self, entry, stored, error=None) -> None:
        for waiter in self.objects.resolve(entry, stored, error):
            waiter(entry)


def a_stream() -> tuple[StandInNode, StreamTable]:
    node = StandInNode()
    node.objects.create(HEAD, 0, task_id=7)  # the generator's head, held by the consumer
    return node, StreamTable(node)


def value(item: object) -> serialization.Stored:
    return serialization.serialize(item, None)


def in_segment(path: str) -> serialization.Stored:
    return serialization.Stored(b"", (), path, 4 << 20, ())


def test_an_unread_item_is_kept_by_the_stream_pin_not_by_a_task_use():
    node, table = a_stream()
    assert table.on_yield(HEAD, 0, 10, value("a")) == 1
    entry = node.objects.entries[10]
    assert entry.stream_pinned and entry.task_uses == 0  # spilling may take it
    assert table.item(HEAD, 0) == ("item", 10)
    table.item(HEAD, 1)  # asking for the next item gives up the pin on the first
    assert not entry.stream_pinned and 10 not in node.objects.entries


def test_a_yield_after_the_head_is_gone_releases_the_streams_pins():
    node, table = a_stream()
    table.on_yield(HEAD, 0, 10, value("a"))
    kind, placeholder = table.item(HEAD, 1)  # the consumer waits for item 1
    assert kind == "wait" and node.objects.entries[placeholder].stream_pinned
    del node.objects.entries[HEAD]  # the head was freed before the stream heard of it
    assert table.on_yield(HEAD, 1, 11, in_segment("/dev/shm/x/b")) is None
    assert HEAD not in table.streams
    assert 10 not in node.objects.entries and placeholder not in node.objects.entries
    assert node.store.released == ["/dev/shm/x/b"]


def test_a_retry_repeating_yields_is_dropped_and_told_how_many_the_stream_has():
    node, table = a_stream()
    table.on_yield(HEAD, 0, 10, value("a"))
    table.on_yield(HEAD, 1, 11, value("b"))
    # The re-run's first yield: dropped, and the worker learns to skip up to index 2.
    assert table.on_yield(HEAD, 0, 20, in_segment("/dev/shm/x/again")) == 2
    assert 20 not in node.objects.entries
    assert node.store.released == ["/dev/shm/x/again"]
    assert table.on_yield(HEAD, 2, 21, value("c")) == 3
    assert [table.item(HEAD, i) for i in range(3)] == [("item", 10), ("item", 11), ("item", 21)]
