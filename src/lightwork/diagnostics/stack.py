"""Stack dumps of every thread of the driver and of every worker and actor process.

``stack()`` (and ``lightwork stack`` from another terminal) needs no external tool, no
sudo and no ptrace: the runtime asks its own processes. The driver lists its threads
with ``sys._current_frames``; each worker has faulthandler registered on ``SIGUSR1``
(see ``kernel/control.py``), so the dump is written by a C signal handler and works
while the worker sleeps in C, runs a long numpy call or holds the GIL. Every worker is
signalled at once and each has its own deadline (``timeout``), so one stopped process
never hangs the command: it is reported as ``timeout`` with whatever it wrote.

Each process is labelled with its worker id, pid, role (task worker or actor) and what
it runs. Frames read oldest first, like a traceback, with their source line; the
runtime's own outer frames (worker loop, fork server, the standard library's thread and
event-loop plumbing, and on the cluster backend the engine's layers under a task) are
folded into one line unless ``full=True``; so are, in a worker whose fork server was
forked from the driver, the driver's frames at ``init`` that the fork copied below the
fork server's. A thread inside a lightwork call (a ``get``) shows the user's line, the
call into lightwork and the innermost frame (what it waits on), with the frames between
folded.

``native=True`` also runs ``py-spy dump --native`` on every process when py-spy is
installed (it shows C frames too, and needs ptrace permission), and otherwise says how
to install it.
"""

from __future__ import annotations

import linecache
import os
import re
import shutil
import subprocess
import threading
from typing import Any

from lightwork.kernel.control import DEFAULT_STACK_TIMEOUT_S
from lightwork.kernel.introspect import LIGHTWORK_DIR

__all__ = ["StackDump", "format_stacks", "native_stacks", "parse_faulthandler", "stack"]

_THREAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*?)\])? \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_PACKAGE_DIR = LIGHTWORK_DIR.rstrip(os.sep)  # (kernel.introspect's)
_FORK_SERVER_FILE = os.path.join(_PACKAGE_DIR, "engines", "local", "forkserver.py")

PY_SPY_MISSING = (
    "native stacks need py-spy, which is not installed: `pip install py-spy` "
    "(attaching to another process may also need `sudo` or "
    "`sysctl kernel.yama.ptrace_scope=0`)")


_STDLIB_DIR = os.path.dirname(os.path.abspath(threading.__file__))
# Plumbing between a thread's start and the user's code: the standard library's thread
# pools and event loops, and on the cluster backend the engine's own layers (a Dask
# worker thread runs a task through distributed, dask and tornado before lightwork's).
_STDLIB_PLUMBING = tuple(os.path.join(_STDLIB_DIR, name) for name in (
    "threading.py", "asyncio" + os.sep, "concurrent" + os.sep, "selectors.py", "queue.py",
    "socketserver.py"))
_ENGINE = re.compile(r"[/\\](?:site|dist)-packages[/\\](?:distributed|dask|tornado)[/\\]")
#: Frames kept on the inner side of a fold: the call into lightwork and the innermost.
INNER_KEPT = 2


def _foldable(filename: str) -> bool:
    """Frames that are not the user's: lightwork's modules, the fork server's -c, the
    standard library's thread and event-loop plumbing, the cluster engine's modules."""
    return (filename.startswith(_PACKAGE_DIR + os.sep) or filename == "<string>"
            or filename.startswith(_STDLIB_PLUMBING) or _ENGINE.search(filename) is not None)


def _fold_label(frames: list[list[Any]], side: str) -> str:
    """``[N outer frames of lightwork, Dask and thread start-up; ...]``, naming only
    the layers the folded frames belong to."""
    layers = []
    if any(name.startswith(_PACKAGE_DIR + os.sep) or name == "<string>" for name, *_ in frames):
        layers.append("lightwork")
    if any(_ENGINE.search(name) for name, *_ in frames):
        layers.append("Dask")
    if any(name.startswith(_STDLIB_PLUMBING) for name, *_ in frames):
        layers.append("thread start-up" if side == "outer" else "the standard library")
    named = " and ".join([", ".join(layers[:-1]), layers[-1]] if len(layers) > 1 else layers)
    return f"[{len(frames)} {side} frames of {named}; --full shows them]"


class StackDump(str):
    """The dump as text; shown as-is at the interactive prompt."""

    def __repr__(self) -> str:
        return str(self)


def stack(native: bool = False, timeout: float = DEFAULT_STACK_TIMEOUT_S,
          full: bool = False) -> StackDump:
    """Current Python stacks of every thread of the driver, workers and actors."""
    from lightwork.state import query

    data = query("stacks", request_timeout=timeout + 10.0, timeout=timeout)
    text = format_stacks(data, full=full)
    if native:
        text += "\n" + native_stacks(data, timeout=max(timeout, 5.0))
    return StackDump(text)


