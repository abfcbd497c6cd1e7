"""``get`` and ``wait`` on the distributed backend.

:class:`Fetching` is the backend's ``fetch`` component, with no state of its own: it
reads the backend's object table, and asks ``tasks`` to recover what a lost worker took
with it. In the driver, ``get`` first takes the small results their workers sent it
(``cluster_replies``: it waits for each object's reply or its future, whichever comes
first) and gathers only the others' futures through the client (``timeout`` by
distributed's ``wait`` first). ``wait`` counts done futures with done callbacks and
one event, and a result that came as ready. A future's failure that
is not the user's error (a stored ``Failed``) is turned into lightwork's own error:
cancelled, a worker lost on every try (``WorkerCrashedError``), or the backend's.
A ``get`` of several objects not all done yet fetches them as they finish, so the
first failure ends it at once, as in Ray, instead of after the slowest of the rest
(``_gather_failing_fast``); when all are done it is one gather.

A task lost with its worker and submitted again (``max_retries``, see ``cluster_tasks``)
is not ready while its retry runs, for ``get`` and ``wait`` alike: both start its
recovery when they meet the loss first (it is idempotent), then follow the id's new
future. It is ready, its ``get`` raising ``WorkerCrashedError``, only once its retries
are used up. A future cancelled by the scheduler, not by the program (it forgot a task
whose scattered argument was lost with its worker), is met the same way: ``get`` and
``wait`` have ``tasks.revive`` submit the task again and follow its new future
(``cluster_tasks``, *Large arguments*).

Nested calls
------------
Inside a task, ``get`` and ``wait`` secede from the worker's thread pool while they
block and rejoin after, so a task waiting for its children never holds the slot they
need, even on a cluster of one single-thread worker.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions
from lightwork.kernel.object_ref import ObjectRef, ref_counter
from lightwork.engines.distributed import worker as cluster_worker
from lightwork.engines.distributed.worker import BACKEND, Failed


if TYPE_CHECKING:
    from lightwork.engines.distributed.backend import DistributedBackend


class _WorkerLost(Exception):
    """A fetched task was lost with its worker (``killed``: distributed's KilledWorker)."""

    def __init__(self, killed: BaseException) -> None:
        super().__init__(killed)
        self.killed = killed


class _Revived(Exception):
    """A fetched task that the scheduler forgot with a lost value was submitted again."""


class Fetching:
    """Fetching results: the backend's ``fetch`` component. It keeps no state of its
    own: it reads the backend's object table, and asks ``tasks`` to recover what a lost
    worker took with it."""

    def __init__(self, backend: DistributedBackend) -> None:
        self.backend = backend

    def get(self, ids: list[int], timeout: float | None, callsite: Any = None) -> list[Any]:
        self.backend.check_open()
        if ref_counter._released:
            self.backend._drain()
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        try:
            while True:
                futures = [self.backend.future_of(i) for i in ids]
                early = self._replies(ids, futures, deadline)
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    if early:
                        stored = self._merge(early, futures, left)
                    else:
                        stored = self._blocking(lambda: self._gather(futures, left))
                    break
                except _Revived:  # submitted again: follow the new futures
                    continue
                except _WorkerLost as lost:  # submitted again, unless out of retries
                    self._recover_all(lost.killed, futures)
                    if all(self.backend.futures.get(i) is f for i, f in zip(ids, futures)):
                        raise self._system_error(lost.killed, futures) from None
        finally:
            if self.backend.recorder is not None:
                self.backend.recorder.blocked("get", start, ids, callsite, self.backend.task_ids.get(ids[0], 0))
            output = self.backend.output
            if output is not None:  # the lines the calls printed show before their results
                output.settle()
        return [self.backend.decode(value) for value in stored]

    def _replies(self, ids: list[int], futures: list[Any],
                 deadline: float | None) -> dict[int, Any]:
        """The stored values, by position, of those of ``ids`` whose results their
        workers sent here (``cluster_replies``), once each has come or its future is
        done; empty if none of ``ids`` is awaited so."""
        replies = self.backend.replies
        if replies is None:
            return {}
        task_ids = [self.backend.task_ids.get(i, 0) for i in ids]
        if not any(replies.awaited(t) for t in task_ids):
            return {}
        return replies.take(task_ids, futures, deadline,
                            final=lambda value: type(value) is Failed)

    def came(self, object_id: int) -> bool:
        """Whether ``object_id``'s result was sent here by its worker, so it is ready
        before the scheduler's report (``cluster_replies``)."""
        replies = self.backend.replies
        return replies is not None and replies.came(self.backend.task_ids.get(object_id, 0))

    def _merge(self, early: dict[int, Any], futures: list[Any],
               timeout: float | None) -> list[Any]:
        """The stored values of ``futures``: those in ``early``, and the rest gathered."""
        failed = [value for value in early.values() if type(value) is Failed]
        if failed:  # the first failure ends the get at once, as in _gather_failing_fast
            return failed[:1]
        if len(early) == len(futures):
            return [early[i] for i in range(len(futures))]
        rest = [i for i in range(len(futures)) if i not in early]
        fetched = self._gather([futures[i] for i in rest], timeout)
        if len(fetched) != len(rest):  # a failure among the rest ended it
            return fetched
        values = iter(fetched)
        return [early[i] if i in early else next(values) for i in range(len(futures))]

    def _gather(self, futures: list[Any], timeout: float | None) -> list[Any]:
        from distributed import wait as wait_futures

        try:
            if any(f.key is None for f in futures):
                return self._gather_with_actor_results(futures, timeout)
            if len(futures) > 1 and not all(f.done() for f in futures):
                return self._gather_failing_fast(futures, timeout)
            if timeout is not None:
                wait_futures(futures, timeout=timeout)
            return self.backend.client.gather(futures)
        except TimeoutError:
            still = sum(1 for f in futures if not f.done())
            raise exceptions.GetTimeoutError(
                f"get timed out after {timeout} s: {still} of {len(futures)} object(s) "
                "not ready. Raise the timeout, or use wait() to take the ready ones "
                "first.") from None
        except BaseException as exc:
            from distributed.scheduler import KilledWorker

            if isinstance(exc, KilledWorker):
                raise _WorkerLost(exc) from None
            if isinstance(exc, concurrent.futures.CancelledError) and self.backend.tasks.revive(
                    [f for f in futures if f.key is not None and f.cancelled()]):
                raise _Revived() from None
            raise self._system_error(exc, futures) from None

    def _gather_failing_fast(self, futures: list[Any], timeout: float | None) -> list[Any]:
        """The values of ``futures``, fetched as they finish; the first failed one ends
        it at once: then the list is that failure alone (a stored ``Failed``, which
        ``get`` raises as it decodes), or distributed's error for a future that erred
        (raised by ``gather``, as for one future)."""
        from distributed import wait as wait_futures

        deadline = None if timeout is None else time.monotonic() + timeout
        values: list[Any] = [None] * len(futures)
        pending = list(range(len(futures)))
        client = self.backend.client
        while pending:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            wait_futures([futures[i] for i in pending], timeout=left,
                         return_when="FIRST_COMPLETED")
            done = [i for i in pending if futures[i].done()]
            for i, value in zip(done, client.gather([futures[i] for i in done])):
                if type(value) is Failed:
                    return [value]
                values[i] = value
            fetched = set(done)  # (one that finished since is fetched next round)
            pending = [i for i in pending if i not in fetched]
        return values

    def _recover_all(self, killed: Any, futures: list[Any]) -> None:
        """Recover the task lost with its worker (``killed``: distributed's KilledWorker)
        and every failed one among ``futures`` (those the scheduler plugin's message,
        ``cluster_plugin.TaskErrors``, did not reach first)."""
        from lightwork.engines.distributed.tasks import _losses

        erred = [f.key for f in futures if f.key is not None and f.status == "error"]
        for key in erred or [killed.task]:
            self.backend.tasks.recover(killed.task, key, _losses(killed))

    def _gather_with_actor_results(self, futures: list[Any], timeout: float | None) -> list[Any]:
        from distributed import wait as wait_futures

        deadline = None if timeout is None else time.monotonic() + timeout
        cluster = [f for f in futures if f.key is not None]
        if cluster and timeout is not None:
            wait_futures(cluster, timeout=timeout)
        values = iter(self.backend.client.gather(cluster) if cluster else [])
        return [next(values) if f.key is not None else f.stored(
            None if deadline is None else max(0.0, deadline - time.monotonic()))
            for f in futures]

    def _system_error(self, exc: BaseException, futures: list[Any]) -> BaseException:
        """distributed's failure of a future as lightwork's error."""
        from distributed.scheduler import KilledWorker

        if isinstance(exc, concurrent.futures.CancelledError):
            key = getattr(exc, "key", None) or next(
                (f.key for f in futures if f.cancelled()), "?")
            return exceptions.TaskCancelledError(f"task {key} was cancelled")
        if isinstance(exc, KilledWorker):
            key = exc.args[0] if exc.args else "?"
            return exceptions.WorkerCrashedError(
                f"task {key} was running on a worker that died, on every try its "
                "max_retries allows (each try is allowed-failures + 1 workers: "
                f"{exc.allowed_failures + 1} here). Look at the workers' logs for why they "
                "died (memory limit, a crash in native code); if the task uses too much "
                "memory, give it more with resources or split it")
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return exc
        return exceptions.RuntimeSystemError(
            f"the {BACKEND} backend could not fetch a result: {type(exc).__name__}: {exc}")

    def wait(self, ids: list[int], num_returns: int, timeout: float | None,
             callsite: Any = None) -> list[int]:
        self.backend.check_open()
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        blocked = False
        while True:
            futures = [self.backend.future_of(i) for i in ids]
            settled = [self._settled(i, f) for i, f in zip(ids, futures)]
            if not all(f is self.backend.futures.get(i) for i, f in zip(ids, futures)):
                continue  # a lost task was submitted again: count its new future
            ready = [i for i, was_settled in zip(ids, settled) if was_settled]
            left = None if deadline is None else deadline - time.monotonic()
            if len(ready) >= num_returns or timeout == 0 or (left is not None and left <= 0):
                break
            # A task's Future, an actor call's ActorResult or a stream's ItemSlot; every one
            # not counted above (a callback on one done since runs at once: none is missed).
            # A future that fails in the engine (its worker lost) is not counted: it wakes
            # the loop, which counts it once its retry is decided (see ``_settled``).
            event = threading.Event()
            needed = [num_returns - len(ready)]
            count_lock = threading.Lock()

            def hit(future: Any, event: Any = event, needed: Any = needed,
                    count_lock: Any = count_lock) -> None:
                if getattr(future, "status", None) == "error":
                    event.set()
                    return
                with count_lock:
                    needed[0] -= 1
                    if needed[0] <= 0:
                        event.set()

            for future, was_settled in zip(futures, settled):
                if not was_settled:
                    future.add_done_callback(hit)
            blocked = True
            if not self._blocking(lambda event=event, left=left: event.wait(left)):
                ready = [i for i, f in zip(ids, futures) if self._settled(i, f)]
                break
        if blocked and self.backend.recorder is not None:
            self.backend.recorder.blocked("wait", start, ids, callsite, self.backend.task_ids.get(ids[0], 0))
        output = self.backend.output
        if output is not None:
            output.settle()
        return ready[:num_returns]

    def _settled(self, object_id: int, future: Any) -> bool:
        """Whether ``wait`` counts ``future`` (of ``object_id``) as ready: done, unless it
        failed in the engine because its worker was lost and its task runs again
        (``max_retries``), as Ray keeps a retried task not ready. Then its id has a new
        future (submitted here, if the scheduler plugin's message has not done it yet)."""
        if not future.done():
            return self.came(object_id)
        if self.came(object_id):  # its value is here, whatever became of its worker
            return True
        status = getattr(future, "status", None)
        if status == "cancelled" and future.key is not None:
            # forgotten with a lost value, not cancelled by the program: runs again
            return not self.backend.tasks.revive([future])
        if status != "error":
            return True
        from distributed.scheduler import KilledWorker

        try:
            lost = future.exception()
        except Exception:  # noqa: BLE001 - released meanwhile: get says what happened
            return True
        if isinstance(lost, KilledWorker):
            from lightwork.engines.distributed.tasks import _losses

            self.backend.tasks.recover(lost.task, future.key, _losses(lost))
        return self.backend.futures.get(object_id) is future

    def _blocking(self, call: Any) -> Any:
        """Run ``call``; inside a task, seceded from the worker's pool while it blocks."""
        if self.backend.in_driver or getattr(cluster_worker.current, "task", None) is None:
            return call()
        from distributed import rejoin, secede

        try:
            secede()
        except ValueError:  # an actor's own thread, not the worker's pool: nothing to free
            return call()
        try:
            return call()
        finally:
            rejoin()

    def future(self, ref: ObjectRef) -> concurrent.futures.Future[Any]:
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def fetch() -> None:
            try:
                value = self.get([ref.id], None)[0]
            except BaseException as exc:  # noqa: BLE001 - delivered to the future
                if result.set_running_or_notify_cancel():
                    result.set_exception(exc)
                return
            # The caller may have given up on it (an asyncio.wait_for that timed out
            # cancels the future): a cancelled future takes no result.
            if result.set_running_or_notify_cancel():
                result.set_result(value)

        threading.Thread(target=fetch, daemon=True, name="lightwork-future").start()
        return result
