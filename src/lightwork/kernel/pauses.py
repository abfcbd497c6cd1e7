"""The driver's side of the in-task debugger (``debugger.py``): the calls paused now.

Workers announce each pause and its end (the local engine in a frame); the driver keeps
them here, by the paused call's socket, prints one line per pause, and answers the
control operation ``debug_paused`` from :meth:`PauseTable.rows`, which ``lightwork
debug`` lists and attaches from. Importing this module imports no debugger.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

#: The first byte of the status line that ends a debugging session (never in pdb's text).
STATUS = "\x00"

class PauseTable:
    """The driver's list of calls paused in the debugger now, by their socket path.

    Filled from the workers' announcements (with the runtime's lock held), read by the
    views and the control operation ``debug_paused`` (its own lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.paused: dict[str, dict[str, Any]] = {}

    def __bool__(self) -> bool:
        return bool(self.paused)

    def add(self, info: dict[str, Any]) -> None:
        with self.lock:
            self.paused[info["socket"]] = info

    def remove(self, path: str) -> dict[str, Any] | None:
        with self.lock:
            return self.paused.pop(path, None)

    def drop_worker(self, worker_id: int) -> list[dict[str, Any]]:
        """Forget the pauses of a worker that ended (its sockets are removed here: the
        process that made them cannot)."""
        with self.lock:
            gone = [info for info in self.paused.values() if info["worker_id"] == worker_id]
            for info in gone:
                del self.paused[info["socket"]]
        for info in gone:
            if not info["socket"].startswith("tcp://"):
                try:
                    os.unlink(info["socket"])
                except OSError:
                    pass
        return gone

    def task_ids(self) -> set[int]:
        with self.lock:
            return {info["task_id"] for info in self.paused.values()}

    def open_windows(self) -> dict[int, float]:
        """Task id -> when its pause began, for the calls paused now."""
        with self.lock:
            return {info["task_id"]: info["since"] for info in self.paused.values()}

    def rows(self) -> list[dict[str, Any]]:
        """The paused calls, oldest first, with how long each has been paused."""
        now = time.monotonic()
        with self.lock:
            infos = sorted(self.paused.values(), key=lambda info: info["since"])
        return [{**info, "paused_s": max(0.0, now - info["since"])} for info in infos]


def pause_line(info: dict[str, Any]) -> str:
    """The one line the driver prints when a call pauses."""
    where = f"{info['function']} at {info['file']}:{info['line']}"
    if info["kind"] == "debugpy":
        host = info.get("host")  # a cluster worker's machine: debugpy is on its loopback
        port = str(info["address"]).rpartition(":")[2]
        there = (f" on {host} (from another machine: ssh -L {port}:127.0.0.1:{port} {host})"
                 if host else "")
        return (f"lightwork: {info['name']} (task {info['task_id']}) waits for a "
                f"debugger at {where}, worker pid {info['pid']}: attach your editor to "
                f"{info['address']}{there}")
    how = (f"stopped after it raised {info['error']}" if info["kind"] == "post-mortem"
           else "paused at a breakpoint")
    return (f"lightwork: {info['name']} (task {info['task_id']}) {how} in {where}, "
            f"worker pid {info['pid']}: run `lightwork debug` to attach")
