"""memray captures of the workers while a profile runs, merged by task function.

``profile_tasks(memory="memray")`` (or ``lightwork profile --memray``): the switch file
carries the extra ``memray`` (``sampler.py``), and each worker's :class:`CallProfiler`
(``call_profiler.py``) holds a :class:`Capture`: a ``memray.Tracker`` writing
``sample-w<id>.memray`` in the session directory from the moment the worker follows
the switch until the profile stops. memray records every allocation of the process with
its Python stack; lightwork adds only which task functions ran there (``labels``, from
the call wrapper), since memray's stacks name functions by their code's short name.

The driver's side, :func:`merge`, reads each worker's capture with memray's own
``FileReader`` once the worker's final file says the tracker is closed, and keeps two
views of it: what was allocated at the worker's high-water mark (``peak``) and what was
still allocated when the capture ended (``leaks``). Each allocation is labelled with the
task function whose call made it: the frame just inside the worker's own call of the
task (``Worker._execute``, or ``_invoke`` on an async actor's loop) names it, matched
to the worker's labels by short name. Allocations made outside any call (loading
arguments, storing results, the runtime's threads) are the runtime's and left out.
Stacks are added up over the workers by ``(label, frames)``, so the result is a small
JSON value like the rest of a profile, and ``TaskProfile.memray_flamegraph`` renders it
with memray's flame graph reporter, one "thread" per task function.

memray is an optional dependency (the ``profile`` extra), imported only here, and
only when a profile asks for it.
"""

from __future__ import annotations

import _thread
import os
from typing import Any

from lightwork.kernel.introspect import LIGHTWORK_DIR as _LIGHTWORK_DIR

SUFFIX = ".memray"
START_S = 2.0
#: The frames that call a task's own code: what is inside one of them is the task's.
_WORKER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
_RUNNERS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "actor_runners.py")
_BOUNDARIES = {("_execute", _WORKER_FILE), ("_invoke", _RUNNERS_FILE)}
MAX_FRAMES = 64  # innermost frames kept per stack: deep recursion stays one box a level


def require() -> Any:
    """The ``memray`` module, or an ImportError saying what to install."""
    try:
        import memray
    except ImportError:
        raise ImportError("memory flame graphs need memray: pip install "
                          "'lightwork[profile]' (or pip install memray; Linux and macOS)"
                          ) from None
    return memray


def capture_path(sample_path: str) -> str:
    return sample_path[: -len(".json")] + SUFFIX


class Capture:
    """One worker's memray tracker for one profile."""

    def __init__(self, sample_path: str) -> None:
        self.path = capture_path(sample_path)
        self.labels: set[str] = set()  # the task functions called while it traced
        self.error = ""
        self._tracker: Any = None

    def start(self) -> None:
        """Start the tracker from a thread of its own, and wait for it (up to
        ``START_S``). memray builds a thread's stack from its frames at the thread's
        first event after the tracker began, except in the thread that began it, whose
        frames it never sees: a tracker started by the signal handler would record
        empty stacks for the main thread's calls once the handler returned."""
        started = _thread.allocate_lock()
        started.acquire()

        def begin() -> None:
            try:
                memray = require()
                try:
                    os.unlink(self.path)  # memray will not overwrite a file
                except FileNotFoundError:
                    pass
                tracker = memray.Tracker(self.path, follow_fork=False)
                tracker.__enter__()
                self._tracker = tracker
            except Exception as exc:  # noqa: BLE001 - reported with the profile, never in a task
                self.error = f"{type(exc).__name__}: {exc}"
            finally:
                started.release()

        _thread.start_new_thread(begin, ())
        started.acquire(timeout=START_S)

    def stop(self) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            try:
                tracker.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001 - as in start
                self.error = f"{type(exc).__name__}: {exc}"

    def result(self) -> dict[str, Any]:
        return {"file": self.path, "labels": sorted(self.labels), "error": self.error}


def _labelled(stack: list[tuple[str, str, int]], by_name: dict[str, str]
              ) -> tuple[str, list[list[Any]]] | None:
    """The task label and the task's frames (innermost first) of one memray stack."""
    for depth, (function, file, _line) in enumerate(stack):
        if (function, file) in _BOUNDARIES:
            inner = stack[:depth]
            if not inner or inner[-1][1].startswith(_LIGHTWORK_DIR):
                return None  # the runtime's own work in its call of the task
            name = inner[-1][0]
            label = by_name.get(name, name)
            return label, [list(frame) for frame in inner[-MAX_FRAMES:]]
    return None


def _by_name(labels: list[str]) -> dict[str, str]:
    """Short code name -> task label, where only one label has that short name."""
    seen: dict[str, list[str]] = {}
    for label in labels:
        seen.setdefault(label.rsplit(".", 1)[-1], []).append(label)
    return {name: found[0] for name, found in seen.items() if len(found) == 1}


def read(result: dict[str, Any]) -> dict[str, Any]:
    """One worker's capture, labelled: ``{peak, leaks: [[label, frames, bytes, count]],
    peak_bytes, allocations}`` (empty lists if it wrote none)."""
    memray = require()
    out: dict[str, Any] = {"peak": [], "leaks": [], "peak_bytes": 0, "allocations": 0}
    path = result.get("file") or ""
    if not os.path.exists(path):
        return out
    by_name = _by_name(list(result.get("labels") or []))
    with memray.FileReader(path) as reader:
        out["peak_bytes"] = reader.metadata.peak_memory
        out["allocations"] = reader.metadata.total_allocations
        for view, records in (("peak", reader.get_high_watermark_allocation_records(merge_threads=True)),
                              ("leaks", reader.get_leaked_allocation_records(merge_threads=True))):
            merged: dict[tuple[Any, ...], list[Any]] = {}
            for record in records:
                found = _labelled(record.stack_trace(), by_name)
                if found is None:
                    continue
                label, frames = found
                key = (label, tuple(map(tuple, frames)))
                into = merged.setdefault(key, [label, frames, 0, 0])
                into[2] += record.size
                into[3] += record.n_allocations
            out[view] = list(merged.values())
    return out


def merge(results: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """The workers' captures (``[(worker_id, Capture.result())]``) read and added up by
    ``(label, frames)``; ``workers`` lists each one's peak and its error, if any."""
    out: dict[str, Any] = {"peak": [], "leaks": [], "workers": []}
    totals: dict[str, dict[tuple[Any, ...], list[Any]]] = {"peak": {}, "leaks": {}}
    for worker_id, result in results:
        if not result:
            continue
        error = str(result.get("error") or "")
        try:
            data = read(result) if not error else None
        except Exception as exc:  # noqa: BLE001 - a torn file: name it, keep the others
            error, data = f"{type(exc).__name__}: {exc}", None
        finally:
            try:
                os.unlink(result.get("file") or "")  # large; what matters is merged here
            except OSError:
                pass
        entry = {"worker_id": worker_id, "error": error, "peak_bytes": 0, "allocations": 0}
        if data is not None:
            entry["peak_bytes"], entry["allocations"] = data["peak_bytes"], data["allocations"]
            for view in ("peak", "leaks"):
                for label, frames, size, count in data[view]:
                    key = (label, tuple(map(tuple, frames)))
                    into = totals[view].setdefault(key, [label, frames, 0, 0])
                    into[2] += size
                    into[3] += count
        out["workers"].append(entry)
    for view in ("peak", "leaks"):
        out[view] = sorted(totals[view].values(), key=lambda row: -row[2])
    return out
