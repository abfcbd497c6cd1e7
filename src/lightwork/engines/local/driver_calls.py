"""The driver's side of the public API, as methods of the Node (a mixin: coordination).

``submit_task``/``submit_actor_task``/``create_actor``/``put`` register work under the
node's lock and dispatch it from the caller's thread (no hand-off on the submit path);
``get``/``wait`` register a :class:`Countdown` on the pending objects and block on it
(``IOLoop.lead``). The first blocked caller *leads*: it polls the worker sockets itself
on its own epoll, so the result that completes its countdown wakes it directly; other
blocked callers wait on their countdown's event, set by whichever thread applied the
result. A leader spins briefly before it blocks (``spin.py``) and mutes the I/O thread's
watch of the workers meanwhile (``io_loop.py``).

Every method here runs in a user thread; the state belongs to the node's parts
(``node.py``), whose methods these call.

A submission that finds every worker busy is queued without the lock
(``node_lock.py``). Every ``SUBMITTER_PASS_EVERY`` queued submissions the submitting
thread registers them, reads the workers and dispatches itself
(``IOLoop.submitter_pass``), with the I/O thread's watch of the workers muted as for a
leading getter. Why: with two
threads taking turns with the GIL, each turn moved the batch's objects from one core's
cache to the other's, and the workers got their tasks in bursts.

The common task (``TaskSpec.plain``: the driver's, one return, no dependencies, inline
arguments without refs) takes shorter paths on both sides: registered straight from the
submit queue, its result kept as its bytes (``ObjectEntry.serialized``), its ref counted
without a lock (``_object_ref.fresh_ref``), its record, spec and entry made in C
(``collector.maker``), and a read's plain results ended in one pass
(``WorkerRequests._on_task_messages``).

Measured: see bench/HOTPATH.md, "The driver's share".
"""

from __future__ import annotations

import concurrent.futures
import copy
import os
import threading
import time
from collections.abc import Callable
from pickle import loads as pickle_loads
from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions
from lightwork.kernel.object_ref import ObjectRef, fresh_ref, ref_counter
from lightwork.kernel import serialization
from lightwork.kernel.calls import (
    ActorSpec,
    CallSpec,
    large_arguments,
    prepare_args,
    unschedulable_error,
    warn_actor_unschedulable,
    warn_unschedulable,
)
from lightwork.kernel.collector import keep_out_of_collector, maker, untrack_hot
from lightwork.kernel.events import DriverSpan, TaskRecord
from lightwork.engines.local.lineage import value_vanished
from lightwork.engines.local.objects import FAILED, PENDING, READY, ObjectEntry
from lightwork.engines.local.scheduler import TaskSpec
from lightwork.kernel.serialization import Stored

if TYPE_CHECKING:
    from lightwork.engines.local.node import NodeState
    from lightwork.engines.local.store import SegmentStore

    _Base = NodeState
else:
    _Base = object


DRIVER_BUSY_SAMPLE_S = 0.005
#: A thread submitting while every worker is busy reads the workers and dispatches
#: itself each time this many submissions wait to be registered (``IOLoop.submitter_pass``).
SUBMITTER_PASS_EVERY = 128
#: A blocked get's values are summed into its span (the advisor's get-too-many rule)
#: only while the store's segments hold this much: one comparison for any other get.
GET_SIZE_GATE = 64 << 20

#: A new task's or call's record and spec, made out of the collector (collector.py): a
#: record always (events.py), a spec while it is pending (where that pays: untrack_hot).
make_record = maker(TaskRecord, keep_out_of_collector)
make_spec = maker(TaskSpec, untrack_hot)


_schedstat: tuple[int, int] | None = None  # (pid, fd of the main thread's schedstat)
#: libc's pread through ctypes, and the one buffer it reads into (the main thread's only).
_pread_holding_gil: tuple[Any, Any] | None = None  # (ctypes: dynamic attributes)


