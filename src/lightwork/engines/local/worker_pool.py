"""The driver's worker processes: starting them, their connections, signalling them.

Owns

* the fork server (``fork_client.py``), started before the node's I/O thread exists
  (it forks or execs; user threads do not matter), and its control socket's input:
  ``SPAWNED`` gives a worker's pid, ``EXITED`` its wait status;
* ``workers``: the driver's :class:`WorkerConn` of every worker process, pooled task
  workers and actors' alike, by worker id, from :meth:`WorkerPool.start` until the
  node finishes its death (:meth:`WorkerPool.forget`);
* what every worker starts with: the job's ``runtime_env`` and environment (one thread
  per task slot in numerical libraries unless the user chose, against the "no speedup"
  trap of multi-threaded numpy running in every worker at once).

A connection's life: started (no pid yet) -> spawned (pid known) -> EOF on its socket
(``eof_at``) -> dead once its exit status came or was waited for
(``worker_deaths.py``). A kill or cancel that comes before the pid is remembered on the
connection (``doomed``, ``interrupt_on_spawn``) and sent when ``SPAWNED`` arrives.

Threads: every method runs with the node's lock held. The pool knows nothing of the I/O
loop but the ``watch`` callback it is given, which puts a new worker's socket in the
loop's selectors; reading and sending frames are the loop's (``io_loop.py``), what a
worker's end does to tasks and objects the node's (``worker_deaths.py``). Tools read
``workers`` under the lock (as ``node.workers``) and never change it.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightwork.kernel import exceptions
from lightwork.kernel import ray_alias
from lightwork.kernel.object_ref import WORKER_NUMBERS
from lightwork.kernel.session import Session
from lightwork.engines.local import forkserver as fs
from lightwork.engines.local import preload
from lightwork.engines.local import protocol as p
from lightwork.engines.local.fork_client import ForkServer
from lightwork.engines.local.scheduler import Scheduler, WorkerSlot

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


@dataclass(eq=False)
class WorkerConn:
    """The driver's side of one worker process."""

    worker_id: int
    sock: socket.socket
    slot: WorkerSlot
    pid: int = 0
    decoder: p.FrameDecoder = field(default_factory=p.FrameDecoder)
    out: bytearray = field(default_factory=bytearray)
    functions: set[bytes] = field(default_factory=set)
    holds: set[int] = field(default_factory=set)
    owned: set[int] = field(default_factory=set)
    exit_status: int | None = None
    eof_at: float = 0.0
    dead: bool = False
    started_at: float = field(default_factory=time.monotonic)
    actor: Any = None  # the Actor this process runs, or None for a pooled task worker
    doomed: bool = False  # killed on purpose: SIGKILL sent, or sent once its pid is known
    interrupt_on_spawn: bool = False  # a cancel came before its pid: SIGINT once known
    oom_kill: str = ""  # why the memory monitor killed it, or ""
    # Its nested get/wait calls not yet answered, by request id: each lends the worker's
    # CPU until answered, or until the task that made it ends (worker_requests.py).
    waits: dict[int, dict[str, bool]] = field(default_factory=dict)


