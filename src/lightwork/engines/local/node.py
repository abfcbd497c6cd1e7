"""The driver's runtime: the coordinator of the parts that own its state.

    user threads (API calls)          I/O thread "lightwork-node"
    ─ submit: serialize args, ─┐      ┌─ select() on worker sockets, the fork server's
      take the lock, register, │      │  control socket and a wake-up pipe
      dispatch, send frames    ├─lock─┤─ read frames, apply them (results, nested
    ─ get/wait: register a     │      │  submissions, borrows, deaths), dispatch
      waiter, block on it   ───┘      └─ run timers; complete futures outside the lock

One lock (``self.lock``, ``node_lock.py``) guards all runtime state; whoever holds it is
the one mutator. API threads do their own sends (no thread hand-off on the submit path);
the I/O thread does most reads. A task submitted while every worker is busy skips the
lock: it is queued and registered by the lock's next taker (``node_lock.py``).

The parts, each the only one to change what it owns (all under the lock):

=================  ===================================================================
``objects``        ``ObjectTable`` (objects.py): every object's entry, state, holders
``task_table``     ``TaskTable`` (task_table.py): live tasks, their code, recursive-
                   cancel bookkeeping, task-end listeners
``scheduler``      ``Scheduler`` (scheduler.py): resources, ready queue, worker slots,
                   placement groups; pure decisions, no I/O
``pool``           ``WorkerPool`` (worker_pool.py): worker processes, their
                   connections, the fork server; signalling workers
``io``             ``IOLoop`` (io_loop.py): the I/O thread, selectors, gate, wake-ups,
                   timers, deferred callbacks; who leads a blocked get
``actors``         ``ActorManager`` (actors.py): actors, their calls and restarts
``streams``        ``StreamTable`` (streams.py): generator tasks' yielded items
``store``          ``SegmentStore`` (store.py) and ``spiller`` (spill.py): shared memory
``gpus``, ``log``  GPU ids per task and actor; the event log (kernel/events.py)
``output``         ``DriverOutput`` (output.py): what workers print
=================  ===================================================================

The node itself keeps only what no part owns alone: whether the runtime is ``closed``
or ``broken``, the id counter, and the cache of feasible shapes. Its own methods, and
those of its mixins, are the coordination that touches several parts at once: a
submission registers return objects, a task and its dependencies, then dispatches;
a result resolves objects, ends a task, frees a slot; a worker's death requeues or fails
its tasks and has the driver adopt its objects. They call the parts' methods and never
change a part's fields. The mixins are that coordination split by what starts it, and
hold no state: ``driver_calls.py`` (the API's operations), ``worker_requests.py`` (what
workers send), ``worker_deaths.py`` (a worker's end), ``cancel.py`` (cancelling) and
``lineage.py`` (rebuilding lost values). They stay mixins, not parts, because each
handler runs several parts' steps under the one lock in one frame: as parts they would
only hold a reference back to the node.

``node.tasks``, ``node.workers`` and ``node.forkserver`` are the task table's and the
pool's own dict and fork server, read (never changed) by the tools; ``node._send`` is
the I/O loop's ``send``, bound once because the hot paths call it per frame.

Reference counting: see ``objects.py`` (the table) and ``kernel/object_ref.py`` (per
process). What the I/O loop costs on the hot path: ``io_loop.py``.
"""

from __future__ import annotations

