"""``Queue``: a first-in first-out queue shared by the driver, tasks and actors (Ray's).

As in Ray, the items live in an actor (an async actor holding an ``asyncio.Queue``); a
:class:`Queue` object is a thin client holding that actor's handle, so it pickles and
can be passed to tasks and actors, which then put and get on the same queue. Blocking
calls wait inside the actor (``asyncio.wait_for``), so many waiting getters cost one
coroutine each, not a thread. Items travel as task arguments and results, so a
top-level ``ObjectRef`` put on the queue comes out as its value, as in Ray.

``Empty`` and ``Full`` derive from the standard library's ``queue.Empty`` and
``queue.Full``, so code written for ``queue.Queue`` catches them unchanged.
"""

from __future__ import annotations

import asyncio
import queue as _stdlib_queue
from collections.abc import Iterable
from typing import Any

from lightwork import api
from lightwork.kernel.exceptions import TaskError

__all__ = ["Empty", "Full", "Queue"]


class Empty(_stdlib_queue.Empty):
    """``get`` found nothing in time (or ``get_nowait`` found nothing at all)."""


class Full(_stdlib_queue.Full):
    """``put`` found no room in time (or ``put_nowait`` found no room at all)."""


class Queue:
    """A queue of at most ``maxsize`` items (``0``: unbounded), held by an actor.

    ``actor_options`` are passed to the actor's ``.options()`` (for example a ``name``
    to find it with ``lightwork.get_actor``, or ``num_cpus``).
    """

    def __init__(self, maxsize: int = 0, actor_options: dict[str, Any] | None = None) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int):
            raise TypeError(f"maxsize must be an int (0: unbounded), got {maxsize!r:.80}")
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0 (0: unbounded), got {maxsize}")
        if actor_options is not None and not isinstance(actor_options, dict):
            raise TypeError(f"actor_options must be a dict of actor options, got {actor_options!r}")
        self.maxsize = maxsize
        self.actor: Any = _queue_actor_class().options(**(actor_options or {})).remote(maxsize)

    def __len__(self) -> int:
        return self.size()

    def size(self) -> int:
        """The number of items in the queue now."""
        return api.get(self._actor().qsize.remote())

    qsize = size

    def empty(self) -> bool:
        return api.get(self._actor().empty.remote())

    def full(self) -> bool:
        return api.get(self._actor().full.remote())

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Add ``item``; if the queue is full, wait up to ``timeout`` s (None: forever)
        for room, or with ``block=False`` raise :class:`Full` at once."""
        if not block:
            return self.put_nowait(item)
        _check_timeout(timeout)
        _raise_plain(lambda: api.get(self._actor().put.remote(item, timeout)))

    async def put_async(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """:meth:`put` for asyncio code: awaits instead of blocking the thread."""
        if not block:
            return await _await_plain(self._actor().put_nowait.remote(item))
        _check_timeout(timeout)
        await _await_plain(self._actor().put.remote(item, timeout))

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Remove and return the oldest item; if there is none, wait up to ``timeout`` s
        (None: forever), or with ``block=False`` raise :class:`Empty` at once."""
        if not block:
            return self.get_nowait()
        _check_timeout(timeout)
        return _raise_plain(lambda: api.get(self._actor().get.remote(timeout)))

    async def get_async(self, block: bool = True, timeout: float | None = None) -> Any:
        """:meth:`get` for asyncio code: awaits instead of blocking the thread."""
        if not block:
            return await _await_plain(self._actor().get_nowait.remote())
        _check_timeout(timeout)
        return await _await_plain(self._actor().get.remote(timeout))

    def put_nowait(self, item: Any) -> None:
        _raise_plain(lambda: api.get(self._actor().put_nowait.remote(item)))

    def put_nowait_batch(self, items: Iterable[Any]) -> None:
        """Add all ``items`` at once, or none of them (:class:`Full`) if they do not fit."""
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            raise TypeError(f"put_nowait_batch() needs a list of items, got {items!r:.80}")
        _raise_plain(lambda: api.get(self._actor().put_nowait_batch.remote(list(items))))

    def get_nowait(self) -> Any:
        return _raise_plain(lambda: api.get(self._actor().get_nowait.remote()))

    def get_nowait_batch(self, num_items: int) -> list[Any]:
        """Remove and return the ``num_items`` oldest items, or none (:class:`Empty`) if
        fewer are there."""
        if isinstance(num_items, bool) or not isinstance(num_items, int):
            raise TypeError(f"num_items must be an int (how many items to take), "
                            f"got {num_items!r:.80}")
        if num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {num_items}")
        return _raise_plain(lambda: api.get(self._actor().get_nowait_batch.remote(num_items)))

    def shutdown(self, force: bool = False, grace_period_s: int = 5) -> None:
        """End the queue's actor (its items are lost). ``force=True`` kills it now;
        otherwise it ends after the calls already sent, or is killed after
        ``grace_period_s`` seconds. Using the queue afterwards raises RuntimeError."""
        actor, self.actor = self.actor, None
        if actor is None:
            return
        if force:
            api.kill(actor, no_restart=True)
            return
        done = actor.__ray_terminate__.remote()
        ready, _ = api.wait([done], timeout=grace_period_s)
        if not ready:
            api.kill(actor, no_restart=True)

    def _actor(self) -> Any:
        if self.actor is None:
            raise RuntimeError(
                "this Queue was shut down (Queue.shutdown()): its items are gone; make a "
                "new Queue")
        return self.actor

    def __repr__(self) -> str:
        state = "shut down" if self.actor is None else repr(self.actor)
        return f"Queue(maxsize={self.maxsize}, {state})"


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be None or a number of seconds, got {timeout!r}")
    if timeout < 0:
        raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout}")