def _read_schedstat(fd: int) -> bytes:
    # libc's pread through ctypes.PyDLL, which keeps the GIL: os.pread releases it, and
    # in a submit loop the I/O thread takes it then, so each sample would cost the loop
    # a GIL hand-off. The buffer is made once: a sample comes every 5 ms, with ctypes'
    # code gone cold by then, and making a buffer cold cost more than the read itself
    # (measured: see bench/HOTPATH.md, "The driver's share").
    global _pread_holding_gil
    import ctypes

    if _pread_holding_gil is None:
        pread = ctypes.PyDLL(None, use_errno=True).pread
        pread.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long)
        pread.restype = ctypes.c_ssize_t
        _pread_holding_gil = (pread, ctypes.create_string_buffer(64))
    pread, buffer = _pread_holding_gil
    length = pread(fd, buffer, 64, 0)
    if length < 0:
        raise OSError(ctypes.get_errno(), "pread of schedstat failed")
    return buffer.raw[:length]


def _thread_cpu_and_busy_s() -> tuple[float, float]:
    """The calling (main) thread's CPU seconds, and its seconds running or ready to run
    (``schedstat``: CPU time plus time waiting for a core, so a loaded machine stretches
    the driver's work without hiding it; its CPU time where ``/proc`` has no schedstat)."""
    global _schedstat
    try:
        if _schedstat is None or _schedstat[0] != os.getpid():
            _schedstat = (os.getpid(), os.open("/proc/thread-self/schedstat", os.O_RDONLY))
        ran, waited = _read_schedstat(_schedstat[1]).split()[:2]
        return int(ran) / 1e9, (int(ran) + int(waited)) / 1e9
    except (OSError, ValueError, AttributeError):  # AttributeError: no libc pread
        cpu = time.thread_time()
        return cpu, cpu


class Countdown:
    """Wakes a blocked caller when ``remaining`` objects have resolved.

    ``hit`` runs under the node's lock. The caller may be polling the workers itself
    (``IOLoop.lead``, the leader: it reads ``remaining``); when another thread
    completes the countdown, ``wake`` interrupts the leader's select. A caller that does
    not lead sleeps on ``event``, made (under the lock) only then: most gets lead.
    """

    __slots__ = ("remaining", "event", "waiter", "wake")

    def __init__(self, remaining: int) -> None:
        self.remaining = remaining
        self.event: threading.Event | None = None
        self.waiter = threading.get_ident()
        self.wake: Callable[[], None] | None = None

    def hit(self, entry: ObjectEntry) -> None:
        self.remaining -= 1
        if self.remaining <= 0:
            if self.event is not None:
                self.event.set()
            if self.wake is not None and threading.get_ident() != self.waiter:
                self.wake()


class FailFastCountdown(Countdown):
    """A ``get`` of several objects: the first that fails ends the wait, as in Ray (the
    error is raised at once, not after the others, which may never come: a call that
    waits for a signal sent only after the caller saw the error)."""

    __slots__ = ("failed",)

    def __init__(self, remaining: int) -> None:
        Countdown.__init__(self, remaining)
        self.failed = False

    def hit(self, entry: ObjectEntry) -> None:
        if entry.state == FAILED:
            self.remaining = 1
            self.failed = True
        Countdown.hit(self, entry)


