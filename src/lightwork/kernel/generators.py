"""What a generator task needs in every engine's worker: ``num_returns="dynamic"`` and
a static ``num_returns=k``.

A ``num_returns="dynamic"`` task's ref resolves to a :class:`DynamicObjectRefGenerator`
of refs to every item, ready when the task ends. The function runs inside
:class:`DynamicReturns`, which stores each item as it comes. An exception mid-way raises
:class:`GeneratorRaised` out of the function, carrying the refs so far with the error as
their last item (its ref raises it): the worker retries the task when its
``retry_exceptions`` say so (a retry's items are all the retry's, as in Ray), else keeps
that partial result. An actor method called with ``num_returns="dynamic"`` names its
method ``DYNAMIC_METHOD + name``; the actor's worker finds no such attribute and runs the
method inside :class:`DynamicReturns` (so a plain call pays nothing for it). Async
generator methods are drained on the actor's event loop. Items are stored through the
process's backend (:func:`lightwork.kernel.backend.current`).

A generator called with an int ``num_returns=k`` fills the k refs in yield order
(:func:`take_static`), as Ray does: the first k items are kept whatever follows. One more
yield, or an exception after the k-th, is logged on the worker's stderr and not raised
(Ray's behaviour, ray-project/ray#28689). Fewer items (the generator ended, or raised)
raise :class:`GeneratorRaised` with the items so far: the refs past them raise the error
(a ``ValueError`` saying how many came, or the user's exception), unless the task is
retried. With k of 2 or more the worker sees a generator where one value per ref was
expected, so nothing marks the call; with k = 1 (a generator would otherwise stream) the
function runs inside :class:`StaticReturns` (a method: ``STATIC_METHOD + name``), whose
result is a :class:`StaticItems`.
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
# Likewise for a generator method called with num_returns=1 (see StaticReturns).
STATIC_METHOD = "static:"


# The most items one streaming generator call may yield (Ray's default, and its
# variable); read once a process, so set it before the runtime starts its workers.
DEFAULT_MAX_STREAM_ITEMS = 100_000_000
_max_stream_items: int | None = None


def max_stream_items() -> int:
    """The limit on a streaming generator's items: ``LIGHTWORK_MAX_GENERATOR_RETURNS``,
    else Ray's ``RAY_max_num_generator_returns``, else 100 million."""
    global _max_stream_items
    if _max_stream_items is None:
        from lightwork.kernel.environ import setting

        limit = setting(("LIGHTWORK_MAX_GENERATOR_RETURNS", "RAY_max_num_generator_returns"),
                        int, "a whole number of items")
        _max_stream_items = DEFAULT_MAX_STREAM_ITEMS if limit is None else limit
    return _max_stream_items


def too_many_items_error(name: str, limit: int) -> ValueError:
    return ValueError(
        f"generator task {name} yielded more than {limit} items, the limit on one "
        f"streaming generator (RAY_max_num_generator_returns or "
        f"LIGHTWORK_MAX_GENERATOR_RETURNS in the environment that starts the runtime); "
        f"raise the limit, or yield fewer, larger items")


class GeneratorRaised(Exception):
    """A generator task's generator raised (``error``) before it filled its returns.

    ``partial`` is the task's result if it is not retried: a dynamic generator's refs
    with the error last, or the items a static one yielded (fewer than its returns)."""

    def __init__(self, error: BaseException, partial: Any) -> None:
        super().__init__(error)
        self.error = error
        self.partial = partial


class StaticItems:
    """What a generator function called with ``num_returns=1`` returns in its worker:
    its generator, marked as not to be streamed."""

    __slots__ = ("items",)

    def __init__(self, items: Any) -> None:
        self.items = items


class StaticReturns:
    """Runs a generator function whose caller asked for ``num_returns=1``."""

    def __init__(self, function: Any) -> None:
        self.function = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.function(*args, **kwargs)
        return StaticItems(result) if inspect.isgenerator(result) or inspect.isasyncgen(result) \
            else result


