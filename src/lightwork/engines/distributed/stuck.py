"""The cluster's running tasks, for the advisor's stuck-task rule.

The embedded runtime's advisor reads its workers itself (``/proc`` for their CPU,
faulthandler dumps for their stacks). A cluster's workers are elsewhere, so one
``client.run`` asks each worker process (:func:`executing`) for what distributed knows of
the tasks it executes now: its ``active_threads`` (thread -> key) and each task's
``start_time``, plus, read there, each such thread's Python stack and CPU time (psutil, a
dependency of distributed). The driver (:func:`executing_calls`) keeps the tasks of its
own session that it still waits for, by key, with their records.

Only ``advise()`` asks, and only then: nothing runs on the task path. A task blocked in a
nested ``get`` has seceded from its worker's pool (``cluster_worker``), so it is not
listed: the task it waits for is the one to name, as on the embedded runtime. Actor calls
run in their actor's host, outside the pool, and are not listed.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback
from typing import Any, NamedTuple

from lightwork.kernel.events import TaskRecord

# A lightwork task's key: its function's name, "-", its task id in hex, and "-r<n>" on a
# retry (``cluster_tasks``).
_TASK_KEY = re.compile(r"-([0-9a-f]+)(?:-r\d+)?$")


class ExecutingCall(NamedTuple):
    """One task running on a cluster worker now."""

    record: TaskRecord
    address: str
    pid: int
    running_s: float  # by the worker's clock
    cpu_s: float | None  # its thread's CPU time so far (None: not readable there)
    frames: list[list[Any]]  # [file, line, function], outermost first


def executing(dask_worker: Any = None) -> dict[str, Any]:
    """The tasks this worker process executes now (run by ``client.run``)."""
    now = time.time()
    lock = getattr(dask_worker, "active_threads_lock", None)
    if lock is None:
        return {"pid": os.getpid(), "calls": []}
    with lock:
        active = dict(dask_worker.active_threads)
    frames = sys._current_frames()
    native = {thread.ident: thread.native_id for thread in threading.enumerate()}
    try:
        import psutil

        cpu = {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
    except Exception:  # noqa: BLE001 - no CPU figures: the driver-blocked half still works
        cpu = {}
    calls = []
    for ident, key in active.items():
        state = dask_worker.state.tasks.get(key)
        start = getattr(state, "start_time", None)
        frame = frames.get(ident)
        if start is None or frame is None or not isinstance(key, str):
            continue
        calls.append({
            "key": key, "running_s": now - start, "cpu_s": cpu.get(native.get(ident)),
            "frames": [[f.filename, f.lineno, f.name] for f in traceback.extract_stack(frame)],
        })
    return {"pid": os.getpid(), "calls": calls}


def task_id_of(key: str) -> int | None:
    """The lightwork task id a task's key carries, or None (not one of lightwork's)."""
    match = _TASK_KEY.search(key)
    return int(match.group(1), 16) if match else None


def executing_calls(log: Any) -> list[ExecutingCall]:
    """The tasks of ``log``'s session running on the cluster now (one ``client.run``)."""
    client = log.backend.client
    if client is None or log.closed or getattr(client, "status", "running") != "running":
        return []  # no cluster to ask (a log read after its session, or without one)
    replies = client.run(executing, on_error="ignore")
    found = []
    for address, reply in replies.items():
        if not isinstance(reply, dict):
            continue  # a worker that could not answer
        for call in reply.get("calls", ()):
            task_id = task_id_of(call["key"])
            with log.lock:
                live = log.tasks.get(task_id) if task_id is not None else None
            if live is None:
                continue  # another session's, or not lightwork's
            found.append(ExecutingCall(live.record, str(address), int(reply.get("pid", 0)),
                                       float(call["running_s"]), call.get("cpu_s"),
                                       call.get("frames") or []))
    return found
