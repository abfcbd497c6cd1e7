"""Ray's path for the state API (``ray.util.state``): the same functions as :mod:`lightwork.state`."""

from lightwork.state import (
    StateRow,
    get_actor,
    get_objects,
    get_task,
    get_worker,
    list_actors,
    list_objects,
    list_tasks,
    list_workers,
    memory_summary,
    status,
    summarize_tasks,
)

__all__ = ["StateRow", "get_actor", "get_objects", "get_task", "get_worker", "list_actors",
           "list_objects", "list_tasks", "list_workers", "memory_summary", "status",
           "summarize_tasks"]