def _raise_plain(call: Any) -> Any:
    """Run ``call``; an Empty/Full raised in the actor comes out as the plain exception."""
    try:
        return call()
    except TaskError as error:
        _reraise_queue_error(error)
        raise


async def _await_plain(ref: Any) -> Any:
    try:
        return await ref
    except TaskError as error:
        _reraise_queue_error(error)
        raise


def _reraise_queue_error(error: TaskError) -> None:
    for kind in (Empty, Full):
        if isinstance(error, kind):
            raise kind(*getattr(error.cause, "args", ())) from None


class _QueueActor:
    """The items, in an async actor. Every method is a coroutine, even those that never
    wait, so all of them run on the actor's one event loop thread: ``asyncio.Queue`` is
    not thread-safe, and a waiting ``get`` must see a ``put_nowait`` at once."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)

    async def qsize(self) -> int:
        return self.queue.qsize()

    async def empty(self) -> bool:
        return self.queue.empty()

    async def full(self) -> bool:
        return self.queue.full()

    async def put(self, item: Any, timeout: float | None = None) -> None:
        try:
            await asyncio.wait_for(self.queue.put(item), timeout)
        except asyncio.TimeoutError:
            raise Full(f"the queue stayed full (maxsize {self.maxsize}) for {timeout} s") from None

    async def get(self, timeout: float | None = None) -> Any:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            raise Empty(f"the queue stayed empty for {timeout} s") from None

    async def put_nowait(self, item: Any) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            raise Full(f"the queue is full (maxsize {self.maxsize})") from None

    async def put_nowait_batch(self, items: list[Any]) -> None:
        if self.maxsize > 0 and len(items) + self.queue.qsize() > self.maxsize:
            raise Full(f"cannot add {len(items)} items to a queue holding "
                       f"{self.queue.qsize()} with maxsize {self.maxsize}")
        for item in items:
            self.queue.put_nowait(item)

    async def get_nowait(self) -> Any:
        try:
            return self.queue.get_nowait()
        except asyncio.QueueEmpty:
            raise Empty("the queue is empty") from None

    async def get_nowait_batch(self, num_items: int) -> list[Any]:
        if num_items > self.queue.qsize():
            raise Empty(f"cannot get {num_items} items from a queue holding {self.queue.qsize()}")
        return [self.queue.get_nowait() for _ in range(num_items)]


_actor_class: Any = None


def _queue_actor_class() -> Any:
    global _actor_class
    if _actor_class is None:
        _actor_class = api.remote(_QueueActor)
    return _actor_class
