"""The run's record: what every engine keeps of a session for the diagnostics.

Each engine's driver keeps one record of its run (the local engine's ``Node``, the
cluster engine's ``ClusterLog``), and the tools read it without asking which engine
made it. The record holds, as attributes:

* ``session`` (``name``, ``directory``), ``log`` (the :class:`~lightwork.kernel.events.
  EventLog`), ``lock`` (guarding the log and the task table), ``tasks`` (live tasks by
  id), ``actors`` (``actors.actors``: live actors by id);
* ``advisor`` (the live advisor, or None), ``control`` (the control server, or None).

and ``answer_query(op, args)``, each engine's own answer to the built-in diagnostics
operations (``control.OPS``), beside the methods below, which an engine overrides
where its run differs. Their defaults are the embedded runtime's, whose record is
always up to date in this process.
"""

from __future__ import annotations

from typing import Any


class RunRecord:
    """Base of every engine's run record (see the module docstring)."""

    advisor: Any = None
    control: Any = None

    def sync(self) -> None:
        """Bring the record up to date before a diagnostic reads it (a cluster run
        pulls its workers' reports). Nothing to do where the record is always current."""

    def settle(self) -> None:
        """Hear of every task that ended before now (a run's end calls it, so its hooks
        miss none); nothing to do where task ends arrive as they happen."""

    def task_graph_of(self, object_ids: list[int], with_return_ids: bool = False) -> Any:
        """Per object, the task making it and the unfinished tasks it waits on
        (``introspect.TaskGraph``)."""
        from lightwork.kernel import introspect

        return introspect.task_graph_of(self, object_ids, with_return_ids)

    def dashboard_facts(self, live_limit: int) -> dict[str, Any] | None:
        """What the dashboard shows of resources, workers and actors, where the record
        must ask elsewhere for it (a cluster's scheduler); None: the views make them."""
        return None

    def knows_actor(self, actor_id: int) -> bool:
        """Whether ``actor_id`` is an actor of this run (caller holds ``lock``)."""
        return actor_id in self.actors.actors  # type: ignore[attr-defined]

    def kill_actor(self, actor_id: int) -> None:
        """Kill the actor for good (the dashboard's action, when actions are allowed)."""
        self.driver_request("kill", actor_id, True)  # type: ignore[attr-defined]
