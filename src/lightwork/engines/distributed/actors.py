"""Actors on the distributed backend: each lightwork actor lives in a distributed actor.

``create_actor`` submits :class:`ActorHost` with ``actor=True``: distributed builds it on
one worker and keeps it in that worker's memory, and calls reach it directly from the
caller (not through the scheduler). Distributed runs every actor method of a worker on
one shared thread, so the host's only method, :meth:`ActorHost.call`, is a coroutine
(distributed runs it on the worker's event loop) that hands the user's method to the
actor's *own* thread pool (``max_concurrency`` threads) or, for an async actor, to its own
event loop thread: two actors on one worker run at the same time, and a slow method never
blocks the worker's loop.

Order: distributed sends each call as its own message and may deliver them out of
order, so every call carries ``(caller, seq)``; the host starts a caller's calls in
``seq`` order (a call waits on the loop for its turn) and, with one thread, runs them in
that order too.

Results: a call's result comes back to its caller (it is not a cluster key); the caller's
side (``cluster_actor_calls``) maps the call's ref to an ``ActorResult``. Errors are
values, as for tasks (``cluster_worker.Failed``); a constructor that raised makes every
call fail with ``ActorDiedError`` carrying its traceback. A result with refs inside is
handed over to its caller (``cluster_holds.Handover``). Each call is stamped into the
event log from the actor's side (``cluster_record.note``, with the call's task id): actor
calls bypass the scheduler. A restart (``max_restarts``) builds a new host from the same
header on another worker (see ``cluster_actor_calls``); its call order starts afresh.

An async actor runs every method on its loop's thread, sync ones and its constructor
included, as in Ray (a sync method that sets an ``asyncio.Event`` wakes the coroutine
awaiting it). ``exit_actor()`` and ``__ray_terminate__`` end the actor inside its host
(``request_exit``): the worker process is shared, so it stays, and the actor's atexit
handlers do not run; the call that exited fails with ``ActorDiedError`` (the one that
called ``__ray_terminate__`` returns), every later call fails naming why, and
``__ray_shutdown__()`` runs once, as it does when distributed drops the host
(``__del__``: no handle left).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import sys
import threading
import traceback
import weakref
import time
import types
from typing import Any

import cloudpickle

from lightwork.kernel import debugger, exceptions
from lightwork.kernel.calls import actor_method, built_in_method
from lightwork.kernel.generators import (
    DYNAMIC_METHOD,
    STATIC_METHOD,
    DynamicReturns,
    GeneratorRaised,
    StaticItems,
    StaticReturns,
    collect_async,
    take_static,
)
from lightwork.kernel.object_ref import ref_counter
from lightwork.engines.distributed import output as cluster_output
from lightwork.engines.distributed import record as cluster_record
from lightwork.engines.distributed import worker as cluster_worker
from lightwork.engines.distributed.debugging import CALL as _DEBUG_CALL
from lightwork.engines.distributed.holds import Handover
from lightwork.kernel.serialization import SerializationError
from lightwork.engines.distributed.worker import (
    ArgSlot,
    Failed,
    WithRefs,
    current,
    error_of,
    spread_failure,
    stored_size,
)

ASYNC_DEFAULT_CONCURRENCY = 1000


class ActorHost:
    """One lightwork actor inside a distributed actor (see the module docstring)."""

    def __init__(self, header: tuple[Any, ...], *dep_values: Any) -> None:
        actor_id, class_name, blob, payload, keys, max_concurrency, is_async, session = header
        self.actor_id = actor_id
        self.session = session  # its driver's: tags its calls' stamps (cluster_record)
        self.class_name = class_name
        self.backend = backend = cluster_worker.worker_backend()
        # The worker's client, found now (in the worker's task thread): the actor's own
        # threads cannot find it, and its methods may put, submit or get.
        backend.client  # noqa: B018
        self.init_error: Failed | None = None
        self.instance: Any = None
        backend.adopt(keys)
        self.next_seq: dict[str, int] = {}
        self.turns: dict[tuple[str, int], asyncio.Event] = {}
        self.is_async = is_async
        # Why the actor ended inside this host (exit_actor(), __ray_terminate__), else "";
        # the call that asked for it (``_CALL``), whose caller sees the death.
        self.exit_reason = ""
        self.exit_call: Any = None
        self._running: set[Any] = set()  # the _CALL tokens of an async actor's running calls
        self._shut_down = False
        slots = max_concurrency or (ASYNC_DEFAULT_CONCURRENCY if is_async else 1)
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        if is_async:  # its own loop, in its own thread: never the worker's
            self.loop = asyncio.new_event_loop()
            self.limit = asyncio.Semaphore(slots)
            threading.Thread(target=_run_until_stopped, args=(self.loop,), daemon=True,
                             name=f"lightwork-actor-{class_name}").start()
        else:
            self.executor = concurrent.futures.ThreadPoolExecutor(
                slots, thread_name_prefix=f"lightwork-actor-{class_name}")
        previous = getattr(current, "session", 0)
        current.session = session  # what the constructor borrows or makes is its session's
        try:
            args, kwargs = _load_args(backend, payload, dep_values)
            cls = cloudpickle.loads(blob)
            if self.loop is not None:  # on the loop, as in Ray: it may start asyncio tasks
                self.instance = asyncio.run_coroutine_threadsafe(
                    self._construct(cls, args, kwargs), self.loop).result()
            else:
                self.instance = self._construct_here(cls, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - every call will say the actor died of it
            self.init_error = error_of(f"{class_name}.__init__", exc)
        finally:
            current.session = previous
        if self.init_error is None and self.exit_reason:  # exit_actor() in the constructor
            self.exit_reason = f"{exceptions.USER_EXIT} while it was being created"
            self._shutdown_once()

    def _construct_here(self, cls: Any, args: Any, kwargs: Any) -> Any:
        current.host = weakref.ref(self)
        try:
            return cls(*args, **kwargs)
        except SystemExit:
            if not self.exit_reason:
                raise
            return None
        finally:
            current.host = None

    async def _construct(self, cls: Any, args: Any, kwargs: Any) -> Any:
        # The loop runs only this actor. Weakly: the loop thread's locals must not keep the
        # host (and so the loop) alive once distributed drops it (``__del__``).
        current.session, current.host = self.session, weakref.ref(self)
        try:
            return cls(*args, **kwargs)
        except exceptions.AsyncioActorExit:
            return None

    def request_exit(self, reason: str) -> None:
        """``exit_actor()`` (or ``__ray_terminate__``) in this actor: later calls fail, the
        calling one's caller sees the death, ``__ray_shutdown__()`` runs once."""
        if not self.exit_reason:
            self.exit_reason = reason
            self.exit_call = _CALL.get()
        if self.exit_call not in self._running and self.loop is not None:
            # From an asyncio task of its own (which may carry the token of the call that
            # started it, long returned): no call ends with it, so the hook runs now.
            self.loop.call_soon_threadsafe(self._shutdown_once)

    def _died_here(self, name: str, num_returns: int) -> Any:
        """The result of a call made after the actor ended in this host."""
        died = exceptions.ActorDiedError(
            f"actor {self.class_name} cannot run {name}. The actor is dead because "
            f"{self.exit_reason}. Calls made after an actor's death fail; create a new actor.")
        return spread_failure(Failed(died), num_returns)

    def _exit_outcome(self, name: str, num_returns: int, token: Any) -> Any:
        """The result of the call that called ``exit_actor()`` (``token``: its ``_CALL``),
        whatever it returned or raised; None for any other call."""
        if token is not self.exit_call or not self.exit_reason or self.exit_reason == TERMINATED:
            return None
        self._shutdown_once()
        died = exceptions.exit_actor_called(self.class_name, name)
        return spread_failure(Failed(died), num_returns)

    def _shutdown_once(self) -> None:
        """Call the user's ``__ray_shutdown__()`` once (a coroutine is run on the loop)."""
        if self._shut_down or self.instance is None:
            return
        self._shut_down = True
        hook = getattr(self.instance, "__ray_shutdown__", None)
        if not callable(hook):
            return
        try:
            result = hook()
            if asyncio.iscoroutine(result):
                assert self.loop is not None  # (only an async actor has coroutine methods)
                on_loop = host_here() is self and self.is_async
                if on_loop:  # it cannot wait for itself: runs next on the loop
                    self.loop.create_task(result)
                else:
                    asyncio.run_coroutine_threadsafe(result, self.loop).result()
        except Exception:  # noqa: BLE001 - logged, as in Ray; the actor ends all the same
            print(f"lightwork: {self.class_name}.__ray_shutdown__() raised:", file=sys.stderr)
            traceback.print_exc()

    def __del__(self) -> None:
        """Distributed dropped the actor (killed, or no process holds a handle): its
        threads end too (a pool's idle threads would, once it is collected; an async
        actor's loop runs until stopped), after ``__ray_shutdown__()``.

        A kill ends it the same way here (distributed cancels the key and drops the host
        alike, and the worker process is shared): unlike Ray's ``kill``, which skips the
        hook, it runs."""
        if getattr(self, "instance", None) is not None and not self._shut_down:
            self._shutdown_once()
        loop = getattr(self, "loop", None)
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
        executor = getattr(self, "executor", None)
        if executor is not None:
            executor.shutdown(wait=False)

    async def call(self, caller: str, seq: int, method: str, name: str, payload: bytes,
                   keys: dict[int, str] | None, num_returns: int, task_id: int = 0,
                   caller_client: str = "") -> Any:
        """Run one method call in its caller's order; returns its stored result(s)
        (``caller_client``: the id of the caller's distributed client, which takes over
        the refs inside the result, see ``cluster_holds``)."""
        if self.next_seq.get(caller, 0) != seq:
            turn = self.turns.setdefault((caller, seq), asyncio.Event())
            await turn.wait()
        try:
            if self.init_error is not None:
                died = exceptions.ActorDiedError(
                    f"actor {self.class_name} died in its constructor:\n"
                    f"{self.init_error.error}")
                return spread_failure(Failed(died), num_returns)
            if self.exit_reason:
                return self._died_here(name, num_returns)
            if self.is_async:
                assert self.loop is not None
                running = asyncio.run_coroutine_threadsafe(
                    self._run_async(method, name, payload, keys, num_returns, task_id,
                                    caller_client), self.loop)
            else:
                assert self.executor is not None
                running = self.executor.submit(
                    self._run, method, name, payload, keys, num_returns, task_id,
                    caller_client)
        finally:  # the next call of this caller may start now
            self.next_seq[caller] = seq + 1
            successor = self.turns.pop((caller, seq + 1), None)
            if successor is not None:
                successor.set()
        return await asyncio.wrap_future(running)

    def _run(self, method: str, name: str, payload: bytes, keys: Any, num_returns: int,
             task_id: int, caller_client: str) -> Any:
        started = time.time()
        previous = getattr(current, "task", None), getattr(current, "session", 0)
        current.task, current.session = (0, name, {}), self.session
        current.host = weakref.ref(self)
        token = object()
        _CALL.set(token)
        _DEBUG_CALL.set((task_id, name, self.session))  # (this pool thread's next call resets it)
        try:
            self.backend.adopt(keys)
            args, kwargs = cluster_worker.load_arguments(payload)
            loaded = time.time()
            try:
                result = self._method(method)(*args, **kwargs)
            except GeneratorRaised as raised:  # a dynamic generator's error, mid-way
                result = raised.with_traceback(None)  # (no cycle through this frame)
            result, failure = self._call_result(result, name, num_returns, task_id, started)
            if failure is not None:
                return failure
        except Exception as exc:  # noqa: BLE001 - the user's error is the call's result
            if debugger.post_mortem_on():  # init(post_mortem=True): pause where it raised
                debugger.post_mortem(exc)
            self._note(task_id, name, started, exc)
            return self._exit_outcome(name, num_returns, token) or spread_failure(
                error_of(name, exc), num_returns)
        except SystemExit as exc:  # exit_actor(), or the user's sys.exit(): never the pool's
            self._note(task_id, name, started, exc)
            return self._exit_outcome(name, num_returns, token) or spread_failure(
                error_of(name, exc), num_returns)
        finally:
            current.task, current.session, current.host = previous + (None,)
            if cluster_output.pending:  # what it printed, before the reply
                cluster_output.end_call(task_id)
            self.backend.confirm_borrows()  # before the reply (see there)
        if self.exit_reason and token is self.exit_call:  # it ended the actor
            exited = self._exit_outcome(name, num_returns, token)
            if exited is not None:
                return exited
            self._shutdown_once()  # __ray_terminate__: it returns None, after the hook
        finished = time.time()
        stored = self._store(name, result, num_returns, caller_client)
        del result  # this process's own refs to what is inside go now: the result's
        if ref_counter._released:  # holds keep those objects (cluster_holds)
            self.backend._drain()
        cluster_record.note(self.session, task_id, name, self.actor_id, started, loaded, finished,
                            time.time(), None, (), _result_size(stored, num_returns))
        return stored

    async def _run_async(self, method: str, name: str, payload: bytes, keys: Any,
                         num_returns: int, task_id: int, caller_client: str) -> Any:
        # This loop's thread runs only this actor's calls (the host weakly: see _construct).
        current.session, current.host = self.session, weakref.ref(self)
        token = object()
        _CALL.set(token)  # (this call's asyncio task has a context of its own)
        _DEBUG_CALL.set((task_id, name, self.session))
        async with self.limit:
            started = time.time()
            self._running.add(token)
            try:
                self.backend.adopt(keys)
                args, kwargs = cluster_worker.load_arguments(payload)
                loaded = time.time()
                try:
                    if method.startswith(DYNAMIC_METHOD):  # drained on this loop (not a new one)
                        result = actor_method(self.instance, method[len(DYNAMIC_METHOD):])(
                            *args, **kwargs)
                        result = await collect_async(result)
                    else:
                        result = self._method(method)(*args, **kwargs)
                    if asyncio.iscoroutine(result):
                        result = await result
                except GeneratorRaised as raised:  # a dynamic generator's error, mid-way
                    result = raised.with_traceback(None)  # (no cycle through this frame)
                result, failure = self._call_result(result, name, num_returns, task_id,
                                                    started)
                if failure is not None:
                    return failure
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - SystemExit would end the loop
                if not isinstance(exc, SystemExit) and debugger.post_mortem_on():
                    debugger.post_mortem(exc)
                self._note(task_id, name, started, exc)
                return self._exit_outcome(name, num_returns, token) or spread_failure(
                    error_of(name, exc), num_returns)
            finally:
                self._running.discard(token)
                if cluster_output.pending:  # what it printed, before the reply
                    cluster_output.end_call(task_id)
                # Before the reply (see there); a moment of this actor's loop, only
                # when the call borrowed refs.
                self.backend.confirm_borrows()
        if self.exit_reason and token is self.exit_call:  # it ended the actor
            exited = self._exit_outcome(name, num_returns, token)
            if exited is not None:
                return exited
            self._shutdown_once()  # __ray_terminate__: it returns None, after the hook
        finished = time.time()
        stored = self._store(name, result, num_returns, caller_client)
        del result
        if ref_counter._released:
            self.backend._drain()
        cluster_record.note(self.session, task_id, name, self.actor_id, started, loaded, finished,
                            time.time(), None, (), _result_size(stored, num_returns))
        return stored

    def _method(self, method: str) -> Any:
        if method == "__ray_terminate__":
            return self._terminate
        if method.startswith(DYNAMIC_METHOD):  # num_returns="dynamic": items stored as put
            return DynamicReturns(actor_method(self.instance, method[len(DYNAMIC_METHOD):]))
        if method.startswith(STATIC_METHOD):  # a generator method called with num_returns=1
            return StaticReturns(actor_method(self.instance, method[len(STATIC_METHOD):]))
        try:
            return actor_method(self.instance, method)
        except AttributeError:
            built_in = built_in_method(self.instance, method)  # __ray_ready__, __ray_call__
            if built_in is None:
                raise
            return built_in

    def _call_result(self, result: Any, name: str, num_returns: int, task_id: int,
                     started: float) -> tuple[Any, Any]:
        """What a method returned (or the ``GeneratorRaised`` its dynamic generator
        raised) as the call's ``(result, failure)``: a generator method's first
        ``num_returns`` items are its result; a generator that raised before it filled
        its returns fails the call (``failure``: the stored items, then the error), or,
        a dynamic one, has its refs with the error last as its result. One helper for
        the thread-pool and the event-loop paths."""
        if type(result) is GeneratorRaised:
            raised = result
        elif type(result) is StaticItems or (
                num_returns != 1 and type(result) is types.GeneratorType):
            try:
                return _static_result(result, num_returns, name), None
            except GeneratorRaised as caught:
                raised = caught.with_traceback(None)  # (no cycle through this frame)
        else:
            return result, None
        failure = self._generator_raised(raised, name, num_returns, task_id, started)
        return (raised.partial if failure is None else None), failure

    def _generator_raised(self, raised: GeneratorRaised, name: str, num_returns: int,
                          task_id: int, started: float) -> Any:
        """A generator method raised before it filled its returns: None when its result
        is ``raised.partial`` (a dynamic one's refs, the error last), else the stored
        result: the items it yielded, then the error for each return left."""
        if type(raised.partial) is not list:
            return None
        self._note(task_id, name, started, raised.error)
        failed = error_of(name, raised.error)
        try:
            kept = tuple(self.backend.encode(part) for part in raised.partial)
        except SerializationError:
            kept = ()
        if not kept:
            return spread_failure(failed, num_returns)
        return kept + (failed,) * (num_returns - len(kept))

    def _terminate(self) -> None:
        self.request_exit(TERMINATED)

    def _note(self, task_id: int, name: str, started: float, exc: BaseException) -> None:
        now = time.time()
        cluster_record.note(self.session, task_id, name, self.actor_id, started, now, now, now,
                            cluster_record.error_text(exc))

    def _store(self, name: str, result: Any, num_returns: int, caller_client: str) -> Any:
        if num_returns == 0:
            return None
        if num_returns == 1:
            stored: Any = self.backend.encode(result)
            parts: tuple[Any, ...] = (stored,)
        else:
            parts = tuple(result) if isinstance(result, (tuple, list)) else ()
            if len(parts) != num_returns:
                exc = ValueError(f"{name} has num_returns={num_returns} but returned "
                                 f"{result!r:.80}")
                return spread_failure(error_of(name, exc), num_returns)
            stored = parts = tuple(self.backend.encode(part) for part in parts)
        # Refs inside: handed over to the caller through the scheduler (cluster_holds),
        # so this process's own refs may go as soon as the call returns.
        inner = [key for part in parts if type(part) is WithRefs for key in part.keys.values()]
        if inner:
            return self.backend.holds.hand_over_result(stored, list(dict.fromkeys(inner)),
                                                 caller_client)
        return stored


