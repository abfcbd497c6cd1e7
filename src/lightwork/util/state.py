"""Ray's path for the state API (``ray.util.state``): the same functions as :mod:`lightwork.state`."""

from lightwork.state import (
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
