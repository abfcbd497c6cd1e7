"""What a generator task needs in every engine's worker: ``num_returns="dynamic"``.

A ``num_returns="dynamic"`` task's ref resolves to a :class:`DynamicObjectRefGenerator`
of refs to every item, ready when the task ends. The function runs inside
:class:`DynamicReturns`, which stores each item as it comes; an exception mid-way becomes
the last item (its ref raises it), as in Ray. An actor method called with
``num_returns="dynamic"`` names its method ``DYNAMIC_METHOD + name``; the actor's worker
finds no such attribute and runs the method inside :class:`DynamicReturns` (so a plain
call pays nothing for it). Async generator methods are drained on the actor's event
loop. Items are stored through the process's backend
(:func:`lightwork.kernel.backend.current`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from lightwork.kernel import backend as _backend
from lightwork.kernel.object_ref import ObjectRef

# The method name of a num_returns="dynamic" actor call is this prefix + the method's name
# (a Python name cannot contain ":", so it never shadows an attribute).
DYNAMIC_METHOD = "dynamic:"


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
            refs.append(_backend.current().put(item))
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
    refs = []
    try:
        async for item in items:
            refs.append(_backend.current().put(item))
    except Exception as exc:  # noqa: BLE001 - the error is the last item, as in Ray
        refs.append(_error_item(exc))
    return refs


def _drain_async(items: Any) -> list[ObjectRef]:
    """Store each item of an async generator: on the actor's event loop when there is
    one (its other coroutines keep running), else on a loop of its own."""
    import asyncio

    loop = _backend.current().actor_loop()
    drain = _store_async_items(items)
    return loop.run(drain) if loop is not None else asyncio.run(drain)


def _error_item(exc: Exception) -> ObjectRef:
    """A ref whose ``get`` raises ``exc``: where a dynamic generator stopped with it."""
    return _backend.current().put_error(exc)
