"""``Pool``: the standard library's ``multiprocessing.Pool`` interface, run on lightwork.

Code written for ``multiprocessing.Pool`` (or for Ray's ``ray.util.multiprocessing``)
moves over by changing the import. As in Ray, each of the pool's ``processes`` is an
actor (a process of its own), so ``initializer(*initargs)`` runs once per process, and
state the initializer sets up is there for every call that process runs.

Dispatch. Work is cut into chunks (stdlib's chunk sizes: ``map`` about four chunks per
process, ``imap`` one item per chunk unless told); each chunk is one actor call that
returns the chunk's results. A chunk goes to the process with the fewest chunks still
outstanding, so the pool stays balanced. The function is stored once per call of ``map``
(``put``) and passed by reference, not pickled into every chunk.

Results handler. One thread per pool (started with the first submission, as the standard
library's result-handler thread) watches every outstanding chunk with ``lightwork.wait``,
which only learns *that* a chunk is done and never unpickles its result. When a chunk is
done it counts it down for its process, and when all chunks of an ``apply_async`` /
``map_async`` with a callback are done it runs the callback (or error callback) on this
thread, as the standard library does: callbacks may call back into lightwork, and a slow
callback delays the others. Results are unpickled once, by whoever asks for them.

``imap``/``imap_unordered`` read their input lazily, as the standard library does: the
iterator keeps a bounded number of chunks in flight (a few per process) and reads more of
the input as results are taken, so an endless generator works with
``itertools.islice(pool.imap(f, endless()), n)``. An error raised by the input itself is
raised by ``next()`` in the place of the item it failed to produce.

``maxtasksperchild``: a process that has been given that many chunks is retired — its
``__ray_terminate__`` is queued after its last chunk, so it ends once that work is done —
and a fresh process takes its place in the pool.

Errors: an exception raised by the function comes back as the user's own exception type
(the original class, not a wrapper), with the remote traceback attached as its
``__cause__``, as the standard library does. A process that dies raises lightwork's
``ActorDiedError`` for the chunks it held.

Lifecycle, as in the standard library: ``close()`` refuses new work, ``terminate()``
kills the processes now, ``join()`` (after either) waits for outstanding work, its
callbacks and the processes' end (input an ``imap`` has not read yet is not work yet); leaving a ``with Pool() as pool:`` block terminates it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing as _stdlib_multiprocessing
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from lightwork import api
from lightwork.kernel.exceptions import TaskError

__all__ = ["AsyncResult", "IMapIterator", "JoinableQueue", "Pool", "TimeoutError"]

TimeoutError = _stdlib_multiprocessing.TimeoutError  # the stdlib's name, as Ray's module has
# The standard library's, as Ray's module re-exports it: a queue between this process
# and its own children (not an actor: for a queue that tasks share, see util.queue).
JoinableQueue = _stdlib_multiprocessing.JoinableQueue

_RUN, _CLOSE, _TERMINATE = "RUN", "CLOSE", "TERMINATE"

_logger = logging.getLogger(__name__)

# How long the results handler blocks in one wait before it takes in newly submitted
# chunks: the longest a new chunk goes unwatched (it delays only the balancing count).
_HANDLER_POLL_S = 0.05
# Chunks an imap keeps in flight per process before it reads more of its input.
_IMAP_CHUNKS_IN_FLIGHT_PER_PROCESS = 4


class _PoolProcess:
    """One process of a pool: runs the initializer once, then chunks of calls."""

    def __init__(self, initializer: Callable[..., Any] | None, initargs: tuple) -> None:
        if initializer is not None:
            initializer(*initargs)

    def run_chunk(self, func: Callable[..., Any], how: str, chunk: list[Any]) -> list[Any]:
        """The chunk's results in order; an item that raised is an ``_ItemFailure``
        in its place (the other items still run, as in Ray)."""
        results: list[Any] = []
        for item in chunk:
            try:
                if how == "star":
                    results.append(func(*item))
                elif how == "apply":
                    results.append(func(*item[0], **item[1]))
                else:
                    results.append(func(item))
            except Exception as exc:  # noqa: BLE001 - the item's result is its error
                results.append(_ItemFailure.of(exc))
        return results


class _ItemFailure:
    """The error one item of a chunk raised, as its result: the exception (or, if it
    cannot be pickled, a ``RemoteError`` with its text) and its traceback's text."""

    __slots__ = ("error", "traceback")

    def __init__(self, error: BaseException, traceback: str) -> None:
        self.error = error
        self.traceback = traceback

    @classmethod
    def of(cls, exc: BaseException) -> _ItemFailure:
        import traceback as _traceback

        import cloudpickle

        text = "".join(_traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            cloudpickle.dumps(exc)
        except Exception:  # noqa: BLE001 - it still travels, as its text
            exc = RemoteError(f"{type(exc).__name__}: {exc} (the exception could not be "
                              "pickled, so it came back as this RemoteError)")
        exc.__traceback__ = None  # its frames stay here; the text travels
        return cls(exc, text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ItemFailure, (self.error, self.traceback))

    def exception(self) -> BaseException:
        """The user's exception, with the remote traceback as its ``__cause__``."""
        self.error.__cause__ = RemoteTraceback(f'\n"""\n{self.traceback}"""')
        return self.error


class RemoteError(Exception):
    """An exception raised in a pool process that could not be pickled back."""


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
        if not api.is_initialized():  # as in Ray: an address given or set, else local
            if ray_address is not None:
                api.init(address=ray_address)
            elif os.environ.get("LIGHTWORK_ADDRESS"):  # (init() reads it)
                api.init()
            else:
                api.init(num_cpus=processes)
        cpus = int(api.cluster_resources().get("CPU", 0))
        if processes is not None and processes > cpus:
            raise ValueError(
                f"Pool(processes={processes}) needs {processes} CPUs, but the runtime has "
                f"{cpus}: ask for at most {cpus} processes, or start the runtime with "
                f"more (init(num_cpus={processes}))")
        self._initializer = initializer
        self._initargs = tuple(initargs or ())
        self._maxtasksperchild = maxtasksperchild
        self._actor_class = api.remote(_PoolProcess).options(**(ray_remote_args or {}))
        count = processes or max(1, cpus)
        self._processes = count
        # Guards the roster, the counts and the handler's start.
        self._lock = threading.RLock()
        self._actors: list[Any] = [self._start_actor() for _ in range(count)]
        self._outstanding: list[int] = [0] * count  # chunks not yet answered, per slot
        self._given: list[int] = [0] * count  # chunks given to the slot's current process
        self._retired: list[Any] = []  # processes ending after their last chunk
        self._pending: set[Any] = set()  # refs of every chunk not yet answered
        self._state = _RUN
        # Messages for the results handler, in order: (ref, slot, actor) of each chunk; an
        # AsyncResult whose callbacks are due when its chunks are done; an Event to set
        # once everything before it is handled (join); None to stop (terminate).
        self._handler_inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._handler: threading.Thread | None = None
        # As in Ray, the processes are up (their initializer has run) when Pool() returns.
        try:
            api.get([actor.__ray_ready__.remote() for actor in self._actors])
        except BaseException:
            self.terminate()
            raise

    # -- the standard library's interface ------------------------------------------------
    def apply(self, func: Callable[..., Any], args: Iterable[Any] = (),
              kwds: dict[str, Any] | None = None) -> Any:
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable[..., Any], args: Iterable[Any] = (),
                    kwds: dict[str, Any] | None = None, callback: Callable[[Any], Any] | None = None,
                    error_callback: Callable[[BaseException], Any] | None = None) -> AsyncResult:
        _check_callable(func, "apply_async")
        refs = self._submit(func, "apply", [[(tuple(args), dict(kwds or {}))]])
        return self._async_result(refs, True, callback, error_callback)

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
        self._check_running()
        return IMapIterator(self, func, iter(iterable), _check_chunksize(chunksize), ordered=True)

    def imap_unordered(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                       chunksize: int = 1) -> IMapIterator:
        """Results in the order they finish."""
        _check_callable(func, "imap_unordered")
        self._check_running()
        return IMapIterator(self, func, iter(iterable), _check_chunksize(chunksize), ordered=False)

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
                api.kill(actor)
        self._handler_inbox.put(None)  # the handler ends once the killed chunks are handled

    def join(self) -> None:
        """Wait for the outstanding work, then for the processes to end (after close or
        terminate, as in the standard library)."""
        if self._state == _RUN:
            raise ValueError("Pool is still running: call close() or terminate() before join()")
        if self._state == _CLOSE:
            with self._lock:
                pending = list(self._pending)
            if pending:
                api.wait(pending, num_returns=len(pending))
            self._flush_handler()  # their callbacks have run, as in the standard library
            with self._lock:
                actors, self._actors = self._actors + self._retired, []
                self._retired = []
            ends = [actor.__ray_terminate__.remote() for actor in actors]
            if ends:
                api.wait(ends, num_returns=len(ends), timeout=30)
            self._state = _TERMINATE
            self._handler_inbox.put(None)

    def _flush_handler(self) -> None:
        """Wait until the results handler has handled everything submitted so far."""
        handler = self._handler
        if handler is None or handler is threading.current_thread():
            return  # nothing submitted, or join() called from a callback
        flushed = threading.Event()
        self._handler_inbox.put(flushed)
        while not flushed.wait(0.1) and handler.is_alive():
            pass

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
        return self._async_result(refs, False, callback, error_callback)

    def _async_result(self, refs: list[Any], single: bool, callback: Any,
                      error_callback: Any) -> AsyncResult:
        for name, given in (("callback", callback), ("error_callback", error_callback)):
            if given is not None and not callable(given):
                raise TypeError(f"{name} must be callable or None, got {given!r:.80}")
        result = AsyncResult(refs, single)
        if callback is not None or error_callback is not None:
            result._callbacks = (callback, error_callback)
            self._handler_inbox.put(result)  # after its chunks: they are watched first
        return result

    def _submit(self, func: Callable[..., Any], how: str, chunks: list[list[Any]],
                func_ref: Any = None, check: bool = True) -> list[Any]:
        if check:
            self._check_running()
        elif self._state == _TERMINATE:
            raise ValueError("Pool not running (it was terminated)")
        if not chunks:
            return []
        if func_ref is None:
            func_ref = api.put(func)  # stored once, read by every chunk's process
        refs = []
        with self._lock:
            for chunk in chunks:
                slot = min(range(len(self._actors)), key=self._outstanding.__getitem__)
                ref = self._actors[slot].run_chunk.remote(func_ref, how, chunk)
                self._outstanding[slot] += 1
                self._given[slot] += 1
                self._pending.add(ref)
                refs.append(ref)
                self._handler_inbox.put((ref, slot, self._actors[slot]))
                if self._maxtasksperchild and self._given[slot] >= self._maxtasksperchild:
                    self._retire(slot)
            if self._handler is None:
                self._handler = threading.Thread(
                    target=self._handle_results, name="lightwork-pool-results", daemon=True)
                self._handler.start()
        return refs

    def _handle_results(self) -> None:
        """The results handler (see the module docstring): counts finished chunks and runs
        callbacks, without ever reading a result itself."""
        chunks: dict[Any, tuple[int, Any]] = {}  # watched chunk ref -> (slot, actor)
        callbacks: list[AsyncResult] = []  # results whose callbacks are still due
        flushes: list[threading.Event] = []  # join()s waiting for the above to empty
        stopping = False
        while True:
            # Idle, block until there is something to do; busy, take what has arrived.
            block = not chunks and not callbacks and not flushes
            with contextlib.suppress(queue.Empty):
                while True:
                    item = self._handler_inbox.get(block=block)
                    block = False
                    if item is None:
                        stopping = True
                    elif isinstance(item, threading.Event):
                        flushes.append(item)
                    elif isinstance(item, AsyncResult):
                        callbacks.append(item)
                    else:
                        chunks[item[0]] = (item[1], item[2])
            done: list[Any] = []
            if chunks:
                watched = list(chunks)
                try:
                    done = api.wait(watched, num_returns=1, timeout=_HANDLER_POLL_S)[0]
                    if done:  # collect every other chunk already done, in the same sweep
                        done = api.wait(watched, num_returns=len(watched), timeout=0)[0]
                except Exception:  # the runtime ended under the pool
                    _logger.debug("pool results handler stops: the runtime ended", exc_info=True)
                    for flushed in flushes:
                        flushed.set()
                    return
            with self._lock:
                for ref in done:
                    slot, actor = chunks.pop(ref)
                    self._pending.discard(ref)
                    if slot < len(self._actors) and self._actors[slot] is actor:
                        self._outstanding[slot] -= 1
            still_due = []
            for result in callbacks:
                if any(ref in chunks for ref in result._refs):
                    still_due.append(result)
                else:
                    result._run_callbacks()
            callbacks = still_due
            if not chunks and not callbacks:
                for flushed in flushes:
                    flushed.set()
                flushes = []
                if stopping:
                    return

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

    def __init__(self, refs: list[Any], single: bool) -> None:
        self._refs = refs
        self._single = single
        self._outcome: tuple[bool, Any] | None = None
        # (callback, error_callback), run by the pool's results handler once all chunks are
        # done; None when there are none.
        self._callbacks: tuple[Any, Any] | None = None

    def _run_callbacks(self) -> None:
        assert self._callbacks is not None
        callback, error_callback = self._callbacks
        try:
            ok, value = self._settle()
            if ok and callback is not None:
                callback(value)
            elif not ok and error_callback is not None:
                error_callback(value)
        except Exception:  # a failing callback must not stop the others
            _logger.exception("a Pool callback raised; the pool carries on")

    def ready(self) -> bool:
        if self._outcome is not None or not self._refs:
            return True
        ready, _ = api.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)

    def wait(self, timeout: float | None = None) -> None:
        if self._refs and self._outcome is None:
            api.wait(self._refs, num_returns=len(self._refs), timeout=timeout)

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
                chunks = api.get(self._refs)
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                self._outcome = (False, _user_error(error))
            else:
                values = list(itertools.chain.from_iterable(chunks))
                failed = next((v for v in values if type(v) is _ItemFailure), None)
                if failed is not None:  # the first item that raised, in input order
                    self._outcome = (False, failed.exception())
                else:
                    self._outcome = (True, values[0] if self._single else values)
        return self._outcome


