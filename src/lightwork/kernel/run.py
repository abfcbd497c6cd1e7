"""The run's record: what every engine keeps of a session for the diagnostics.

Each engine's driver keeps one record of its run (the local engine's ``Node``, whose
side of this interface is ``engines/local/record.py``; the cluster engine's
``ClusterLog``), and the tools (``state``, ``diagnostics/``, ``dashboard/``, ``dask/``)
read a run only through it, never through an engine's own objects. The record holds, as
attributes:

* ``session`` (``name``, ``directory``), ``log`` (the :class:`~lightwork.kernel.events.
  EventLog`), ``lock`` (guarding the log and the task table), ``tasks`` (live tasks by
  id), ``actors`` (``actors.actors``: live actors by id), ``closed``;
* ``advisor`` (the live advisor, or None), ``control`` (the control server, or None),
  ``pauses`` (the calls paused in the debugger, a ``kernel.pauses.PauseTable``, or None);

and ``answer_query(op, args)``, each engine's own answer to the built-in diagnostics
operations (``control.OPS``), beside the methods below. Each method has one answer per
engine; where an engine has no such fact (a cluster driver has no worker processes of
its own, no shared-memory store, no live advisor), the base class's answer says so:
None, an empty list, or :attr:`live_state_missing` for a tool that cannot run without
it, which the API turns into ``UnsupportedOnBackend`` naming the tool.

Methods marked "lock held" are called with ``lock`` taken, and take no other lock: the
dashboard and the advisor read several of them in one hold, so what they show is one
moment of the run.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, NamedTuple, TypedDict

from collections.abc import Callable

from lightwork.kernel.events import EventLog


class PinnedObjects(NamedTuple):
    """The stored objects held only by the driver's refs (the advisor's pinned rule)."""

    nbytes: int
    objects: int
    #: bytes by the id of the task that made them (0 for a ``put``)
    by_task: dict[int, int]


class StoreFacts(TypedDict, total=False):
    """What the object store reports about itself (the dashboard's store panel); keys an
    engine has no value for are absent, or None where the panel shows "unknown"."""

    objects: int
    shared_memory_bytes: int
    freed_objects: int | None
    budget: float
    spilled_bytes: float
    spilled_total: float
    cluster_bytes: int


class RunRecord(abc.ABC):
    """Base of every engine's run record (see the module docstring). Each engine must
    answer the abstract questions; the others have an answer for a run that cannot tell."""

    session: Any  # (name, directory)
    log: EventLog
    lock: Any  # guards log and tasks (a context manager)
    tasks: dict[int, Any]  # live tasks by id: .record, .state, .actor_id, .return_ids
    actors: Any  # .actors: live actors by id
    advisor: Any = None
    control: Any = None
    pauses: Any = None  # a kernel.pauses.PauseTable, where calls can pause
    closed: bool = False
    #: Why this run cannot serve a diagnostic that needs the engine's own live state
    #: (its worker processes sampled, its store read), or None where it can.
    live_state_missing: ClassVar[str | None] = None
    #: True where the run's workers are processes on other machines, which
    #: :meth:`remote_process_usage` samples (a cluster run); else they are sampled here,
    #: from :meth:`runtime_pids`.
    processes_elsewhere: ClassVar[bool] = False

    # -- keeping the record current --------------------------------------------------
    def sync(self) -> None:
        """Bring the record up to date before a diagnostic reads it (a cluster run
        pulls its workers' reports). Nothing to do where the record is always current."""

    def settle(self) -> None:
        """Hear of every task that ended before now (a run's end calls it, so its hooks
        miss none); nothing to do where task ends arrive as they happen."""

    @abc.abstractmethod
    def add_task_listener(self, listener: Callable[[list[Any]], None]) -> None:
        """Call ``listener`` with each batch of ended ``TaskRecord``s, outside the lock."""

    @abc.abstractmethod
    def remove_task_listener(self, listener: Callable[[list[Any]], None]) -> None:
        """Stop calling ``listener`` (no error if it was not added)."""

    # -- objects and tasks -------------------------------------------------------------
    def task_graph_of(self, object_ids: list[int], with_return_ids: bool = False) -> Any:
        """Per object, the task making it and the unfinished tasks it waits on
        (``introspect.TaskGraph``)."""
        from lightwork.kernel import introspect

        return introspect.task_graph_of(self, object_ids, with_return_ids)

    def ready_value(self, object_id: int) -> tuple[bool, Any]:
        """``(True, value)`` if the object is alive and ready, else ``(False, None)``."""
        from lightwork.kernel import introspect

        return introspect.ready_value(self, object_id)

    def pending_objects(self, object_ids: list[int]) -> list[int] | None:
        """Which of ``object_ids`` are not ready yet (lock held; a freed one counts as
        ready: it was), in their order; None where the run cannot tell."""
        return None

    @abc.abstractmethod
    def resources(self) -> tuple[dict[str, float], dict[str, float]]:
        """(total, available) resources of the run."""

    def cpu_total(self) -> float:
        """The run's CPU slots (at least 1): the advisor's measure of a full machine."""
        try:
            return float(self.resources()[0].get("CPU", 1.0)) or 1.0
        except Exception:  # noqa: BLE001 - only a measure; a broken cluster still has 1
            return 1.0

    # -- what the engine's own processes and store show ---------------------------------
    def runtime_pids(self) -> list[int] | None:
        """The pids of the processes the engine started on this machine (fork server,
        workers, actors), or None where it started none here."""
        return None

    def remote_process_usage(self) -> dict[str, tuple[int, float, int]]:
        """(pid, CPU percent since the last call, RSS bytes) of each worker process the
        run has on other machines, by where it runs (one round trip; {} where it has none,
        or they could not be reached). The first call primes the CPU counters."""
        return {}

    def worker_pids(self) -> list[tuple[int, int]]:
        """(worker id, pid) of each started worker process on this machine (lock held)."""
        return []

    def worker_heads(self, concurrent: bool = True) -> list[Any]:
        """The live tasks at the head of each worker, the ones that may be running now
        (lock held): a task worker's first, an actor's first ``max_concurrency`` calls
        (only its first with ``concurrent`` False). Empty where the run cannot see its
        workers' queues."""
        return []

    def resource_use(self) -> dict[str, list[float]]:
        """Each resource as ``[in use, total]`` (lock held); CPU always, the others
        where there are any."""
        return {}

    def store_facts(self) -> StoreFacts:
        """The object store's own report (lock held)."""
        return StoreFacts(objects=0, shared_memory_bytes=0, freed_objects=None)

    def shared_memory_bytes(self) -> int:
        """Bytes of the stored values in shared memory (lock held)."""
        return 0

    def driver_pinned(self, settled_before: float) -> PinnedObjects | None:
        """The stored objects held only by driver refs, ready since before
        ``settled_before`` (``time.monotonic``; lock held); None where the run keeps no
        store of its own."""
        return None

    def actor_deadlocks(self) -> list[Any]:
        """The runtime's own reports of ``get``s in actors that could never return
        (lock held)."""
        return []

    def running_calls(self) -> list[tuple[Any, int, int, bool]]:
        """``(record, worker id, pid, blocked in a nested get/wait)`` of the call each
        of the run's own worker processes runs now, leaving out actors that run calls
        side by side (lock held); empty where the workers are elsewhere
        (:meth:`executing_calls` answers there)."""
        return []

    def store_budget(self) -> int:
        """The bytes the run's own object store may hold (0: it has no store of its
        own, as on a cluster, whose values live in the workers' memory)."""
        return 0

    def actor_concurrency(self, actor_id: int) -> int:
        """How many calls the live actor ``actor_id`` may run at once (1 where the run
        cannot tell, or the actor is gone)."""
        return 1

    def note_advice_event(self, event: tuple[Any, ...]) -> None:
        """Keep ``event`` for the live advisor's next look (``diagnostics/advisor.py``
        lists the kinds); dropped where the run keeps none."""

    def take_advice_events(self) -> list[tuple[Any, ...]]:
        """The events kept since the last call, oldest first (lock held)."""
        return []

    def worker_infos(self) -> dict[int, dict[str, Any]]:
        """Each live worker process of the run's own, by worker id: ``pid``,
        ``actor_class``, ``actor_id`` (hex) and ``max_concurrency`` (lock held)."""
        return {}

    def executing_calls(self) -> list[Any] | None:
        """The tasks running on workers elsewhere now, each with its stack and its
        thread's CPU (``engines/distributed/stuck.ExecutingCall``), for the advisor's
        stuck-task rule; None where the advisor reads the workers itself."""
        return None

    def add_profile(self, row: list[Any]) -> bool:
        """Keep a driver-side ``lightwork.timeline`` span ``[name, start, end, pid,
        thread, task_id, extra]`` for the timeline; False where the run keeps none."""
        return False

    # -- the dashboard ------------------------------------------------------------------
    def dashboard_facts(self, live_limit: int) -> dict[str, Any] | None:
        """What the dashboard shows of resources, workers and actors, where the record
        must ask elsewhere for it (a cluster's scheduler); None: the feed builds them from
        the methods above and the views."""
        return None

    def knows_actor(self, actor_id: int) -> bool:
        """Whether ``actor_id`` is an actor of this run (caller holds ``lock``)."""
        return actor_id in self.actors.actors

    @abc.abstractmethod
    def cancel(self, object_ids: list[int], force: bool) -> None:
        """Cancel the tasks making ``object_ids`` (the dashboard's action)."""

    @abc.abstractmethod
    def kill_actor(self, actor_id: int) -> None:
        """Kill the actor for good (the dashboard's action, when actions are allowed)."""
