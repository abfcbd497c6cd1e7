"""Stack dumps of every thread of the driver and of every worker and actor process.

``stack()`` (and ``lightwork stack`` from another terminal) needs no external tool, no
sudo and no ptrace: the runtime asks its own processes. The driver lists its threads
with ``sys._current_frames``; each worker has faulthandler registered on ``SIGUSR1``
(see ``_runtime/control.py``), so the dump is written by a C signal handler and works
while the worker sleeps in C, runs a long numpy call or holds the GIL. Every worker is
signalled at once and each has its own deadline (``timeout``), so one stopped process
never hangs the command: it is reported as ``timeout`` with whatever it wrote.

Each process is labelled with its worker id, pid, role (task worker or actor) and what
it runs. Frames read oldest first, like a traceback, with their source line; the
runtime's own outer frames (worker loop, fork server) are folded into one line unless
``full=True``; so are, in a worker whose fork server was forked from the driver, the
driver's frames at ``init`` that the fork copied below the fork server's.

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
from typing import Any

from lightwork._runtime.control import DEFAULT_STACK_TIMEOUT_S

__all__ = ["StackDump", "format_stacks", "native_stacks", "parse_faulthandler", "stack"]

_THREAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*?)\])? \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FORK_SERVER_FILE = os.path.join(_PACKAGE_DIR, "_runtime", "forkserver.py")

PY_SPY_MISSING = (
    "native stacks need py-spy, which is not installed: `pip install py-spy` "
    "(attaching to another process may also need `sudo` or "
    "`sysctl kernel.yama.ptrace_scope=0`)")


def _foldable(filename: str) -> bool:
    """The runtime's own outer frames: lightwork's modules, the fork server's -c, threads."""
    return (filename.startswith(_PACKAGE_DIR + os.sep) or filename == "<string>"
            or os.path.basename(filename) == "threading.py")


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
    folded = 0
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
    if folded:
        lines.append(
            f"  [{folded} outer frames of lightwork and thread start-up; --full shows them]")
    for filename, lineno, function in frames[folded:]:
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
