"""How an actor with concurrency runs its calls in a worker: on a thread pool
(``max_concurrency`` > 1: :class:`CallPool`) or, for an async actor, on an event loop of
its own (:class:`AsyncRunner`, whose calls the pool's threads hand over).

Every method of an async actor runs on its loop's one thread, sync ones and the
constructor included, as in Ray: a plain method that sets an ``asyncio.Event`` then wakes
the coroutine awaiting it (set from another thread, the waiter's future would be marked
done without the loop waking up). A sync method blocks the loop while it runs, as in
Ray; ``max_concurrency`` bounds the calls in progress (the pool's threads, each waiting
for one call on the loop).

Once the actor is exiting (``exit_actor()``, ``__ray_terminate__``), calls not yet
started never start: the process ends when the running ones return
(``Worker.begin_exit``), and the driver fails the others with the actor's death.

The worker's main thread keeps reading frames meanwhile (``worker.py``). Threads started
here block SIGINT (:func:`leave_sigint_to_the_main_thread`): a cancel's signal must land
in the main thread, whose handler decides what it interrupts.
"""

from __future__ import annotations

import contextvars
import inspect
import signal
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightwork.engines.local.worker import Worker

#: The frame of the call a coroutine on an async actor's loop belongs to (each asyncio
#: task has its own): ``Worker.current`` reads it there.
COROUTINE_FRAME: contextvars.ContextVar[tuple[Any, ...] | None] = contextvars.ContextVar(
    "lightwork_coroutine_frame", default=None)


def is_async_class(cls: type) -> bool:
    from lightwork.kernel.calls import is_async_method

    return any(is_async_method(member) for _, member in inspect.getmembers(cls, callable))


def leave_sigint_to_the_main_thread() -> None:
    """Block SIGINT in one of lightwork's own threads of a worker (call it first thing).

    A cancel's SIGINT then lands in the main thread, whose sleep or read it interrupts, so
    the handler runs at once. Taken by another thread, it would only flag the main thread,
    which could start (and run) the cancelled call before looking at the flag."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


class CallPool:
    """Runs an actor's calls on ``size`` threads (threaded and async actors)."""

    def __init__(self, worker: Worker, size: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.worker = worker
        self.executor = ThreadPoolExecutor(size, thread_name_prefix="lightwork-actor",
                                           initializer=leave_sigint_to_the_main_thread)

    def submit(self, frame: tuple[Any, ...]) -> None:
        try:
            self.executor.submit(self._run, frame)
        except RuntimeError:  # shut down: the actor is exiting, the call never starts
            pass

    def _run(self, frame: tuple[Any, ...]) -> None:
        worker = self.worker
        if worker.exiting:  # exit_actor() ran meanwhile: later calls fail with its death
            return
        result = worker.execute(frame)
        if worker.exiting:
            worker.send([worker.exit_result(result)])
            worker.begin_exit()
            return
        worker.send([result])


class AsyncRunner:
    """The event loop of an async actor, in its own thread; calls share it.

    Each call's coroutine runs as an asyncio task registered in ``running`` under its
    task id, so ``cancel()`` (the SIGINT handler, ``_on_sigint``) can cancel it on the
    loop: the coroutine gets ``asyncio.CancelledError`` at its next ``await``, as in Ray.
    The task's context carries the call's frame (``Worker.current`` reads it there).
    """

    def __init__(self, worker: Worker, limit: int) -> None:
        import asyncio

        self.worker = worker
        self.limit = limit
        self.running: dict[int, Any] = {}  # task id -> asyncio task
        self._loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run_loop, name="lightwork-actor-loop",
                                       daemon=True)
        self.thread.start()

    def _run_loop(self) -> None:
        leave_sigint_to_the_main_thread()
        self._loop.run_forever()

    def run(self, coroutine: Any, frame: tuple[Any, ...] | None = None) -> Any:
        import asyncio

        if frame is not None:
            coroutine = self._cancellable(coroutine, frame)
        result = asyncio.run_coroutine_threadsafe(_shielded(coroutine), self._loop).result()
        if type(result) is _Raised:
            raise result.exc
        return result

    def call(self, fn: Any, args: Any, kwargs: Any, frame: tuple[Any, ...] | None) -> Any:
        """Call ``fn`` (a method, or the class: the constructor) on the loop's thread and
        await what it returns if that is a coroutine; from another thread."""
        return self.run(_invoke(fn, args, kwargs), frame)

    async def _cancellable(self, coroutine: Any, frame: tuple[Any, ...]) -> Any:
        import asyncio

        task_id = frame[0]
        # The call's frame for code on the loop (Worker.current): the parent of the calls
        # it makes, its task id in get_runtime_context(). Each asyncio task has its own.
        COROUTINE_FRAME.set(frame)
        self.running[task_id] = asyncio.current_task()
        try:
            # Registered first, then checked: a cancel read before the registration is
            # seen here, one read after it finds the task in ``running``.
            if task_id in self.worker.cancelled_ids:
                coroutine.close()
                raise asyncio.CancelledError
            return await coroutine
        finally:
            del self.running[task_id]

    def call_soon(self, callback: Any) -> None:
        self._loop.call_soon_threadsafe(callback)

    def cancel(self, task_ids: set[int]) -> None:
        """Cancel the running coroutines of these calls (from any thread)."""
        for task_id, task in list(self.running.items()):
            if task_id in task_ids:
                self._loop.call_soon_threadsafe(task.cancel)


class _Raised:
    """A ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``), carried out of the loop as a value: raised in a coroutine,
    asyncio would re-raise it out of ``run_forever`` and end the loop's thread, so every
    later call would wait forever. The caller's thread raises it again (``run``)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def _shielded(coroutine: Any) -> Any:
    import asyncio

    try:
        return await coroutine
    except asyncio.CancelledError:
        raise
    except (SystemExit, KeyboardInterrupt) as exc:
        return _Raised(exc)


async def _invoke(fn: Any, args: Any, kwargs: Any) -> Any:
    from lightwork.kernel.generators import DynamicReturns, collect_async

    if type(fn) is DynamicReturns:  # an async generator is drained here, on this loop
        return await collect_async(fn.function(*args, **kwargs))
    result = fn(*args, **kwargs)
    if inspect.iscoroutine(result):
        result = await result
    return result