def take_static(items: Any, count: int, name: str, store: Any = None) -> list[Any]:
    """The first ``count`` items of generator ``items`` (each passed through ``store``
    as it comes, when given), for a task ``name`` declared ``num_returns=count``.

    Raises :class:`GeneratorRaised` (its ``partial``: the items so far) when the
    generator ended or raised before ``count`` items. One item too many, or an error
    after the last item, is logged and dropped: the ``count`` items are the result."""
    if type(items) is StaticItems:
        items = items.items
    if inspect.isasyncgen(items):
        raise TypeError(
            f"{name} is an async generator, which cannot fill num_returns={count}: call "
            "it with num_returns='streaming' (the default) or 'dynamic'")
    taken: list[Any] = []
    extra: BaseException | None = None
    while True:
        try:
            item = next(items)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 - the user's error: a result, as in Ray
            if len(taken) < count:
                raise GeneratorRaised(exc, taken) from None
            extra = exc
            break
        if len(taken) == count:
            extra = ValueError(f"task {name} yielded more than num_returns={count} items")
            items.close()  # the item past the last is not taken: end the generator now
            break
        # (outside the try: a value that cannot be stored is the runtime's error)
        taken.append(item if store is None else store(item, len(taken)))
    if extra is not None:
        _log_dropped(name, count, extra)
    elif len(taken) < count:
        raise GeneratorRaised(ValueError(
            f"task {name} was declared with num_returns={count} but its generator "
            f"yielded {len(taken)} item{'s' if len(taken) != 1 else ''}; yield exactly "
            f"{count}, or use num_returns='dynamic' for a count known only as it runs"),
            taken)
    return taken


def _log_dropped(name: str, count: int, error: BaseException) -> None:
    import sys
    import traceback

    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    print(f"lightwork: generator task {name} already filled its num_returns={count} "
          f"refs, so this error is logged and not raised (as in Ray, "
          f"ray-project/ray#28689): {text}", file=sys.stderr, flush=True)


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
        return _raise_if_failed(_drain_async(result))
    if not inspect.isgenerator(result):  # as in Ray: a returned list is refused too
        raise TypeError(
            f"a num_returns='dynamic' task must be a generator function (yield its items), "
            f"but it returned {type(result).__name__}; yield the items, or drop "
            f"num_returns='dynamic' (an int num_returns=k returns k values)")
    items = result
    refs = []
    try:
        for item in items:
            refs.append(_backend.current().put(item))
    except Exception as exc:  # noqa: BLE001 - the error is the last item, as in Ray
        refs.append(_error_item(exc))
        raise GeneratorRaised(exc, DynamicObjectRefGenerator(refs)) from None
    return DynamicObjectRefGenerator(refs)


async def collect_async(result: Any) -> DynamicObjectRefGenerator:
    """``collect`` from a coroutine already running on the actor's loop (the cluster
    backend's async actors): an async generator is drained here, on that loop."""
    if inspect.isasyncgen(result):
        return _raise_if_failed(await _store_async_items(result))
    return collect(result)


async def _store_async_items(items: Any) -> tuple[list[ObjectRef], Exception | None]:
    refs = []
    try:
        async for item in items:
            refs.append(_backend.current().put(item))
    except Exception as exc:  # noqa: BLE001 - the error is the last item, as in Ray
        refs.append(_error_item(exc))
        return refs, exc
    return refs, None


def _raise_if_failed(drained: tuple[list[ObjectRef], Exception | None]) -> DynamicObjectRefGenerator:
    refs, error = drained
    if error is not None:  # raised here, off the loop: see GeneratorRaised
        raise GeneratorRaised(error, DynamicObjectRefGenerator(refs))
    return DynamicObjectRefGenerator(refs)


def _drain_async(items: Any) -> tuple[list[ObjectRef], Exception | None]:
    """Store each item of an async generator: on the actor's event loop when there is
    one (its other coroutines keep running), else on a loop of its own."""
    import asyncio

    loop = _backend.current().actor_loop()
    drain = _store_async_items(items)
    return loop.run(drain) if loop is not None else asyncio.run(drain)


def _error_item(exc: Exception) -> ObjectRef:
    """A ref whose ``get`` raises ``exc``: where a dynamic generator stopped with it."""
    return _backend.current().put_error(exc)
