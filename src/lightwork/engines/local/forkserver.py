"""The fork server: starts worker processes in milliseconds and cleans up after the driver.

``init()`` makes this process one of two ways (``session.fork_server_start_method``):

* **fork** (the default): ``os.fork()`` of the driver itself, no exec. Everything the driver
  imported is there already, so the first workers start within milliseconds of ``init`` and
  the first batch of tasks runs as fast as later ones. Only done while it is safe and cheap:
  the driver has one OS thread (a second thread, Python's or a library's, could hold a lock
  that the child would inherit locked forever) and at most ``FORK_RSS_LIMIT`` resident.
* **exec**: ``python -c`` (safe whatever threads the driver has), which imports the worker's
  part of lightwork and cloudpickle before it can serve (0.1-0.2 s of CPU): the first batch
  after ``init`` waits for that. Used when the driver has threads (a second ``init`` after
  ``shutdown`` has none of lightwork's left), is large, or ``LIGHTWORK_FORKSERVER=exec``.

Either way it runs in a new session, so a Ctrl-C in the terminal reaches the driver only,
and freezes its heap (``gc.freeze``) so a worker's collections never write to, and so copy,
the pages it shares with this process.

What a forked server inherits from the driver, and what it does about it
(``main_in_forked_driver``):

* memory: the driver's heap, copy-on-write. Workers share it; their unique memory stays a
  few MB, but their RSS counts the shared pages (about the driver's RSS at ``init``: 26 MB
  after ``import lightwork``, more if the program imported numpy or made data first). Pages
  the driver rewrites after ``init`` are copied once, which ``FORK_RSS_LIMIT`` bounds.
  Mappings the driver holds (``mmap``) stay mapped here for the session.
* file descriptors: every one except stdout, stderr and the control socket is pointed at
  ``/dev/null`` with ``dup2`` (stdin too, as for the exec'd server). That lets go of the
  driver's pipes, sockets and files (a pipe's write end left open here would keep its
  reader from ever seeing EOF; the driver's end of the control socket would keep this
  process from seeing the driver die), while the numbers stay taken, so a stale Python
  file object's finalizer can never close a descriptor opened later.
* signal handlers: reset to a fresh interpreter's (the driver's own handlers, and asyncio's
  wake-up fd, must not run here); then as below.
* module state: the driver's modules as they were at ``init``, including ``__main__`` and
  any module globals it had changed; lightwork's per-process reference counts are reset.
  A task's function still arrives by value or by import, as with the exec'd server.
* the driver's call stack at ``init``: those frames stay below the worker's in the worker's
  main thread; ``lightwork.stack()`` folds them with lightwork's outer frames.

Protocol with the driver:

    driver --SPAWN(worker_id, config) + one socket fd (SCM_RIGHTS)--> fork server
           --PRELOAD(module names, thread variables[, in the background])-->
           <--SPAWNED(worker_id, pid) / EXITED(worker_id, pid, wait status)--
           <--PRELOADED(0, report)--

A PRELOAD imports the driver's libraries here before the spawns that follow it, so that
the workers forked from then on have them (``preload.py`` says which, and why). One in
the background (sent at ``init``) stops as soon as the driver sends anything else.

For each SPAWN it forks; the child becomes a worker on the socket it was given, with
the driver's ``sys.path``, working directory and environment additions. Children are
reaped on SIGCHLD and their exit status is reported, so the driver can say *how* a
worker died. Workers get a parent-death signal, so they die with the fork server.

When the control socket closes — ``shutdown()``, or the driver died, even by SIGKILL —
the fork server kills every worker it started, removes the session's shared-memory and
session directories, and exits. Nothing of the session is left behind.

Forking the driver brings the first result of a fresh ``init`` about three times
sooner than the exec'd server, and the first batch as fast as later ones; workers of
either kind cost a few MB of their own (measured: see bench/HOTPATH.md, "Fork server
start-up").

A driver that imported numpy before ``init`` has an OpenBLAS thread, so it gets the exec'd
server (and the same figures as the exec'd column).
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import select
import shutil
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from lightwork.engines.local import preload

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
    from lightwork.engines.local import worker

    # Workers are forked from here: a collection in a worker must not touch (and so copy)
    # the objects this process holds, shared with every worker.
    gc.freeze()
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


def main_in_forked_driver(control_fd: int, cleanup_paths: list[str]) -> None:
    """Entry in a child ``os.fork``-ed from the driver at ``init``; never returns.

    Lets go of what it inherited (see the module docstring), then serves as ``main``.
    The driver's end of the control socket is one of the descriptors let go.
    """
    try:
        os.setsid()
        _forget_driver_signals()
        _release_driver_descriptors(keep={1, 2, control_fd})
        from lightwork.kernel.object_ref import ref_counter

        ref_counter.reset()
        ref_counter.on_borrow = None
        ref_counter.on_first_release = None
        main(control_fd, cleanup_paths)
    finally:
        os._exit(1)


def _forget_driver_signals() -> None:
    signal.set_wakeup_fd(-1)
    fresh: dict[int, Callable[..., Any] | int] = {
        signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN,
        signal.SIGXFSZ: signal.SIG_IGN}
    for sig in signal.valid_signals():
        try:
            current = signal.getsignal(sig)
        except ValueError:
            continue
        wanted = fresh.get(sig, signal.SIG_DFL)
        if current is None or current == wanted:  # None: installed outside Python
            continue
        try:
            signal.signal(sig, wanted)
        except (OSError, ValueError, RuntimeError):
            pass


def _release_driver_descriptors(keep: set[int]) -> None:
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return  # no /proc: the exec'd server is used where this matters (Linux only)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        if fd in keep or fd == null:
            continue
        try:
            os.fstat(fd)  # the listing's own descriptor is closed by now
        except OSError:
            continue
        os.dup2(null, fd)
    os.close(null)


def _serve(control: socket.socket, wake_read: int, children: dict[int, int], run_worker: Any) -> None:
    buffer = b""
    watched: list[socket.socket | int] = [control, wake_read]
    while True:
        readable, _, _ = select.select(watched, [], [])
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
                elif message[0] == preload.PRELOAD:  # before the spawns that follow it
                    # A background preload (at init) gives way to the driver's next
                    # message; none if that is here already.
                    background = len(message) > 3 and message[3]
                    if background and len(buffer) >= 4:
                        continue
                    report = preload.import_modules(
                        message[1], message[2],
                        stop_when_readable=control.fileno() if background else None)
                    report["background"] = bool(background)
                    gc.freeze()  # (as at start: the new modules are shared with workers)
                    _send(control, (preload.PRELOADED, 0, report))


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