def parse_faulthandler(text: str) -> list[dict[str, Any]]:
    """Threads of a faulthandler dump, frames oldest first (it prints newest first)."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        match = _THREAD.match(line)
        if match:
            current = match.group(1) == "Current thread"
            name = match.group(3) or ("wrote this dump" if current else "")
            threads.append({"id": int(match.group(2), 16), "name": name, "frames": [], "notes": []})
            continue
        if not threads:
            continue
        frame = _FRAME.match(line)
        if frame:
            threads[-1]["frames"].append([frame.group(1), int(frame.group(2)), frame.group(3)])
        elif line.strip():
            threads[-1]["notes"].append(line.strip())  # "<no Python frame>", "..."
    for thread in threads:
        thread["frames"].reverse()
    return threads


def _format_thread(thread: dict[str, Any], full: bool) -> list[str]:
    name = thread.get("name") or ""
    title = f"Thread {name} ({thread['id']:#x})" if name else f"Thread {thread['id']:#x}"
    lines = [title + ":"]
    frames = thread["frames"]
    folded = 0  # outer frames folded
    inner: tuple[int, int] | None = None  # (first, end) of the inner frames folded
    if not full:
        # Frames below the fork server's are a forked driver's, not this process's work.
        for index, frame in enumerate(frames[:-1]):
            if frame[0] == _FORK_SERVER_FILE:
                folded = index
                break
        while folded < len(frames) - 1 and _foldable(frames[folded][0]):
            folded += 1
        if folded == 1:
            folded = 0  # folding one line saves nothing
        # Past the user's innermost frame, the thread is inside lightwork (a get, say):
        # keep the call into it and the innermost frame (what it waits on), fold the rest.
        last_own = max((index for index in range(folded, len(frames))
                        if not _foldable(frames[index][0])), default=None)
        if last_own is not None and len(frames) - last_own - 1 > INNER_KEPT + 1:
            inner = (last_own + 2, len(frames) - 1)
    if folded:
        lines.append(f"  {_fold_label(frames[:folded], 'outer')}")
    for index in range(folded, len(frames)):
        if inner is not None and inner[0] <= index < inner[1]:
            if index == inner[0]:
                lines.append(f"  {_fold_label(frames[inner[0]:inner[1]], 'inner')}")
            continue
        filename, lineno, function = frames[index]
        lines.append(f'  File "{filename}", line {lineno}, in {function}')
        source = linecache.getline(filename, lineno).strip()
        if source:
            lines.append(f"    {source}")
    for note in thread.get("notes", []):
        lines.append(f"  {note}")
    if not frames and not thread.get("notes"):
        lines.append("  (no Python frame)")
    return lines


def format_stacks(data: dict[str, Any], full: bool = False) -> str:
    """Text of a ``stacks`` reply: the driver first, then each worker by id."""
    workers = sorted(data.get("workers", []), key=lambda w: w["worker_id"])
    driver = data["driver"]
    out = [f"lightwork stack: the driver and {len(workers)} worker process(es)", ""]
    out.append(f"=== driver (pid {driver['pid']}) ===")
    for thread in sorted(driver["threads"], key=lambda t: (t["name"] != "MainThread", t["name"])):
        out += _format_thread(thread, full) + [""]
    for worker in workers:
        out.append(f"=== worker {worker['worker_id']} (pid {worker['pid'] or '?'}) · "
                   f"{worker['label']} · {worker['doing']} ===")
        if worker.get("note"):
            out.append(f"[{worker['status']}: {worker['note']}]")
        threads = worker.get("threads") or parse_faulthandler(worker.get("text") or "")
        for thread in threads:
            out += _format_thread(thread, full) + [""]
        if not threads:
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def native_stacks(data: dict[str, Any], timeout: float = 5.0) -> str:
    """``py-spy dump --native`` of the driver and every worker, or how to get py-spy."""
    exe = shutil.which("py-spy")
    if exe is None:
        return PY_SPY_MISSING + "\n"
    targets = [("driver", data["driver"]["pid"])] + [
        (f"worker {w['worker_id']} · {w['label']}", w["pid"])
        for w in sorted(data.get("workers", []), key=lambda w: w["worker_id"]) if w.get("pid")
    ]
    out = ["native stacks (py-spy dump --native):", ""]
    for label, pid in targets:
        out.append(f"=== {label} (pid {pid}) ===")
        try:
            done = subprocess.run([exe, "dump", "--native", "--pid", str(pid)],
                                  capture_output=True, text=True, timeout=timeout)
            out.append(done.stdout.rstrip() if done.returncode == 0 else (
                f"py-spy failed ({done.stderr.strip() or done.returncode}); it needs permission "
                "to ptrace the process: run with sudo or set kernel.yama.ptrace_scope=0"))
        except subprocess.TimeoutExpired:
            out.append(f"py-spy did not finish within {timeout:g} s")
        out.append("")
    return "\n".join(out)
