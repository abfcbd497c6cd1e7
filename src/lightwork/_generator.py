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
driver-side state is ``lightwork._runtime.streams``; the worker sends items in
``Worker.stream_items``.

``num_returns="dynamic"`` (Ray's older form): ``f.remote()`` returns one ref; its value is
a :class:`DynamicObjectRefGenerator` of refs to every item, ready when the task ends.
The function runs inside :class:`DynamicReturns`, which stores each item as it comes;
an exception mid-way becomes the last item (its ref raises it), as in Ray.
An actor method called with ``num_returns="dynamic"`` (``@lightwork.method`` or
``.options()``) names its method ``DYNAMIC_METHOD + name``; the actor's worker finds no
such attribute and runs the method inside :class:`DynamicReturns` (so a plain call pays
nothing for it). Async generator methods are drained on the actor's event loop.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from lightwork._object_ref import ObjectRef

__all__ = ["DynamicObjectRefGenerator", "ObjectRefGenerator"]

# The method name of a num_returns="dynamic" actor call is this prefix + the method's name
# (a Python name cannot contain ":", so it never shadows an attribute).
DYNAMIC_METHOD = "dynamic:"


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
        from lightwork import _api

        if self._finished:
            raise StopIteration
        core = _api._core((self._head,))
        while True:
            kind, object_id = core.driver_request("stream", "item", self._head.id, self._index)
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
        from lightwork import _api

        if self._finished:
            return self._head
        core = _api._core((self._head,))
        kind, object_id = core.driver_request("stream", "item", self._head.id, self._index)
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


class DynamicObjectRefGenerator:
    """What a ``num_returns="dynamic"`` task's ref resolves to: refs to every item."""

    def __init__(self, refs: list[ObjectRef]) -> None:
        self._refs = list(refs)

    def __iter__(self) -> Iterator[ObjectRef]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)

    def __repr__(self) -> str:
        return f"DynamicObjectRefGenerator({len(self._refs)} refs)"


class DynamicReturns:
    """Runs a generator function in a ``num_returns="dynamic"`` task: each item is
    stored as it is yielded, and the task returns the refs."""

    def __init__(self, function: Any) -> None:
        self.function = function

    def __call__(self, *args: Any, **kwargs: Any) -> DynamicObjectRefGenerator:
        return collect(self.function(*args, **kwargs))


def collect(result: Any) -> DynamicObjectRefGenerator:
    """Store each item of what a dynamic generator function returned (an async
    generator's on a loop, see ``_drain_async``), an error mid-way as the last item."""
    import lightwork

    if inspect.isasyncgen(result):
        return DynamicObjectRefGenerator(_drain_async(result))
    try:
        items = iter(result)
    except TypeError:
        raise TypeError(
            f"a num_returns='dynamic' task must return a generator (or an iterable), "
            f"got {type(result).__name__}; yield the items, or drop num_returns") from None
    refs = []
    try:
        for item in items:
            refs.append(lightwork.put(item))
    except Exception as exc:  # noqa: BLE001 - the error is the last item, as in Ray
        refs.append(_error_item(exc))
    return DynamicObjectRefGenerator(refs)


async def collect_async(result: Any) -> DynamicObjectRefGenerator:
    """``collect`` from a coroutine already running on the actor's loop (the cluster
    backend's async actors): an async generator is drained here, on that loop."""
    if inspect.isasyncgen(result):
        return DynamicObjectRefGenerator(await _store_async_items(result))
    return collect(result)


async def _store_async_items(items: Any) -> list[ObjectRef]:
    import lightwork

    refs = []
    try:
        async for item in items:
            refs.append(lightwork.put(item))
    except Exception as exc:  # noqa: BLE001 - the error is the last item, as in Ray
        refs.append(_error_item(exc))
    return refs


def _drain_async(items: Any) -> list[ObjectRef]:
    """Store each item of an async generator: on the actor's event loop when there is
    one (its other coroutines keep running), else on a loop of its own."""
    import asyncio

    from lightwork import _api

    loop = getattr(_api._worker, "loop", None)
    drain = _store_async_items(items)
    return loop.run(drain) if loop is not None else asyncio.run(drain)


def _error_item(exc: Exception) -> ObjectRef:
    """A ref whose ``get`` raises ``exc``: where a dynamic generator stopped with it."""
    from lightwork import _api

    if _api._worker is not None:  # in a worker of the embedded runtime
        return _api._worker.put_error(exc)
    put_error = getattr(_api._backend, "put_error", None)  # a cluster backend's worker
    if put_error is None:  # not in a worker: fail the call
        raise exc
    return put_error(exc)