class WorkerPool:
    """The fork server and the connections of the worker processes it started."""

    def __init__(
        self, session: Session, scheduler: Scheduler, runtime_env: dict[str, Any] | None,
        job_id: int, event_budget: int,
    ) -> None:
        self.session = session
        self.scheduler = scheduler
        self.workers: dict[int, WorkerConn] = {}
        self.env = {name: "1" for name in THREAD_VARS if name not in os.environ}
        # init(runtime_env=...), normalized (runtime_env.py): set in every worker at start.
        self.runtime_env = runtime_env
        if runtime_env is not None:
            self.env.update(runtime_env["env_vars"])
        self.job_id = job_id
        self.event_budget = event_budget
        # Ids continue from the previous session (see kernel/object_ref.py).
        self._numbers = WORKER_NUMBERS
        self.forkserver = ForkServer(session)
        self.forkserver.control.setblocking(False)
        self._control_input = bytearray()
        #: Puts a new worker's socket in the I/O loop's selectors (set by the node).
        self.watch: Callable[[WorkerConn], None] = lambda conn: None
        #: The heads of the pickles of the work waiting for workers (set by the node:
        #: ``preload.waiting_pickles``), which say what the fork server preloads.
        self.waiting: Callable[[], list[bytes]] | None = None
        #: init's background preload ended before the first workers were forked.
        self.background_done = False
        #: What ``breakpoint()`` starts in a worker (kernel/debugger.py; set by the node).
        self.debugging: dict[str, Any] = {}

    def first_workers_at_init(self) -> bool:
        """Whether ``init`` forks the first workers. Not when the fork server was exec'd
        and the driver has libraries it could preload: those are sent to it now, to
        import in the background, and the first submission forks the workers, once its
        pickles say which of those libraries they need (preload.py)."""
        if self.forkserver.start_method == "fork" or not preload.enabled():
            return True
        job_env = self.runtime_env
        try:
            return not self.forkserver.preload_in_background(
                self.env, job_env["paths"] if job_env else ())
        except OSError as exc:
            raise exceptions.RuntimeSystemError(
                f"cannot start the workers: the fork server is gone ({exc})") from exc

    def start(self, pooled: bool = True, gpu: bool = False,
              work: Callable[[], list[bytes]] | None = None) -> WorkerConn:
        """Ask the fork server for a new worker; ``pooled``: a task worker with a slot in
        the scheduler (else an actor's process, whose slot is its own), of the GPU kind
        if ``gpu`` (it runs only tasks that need a GPU: see scheduler.py). ``work``: the
        heads of the pickles it will load first, if not the waiting tasks'."""
        worker_id = next(self._numbers)
        ours, theirs = socket.socketpair()
        job_env = self.runtime_env
        session = self.session
        config = {
            "sys_path": job_env["paths"] + sys.path if job_env else list(sys.path),
            "cwd": (job_env and job_env["working_dir"]) or os.getcwd(),
            "env": self.env,
            "as_ray": ray_alias.installed(),
            "job_id": self.job_id,
            "shm_dir": session.shm_dir,
            "spill_dir": session.spill_dir,
            "node_id": session.name,
            "total": dict(self.scheduler.total),
            "session_dir": session.directory,
            "event_budget": self.event_budget,
            **self.debugging,
            # PYTHONBREAKPOINT as the driver has it now: 0 turns the debugger off there.
            "breakpoint": os.environ.get("PYTHONBREAKPOINT"),
        }
        try:
            # The driver's libraries first, so the worker has them from birth (preload.py).
            self.forkserver.preload_new_modules(self.env, job_env["paths"] if job_env else (),
                                                work or self.waiting)
            self.forkserver.spawn(worker_id, config, theirs)
        except OSError as exc:
            theirs.close()
            ours.close()
            raise exceptions.RuntimeSystemError(
                f"cannot start a worker: the fork server is gone ({exc})") from exc
        theirs.close()
        ours.setblocking(False)
        slot = self.scheduler.add_worker(worker_id, gpu) if pooled else WorkerSlot(worker_id)
        conn = WorkerConn(worker_id, ours, slot)
        self.workers[worker_id] = conn
        self.watch(conn)
        return conn

    def forget(self, conn: WorkerConn) -> None:
        """``conn``'s process is dead and its end handled: it leaves the pool."""
        conn.dead = True
        self.workers.pop(conn.worker_id, None)

    def read_control(self) -> list[WorkerConn] | None:
        """Read the fork server's news (its control socket is readable): note pids and
        exit statuses. Return the workers whose exit status came after their socket
        closed (their deaths can be finished now), or None if the fork server is gone."""
        control = self.forkserver.control
        try:
            data = control.recv(1 << 16)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        if not data:
            return None
        ended = []
        buffer = self._control_input
        buffer += data
        while len(buffer) >= 4:
            length = int.from_bytes(buffer[:4], "little")
            if len(buffer) < 4 + length:
                break
            message = pickle.loads(bytes(buffer[4 : 4 + length]))
            del buffer[: 4 + length]
            if message[0] == preload.PRELOADED:
                report = message[2]
                self.forkserver.preloaded.append(report)
                # init's background preload ended before any submission: the workers
                # can be forked now, with every library the driver had (the node does).
                if report.get("background") and not report.get("interrupted") and not self.workers:
                    self.background_done = True
                continue
            conn = self.workers.get(message[1])
            if conn is None:
                continue
            if message[0] == fs.SPAWNED:
                conn.pid = message[2]
                if conn.doomed or conn.interrupt_on_spawn:  # kill/cancel came before the pid
                    _signal(conn.pid, signal.SIGKILL if conn.doomed else signal.SIGINT)
            elif message[0] == fs.EXITED:
                conn.exit_status = message[3]
                if conn.eof_at:
                    ended.append(conn)
        return ended

    def gone_reason(self) -> str:
        """Why no worker can be started (the fork server's control socket closed)."""
        process = self.forkserver.process
        return (f"the fork server (pid {process.pid}) exited with code {process.poll()}, "
                "so no worker can be started; its error, if any, is above")

    def interrupt(self, conn: WorkerConn, task_id: int, force: bool) -> None:
        """Cancel ``task_id`` on ``conn``'s worker: its id goes to the worker's cancel
        file, then SIGINT (SIGKILL with ``force``), now or once its pid is known."""
        try:
            with open(p.cancel_file(self.session.directory, conn.worker_id), "a") as f:
                f.write(f"{task_id}\n")
        except OSError:
            force = True  # the worker cannot learn which task: end it, the crash path retries
        if force:
            conn.doomed = True
        else:
            conn.interrupt_on_spawn = True
        if conn.pid:
            _signal(conn.pid, signal.SIGKILL if force else signal.SIGINT)

    def kill(self, conn: WorkerConn) -> None:
        """SIGKILL ``conn``'s process now, or as soon as the fork server gives its pid."""
        conn.doomed = True
        if conn.pid:
            _signal(conn.pid, signal.SIGKILL)

    def stop(self) -> None:
        """Close every worker's socket and stop the fork server (at shutdown)."""
        for conn in list(self.workers.values()):
            try:
                conn.sock.close()
            except OSError:
                pass
        self.forkserver.stop()


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
