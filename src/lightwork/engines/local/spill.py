"""Spilling: moving the least recently used objects from shared memory to disk.

One daemon thread ("lightwork-spill") per session relieves the store, so a slow disk or a
long collection never stalls a submission or the node's I/O loop. It sleeps until the
store wakes it, or until the oldest pooled segment has been idle for
``store.POOL_IDLE_S`` (``SegmentStore.trim_idle`` unlinks it). Woken to collect garbage
cycles (``SegmentStore.on_high``), it has the node ask every worker, then collects the
driver's on this thread, holding no lock, so finalizers that release refs may take the
node's. Woken to spill (``SegmentStore.on_pressure``), it first maps and faults in
segments that went back to the store's pool unmapped (``SegmentStore.prepare_pool``),
then, while the store is over its budget, spills one object at a time:

1. under the node lock, picks the least recently used object that nothing is reading
   (no pending task uses it, no worker maps it, no array in the driver points into it);
2. without any lock, copies its segment into ``<spill dir>/<segment name>`` (written
   under a temporary name, then renamed, so the file is complete whenever it exists);
3. under the node lock, if the object is still alive and still unread, points its entry
   at the spill file and frees the segment (``SegmentStore.moved_to_disk``); otherwise
   removes the copy.

Reading a spilled object maps the spill file read-only: ``get``, ``wait`` and task
arguments need no restore step, the page cache serves the bytes, and the kernel may drop
them again under memory pressure. A reader that was sent the old shared-memory path
finds the spill file under the same name (``MappedSegments``).

Failures: a full disk (ENOSPC) or a directory that refuses writes (read-only, no
permission) stops spilling for good (``spill_stuck`` says why, once, on the
``lightwork`` logger); the data stays in memory and writers that need room get
``ObjectStoreFullError`` naming the sizes.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from typing import TYPE_CHECKING

from lightwork.kernel import serialization
from lightwork.engines.local.objects import READY, ObjectEntry
from lightwork.kernel.serialization import Stored

if TYPE_CHECKING:
    from lightwork.engines.local.node import Node

log = logging.getLogger("lightwork")

_COPY_CHUNK = 8 << 20


class Spiller:
    """The spill thread of one session (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.store = node.store
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.closed = False
        self.spill_seconds = 0.0  # time spent copying, for throughput figures
        self._collect = False  # a collection of garbage cycles is asked for
        self.store.on_pressure = self.wake
        self.store.on_high = self.collect_soon

    def collect_soon(self) -> None:
        """Ask for a collection of garbage cycles in every process (cheap: the store
        calls it under its lock)."""
        self._collect = True
        self.wake()

    def wake(self) -> None:
        if self._thread is None:
            with self._start_lock:  # started on first need: most sessions never spill
                if self._thread is None and not self.closed:
                    self._thread = threading.Thread(
                        target=self._run, name="lightwork-spill", daemon=True)
                    self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        self.closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self.closed:
            self._wake.wait(self.store.trim_idle())
            self._wake.clear()
            if self._collect:
                self._collect = False
                self.node.collect_garbage()
            self.store.prepare_pool()
            stuck = False
            while not self.closed and self.store.over_budget > 0 and self.store.spill_stuck is None:
                if not self._spill_one():
                    stuck = True
                    break
            self.store.wait_for_room(nothing_to_spill=stuck)

    def _spill_one(self) -> bool:
        """Move one object to disk; False when none can be moved now."""
        node, store = self.node, self.store
        with node.lock:
            victim = self._pick()
        if victim is None:
            return False
        entry, stored = victim
        assert stored.path is not None
        target = store.spill_path(stored.path)
        import time

        started = time.perf_counter()
        try:
            _copy_file(stored.path, target)
        except _SourceGone:
            return True  # freed meanwhile: look again
        except OSError as exc:
            self._stuck(exc)
            return False
        self.spill_seconds += time.perf_counter() - started
        with node.lock:
            if (node.objects.entries.get(entry.object_id) is entry and entry.stored is stored
                    and _unread(entry, store)):
                entry.stored = Stored(b"", (), target, stored.size, stored.contained)
                store.moved_to_disk(stored.path, target, stored.size)
                return True
        serialization._unlink_quietly(target)
        return True

    def _pick(self) -> tuple[ObjectEntry, Stored] | None:
        """The least recently used object nothing reads (node lock held)."""
        entries = self.node.objects.entries
        for segment in list(self.store.live.values()):
            entry = entries.get(segment.object_id) if segment.object_id else None
            if entry is None or entry.state != READY or entry.stored is None:
                continue
            if entry.stored.path != segment.path or not _unread(entry, self.store):
                continue
            if not serialization.MAPS.close_if_unviewed(segment.path):
                continue
            return entry, entry.stored
        return None

    def _stuck(self, exc: OSError) -> None:
        store = self.store
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            why = (f"the spill directory {store.spill_dir} is full "
                   f"({serialization._free_bytes(store.spill_dir or '.'):,} bytes free)")
        else:
            why = f"cannot write to the spill directory {store.spill_dir}: {exc}"
        store.spill_stuck = why
        log.error("lightwork: spilling objects to disk stopped: %s; objects stay in memory "
                  "and writes past the budget fail with ObjectStoreFullError", why)


def _unread(entry: ObjectEntry, store: object) -> bool:
    path = entry.path
    return bool(path is not None and not entry.task_uses
                and not store.readers.get(path))  # type: ignore[attr-defined]


class _SourceGone(Exception):
    """The segment was freed (and unlinked) before it could be copied."""


def _copy_file(source: str, target: str) -> None:
    """Copy ``source`` to ``target`` through a temporary name: complete or absent."""
    partial = target + ".partial"
    try:
        length = serialization.segment_length(source)
        src = os.open(source, os.O_RDONLY)
    except FileNotFoundError:
        raise _SourceGone() from None
    try:
        dst = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            offset = 0
            while offset < length:
                sent = os.sendfile(dst, src, offset, min(_COPY_CHUNK, length - offset))
                if sent == 0:
                    raise OSError(errno.EIO, f"short read copying {source}")
                offset += sent
        finally:
            os.close(dst)
        os.rename(partial, target)
    except BaseException:
        serialization._unlink_quietly(partial)
        raise
    finally:
        os.close(src)
