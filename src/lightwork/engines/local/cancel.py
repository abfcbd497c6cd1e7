"""Cancelling tasks: ``cancel()`` wins in every state of a task (Node methods, a mixin).

The states and what a cancel does in each are in :meth:`Cancellation._cancel_ids`'s
docstring; an actor's calls are cancelled by ``actors.py`` (``ActorManager.cancel_call``),
which uses :meth:`Cancellation._fail_returns` too; signalling a worker is the pool's
(``WorkerPool.interrupt``).
Called with the node's lock held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions
from lightwork.engines.local.scheduler import DISPATCHED, READY as TASK_READY, WAITING, TaskSpec

if TYPE_CHECKING:
    from lightwork.engines.local.node import NodeState

    _Base = NodeState
else:
    _Base = object


def cancelled_error(task: TaskSpec, when: str) -> exceptions.TaskCancelledError:
    return exceptions.TaskCancelledError(f"task {task.name} was cancelled with cancel() {when}")


def interrupted_error(task: TaskSpec) -> exceptions.TaskError:
    """A running task the cancel interrupted: as in Ray, its ``get`` raises an error that
    is the task's error and a TaskCancelledError both (``except TaskError`` catches it,
    as ``except RayTaskError`` does in Ray); one cancelled before it started is only a
    TaskCancelledError."""
    cause = cancelled_error(task, "while it ran")
    return exceptions.TaskError(task.name, f"TaskCancelledError: {cause}\n", cause)


class Cancellation(_Base):
    """The node's cancel operations."""

    def _cancel_ids(self, object_ids: list[int], force: bool, recursive: bool = False) -> None:
        """Cancel the tasks making these objects; the cancel wins in every state.

        ``recursive``: a task or actor call that is running may have submitted tasks and
        actor calls from its worker (``TaskSpec.parent``); those still pending or running
        are cancelled too, and theirs in turn, as in Ray: with the same ``force`` for tasks,
        without it for actor calls (Ray ignores it there; given for an actor call itself,
        it raises ValueError before anything is cancelled). No index
        of children is kept (that would cost every nested submission): the tasks table is
        searched, and only while some live task has a parent (``TaskTable.nested_live``).
        A running task cancelled this way stays in ``TaskTable.cancelled_parents`` until it
        ends, so a task it submitted just before the cancel landed is cancelled when its
        submission arrives.

        Waiting or ready: the task fails now. Dispatched to a worker: its id goes to the
        worker's cancel file, then SIGINT (SIGKILL with ``force``) — sent as soon as the
        fork server gives the worker's pid if it has not yet. The worker checks the file
        when a SIGINT came, both in the signal handler (the task running now) and before
        it starts a task, so a cancel landing between dispatch and start is not lost. A
        task queued on its worker behind another cannot have started: its objects fail
        now, and ``force`` never kills the worker (that would kill the task ahead of it).
        """
        tasks = []
        for object_id in object_ids:
            entry = self.objects.entries.get(object_id)
            task = self.tasks.get(entry.task_id) if entry is not None else None
            if task is not None:
                if force and task.actor_id:
                    raise self.actors.force_refused(task)
                tasks.append(task)
        named = len(tasks)
        if recursive:
            running = [task for task in tasks if task.state == DISPATCHED]  # actor calls too
            if running:
                # Remembered even when no nested task is live: a child whose submission
                # is still on its way is cancelled when it arrives (_on_worker_submit).
                tasks.extend(self.task_table.cancel_children_of(running))
        for index, task in enumerate(tasks):
            self._cancel_task(task, force and (index < named or not task.actor_id))

    def _cancel_task(self, task: TaskSpec, force: bool) -> None:
        """Cancel one task (see ``_cancel_ids``)."""
        if task.actor_id:  # an actor's call: see actors.py (force raises there)
            self.actors.cancel_call(task, force)
            return
        if task.cancelled:
            return
        task.cancelled = True
        if task.state == WAITING or (
            task.state == TASK_READY and self.scheduler.remove_ready(task)
        ):
            self._fail_task(task, cancelled_error(task, "before it ran"))
        elif task.worker is not None:
            slot = task.worker
            if slot.inflight and slot.inflight[0] is not task:
                self._fail_returns(task, cancelled_error(task, "while it was queued on a worker"))
                force = False
            conn = self.workers.get(slot.worker_id)
            if conn is not None:
                self.pool.interrupt(conn, task.task_id, force)

    def _fail_returns(self, task: TaskSpec, error: Any) -> None:
        """Fail a task's objects now; the task itself ends when its worker says so."""
        for object_id in task.return_ids:
            entry = self.objects.get(object_id)
            if entry is not None:
                self._resolve(entry, None, error)
