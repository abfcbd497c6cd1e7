"""Native stacks of the workers, with py-spy, for a profile with ``native=True``.

The workers' own samplers (``sampler.py``) read Python frames only: a task inside a C
function (zlib, numpy, a driver's library) shows as the Python line that called it.
With ``native``, the driver instead runs one ``py-spy record --native`` per live worker
for the length of the profile, which stops the worker at each sample and unwinds its C
stack too, and the workers' samplers stay off (the samples would count twice). The
driver samples itself in Python as always.

Labelling: py-spy knows nothing of tasks, but its stacks hold the worker's frames: the
frame just inside ``_execute`` (``worker.py``; ``_cancellable`` on an async actor's
loop) is the task's own function, and lightwork knows which task functions ran on
which worker (the task table), so a stack is filed under the one whose short name it
shows. Stacks with no such frame (the worker idle, its I/O thread, a pool thread waiting
for its loop) run no task and are left out. Frames become ``function (file)``:
py-spy gives the line running, and functions, not lines, add up in one box; a C frame
py-spy could not name is named by its library.

States: *recording* (``start``: each py-spy process writes its samples to
``native-w<id>.txt`` in the session directory when it ends), *stopped* (``stop``:
SIGINT to each, wait, read, delete). While recording, a watcher thread asks the node
for its live workers every ``WATCH_S`` and starts a py-spy on each worker forked
meanwhile (a pool growing, a worker replaced, an actor started): the workers' own
signal-and-switch path that lets a new worker join a sampling profile cannot serve
here, since py-spy must be the driver's child to ptrace under
``kernel.yama.ptrace_scope=1``. The watcher is the only thread that adds recordings
after ``start``; ``stop`` ends it first, under the recorder's lock. py-spy missing, or
not allowed to ptrace (``kernel.yama.ptrace_scope``, a container without
``CAP_SYS_PTRACE``), fails ``start`` with what to do, before any profile runs.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any, Callable

STOP_S = 10.0  # py-spy writes its samples when interrupted; a loaded host takes a while
WATCH_S = 0.2  # how often the recorder looks for workers forked during the profile
# py-spy names a Python frame ``qualname (path:line)``, the path relative to its
# sys.path entry. The task's own code is inside the innermost of these frames:
_BOUNDARIES = {("Worker._execute", "lightwork/engines/local/worker.py"),
               ("_invoke", "lightwork/engines/local/actor_runners.py")}
# Inside one but the runtime's own: a pool thread handing a call to the loop, reading
# the worker's memory, a profile stepping a coroutine.
_RUNTIME = {"AsyncRunner.call", "AsyncRunner.run", "MemoryProbe.before", "MemoryProbe.after"}
_STEPS = "Steps.__await__"
_ADDRESS = re.compile(r"^0x[0-9a-f]+ \((.*)\)$")
_LINE = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")


def _parts(frame: str) -> tuple[str, str]:
    """``"Worker._execute (lightwork/engines/local/worker.py:684)"`` -> its function
    and its file."""
    named = _LINE.match(frame)
    return (named.group(1), named.group(2)) if named else (frame, "")

PTRACE_HELP = ("py-spy needs permission to ptrace the workers: run as root or with "
               "sudo, allow it with `sysctl kernel.yama.ptrace_scope=0`, or in a "
               "container add CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE)")


def py_spy() -> str:
    """py-spy's executable, or a FileNotFoundError saying how to install it."""
    found = shutil.which("py-spy") or shutil.which(
        "py-spy", path=os.path.dirname(sys.executable))
    if found is None:
        raise FileNotFoundError("native frames need py-spy, which is not installed: "
                                "pip install py-spy (or profile without native)")
    return found


