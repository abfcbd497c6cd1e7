"""The one place the tests reach into lightwork's internals on purpose.

The public API says what a program can do; some tests must also see what the runtime did
behind it (which worker ran a task, where an object's segment lives, what the driver's
event log holds, which dashboard child a session started). They ask this module, so a
refactor of ``src/`` changes one file of the suite instead of thirty.

What lives where
----------------
* The process's backend: ``lightwork.api.core._backend`` (``backend``), started on
  demand by ``lightwork.api.core._core`` (``running_backend``). A cluster backend has a
  Dask ``client`` and a ``recorder`` (its event log and control server).
* The local engine's driver-side ``Node``: ``backend().node`` (``driver_node``), with its
  object table, store, worker connections, event log, control server and forkserver; its
  I/O loop (``node.io``: ``io_loop``) and task table (``node.task_table``: ``task_table``).
* The dashboard child of ``init(dashboard=True)``: ``lightwork.api.core._dashboard``.
* Inside a task, the worker running it: ``lightwork.engines.local.worker._current_worker``.

Unit tests of one module (the scheduler's state machine, the event log, the collector,
the protocol, the store) import that module directly: it is their subject, not a side
door. Functions here are shipped to workers by value (conftest.py registers this module
as it does ``helpers``), so a task may call ``support.current_worker()``; driver scripts
run in subprocesses import it too (``helpers.ALIAS_PRELUDE`` puts ``tests/`` on their
``sys.path``).
"""

from __future__ import annotations

from typing import Any


def _core_module() -> Any:
    from lightwork.api import core

    return core


# ---- the backend ---------------------------------------------------------------------


def backend() -> Any:
    """The backend installed in this process (None before the first ``init``); never
    starts one."""
    return _core_module()._backend


def running_backend() -> Any:
    """The backend running this process's calls, starting a default runtime if none
    runs (what ``lightwork.get`` and friends call)."""
    return _core_module()._core()


def cluster_client() -> Any:
    """The Dask ``distributed.Client`` of the cluster backend in this process."""
    return backend().client


def recorder() -> Any:
    """The cluster backend's recorder: its event log and control server in the driver."""
    return backend().recorder


def drain_cluster_backend() -> None:
    """Let the cluster backend finish the releases and hand-overs it has queued."""
    backend()._drain()


def task_id_of(ref: Any) -> Any:
    """The id of the task that produces ``ref`` (on either backend)."""
    return running_backend().task_id_of(ref.id)


def dashboard_child() -> Any:
    """The dashboard child process of ``init(dashboard=True)``, or None."""
    return _core_module()._dashboard


def patch_blocking_observers(monkeypatch: Any, observers: Any) -> None:
    """Make the API's ``get``/``wait`` see ``observers`` as the diagnostics callbacks
    that are active (the API binds the list once, at import)."""
    monkeypatch.setattr(_core_module(), "_observers", observers)


# ---- the local engine's driver node --------------------------------------------------


def run_record(feature: str = "a test", live: bool = False) -> Any:
    """The run's record (``kernel.run.RunRecord``) as the tools get it
    (``api.core.run_record``): the local ``Node`` or the cluster's ``ClusterLog``."""
    return _core_module().run_record(feature, live=live)


def driver_node() -> Any:
    """The driver's ``Node`` of the local engine (what the diagnostics read), or None
    when no runtime runs."""
    return _core_module().driver_node()


def object_entry(ref: Any) -> Any:
    """The driver's object-table entry of ``ref`` (KeyError once it was released)."""
    return driver_node().objects.entries[ref.id]


def object_ids() -> Any:
    """The ids in the driver's object table (a live view)."""
    return driver_node().objects.entries


def stored_path(ref: Any) -> str:
    """The shared-memory (or spill) path holding ``ref``'s value."""
    return driver_node().objects.get(ref.id).stored.path


def store() -> Any:
    """The driver's shared-memory store (its segments, budget and free list)."""
    return driver_node().store


def worker_pids() -> set[int]:
    """The pids of the workers connected to the driver now."""
    return {conn.pid for conn in list(driver_node().workers.values())}


def worker_ids() -> set[int]:
    """The ids of the workers connected to the driver now."""
    return set(driver_node().workers)


def io_loop() -> Any:
    """The driver's I/O loop (``io_loop.py``: its thread, its selectors and gate, its
    idle/busy flags, the muting state, and the methods a test may wrap on the instance)."""
    return driver_node().io


def task_table() -> Any:
    """The driver's table of live tasks (``task_table.py``: its recursive-cancel
    bookkeeping, its task-end listeners and the records they have not heard of)."""
    return driver_node().task_table


def event_log() -> Any:
    """The driver's event log (task records, spans, tallies)."""
    return driver_node().log


def session_directory() -> str:
    """The session's directory (its control socket, its logs)."""
    return driver_node().session.directory


def session_driver_pid(path: str) -> int | None:
    """The driver pid a session directory's name ends with (None if it names none)."""
    from lightwork.kernel.session import driver_pid
    import os

    return driver_pid(os.path.basename(path))


def pid_alive(pid: int) -> bool:
    """Whether a process of that pid exists, as the runtime's stale-session sweep sees it."""
    from lightwork.kernel.session import pid_alive as alive

    return alive(pid)


def control_path() -> str:
    """The path of the driver's control socket (what ``lightwork`` CLI commands and the
    dashboard connect to)."""
    return driver_node().control.path


def paused_calls() -> list[dict[str, Any]]:
    """The calls paused in the debugger now, as ``lightwork debug`` lists them (each with
    its ``socket``, ``task_id``, ``pid``, ``paused_s``)."""
    return driver_node().pauses.rows()


def forkserver() -> Any:
    """The driver's forkserver (its ``start_method`` and ``process``)."""
    return driver_node().forkserver


def memory_monitor() -> Any:
    """The driver's memory monitor."""
    return driver_node().memory_monitor


# ---- inside a task -------------------------------------------------------------------


def current_worker() -> Any:
    """The ``Worker`` running the calling task (None in the driver)."""
    from lightwork.engines.local import worker

    return worker._current_worker
