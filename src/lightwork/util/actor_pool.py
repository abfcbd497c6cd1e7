"""ActorPool: spread work over a fixed set of actors, one call per actor at a time.

State, as in Ray 2.60's ``ActorPool``: ``_idle`` actors ready for work;
``_pending_submits`` the (fn, value) pairs waiting for an idle actor, in order;
``_running`` maps each submitted, not yet returned call to (submission index, actor),
keyed by its ref (a tuple of refs when ``fn`` returned several: ``num_returns=k``);
``_index_to_ref`` holds those same calls by submission index, so ``get_next`` returns
results in submission order while ``get_next_unordered`` returns whichever finishes
first. A call's actor goes back to ``_idle`` when its result is taken, or when the call
is dropped (``ignore_if_timedout``) or has ``timeout=0`` ahead of a ``map`` - that
actor may still be running it, and takes the next call after it - and not when the
call failed because the actor died.

``map``/``map_unordered`` submit every value at once (Ray's "eager" map) and return a
generator of the results. Results of calls submitted before the map are taken if
ready and dropped if not: the map does not wait for them (ray-project/ray#23107).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from lightwork import api
from lightwork.api.actor import ActorHandle
from lightwork.kernel import exceptions

_TIMED_OUT = "timed out waiting for the pool's next result"


class ActorPool:
    """A fixed set of actors that calls are spread over, one at a time per actor."""

    def __init__(self, actors: Iterable[ActorHandle]) -> None:
        actors = list(actors)
        for actor in actors:
            _check_actor(actor)
        self._idle: list[ActorHandle] = actors
        self._pending_submits: deque[tuple[Callable[[ActorHandle, Any], Any], Any]] = deque()
        self._running: dict[Any, tuple[int, ActorHandle]] = {}
        self._index_to_ref: dict[int, Any] = {}
        self._next_submit = 0

    # -- submitting ------------------------------------------------------------------
    def submit(self, fn: Callable[[ActorHandle, Any], Any], value: Any) -> None:
        """Call ``fn(actor, value)`` (which must return an ObjectRef, or a list of them
        for a method with ``num_returns=k``) on an idle actor, or queue it until one is."""
        if not callable(fn):
            raise TypeError(f"ActorPool.submit takes a function (actor, value) -> ObjectRef, "
                            f"got {type(fn).__name__}: {fn!r:.80}")
        if not self._idle:
            self._pending_submits.append((fn, value))
            return
        actor = self._idle.pop()
        try:
            ref = fn(actor, value)
            key = _key_of(ref)
        except BaseException:
            self._idle.append(actor)
            raise
        self._running[key] = (self._next_submit, actor)
        self._index_to_ref[self._next_submit] = ref
        self._next_submit += 1

    def map(self, fn: Callable[[ActorHandle, Any], Any], values: Iterable[Any]) -> Iterator[Any]:
        """Results of ``fn`` over ``values``, in the order of ``values``. Every value is
        submitted now; iterate the result to collect them."""
        self._drop_earlier_results()
        for value in _iterable(values, "map"):
            self.submit(fn, value)
        return self._results(self.get_next)

    def map_unordered(self, fn: Callable[[ActorHandle, Any], Any],
                      values: Iterable[Any]) -> Iterator[Any]:
        """Results of ``fn`` over ``values``, as they finish. Every value is submitted
        now; iterate the result to collect them."""
        self._drop_earlier_results()
        for value in _iterable(values, "map_unordered"):
            self.submit(fn, value)
        return self._results(self.get_next_unordered)

    def _results(self, take: Callable[[], Any]) -> Iterator[Any]:
        while self.has_next():
            yield take()

    def _drop_earlier_results(self) -> None:
        """Before a map: take the results submitted earlier that are ready, and drop
        the others (their actors take the map's calls after them), as in Ray."""
        while self.has_next():
            try:
                self.get_next(timeout=0, ignore_if_timedout=True)
            except TimeoutError:
                pass

    # -- collecting ------------------------------------------------------------------
    def has_next(self) -> bool:
        """Whether a submitted result has not been returned yet."""
        return bool(self._running)

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """The next result in submission order, waiting up to ``timeout`` seconds (None:
        as long as it takes). On a timeout, raise ``TimeoutError``; with
        ``ignore_if_timedout=True`` the call is dropped first (the next ``get_next``
        moves past it), else it stays the next result."""
        _check_timeout(timeout)
        self._check_has_next()
        # Pending submissions come after every submitted call, so the oldest submitted
        # call is the next result in order.
        index = min(self._index_to_ref)
        ref = self._index_to_ref[index]
        if timeout is not None and not _ready(_refs_of(ref), timeout):
            if not ignore_if_timedout:
                raise TimeoutError(f"{_TIMED_OUT} (waited {timeout} s)")
            self._drop(index, ref)
            raise TimeoutError(f"{_TIMED_OUT} (waited {timeout} s); the call {ref!r:.120} "
                               "was dropped from the pool")
        return self._take(index, ref)

    def get_next_unordered(self, timeout: float | None = None,
                           ignore_if_timedout: bool = False) -> Any:
        """Whichever result finishes next, waiting up to ``timeout`` seconds (None: as
        long as it takes). On a timeout, raise ``TimeoutError``; with
        ``ignore_if_timedout=True`` the oldest call is dropped first, as in Ray 2.60."""
        _check_timeout(timeout)
        self._check_has_next()
        index = self._first_ready(timeout)
        if index is None:
            if not ignore_if_timedout:
                raise TimeoutError(f"{_TIMED_OUT} (waited {timeout} s)")
            index = min(self._index_to_ref)
            ref = self._index_to_ref[index]
            self._drop(index, ref)
            raise TimeoutError(f"{_TIMED_OUT} (waited {timeout} s); the call {ref!r:.120} "
                               "was dropped from the pool")
        return self._take(index, self._index_to_ref[index])

    def _check_has_next(self) -> None:
        if self._running:
            return
        if self._pending_submits:  # (only when the pool has no actor left)
            raise ValueError(
                f"{len(self._pending_submits)} submission(s) wait for an actor, but the "
                "pool has none: push() an actor into it")
        raise StopIteration("no more results to get: submit work first")

    def _first_ready(self, timeout: float | None) -> int | None:
        """The index of a submitted call whose refs are all ready, waiting up to
        ``timeout``; None if none is by then."""
        by_ref: dict[Any, list[int]] = {}
        for index, ref in self._index_to_ref.items():
            for one in _refs_of(ref):
                by_ref.setdefault(one, []).append(index)
        flat = list(by_ref)
        if not flat:  # a call with num_returns=0: nothing to wait for
            return min(self._index_to_ref)
        deadline = None if timeout is None else time.monotonic() + timeout
        need = 1
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = api.wait(flat, num_returns=need, timeout=left)
            done = set(ready)
            for index in sorted({i for one in ready for i in by_ref[one]}):
                if all(one in done for one in _refs_of(self._index_to_ref[index])):
                    return index
            if len(ready) < need:
                return None
            need = len(ready) + 1  # some call has refs still pending: wait for one more

    def _take(self, index: int, ref: Any) -> Any:
        """Get the result of call ``index`` and give its actor back (unless the call
        failed because the actor died: it leaves the pool, as in Ray)."""
        del self._index_to_ref[index]
        _, actor = self._running.pop(_key_of(ref))
        alive = True
        try:
            return api.get(ref)
        except exceptions.ActorDiedError:
            alive = False
            raise
        finally:
            self._return_actor(actor, alive)

    def _drop(self, index: int, ref: Any) -> None:
        del self._index_to_ref[index]
        _, actor = self._running.pop(_key_of(ref))
        self._return_actor(actor)

    def _return_actor(self, actor: ActorHandle, alive: bool = True) -> None:
        if alive:
            self._idle.append(actor)
        if self._pending_submits and self._idle:
            self.submit(*self._pending_submits.popleft())

    # -- the actors ------------------------------------------------------------------
    def has_free(self) -> bool:
        """Whether an actor is idle and no submission waits for one."""
        return bool(self._idle) and not self._pending_submits

    def pop_idle(self) -> ActorHandle | None:
        """Take an idle actor out of the pool (None if none is free)."""
        return self._idle.pop() if self.has_free() else None

    def push(self, actor: ActorHandle) -> None:
        """Add an actor to the pool (it must not be in it already)."""
        _check_actor(actor)
        busy = [a for _, a in self._running.values()]
        if actor in self._idle or actor in busy:
            raise ValueError(f"{actor!r} is already in this pool")
        self._return_actor(actor)


def _key_of(ref: Any) -> Any:
    """The pool's key for what ``fn`` returned: the ref, or a tuple of several refs."""
    if isinstance(ref, api.ObjectRef):
        return ref
    if isinstance(ref, list) and all(isinstance(one, api.ObjectRef) for one in ref):
        return tuple(ref)
    raise TypeError(
        "the function given to ActorPool must return an ObjectRef (or a list of them, "
        "for a method with num_returns=k), e.g. lambda actor, value: "
        f"actor.method.remote(value); it returned {ref!r:.80}")


def _refs_of(ref: Any) -> list[Any]:
    return ref if isinstance(ref, list) else [ref]


def _ready(refs: list[Any], timeout: float) -> bool:
    if not refs:
        return True
    ready, _ = api.wait(refs, num_returns=len(refs), timeout=timeout)
    return len(ready) == len(refs)


def _check_timeout(timeout: Any) -> None:
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or timeout < 0):
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")


def _iterable(values: Any, what: str) -> Iterable[Any]:
    try:
        iter(values)
    except TypeError:
        raise TypeError(f"ActorPool.{what} takes an iterable of values, got "
                        f"{type(values).__name__}: {values!r:.80}") from None
    return values


def _check_actor(actor: Any) -> None:
    if not isinstance(actor, ActorHandle):
        raise TypeError(f"ActorPool holds actor handles, got {type(actor).__name__}: {actor!r:.80}")
