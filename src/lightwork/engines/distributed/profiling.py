"""Task profiles on the distributed backend, from Dask's own sampler.

Every Dask worker already samples the stacks of its task threads (``distributed.profile``,
every ``distributed.worker.profile.interval``, 10 ms by default) and keeps the merged
call trees per key prefix, in one-second cycles (``profile_keys_history``). A task's key
here starts with its function's name (``tasks.py``: ``<name>-<task id>``), so that
prefix is the task function. A profile is then a window of time: ``sample_start`` notes
when it began, and ``sample_stop`` asks every worker (``client.run``: :func:`collect`)
for its trees per prefix since then and turns them into the stacks a local profile has
(``TaskProfile``'s input), labelled with the task function whose prefix it is. Nothing
runs on the workers between the two; nothing is started or stopped on them.

What differs from a local profile: cycles are whole seconds, so the window is rounded
out to them (a task that ran up to a second before the block can show); the rate is
the workers' own (the ``hz`` asked for is not applied); the driver is not sampled; and
only stack sampling is offered: cProfile, line, memory and native modes need the
embedded runtime's workers, and say so. Dask's trees start below the frame of a file
named ``distributed/worker.py``, which lightwork's ``run_task`` is too; any of
lightwork's frames left above the task's are cut as well, and stacks that do not start
at the task's function (the runtime's work around the call: loading its arguments,
storing its result) are left out, so a stack starts at the task's function as it does
locally. Frames are ``name (file)``: Dask
keeps the line running and the short name, and the line is dropped so that one
function is one box. Dask counts a sample on each frame of its stack but the innermost,
which it only adds to the tree: where a frame has one such callee, its samples are that
callee's; with several, they stay with the frame (Dask's own view cannot tell either).
"""

from __future__ import annotations

import os
import time
from typing import Any

from lightwork.kernel.introspect import LIGHTWORK_DIR as _LIGHTWORK_DIR

#: Where lightwork's cluster worker code lives: frames up to the last of these are cut.
_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def collect(start: float, dask_worker: Any = None) -> dict[str, Any]:
    """On a worker (``client.run``): its call trees per key prefix since ``start``."""
    history = list(getattr(dask_worker, "profile_keys_history", ()))
    from distributed import profile

    trees: dict[str, list[Any]] = {}
    for when, per_key in history:
        if when >= start:
            for prefix, tree in per_key.items():
                trees.setdefault(prefix, []).append(tree)
    for prefix, tree in dict(getattr(dask_worker, "profile_keys", {})).items():
        trees.setdefault(prefix, []).append(tree)  # the cycle still being filled
    interval = _interval()
    return {"pid": os.getpid(), "hz": 1.0 / interval if interval else 100.0,
            "trees": {prefix: profile.merge(*parts) for prefix, parts in trees.items()}}


def _interval() -> float:
    import dask
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("distributed.worker.profile.interval"),
                                 default="ms") or 0.01)


def _frame(description: dict[str, Any]) -> str:
    name = str(description.get("name", "?")).replace(";", ",")
    file = str(description.get("filename", ""))
    short = os.path.basename(file) if not file.startswith("<") else file
    return f"{name} ({short})"


def stacks_of(tree: dict[str, Any]) -> list[tuple[tuple[str, ...], int]]:
    """A Dask call tree as ``(frames, samples)`` with the samples that ended in each
    node, the frames cut to the task's own (module docstring)."""
    out: dict[tuple[str, ...], int] = {}

    def walk(node: dict[str, Any], path: list[tuple[str, str]]) -> None:
        children = list(node.get("children", {}).values())
        own = int(node.get("count", 0)) - sum(int(c.get("count", 0)) for c in children)
        here = path + [_entry(node)]
        if own > 0:
            # Dask counts a sample on every frame but the innermost, which it adds with
            # no count: one such child was the innermost frame; with several, which one
            # is unknown and the samples stay with this frame.
            leaves = [c for c in children if not c.get("count")]
            frames = _task_frames(here + [_entry(leaves[0])] if len(leaves) == 1 else here)
            if frames:
                out[frames] = out.get(frames, 0) + own
        for child in children:
            walk(child, here)

    for child in tree.get("children", {}).values():  # the root is Dask's, no frame
        walk(child, [])
    return list(out.items())


