"""Rebuilding lost values by re-running the task that made them (lineage).

What can be lost on one machine: nothing dies with a worker (inline values travel to the
driver's table, large ones are segment files in ``/dev/shm`` that the driver adopts), so
a value is lost only when its segment file vanished, and was neither spilled nor mapped
by the reader already (removed from ``/dev/shm`` by hand, or by a tmpfs clean-up). The loss is noticed where the value
is read: by ``get`` in the driver, or by a worker loading a task's arguments (its task
then comes back with ``("lost", path)`` and waits for the rebuilt value).

What can be rebuilt: the result of a plain task, by re-running it, as long as

* the task may be retried: each rebuild is an attempt counted against ``max_retries``
  (-1: no limit; 0: never rebuilt);
* its by-value arguments were kept: the finished task (``ObjectEntry.lineage``) is kept
  only when they are at most ``LINEAGE_ARGS_MAX`` bytes inline, so lineage never pins
  big arguments in memory (and only for results in segments: an inline result lives in
  the driver's table and cannot be lost, so small results cost nothing here);
* its ref arguments are still in the table (a freed argument is gone for good), and
  each of them is readable or can be rebuilt in turn (recursively, depth first).

What cannot: ``put`` objects and actor results (no task to re-run; an actor's state has
moved on). Those raise ``ObjectLostError``, or ``OwnerDiedError`` when the worker that
created them had died and the driver had adopted them. A task result that cannot be
rebuilt raises ``ObjectReconstructionFailedError`` naming why.

Methods of the Node (a mixin), called with its lock held.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING

from lightwork.kernel import exceptions
from lightwork.kernel import serialization
from lightwork.engines.local.objects import FAILED, PENDING, READY, ObjectEntry
from lightwork.engines.local.scheduler import WAITING, TaskSpec

if TYPE_CHECKING:
    from lightwork.engines.local.node import NodeState
    from lightwork.engines.local.store import SegmentStore

    _Base = NodeState
else:
    _Base = object

LINEAGE_ARGS_MAX = 64 * 1024


def keeps_lineage(task: TaskSpec) -> bool:
    """Whether ``task``'s results can be rebuilt by re-running it (see the module doc)."""
    return (task.max_retries != 0 and not task.actor_id and task.args.path is None
            and task.args.size <= LINEAGE_ARGS_MAX)


def value_vanished(entry: ObjectEntry, store: SegmentStore | None) -> bool:
    """Whether ``entry`` is READY but its value can no longer be read in this process:
    its segment file is gone, not spilled, and not mapped here already."""
    path = entry.path
    if entry.state != READY or path is None:
        return False
    return path not in serialization.MAPS and not file_exists(path, store)


def file_exists(path: str, store: SegmentStore | None) -> bool:
    """Whether a worker can open segment ``path`` (in shared memory, or spilled)."""
    if os.path.exists(path):
        return True
    spill_dir = store.spill_dir if store is not None else None
    return spill_dir is not None and os.path.exists(
        os.path.join(spill_dir, os.path.basename(path)))


