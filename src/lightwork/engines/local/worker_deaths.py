"""A worker process that ends: retired after ``max_calls``, or dead (Node methods, a mixin).

A worker is dead when its socket closes (:meth:`WorkerDeaths._on_worker_eof`); the fork
server's ``EXITED`` (read by the pool: ``WorkerPool.read_control``) gives its wait status,
awaited for at most ``EXIT_STATUS_GRACE_S``, so the error names the exit code or signal.
The pool owns the connection (``WorkerPool.forget`` drops it); this mixin coordinates
what its end does to the scheduler, the tasks, the objects and the actors. Then its running task is retried
(``max_retries``) or fails with ``WorkerCrashedError``, its queued tasks go back to the
queue, what it borrowed is released, and the objects it owned are adopted by the driver
(their values never lived only in the worker). An actor's worker is the actor manager's
to handle (``ActorManager.on_worker_death``). Called with the node's lock held.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from lightwork.kernel import exceptions
from lightwork.engines.local.cancel import cancelled_error
from lightwork.engines.local.memory_monitor import OOM_REASON, handle_oom_death
from lightwork.engines.local.scheduler import TaskSpec

if TYPE_CHECKING:
    from lightwork.engines.local.node import NodeState, WorkerConn

    _Base = NodeState
else:
    _Base = object

EXIT_STATUS_GRACE_S = 1.0  # how long a closed socket waits for the fork server's EXITED


class WorkerDeaths(_Base):
    """What the node does when a worker process ends."""

    def _retire_worker(self, conn: WorkerConn) -> None:
        """The worker ran a ``max_calls`` function's last call and is exiting
        (``calls.CallLimit``): what it was sent after that call will not run there, so
        it goes back to the queue, and a new worker takes the slot. Its end of file then
        finds no task on it: an expected exit, not a crash."""
        for task in self.scheduler.remove_worker(conn.slot):
            if task.cancelled:
                self._fail_task(task, cancelled_error(task, "before it ran"))
            else:
                self._requeue(task)
        if len(self.scheduler.workers) < max(1, int(self.scheduler.total.get("CPU", 1.0))):
            self.pool.start()

    def _read_forkserver(self) -> bool:
        """The fork server sent news (its pids and exit statuses: ``WorkerPool``): finish
        the deaths it completes. False if the fork server is gone: the runtime fails,
        saying why, once the lock is let go."""
        ended = self.pool.read_control()
        if ended is None:
            if not self.closed:
                reason = self.pool.gone_reason()
                self.io.defer(lambda: self.fail_runtime(reason))
            return False
        for conn in ended:  # their exit status came after their socket closed
            self._finish_worker_death(conn)
        if self.pool.background_done:  # the first workers, now that nothing is missing
            self.pool.background_done = False
            if not self.scheduler.workers and not self.closed:
                try:
                    for _ in range(max(1, int(self.scheduler.total.get("CPU", 1.0)))):
                        self.pool.start()
                except exceptions.RuntimeSystemError as exc:
                    reason = str(exc)
                    self.io.defer(lambda: self.fail_runtime(reason))
                    return False
        return True

    def _on_worker_eof(self, conn: WorkerConn) -> None:
        if conn.eof_at:
            return
        conn.eof_at = time.monotonic()
        self.io.unwatch_worker(conn)
        conn.sock.close()
        if conn.exit_status is not None:
            self._finish_worker_death(conn)
        else:
            self.io.add_timer(EXIT_STATUS_GRACE_S, lambda: self._finish_worker_death(conn))

    def _finish_worker_death(self, conn: WorkerConn) -> None:
        if conn.dead:
            return
        self.pool.forget(conn)
        if self.pauses:
            self._end_pauses(conn)
        self.store.forget_worker(conn.worker_id)
        if conn.actor is not None:
            self.actors.on_worker_death(conn, describe_exit(conn.exit_status))
        else:
            tasks = self.scheduler.remove_worker(conn.slot)
            for task in tasks[1:]:
                if task.cancelled:
                    self._fail_task(task, cancelled_error(task, "before it ran"))
                else:
                    self._requeue(task)
            if tasks:
                self._on_task_crashed(tasks[0], conn)
        for object_id in conn.holds | conn.owned:
            entry = self.objects.entries.get(object_id)
            if entry is None:
                continue
            entry.discard_holder(conn.worker_id)
            if entry.owner == conn.worker_id:
                # Its bytes are in the driver's table (inline) or in /dev/shm, not in the
                # dead process: the driver adopts it instead of losing it.
                entry.owner = 0
                entry.orphaned_by = conn.worker_id
            self.objects.release_if_unheld(entry)

    def _on_task_crashed(self, task: TaskSpec, conn: WorkerConn) -> None:
        self._release_gpus(task.task_id)
        how = describe_exit(conn.exit_status)
        if conn.oom_kill:
            how = f"{OOM_REASON} ({how})"
        task.record.retries += ((time.monotonic(), f"worker crashed: {how}"),)
        if task.cancelled:
            self._fail_task(task, exceptions.TaskCancelledError(
                f"task {task.name} was cancelled (force=True killed its worker)"))
        elif conn.oom_kill:
            handle_oom_death(self, task, conn)
        elif task.max_retries < 0 or task.attempt < task.max_retries:
            task.attempt += 1
            self._requeue(task)
        else:
            self._fail_task(task, exceptions.WorkerCrashedError(
                f"the worker process (pid {conn.pid}) running task {task.name} died: {how}. "
                f"The task was tried {task.attempt + 1} time(s) (max_retries={task.max_retries}). "
                f"Check the worker's output above for a traceback{crash_hint(conn.exit_status)}."))


def crash_hint(status: int | None) -> str:
    """A likely cause worth naming for this wait status, as a clause (or "")."""
    if status is not None and os.waitstatus_to_exitcode(status) == -signal.SIGKILL:
        return ("; a SIGKILL often means the machine ran out of memory (the kernel's "
                "out-of-memory killer), unless a person or program killed it")
    return ""


def describe_exit(status: int | None) -> str:
    if status is None:
        return "its exit status is unknown (the process closed its connection)"
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"it was killed by signal {-code} ({name})"
    return f"it exited with code {code} (sys.exit or os._exit in the task, or a native crash)"