import gc
import itertools
import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions
from lightwork.kernel.object_ref import (
    DRIVER_IDS,
    IdFloor,
    ObjectRef,
    ended_session_message,
    keep_out_of_band,
    ref_counter,
)
from lightwork.kernel import control
from lightwork.engines.local.actors import ActorManager
from lightwork.engines.local.cancel import Cancellation
from lightwork.engines.local.driver_calls import DriverCalls
from lightwork.engines.local.worker_requests import WorkerRequests
from lightwork.engines.local.worker_deaths import WorkerDeaths
from lightwork.engines.local import protocol as p
from lightwork.engines.local import preload
from lightwork.kernel import serialization
from lightwork.kernel.events import EventLog, TaskRecord
from lightwork.engines.local.gpus import GpuIds
from lightwork.engines.local.io_loop import IOLoop
from lightwork.engines.local.lineage import Lineage
from lightwork.engines.local.memory_monitor import MemoryMonitor
from lightwork.kernel.environ import retry_delay_from_env
from lightwork.engines.local.node_lock import NodeLock
from lightwork.engines.local.output import DriverOutput
from lightwork.engines.local.record import LocalRecord
from lightwork.kernel.pauses import PauseTable
from lightwork.engines.local.objects import FAILED, PENDING, ObjectEntry, ObjectTable
from lightwork.engines.local.scheduler import (
    DISPATCHED,
    FAILED as TASK_FAILED,
    Scheduler,
    TaskSpec,
)
from lightwork.kernel.serialization import Stored
from lightwork.kernel.session import Session
from lightwork.engines.local.streams import StreamTable
from lightwork.engines.local.spill import Spiller
from lightwork.engines.local.store import SegmentStore, default_budget
from lightwork.engines.local.task_table import TaskTable, tell
from lightwork.engines.local.worker_pool import WorkerConn, WorkerPool

log = logging.getLogger("lightwork")

if TYPE_CHECKING:

    class NodeState:
        """What :class:`Node`'s mixins share, declared for the type checker only.

        Each mixin (``driver_calls.py``, ...) subclasses this under
        ``TYPE_CHECKING`` (at run time, ``object``): the parts ``Node.__init__`` makes,
        the node's own flags, and the methods one mixin calls on another, so mypy
        checks every mixin against one list. ``Node`` itself cannot be the mixins'
        base: it subclasses them.
        """

        _ids: itertools.count[int]
        _feasible_shapes: set[tuple]
        _warned_shapes: set[tuple]  # shapes that can never run, already warned of
        # (an instance attribute: IOLoop.send, bound; see Node.__init__)
        _send: Callable[[WorkerConn, list[tuple[Any, ...]]], None]
        output: DriverOutput
        pauses: PauseTable
        advisor: Any  # the live advisor (diagnostics layer), or None
        advice_events: deque[tuple[Any, ...]]
        actors: ActorManager
        retry_delay_s: float
        broken: str
        closed: bool
        gpus: GpuIds
        io: IOLoop
        pool: WorkerPool
        id_floor: IdFloor
        job_id: int
        lock: NodeLock
        log: EventLog
        namespace: str | None
        node_id: str
        objects: ObjectTable
        scheduler: Scheduler
        session: Session
        store: SegmentStore
        streams: StreamTable
        task_table: TaskTable
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
        def _handle_read(self, conn: WorkerConn, messages: list[tuple[Any, ...]]) -> None: ...
        def _on_worker_eof(self, conn: WorkerConn) -> None: ...
        def _finish_worker_death(self, conn: WorkerConn) -> None: ...
        def _retire_worker(self, conn: WorkerConn) -> None: ...
        def _end_pauses(self, conn: WorkerConn) -> None: ...