class Lineage(_Base):
    """Rebuilding of lost task results; see the module docstring."""

    def recover_lost(self, entry: ObjectEntry) -> None:
        """``entry``'s value vanished: start rebuilding it, or make it fail saying why."""
        if entry.state != READY:
            return
        self._note_vanished(entry)
        error = self._rebuild(entry, set())
        if error is not None:
            for waiter in self.objects.lose(entry, error):
                waiter(entry)

    def recover_lost_argument(self, task: TaskSpec, path: str) -> None:
        """A worker could not load ``task``'s argument at ``path``: rebuild it, re-run after."""
        lost = None
        for object_id in task.deps:
            dep = self.objects.entries.get(object_id)
            # By name: a spilled value's file is found under the spill directory.
            dep_path = dep.path if dep is not None else None
            if dep_path is not None and os.path.basename(dep_path) == os.path.basename(path):
                lost = dep
                break
        if lost is None:  # not one of its ref arguments: its own by-value arguments
            self._fail_task(task, exceptions.ObjectLostError(
                f"{task.task_id:020x}",
                f"the by-value arguments of task {task.name} vanished from shared memory "
                f"({path}) before it ran; nothing can rebuild them. Keep /dev/shm intact "
                "while lightwork runs."))
            return
        self.recover_lost(lost)
        task.state = WAITING
        task.record.dispatched = 0.0
        if lost.state == PENDING:
            task.unready += 1
            # (mypy cannot infer a lambda with a default: the task bound per waiter)
            lost.add_waiter(lambda _e, t=task: self._dep_ready(t))  # type: ignore[misc]
        else:
            self._deps_ready(task)

    def _note_vanished(self, entry: ObjectEntry) -> None:
        if entry.path is not None:
            self.store.forget_lost(entry.path)

    def _rebuild(self, entry: ObjectEntry, visiting: set[int]) -> BaseException | None:
        """Re-submit the task that made ``entry``; return the error if it cannot be."""
        object_id = f"{entry.object_id:020x}"
        task = entry.lineage
        if task is None:
            return self._unrebuildable(entry)
        if task.task_id in self.tasks:  # already being re-run for another of its results
            self.objects.forget_value(entry)
            return None
        why = self._why_not_rebuildable(task, visiting)
        if why:
            return exceptions.ObjectReconstructionFailedError(
                object_id,
                f"object {object_id} (a result of task {task.name}) was lost: its segment "
                f"file vanished from shared memory, and it cannot be rebuilt: {why}.")
        now = time.monotonic()
        task.attempt += 1
        task.state = WAITING
        task.record = dataclasses.replace(
            task.record, submitted=now, attempt=task.attempt, state=WAITING, deps_ready=0.0,
            dispatched=0.0, started=0.0, args_loaded=0.0, finished=0.0, stored=0.0,
            seen=0.0, result_size=0, error=None,
            retries=task.record.retries + ((now, f"rebuilding lost object {object_id}"),))
        released = []
        for return_id in task.return_ids:
            result = self.objects.entries.get(return_id)
            if result is not None and value_vanished(result, self.store):
                self._note_vanished(result)
                released += self.objects.forget_value(result)
        if entry.state == READY:
            released += self.objects.forget_value(entry)
        self.register_task(task, task.args.contained)
        for inner in released:
            self.objects.release_if_unheld(inner)
        return None

    def _why_not_rebuildable(self, task: TaskSpec, visiting: set[int]) -> str:
        if task.max_retries >= 0 and task.attempt >= task.max_retries:
            return (f"its task was already run {task.attempt + 1} time(s), the most its "
                    f"max_retries={task.max_retries} allows; raise max_retries to allow more")
        if task.task_id in visiting:
            return "its arguments depend on it (a cycle in the lineage)"
        visiting.add(task.task_id)
        for dep_id in task.deps:
            dep = self.objects.entries.get(dep_id)
            if dep is None:
                return (f"its argument {dep_id:020x} was freed after the task finished; "
                        "keep a ref to the arguments of results you may need rebuilt")
            if dep.state == FAILED:
                return f"its argument {dep_id:020x} failed: {dep.error}"
            if value_vanished(dep, self.store):
                self._note_vanished(dep)
                error = self._rebuild(dep, visiting)
                if error is not None:
                    self.objects.lose(dep, error)
                    return f"its argument {dep_id:020x} was lost too, and {error}"
        return ""

    def _unrebuildable(self, entry: ObjectEntry) -> BaseException:
        object_id = f"{entry.object_id:020x}"
        what = ("a put() object" if not entry.task_id
                else "an actor call's result or the result of a task that cannot be re-run "
                     "(max_retries=0, or by-value arguments over "
                     f"{LINEAGE_ARGS_MAX // 1024} KB)")
        message = (f"object {object_id} ({what}) was lost: its segment file vanished from "
                   "shared memory, and nothing can rebuild it")
        if entry.orphaned_by:
            return exceptions.OwnerDiedError(
                object_id, f"{message}; its owner, worker {entry.orphaned_by}, had died, so "
                "no process can create it again. Keep /dev/shm intact while lightwork runs.")
        if entry.task_id:
            return exceptions.ObjectReconstructionFailedError(
                object_id, f"{message}. Keep /dev/shm intact while lightwork runs, and give "
                "tasks whose results must survive max_retries > 0.")
        return exceptions.ObjectLostError(
            object_id, f"{message}. Keep /dev/shm intact while lightwork runs.")
