"""``ray.experimental.state.api``: Ray's path for the state API before it moved to
``ray.util.state``; the same functions as :mod:`lightwork.util.state` (``list_tasks``,
``list_actors``, ``list_objects``, ...)."""

from lightwork.util.state import (
    list_actors,
    list_objects,
    list_tasks,
    list_workers,
    memory_summary,
    status,
    summarize_tasks,
)

__all__ = ["list_actors", "list_objects", "list_tasks", "list_workers", "memory_summary",
           "status", "summarize_tasks"]
