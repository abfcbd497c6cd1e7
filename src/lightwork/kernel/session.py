"""The session's directories, shared by both engines.

A session has two private directories (mode 0700):

* ``<tmp>/lightwork-<uid>/session_<time>_<pid>``: the place for the control socket and
  logs that diagnostics attach to;
* ``/dev/shm/lightwork-session_<time>_<pid>``: shared-memory segment files of large
  objects (falls back to a folder in the session directory where ``/dev/shm`` is absent).

and a spill directory on disk for objects moved out of memory (``spill.py``): ``spill``
in the session directory, or ``lightwork-spill-session_<...>`` inside the directory the
user chose (``init(_spill_dir=)`` or Ray's ``object_spilling_config``).

All are removed at shutdown, by the fork server if the driver dies, and (all but a
user-chosen spill directory) at the next ``init`` on this machine if both of those were
killed (their pid is gone).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass

SHM_ROOT = "/dev/shm"
SHM_PREFIX = "lightwork-"


def sessions_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"lightwork-{os.getuid()}")


@dataclass
class Session:
    name: str
    directory: str
    shm_dir: str
    spill_dir: str

    @classmethod
    def create(cls, spill_root: str | None = None) -> Session:
        remove_stale_sessions()
        name = time.strftime("session_%Y-%m-%d_%H-%M-%S_") + f"{time.monotonic_ns() % 1000000:06d}_{os.getpid()}"
        root = sessions_root()
        os.makedirs(root, mode=0o700, exist_ok=True)
        directory = os.path.join(root, name)
        os.mkdir(directory, 0o700)
        if os.path.isdir(SHM_ROOT) and os.access(SHM_ROOT, os.W_OK):
            shm_dir = os.path.join(SHM_ROOT, SHM_PREFIX + name)
        else:
            shm_dir = os.path.join(directory, "objects")
        os.mkdir(shm_dir, 0o700)
        if spill_root is None:
            spill_dir = os.path.join(directory, "spill")
        else:
            spill_dir = os.path.join(spill_root, "lightwork-spill-" + name)
        try:
            os.makedirs(spill_dir, 0o700)
        except OSError:
            pass  # a read-only spill root: the spiller reports it when it first needs it
        return cls(name, directory, shm_dir, spill_dir)

    def remove(self) -> None:
        shutil.rmtree(self.shm_dir, ignore_errors=True)
        shutil.rmtree(self.spill_dir, ignore_errors=True)
        shutil.rmtree(self.directory, ignore_errors=True)


def driver_pid(name: str) -> int | None:
    """The driver's pid a session directory's name ends with (``..._<pid>``), or None."""
    try:
        return int(name.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process of that pid exists (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_sessions() -> None:
    """Remove directories of sessions whose driver and fork server are both gone."""
    candidates = []
    if os.path.isdir(SHM_ROOT):
        candidates += [
            os.path.join(SHM_ROOT, entry)
            for entry in os.listdir(SHM_ROOT)
            if entry.startswith(SHM_PREFIX + "session_")
        ]
    root = sessions_root()
    if os.path.isdir(root):
        candidates += [os.path.join(root, entry) for entry in os.listdir(root)]
    for path in candidates:
        pid = driver_pid(os.path.basename(path))
        if pid is not None and pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)


__all__ = ["SHM_PREFIX", "SHM_ROOT", "Session", "driver_pid", "pid_alive", "remove_stale_sessions",
           "sessions_root"]