class Node(DriverCalls, WorkerRequests, Lineage, Cancellation, WorkerDeaths, LocalRecord):
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
        debugger: str = "pdb",
        post_mortem: bool = False,
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
        self.task_table = TaskTable()  # live tasks, their code, their ends' listeners
        # (Tools read the live tasks as ``node.tasks``; only the table changes them.)
        self.tasks: dict[int, TaskSpec] = self.task_table.tasks
        self.lock.register = self._register_queued
        self.gpus = GpuIds(int(num_gpus))  # which GPU ids each task and actor uses
        # Ids continue from the previous session (see kernel/object_ref.py).
        self.id_floor = IdFloor()
        self._ids = DRIVER_IDS
        self._feasible_shapes: set[tuple] = set()
        self._warned_shapes: set[tuple] = set()
        self.output = DriverOutput(echo=log_to_driver)  # what workers print (output.py)
        # Calls paused in the debugger now (kernel/debugger.py).
        self.pauses = PauseTable()
        self.post_mortem = post_mortem
        self.closed = False
        self.broken = ""  # why the runtime cannot go on (a dead fork server, a bug), or ""
        self.advisor: Any = None  # set by init() unless advisor=False (diagnostics layer)
        # What serving the workers' requests showed the advisor (``note_blocking_call``,
        # ``note_returned_refs`` in worker_requests.py),
        # kept only while it runs; its looks take them.
        self.advice_events: deque[tuple[Any, ...]] = deque(maxlen=256)
        self.memory_monitor: MemoryMonitor | None = None  # started by init()
        self.retry_delay_s = retry_delay_from_env()  # before a retry for retry_exceptions
        self.actors = ActorManager(self)
        self.streams = StreamTable(self)  # generator tasks' yielded items (streams.py)
        self.objects.on_actor_freed = self.actors.handle_freed
        # The worker processes and the fork server that starts them; the fork server is
        # started before our I/O thread exists. (Tools read ``node.workers`` and
        # ``node.forkserver``; only the pool changes them.)
        self.pool = WorkerPool(self.session, self.scheduler, runtime_env, self.job_id,
                               event_budget)
        self.workers: dict[int, WorkerConn] = self.pool.workers
        self.pool.debugging = {"debugger": debugger, "post_mortem": post_mortem}
        self.forkserver = self.pool.forkserver
        # The I/O thread, the selectors and wake-ups, the timers and deferred callbacks
        # (io_loop.py). Sending is the loop's; ``_send`` is its bound method, which the
        # hot paths here and in actors.py call without an attribute chain.
        self.io = IOLoop(self)
        self._send = self.io.send
        ref_counter.on_borrow = self._on_driver_borrow
        ref_counter.on_out_of_band = self._on_out_of_band
        self.pool.watch = self.io.watch_worker
        self.pool.waiting = lambda: preload.waiting_pickles(self)
        if self.pool.first_workers_at_init():  # (else at the first submission: preload.py)
            with self.lock:
                for _ in range(max(1, int(num_cpus))):
                    self.pool.start()
        self.io.start()
        self.control = control.start(self)  # diagnostics side-car: socket, sampler

    # ------------------------------------------------------------------ ids, failure
    def next_object_id(self) -> int:
        return next(self._ids)

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
            deferred = self.io.take_deferred()
        print(f"lightwork: the runtime stopped working: {reason}", file=sys.stderr)
        self.io.wake_leader()
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
            if entry.stream_pinned:  # a generator's item: the consumer holds it now
                self.streams.on_consumer_hold(entry)

    def _on_out_of_band(self, ref: ObjectRef, how: str) -> None:
        """The user pickled ``ref`` outside lightwork's serializer, or rebuilt it from
        its id (``RefCounter.on_out_of_band``): a pickled one is kept until shutdown, so
        the bytes stay loadable whatever happens to the user's refs; the advisor is told."""
        site = keep_out_of_band(ref, how)
        if site is not None and self.advisor is not None:
            self.advice_events.append(("out-of-band", how, ref.hex(), site, None))

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
                "(its ObjectRef was deleted, or the ref was rebuilt from its id, "
                "ObjectRef.from_hex, after the original was garbage-collected). Keep an "
                "ObjectRef alive for as long as you need the object, and pass the ref itself "
                "rather than its id.",
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
        self.task_table.add(task)
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
            scheduler.note_submitting()
        create = self.objects.create
        add = self.task_table.add
        while queued:
            task = queued.popleft()
            at = task.record.submitted
            if task.plain:  # what register_task comes to for it, without its tests
                create(task.return_ids[0], 0, task.task_id, at)  # (its one return)
                add(task)
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
        failed = None
        for object_id in task.deps:
            entry = self.objects.entries[object_id]
            if entry.state == FAILED:
                failed = entry
                break
        if failed is not None:
            self._fail_task(task, failed.error)
        if task.actor_id:  # ready, or failed: the calls queued behind it may go now
            actor = self.actors.actors.get(task.actor_id)
            # A busy actor's ready calls go with its next frame read (IOLoop.read_worker), and
            # a new call is queued after this (ActorManager.add_call sends it if idle).
            if actor is not None and len(actor.inflight) < actor.slots:
                self.actors.pump(actor)
        elif failed is None:
            self.scheduler.make_ready(task)

    def _fail_task(self, task: TaskSpec, error: Any) -> None:
        for object_id in task.return_ids:
            entry = self.objects.get(object_id)
            if entry is not None:
                self._resolve(entry, None, error)
        task.record.error = _error_summary(error)
        self._end_task(task, TASK_FAILED)

    def _end_task(self, task: TaskSpec, state: str) -> None:
        tell_listeners = self.task_table.end(task, state)
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
        if tell_listeners:  # outside the lock, once this call's ends are all noted
            self.io.defer(self._tell_listeners)

    def _tell_listeners(self) -> None:
        with self.lock:
            ended, listeners = self.task_table.take_unheard()
        if ended:
            for listener in listeners:
                tell(listener, ended)

    def add_task_listener(self, listener: Callable[[list[TaskRecord]], None]) -> None:
        """Call ``listener(records)`` with the records of tasks as they end (see
        ``task_table.py``)."""
        with self.lock:
            self.task_table.add_listener(listener)

    def remove_task_listener(self, listener: Callable[[list[TaskRecord]], None]) -> None:
        with self.lock:
            owed = self.task_table.remove_listener(listener)
        if owed:
            tell(listener, owed)

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
            scheduler.settle()
            return
        try:
            while True:
                assignments = scheduler.schedule(time.monotonic())
                if scheduler.newly_reserved:  # their bundles' GPU ids, before anything runs there
                    for group in scheduler.take_newly_reserved():
                        self.gpus.reserve_group(group)
                self._send_assignments(assignments)
                if scheduler.orphaned:
                    self._fail_orphaned_tasks()
                if self.actors.pending:
                    self.actors.place_pending()
                if scheduler.starving <= 0:
                    return
                gpu_kind = scheduler.take_starving_gpu()
                room = scheduler.worker_cap() - len(scheduler.workers)
                to_start = min(scheduler.starving, room)
                if to_start <= 0:
                    return
                for started in range(to_start):
                    # The GPU kind first: its tasks wait for nothing else (scheduler.py).
                    self.pool.start(gpu=started < gpu_kind)
        except exceptions.RuntimeSystemError as exc:
            reason = str(exc)  # fail outside this call: it may run under a user's API call
            self.io.defer(lambda: self.fail_runtime(reason))

    def _send_assignments(self, assignments: list[TaskSpec]) -> None:
        if assignments:
            batches: dict[WorkerConn, list[tuple[Any, ...]]] = {}
            now = time.monotonic()
            gpus = self.gpus if self.gpus.any else None  # (a call per task saved without)
            workers = self.workers
            functions = self.task_table.functions
            args: Stored | bytes  # a task's arguments as the frame carries them
            for task in assignments:
                conn = workers[task.worker.worker_id]  # type: ignore[union-attr]  # assigned: placed
                batch = batches.get(conn)
                if batch is None:
                    batch = batches[conn] = []
                key = task.function_key
                if key not in conn.functions:
                    conn.functions.add(key)
                    batch.append((p.FUNCTION, key, functions[key]))
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

    def collect_garbage(self) -> None:
        """The store is under pressure (``SegmentStore.on_high``): every worker runs
        Python's cycle collector between its calls (``COLLECT``), and so does the driver,
        here on the spill thread with no lock held. The refs it frees are released as
        any dropped ref is (the I/O loop drains them)."""
        with self.lock:
            if self.closed:
                return
            for conn in list(self.workers.values()):
                self._send(conn, [(p.COLLECT,)])
        log.debug("the object store holds %d of its %d bytes: collecting garbage cycles",
                  self.store.live_bytes, self.store.budget)
        gc.collect()

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
        self.io.wake()
        self.io.join()
        self.output.close()  # the lines the workers printed last, if the terminal takes them
        self.pool.stop()
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
        self.io.close()
        if ref_counter.on_borrow == self._on_driver_borrow:
            ref_counter.on_borrow = None
            ref_counter.on_first_release = None
        if ref_counter.on_out_of_band == self._on_out_of_band:
            ref_counter.on_out_of_band = None
            ref_counter.pinned.clear()

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
