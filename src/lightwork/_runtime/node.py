"""The driver's runtime: object table, scheduler, worker pool and the I/O loop.

    user threads (API calls)          I/O thread "lightwork-node"
    ─ submit: serialize args, ─┐      ┌─ select() on worker sockets, the fork server's
      take the lock, register, │      │  control socket and a wake-up pipe
      dispatch, send frames    ├─lock─┤─ read frames, apply them (results, nested
    ─ get/wait: register a     │      │  submissions, borrows, deaths), dispatch
      waiter, block on it   ───┘      └─ run timers; complete futures outside the lock

One lock (``self.lock``) guards all runtime state; whoever holds it is the one mutator.
API threads do their own sends (no thread hand-off on the submit path); the I/O thread
does all reads. A task submitted while every worker is busy skips the lock: it is queued
and registered by the lock's next taker (``node_lock.py``). Sockets are non-blocking on
this side: a frame that does not fit in the socket buffer waits in the connection's
``out`` buffer and the I/O thread finishes it, so the driver never blocks on a worker
that is itself blocked on the driver.

Workers: ``Session``'s fork server starts them; ``EXITED`` from it gives the wait status
of a dead worker, so the error names the exit code or signal. What happens when a worker
ends is ``worker_deaths.py``'s (its task retried or failed with ``WorkerCrashedError``,
the objects it owned adopted by the driver); cancelling is ``cancel.py``'s. Those, like
``driver_calls.py`` (the API's operations), ``worker_requests.py`` (what workers send
the driver: results and requests) and ``lineage.py`` (rebuilding lost values), are
mixins of :class:`Node`: methods on the same state, kept apart by responsibility.

Reference counting: see ``objects.py`` (the table) and ``_object_ref.py`` (per process).

Cost of the I/O thread on the hot path (issue 13, measured 2026-11-24; details and
figures in ``driver_calls.py``'s docstring). During a loop of synchronous calls it used
~52 µs of CPU per call (the main thread ~70) although the leading getter reads the result
itself, for two wake-ups per call:

* the result frame: this thread's epoll watches the same worker sockets as the leader's.
  Kept on purpose: keeping this thread out while a getter leads (a nested epoll of the
  worker sockets, unregistered for the leader's time) made every figure worse on the
  loaded 2-core host (main thread +40-80 µs per call, total +40-60, wall 1.6-3x, A/B in
  one run): two threads racing for a frame reach it sooner there than one does.
* the wake pipe, written when the program drops a ref (``_object_ref.RefCounter``'s
  ``on_first_release``), so the release is applied while the program makes no calls.
  Now written only when this thread sleeps idle: while the runtime is busy (frames or
  wake-ups in the last ``IO_BUSY_FOR_S``) it sleeps at most ``IO_BUSY_SLEEP_S`` and
  drains releases then, if a call has not already. This thread: 51 -> 33 µs per sync
  call, the driver's total 126 -> 105 (A/B, 5 rounds each, load average 13).

Session 5 measured why the first wake-up is worth keeping: this thread applies about
half of the results itself (real work, not a lost race), and a leader reading alone
only moved that work into the caller's thread (total CPU unchanged, wall 6-35% worse;
``driver_calls.py`` has the figures). Worker sockets are read into one buffer of
``protocol.RECV_SIZE`` allocated once (``_recv_scratch``), and a read stops at a short
read: the next frame wakes the poller anyway, and the extra ``recv`` only failed.

Session 7 (quiet machine) reversed that verdict once the leading getter spins
(``spin.py``): it is then on the CPU when the result comes, and the I/O thread's
wake-up for the same frame is pure cost (the GIL and the lock taken from the leader,
a context switch on each side). So this thread watches the worker sockets through an
epoll of their own (``_worker_selector``, one fd in its epoll, behind a bare epoll, the
*gate*), which a leader mutes with one ``epoll_ctl`` on the gate when it starts leading
and unmutes when it stops (``DriverCalls._block_on``); a socket with output waiting is in
this thread's epoll for writing only. The leader applies everything meanwhile, as it did
before. A sync call, A/B against spinning alone: 114 -> 54 µs, this thread's CPU per
call 22 -> 0.5 µs, the driver's 99 -> 52; an actor's sync call 97 -> 71 µs; batches
unchanged. Where the machine has no core to spare (``spin.cores_to_spare``) the leader
does not mute, for the reason above.

Session 10 (2026-11-25, quiet): why the workers starve while a program submits in a
loop. Every socket call this thread makes (the workers' epoll queried with ``select(0)``,
each ``recv_into``, each ``send``) releases the GIL, and getting it back from a submit
loop that holds it waits up to a switch interval (5 ms): a pass that reads four
workers and sends to them waits 5-10 times. 20,000 tasks of ``sleep(0.1 ms)`` on 4
slots, from the records' dispatch times: while the loop submits (0.17-0.31 s), passes
came 15-100 ms apart and the workers started 200-450 tasks per 100 ms, against
1,700-1,900 once it stopped. Tried, each A/B in alternating fresh drivers: the three
calls through libc holding the GIL (``ctypes.PyDLL``, as ``driver_calls._read_schedstat``
does): passes every ~9 ms, the sleeps paired 0.99 (5 rounds), but 10,000 no-op tasks
1.05 slower by the wall clock (8 rounds; the driver's CPU 0.97); with the submitting
thread also reading the workers that are ready every 1 ms of submissions: the workers'
starved time 0.13-0.25 -> 0.06-0.16 s, but the submit loop slower (0.23 -> 0.29-0.40 s),
the sleeps 0.98, 10,000 tasks 1.11; a non-blocking look holding the GIL before each
blocking ``select``: worse (the loop 0.30-0.45 s). None kept. The sleeps themselves are
most of that figure: each ``sleep(0.1 ms)`` runs 200-215 µs in a worker under this load
(175 µs alone: the kernel's 50 µs timer slack and the wake-up), so four slots need
1.0-1.07 s for the 20,000 before any overhead. Session 11 gave the workers work for the
whole gap instead: the scheduler's window follows the gaps between passes, and is widest
while a loop submits (``scheduler.py``; the sleeps paired 0.94, 1.10 s in ``make bench``).
"""

