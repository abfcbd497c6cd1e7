"""The embedded runtime's answers to diagnostics requests, and its stack dumps.

:func:`answer_query` is the local run's ``answer_query`` (``Node.answer_query``): the
control server (:func:`lightwork.kernel.control.dispatch`) and the in-process state API
both call it, so both paths return the same rows, built by :mod:`lightwork.kernel.views`.

:func:`collect_stacks` signals every live worker with ``control.STACK_SIGNAL``; each
worker's faulthandler (installed by ``control.install_worker_hooks``) writes all its
threads into its ``stack-w<id>.txt`` in the session directory, from a C signal handler,
so a worker stuck in C code or holding the GIL still answers, with no ptrace.

:func:`answer_sampling` runs task profiles (``sampler.py``): ``sample_start`` and
``sample_stop`` for ``profile_tasks()`` in the driver, and ``sample`` (start, wait
``seconds`` in the connection's own thread, stop) for ``lightwork profile``, so a
client that goes away mid-profile cannot leave the workers sampling.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from lightwork.kernel import views
from lightwork.kernel.control import (
    DEFAULT_STACK_TIMEOUT_S,
    STACK_SIGNAL,
    _stack_lock,
    driver_threads,
    known_ops,
    stack_file_path,
)

if TYPE_CHECKING:
    from lightwork.engines.local.node import Node


def answer_query(node: Node, op: str, args: dict[str, Any]) -> Any:
    """Answer one built-in diagnostics operation from the node's state."""
    if op == "ping":
        return {"session": node.session.name, "driver_pid": os.getpid()}
    if op == "status":
        return views.status(node)
    if op == "list":
        kind = args.get("kind")
        listers = {"tasks": views.task_rows, "actors": views.actor_rows,
                   "workers": views.worker_rows, "objects": views.object_rows}
        if kind not in listers:
            raise ValueError(f"cannot list {kind!r}; choose one of {', '.join(listers)}")
        limit = args.get("limit", views.DEFAULT_LIMIT)
        rows, total = views.filter_rows(kind, listers[kind](node), args.get("filters"), limit)
        return {"rows": rows, "total": total}
    if op == "summarize_tasks":
        return views.summarize_tasks(node)
    if op == "memory_summary":
        return views.memory_summary(node)
    if op == "timeline_data":
        return views.timeline_data(node)
    if op == "advise":
        return views.advice(node)
    if op == "stacks":
        timeout = float(args.get("timeout", DEFAULT_STACK_TIMEOUT_S))
        if not 0 < timeout <= 60:
            raise ValueError(f"the stack timeout must be in (0, 60] seconds, got {timeout}")
        return collect_stacks(node, timeout)
    if op == "logs":
        return logs(node, args)
    if op in ("sample_start", "sample_stop", "sample"):
        return answer_sampling(node, op, args)
    if op == "debug_paused":  # `lightwork debug`: the calls paused in the debugger
        return {"session": node.session.name, "paused": node.pauses.rows()}
    raise ValueError(f"unknown operation {op!r}; known: {', '.join(known_ops())}")


def logs(node: Node, args: dict[str, Any]) -> dict[str, Any]:
    """``lightwork logs``: what the calls named in ``args`` printed, as kept."""
    from lightwork.kernel.driver_output import answer_logs

    return answer_logs(node.output, node.session.name, args)


def answer_sampling(node: Node, op: str, args: dict[str, Any]) -> Any:
    """Task profiles (``sampler.py``): start, stop, or ``sample`` for ``seconds``."""
    from lightwork.engines.local import sampler

    hz = float(args.get("hz", sampler.DEFAULT_HZ))
    mode = str(args.get("mode", sampler.SAMPLE))
    memory = args.get("memory", False)
    if memory not in (True, False, "tracemalloc", "memray"):
        raise ValueError(f"memory must be True (tracemalloc), \"memray\" or False, "
                         f"got {memory!r}")
    memray = memory == "memray"
    if memray and mode == sampler.CPROFILE:
        raise ValueError("memray and cProfile both need Python's profile hook, one at a "
                         "time: profile memory with memray in sampling mode, or with "
                         "tracemalloc (--memory) in cprofile mode")
    if memray:
        from lightwork.engines.local.memray_capture import require

        require()  # a clear ImportError here, not an empty capture from every worker
    memory = memory in (True, "tracemalloc")
    lines = _line_targets(args.get("lines"))
    native = bool(args.get("native", False))
    if native and (mode != sampler.SAMPLE or memory or memray or lines):
        raise ValueError("native frames (py-spy) are stack samples on their own: profile "
                         "with native alone, in sampling mode (no cprofile, memory or "
                         "lines beside it)")
    if op == "sample_start":
        return sampler.start(node, hz, mode, memory, lines, memray, native)
    if op == "sample_stop":
        return sampler.stop(node)
    seconds = float(args.get("seconds", 5.0))
    if not 0 < seconds <= 3600:
        raise ValueError(f"a profile lasts within (0, 3600] seconds, got {seconds:g}")
    sampler.start(node, hz, mode, memory, lines, memray, native)
    try:
        time.sleep(seconds)
    finally:
        result = sampler.stop(node)
    return result


