"""The embedded runtime's side of the run record (``kernel.run.RunRecord``).

``Node`` is the local run's record; this base class answers the record's questions
about the engine's own parts (worker processes and their queues, the scheduler's
resources, the object table and the segment store, the actor manager's deadlock
reports), so the tools read the run through ``RunRecord``'s methods and this module is
the one place where those answers meet the ``Node``'s attributes. It holds no state of
its own; the methods marked "lock held" read the node's state under its lock, and take
none.
"""

from __future__ import annotations

import functools
import itertools
import operator
from typing import Any

from lightwork.kernel.events import TaskRecord
from lightwork.kernel.run import PinnedObjects, RunRecord, StoreFacts
from lightwork.engines.local.objects import PENDING, READY


class _Freed:
    """Stands for the entry of an object already freed: it was ready."""

    state = READY


_ENTRY_STATE = operator.attrgetter("state")
_IS_PENDING = functools.partial(operator.eq, PENDING)


class LocalRecord(RunRecord):
    """``RunRecord``'s engine questions, answered from a ``Node``'s parts."""

    # (set by Node.__init__; named here for the type checker)
    workers: dict[int, Any]
    forkserver: Any
    objects: Any
    store: Any
    scheduler: Any
    actors: Any
    advice_events: Any  # a bounded deque, filled while an advisor runs

    def pending_objects(self, object_ids: list[int]) -> list[int] | None:
        # In C (map, compress): the lock is held while this runs, once a second per page.
        entries = self.objects.entries
        states = map(_ENTRY_STATE, map(entries.get, object_ids, itertools.repeat(_Freed)))
        return list(itertools.compress(object_ids, map(_IS_PENDING, states)))

    def cpu_total(self) -> float:
        return float(self.scheduler.total.get("CPU", 1.0))

    def runtime_pids(self) -> list[int] | None:
        pids = [conn.pid for conn in list(self.workers.values()) if conn.pid]
        server = getattr(self.forkserver, "process", None)
        if server is not None:
            pids.append(server.pid)
        return pids

    def worker_pids(self) -> list[tuple[int, int]]:
        return [(worker_id, conn.pid) for worker_id, conn in self.workers.items() if conn.pid]

    def worker_heads(self, concurrent: bool = True) -> list[Any]:
        heads: list[Any] = []
        for conn in self.workers.values():
            actor = conn.actor
            if actor is not None:
                many = max(1, actor.max_concurrency or 1) if concurrent else 1
                heads.extend(itertools.islice(actor.inflight.values(), many))
            elif conn.slot.inflight:
                heads.append(conn.slot.inflight[0])
        return heads

    def resource_use(self) -> dict[str, list[float]]:
        scheduler = self.scheduler
        return {k: [max(0.0, v - scheduler.available.get(k, 0.0)), v]
                for k, v in scheduler.total.items() if v or k == "CPU"}

    def store_facts(self) -> StoreFacts:
        table = self.objects
        facts = StoreFacts(objects=len(table.entries), shared_memory_bytes=table.bytes_in_segments,
                           freed_objects=table.freed_count)
        store = self.store  # the segment store: budget and spilling
        for key in ("budget", "spilled_bytes", "spilled_total"):  # (StoreFacts keys)
            value = getattr(store, key, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                facts[key] = value
        return facts

    def shared_memory_bytes(self) -> int:
        return int(self.objects.bytes_in_segments)

    def driver_pinned(self, settled_before: float) -> PinnedObjects | None:
        total = count = 0
        by_task: dict[int, int] = {}
        for entry in self.objects.entries.values():
            if entry.path is None or entry.ready_at > settled_before:  # (values in segments)
                continue
            if entry.driver_holds and not (entry.holders or entry.task_uses or entry.containers):
                size = entry.size
                total += size
                count += 1
                by_task[entry.task_id] = by_task.get(entry.task_id, 0) + size
        return PinnedObjects(total, count, by_task)

    def actor_deadlocks(self) -> list[Any]:
        return list(self.actors.deadlocks)

    def add_profile(self, row: list[Any]) -> bool:
        sidecar = self.control
        if sidecar is None:
            return False
        sidecar.add_profile(row)
        return True

    def running_calls(self) -> list[tuple[Any, int, int, bool]]:
        calls = []
        for conn in self.workers.values():
            actor = conn.actor
            if actor is not None:
                if (actor.max_concurrency or 1) > 1:
                    continue  # its calls wait for each other by design (a signal actor)
                tasks = list(actor.inflight.values())[:1]
            else:
                tasks = list(conn.slot.inflight)[:1]
            nested = bool(conn.slot.blocked)
            for task in tasks:
                record = task.record
                if isinstance(record, TaskRecord) and (record.started or record.dispatched):
                    calls.append((record, conn.worker_id, conn.pid or 0, nested))
        return calls

    def store_budget(self) -> int:
        return int(self.store.budget)

    def actor_concurrency(self, actor_id: int) -> int:
        actor = self.actors.actors.get(actor_id)
        return max(1, actor.max_concurrency or 1) if actor is not None else 1

    def note_advice_event(self, event: tuple[Any, ...]) -> None:
        if self.advisor is not None and not self.closed:
            self.advice_events.append(event)

    def take_advice_events(self) -> list[tuple[Any, ...]]:
        events = list(self.advice_events)
        self.advice_events.clear()
        return events

    def worker_infos(self) -> dict[int, dict[str, Any]]:
        infos = {}
        for conn in self.workers.values():
            actor = conn.actor
            infos[conn.worker_id] = {
                "pid": conn.pid,
                "actor_class": actor.class_name if actor is not None else None,
                "actor_id": f"{actor.actor_id:020x}" if actor is not None else None,
                "max_concurrency": (actor.max_concurrency or 1) if actor is not None else 1,
            }
        return infos