class IMapIterator(Iterator[Any]):
    """What ``imap``/``imap_unordered`` return; ``next(timeout)`` as in the stdlib. Reads its
    input lazily, keeping a bounded number of chunks in flight (see the module docstring)."""

    def __init__(self, pool: Pool, func: Callable[[Any], Any], items: Iterator[Any],
                 chunksize: int, ordered: bool) -> None:
        self._pool = pool
        self._func = func
        self._func_ref: Any = None  # stored at the first chunk
        self._items = items
        self._chunksize = chunksize
        self._ordered = ordered
        self._in_flight: deque[Any] = deque()  # chunk refs, in input order
        self._most_in_flight = max(1, pool._processes * _IMAP_CHUNKS_IN_FLIGHT_PER_PROCESS)
        self._input_error: BaseException | None = None  # raised where its item would be
        self._input_done = False
        self._buffer: deque[Any] = deque()

    def __iter__(self) -> IMapIterator:
        return self

    def __next__(self) -> Any:
        return self.next()

    def _fill(self) -> None:
        """Read input and submit chunks until enough are in flight or the input ends."""
        while not self._input_done and self._input_error is None \
                and len(self._in_flight) < self._most_in_flight:
            chunk: list[Any] = []
            try:
                for item in self._items:
                    chunk.append(item)
                    if len(chunk) == self._chunksize:
                        break
                else:
                    self._input_done = True
            except Exception as error:  # noqa: BLE001 - raised at its place in the results
                self._input_error = error
            if chunk:
                if self._func_ref is None:
                    self._func_ref = api.put(self._func)
                self._in_flight.extend(self._pool._submit(
                    self._func, "map", [chunk], func_ref=self._func_ref, check=False))

    def next(self, timeout: float | None = None) -> Any:
        if not self._buffer:
            self._fill()
            if not self._in_flight:
                if self._input_error is not None:
                    error, self._input_error = self._input_error, None
                    self._input_done = True
                    raise error
                raise StopIteration
            if self._ordered:
                ready, _ = api.wait([self._in_flight[0]], timeout=timeout)
            else:
                ready, _ = api.wait(list(self._in_flight), num_returns=1, timeout=timeout)
            if not ready:
                raise TimeoutError(f"no result within {timeout} s")
            self._in_flight.remove(ready[0])
            try:
                self._buffer.extend(api.get(ready[0]))
            except BaseException as error:  # noqa: BLE001 - re-raised as the user's type
                raise _user_error(error)  # its __cause__ is the remote traceback
            finally:
                self._fill()  # keep the processes busy while the caller works
        value = self._buffer.popleft()
        if type(value) is _ItemFailure:  # as in Ray: a failed item's result is its error
            return value.exception()
        return value


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[start:start + size] for start in range(0, len(items), size)]


def _check_chunksize(chunksize: Any) -> int:
    if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
        raise ValueError(f"chunksize must be an int >= 1, got {chunksize!r}")
    return chunksize


def _check_callable(func: Any, call: str) -> None:
    if not callable(func):
        raise TypeError(f"Pool.{call}() needs a function to call, got {func!r:.80}")
