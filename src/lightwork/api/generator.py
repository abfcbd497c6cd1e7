"""Generator tasks: ``ObjectRefGenerator`` (streaming) and ``num_returns="dynamic"``.

Streaming, Ray's default for generator functions and methods since 2.8: ``f.remote()``
returns an :class:`ObjectRefGenerator` at once. Iterating it (``for``, ``next``,
``async for``) gives one ObjectRef per yielded item, as soon as the task yields it —
the task keeps running meanwhile. An exception raised mid-stream is delivered at its
place: the ref after the last good item raises it on ``get``, and the iteration ends
after it. ``completed()`` is a ref that resolves when the task ends; as in Ray it raises
only when the task failed outside the generator (its worker crashed, it was cancelled),
and then the stream's next ref raises the same. Dropping the
generator early releases the items not read (the task runs to its end, as in Ray).
``wait`` accepts generators, as Ray's does: one is ready when ``next`` would not block
(``_peek``). A retried generator task re-runs from the top and the consumer sees each
item once (the re-run's first yields are skipped; see ``streams.py``). The
driver-side state is ``lightwork.engines.local.streams``; the worker sends items in
``Worker.stream_items``.

``num_returns="dynamic"`` (Ray's older form) lives in the kernel
(:mod:`lightwork.kernel.generators`), since every engine's workers run it.
"""

from __future__ import annotations

from typing import Any

from lightwork.kernel.generators import DynamicObjectRefGenerator
from lightwork.kernel.object_ref import ObjectRef

__all__ = ["DynamicObjectRefGenerator", "ObjectRefGenerator"]

class ObjectRefGenerator:
    """The refs a streaming generator task yields, in order, as it yields them."""

    def __init__(self, head: ObjectRef) -> None:
        self._head = head
        self._index = 0
        self._finished = False

    def __iter__(self) -> ObjectRefGenerator:
        return self

    def __next__(self) -> ObjectRef:
        ref = self._next(None)
        assert ref is not None
        return ref

    def _next(self, timeout: float | None) -> ObjectRef | None:
        """The next item's ref, waiting up to ``timeout`` s (None: until it comes);
        None when the timeout passed first; StopIteration at the end."""
        from lightwork.api import core as _api

        if self._finished:
            raise StopIteration
        core = _api._core((self._head,))
        while True:
            kind, object_id = core.stream_item(self._head.id, self._index)
            if kind == "item":
                self._index += 1
                return ObjectRef(object_id, _borrowed=True)
            if kind == "error":  # the head raises the task's error
                self._index += 1
                return self._head
            if kind == "end":
                self._finished = True
                raise StopIteration
            placeholder = ObjectRef(object_id, _borrowed=True)
            ready = core.wait([placeholder.id], 1, timeout)
            if not ready:
                return None

    def _peek(self) -> ObjectRef:
        """A ref that is ready exactly when ``next(self)`` would not block: the next
        item's (or the placeholder that becomes it), or the head's once the stream ended
        or failed. ``wait`` waits on it; the generator does not advance."""
        from lightwork.api import core as _api

        if self._finished:
            return self._head
        core = _api._core((self._head,))
        kind, object_id = core.stream_item(self._head.id, self._index)
        if kind in ("item", "wait"):
            return ObjectRef(object_id, _borrowed=True)
        return self._head  # "error" or "end": the task ended, so its head is ready

    def __aiter__(self) -> ObjectRefGenerator:
        return self

    async def __anext__(self) -> ObjectRef:
        def step() -> ObjectRef | None:
            try:
                return self._next(None)
            except StopIteration:
                return None  # a StopIteration cannot cross a future

        import asyncio  # here: a worker's start-up should not pay for asyncio

        ref = await asyncio.get_running_loop().run_in_executor(None, step)
        if ref is None:
            raise StopAsyncIteration
        return ref

    def completed(self) -> ObjectRef:
        """A ref that resolves when the task has ended (raising only if the task failed
        outside the generator's own code: a crash, a cancel)."""
        return self._head

    def is_finished(self) -> bool:
        """Whether iteration has reached the end of the stream."""
        return self._finished

    def __reduce__(self) -> tuple[Any, ...]:
        return (ObjectRefGenerator, (self._head,))

    def __repr__(self) -> str:
        return f"ObjectRefGenerator({self._head.hex()}, next item {self._index})"


