"""The driver's side of the fork server: start it, ask it for workers.

The fork server (``forkserver.py``) is forked from the driver while that is safe and
cheap (one thread, small RSS: :func:`fork_server_start_method`), else started as a fresh
Python (exec). Either way the driver talks to it over one socket pair, and the server
removes the session's directories if the driver dies.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable

from lightwork.engines.local import preload
from lightwork.kernel.session import Session

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
        # What the fork server said of each preload (preload.import_modules's reports).
        self.preloaded: list[dict] = []
        # The modules the fork server has or was sent (a forked server: the driver's as
        # of now), the packages the work's pickles named so far, and len(sys.modules)
        # when it was last compared.
        forked = self.start_method == "fork"
        self._modules_known: set[str] = set(sys.modules) if forked else set()
        self._packages: set[str] = set()
        self._modules_seen = -1

    def spawn(self, worker_id: int, config: dict, worker_end: socket.socket) -> None:
        from lightwork.engines.local.forkserver import SPAWN

        self._send((SPAWN, worker_id, config), [worker_end.fileno()])

    def preload_in_background(self, env: dict[str, str],
                              excluded_dirs: Iterable[str] = ()) -> bool:
        """At ``init``, with no worker forked yet: have the fork server import the
        driver's libraries until the driver next needs it (the first spawn's own
        preload follows, for what that work names). False if there is none to import."""
        names = preload.modules_to_preload(sys.modules, (), excluded_dirs)
        if names:
            self._send((preload.PRELOAD, names, env, True), [])
        return bool(names)

    def preload_new_modules(self, env: dict[str, str], excluded_dirs: Iterable[str] = (),
                            waiting: Callable[[], list[bytes]] | None = None) -> None:
        """Before a spawn (the caller holds the node's lock): have the fork server
        import the driver's modules of the packages the new worker's work names, as
        ``preload.modules_to_preload`` chooses, before it forks the next worker; its
        report comes back in ``preloaded``. ``waiting`` gives the heads of the pickles
        of the work waiting for workers (``preload.py`` says why these); once they name
        nothing new, one ``len`` tells whether the driver imported anything since."""
        if not preload.enabled():
            return
        if waiting is not None:
            named = preload.packages_named(waiting(), sys.modules)
            if not named <= self._packages:
                self._packages |= named
                self._modules_seen = -1  # packages not sent yet: look again
        if len(sys.modules) == self._modules_seen or not self._packages:
            return
        self._modules_seen = len(sys.modules)
        names = preload.modules_to_preload(sys.modules, self._modules_known, excluded_dirs,
                                           self._packages)
        self._modules_known.update(names)
        if names:
            self._send((preload.PRELOAD, names, env), [])

    def _send(self, message: tuple, fds: list[int]) -> None:
        import pickle
        import select

        payload = pickle.dumps(message)
        frame = [len(payload).to_bytes(4, "little") + payload]
        deadline = time.monotonic() + 10.0
        rest = memoryview(frame[0])
        while rest:  # the control socket is non-blocking (the I/O loop reads it)
            try:
                if fds:  # (a spawn's frame is small: sent whole, with its descriptor)
                    socket.send_fds(self.control, frame, fds)
                    return
                rest = rest[self.control.send(rest):]
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
    # The directory that holds the lightwork package (.../src, or site-packages): this
    # file is lightwork/engines/local/fork_client.py. Not lightwork/ itself, whose
    # modules (cloudpickle.py, dask/, ...) would shadow the packages of those names.
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    # The worker's part of lightwork only (see lightwork/__init__.py): the first
    # workers start as soon as this import ends.
    code = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); "
        "os.environ['_LIGHTWORK_WORKER_IMPORT'] = '1'; "
        "from lightwork.engines.local.forkserver import main; "
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
            from lightwork.engines.local import forkserver

            forkserver.main_in_forked_driver(child_end.fileno(), cleanup_paths)
        finally:
            os._exit(1)
    return ForkedProcess(pid)
