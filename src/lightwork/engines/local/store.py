"""The driver's shared memory: recycled segments and who still reads them.

Writing a large value into fresh tmpfs pages costs a page allocation, a zeroing and a
page fault per 4 KiB: several times the copy itself. So the driver keeps the segments of
freed objects (up to ``pool_limit`` bytes) mapped writable and faulted in, and writes the
next large value into one of them: a ``put`` or a by-value argument then costs one
``memcpy``. A segment is one file under the session's ``/dev/shm`` directory; a recycled
one keeps its name (names are opaque to readers).

The pool gives memory back when idle: a segment that stays unused in it for
``POOL_IDLE_S`` is unlinked (``trim_idle``, run by the spill thread, which sleeps until
the oldest pooled segment is due), and a write that needs room trims it first.

A segment may hold a new value only when no reader anywhere still has a view into its
old one (an array from ``get``, an argument an actor kept):

* in the driver, ``serialization.MAPS.forget`` says so (an ``mmap`` cannot be closed
  while a view of it exists);
* a worker reports each segment it maps (``MAPPED``, sent before anything that could
  end the worker's use of the object) and each mapping it has closed (``UNMAPPED``,
  after each task); ``readers`` holds, per segment, the workers that map it.

A freed segment that someone still reads is unlinked instead: the reader's mapping stays
valid, and the memory returns to the system when the reader drops its view.

The budget (``init(object_store_memory=)``; by default 30% of the machine's memory,
capped by what ``/dev/shm`` has free, as in Ray) bounds live segments plus pooled ones.
A driver write that would pass it first trims the pool, then asks the spiller
(``spill.py``) to move the least recently used objects to disk and waits, at most
``ROOM_WAIT_S``, for room; when nothing more can be spilled it raises
``ObjectStoreFullError``. A worker asks before it writes a large value (``reserve``,
a ``room`` request): it gets a pooled segment to write over in place, or room for a new
file once the spiller made it, or that error; the reserved segment counts as live from
then on, until the object is reported (``track``; for a call's arguments, when the
call's submission arrives), freed, or the worker dies (``forget_worker`` drops what it
never reported). A write that must wait for the
spiller waits on a short-lived thread, never on the node's I/O thread, and fails (no
deadlock) when the objects in memory are all read by running tasks.
``live`` is kept in least-recently-used order (``touch``).

Before spilling, garbage: once live objects pass ``COLLECT_AT`` of the budget, the store
asks (``on_high``, at most once per ``COLLECT_EVERY_S``) for every process of the session
to run Python's cycle collector. A ref that only a reference cycle still holds (a worker
with ``gc.disable()``, or one that allocates too little for a collection to come) keeps
its object alive until then; collecting first frees it instead of spilling it.

Thread safety: the store has its own lock, taken briefly and never while calling out;
``write`` runs in user threads (``put``, by-value arguments), ``release`` and the reader
reports on the node's I/O thread under the node lock.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from lightwork.kernel import serialization
from lightwork.kernel.exceptions import ObjectStoreFullError

#: A recycled segment may hold a value this many times smaller than its capacity, plus
#: ``REUSE_SLACK`` bytes; a smaller value gets a new segment instead of wasting the rest.
REUSE_RATIO = 2
REUSE_SLACK = 4 * 1024 * 1024
#: The longest a driver write waits for the spiller to make room while it is still moving
#: objects (a slow disk); with nothing left to move, or a broken spill disk, it fails
#: at once.
ROOM_WAIT_S = 60.0
#: Once spilling, the spiller goes on until live bytes are this share of the budget, so
#: the next writes find room without waiting.
SPILL_TO = 0.9
#: Past this share of the budget in live objects, every process of the session runs
#: Python's cycle collector (Ray's threshold): objects that only reference cycles still
#: hold are freed before anything is spilled for them.
COLLECT_AT = 0.7
#: At most one such collection in this many seconds: a store that stays full of live
#: objects costs a collection per interval, not one per write.
COLLECT_EVERY_S = 10.0
#: A pooled segment unused this long is unlinked: an idle program gives memory back.
POOL_IDLE_S = 5.0
#: Share of the machine's memory the store may use by default (Ray's default).
DEFAULT_BUDGET_SHARE = 0.3
#: The smallest budget accepted: a few large objects.
MIN_BUDGET = 4 * 1024 * 1024


@dataclass(slots=True, eq=False)
class Segment:
    path: str
    capacity: int
    mapping: mmap.mmap | None = None  # the driver's writable mapping, faulted in
    object_id: int = 0  # the object it holds (0: a call's arguments, or not yet known)
    pooled_at: float = 0.0  # when it last went back to the pool


class SegmentStore:
    """Segments of the session's shared-memory directory (see the module docstring)."""

    def __init__(self, shm_dir: str, budget: int, spill_dir: str | None = None) -> None:
        self.shm_dir = shm_dir
        self.budget = budget
        self.pool_limit = budget // 4
        self.pool_idle_s = POOL_IDLE_S
        self.spill_dir = spill_dir
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # notified when bytes are freed
        self._names = itertools.count(1)
        self.free: list[Segment] = []  # recycled, most recently freed last
        self.live: dict[str, Segment] = {}  # value segments, least recently used first
        self.readers: dict[str, set[int]] = {}  # segment path -> workers that map it
        self.reserved: dict[str, int] = {}  # path -> worker writing it, not yet reported
        self.spilled: dict[str, int] = {}  # spill file path -> bytes
        self.live_bytes = 0
        self.pooled_bytes = 0
        self.spilled_bytes = 0
        self.spilled_total = 0  # objects ever spilled
        self.recycled_count = 0
        self.on_pressure: Callable[[], None] | None = None  # wakes the spiller
        self.on_high: Callable[[], None] | None = None  # asks for a collection of cycles
        self._collect_after = 0.0  # (monotonic) no collection is asked before then
        self.wanted = 0  # bytes a writer waits for
        self.spill_stuck: str | None = None  # why the spiller cannot free more, if so
        self.nothing_to_spill = False  # the spiller found every object in memory in use
        self.closed = False

    # ---------------------------------------------------------------- writing
    def write(self, data: bytes, raws: list[memoryview]) -> str:
        """Write a value into a recycled (or new) segment; return its path."""
        plan = serialization.layout(data, raws)
        segment = self._take(plan.total)
        if segment is None:
            self._make_room(plan.total)
            segment = self._create(data, raws)
            with self._lock:
                self._add_live_locked(segment)
            return segment.path
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
            self._add_live_locked(segment)
        return segment.path

    def _make_room(self, size: int, claim: Segment | None = None, worker_id: int = 0,
                   wait: bool = True) -> bool:
        """Return True once ``size`` new bytes fit in the budget; else ObjectStoreFullError.

        ``claim``: a worker's segment, counted (``_claim_locked``) in the same critical
        section that found room, so two writers never both take the last room. With
        ``wait`` False, return False instead of waiting for the spiller (woken meanwhile).
        """
        if size > self.budget:
            raise ObjectStoreFullError(
                f"an object of {size:,} bytes is larger than the whole object store "
                f"budget ({self.budget:,} bytes). Pass a larger object_store_memory to "
                "init(), or split the value into smaller objects.")
        deadline = time.monotonic() + ROOM_WAIT_S
        deferred = False
        with self._lock:
            self.nothing_to_spill = False  # the spiller looks again for this write
            try:
                while True:
                    over = self.live_bytes + self.pooled_bytes + size - self.budget
                    if over <= 0:
                        if claim is not None:
                            self._claim_locked(claim, worker_id)
                        return True
                    if self.pooled_bytes:
                        self._trim_locked(max(0, self.pooled_bytes - over))
                        continue
                    left = deadline - time.monotonic()
                    if (left <= 0 or self.spill_stuck is not None or self.closed
                            or self.nothing_to_spill or self.on_pressure is None):
                        raise self._full_error(size)
                    self.wanted = max(self.wanted, size)
                    self.on_pressure()  # cheap (an Event) when the spiller is awake
                    if not wait:
                        deferred = True  # ``wanted`` stays: the spiller works for it
                        return False
                    self._room.wait(min(left, 0.05))
            finally:
                if not deferred:
                    self.wanted = 0

    def _full_error(self, size: int) -> ObjectStoreFullError:
        why = self.spill_stuck or (
            "every object in memory is in use: read by a running task or a worker, or "
            "an array in the driver points into it" if self.nothing_to_spill
            else f"the spiller did not make room within {ROOM_WAIT_S:.0f} s")
        spill = ""
        if self.spill_dir is not None:
            spill = (f" The spill directory {self.spill_dir} holds {self.spilled_bytes:,} "
                     f"bytes and has {serialization._free_bytes(self.spill_dir):,} free.")
        return ObjectStoreFullError(
            f"the object store is full: an object of {size:,} bytes does not fit; "
            f"{self.live_bytes:,} of the {self.budget:,}-byte budget hold objects in use "
            f"({why}).{spill} Drop ObjectRefs you no longer need, pass a larger "
            "object_store_memory to init(), or give the spill directory more room.")

    def wait_for_room(self, nothing_to_spill: bool = False) -> None:
        """Wake writers waiting in ``_make_room``: something was freed or spilled, or
        (``nothing_to_spill``) the spiller found nothing it may move."""
        with self._lock:
            if nothing_to_spill and self.over_budget > 0:
                self.nothing_to_spill = True
            self._room.notify_all()

    @property
    def over_budget(self) -> int:
        """Bytes to spill: down to ``SPILL_TO`` of the budget, with room for a waiting write."""
        target = int(self.budget * SPILL_TO) - self.wanted
        return self.live_bytes + self.pooled_bytes - target

    def touch(self, path: str) -> None:
        """``path`` was just used: it is the last to spill."""
        with self._lock:
            segment = self.live.pop(path, None)
            if segment is not None:
                self.live[path] = segment

    def track(self, path: str, size: int, object_id: int) -> None:
        """A value segment now belongs to object ``object_id`` (a worker's: count it)."""
        wake = False
        with self._lock:
            self.reserved.pop(path, None)
            segment = self.live.get(path)
            if segment is None and path not in self.spilled:
                segment = Segment(path, size)
                self._add_live_locked(segment)
                wake = self.live_bytes + self.pooled_bytes + self.wanted > self.budget
            if segment is not None:
                segment.object_id = object_id
        if wake and self.on_pressure is not None:
            self.on_pressure()

    def _add_live_locked(self, segment: Segment) -> None:
        """Count ``segment`` as live; past ``COLLECT_AT`` of the budget, ask for a
        collection of garbage cycles (``on_high``), at most once per ``COLLECT_EVERY_S``."""
        self.live[segment.path] = segment
        self.live_bytes += segment.capacity
        if self.live_bytes >= self.budget * COLLECT_AT and self.on_high is not None:
            now = time.monotonic()
            if now >= self._collect_after:
                self._collect_after = now + COLLECT_EVERY_S
                self.on_high()

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

    def _create(self, data: bytes, raws: list[memoryview]) -> Segment:
        """A new segment holding the value (mapped writable only once it is recycled)."""
        path = f"{self.shm_dir}/s{next(self._names):x}"
        return Segment(path, serialization.write_segment(path, data, raws))

    # ---------------------------------------------------------------- workers' writes
    def reserve(self, size: int, path: str, worker_id: int,
                wait: bool = True) -> tuple[str, bool] | None:
        """Room for a worker to write a value of ``size`` bytes, counted before it writes.

        Returns ``(path, recycled)``: a pooled segment to write over in place (its pages
        are already there, so no allocation), or ``path`` itself for a new file. The
        segment counts as live from now on; ``track`` (the object is reported) or
        ``release`` ends the reservation, and ``forget_worker`` drops it if the worker
        dies first. Past the budget this spills or fails like a driver write; with
        ``wait`` False it returns None where it would wait for the spiller.
        """
        segment = self._take(size)
        if segment is not None:
            with self._lock:
                self._claim_locked(segment, worker_id)
            return segment.path, True
        if not self._make_room(size, Segment(path, size), worker_id, wait):
            return None  # ``wanted`` stays set for the spiller until ``reserve_new``
        return path, False

    def reserve_new(self, size: int, path: str, worker_id: int) -> tuple[str, bool]:
        """``reserve`` after it returned None: wait for the spiller to make room for a
        new file (not the pool again, so ``_make_room`` always resets ``wanted``)."""
        self._make_room(size, Segment(path, size), worker_id)
        return path, False

    def _claim_locked(self, segment: Segment, worker_id: int) -> None:
        stale = self.live.pop(segment.path, None)  # a retry writes its result's name again
        if stale is not None:
            self.live_bytes -= stale.capacity
        self._add_live_locked(segment)
        self.reserved[segment.path] = worker_id

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
        """A worker died: its mappings died with it, and what it was writing is garbage
        (a result it reported was tracked before its death is handled)."""
        dropped = []
        with self._lock:
            for path in [p for p, ids in self.readers.items() if worker_id in ids]:
                self.readers[path].discard(worker_id)
                if not self.readers[path]:
                    del self.readers[path]
            for path in [p for p, writer in self.reserved.items() if writer == worker_id]:
                del self.reserved[path]
                segment = self.live.pop(path, None)
                if segment is not None:
                    self.live_bytes -= segment.capacity
                    dropped.append(segment)
            if dropped:
                self._room.notify_all()
        for segment in dropped:
            self._discard(segment)

    # ---------------------------------------------------------------- freeing
    def release(self, path: str) -> None:
        """The value in segment ``path`` is freed: recycle the segment, or unlink it."""
        unviewed = serialization.MAPS.forget(path)
        with self._lock:
            self._room.notify_all()
            self.reserved.pop(path, None)
            size = self.spilled.pop(path, None)
            if size is not None:
                self.spilled_bytes -= size
                self.readers.pop(path, None)
                serialization._unlink_quietly(path)
                return
            segment = self.live.pop(path, None)
            if segment is not None:
                self.live_bytes -= segment.capacity
            read_elsewhere = self.readers.pop(path, None)
            if unviewed and not read_elsewhere and not self.closed:
                if segment is None or segment.mapping is None:  # not yet ours to write
                    segment = self._adopt(path)
                room = min(self.pool_limit, self.budget - self.live_bytes)
                if segment.capacity and self.pooled_bytes + segment.capacity <= room:
                    first = not self.free
                    segment.pooled_at = time.monotonic()
                    self.free.append(segment)
                    self.pooled_bytes += segment.capacity
                    if (segment.mapping is None or first) and self.on_pressure is not None:
                        # The spill thread maps it (prepare_pool) and times its trim.
                        self.on_pressure()
                    return
        if segment is None:
            segment = Segment(path, 0)
        self._discard(segment)

    def forget_lost(self, path: str) -> None:
        """Segment ``path``'s file vanished (removed behind our back): never recycle it.

        Its object is then freed or rebuilt (``lineage.py``) through ``release`` as
        usual, which finds nothing left to pool.
        """
        with self._lock:
            segment = self.live.pop(path, None)
            if segment is not None:
                self.live_bytes -= segment.capacity
            self.readers.pop(path, None)
        if segment is not None and segment.mapping is not None:
            segment.mapping.close()
            segment.mapping = None

    def prepare_pool(self) -> None:
        """Map pooled segments writable and fault them in, off the writers' path (run by
        the spill thread): a write into a prepared segment is one ``memcpy``."""
        tried: set[int] = set()
        while True:
            with self._lock:
                segment = next((s for s in self.free
                                if s.mapping is None and id(s) not in tried), None)
                if segment is None or self.closed:
                    return
            tried.add(id(segment))
            try:
                mapping = _map_writable(segment.path)  # it stays in the pool meanwhile
            except (OSError, ValueError):
                continue  # taken or trimmed meanwhile: nothing to prepare
            with self._lock:
                if segment.mapping is None and any(s is segment for s in self.free):
                    segment.mapping = mapping
                    continue
            mapping.close()  # a writer took it (and mapped it) or it was trimmed

    def _adopt(self, path: str) -> Segment:
        """Take a freed segment for reuse under a new name of the driver's: a worker's
        task re-run (a retry, a lineage rebuild) writes its old name again."""
        new_path = f"{self.shm_dir}/s{next(self._names):x}"
        try:
            os.rename(path, new_path)
        except OSError:
            return Segment(path, 0)  # gone or unmovable: not pooled (capacity 0)
        return Segment(new_path, _file_size(new_path))

    def _discard(self, segment: Segment) -> None:
        if segment.mapping is not None:
            segment.mapping.close()
            segment.mapping = None
        serialization._unlink_quietly(segment.path)

    def trim_idle(self) -> float | None:
        """Unlink pooled segments unused for ``pool_idle_s``; return the seconds until
        the next one is due (None: the pool is empty)."""
        now = time.monotonic()
        with self._lock:
            while self.free and self.free[0].pooled_at + self.pool_idle_s <= now:
                segment = self.free.pop(0)  # the least recently freed is first
                self.pooled_bytes -= segment.capacity
                self._discard(segment)
            if not self.free:
                return None
            return max(0.01, self.free[0].pooled_at + self.pool_idle_s - now)

    def trim(self, keep: int = 0) -> None:
        """Unlink recycled segments until at most ``keep`` bytes stay pooled."""
        with self._lock:
            self._trim_locked(keep)

    def _trim_locked(self, keep: int) -> None:
        while self.free and self.pooled_bytes > keep:
            segment = self.free.pop(0)
            self.pooled_bytes -= segment.capacity
            self._discard(segment)  # unlink only: cheap enough to do holding the lock

    # ---------------------------------------------------------------- spilling
    def spill_path(self, path: str) -> str:
        assert self.spill_dir is not None
        return os.path.join(self.spill_dir, os.path.basename(path))

    def moved_to_disk(self, path: str, spill_path: str, size: int) -> None:
        """Segment ``path`` now lives in ``spill_path``: free its memory."""
        serialization.MAPS.forget(path)
        with self._lock:
            segment = self.live.pop(path, None)
            if segment is not None:
                self.live_bytes -= segment.capacity
            self.readers.pop(path, None)
            self.spilled[spill_path] = size
            self.spilled_bytes += size
            self.spilled_total += 1
            self._room.notify_all()
        # Never recycled: a reader may have been sent the old path just now (it finds the
        # spill file once this name is gone, but a reused segment would show new data).
        self._discard(segment or Segment(path, 0))

    def close(self) -> None:
        """Unmap and unlink everything this store wrote (the session is ending)."""
        with self._lock:
            self.closed = True
            segments = self.free + list(self.live.values())
            self.free, self.live, self.pooled_bytes, self.live_bytes = [], {}, 0, 0
            self.reserved.clear()
            spilled, self.spilled = list(self.spilled), {}
            self.readers.clear()
            self._room.notify_all()
        for segment in segments:
            self._discard(segment)
        for path in spilled:
            serialization._unlink_quietly(path)

    def summary(self) -> dict[str, object]:
        with self._lock:
            return {
                "budget_bytes": self.budget,
                "used_bytes": self.live_bytes,
                "pooled_bytes": self.pooled_bytes,
                "spilled_bytes": self.spilled_bytes,
                "spilled_objects": len(self.spilled),
                "spilled_total": self.spilled_total,
                "spill_dir": self.spill_dir,
                "spill_error": self.spill_stuck,
            }


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


def default_budget(shm_dir: str) -> int:
    """30% of the machine's memory, capped by what ``shm_dir``'s file system has free."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        total = 8 << 30
    budget = int(total * DEFAULT_BUDGET_SHARE)
    free = serialization._free_bytes(shm_dir)
    return max(MIN_BUDGET, min(budget, free) if free else budget)


def check_budget(value: object, shm_dir: str) -> int:
    """Validate ``init(object_store_memory=)``; return the budget in bytes."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(
            f"object_store_memory must be a number of bytes (an int), got {value!r}")
    if value < MIN_BUDGET:
        raise ValueError(
            f"object_store_memory={value!r} is too small: the store needs at least "
            f"{MIN_BUDGET:,} bytes (4 MiB); pass a larger number of bytes, or leave it out "
            "for the default (30% of memory)")
    free = serialization._free_bytes(shm_dir)
    if free and value > free:
        raise ValueError(
            f"object_store_memory={value:,} bytes is more than the {free:,} bytes free in "
            f"{os.path.dirname(shm_dir) or shm_dir}, where objects live; pass at most "
            f"{free:,}, or leave it out for the default")
    return int(value)
