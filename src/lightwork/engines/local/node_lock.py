"""The node's one lock, which also takes in the submissions queued while it was free.

Every piece of the driver's runtime state is guarded by one reentrant lock (``node.py``).
A submission takes it to register the task (its result entries, the task table, the
scheduler's queue) and, when a worker is idle, to send the task at once. While every
worker is busy there is nothing to send, and the lock is then mostly a hand-over: the I/O
thread holds it to apply results, the submitting thread waits for it, each wait a futex
and a GIL hand-over on both sides. So a submission that could not run yet anyway does
not take the lock (``DriverCalls.submit``): it appends the task to ``queued`` (one
atomic ``deque.append``), and whoever takes the lock next registers the queued tasks,
in order, before anything else (``__enter__``). Every reader of the runtime's state
holds the lock, so none of them ever sees the tables without a task already submitted.
A submission that finds a worker idle takes the lock as before, registers its task and
sends it at once (after the queued ones: ``__enter__`` registered them first).

Why a queued task cannot be forgotten while a worker idles: the submitter appends, then
looks for an idle worker again, and takes the lock if it finds one. The I/O thread marks a
worker idle when it applies a result and then dispatches (``Node._dispatch``), which
registers the queue again, under the lock. Python's GIL orders the four steps: if the
submitter looked before the worker was marked idle, the dispatch that follows the mark
comes after the append and registers the task; if it looked after, it found the worker
and took the lock itself. (Were that argument wrong, the task would wait for the next
taker of the lock: the I/O thread's next poll, at most ``IO_IDLE_SLEEP_S`` away, or
any API call; never for ever.)

Only tasks with no dependencies and no refs inside their arguments are queued: their
registration cannot fail (no ended-session refs to refuse, no entry to pin that a
release drained meanwhile could free).

The one reader that can meet an id whose task is still queued is the drain of released
refs (``Node._drain_refs``): another thread may submit a task and drop its ref while
this one holds the lock, after its ``__enter__``. A release with no entry therefore
registers the queue and looks again: the task was appended before its ref existed, so
it is there (without that, the entry registered later would be held for ever). Every
other reader gets its ids from refs it holds, made after their tasks were appended and
so before its own ``__enter__``.

A synchronous call finds its worker idle and takes the lock at once: queueing it too
would add a registration step to the path that has nothing to wait behind.

Measured: see bench/HOTPATH.md, "The node lock".
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any


class NodeLock:
    """A reentrant lock whose taker first registers ``queued`` with ``register``."""

    __slots__ = ("_lock", "queued", "register")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.queued: collections.deque[Any] = collections.deque()
        # Registers every queued task, oldest first (called with the lock held); set by
        # the node once its tables exist.
        self.register: Callable[[], None] = _nothing

    def __enter__(self) -> bool:
        self._lock.acquire()
        if self.queued:
            try:
                self.register()
            except BaseException:
                self._lock.release()
                raise
        return True

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


def _nothing() -> None:
    pass
