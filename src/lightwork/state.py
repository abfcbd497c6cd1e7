"""The state of a running session: tasks, actors, workers, objects (Ray's state API).

``list_tasks()``, ``list_actors()``, ``list_workers()`` and ``list_objects()`` return
lists of plain dicts (JSON-able, the same rows ``lightwork list ... --format json``
prints). Each takes filters — ``list_tasks(state="RUNNING")``,
``list_tasks(filters=[("name", "=", "*work"), ("state", "!=", "FINISHED")])`` — and a
``limit`` (default 100). Unknown keys raise ``ValueError`` naming the valid ones.

Each row is a :class:`StateRow`: a dict whose keys also read as attributes, as Ray's
state objects do (``row["state"]`` and ``row.state``). ``get_actor(id)``,
``get_task(id or ref)`` and ``get_worker(id)`` return one row or None, ``get_objects(id)``
a list.

``summarize_tasks()`` groups tasks by function: counts by state, run time
mean/p50/p95/max, total queued time. ``memory_summary()`` groups objects by owner and by
reference kind and lists the largest. ``status()`` is what ``lightwork status`` shows.

Task states, reference kinds and filter rules are documented in
``lightwork.kernel.views``. Listings read the always-on event log, so ended tasks
are there up to the event budget (``init(event_budget=...)``).

In the driver these read the runtime directly; inside a task or an actor they ask the
driver over the session's control socket. :func:`query` is the one path both take.
"""

from __future__ import annotations

from typing import Any

from lightwork.kernel import control
from lightwork.kernel import views

__all__ = ["StateRow", "get_actor", "get_objects", "get_task", "get_worker", "list_actors",
           "list_objects", "list_tasks", "list_workers", "memory_summary", "query", "status",
           "summarize_tasks"]


class StateRow(dict):
    """One row of the state API: a plain dict (JSON-able, what ``lightwork list ...
    --format json`` prints) whose keys also read as attributes, as on Ray's state
    objects: ``row.state`` is ``row["state"]``."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"a state row has no field {name!r}; its fields are: {', '.join(self)}"
            ) from None

    def asdict(self) -> dict[str, Any]:
        """The row as a plain dict (Ray's state objects have the same method)."""
        return dict(self)


def query(op: str, request_timeout: float = 30.0, **args: Any) -> Any:
    """Run one diagnostics operation (``control.OPS``) against this process's session."""
    from lightwork.api import core as _api

    node = _api.run_record(f"the state API ({op})", session=True)
    if node is not None:
        return control.dispatch(node, op, args)
    backend = _api._backend
    path = control.worker_socket_path()  # in a worker that knows its session's socket
    if path is not None and backend is not None and not backend.in_driver:
        return control.request(path, op, args, timeout=request_timeout)
    if backend is not None and not backend.in_driver:  # a task on a cluster worker
        from lightwork.kernel.exceptions import UnsupportedOnBackend

        raise UnsupportedOnBackend(
            f"the state API ({op}) inside a task is not supported on the {backend.name} "
            "backend (the driver that holds the run's record may be on another machine): "
            "call it from the driver, or run `lightwork status`/`list` in a terminal on "
            "the driver's machine")
    raise RuntimeError(
        "no lightwork runtime is running in this process; call lightwork.init() first "
        "(from another terminal, `lightwork status` attaches to a running program)")


def _list(kind: str, filters: Any, limit: int | None,
          equals: dict[str, Any], timeout: float = 30.0) -> list[StateRow]:
    parsed = views.parse_filters(filters) + [(k, "=", v) for k, v in equals.items()]
    result = query("list", request_timeout=timeout, kind=kind, filters=parsed, limit=limit)
    return [StateRow(row) for row in result["rows"]]


def list_tasks(filters: Any = None, *, limit: int | None = views.DEFAULT_LIMIT,
               **equals: Any) -> list[StateRow]:
    """Live tasks (in submission order), then ended ones (most recent first)."""
    return _list("tasks", filters, limit, equals)


def list_actors(filters: Any = None, *, limit: int | None = views.DEFAULT_LIMIT,
                **equals: Any) -> list[StateRow]:
    return _list("actors", filters, limit, equals)


def list_workers(filters: Any = None, *, limit: int | None = views.DEFAULT_LIMIT,
                 **equals: Any) -> list[StateRow]:
    """The driver (``worker_id`` 0), then every worker process, with CPU % and RSS."""
    return _list("workers", filters, limit, equals)


def list_objects(filters: Any = None, *, limit: int | None = views.DEFAULT_LIMIT,
                 **equals: Any) -> list[StateRow]:
    """Objects in the object table, largest first, with what keeps each alive."""
    return _list("objects", filters, limit, equals)


def _one_id(what: str, id: Any, kinds: tuple[type, ...], address: Any, timeout: Any) -> None:
    """Check a ``get_*`` call's arguments. ``address`` is Ray's (its state server's): the
    session here is this process's, so only None or a string is taken, and ignored."""
    if isinstance(id, bool) or not isinstance(id, kinds) or (isinstance(id, str) and not id):
        raise TypeError(f"{what}(id) takes the id as {' or '.join(k.__name__ for k in kinds)} "
                        f"(as list_{what[4:]}s() rows give it), got {id!r}")
    if address is not None and not isinstance(address, str):
        raise TypeError(f"{what}(address=) is a string or None, got {address!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"{what}(timeout=) is a positive number of seconds, got {timeout!r}")


def get_actor(id: str, address: str | None = None, timeout: float = 30) -> StateRow | None:
    """The row of the actor with this id (``list_actors()``'s ``actor_id``, a hex
    string, as ``handle._actor_id`` and the CLI show it), or None."""
    _one_id("get_actor", id, (str,), address, timeout)
    rows = _list("actors", [("actor_id", "=", id.lower())], None, {}, timeout)
    return rows[0] if rows else None


def get_task(id: Any, address: str | None = None, timeout: float = 30) -> StateRow | None:
    """The row of the task with this id (``list_tasks()``'s ``task_id``), or of the task
    that makes this ref; its latest attempt when it was retried; None if not known."""
    from lightwork.kernel.object_ref import ObjectRef

    if isinstance(id, ObjectRef):
        id = id.task_id()
    _one_id("get_task", id, (int, str), address, timeout)
    rows = _list("tasks", [("task_id", "=", id)], None, {}, timeout)
    return max(rows, key=lambda row: row.get("attempt") or 0) if rows else None


def get_worker(id: Any, address: str | None = None, timeout: float = 30) -> StateRow | None:
    """The row of the worker with this id (``list_workers()``'s ``worker_id``; 0 is the
    driver), or None."""
    _one_id("get_worker", id, (int, str), address, timeout)
    rows = _list("workers", [("worker_id", "=", id)], None, {}, timeout)
    return rows[0] if rows else None


def get_objects(id: str, address: str | None = None, timeout: float = 30) -> list[StateRow]:
    """The rows of the object with this id (``list_objects()``'s ``object_id``, as
    ``ref.hex()`` gives it): one, or none if it is gone."""
    _one_id("get_objects", id, (str,), address, timeout)
    return _list("objects", [("object_id", "=", id.lower())], None, {}, timeout)


def summarize_tasks() -> dict[str, Any]:
    return query("summarize_tasks")


def memory_summary() -> dict[str, Any]:
    return query("memory_summary")


def status() -> dict[str, Any]:
    return query("status")