from __future__ import annotations

import heapq
import itertools
import os
import select
import selectors
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightwork import exceptions
from lightwork._object_ref import (
    DRIVER_IDS,
    WORKER_NUMBERS,
    IdFloor,
    ended_session_message,
    ref_counter,
)
from lightwork._runtime import forkserver
from lightwork._runtime import control
from lightwork._runtime.actors import ActorManager
from lightwork._runtime.cancel import Cancellation
from lightwork._runtime.driver_calls import DriverCalls
from lightwork._runtime.worker_requests import WorkerRequests
from lightwork._runtime.worker_deaths import WorkerDeaths
from lightwork._runtime import protocol as p
from lightwork._runtime import serialization
from lightwork._runtime import ray_alias
from lightwork._runtime.events import EventLog, TaskRecord
from lightwork._runtime.gpus import GpuIds
from lightwork._runtime.introspect import report_unraisable
from lightwork._runtime.lineage import Lineage
from lightwork._runtime.memory_monitor import MemoryMonitor
from lightwork._runtime.node_lock import NodeLock
from lightwork._runtime.objects import FAILED, PENDING, ObjectEntry, ObjectTable
from lightwork._runtime.scheduler import (
    DISPATCHED,
    FAILED as TASK_FAILED,
    Scheduler,
    TaskSpec,
    WorkerSlot,
)
from lightwork._runtime.serialization import Stored
from lightwork._runtime.session import ForkServer, Session
from lightwork._runtime.spin import Spinner
from lightwork._runtime.streams import StreamTable
from lightwork._runtime.spill import Spiller
from lightwork._runtime.store import SegmentStore, default_budget

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
# The I/O thread's sleep while the runtime is busy (it had frames or wake-ups within
# IO_BUSY_FOR_S): a ref the program drops meanwhile is drained within this, without a
# wake-up of its own. Idle, it sleeps IO_IDLE_SLEEP_S and a dropped ref wakes it.
IO_BUSY_SLEEP_S = 0.005
IO_BUSY_FOR_S = 0.05
IO_IDLE_SLEEP_S = 0.5


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


