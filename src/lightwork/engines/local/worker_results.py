"""What a call's return becomes in the worker: the values its DONE carries, or a
generator's items (a mixin of :class:`worker.Worker`).

A call's result leaves as its values travel (``serialization.bare``): the common tiny
result, one scalar, as its pickle's bytes alone (no ``Stored``, no list: ``protocol.py``),
else a list, one value per return. A large value is written to shared memory first,
once the driver's store granted it room (``worker_calls.SharedMemoryWriter``), and only
its segment's name travels.

A generator function's items (``Worker._execute`` tells one by what it returned) either
stream or fill fixed returns. With one return not fixed by the caller, each item goes to
the driver as it is yielded, a ``stream`` request whose reply says how many items the
stream holds (a retry re-sends none of those) or that nobody consumes it any more
(``streams.py``); the task's own result is None. An exception the generator raises, or
an item past ``generators.max_stream_items``, becomes the stream's last item, unless the
driver answers that the task is retried for it. With ``num_returns=k`` the items fill
the returns one by one, each written as it comes (``generators.take_static``).

It all runs on the thread that ran the call: the main thread, or a threaded actor's pool
thread; an async generator is drained on the actor's event loop (a loop of its own in
a task), each item sent from a thread so that the loop keeps serving.
"""

from __future__ import annotations

import pickle
import types
from typing import TYPE_CHECKING, Any

from lightwork.kernel.generators import (
    StaticItems,
    max_stream_items,
    take_static,
    too_many_items_error,
)
from lightwork.engines.local import protocol as p
from lightwork.kernel import serialization
from lightwork.kernel.serialization import SerializationError, bare
from lightwork.engines.local.call_outcomes import error_outcome
from lightwork.engines.local.worker_calls import SharedMemoryWriter
from lightwork.engines.local.worker_exit import ActorExit

if TYPE_CHECKING:
    from lightwork.engines.local.worker_state import WorkerState

    _Base = WorkerState
else:
    _Base = object


class WorkerResults(_Base):
    """The worker's storing of what its calls returned."""

    def store_results(self, name: str, result: Any, return_ids: tuple[int, ...]) -> Any:
        """The outcome of a call that returned ``result``: its values as they travel
        (``serialization.bare``), in a list, or the one scalar's pickle alone."""
        if len(return_ids) == 1:
            if type(result) in serialization.SCALARS:  # the common tiny result: no Stored
                return pickle.dumps(result, protocol=5)  # (and no list: protocol.py)
            return [bare(serialization.serialize(result, SharedMemoryWriter(self, return_ids[0])))]
        if not return_ids:
            return []
        try:
            values = list(result)
        except TypeError:
            values = None
        if values is None or len(values) != len(return_ids):
            got = "a non-iterable" if values is None else f"{len(values)} values"
            raise ValueError(
                f"task {name} was declared with num_returns={len(return_ids)} but "
                f"returned {got}; return a tuple of exactly {len(return_ids)} items or "
                "change num_returns"
            )
        return [
            bare(serialization.serialize(value, SharedMemoryWriter(self, object_id)))
            for value, object_id in zip(values, return_ids)
        ]

    def store_yields(self, name: str, items: Any, return_ids: tuple[int, ...]) -> Any:
        """The outcome of a call whose function returned a generator: streamed when the
        caller asked for one ref and did not fix it (``stream_items``), else its items
        fill the ``num_returns=k`` returns one by one as they are yielded, each written
        as it comes (``generators.take_static``: what more or fewer items do)."""
        if type(items) is not StaticItems and len(return_ids) == 1:
            self.stream_items(name, return_ids[0], items)
            return self.store_results(name, None, return_ids)  # the task's own result

        def store(item: Any, index: int) -> Any:
            return bare(serialization.serialize(item, SharedMemoryWriter(self, return_ids[index])))

        return take_static(items, len(return_ids), name, store)

    def stream_items(self, name: str, head: int, items: Any) -> None:
        """Send each item of a generator task to the driver as it is yielded (see
        ``streams.py``); the task's own result is None. An exception the generator raises
        becomes the stream's last item, as in Ray (the task itself succeeds), unless the
        driver answers that the task is retried for it: then it fails the task. Once the
        consumer is gone the generator still runs to its end, but its items are not sent.
        A re-run (a retry) neither serializes nor sends the yields the driver's reply
        says the stream already has."""
        # [yields so far in this run, items the stream holds; None: nobody consumes it]
        progress: list[Any] = [0, 0]
        limit = max_stream_items()

        def send(item: Any) -> None:
            index, have = progress
            if index >= limit:  # the generator's error, so the stream's last item
                raise too_many_items_error(name, limit)
            progress[0] = index + 1
            if have is not None and index >= have:
                object_id = self.next_object_id()
                stored = serialization.serialize(item, SharedMemoryWriter(self, object_id))
                progress[1] = self.driver_request("stream", "yield", head, index, object_id, stored)

        try:
            if type(items) is types.AsyncGeneratorType:
                import asyncio

                async def drain() -> None:
                    async for item in items:
                        await asyncio.to_thread(send, item)  # the actor's loop keeps serving

                if self.loop is not None:
                    self.loop.run(drain())
                else:
                    asyncio.run(drain())
            else:
                for item in items:
                    send(item)
        except (ActorExit, SerializationError):
            raise
        except Exception as exc:  # noqa: BLE001 - the user's error is the stream's last item
            index, have = progress
            if have is not None and index >= have:
                reply = self.driver_request("stream", "yield", head, index,
                                            self.next_object_id(), None, error_outcome(name, exc))
                if reply == p.STREAM_RETRY:  # retry_exceptions takes it: the task fails
                    raise
        return None
