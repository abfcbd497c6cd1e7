"""The session's directories and its fork server process.

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
import signal
import socket
import subprocess
import sys
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


def _pid_of(name: str) -> int | None:
    try:
        return int(name.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
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
        pid = _pid_of(os.path.basename(path))
        if pid is not None and pid != os.getpid() and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)


# The fork server is forked from the driver (no exec) only while the driver's resident
# memory is at most this: a driver that later rewrites pages it had at init copies them
# (the fork server still shares them), and every worker's RSS counts the shared pages, so
# a big driver pays the exec'd server's start-up instead (see ``forkserver.py``).
FORK_RSS_LIMIT = 256 << 20
# "exec" forces the exec'd fork server ("fork" is the default wherever it is safe).
START_METHOD_VARIABLE = "LIGHTWORK_FORKSERVER"


def fork_server_start_method() -> str:
    """``"fork"`` if forking this driver now is safe and cheap, else ``"exec"``.

    Safe: one OS thread in the process (any other thread, Python's or a library's, might
    hold a lock the child would inherit locked). Cheap: resident memory within
    :data:`FORK_RSS_LIMIT`. Both read ``/proc/self``; elsewhere the answer is ``"exec"``.
    """
    if os.environ.get(START_METHOD_VARIABLE) == "exec" or not hasattr(os, "fork"):
        return "exec"
    try:
        if len(os.listdir("/proc/self/task")) != 1:
            return "exec"
        with open("/proc/self/statm", "rb") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return "exec"
    if resident_pages * os.sysconf("SC_PAGE_SIZE") > FORK_RSS_LIMIT:
        return "exec"
    return "fork"


class ForkedProcess:
    """The part of ``subprocess.Popen`` the node uses, for a child made by ``os.fork``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else (a user's os.wait)
                self.returncode = 0
                return 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"fork server (pid {self.pid})", timeout or 0.0)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ForkServer:
    """Handle on the fork server process (see ``forkserver.py``).

    ``start_method`` says how it was made: ``"fork"`` (a copy of this driver, ready at
    once) or ``"exec"`` (a fresh interpreter that imports the worker code first).
    """

    def __init__(self, session: Session) -> None:
        parent_end, child_end = socket.socketpair()
        cleanup_paths = [session.shm_dir, session.spill_dir, session.directory]
        self.start_method = fork_server_start_method()
        self.process: subprocess.Popen | ForkedProcess
        if self.start_method == "fork":
            self.process = _fork_from_driver(child_end, cleanup_paths)
        else:
            self.process = _exec_python(child_end, cleanup_paths)
        child_end.close()
        self.control = parent_end

    def spawn(self, worker_id: int, config: dict, worker_end: socket.socket) -> None:
        import pickle

        from lightwork._runtime.forkserver import SPAWN

        import select

        payload = pickle.dumps((SPAWN, worker_id, config))
        frame = [len(payload).to_bytes(4, "little") + payload]
        deadline = time.monotonic() + 10.0
        while True:  # the control socket is non-blocking (the I/O loop reads it)
            try:
                socket.send_fds(self.control, frame, [worker_end.fileno()])
                return
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                select.select([], [self.control], [], left)

    def stop(self, timeout: float = 2.0) -> None:
        try:
            self.control.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _exec_python(child_end: socket.socket, cleanup_paths: list[str]) -> subprocess.Popen:
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # The worker's part of lightwork only (see lightwork/__init__.py): the first
    # workers start as soon as this import ends.
    code = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); "
        "os.environ['_LIGHTWORK_WORKER_IMPORT'] = '1'; "
        "from lightwork._runtime.forkserver import main; "
        "del os.environ['_LIGHTWORK_WORKER_IMPORT']; "
        "main(int(sys.argv[2]), sys.argv[3:])"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, src, str(child_end.fileno()), *cleanup_paths],
        pass_fds=(child_end.fileno(),),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _fork_from_driver(child_end: socket.socket, cleanup_paths: list[str]) -> ForkedProcess:
    # Text still buffered in the driver's streams would be printed again by each worker.
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    pid = os.fork()
    if pid == 0:  # the fork server: never returns into the driver's code
        try:
            from lightwork._runtime import forkserver

            forkserver.main_in_forked_driver(child_end.fileno(), cleanup_paths)
        finally:
            os._exit(1)
    return ForkedProcess(pid)
