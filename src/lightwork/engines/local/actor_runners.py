"""How an actor with concurrency runs its calls in a worker: on a thread pool
(``max_concurrency`` > 1: :class:`CallPool`) or, for an async actor, as coroutines on an
event loop of its own (:class:`AsyncRunner`, whose calls the pool's threads hand over).

The worker's main thread keeps reading frames meanwhile (``worker.py``). Threads started
here block SIGINT (:func:`leave_sigint_to_the_main_thread`): a cancel's signal must land
in the main thread, whose handler decides what it interrupts.
"""

from __future__ import annotations

import contextvars
import inspect
import os
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
    return any(
        inspect.iscoroutinefunction(member) for _, member in inspect.getmembers(cls, callable)
    )


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
        self.executor.submit(self._run, frame)

    def _run(self, frame: tuple[Any, ...]) -> None:
        worker = self.worker
        result = worker.execute(frame)
        worker.send([result])
        if worker.exiting:
            os._exit(0)


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
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

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

    def cancel(self, task_ids: set[int]) -> None:
        """Cancel the running coroutines of these calls (from any thread)."""
        for task_id, task in list(self.running.items()):
            if task_id in task_ids:
                self._loop.call_soon_threadsafe(task.cancel)
