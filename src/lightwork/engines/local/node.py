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

Reference counting: see ``objects.py`` (the table) and ``kernel/object_ref.py`` (per process).

The I/O loop (the poll both the I/O thread and a leading getter run, reading and
sending frames, timers and wake-ups) is ``io_loop.py``'s, with what it costs on the hot
path.
"""

from __future__ import annotations

import itertools
import os
import select
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions
from lightwork.kernel.object_ref import (
    DRIVER_IDS,
    WORKER_NUMBERS,
    IdFloor,
    ended_session_message,
    ref_counter,
)
from lightwork.kernel import control
from lightwork.kernel.run import RunRecord
from lightwork.engines.local.actors import ActorManager
from lightwork.engines.local.cancel import Cancellation
from lightwork.engines.local.driver_calls import DriverCalls
from lightwork.engines.local.worker_requests import WorkerRequests
from lightwork.engines.local.worker_deaths import WorkerDeaths
from lightwork.engines.local import protocol as p
from lightwork.kernel import serialization
from lightwork.kernel import ray_alias
from lightwork.kernel.events import EventLog, TaskRecord
from lightwork.engines.local.gpus import GpuIds
from lightwork.kernel.introspect import report_unraisable
from lightwork.engines.local.io_loop import IOLoop
from lightwork.engines.local.lineage import Lineage
from lightwork.engines.local.memory_monitor import MemoryMonitor
from lightwork.engines.local.node_lock import NodeLock
from lightwork.engines.local.output import DriverOutput
from lightwork.engines.local.objects import FAILED, PENDING, ObjectEntry, ObjectTable
from lightwork.engines.local.scheduler import (
    DISPATCHED,
    FAILED as TASK_FAILED,
    Scheduler,
    TaskSpec,
    WorkerSlot,
)
from lightwork.kernel.serialization import Stored
from lightwork.engines.local.fork_client import ForkServer
from lightwork.kernel.session import Session
from lightwork.engines.local.spin import Spinner
from lightwork.engines.local.streams import StreamTable
from lightwork.engines.local.spill import Spiller
from lightwork.engines.local.store import SegmentStore, default_budget

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


if TYPE_CHECKING:

    class NodeState:
        """What :class:`Node`'s mixins share, declared for the type checker only.

        Each mixin (``io_loop.py``, ``driver_calls.py``, ...) subclasses this under
        ``TYPE_CHECKING`` (at run time, ``object``): the attributes ``Node.__init__``
        sets and the methods one mixin calls on another, so mypy checks every part
        against one list. ``Node`` itself cannot be the mixins' base: it subclasses them.
        """

        _fs_decoder: bytearray
        _ids: itertools.count[int]
        _leader: threading.Lock
        _leader_selector: selectors.BaseSelector
        _leader_spinner: Spinner
        _leader_wake_write: int
        _recv_scratch: memoryview
        _submitter_passed_at: float
        _submitter_muted: bool
        _deferred: list[Callable[[], None]]
        output: DriverOutput
        _feasible_shapes: set[tuple]
        _thread: threading.Thread
        _timer_seq: itertools.count[int]
        _timers: list[tuple[float, int, Callable[[], None]]]
        _wake_write: int
        _want_write: set[WorkerConn]
        _worker_selector: selectors.BaseSelector
        _workers_fd: int
        _workers_gate: Any  # select.epoll, or None where there is no epoll
        actors: ActorManager
        broken: str
        cancelled_parents: set[int]
        closed: bool
        forkserver: ForkServer
        functions: dict[bytes, bytes]
        gpus: GpuIds
        id_floor: IdFloor
        job_id: int
        lock: NodeLock
        log: EventLog
        namespace: str | None
        nested_live: int
        node_id: str
        objects: ObjectTable
        scheduler: Scheduler
        selector: selectors.BaseSelector
        session: Session
        store: SegmentStore
        streams: StreamTable
        task_listeners: list[Callable[[list[TaskRecord]], None]]
        tasks: dict[int, TaskSpec]
        workers: dict[int, WorkerConn]

        def next_object_id(self) -> int: ...
        def lookup(self, object_id: int) -> ObjectEntry: ...
        def register_task(
            self, task: TaskSpec, contained: tuple[int, ...], at: float | None = None
        ) -> None: ...
        def fail_runtime(self, reason: str) -> None: ...
        def ended_session_error(
            self, object_id: int, actor: bool = False
        ) -> exceptions.SessionEndedError: ...
        def placement_group_request(self, op: str, *args: Any) -> Any: ...
        def _resources_x(self) -> tuple[dict[str, float], dict[str, float]]: ...
        def recover_lost(self, entry: ObjectEntry) -> None: ...
        def recover_lost_argument(self, task: TaskSpec, path: str) -> None: ...
        def _start_worker(self, pooled: bool = True) -> WorkerConn: ...
        def _dispatch(self) -> None: ...
        def _drain_refs(self) -> None: ...
        def _dep_ready(self, task: TaskSpec) -> None: ...
        def _deps_ready(self, task: TaskSpec, at: float | None = None) -> None: ...
        def _end_task(self, task: TaskSpec, state: str) -> None: ...
        def _fail_task(self, task: TaskSpec, error: Any) -> None: ...
        def _requeue(self, task: TaskSpec) -> None: ...
        def _release_gpus(self, task_id: int) -> None: ...
        def _resolve(
            self, entry: ObjectEntry, stored: Stored | None, error: Any = None
        ) -> None: ...
        def _cancel_ids(
            self, object_ids: list[int], force: bool, recursive: bool = False
        ) -> None: ...
        def _cancel_task(self, task: TaskSpec, force: bool) -> None: ...
        def _add_timer(self, delay: float, callback: Callable[[], None]) -> None: ...
        def _poll(self, longest: float | None, leading: bool = False) -> bool: ...
        def _read_worker(self, conn: WorkerConn) -> None: ...
        def _send(self, conn: WorkerConn, messages: list[tuple[Any, ...]]) -> None: ...
        def _wake_leader(self) -> None: ...
        def _watch_workers(self, watch: bool) -> bool: ...
        def _handle_read(self, conn: WorkerConn, messages: list[tuple[Any, ...]]) -> None: ...
        def _on_worker_eof(self, conn: WorkerConn) -> None: ...
        def _finish_worker_death(self, conn: WorkerConn) -> None: ...
        def _retire_worker(self, conn: WorkerConn) -> None: ...


class Node(IOLoop, DriverCalls, WorkerRequests, Lineage, Cancellation, WorkerDeaths, RunRecord):
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
        log_to_driver: bool = True,
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
        # Ids and worker numbers continue from the previous session (see kernel/object_ref.py).
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
        self.output = DriverOutput(echo=log_to_driver)  # what workers print (output.py)
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
        # A submitting thread muted the I/O thread's watch of the workers, and when it
        # last read them (DriverCalls._submitter_pass; both under _leader).
        self._submitter_muted = False
        self._submitter_passed_at = 0.0
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
            if self.lock.queued:
                # Tasks queued after this thread took the lock (node_lock.py) may have
                # made some of these: registered first, theirs are released like any other.
                self._register_queued()
            self.objects.release_driver_holds(gone, ref_counter.holds)
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
                    # (mypy cannot infer a lambda with a default: the task bound per waiter)
                    entry.add_waiter(lambda _e, t=task: self._dep_ready(t))  # type: ignore[misc]
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
            if task.plain:  # what register_task comes to for it, without its tests
                create(task.return_ids[0], 0, task.task_id, at)  # (its one return)
                tasks[task.task_id] = task
                if task.actor_id:  # it joins its actor's queue, which sends it if it can
                    self.actors.add_call(task.actor_id, task)
                else:
                    scheduler.make_ready(task)
                continue
            for object_id in task.return_ids:
                create(object_id, 0, task.task_id, at)
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

    def _unuse(self, object_id: int, times: int = 1) -> None:
        entry = self.objects.entries.get(object_id)
        if entry is not None:
            entry.task_uses -= times
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
            args: Stored | bytes  # a task's arguments as the frame carries them
            for task in assignments:
                conn = workers[task.worker.worker_id]  # type: ignore[union-attr]  # assigned: placed
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
    def answer_query(self, op: str, args: dict[str, Any]) -> Any:
        """A diagnostics request (``control.dispatch`` and the state API call this)."""
        from lightwork.engines.local import queries

        return queries.answer_query(self, op, args)

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
    from lightwork.engines.local.memory_monitor import read_meminfo

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
