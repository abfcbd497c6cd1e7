"""``Pool``: the standard library's ``multiprocessing.Pool`` interface, run on lightwork.

Code written for ``multiprocessing.Pool`` (or for Ray's ``ray.util.multiprocessing``)
moves over by changing the import. As in Ray, each of the pool's ``processes`` is an
actor (a process of its own), so ``initializer(*initargs)`` runs once per process, and
state the initializer sets up is there for every call that process runs.

Dispatch. Work is cut into chunks (stdlib's chunk sizes: ``map`` about four chunks per
process, ``imap`` one item per chunk unless told); each chunk is one actor call that
returns the chunk's results. A chunk goes to the process with the fewest chunks still
outstanding (counted down as results arrive), so the pool stays balanced without a
dispatcher thread. The function is stored once per call of ``map`` (``put``) and passed
by reference, not pickled into every chunk.

``maxtasksperchild``: a process that has been given that many chunks is retired — its
``__ray_terminate__`` is queued after its last chunk, so it ends once that work is done —
and a fresh process takes its place in the pool.

Errors: an exception raised by the function comes back as the user's own exception type
(the original class, not a wrapper), with the remote traceback attached as its
``__cause__``, as the standard library does. A process that dies raises lightwork's
``ActorDiedError`` for the chunks it held.

Lifecycle, as in the standard library: ``close()`` refuses new work, ``terminate()``
kills the processes now, ``join()`` (after either) waits for outstanding work and the
processes' end; leaving a ``with Pool() as pool:`` block terminates it.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as _stdlib_multiprocessing
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import lightwork
from lightwork.exceptions import TaskError

__all__ = ["AsyncResult", "IMapIterator", "Pool", "TimeoutError"]

TimeoutError = _stdlib_multiprocessing.TimeoutError  # the stdlib's name, as Ray's module has

_RUN, _CLOSE, _TERMINATE = "RUN", "CLOSE", "TERMINATE"


class _PoolProcess:
    """One process of a pool: runs the initializer once, then chunks of calls."""

    def __init__(self, initializer: Callable[..., Any] | None, initargs: tuple) -> None:
        if initializer is not None:
            initializer(*initargs)

    def run_chunk(self, func: Callable[..., Any], how: str, chunk: list[Any]) -> list[Any]:
        if how == "star":
            return [func(*args) for args in chunk]
        if how == "apply":
            return [func(*args, **kwargs) for args, kwargs in chunk]
        return [func(item) for item in chunk]


class RemoteTraceback(Exception):
    """The traceback of an error raised in a pool process (the stdlib's name and shape)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _user_error(error: BaseException) -> BaseException:
    """The exception to raise for ``error``: the user's original one when it came back."""
    if isinstance(error, TaskError) and error.cause is not None:
        cause = error.cause
        cause.__cause__ = RemoteTraceback(f'\n"""\n{error.traceback_str}"""')
        return cause
    return error


class Pool:
    """A pool of ``processes`` worker processes (default: the runtime's CPUs)."""

    def __init__(self, processes: int | None = None,
                 initializer: Callable[..., Any] | None = None, initargs: Iterable[Any] = (),
                 maxtasksperchild: int | None = None, context: Any = None,
                 ray_address: str | None = None,
                 ray_remote_args: dict[str, Any] | None = None) -> None:
        if processes is not None and (isinstance(processes, bool)
                                      or not isinstance(processes, int) or processes < 1):
            raise ValueError(f"processes must be an int >= 1 (or None: one per CPU), got {processes!r}")
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable, got {initializer!r:.80}")
        if maxtasksperchild is not None and (
                isinstance(maxtasksperchild, bool) or not isinstance(maxtasksperchild, int)
                or maxtasksperchild < 1):
            raise ValueError(f"maxtasksperchild must be an int >= 1 or None, got {maxtasksperchild!r}")
        if ray_remote_args is not None and not isinstance(ray_remote_args, dict):
            raise TypeError(f"ray_remote_args must be a dict of actor options, got {ray_remote_args!r}")
        if ray_address is not None and not lightwork.is_initialized():
            lightwork.init(address=ray_address)
        self._initializer = initializer
        self._initargs = tuple(initargs or ())
        self._maxtasksperchild = maxtasksperchild
        self._actor_class = lightwork.remote(_PoolProcess).options(**(ray_remote_args or {}))
        count = processes or max(1, int(lightwork.cluster_resources().get("CPU", 1)))
        self._processes = count
        # Guards the roster and counts. Reentrant: a chunk already answered when it is
        # submitted runs its done-callback (_answered) at once, in the submitting thread.
        self._lock = threading.RLock()
        self._actors: list[Any] = [self._start_actor() for _ in range(count)]
        self._outstanding: list[int] = [0] * count  # chunks not yet answered, per slot
        self._given: list[int] = [0] * count  # chunks given to the slot's current process
        self._retired: list[Any] = []  # processes ending after their last chunk
        self._pending: set[Any] = set()  # refs of every chunk not yet answered
        self._state = _RUN

    # -- the standard library's interface ------------------------------------------------
    def apply(self, func: Callable[..., Any], args: Iterable[Any] = (),
              kwds: dict[str, Any] | None = None) -> Any:
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable[..., Any], args: Iterable[Any] = (),
                    kwds: dict[str, Any] | None = None, callback: Callable[[Any], Any] | None = None,
                    error_callback: Callable[[BaseException], Any] | None = None) -> AsyncResult:
        _check_callable(func, "apply_async")
        refs = self._submit(func, "apply", [[(tuple(args), dict(kwds or {}))]])
        return AsyncResult(refs, single=True, callback=callback, error_callback=error_callback)

    def map(self, func: Callable[[Any], Any], iterable: Iterable[Any],
            chunksize: int | None = None) -> list[Any]:
        return self.map_async(func, iterable, chunksize).get()

    def map_async(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                  chunksize: int | None = None, callback: Callable[[Any], Any] | None = None,
                  error_callback: Callable[[BaseException], Any] | None = None) -> AsyncResult:
        return self._map_async(func, iterable, chunksize, "map", callback, error_callback)

    def starmap(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                chunksize: int | None = None) -> list[Any]:
        return self.starmap_async(func, iterable, chunksize).get()

    def starmap_async(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                      chunksize: int | None = None, callback: Callable[[Any], Any] | None = None,
                      error_callback: Callable[[BaseException], Any] | None = None) -> AsyncResult:
        return self._map_async(func, iterable, chunksize, "star", callback, error_callback)

    def imap(self, func: Callable[[Any], Any], iterable: Iterable[Any],
             chunksize: int = 1) -> IMapIterator:
        """Results in the input's order, each as soon as it and those before it are done."""
        _check_callable(func, "imap")
        refs = self._submit(func, "map", _chunks(list(iterable), _check_chunksize(chunksize)))
        return IMapIterator(refs, ordered=True)

    def imap_unordered(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                       chunksize: int = 1) -> IMapIterator:
        """Results in the order they finish."""
        _check_callable(func, "imap_unordered")
        refs = self._submit(func, "map", _chunks(list(iterable), _check_chunksize(chunksize)))
        return IMapIterator(refs, ordered=False)

    def close(self) -> None:
        """Accept no more work; the processes end once theirs is done (see ``join``)."""
        if self._state == _RUN:
            self._state = _CLOSE

    def terminate(self) -> None:
        """Stop now: kill every process, outstanding work included."""
        if self._state == _TERMINATE:
            return
        self._state = _TERMINATE
        with self._lock:
            actors, self._actors = self._actors + self._retired, []
            self._retired = []
        for actor in actors:
            with contextlib.suppress(Exception):  # an actor already gone is what we want
                lightwork.kill(actor)

    def join(self) -> None:
        """Wait for the outstanding work, then for the processes to end (after close or
        terminate, as in the standard library)."""
        if self._state == _RUN:
            raise ValueError("Pool is still running: call close() or terminate() before join()")
        if self._state == _CLOSE:
            with self._lock:
                pending = list(self._pending)
            if pending:
                lightwork.wait(pending, num_returns=len(pending))
            with self._lock:
                actors, self._actors = self._actors + self._retired, []
                self._retired = []
            ends = [actor.__ray_terminate__.remote() for actor in actors]
            if ends:
                lightwork.wait(ends, num_returns=len(ends), timeout=30)
            self._state = _TERMINATE

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.terminate()

    def __repr__(self) -> str:
        return f"<lightwork.util.multiprocessing.Pool state={self._state} processes={self._processes}>"

    # -- dispatch ------------------------------------------------------------------------
    def _map_async(self, func: Callable[..., Any], iterable: Iterable[Any], chunksize: int | None,
                   how: str, callback: Any, error_callback: Any) -> AsyncResult:
        _check_callable(func, "map")
        items = list(iterable)
        if chunksize is None:
            chunksize, extra = divmod(len(items), self._processes * 4)
            chunksize = max(1, chunksize + bool(extra))
        refs = self._submit(func, how, _chunks(items, _check_chunksize(chunksize)))
        return AsyncResult(refs, single=False, callback=callback, error_callback=error_callback)

    def _submit(self, func: Callable[..., Any], how: str, chunks: list[list[Any]]) -> list[Any]:
        self._check_running()
        if not chunks:
            return []
        func_ref = lightwork.put(func)  # stored once, read by every chunk's process
        refs = []
        with self._lock:
            for chunk in chunks:
                slot = min(range(len(self._actors)), key=self._outstanding.__getitem__)
                ref = self._actors[slot].run_chunk.remote(func_ref, how, chunk)
                self._outstanding[slot] += 1
                self._given[slot] += 1
                self._pending.add(ref)
                refs.append(ref)
                ref.future().add_done_callback(
                    lambda _done, ref=ref, slot=slot, actor=self._actors[slot]:
                    self._answered(ref, slot, actor))
                if self._maxtasksperchild and self._given[slot] >= self._maxtasksperchild:
                    self._retire(slot)
        return refs

    def _answered(self, ref: Any, slot: int, actor: Any) -> None:
        with self._lock:
            self._pending.discard(ref)
            if slot < len(self._actors) and self._actors[slot] is actor:
                self._outstanding[slot] -= 1

    def _retire(self, slot: int) -> None:
        """The slot's process got its last chunk: it ends after it; a new one takes over."""
        old = self._actors[slot]
        old.__ray_terminate__.remote()  # runs after the chunks already queued on it
        self._retired.append(old)
        self._actors[slot] = self._start_actor()
        self._outstanding[slot] = 0
        self._given[slot] = 0

    def _start_actor(self) -> Any:
        return self._actor_class.remote(self._initializer, self._initargs)

    def _check_running(self) -> None:
        if self._state != _RUN:
            raise ValueError(f"Pool not running (it was {'closed' if self._state == _CLOSE else 'terminated'})")