def _line_targets(lines: Any) -> list[Any]:
    """``lines``: functions as ``[file, first line, name]`` (``profile_tasks`` gives
    their codes) or as names (``lightwork profile --lines``: ``qualname``,
    ``file.py:qualname`` or ``module:qualname``)."""
    if not lines:
        return []
    if not isinstance(lines, list) or not all(
            (isinstance(t, list) and len(t) == 3 and isinstance(t[0], str)
             and isinstance(t[1], int) and isinstance(t[2], str))
            or (isinstance(t, str) and t.strip(":") and " " not in t) for t in lines):
        raise ValueError("lines must be a list of functions: [file, first line, name] "
                         "each (profile_tasks(lines=[func, ...]) builds it), or names "
                         "such as parse, Loader.load, mymodule:parse, tasks.py:parse")
    try:
        import line_profiler  # noqa: F401 - a clear error here, not an empty profile
    except ImportError:
        raise ImportError("line timings need line_profiler in the program's environment: "
                          "pip install 'lightwork[profile]' (or pip install "
                          "line_profiler)") from None
    return lines


def _describe_worker(node: Node, conn: Any) -> dict[str, Any]:
    actor = conn.actor
    if actor is not None:
        running = [task.name for task in actor.inflight.values()]
        label = f"actor {actor.class_name} ({actor.actor_id:020x})"
    else:
        running = [conn.slot.inflight[0].name] if conn.slot.inflight else []
        label = "task worker"
    if running:
        doing = "running " + ", ".join(running[:4]) + (" …" if len(running) > 4 else "")
        if conn.slot.blocked:
            doing += " (blocked in a nested get/wait)"
    else:
        doing = "idle"
    return {"worker_id": conn.worker_id, "pid": conn.pid, "label": label, "doing": doing,
            "running": running}


def collect_stacks(node: Node, timeout: float = DEFAULT_STACK_TIMEOUT_S) -> dict[str, Any]:
    """Ask every worker for a faulthandler dump of all its threads; wait ``timeout`` at most.

    All workers are signalled first and then polled together, so the whole dump takes
    as long as the slowest worker, bounded by ``timeout``. A dump is complete when its
    file stopped growing for three polls; a worker that wrote nothing by the deadline is
    reported as ``timeout`` (stopped, or stuck in the kernel), with what it wrote if any.
    """
    with node.lock:
        targets = [_describe_worker(node, conn) for conn in node.workers.values()
                   if not conn.dead and not conn.eof_at]
    session_dir = node.session.directory
    result = {"driver": {"pid": os.getpid(), "threads": driver_threads()},
              "workers": targets, "timeout": timeout}
    with _stack_lock:
        pending: dict[int, list[Any]] = {}
        for target in targets:
            target.update(status="ok", text="", note=None)
            path = stack_file_path(session_dir, target["worker_id"])
            if not target["pid"] or not os.path.exists(path):
                target.update(status="starting", note="the worker is still starting")
                continue
            offset = os.path.getsize(path)
            try:
                os.kill(target["pid"], STACK_SIGNAL)
            except ProcessLookupError:
                target.update(status="exited", note="the process exited")
                continue
            pending[target["worker_id"]] = [target, path, offset, offset, 0]
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            time.sleep(0.01)
            for worker_id, entry in list(pending.items()):
                target, path, offset, last, stable = entry
                if _exited(target["pid"]):  # e.g. killed by cancel(force=True) just now
                    target.update(status="exited", note="the process exited",
                                  text=_read_from(path, offset))
                    del pending[worker_id]
                    continue
                size = _size(path)
                if size > offset and size == last:
                    entry[4] = stable + 1
                    if entry[4] >= 3:
                        target["text"] = _read_from(path, offset)
                        del pending[worker_id]
                else:
                    entry[3], entry[4] = size, 0
        for target, path, offset, _, _ in pending.values():
            text = _read_from(path, offset)
            target.update(status="timeout", text=text, note=(
                f"no complete answer within {timeout:g} s (the process may be stopped, "
                "or stuck in the kernel); " + ("partial output below" if text else "no output")))
    return result


def _exited(pid: int) -> bool:
    """Gone or a zombie: it will never write its dump (a stopped process may, later)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(4 << 20).decode("utf-8", "replace")
    except OSError:
        return ""
