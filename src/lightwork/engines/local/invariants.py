"""A debug check of the runtime's bookkeeping: what must hold between any two events.

``violations(node)`` reads the node under its lock and returns one sentence per broken
rule (an empty list when all hold). ``quiet_violations(node)`` adds the rules of a
session with nothing left to do: no task, no object (once the driver dropped its refs),
every CPU free. The chaos suite calls them after each case; they are cheap enough to
call from a debugger or a test at any time, and nothing on the hot path calls them.

Rules:

* every PENDING object has a producer: its task is in ``node.tasks``, or it is an
  actor handle (resolved at creation), so no ``get`` can wait for nothing;
* reference counts are never negative, and no dead worker is still a holder;
* every object that holds a value in a segment points into the session's directory;
* the scheduler's workers are live connections; an idle worker runs nothing; a ready
  task is in ``node.tasks`` and in the ready state;
* no resource is more available than its total.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightwork.engines.local.objects import PENDING, ObjectEntry
from lightwork.engines.local.scheduler import READY as TASK_READY

if TYPE_CHECKING:
    from lightwork.engines.local.node import Node

_EPS = 1e-6


def violations(node: Node) -> list[str]:
    """The broken rules (see the module docstring), one sentence each."""
    problems: list[str] = []
    with node.lock:
        live_workers = {wid for wid, conn in node.workers.items() if not conn.dead}
        for object_id, entry in node.objects.entries.items():
            name = f"object {object_id:020x}"
            if entry.state == PENDING and entry.task_id not in node.tasks \
                    and object_id not in node.objects.actor_handles:
                problems.append(f"{name} is PENDING but its task {entry.task_id:x} is gone")
            if entry.task_uses < 0 or entry.containers < 0:
                problems.append(f"{name} has negative counts (task_uses={entry.task_uses}, "
                                f"containers={entry.containers})")
            for holder in entry.holders or ():
                if holder not in live_workers:
                    problems.append(f"{name} is still held by dead worker {holder}")
            path = entry.path
            if path is not None and not path.startswith(node.session.shm_dir):
                problems.append(f"{name} has a segment outside the session: {path}")
        scheduler = node.scheduler
        for worker_id, slot in scheduler.workers.items():
            if worker_id not in live_workers:
                problems.append(f"the scheduler still places work on dead worker {worker_id}")
        for worker_id, slot in [*scheduler.idle.items(), *scheduler.idle_gpu.items()]:
            if slot.inflight:
                problems.append(f"idle worker {worker_id} has {len(slot.inflight)} task(s)")
        for queue in scheduler.ready.values():
            for task in queue:
                if task.task_id not in node.tasks or task.state != TASK_READY:
                    problems.append(f"ready task {task.name} ({task.task_id:x}) is in state "
                                    f"{task.state} or unknown to the node")
        for resource, amount in scheduler.available.items():
            total = scheduler.total.get(resource, 0.0)
            if amount > total + _EPS:
                problems.append(f"{amount:g} {resource} available of {total:g} in total")
    return problems


def quiet_violations(node: Node) -> list[str]:
    """``violations`` plus the rules of a session with nothing left to do."""
    problems = violations(node)
    with node.lock:
        if node.tasks:
            names = sorted({task.name for task in node.tasks.values()})[:5]
            problems.append(f"{len(node.tasks)} task(s) still known: {', '.join(names)}")
        if node.objects.entries:
            some = [describe_holds(entry) for entry in list(node.objects.entries.values())[:3]]
            problems.append(f"{len(node.objects.entries)} object(s) still in the table, "
                            f"e.g. {'; '.join(some)}")
        for resource, total in node.scheduler.total.items():
            available = node.scheduler.available.get(resource, 0.0)
            if abs(available - total) > _EPS:
                problems.append(f"only {available:g} of {total:g} {resource} available")
    return problems


def describe_holds(entry: ObjectEntry) -> str:
    """What keeps ``entry`` in the table, in one line."""
    reasons = []
    if entry.driver_holds:
        reasons.append("a driver ref")
    if entry.holders:
        reasons.append(f"workers {sorted(entry.holders)}")
    if entry.task_uses:
        reasons.append(f"{entry.task_uses} task use(s)")
    if entry.containers:
        reasons.append(f"{entry.containers} container(s)")
    if entry.stream_pinned:
        reasons.append("a generator stream (item not read yet)")
    state = {0: "PENDING", 1: "READY", 2: "FAILED"}.get(entry.state, str(entry.state))
    return (f"{entry.object_id:020x} ({state}, task {entry.task_id:x}) held by "
            f"{', '.join(reasons) or 'nothing'}")