class AsyncResult:
    """What ``apply_async``/``map_async`` return (the stdlib's ``AsyncResult``)."""

    def __init__(self, refs: list[Any], single: bool, callback: Any = None,
                 error_callback: Any = None) -> None:
        self._refs = refs
        self._single = single
        self._outcome: tuple[bool, Any] | None = None
        if callback is not None or error_callback is not None:
            # Callbacks run on a thread of their own, never on the runtime's, so they may
            # call back into lightwork (the stdlib runs them on its result thread).
            threading.Thread(target=self._notify, args=(callback, error_callback),
                             name="lightwork-pool-callback", daemon=True).start()

    def _notify(self, callback: Any, error_callback: Any) -> None:
        self.wait()
        ok, value = self._settle()
        if ok and callback is not None:
            callback(value)
        elif not ok and error_callback is not None:
            error_callback(value)

    def ready(self) -> bool:
        if self._outcome is not None or not self._refs:
            return True
        ready, _ = lightwork.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)

    def wait(self, timeout: float | None = None) -> None:
        if self._refs and self._outcome is None:
            lightwork.wait(self._refs, num_returns=len(self._refs), timeout=timeout)

    def successful(self) -> bool:
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._settle()[0]

    def get(self, timeout: float | None = None) -> Any:
        self.wait(timeout)
        if not self.ready():
            raise TimeoutError(f"the pool's results were not ready within {timeout} s")
        ok, value = self._settle()
        if not ok:
            raise value
        return value

    def _settle(self) -> tuple[bool, Any]:
        if self._outcome is None:
            try:
                chunks = lightwork.get(self._refs)
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                self._outcome = (False, _user_error(error))
            else:
                values = list(itertools.chain.from_iterable(chunks))
                self._outcome = (True, values[0] if self._single else values)
        return self._outcome


