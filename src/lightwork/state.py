"""The state of a running session: tasks, actors, workers, objects (Ray's state API).

``list_tasks()``, ``list_actors()``, ``list_workers()`` and ``list_objects()`` return
lists of plain dicts (JSON-able, the same rows ``lightwork list ... --format json``
prints). Each takes filters — ``list_tasks(state="RUNNING")``,
``list_tasks(filters=[("name", "=", "*work"), ("state", "!=", "FINISHED")])`` — and a
``limit`` (default 100). Unknown keys raise ``ValueError`` naming the valid ones.

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

__all__ = ["list_actors", "list_objects", "list_tasks", "list_workers", "memory_summary",
           "query", "status", "summarize_tasks"]


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
          equals: dict[str, Any]) -> list[dict[str, Any]]:
    parsed = views.parse_filters(filters) + [(k, "=", v) for k, v in equals.items()]
    result = query("list", kind=kind, filters=parsed, limit=limit)
    return result["rows"]


def list_tasks(filters: Any = None, *, limit: int | None = views.DEFAULT_LIMIT,
               **equals: Any) -> list[dict[str, Any]]:
    """Live tasks (in submission order), then ended ones (most recent first)."""
    return _list("tasks", filters, limit, equals)


def list_actors(filters: Any = None, *, limit: int | None = views.DEFAULT_LIMIT,
                **equals: Any) -> list[dict[str, Any]]:
    return _list("actors", filters, limit, equals)


def list_workers(filters: Any = None, *, limit: int | None = views.DEFAULT_LIMIT,
                 **equals: Any) -> list[dict[str, Any]]:
    """The driver (``worker_id`` 0), then every worker process, with CPU % and RSS."""
    return _list("workers", filters, limit, equals)


def list_objects(filters: Any = None, *, limit: int | None = views.DEFAULT_LIMIT,
                 **equals: Any) -> list[dict[str, Any]]:
    """Objects in the object table, largest first, with what keeps each alive."""
    return _list("objects", filters, limit, equals)


def summarize_tasks() -> dict[str, Any]:
    return query("summarize_tasks")


def memory_summary() -> dict[str, Any]:
    return query("memory_summary")


def status() -> dict[str, Any]:
    return query("status")
