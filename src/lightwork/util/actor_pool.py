"""ActorPool: spread work over a fixed set of actors, one call per actor at a time.

State: ``_idle`` actors ready for work; ``_pending`` submissions waiting for an idle
actor; ``_running`` maps each ref whose actor is still busy to (submission index, actor);
``_index_to_ref`` holds every submitted, not yet returned ref by submission index, so
``get_next`` returns results in submission order while ``get_next_unordered`` returns
whichever finishes first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from lightwork import api
from lightwork.api.actor import ActorHandle


class ActorPool:
    def __init__(self, actors: Iterable[ActorHandle]) -> None:
        actors = list(actors)
        for actor in actors:
            _check_actor(actor)
        self._idle: list[ActorHandle] = actors
        self._pending: deque[tuple[Callable[[ActorHandle, Any], Any], Any]] = deque()
        self._running: dict[Any, tuple[int, ActorHandle]] = {}
        self._index_to_ref: dict[int, Any] = {}
        self._next_submit = 0

    # -- submitting ------------------------------------------------------------------
    def submit(self, fn: Callable[[ActorHandle, Any], Any], value: Any) -> None:
        """Call ``fn(actor, value)`` (which must return an ObjectRef) on an idle actor."""
        if self._idle:
            actor = self._idle.pop()
            ref = fn(actor, value)
            if not isinstance(ref, api.ObjectRef):
                self._idle.append(actor)
                raise TypeError(
                    "the function given to ActorPool must return an ObjectRef, e.g. "
                    f"lambda actor, value: actor.method.remote(value); it returned {ref!r:.80}"
                )
            self._running[ref] = (self._next_submit, actor)
            self._index_to_ref[self._next_submit] = ref
            self._next_submit += 1
        else:
            self._pending.append((fn, value))

    def map(self, fn: Callable[[ActorHandle, Any], Any], values: Iterable[Any]) -> Iterator[Any]:
        """Results of ``fn`` over ``values``, in the order of ``values``."""
        self._drain_before_map()
        for value in values:
            self.submit(fn, value)
        while self.has_next():
            yield self.get_next()

    def map_unordered(self, fn: Callable[[ActorHandle, Any], Any], values: Iterable[Any]) -> Iterator[Any]:
        """Results of ``fn`` over ``values``, as they finish."""
        self._drain_before_map()
        for value in values:
            self.submit(fn, value)
        while self.has_next():
            yield self.get_next_unordered()

    def _drain_before_map(self) -> None:
        while self.has_next():
            self.get_next_unordered()

    # -- collecting ------------------------------------------------------------------
    def has_next(self) -> bool:
        return bool(self._index_to_ref) or bool(self._pending)

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """The next result in submission order."""
        if not self.has_next():
            raise StopIteration("no more results to get: submit work first")
        # Pending submissions always come after every submitted one, so the oldest
        # submitted ref is the next result in order.
        index = min(self._index_to_ref)
        ref = self._index_to_ref[index]
        if timeout is not None:
            ready, _ = api.wait([ref], timeout=timeout)
            if not ready:
                if ignore_if_timedout:
                    del self._index_to_ref[index]
                raise TimeoutError(f"timed out after {timeout} s waiting for the next result")
        del self._index_to_ref[index]
        return self._collect(ref, fetch=True)

    def get_next_unordered(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """Whichever result finishes next."""
        if not self.has_next():
            raise StopIteration("no more results to get: submit work first")
        waiting = {ref: index for index, ref in self._index_to_ref.items()}
        ready, _ = api.wait(list(waiting), num_returns=1, timeout=timeout)
        if not ready:
            raise TimeoutError(f"timed out after {timeout} s waiting for a result")
        ref = ready[0]
        del self._index_to_ref[waiting[ref]]
        return self._collect(ref, fetch=True)

    def _collect(self, ref: Any, fetch: bool = False) -> Any:
        """Give the ref's actor back (running the next pending submission on it)."""
        entry = self._running.pop(ref, None)
        if entry is not None:
            self._return_actor(entry[1])
        return api.get(ref) if fetch else None

    def _return_actor(self, actor: ActorHandle) -> None:
        self._idle.append(actor)
        if self._pending:
            self.submit(*self._pending.popleft())

    # -- the actors ------------------------------------------------------------------
    def has_free(self) -> bool:
        return bool(self._idle) and not self._pending

    def pop_idle(self) -> ActorHandle | None:
        return self._idle.pop() if self.has_free() else None

    def push(self, actor: ActorHandle) -> None:
        """Add an actor to the pool (it must not be in it already)."""
        _check_actor(actor)
        busy = [a for _, a in self._running.values()]
        if actor in self._idle or actor in busy:
            raise ValueError(f"{actor!r} is already in this pool")
        self._return_actor(actor)


def _check_actor(actor: Any) -> None:
    if not isinstance(actor, ActorHandle):
        raise TypeError(f"ActorPool holds actor handles, got {type(actor).__name__}: {actor!r:.80}")