def _entry(node: dict[str, Any]) -> tuple[str, str]:
    description = node.get("description") or {}
    return str(description.get("filename", "")), _frame(description)


def _task_frames(path: list[tuple[str, str]]) -> tuple[str, ...]:
    """The frames inside lightwork's last frame of the worker's engine code, if any is
    there (Dask leaves its own out, and with them most often lightwork's)."""
    last = max((i for i, (file, _f) in enumerate(path) if file.startswith(_ENGINE_DIR)),
               default=-1)
    inner = path[last + 1:]
    if not inner or inner[0][0].startswith(_LIGHTWORK_DIR):
        return ()  # the runtime's own work in its call of the task
    return tuple(frame for _file, frame in inner)


def answer(log: Any, op: str, args: dict[str, Any]) -> Any:
    """``sample_start``, ``sample_stop`` and ``sample`` (``seconds``) on a cluster run."""
    from lightwork.kernel.exceptions import UnsupportedOnBackend

    memory, lines, native = args.get("memory"), args.get("lines"), args.get("native")
    if args.get("mode", "sample") != "sample" or memory or lines or native:
        raise UnsupportedOnBackend(
            "only stack sampling is available on the distributed backend (cProfile, "
            "line, memory and native profiles need the embedded runtime's workers): "
            "profile_tasks() with no mode, memory, lines or native; for memory, the "
            "Dask dashboard's worker memory plots")
    if op == "sample_start":
        return start(log)
    if op == "sample_stop":
        return stop(log)
    seconds = float(args.get("seconds", 5.0))
    if not 0 < seconds <= 3600:
        raise ValueError(f"a profile lasts within (0, 3600] seconds, got {seconds:g}")
    start(log)
    try:
        time.sleep(seconds)
    finally:
        result = stop(log)
    return result


def start(log: Any) -> dict[str, Any]:
    with log.lock:
        if getattr(log, "sampling", None) is not None:
            raise ValueError("a task profile is already running in this session "
                             "(profile_tasks() or `lightwork profile`); stop it first")
        log.sampling = time.time()
    return {"token": f"{os.getpid()}-{log.sampling}", "hz": 1.0 / _interval()}


def stop(log: Any) -> dict[str, Any]:
    from lightwork.engines.distributed.worker import key_name

    with log.lock:
        started, log.sampling = getattr(log, "sampling", None), None
    if started is None:
        raise ValueError("no task profile is running in this session; start one with "
                         "lightwork.profile_tasks() or `lightwork profile --seconds N`")
    ended = time.time()
    client = log.backend.client
    # Dask's cycles are stamped with each worker's clock, which the scheduler's
    # round trips relate to ours; a whole cycle of slack covers both.
    replies = client.run(collect, started - 1.0, on_error="return")
    names = {key_name(name): name for name in _task_names(log)}
    processes = [{"worker_id": 0, "pid": os.getpid(), "samples": 0, "counts": []}]
    hz = 1.0 / _interval()
    missing = []
    for row, address in enumerate(sorted(replies), 1):
        reply = replies[address]
        if isinstance(reply, BaseException) or not isinstance(reply, dict):
            missing.append(row)
            continue
        hz = float(reply.get("hz", hz))
        counts = []
        for prefix, tree in reply["trees"].items():
            label = names.get(prefix, prefix)
            function = label.rsplit(".", 1)[-1]
            counts += [[label, list(frames), n] for frames, n in stacks_of(tree)
                       if frames[0].split(" (", 1)[0] == function]
        processes.append({"worker_id": row, "pid": reply["pid"], "address": address,
                          "samples": sum(n for _l, _f, n in counts), "counts": counts})
    return {"hz": hz, "mode": "sample", "started": started, "ended": ended,
            "processes": processes, "missing": missing, "backend": "distributed"}


def _task_names(log: Any) -> set[str]:
    """The task functions this run submitted (their records, live and ended)."""
    from lightwork.kernel import views

    try:
        return {row["name"] for row in views.task_rows(log)}
    except Exception:  # noqa: BLE001 - no log to read: Dask's prefixes label the stacks
        return set()
