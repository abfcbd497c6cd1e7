"""The fork server: starts worker processes in milliseconds and cleans up after the driver.

``init()`` starts this process with ``python -c`` (exec, so it is safe whatever threads
the driver has) in a new session, so a Ctrl-C in the terminal reaches the driver only.
It preloads the worker code (lightwork, cloudpickle) and then waits on its control socket:

    driver --SPAWN(worker_id, config) + one socket fd (SCM_RIGHTS)--> fork server
           <--SPAWNED(worker_id, pid) / EXITED(worker_id, pid, wait status)--

For each SPAWN it forks; the child becomes a worker on the socket it was given, with
the driver's ``sys.path``, working directory and environment additions. Children are
reaped on SIGCHLD and their exit status is reported, so the driver can say *how* a
worker died. Workers get a parent-death signal, so they die with the fork server.

When the control socket closes — ``shutdown()``, or the driver died, even by SIGKILL —
the fork server kills every worker it started, removes the session's shared-memory and
session directories, and exits. Nothing of the session is left behind.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import shutil
import signal
import socket
import sys
from typing import Any

SPAWN = "spawn"
SPAWNED = "spawned"
EXITED = "exited"
_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: EOF on the socket still ends workers
        pass


def main(control_fd: int, cleanup_paths: list[str]) -> None:
    control = socket.socket(fileno=control_fd)
    # Preload what every worker needs, once, before any fork.
    from lightwork._runtime import worker

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children: dict[int, int] = {}  # pid -> worker id
    try:
        _serve(control, wake_read, children, worker.main)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in list(children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        for path in cleanup_paths:
            shutil.rmtree(path, ignore_errors=True)
        os._exit(0)


def _serve(control: socket.socket, wake_read: int, children: dict[int, int], run_worker: Any) -> None:
    buffer = b""
    while True:
        readable, _, _ = select.select([control, wake_read], [], [])
        if wake_read in readable:
            os.read(wake_read, 4096)
            _reap(control, children)
        if control in readable:
            try:
                data, fds, _flags, _addr = socket.recv_fds(control, 1 << 16, 4)
            except OSError:
                return
            if not data:
                return
            buffer += data
            fds = list(fds)
            while len(buffer) >= 4:
                length = int.from_bytes(buffer[:4], "little")
                if len(buffer) < 4 + length:
                    break
                message = pickle.loads(buffer[4 : 4 + length])
                buffer = buffer[4 + length :]
                if message[0] == SPAWN:
                    _spawn(control, message[1], message[2], fds.pop(0), children, run_worker)


def _spawn(
    control: socket.socket,
    worker_id: int,
    config: dict[str, Any],
    fd: int,
    children: dict[int, int],
    run_worker: Any,
) -> None:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            control.close()
            set_parent_death_signal()
            run_worker(fd, worker_id, config)
            code = 0
        except BaseException:  # noqa: BLE001 - a worker must never return into the server
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(fd)
    children[pid] = worker_id
    _send(control, (SPAWNED, worker_id, pid))


def _reap(control: socket.socket, children: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        worker_id = children.pop(pid, None)
        if worker_id is not None:
            _send(control, (EXITED, worker_id, pid, status))


def _send(control: socket.socket, message: tuple[Any, ...]) -> None:
    payload = pickle.dumps(message)
    try:
        control.sendall(len(payload).to_bytes(4, "little") + payload)
    except OSError:
        pass


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