def _static_result(items: Any, num_returns: int, name: str) -> Any:
    """A generator method's first ``num_returns`` items, as a call's result."""
    values = take_static(items, num_returns, name)
    return values[0] if num_returns == 1 else values


def _result_size(stored: Any, num_returns: int) -> int:
    """The event log's result size of a call's stored result (a handed-over one's inside)."""
    return stored_size(stored.stored if type(stored) is Handover else stored, num_returns)


def host_here() -> ActorHost | None:
    """The actor whose method (or asyncio task, on its loop) runs in this thread."""
    ref = getattr(current, "host", None)
    return ref() if ref is not None else None


#: The call running in this context (a token per call: each thread of the pool, and each
#: asyncio task on the loop, has its own), so ``request_exit`` knows which call exited.
_CALL: contextvars.ContextVar[Any] = contextvars.ContextVar("lightwork_actor_call", default=None)
TERMINATED = "it was terminated with __ray_terminate__"




def _run_until_stopped(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_forever()
    loop.close()


def _load_args(backend: Any, payload: bytes, dep_values: tuple[Any, ...]) -> tuple[list, dict]:
    args, kwargs = cluster_worker.load_arguments(payload)
    if dep_values:
        values = [backend.decode(value) for value in dep_values]
        args = [values[a.index] if type(a) is ArgSlot else a for a in args]
        kwargs = {k: values[v.index] if type(v) is ArgSlot else v for k, v in kwargs.items()}
    return list(args), kwargs