class NativeRecorder:
    """One profile's py-spy processes, one per worker."""

    def __init__(self, session_dir: str, hz: float, workers: dict[int, int],
                 live: Callable[[], dict[int, int]] | None = None) -> None:
        self.session_dir = session_dir
        self.hz = hz
        self.workers = dict(workers)  # worker_id -> pid
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._live = live  # the node's live workers now, for the watcher
        self._lock = threading.Lock()  # the watcher's additions against stop
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self._exe = ""

    def _path(self, worker_id: int) -> str:
        return os.path.join(self.session_dir, f"native-w{worker_id}.txt")

    def start(self) -> None:
        exe = py_spy()
        if self.workers:  # one quick look first: a clear error rather than no samples
            pid = next(iter(self.workers.values()))
            probe = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True,
                                   text=True, timeout=STOP_S)
            if probe.returncode != 0 and _denied(probe.stderr):
                raise PermissionError(f"{PTRACE_HELP} ({probe.stderr.strip()})")
        self._exe = exe
        for worker_id, pid in self.workers.items():
            self._record(worker_id, pid)
        if self._live is not None:
            self._watcher = threading.Thread(target=self._watch, daemon=True,
                                             name="lightwork-native-watch")
            self._watcher.start()

    def _record(self, worker_id: int, pid: int) -> None:
        path = self._path(worker_id)
        if os.path.exists(path):
            os.unlink(path)
        self.workers[worker_id] = pid
        self.processes[worker_id] = subprocess.Popen(
            [self._exe, "record", "--native", "--format", "raw", "--rate", str(int(self.hz)),
             "--pid", str(pid), "--output", path],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def _watch(self) -> None:
        assert self._live is not None
        while not self._stopping.wait(WATCH_S):
            try:
                live = self._live()
            except Exception:  # noqa: BLE001 - the node closing: nothing more to attach
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                for worker_id, pid in live.items():
                    if worker_id not in self.processes:
                        try:
                            self._record(worker_id, pid)
                        except OSError:  # py-spy gone since start: the rest still stop
                            return

    def stop(self, labels: dict[int, set[str]]) -> list[dict[str, Any]]:
        """Stop every py-spy; each worker's counts, as a worker's sampler gives them.
        ``labels``: the task functions that ran on each worker."""
        with self._lock:  # the watcher adds no recording from here on
            self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(timeout=STOP_S)
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        results = []
        for worker_id, process in self.processes.items():
            try:
                _out, err = process.communicate(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                _out, err = process.communicate()
            path = self._path(worker_id)
            try:
                with open(path) as f:
                    text = f.read()
                os.unlink(path)
            except OSError:
                text = ""
            counts = label_stacks(text, labels.get(worker_id, set()))
            results.append({
                "worker_id": worker_id, "pid": self.workers[worker_id], "hz": self.hz,
                "samples": sum(n for _l, _f, n in counts), "final": True, "native": True,
                "counts": counts, "memory": {}, "lines": {}, "memray": {},
                "error": "" if text else (err or b"").decode(errors="replace").strip()[-500:]})
        return results


def _denied(stderr: str) -> bool:
    text = stderr.lower()
    return "permission" in text or "operation not permitted" in text or "ptrace" in text


def _frame(raw: str) -> str:
    """py-spy's ``name (path:line)`` as ``name (file)``; an unnamed C frame as its
    library, in brackets."""
    address = _ADDRESS.match(raw)
    if address:
        return f"[{address.group(1)}]"
    function, file = _parts(raw)
    return f"{function} ({os.path.basename(file)})" if file else raw


def label_stacks(text: str, labels: set[str]) -> list[list[Any]]:
    """py-spy's raw output (``frame;frame;... count``, outermost first) as
    ``[label, frames, count]`` per task stack (module docstring)."""
    by_name: dict[str, list[str]] = {}
    for label in labels:
        by_name.setdefault(label.rsplit(".", 1)[-1], []).append(label)
    merged: dict[tuple[str, tuple[str, ...]], int] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        parts = [_parts(f) for f in frames]
        inside = [i for i, (function, file) in enumerate(parts)
                  if (function, file.replace(os.sep, "/")) in _BOUNDARIES]
        if not inside or inside[-1] + 1 >= len(frames):
            continue
        first = inside[-1] + 1
        if parts[first][0] in _RUNTIME:
            continue
        task = [f for f, (function, _file) in zip(frames[first:], parts[first:])
                if function != _STEPS]
        name = parts[first][0]
        if name in labels:
            label = name
        else:
            found = by_name.get(name.rsplit(".", 1)[-1], [])
            label = found[0] if len(found) == 1 else name
        key = (label, tuple(_frame(f) for f in task))
        merged[key] = merged.get(key, 0) + int(count)
    return [[label, list(frames), n] for (label, frames), n in merged.items()]