class IMapIterator(Iterator[Any]):
    """What ``imap``/``imap_unordered`` return; ``next(timeout)`` as in the stdlib."""

    def __init__(self, refs: list[Any], ordered: bool) -> None:
        self._waiting = list(refs)
        self._ordered = ordered
        self._buffer: list[Any] = []

    def __iter__(self) -> IMapIterator:
        return self

    def __next__(self) -> Any:
        return self.next()

    def next(self, timeout: float | None = None) -> Any:
        if not self._buffer:
            if not self._waiting:
                raise StopIteration
            if self._ordered:
                ref = self._waiting[0]
                ready, _ = lightwork.wait([ref], timeout=timeout)
            else:
                ready, _ = lightwork.wait(self._waiting, num_returns=1, timeout=timeout)
            if not ready:
                raise TimeoutError(f"no result within {timeout} s")
            self._waiting.remove(ready[0])
            try:
                self._buffer = list(lightwork.get(ready[0]))
            except BaseException as error:  # noqa: BLE001 - re-raised as the user's type
                raise _user_error(error)  # its __cause__ is the remote traceback
        return self._buffer.pop(0)


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[start:start + size] for start in range(0, len(items), size)]


def _check_chunksize(chunksize: Any) -> int:
    if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
        raise ValueError(f"chunksize must be an int >= 1, got {chunksize!r}")
    return chunksize


def _check_callable(func: Any, call: str) -> None:
    if not callable(func):
        raise TypeError(f"Pool.{call}() needs a function to call, got {func!r:.80}")
