"""The state of a running session: tasks, actors, workers, objects (Ray's state API).

``list_tasks()``, ``list_actors()``, ``list_workers()`` and ``list_objects()`` return
lists of plain dicts (JSON-able, the same rows ``lightwork list ... --format json``
prints). Each takes filters — ``list_tasks(state="RUNNING")``,
``list_tasks(filters=[("name", "=", "*work"), ("state", "!=", "FINISHED")])`` — and a
``limit`` (default 100). Unknown keys raise ``ValueError`` naming the valid ones.

Each row is a :class:`StateRow`: a dict whose keys also read as attributes, as Ray's
state objects do (``row["state"]`` and ``row.state``). ``get_actor(id)``,
``get_task(id or ref)`` and ``get_worker(id)`` return one row or None, ``get_objects(id)``
a list. ``list_nodes()`` and ``list_placement_groups()`` (with ``get_node`` and
``get_placement_group``) and ``summarize_actors()``/``summarize_objects()`` complete
Ray's set; its calls about jobs, log files, runtime environments and cluster events
import but raise ``NotImplementedError`` saying where lightwork shows the same thing.

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

__all__ = ["StateApiClient", "StateRow", "get_actor", "get_job", "get_log", "get_node",
           "get_objects", "get_placement_group", "get_task", "get_worker", "list_actors",
           "list_cluster_events", "list_jobs", "list_logs", "list_nodes", "list_objects",
           "list_placement_groups", "list_runtime_envs", "list_tasks", "list_workers",
           "memory_summary", "query", "status", "summarize_actors", "summarize_objects",
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


def _check_get(what: str, id: Any, kinds: tuple[type, ...], address: Any, timeout: Any) -> None:
    """Check a ``get_*`` call's arguments. ``address`` is Ray's (its state server's): the
    session here is this process's, so only None or a string is taken, and ignored."""
    if isinstance(id, bool) or not isinstance(id, kinds) or (isinstance(id, str) and not id):
        listing = "list_" + what[4:] + ("" if what.endswith("s") else "s")
        raise TypeError(f"{what}(id) takes the id as {' or '.join(k.__name__ for k in kinds)} "
                        f"(as {listing}() rows give it), got {id!r}")
    if address is not None and not isinstance(address, str):
        raise TypeError(f"{what}(address=) is a string or None, got {address!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"{what}(timeout=) is a positive number of seconds, got {timeout!r}")


def get_actor(id: str, address: str | None = None, timeout: float = 30) -> StateRow | None:
    """The row of the actor with this id (``list_actors()``'s ``actor_id``, a hex
    string, as ``handle._actor_id`` and the CLI show it), or None."""
    _check_get("get_actor", id, (str,), address, timeout)
    rows = _list("actors", [("actor_id", "=", id.lower())], None, {}, timeout)
    return rows[0] if rows else None


def get_task(id: Any, address: str | None = None, timeout: float = 30) -> StateRow | None:
    """The row of the task with this id (``list_tasks()``'s ``task_id``), or of the task
    that makes this ref; its latest attempt when it was retried; None if not known."""
    from lightwork.kernel.object_ref import ObjectRef

    if isinstance(id, ObjectRef):
        id = id.task_id()
    _check_get("get_task", id, (int, str), address, timeout)
    rows = _list("tasks", [("task_id", "=", id)], None, {}, timeout)
    return max(rows, key=lambda row: row.get("attempt") or 0) if rows else None


def get_worker(id: Any, address: str | None = None, timeout: float = 30) -> StateRow | None:
    """The row of the worker with this id (``list_workers()``'s ``worker_id``; 0 is the
    driver), or None."""
    _check_get("get_worker", id, (int, str), address, timeout)
    rows = _list("workers", [("worker_id", "=", id)], None, {}, timeout)
    return rows[0] if rows else None


def get_objects(id: str, address: str | None = None, timeout: float = 30) -> list[StateRow]:
    """The rows of the object with this id (``list_objects()``'s ``object_id``, as
    ``ref.hex()`` gives it): one, or none if it is gone."""
    _check_get("get_objects", id, (str,), address, timeout)
    return _list("objects", [("object_id", "=", id.lower())], None, {}, timeout)


def list_nodes(filters: Any = None, *, limit: int | None = views.DEFAULT_LIMIT,
               **equals: Any) -> list[StateRow]:
    """The machines of the session (``nodes()``): this one on the embedded runtime, each
    worker's on a cluster; ``node_id``, ``state``, ``node_ip``, ``resources_total``."""
    from lightwork.api import core as _api

    rows = [{"node_id": node["NodeID"], "state": "ALIVE" if node.get("Alive") else "DEAD",
             "node_ip": node.get("NodeManagerAddress"),
             "resources_total": dict(node.get("Resources") or {})}
            for node in _api.nodes()]
    return _filtered("nodes", rows, filters, limit, equals)


def get_node(id: str, address: str | None = None, timeout: float = 30) -> StateRow | None:
    """The row of the node with this id (``list_nodes()``'s ``node_id``), or None."""
    _check_get("get_node", id, (str,), address, timeout)
    rows = list_nodes([("node_id", "=", id)], limit=None)
    return rows[0] if rows else None


def list_placement_groups(filters: Any = None, *, limit: int | None = views.DEFAULT_LIMIT,
                          **equals: Any) -> list[StateRow]:
    """The session's placement groups (``placement_group_table()``, a row each):
    ``placement_group_id``, ``name``, ``state``, ``strategy``, ``bundles``."""
    from lightwork.api.placement_group import placement_group_table

    rows = list(placement_group_table().values())  # read only: each row is copied once
    return _filtered("placement_groups", rows, filters, limit, equals)


def get_placement_group(id: str, address: str | None = None,
                        timeout: float = 30) -> StateRow | None:
    """The row of the placement group with this id (``pg.id.hex()``), or None."""
    _check_get("get_placement_group", id, (str,), address, timeout)
    rows = list_placement_groups([("placement_group_id", "=", id)], limit=None)
    return rows[0] if rows else None


def _filtered(kind: str, rows: list[dict[str, Any]], filters: Any, limit: int | None,
              equals: dict[str, Any]) -> list[StateRow]:
    """Ray's filters and limit over rows made here, not by the session's views."""
    parsed = views.parse_filters(filters) + [(k, "=", v) for k, v in equals.items()]
    matched, _ = views.filter_rows(kind, rows, parsed, limit)
    return [StateRow(row) for row in matched]


def summarize_actors() -> dict[str, Any]:
    """Actors by class: how many, and how many in each state."""
    classes: dict[str, dict[str, Any]] = {}
    actors = list_actors(limit=None)
    for row in actors:
        entry = classes.setdefault(row["class_name"], {"class_name": row["class_name"],
                                                       "count": 0, "state_counts": {}})
        entry["count"] += 1
        entry["state_counts"][row["state"]] = entry["state_counts"].get(row["state"], 0) + 1
    return {"total_actors": len(actors), "classes": list(classes.values())}


def summarize_objects() -> dict[str, Any]:
    """Objects by owner and by reference kind, and the store's use: ``memory_summary()``."""
    return memory_summary()


def _not_in_lightwork(name: str, instead: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"ray.util.state.{name} is not in lightwork: {instead}")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Not in lightwork (it raises NotImplementedError): {instead}"
    return refuse


_ONE_PROGRAM = ("a lightwork session is one driver's program, not a cluster of jobs; "
                "status() and `lightwork status` describe it")
_OUTPUT = ("a task's prints reach the driver's terminal with a (name pid=...) prefix, and "
           "`lightwork stack` shows what each worker is doing")
list_jobs = _not_in_lightwork("list_jobs", _ONE_PROGRAM)
get_job = _not_in_lightwork("get_job", _ONE_PROGRAM)
list_logs = _not_in_lightwork("list_logs", _OUTPUT)
get_log = _not_in_lightwork("get_log", _OUTPUT)
list_runtime_envs = _not_in_lightwork(
    "list_runtime_envs", "a runtime_env is applied in each worker as it takes the work "
    "(env_vars, working_dir, py_modules), not installed as an environment of its own")
list_cluster_events = _not_in_lightwork(
    "list_cluster_events", "the session's events are on its timeline (lightwork.timeline())")
StateApiClient = _not_in_lightwork(
    "StateApiClient", "call this module's functions, which read the running session")


def summarize_tasks() -> dict[str, Any]:
    return query("summarize_tasks")


def memory_summary() -> dict[str, Any]:
    return query("memory_summary")


def status() -> dict[str, Any]:
    return query("status")