class DriverCalls(_Base):
    """The public API's operations on the driver's runtime."""

    def cancel(self, object_ids: list[int], force: bool, recursive: bool = True) -> None:
        with self.lock:
            for object_id in object_ids:
                if object_id not in self.objects.entries and self.id_floor.minted_before(object_id):
                    raise self.ended_session_error(object_id)
            self._cancel_ids(object_ids, force, recursive)

    # When the next submission samples the driver's CPU time (see _sample_driver_busy).
    _driver_busy_due = 0.0

    def _sample_driver_busy(self, record: TaskRecord, submitted: float) -> None:
        """Note on ``record`` how long the main thread has worked (at most every
        ``DRIVER_BUSY_SAMPLE_S``: a float compare per task otherwise; a sample costs
        ~2-10 µs). The advisor's serial-driver rule reads the driver's own work from
        it rather than from wall time, in which a sleeping driver looks busy."""
        self._driver_busy_due = submitted + DRIVER_BUSY_SAMPLE_S
        if threading.get_ident() == threading.main_thread().ident:
            record.driver_cpu, record.driver_busy = _thread_cpu_and_busy_s()

    # ------------------------------------------------------------------ the API
    def submit_task(
        self, spec: CallSpec, args: tuple, kwargs: dict, callsite: Any = None
    ) -> list[ObjectRef]:
        shape = spec.shape
        if shape not in self._feasible_shapes:
            problem = self.scheduler.check_feasible(shape)
            if problem:
                removed = self.scheduler.removed_names
                if removed and any(name in removed for name, _ in shape):
                    raise exceptions.TaskPlacementGroupRemoved(
                        f"task {spec.name} was submitted to a placement group that was "
                        "removed; create a new group, or submit it without one")
                return self._submit_unschedulable(spec, callsite, problem)
            self._feasible_shapes.add(shape)
        ids = self._ids
        task_id = next(ids)
        submitted = time.monotonic()  # before the copy: the copy is part of submitting
        stored, deps = prepare_args(args, kwargs, self.store)
        try:
            single = spec.num_returns == 1
            return_ids = (next(ids),) if single else tuple(
                next(ids) for _ in range(spec.num_returns))
            # A task without dependencies is ready from its submission (register_task).
            record = make_record(task_id, spec.name, 0, submitted,
                                 0.0 if deps else submitted, stored.size, callsite, spec.cpus)
            if submitted >= self._driver_busy_due:
                self._sample_driver_busy(record, submitted)
            if stored.path is not None:
                record.large_args = large_arguments(args, kwargs)
                record.copy_s = time.monotonic() - submitted
                if self.advisor is not None and record.large_args:
                    self.advisor.note_large_args(record)  # (the user's thread: it may warn)
            task = make_spec(
                task_id, spec.key, spec.name, stored, deps, return_ids, spec.num_returns, shape,
                spec.max_retries, spec.retry_exceptions, 0, record, 0, 0,
                single and not (deps or stored.contained) and stored.path is None,  # plain
            )
            self.submit(task, spec.blob)
        except BaseException:
            if stored.path is not None:
                self.store.release(stored.path)
            raise
        if single:
            return [fresh_ref(return_ids[0])]
        return [fresh_ref(object_id) for object_id in return_ids]

    def _submit_unschedulable(self, spec: CallSpec, callsite: Any, problem: str) -> list[ObjectRef]:
        """A task whose shape this runtime can never offer (``problem`` says why): warned
        of once per shape, and its refs failed at once, so that a program that never
        reads them goes on, as on Ray, and a get says why instead of waiting forever.
        Its arguments are not kept: it will never run."""
        if spec.shape not in self._warned_shapes:
            self._warned_shapes.add(spec.shape)
            warn_unschedulable("task", spec.name, problem)
        error = unschedulable_error("task", spec.name, problem)
        ids = self._ids
        task_id = next(ids)
        return_ids = tuple(next(ids) for _ in range(spec.num_returns))
        submitted = time.monotonic()
        stored, _ = prepare_args((), {}, self.store)
        record = make_record(task_id, spec.name, 0, submitted, submitted, 0, callsite, spec.cpus)
        task = make_spec(task_id, spec.key, spec.name, stored, (), return_ids, spec.num_returns,
                         spec.shape, 0, False, 0, record, 0, 0, True)
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            for object_id in return_ids:
                self.objects.create(object_id, 0, task_id, submitted)
            self.task_table.add(task)
            self._fail_task(task, error)
        return [fresh_ref(object_id) for object_id in return_ids]

    def create_actor(self, actor: ActorSpec, blob: bytes) -> None:
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            self.task_table.add_function(actor.class_key, blob)
            problem = self.actors.create(actor)
        if problem:  # dead from birth: each of its calls says why (ActorManager.create)
            warn_actor_unschedulable(self._warned_shapes, actor, problem)

    def submit_actor_task(
        self, actor_id: int, method: str, name: str, args: tuple, kwargs: dict,
        num_returns: int, callsite: Any = None,
    ) -> list[ObjectRef]:
        actor = self.actors.actors.get(actor_id)
        if actor is None and self.id_floor.minted_before(actor_id):
            raise self.ended_session_error(actor_id, actor=True)
        ids = self._ids
        task_id = next(ids)
        submitted = time.monotonic()
        stored, deps = prepare_args(args, kwargs, self.store)
        return_ids = (next(ids),) if num_returns == 1 else tuple(
            next(ids) for _ in range(num_returns))
        record = make_record(task_id, name, 0, submitted, 0.0 if deps else submitted,
                             stored.size, callsite, 1.0, actor_id)
        if submitted >= self._driver_busy_due:
            self._sample_driver_busy(record, submitted)
        if stored.path is not None:
            record.large_args = large_arguments(args, kwargs)
            record.copy_s = time.monotonic() - submitted
            if self.advisor is not None and record.large_args:
                self.advisor.note_large_args(record)  # (the user's thread: it may warn)
        task = make_spec(task_id, method, name, stored, deps, return_ids, num_returns, (), 0,
                         False, 0, record, actor_id, 0,
                         num_returns == 1 and not (deps or stored.contained)
                         and stored.path is None)
        if (actor is not None and len(actor.inflight) >= actor.slots
                and actor.max_pending_calls < 0 and not (deps or stored.contained)):
            # Every slot of the actor is taken: queued, as in submit (node_lock.py).
            if self.closed or self.broken:
                self._check_open()  # (it raises, saying which)
            queued = self.lock.queued
            queued.append(task)
            if len(actor.inflight) < actor.slots:  # looked at again after the append:
                with self.lock:  # a slot freed meanwhile; __enter__ registers and sends it
                    self._check_open()
            elif len(queued) >= SUBMITTER_PASS_EVERY:
                self.io.submitter_pass()
            if num_returns == 1:
                return [fresh_ref(return_ids[0])]
            return [fresh_ref(object_id) for object_id in return_ids]
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            try:
                self.actors.check_room(actor_id)
                now = time.monotonic()
                for object_id in return_ids:
                    self.objects.create(object_id, 0, task_id, now)
                self.register_task(task, stored.contained, now)
            except BaseException:
                self.objects.discard(return_ids)
                if stored.path is not None:
                    self.store.release(stored.path)
                raise
            self.actors.add_call(actor_id, task)
        return [fresh_ref(object_id) for object_id in return_ids]

    def kill_actor(self, actor_id: int, no_restart: bool = True) -> None:
        """Kill the actor (for good unless ``no_restart`` is False): the dashboard's
        action, and the run record's ``kill_actor``."""
        with self.lock:
            self._check_open()
            self.actors.kill(actor_id, no_restart)

    def driver_request(self, what: str, *args: Any) -> Any:
        with self.lock:
            self._check_open()
            if what == "get_actor":
                found = self.actors.lookup_name(args[0], args[1])
                return None if found is None else (found.actor_id, found.class_name, found.methods)
            if what == "kill":
                self.actors.kill(args[0], args[1])
                return None
            if what == "placement_group":
                return self.placement_group_request(*args)
            if what == "stream":
                return self.streams.request(*args)
            raise ValueError(f"unknown request {what!r}")

    # ------------------------------------------------------------------ placement groups
    def placement_group_request(self, op: str, *args: Any) -> Any:
        """``create``/``remove``/``table`` of placement groups (caller holds the lock).

        The decisions are the scheduler's (see ``scheduler.py``); this carries them out:
        dispatch what a new reservation or a returned one lets run, fail what a removal
        strands, and forget cached feasibility of the removed group's resource names."""
        scheduler = self.scheduler
        if op == "create":
            group_id, group_hex, name, bundles, strategy = args
            if name and any(group.name == name and group.state != "REMOVED"
                            for group in scheduler.groups.values()):
                raise ValueError(
                    f"a placement group named {name!r} already exists; pick another name, or "
                    "remove it first (lightwork.util.remove_placement_group)")
            scheduler.add_group(group_id, group_hex, name, bundles, strategy)
            self._dispatch()
            return None
        if op == "remove":
            group = scheduler.remove_group(args[0])
            if group is None:
                raise ValueError(f"no placement group with id {args[0]} in this session")
            self.gpus.remove_group(group.hex)
            removed = scheduler.removed_names
            self._feasible_shapes = {shape for shape in self._feasible_shapes
                                     if not any(name in removed for name, _ in shape)}
            for actor in list(self.actors.actors.values()):
                if actor.state != "DEAD" and any(
                        name in removed for name, _ in (*actor.place, *actor.hold)):
                    self.actors.kill(actor.actor_id, True)
                    actor.death_cause = "its placement group was removed"
            self._dispatch()
            return None
        if op == "table":
            return {group.hex: group.row(self.node_id) for group in scheduler.groups.values()}
        raise ValueError(f"unknown placement group request {op!r}")

    def _fail_orphaned_tasks(self) -> None:
        for task in self.scheduler.take_orphaned():
            self._fail_task(task, exceptions.TaskPlacementGroupRemoved(
                f"task {task.name} was to run in a placement group that was removed before "
                "it could start; create a new group, or submit it without one"))

    def submit(self, task: TaskSpec, function_blob: bytes | None) -> None:
        scheduler = self.scheduler
        if scheduler.may_queue and not scheduler.idle and not (task.deps or task.args.contained):
            # Every worker is busy: queued, and registered by the lock's next taker
            # (node_lock.py), most often the I/O thread once a worker frees. (Never
            # while a worker of the GPU kind is idle: ``may_queue``, scheduler.py.)
            if self.closed or self.broken:
                self._check_open()  # (it raises, saying which)
            if function_blob is not None:  # (no lock needed: task_table.py)
                self.task_table.add_function(task.function_key, function_blob)
            queued = self.lock.queued
            queued.append(task)
            if scheduler.idle:  # looked at again after the append (see node_lock.py):
                with self.lock:  # a worker freed meanwhile; __enter__ registers it
                    self._check_open()
                    self._dispatch()
            elif len(queued) >= SUBMITTER_PASS_EVERY:
                self.io.submitter_pass()
            return
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            if function_blob is not None:
                self.task_table.add_function(task.function_key, function_blob)
            now = time.monotonic()
            for object_id in task.return_ids:
                self.objects.create(object_id, 0, task.task_id, now)
            try:
                self.register_task(task, task.args.contained, now)
            except BaseException:
                self.task_table.discard(task)
                self.objects.discard(task.return_ids)
                raise
            if self.scheduler.idle or not self.scheduler.may_queue:  # (a GPU worker idle)
                self._dispatch()
            # else: every worker is busy; the next result frees one and the poller
            # dispatches a whole batch then, instead of one frame per submit here.

    def _drain_refs_if_any(self) -> None:
        if ref_counter._released:
            with self.lock:
                self._drain_refs()

    def _check_open(self) -> None:
        if self.closed:
            raise exceptions.RuntimeSystemError(
                "the lightwork runtime was shut down; call lightwork.init() to start a new one")
        if self.broken:
            raise exceptions.RuntimeSystemError(
                f"the lightwork runtime stopped working: {self.broken}\nCall "
                "lightwork.shutdown() and lightwork.init() to start a new runtime.")

    def put(self, value: Any) -> ObjectRef:
        object_id = self.next_object_id()
        start = time.monotonic()
        stored = serialization.serialize(value, self.store)
        if stored.path is not None and self.log.enabled:
            # lightwork's own copying, not the driver's work (the advisor subtracts it).
            self.log.add_span(DriverSpan("put", start, time.monotonic(), 1,
                                         threading.get_ident(), object_id))
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            entry = self.objects.create(object_id, 0)
            self.objects.resolve(entry, stored)
            return fresh_ref(object_id)

    def get(self, ids: list[int], timeout: float | None, callsite: Any = None) -> list[Any]:
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            # (None in it is caught just below: mypy does not follow a None-in test)
            known: Callable[[int], ObjectEntry] = self.objects.entries.get  # type: ignore[assignment]
            entries = [known(i) for i in ids]
            if None in entries:  # (lookup says why: a freed ref, or an ended session's)
                entries = [self.lookup(i) for i in ids]
            pending = [e for e in entries if e.state == PENDING]
            countdown = None
            # Raise the first failed one's error without waiting (below) when one failed
            # already; looked for only when some have ended (a batch's get: none have).
            failed = (len(entries) > len(pending) > 0
                      and any(e.state == FAILED for e in entries))
            if failed:
                pending = []
            if pending:
                countdown = (FailFastCountdown if len(pending) > 1 else Countdown)(len(pending))
                hit = countdown.hit
                for entry in pending:
                    if entry.waiters is None:  # (add_waiter's common case, without a call)
                        entry.waiters = hit
                    else:
                        entry.add_waiter(hit)
        if countdown is not None:
            start = time.monotonic()
            finished = self.io.lead(countdown, timeout)
            if self.log.enabled:
                self.log.add_span(self._span("get", start, entries, pending, callsite))
            if not finished:
                with self.lock:
                    for entry in pending:
                        entry.remove_waiter(countdown.hit)
                still = sum(1 for e in pending if e.state == PENDING)
                raise exceptions.GetTimeoutError(
                    f"get timed out after {timeout} s: {still} of {len(ids)} object(s) not ready. "
                    "Raise the timeout, or use wait() to take the ready ones first.")
            if type(countdown) is FailFastCountdown and countdown.failed:
                failed = True  # ended by a failure: the others may still be pending
                with self.lock:
                    for entry in pending:
                        entry.remove_waiter(countdown.hit)
        output = self.output
        if output.written != output.queued:  # what the calls printed shows first
            output.settle()
        if failed:
            _value_of(next(e for e in entries if e.state == FAILED), self.store)
        store = self.store
        try:
            # A plain task's value is kept as its pickle (objects.py): read it in place.
            return [pickle_loads(value) if type(value := entry.serialized) is bytes
                    and entry.state == READY else _value_of(entry, store) for entry in entries]
        except FileNotFoundError:  # a segment vanished from /dev/shm: rebuild, then read
            with self.lock:
                for entry in entries:
                    if value_vanished(entry, store):
                        self.recover_lost(entry)
            return self.get(ids, timeout, callsite)

    def wait(
        self, ids: list[int], num_returns: int, timeout: float | None, callsite: Any = None
    ) -> list[int]:
        """Ids (in input order) of up to ``num_returns`` objects that are ready."""
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            entries = [self.lookup(i) for i in ids]
            ready = sum(1 for e in entries if e.state != PENDING)
            countdown = None
            if ready < num_returns and timeout != 0:
                countdown = Countdown(num_returns - ready)
                hit = countdown.hit
                for entry in entries:
                    if entry.state == PENDING:
                        entry.add_waiter(hit)
        if countdown is not None:
            start = time.monotonic()
            self.io.lead(countdown, timeout)
            if self.log.enabled:
                waited = [e for e in entries if e.ready_at >= start or e.state == PENDING]
                self.log.add_span(self._span("wait", start, entries, waited, callsite))
            with self.lock:
                for entry in entries:
                    entry.remove_waiter(countdown.hit)
        output = self.output
        if output.written != output.queued:  # what the calls printed shows first
            output.settle()
        return [e.object_id for e in entries if e.state != PENDING][:num_returns]

    def _span(
        self, kind: str, start: float, entries: list[ObjectEntry], waited: list[ObjectEntry],
        callsite: Any,
    ) -> DriverSpan:
        """The record of one blocked get/wait, with when its objects became ready."""
        if len(waited) == 1:  # get(f.remote()): the same figures, without the lists
            ready_at = waited[0].ready_at
            first = last = ready_at
            shortest = longest = ready_at - waited[0].created_at if ready_at else 0.0
        else:
            ready = [e for e in waited if e.ready_at]
            ready_times = [e.ready_at for e in ready]
            durations = [e.ready_at - e.created_at for e in ready]
            first, last = min(ready_times, default=0.0), max(ready_times, default=0.0)
            shortest, longest = min(durations, default=0.0), max(durations, default=0.0)
        nbytes = 0
        if kind == "get" and self.objects.bytes_in_segments >= GET_SIZE_GATE:
            nbytes = sum(entry.size for entry in entries)
        return DriverSpan(
            kind, start, time.monotonic(), len(entries), threading.get_ident(),
            entries[0].object_id, callsite, entries[0].task_id, len(entries) - len(waited),
            first, last, shortest, longest, nbytes,
        )

    def future(self, ref: ObjectRef) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def complete(entry: ObjectEntry, keep: ObjectRef = ref) -> None:
            def run() -> None:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(_value_of(entry))
                    except BaseException as exc:  # noqa: BLE001 - delivered to the future
                        future.set_exception(exc)
            self.io.defer(run)

        with self.lock:
            self._check_open()
            entry = self.lookup(ref.id)
            if entry.state == PENDING:
                entry.add_waiter(complete)
                return future
        complete(entry)
        for run in self._deferred_pop():
            run()
        return future

    def _deferred_pop(self) -> list[Callable[[], None]]:
        with self.lock:
            return self.io.take_deferred()

    def runtime_context(self) -> dict[str, Any]:
        return {"actor_id": None, "actor_name": None,
                "job_id": self.job_id, "task_id": None, "worker_id": 0,
                "node_id": self.node_id, "resources": {}, "gpu_ids": (),
                "namespace": self.namespace, "pid": os.getpid()}

    def task_id_of(self, object_id: int) -> int:
        with self.lock:
            return self.lookup(object_id).task_id

    # ------------------------------------------------------------------ introspection
    def resources(self) -> tuple[dict[str, float], dict[str, float]]:
        with self.lock:
            return self._resources_x()

    def _resources_x(self) -> tuple[dict[str, float], dict[str, float]]:
        """(total, available) of the node; as in Ray, a resource none of which is free
        now is left out of ``available`` (a total of 0 is left out of both, but CPU's).
        Amounts are whole 1/10,000ths (``calls._check_precision``), so what is free is
        rounded to that unit: the float sums of fractional tasks taken and given back
        drift by 1e-16 or so (2.0000000000000004 free of 2), which the scheduler's own
        fit test tolerates but a program comparing with ``cluster_resources()`` does not."""
        scheduler = self.scheduler
        total = {k: v for k, v in scheduler.total.items() if v or k == "CPU"}
        available = {k: free for k in total
                     if (free := round(scheduler.available.get(k, 0.0), 4)) > 0}
        return total, available



def _value_of(entry: ObjectEntry, store: SegmentStore | None = None) -> Any:
    if entry.state == READY:
        stored = entry.serialized  # (a Stored, or bare bytes: objects.py)
        assert stored is not None
        if type(stored) is Stored and stored.path is not None and store is not None:
            store.touch(stored.path)  # least recently used spills first
        return serialization.loads(stored)
    error = entry.error
    if isinstance(error, Stored):
        error = serialization.loads(error)
    if isinstance(error, exceptions.TaskError):
        raised = error.as_instanceof_cause()
        raise copy.copy(error) if raised is error else raised
    assert isinstance(error, BaseException)
    # A copy: raising the table's own exception object would hang this call's frames (and
    # the ObjectRefs in them) on its __traceback__, so the object could never be freed.
    raise copy.copy(error)

