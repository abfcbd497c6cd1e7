"""The driver's table of live tasks: who is pending, what code they run, who hears ends.

Owns

* ``tasks``: every task and actor call that was registered and has not ended, by id
  (``TaskSpec``; its state machine is ``scheduler.py``'s: WAITING, READY, DISPATCHED,
  then FINISHED or FAILED, set here by :meth:`TaskTable.end`);
* ``functions``: the pickled code of every function and actor class, by key; it only
  grows, so a submitting thread adds to it without the lock (one ``setdefault``);
* for recursive cancel (``cancel.py``): ``nested_live``, how many live tasks a task
  submitted (0: no search is needed), and ``cancelled_parents``, the running tasks
  cancelled with ``recursive=True``, kept until they end so that a child whose
  submission is still on its way is cancelled when it arrives;
* the task-end listeners (diagnostics) and the records of the tasks that ended since
  they were last told (``unheard``): a listener is called as ``fn(records)`` outside the
  lock, in the thread that applied the ends, in the order they ended; the table pays one
  append per ended task while any listener is registered.

Threads: every method runs with the node's lock held (``node_lock.py``), except
:meth:`TaskTable.add_function`, which is a single atomic ``dict.setdefault``. Tools
(views, the dashboard, invariants) read ``tasks`` under the lock and never change it.

What a task's end does to other parts (its arguments' uses, its stream, the event log)
is the node's, which calls :meth:`TaskTable.end` first.
"""

from __future__ import annotations

from collections.abc import Callable

from lightwork.kernel.events import TaskRecord
from lightwork.kernel.introspect import report_unraisable
from lightwork.engines.local.scheduler import DISPATCHED, FINISHED, TaskSpec

Listener = Callable[[list[TaskRecord]], None]


class TaskTable:
    """The live tasks, the code they run and the listeners of their ends."""

    __slots__ = ("tasks", "functions", "add_function", "nested_live", "cancelled_parents",
                 "listeners", "unheard")

    def __init__(self) -> None:
        self.tasks: dict[int, TaskSpec] = {}
        self.functions: dict[bytes, bytes] = {}
        #: ``add_function(key, blob)``: keep the code of ``key`` (the first blob given
        #: wins). The dict's own ``setdefault``, bound: one atomic call, so a submitting
        #: thread needs no lock for it, and the submit path pays no Python frame.
        self.add_function: Callable[[bytes, bytes], bytes] = self.functions.setdefault
        self.nested_live = 0
        self.cancelled_parents: set[int] = set()
        self.listeners: list[Listener] = []
        self.unheard: list[TaskRecord] = []

    # ------------------------------------------------------------------ tasks
    def add(self, task: TaskSpec) -> None:
        """``task`` is live from now until :meth:`end` or :meth:`discard`."""
        self.tasks[task.task_id] = task
        if task.parent:
            self.nested_live += 1

    def discard(self, task: TaskSpec) -> None:
        """Forget ``task`` without ending it (its submission failed part way)."""
        if self.tasks.pop(task.task_id, None) is not None and task.parent:
            self.nested_live -= 1

    def end(self, task: TaskSpec, state: str) -> bool:
        """``task`` ended in ``state`` (FINISHED or FAILED): it leaves the table. True if
        the listeners must now be told (:meth:`take_unheard`): its record is the first
        they have not heard of."""
        task.state = state
        task.record.state = state
        if self.tasks.pop(task.task_id, None) is not None and task.parent:
            self.nested_live -= 1
        if self.cancelled_parents:
            self.cancelled_parents.discard(task.task_id)
        if self.listeners:
            unheard = self.unheard
            unheard.append(task.record)
            return len(unheard) == 1
        return False

    def end_plain(self, task: TaskSpec) -> None:
        """Plain ``task`` finished while nothing follows ends one by one (``followed``):
        what :meth:`end` comes to for it (its parent is the driver)."""
        task.state = task.record.state = FINISHED
        self.tasks.pop(task.task_id, None)

    def followed(self) -> bool:
        """Whether a task's end must go through :meth:`end` for what this table keeps (a
        cancelled parent's children, a listener)."""
        return bool(self.cancelled_parents or self.listeners)

    # ------------------------------------------------------------------ recursive cancel
    def cancel_children_of(self, running: list[TaskSpec]) -> list[TaskSpec]:
        """Note ``running`` (running tasks or actor calls cancelled with
        ``recursive=True``) in ``cancelled_parents`` and return the live tasks and actor
        calls they submitted, transitively; the running ones found are noted too."""
        self.cancelled_parents.update(task.task_id for task in running)
        if not self.nested_live:
            return []
        children: dict[int, list[TaskSpec]] = {}
        for task in self.tasks.values():
            if task.parent:
                children.setdefault(task.parent, []).append(task)
        found: list[TaskSpec] = []
        frontier = list(running)
        while frontier:
            task = frontier.pop()
            self.cancelled_parents.add(task.task_id)
            for child in children.pop(task.task_id, ()):
                found.append(child)
                if child.state == DISPATCHED:
                    frontier.append(child)
        return found

    def parent_cancelled(self, parent: int) -> bool:
        """Whether a task submitted by ``parent`` must be cancelled on arrival."""
        return bool(self.cancelled_parents) and parent in self.cancelled_parents

    # ------------------------------------------------------------------ listeners
    def add_listener(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def remove_listener(self, listener: Listener) -> list[TaskRecord]:
        """Stop telling ``listener``; return what ended while it listened that nobody
        has told it of yet (the thread that ended them tells after letting go of the
        lock), for the caller to tell it now, or it would never hear of them."""
        if listener not in self.listeners:
            return []
        self.listeners.remove(listener)
        return list(self.unheard)

    def take_unheard(self) -> tuple[list[TaskRecord], tuple[Listener, ...]]:
        """The records not told yet and who to tell, for :func:`tell` outside the lock."""
        ended, self.unheard = self.unheard, []
        return ended, tuple(self.listeners)


def tell(listener: Listener, ended: list[TaskRecord]) -> None:
    """Call ``listener`` with ``ended`` (outside the lock); its error is reported, never
    raised: a diagnostics bug must not stop the runtime."""
    try:
        listener(ended)
    except Exception as exc:  # noqa: BLE001 - a diagnostics bug must not stop the runtime
        report_unraisable(exc, "Exception ignored in lightwork task listener", listener)