class Node(DriverCalls, WorkerRequests, Lineage, Cancellation, WorkerDeaths):
    """One session of the embedded runtime in the driver process."""

    def __init__(
        self,
        num_cpus: float,
        num_gpus: float,
        resources: dict[str, float],
        namespace: str | None,
        event_budget: int,
        object_store_memory: int | None = None,
        spill_dir: str | None = None,
        runtime_env: dict[str, Any] | None = None,
        memory: float | None = None,
    ) -> None:
        total = {"CPU": float(num_cpus), "GPU": float(num_gpus), **resources}
        self.namespace = namespace
        self.job_id = 1
        self.session = Session.create(spill_root=spill_dir)
        self.node_id = self.session.name
        self.lock = NodeLock()
        budget = object_store_memory or default_budget(self.session.shm_dir)
        total["memory"] = float(task_memory(budget) if memory is None else int(memory))
        self.store = SegmentStore(self.session.shm_dir, budget, self.session.spill_dir)
        serialization.MAPS.spill_dir = self.session.spill_dir
        self.objects = ObjectTable(self.store.release, self.store.track)
        self.spiller = Spiller(self)
        self.scheduler = Scheduler(total)
        self.log = EventLog(event_budget)
        self.functions: dict[bytes, bytes] = {}
        self.tasks: dict[int, TaskSpec] = {}
        self.lock.register = self._register_queued
        self.workers: dict[int, WorkerConn] = {}
        self.gpus = GpuIds(int(num_gpus))  # which GPU ids each task and actor uses
        # Recursive cancel (``_cancel_ids``): how many live tasks were submitted by a task
        # (0: nothing to search), and the running tasks cancelled with recursive=True.
        self.nested_live = 0
        self.cancelled_parents: set[int] = set()
        # Ids and worker numbers continue from the previous session (see _object_ref.py).
        self.id_floor = IdFloor()
        self._ids = DRIVER_IDS
        self._feasible_shapes: set[tuple] = set()
        self._worker_ids = WORKER_NUMBERS
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = itertools.count()
        self._deferred: list[Callable[[], None]] = []
        # Observers of task ends (diagnostics): called as fn(records) outside the lock, in
        # the thread that applied the ends, with the TaskRecords of the tasks that
        # finished or failed since the last delivery, in the order they ended. The node
        # pays one append per ended task while any listener is registered.
        self.task_listeners: list[Callable[[list[TaskRecord]], None]] = []
        self._ended_unheard: list[TaskRecord] = []
        self._want_write: set[WorkerConn] = set()
        # One receive buffer for every worker socket, used under the lock: ``recv`` of a
        # fresh 256 KiB bytes per read cost an mmap, page faults and an mremap each.
        self._recv_scratch = memoryview(bytearray(p.RECV_SIZE))
        self.closed = False
        self.broken = ""  # why the runtime cannot go on (a dead fork server, a bug), or ""
        self.advisor: Any = None  # set by init() unless advisor=False (diagnostics layer)
        self.memory_monitor: MemoryMonitor | None = None  # started by init()
        self.actors = ActorManager(self)
        self.streams = StreamTable(self)  # generator tasks' yielded items (streams.py)
        self.objects.on_actor_freed = self.actors.handle_freed
        # One thread per task slot unless the user chose: the "no speedup" trap of
        # multi-threaded numpy running in every worker at once.
        self.worker_env = {name: "1" for name in THREAD_VARS if name not in os.environ}
        # init(runtime_env=...), normalized (runtime_env.py): set in every worker at start.
        self.runtime_env = runtime_env
        if runtime_env is not None:
            self.worker_env.update(runtime_env["env_vars"])
        # Started before our I/O thread exists; it execs, so user threads do not matter.
        self.forkserver = ForkServer(self.session)
        self.selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self.selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self.forkserver.control.setblocking(False)
        self._fs_decoder = bytearray()
        self.selector.register(self.forkserver.control, selectors.EVENT_READ, "forkserver")
        # The worker sockets, for this thread: an epoll of their own inside its epoll, so
        # a leading getter can mute them all with one call (see _block_on). A worker's
        # socket is in this thread's epoll itself only while output to it waits.
        self._worker_selector = selectors.DefaultSelector()
        # Muting goes through a gate, a bare epoll holding only _worker_selector: one
        # epoll_ctl on it (0.7 µs) where changing the registration in this thread's
        # selector cost 2.8 µs of Python (``selectors``' key bookkeeping), twice per
        # blocked get. No epoll (not Linux): no gate, and the leader does not mute.
        self._workers_gate: Any = None
        self._workers_fd = self._worker_selector.fileno()
        if hasattr(select, "epoll"):
            self._workers_gate = select.epoll()
            self._workers_gate.register(self._workers_fd, select.EPOLLIN)
            self.selector.register(self._workers_gate, selectors.EVENT_READ, "workers")
        else:
            self.selector.register(self._worker_selector, selectors.EVENT_READ, "workers")
        # A second epoll over the worker sockets for the thread leading a blocked get:
        # epoll wakes one waiter per event, so the leader cannot share the I/O thread's
        # (whose worker sockets are in _worker_selector, which the leader mutes).
        self._leader_selector = selectors.DefaultSelector()
        self._leader_wake_read, self._leader_wake_write = os.pipe()
        os.set_blocking(self._leader_wake_read, False)
        os.set_blocking(self._leader_wake_write, False)
        self._leader_selector.register(self._leader_wake_read, selectors.EVENT_READ, "wake")
        self._leader = threading.Lock()
        self._leader_spinner = Spinner()  # whoever leads; see spin.py
        ref_counter.on_borrow = self._on_driver_borrow
        self._io_sleeps_long = False  # the I/O thread is (about to be) in an idle sleep
        self._io_busy_until = 0.0
        ref_counter.on_first_release = self._on_first_release
        with self.lock:
            for _ in range(max(1, int(num_cpus))):
                self._start_worker()
        self._thread = threading.Thread(target=self._loop, name="lightwork-node", daemon=True)
        self._thread.start()
        self.control = control.start(self)  # diagnostics side-car: socket, sampler

    # ------------------------------------------------------------------ ids, workers
    def next_object_id(self) -> int:
        return next(self._ids)

    def _start_worker(self, pooled: bool = True) -> WorkerConn:
        worker_id = next(self._worker_ids)
        ours, theirs = socket.socketpair()
        job_env = self.runtime_env
        config = {
            "sys_path": job_env["paths"] + sys.path if job_env else list(sys.path),
            "cwd": (job_env and job_env["working_dir"]) or os.getcwd(),
            "env": self.worker_env,
            "as_ray": ray_alias.installed(),
            "job_id": self.job_id,
            "shm_dir": self.session.shm_dir,
            "spill_dir": self.session.spill_dir,
            "node_id": self.node_id,
            "total": dict(self.scheduler.total),
            "session_dir": self.session.directory,
            "event_budget": self.log.budget,
        }
        try:
            self.forkserver.spawn(worker_id, config, theirs)
        except OSError as exc:
            theirs.close()
            ours.close()
            raise exceptions.RuntimeSystemError(
                f"cannot start a worker: the fork server is gone ({exc})") from exc
        theirs.close()
        ours.setblocking(False)
        slot = self.scheduler.add_worker(worker_id) if pooled else WorkerSlot(worker_id)
        conn = WorkerConn(worker_id, ours, slot)
        self.workers[worker_id] = conn
        self._worker_selector.register(ours, selectors.EVENT_READ, conn)
        self._leader_selector.register(ours, selectors.EVENT_READ, conn)
        return conn

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"x")
        except BlockingIOError:
            pass

    def _on_first_release(self) -> None:
        # Runs inside ObjectRef.__del__ (any thread, any moment): no lock, no state but a
        # flag. A busy I/O thread drains the release within IO_BUSY_SLEEP_S by itself;
        # only an idle one needs the wake-up (see _loop for why none is lost).
        if self._io_sleeps_long:
            self._wake()

    def _wake_leader(self) -> None:
        try:
            os.write(self._leader_wake_write, b"x")
        except BlockingIOError:
            pass

    # ------------------------------------------------------------------ sending
    def _send(self, conn: WorkerConn, messages: list[tuple[Any, ...]]) -> None:
        if conn.dead:
            return
        out = conn.out
        out += p.encode_many(messages)
        self._flush(conn)

    def _flush(self, conn: WorkerConn) -> None:
        out = conn.out
        try:
            while out:
                sent = conn.sock.send(out)
                del out[:sent]
        except BlockingIOError:
            if threading.current_thread() is self._thread:
                self._watch_writable(conn)
            else:
                self._want_write.add(conn)
                self._wake()
        except OSError:
            out.clear()  # the worker is gone; its EOF is handled by the I/O loop

    # ------------------------------------------------------------------ the I/O loop
    def _loop(self) -> None:
        try:
            while not self.closed:
                if time.monotonic() < self._io_busy_until:
                    longest = IO_BUSY_SLEEP_S
                else:
                    # Flag first, then look: a release queued before the flag was set is
                    # seen here; one queued after sees the flag and wakes us (the GIL
                    # orders the two; rearm makes sure it calls us).
                    self._io_sleeps_long = True
                    longest = 0.0 if ref_counter.rearm() else IO_IDLE_SLEEP_S
                alive = self._poll(longest)
                self._io_sleeps_long = False
                if not alive:
                    return
        except BaseException as exc:  # noqa: BLE001 - a runtime bug: fail loudly, never hang
            import traceback

            self.fail_runtime(
                "its I/O thread failed:\n" + "".join(traceback.format_exception(exc)).rstrip())

    def fail_runtime(self, reason: str) -> None:
        """The runtime cannot go on: every pending object and later call raises, with why."""
        with self.lock:
            if self.broken or self.closed:
                return
            self.broken = reason
            error = exceptions.RuntimeSystemError(
                f"the lightwork runtime stopped working: {reason}\nCall lightwork.shutdown() "
                "and lightwork.init() to start a new runtime.")
            for entry in list(self.objects.entries.values()):
                if entry.state == PENDING:
                    self._resolve(entry, None, error)
            deferred, self._deferred = self._deferred, []
        print(f"lightwork: the runtime stopped working: {reason}", file=sys.stderr)
        self._wake_leader()
        for callback in deferred:
            callback()

    def _poll(self, longest: float | None, leading: bool = False) -> bool:
        """Wait for I/O up to ``longest`` seconds and apply it; False once closed.

        The I/O thread calls this in its loop. The thread leading a blocked ``get``
        calls it too (``leading``, on its own epoll), so a result wakes its waiter
        directly instead of through the I/O thread. While a leader leads, the I/O thread
        does not watch the workers (``_worker_selector`` muted), unless the machine has no
        core to spare: then both may be woken by the same frame, and the lock makes one
        of them read it while the other finds nothing.
        """
        selector = self._leader_selector if leading else self.selector
        timeout = longest
        if self._timers:
            until_timer = max(0.0, self._timers[0][0] - time.monotonic())
            timeout = until_timer if timeout is None else min(timeout, until_timer)
        try:
            if leading:  # spin first while results have been coming quickly (spin.py)
                events = self._leader_spinner.wait(
                    self._leader_events_now, lambda: selector.select(timeout), timeout)
            else:
                events = selector.select(timeout)
        except (OSError, ValueError):
            return not self.closed
        if events and not leading:
            self._io_busy_until = time.monotonic() + IO_BUSY_FOR_S
        with self.lock:
            if self.closed:
                return False
            for key, mask in events:
                data = key.data
                if data == "wake":
                    try:
                        os.read(key.fd, 4096)
                    except BlockingIOError:
                        pass
                elif data == "forkserver":
                    self._read_forkserver()
                elif data == "workers":
                    for worker_key, _ in self._worker_selector.select(0):
                        self._read_worker(worker_key.data)
                elif leading:
                    self._read_worker(data)
                else:  # only this thread's epoll asks for room to write
                    self._flush(data)
                    if not data.out and not data.dead:
                        self.selector.unregister(data.sock)
            if not leading:
                for conn in self._want_write:
                    if not conn.dead and conn.out:
                        self._watch_writable(conn)
                self._want_write.clear()
            self._drain_refs()
            self._run_timers()
            self._dispatch()
            deferred, self._deferred = self._deferred, []
        for callback in deferred:
            callback()
        return True

    def _watch_writable(self, conn: WorkerConn) -> None:
        """Have this thread's epoll say when ``conn`` has room for its waiting output."""
        if conn.eof_at or conn.sock in self.selector.get_map():  # closed, or watched
            return
        self.selector.register(conn.sock, selectors.EVENT_WRITE, conn)

    def _watch_workers(self, watch: bool) -> bool:
        """Have this thread's epoll watch the workers' sockets, or not (a leading getter
        reads them: ``DriverCalls._block_on``); False if not done (no gate, or it is
        closed: shut down meanwhile, which ``_poll`` says)."""
        gate = self._workers_gate
        if gate is None:
            return False
        try:
            gate.modify(self._workers_fd, select.EPOLLIN if watch else 0)
        except (ValueError, OSError):
            return False
        return True

    def _leader_events_now(self) -> list[tuple[Any, int]] | None:
        return self._leader_selector.select(0) or None

    def _read_worker(self, conn: WorkerConn) -> None:
        """Read what the worker sent and apply it (lock held)."""
        scratch = self._recv_scratch
        messages: list[tuple[Any, ...]] = []
        eof = False
        while True:
            try:
                size = conn.sock.recv_into(scratch)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not size:
                eof = True
                break
            messages += conn.decoder.feed(scratch[:size])
            if size < len(scratch):
                # All there was; a frame sent meanwhile wakes the poller again. This
                # spares a recv that would fail (a syscall and an exception per wake-up).
                break
        self._handle_read(conn, messages)
        if eof:
            self._on_worker_eof(conn)
        elif conn.actor is not None and conn.actor.queue:  # calls held while it was busy
            self.actors.pump(conn.actor)

    def _read_forkserver(self) -> None:
        import pickle

        control = self.forkserver.control
        try:
            data = control.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(control)
            if not self.closed:
                code = self.forkserver.process.poll()
                self._deferred.append(lambda: self.fail_runtime(
                    f"the fork server (pid {self.forkserver.process.pid}) exited with code "
                    f"{code}, so no worker can be started; its error, if any, is above"))
            return
        buffer = self._fs_decoder
        buffer += data
        while len(buffer) >= 4:
            length = int.from_bytes(buffer[:4], "little")
            if len(buffer) < 4 + length:
                break
            message = pickle.loads(bytes(buffer[4 : 4 + length]))
            del buffer[: 4 + length]
            conn = self.workers.get(message[1])
            if conn is None:
                continue
            if message[0] == forkserver.SPAWNED:
                conn.pid = message[2]
                if conn.doomed or conn.interrupt_on_spawn:  # kill/cancel came before the pid
                    try:
                        os.kill(conn.pid, signal.SIGKILL if conn.doomed else signal.SIGINT)
                    except ProcessLookupError:
                        pass
            elif message[0] == forkserver.EXITED:
                conn.exit_status = message[3]
                if conn.eof_at:
                    self._finish_worker_death(conn)

    def _add_timer(self, delay: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), callback))
        if threading.current_thread() is not self._thread:
            self._wake()

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, callback = heapq.heappop(self._timers)
            callback()

    # ------------------------------------------------------------------ objects
    def _resolve(self, entry: ObjectEntry, stored: Stored | None, error: Any = None) -> None:
        for waiter in self.objects.resolve(entry, stored, error):
            waiter(entry)

    def _on_driver_borrow(self, object_id: int) -> None:
        entry = self.objects.entries.get(object_id)
        if entry is not None:
            entry.driver_holds = True

    def _drain_refs(self) -> None:
        gone = ref_counter.drain()
        if gone:
            objects = self.objects
            for object_id in gone:
                entry = objects.entries.get(object_id)
                if entry is None and self.lock.queued:
                    # Its task was queued after this thread took the lock (node_lock.py):
                    # registered first, it is then released like any other.
                    self._register_queued()
                    entry = objects.entries.get(object_id)
                if entry is not None and not ref_counter.holds(object_id):
                    entry.driver_holds = False
                    objects.release_if_unheld(entry)
            if self.streams.streams:  # a dropped generator releases its unread items
                self.streams.release_unconsumed()

    def lookup(self, object_id: int) -> ObjectEntry:
        entry = self.objects.entries.get(object_id)
        if entry is None:
            if self.id_floor.minted_before(object_id):
                raise self.ended_session_error(object_id)
            raise exceptions.ReferenceCountingAssertionError(
                f"{object_id:020x}",
                f"object {object_id:020x} was already freed: no reference to it remained "
                "(its ObjectRef was deleted, or the ref was rebuilt from a pickle after the "
                "original was garbage-collected). Keep an ObjectRef alive for as long as you "
                "need the object.",
            )
        return entry

    def ended_session_error(
        self, object_id: int, actor: bool = False
    ) -> exceptions.SessionEndedError:
        what = f"actor handle {object_id:020x}" if actor else f"ObjectRef({object_id:020x})"
        return exceptions.SessionEndedError(
            f"{object_id:020x}", ended_session_message(what, running=True))

    # ------------------------------------------------------------------ tasks
    def register_task(self, task: TaskSpec, contained: tuple[int, ...],
                      at: float | None = None) -> None:
        """Add a new task (lock held): pin its arguments, wait for its dependencies.
        ``at``: the clock reading its result entries were created at, which is also when
        its dependencies were found ready, if they were (one float for both). A task
        without dependencies is ready from its submission: its record is made saying so
        (``deps_ready``), and is not touched here (it has gone cold in the cache since)."""
        # (Most tasks have neither: each test below skips a loop and its objects.)
        deps = [self.lookup(object_id) for object_id in task.deps] if task.deps else ()
        if contained:
            entries = self.objects.entries
            for object_id in contained:  # a ref inside an argument may be from an ended session
                if object_id not in entries and self.id_floor.minted_before(object_id):
                    raise self.ended_session_error(object_id)
        self.tasks[task.task_id] = task
        if task.parent:
            self.nested_live += 1  # see _cancel_ids; _end_task counts it down
        unready = 0
        if deps:  # the advisor tells a chain of dependent steps from independent tasks
            task.record.dep_tasks = tuple([entry.task_id for entry in deps])  # 3x a genexpr
            for entry in deps:
                entry.task_uses += 1
                if entry.state == PENDING:
                    unready += 1
                    entry.add_waiter(lambda _e, t=task: self._dep_ready(t))
        if contained:
            for object_id in contained:
                inner = self.objects.entries.get(object_id)
                if inner is not None:
                    inner.task_uses += 1
        task.unready = unready
        if not unready:
            self._deps_ready(task, at)

    def _register_queued(self) -> None:
        """Register the tasks and actor calls submitted without the lock, oldest first
        (lock held; see ``node_lock.py``). They have no dependencies and no refs inside
        their arguments, so they are ready: their clock reading is their submission's.
        An actor call then joins its actor's queue, which sends it if a slot is free."""
        queued = self.lock.queued
        scheduler = self.scheduler
        if len(queued) > len(scheduler.workers):
            scheduler.submitting = True  # a loop is submitting: see scheduler.py
        create = self.objects.create
        tasks = self.tasks
        while queued:
            task = queued.popleft()
            at = task.record.submitted
            for object_id in task.return_ids:
                create(object_id, 0, task.task_id, at)
            if task.plain:  # what register_task comes to for it, without its tests
                tasks[task.task_id] = task
                if task.actor_id:  # it joins its actor's queue, which sends it if it can
                    self.actors.add_call(task.actor_id, task)
                else:
                    scheduler.make_ready(task)
                continue
            self.register_task(task, (), at)
            if task.actor_id:
                self.actors.add_call(task.actor_id, task)

    def _dep_ready(self, task: TaskSpec) -> None:
        task.unready -= 1
        if task.unready == 0 and task.state != TASK_FAILED:
            self._deps_ready(task)

    def _deps_ready(self, task: TaskSpec, at: float | None = None) -> None:
        if at is None or task.deps:  # (else its record says so from birth: register_task)
            task.record.deps_ready = time.monotonic() if at is None else at
        for object_id in task.deps:
            entry = self.objects.entries[object_id]
            if entry.state == FAILED:
                self._fail_task(task, entry.error)
                return
        if task.actor_id:
            actor = self.actors.actors.get(task.actor_id)
            # A busy actor's ready calls go with its next frame read (_read_worker), and
            # a new call is queued after this (ActorManager.add_call sends it if idle).
            if actor is not None and len(actor.inflight) < actor.slots:
                self.actors.pump(actor)
        else:
            self.scheduler.make_ready(task)

    def _fail_task(self, task: TaskSpec, error: Any) -> None:
        for object_id in task.return_ids:
            entry = self.objects.get(object_id)
            if entry is not None:
                self._resolve(entry, None, error)
        task.record.error = _error_summary(error)
        self._end_task(task, TASK_FAILED)

    def _end_task(self, task: TaskSpec, state: str) -> None:
        task.state = state
        task.record.state = state
        if self.tasks.pop(task.task_id, None) is not None and task.parent:
            self.nested_live -= 1
        if self.cancelled_parents:
            self.cancelled_parents.discard(task.task_id)
        if self.streams.streams and task.return_ids:
            self.streams.on_task_end(task.return_ids[0])
        if not task.plain:  # (a plain task has no dependencies and inline arguments)
            for object_id in task.deps:
                self._unuse(object_id)
            for object_id in task.args.contained:
                self._unuse(object_id)
            if task.args.path is not None:
                self.store.release(task.args.path)
        self.log.finish_task(task.record)
        if self.task_listeners:
            if not self._ended_unheard:
                self._deferred.append(self._tell_listeners)
            self._ended_unheard.append(task.record)

    def _tell_listeners(self) -> None:
        with self.lock:
            ended, self._ended_unheard = self._ended_unheard, []
            listeners = tuple(self.task_listeners)
        if ended:
            for listener in listeners:
                _tell(listener, ended)

    def add_task_listener(self, listener: Callable[[list[TaskRecord]], None]) -> None:
        with self.lock:
            self.task_listeners.append(listener)

    def remove_task_listener(self, listener: Callable[[list[TaskRecord]], None]) -> None:
        with self.lock:
            if listener not in self.task_listeners:
                return
            self.task_listeners.remove(listener)
            # Tasks that ended while it listened and that nobody has told of yet (the
            # thread that ended them tells after letting go of the lock): tell it now,
            # or it would never hear of them.
            owed = list(self._ended_unheard)
        if owed:
            _tell(listener, owed)

    def _unuse(self, object_id: int) -> None:
        entry = self.objects.entries.get(object_id)
        if entry is not None:
            entry.task_uses -= 1
            self.objects.release_if_unheld(entry)

    def _dispatch(self) -> None:
        if self.lock.queued:  # submitted since the lock was taken (see node_lock.py)
            self._register_queued()
        scheduler = self.scheduler
        if not (scheduler.ready or scheduler.pending_groups or scheduler.orphaned
                or scheduler.newly_reserved or self.actors.pending):
            # Nothing to place (most calls: every poll and submit dispatches); what the
            # loop below would conclude, without its passes over queues and workers.
            scheduler.starving = 0
            scheduler.submitting = False  # (queued actor calls set it; no task needs it)
            return
        try:
            while True:
                assignments = scheduler.schedule(time.monotonic())
                if scheduler.newly_reserved:  # their bundles' GPU ids, before anything runs there
                    for group in scheduler.newly_reserved:
                        self.gpus.reserve_group(group)
                    scheduler.newly_reserved.clear()
                self._send_assignments(assignments)
                if scheduler.orphaned:
                    self._fail_orphaned_tasks()
                if self.actors.pending:
                    self.actors.place_pending()
                if scheduler.starving <= 0:
                    return
                room = scheduler.worker_cap() - len(scheduler.workers)
                to_start = min(scheduler.starving, room)
                if to_start <= 0:
                    return
                for _ in range(to_start):
                    self._start_worker()
        except exceptions.RuntimeSystemError as exc:
            reason = str(exc)  # fail outside this call: it may run under a user's API call
            self._deferred.append(lambda: self.fail_runtime(reason))

    def _send_assignments(self, assignments: list[TaskSpec]) -> None:
        if assignments:
            batches: dict[WorkerConn, list[tuple[Any, ...]]] = {}
            now = time.monotonic()
            gpus = self.gpus if self.gpus.any else None  # (a call per task saved without)
            workers = self.workers
            for task in assignments:
                conn = workers[task.worker.worker_id]
                batch = batches.get(conn)
                if batch is None:
                    batch = batches[conn] = []
                key = task.function_key
                if key not in conn.functions:
                    conn.functions.add(key)
                    batch.append((p.FUNCTION, key, self.functions[key]))
                record = task.record
                record.dispatched = now
                record.worker_id = conn.worker_id
                record.attempt = task.attempt
                record.state = DISPATCHED
                deps = task.deps
                dep_values = [self.objects.entries[d].stored for d in deps] if deps else ()
                args = task.args  # (serialization.bare, without a call per task)
                if args.path is None and not args.buffers and not args.contained:
                    args = args.data
                batch.append((p.TASK, (
                    task.task_id, key, task.name, args, dep_values, task.return_ids,
                    task.shape, gpus.assign(task.task_id, task.shape) if gpus else (),
                )))
            for conn, batch in batches.items():
                self._send(conn, batch)

    def _release_gpus(self, task_id: int) -> None:
        if self.gpus.held:
            self.gpus.release(task_id)

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        self.control.stop()
        if self.memory_monitor is not None:
            self.memory_monitor.stop()
        with self.lock:
            if self.closed:
                return
            self.closed = True
            error = exceptions.RuntimeSystemError(
                "the lightwork runtime was shut down while this object was pending")
            for entry in list(self.objects.entries.values()):
                if entry.state == PENDING:
                    self._resolve(entry, None, error)
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)
        for conn in list(self.workers.values()):
            try:
                conn.sock.close()
            except OSError:
                pass
        self.forkserver.stop()
        self.spiller.stop()
        with self.lock:
            # Specs still queued on a worker would keep a cycle with its slot that the
            # collector cannot see, each spec being out of it (collector.py): empty them.
            for slot in list(self.scheduler.workers.values()):
                self.scheduler.remove_worker(slot)
            self.objects.unlink_all()
            self.store.close()
        serialization.MAPS.clear()
        self.session.remove()
        self.selector.close()
        if self._workers_gate is not None:
            self._workers_gate.close()
        self._worker_selector.close()
        self._leader_selector.close()
        for fd in (self._wake_read, self._wake_write, self._leader_wake_read, self._leader_wake_write):
            os.close(fd)
        if ref_counter.on_borrow == self._on_driver_borrow:
            ref_counter.on_borrow = None
            ref_counter.on_first_release = None

def _tell(listener: Callable[[list[TaskRecord]], None], ended: list[TaskRecord]) -> None:
    try:
        listener(ended)
    except Exception as exc:  # noqa: BLE001 - a diagnostics bug must not stop the runtime
        report_unraisable(exc, "Exception ignored in lightwork task listener", listener)


def task_memory(store_budget: int) -> int:
    """Ray's default ``memory`` resource: the memory available now, less the store's."""
    from lightwork._runtime.memory_monitor import read_meminfo

    try:
        used, total = read_meminfo()
    except (OSError, KeyError, ValueError):
        return 0
    return max(0, total - used - store_budget)


def _error_summary(error: Any) -> str:
    if isinstance(error, Stored):
        try:
            error = serialization.loads(error)
        except Exception:
            return "error (could not be loaded)"
    if isinstance(error, exceptions.TaskError) and error.cause is not None:
        return f"{type(error.cause).__name__}: {error.cause}"
    return f"{type(error).__name__}: {error}"
