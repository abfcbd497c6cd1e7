"""Reading what the runtime recorded.

``task_records()`` and ``blocked_spans()`` read the always-on event log (see
``lightwork.kernel.events``): one record per task with its timestamps on the driver
and on the worker, and the spans the driver spent blocked in ``get``/``wait``. Later
diagnostics (timeline, profilers, the advisor) are built on these.

Dask's diagnostics, for Dask graphs run by ``lightwork.dask.get`` and for plain tasks
(a ``get``/``wait`` inside an active callback is one run): ``Callback`` and
``add_callbacks`` (``callbacks.py``), ``ProgressBar`` (``progress.py``), ``Profiler``,
``ResourceProfiler``, ``CacheProfiler`` and their namedtuples (``profilers.py``),
``visualize`` (``visualize.py``, needs bokeh). ``profile_tasks`` samples the code
inside tasks on every worker (``task_profiler.py``). Code written against
``dask.diagnostics`` works after changing only its imports.
"""

from __future__ import annotations

from lightwork.kernel.events import DriverSpan, TaskRecord, freeze
from lightwork.diagnostics.callbacks import Callback, add_callbacks, current_task_record
from lightwork.diagnostics.profilers import (
    CacheData,
    CacheProfiler,
    Profiler,
    ResourceData,
    ResourceProfiler,
    TaskData,
)
from lightwork.diagnostics.progress import ProgressBar, format_time
from lightwork.diagnostics.task_profiler import TaskProfile, profile_tasks
from lightwork.diagnostics.visualize import visualize

__all__ = [
    "CacheData",
    "CacheProfiler",
    "Callback",
    "DriverSpan",
    "Profiler",
    "ProgressBar",
    "ResourceData",
    "ResourceProfiler",
    "TaskData",
    "TaskProfile",
    "TaskRecord",
    "add_callbacks",
    "blocked_spans",
    "current_task_record",
    "dropped_counts",
    "format_time",
    "profile_tasks",
    "task_records",
    "visualize",
]


def _node():
    from lightwork.api import core as _api

    node = _api.run_record("the event log")
    if node is not None:
        node.sync()  # a cluster run pulls its workers' reports first
    if node is None:
        raise RuntimeError(
            "no lightwork runtime is running in this process; call lightwork.init() first "
            "(the event log lives as long as the runtime)"
        )
    return node


def task_records(include_unfinished: bool = True) -> list[TaskRecord]:
    """Copies of the records of ended tasks (oldest first), then of unfinished ones."""
    node = _node()
    with node.lock:  # the live records change under the lock: copied here; ended ones after
        ended = node.log.ended_records()
        live = [_copy(task.record) for task in node.tasks.values()] if include_unfinished else []
    return [_copy(record) for record in ended] + live


def blocked_spans() -> list[DriverSpan]:
    """Spans the driver's threads spent blocked in ``get`` and ``wait`` (oldest first)."""
    node = _node()
    with node.lock:
        return list(node.log.spans)


def dropped_counts() -> dict[str, int]:
    """How many task records and spans the bounded log has dropped (oldest first)."""
    node = _node()
    return {"tasks": node.log.dropped_tasks, "spans": node.log.dropped_spans}


def _copy(record: TaskRecord) -> TaskRecord:
    return TaskRecord(*freeze(record))
