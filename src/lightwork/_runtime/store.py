"""The driver's shared memory: recycled segments and who still reads them.

Writing a large value into fresh tmpfs pages costs a page allocation, a zeroing and a
page fault per 4 KiB: several times the copy itself. So the driver keeps the segments of
freed objects (up to ``pool_limit`` bytes) mapped writable and faulted in, and writes the
next large value into one of them: a ``put`` or a by-value argument then costs one
``memcpy``. A segment is one file under the session's ``/dev/shm`` directory; a recycled
one keeps its name (names are opaque to readers).

A segment may hold a new value only when no reader anywhere still has a view into its
old one (an array from ``get``, an argument an actor kept):

* in the driver, ``serialization.MAPS.forget`` says so (an ``mmap`` cannot be closed
  while a view of it exists);
* a worker reports each segment it maps (``MAPPED``, sent before anything that could
  end the worker's use of the object) and each mapping it has closed (``UNMAPPED``,
  after each task); ``readers`` holds, per segment, the workers that map it.

A freed segment that someone still reads is unlinked instead: the reader's mapping stays
valid, and the memory returns to the system when the reader drops its view.

Thread safety: the store has its own lock, taken briefly and never while calling out;
``write`` runs in user threads (``put``, by-value arguments), ``release`` and the reader
reports on the node's I/O thread under the node lock.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
from dataclasses import dataclass

from lightwork._runtime import serialization

#: Capacity granularity: a segment is allocated in whole units of this.
SEGMENT_UNIT = 64 * 1024
#: A recycled segment may hold a value this many times smaller than its capacity, plus
#: ``REUSE_SLACK`` bytes; a smaller value gets a new segment instead of wasting the rest.
REUSE_RATIO = 2
REUSE_SLACK = 4 * 1024 * 1024


@dataclass(slots=True, eq=False)
class Segment:
    path: str
    capacity: int
    mapping: mmap.mmap | None = None  # the driver's writable mapping, faulted in


class SegmentStore:
    """Segments of the session's shared-memory directory (see the module docstring)."""

    def __init__(self, shm_dir: str, pool_limit: int) -> None:
        self.shm_dir = shm_dir
        self.pool_limit = pool_limit
        self._lock = threading.Lock()
        self._names = itertools.count(1)
        self.free: list[Segment] = []  # recycled, most recently freed last
        self.live: dict[str, Segment] = {}  # segments written here that hold a value
        self.readers: dict[str, set[int]] = {}  # segment path -> workers that map it
        self.pooled_bytes = 0
        self.recycled_count = 0
        self.closed = False

    # ---------------------------------------------------------------- writing
    def write(self, data: bytes, raws: list[memoryview]) -> str:
        """Write a value into a recycled (or new) segment; return its path."""
        plan = serialization.layout(data, raws)
        segment = self._take(plan.total)
        if segment is None:
            segment = self._create(plan.total)
        try:
            if segment.mapping is None:
                segment.mapping = _map_writable(segment.path)
            view = memoryview(segment.mapping)
            try:
                serialization.write_into(view, plan, data, raws)
            finally:
                view.release()
        except BaseException:
            self._discard(segment)
            raise
        with self._lock:
            self.live[segment.path] = segment
        return segment.path

    def _take(self, size: int) -> Segment | None:
        with self._lock:
            best = None
            for segment in self.free:
                if segment.capacity >= size and (
                        best is None or segment.capacity < best.capacity):
                    best = segment
            if best is None or best.capacity > size * REUSE_RATIO + REUSE_SLACK:
                return None
            self.free.remove(best)
            self.pooled_bytes -= best.capacity
            self.recycled_count += 1
            return best

    def _create(self, size: int) -> Segment:
        capacity = -(-size // SEGMENT_UNIT) * SEGMENT_UNIT
        path = f"{self.shm_dir}/s{next(self._names):x}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            serialization.allocate_file(fd, capacity, path)
            mapping = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED | _POPULATE)
        except BaseException:
            serialization._unlink_quietly(path)
            raise
        finally:
            os.close(fd)
        return Segment(path, capacity, mapping)

    # ---------------------------------------------------------------- readers
    def add_reader(self, path: str, worker_id: int) -> None:
        with self._lock:
            self.readers.setdefault(path, set()).add(worker_id)

    def remove_reader(self, path: str, worker_id: int) -> None:
        with self._lock:
            readers = self.readers.get(path)
            if readers is not None:
                readers.discard(worker_id)
                if not readers:
                    del self.readers[path]

    def forget_worker(self, worker_id: int) -> None:
        """A worker died: its mappings died with it."""
        with self._lock:
            for path in [p for p, ids in self.readers.items() if worker_id in ids]:
                self.readers[path].discard(worker_id)
                if not self.readers[path]:
                    del self.readers[path]

    # ---------------------------------------------------------------- freeing
    def release(self, path: str) -> None:
        """The value in segment ``path`` is freed: recycle the segment, or unlink it."""
        unviewed = serialization.MAPS.forget(path)
        with self._lock:
            segment = self.live.pop(path, None)
            read_elsewhere = self.readers.pop(path, None)
            if unviewed and not read_elsewhere and not self.closed:
                if segment is None:  # a worker wrote it: adopt it
                    segment = Segment(path, _file_size(path))
                if segment.capacity and self.pooled_bytes + segment.capacity <= self.pool_limit:
                    self.free.append(segment)
                    self.pooled_bytes += segment.capacity
                    return
        if segment is None:
            segment = Segment(path, 0)
        self._discard(segment)

    def _discard(self, segment: Segment) -> None:
        if segment.mapping is not None:
            segment.mapping.close()
            segment.mapping = None
        serialization._unlink_quietly(segment.path)

    def trim(self, keep: int = 0) -> int:
        """Unlink recycled segments until at most ``keep`` bytes stay pooled; bytes freed."""
        dropped = []
        with self._lock:
            while self.free and self.pooled_bytes > keep:
                segment = self.free.pop(0)
                self.pooled_bytes -= segment.capacity
                dropped.append(segment)
        for segment in dropped:
            self._discard(segment)
        return sum(segment.capacity for segment in dropped)

    def close(self) -> None:
        """Unmap and unlink everything this store wrote (the session is ending)."""
        with self._lock:
            self.closed = True
            segments = self.free + list(self.live.values())
            self.free, self.live, self.pooled_bytes = [], {}, 0
            self.readers.clear()
        for segment in segments:
            self._discard(segment)

    # ---------------------------------------------------------------- facts
    @property
    def live_bytes(self) -> int:
        return sum(segment.capacity for segment in list(self.live.values()))


# MAP_POPULATE faults the whole new mapping in with one call instead of one fault per page.
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _map_writable(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | _POPULATE)
    finally:
        os.close(fd)


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
