"""What workers send the driver: results (``DONE``), nested submissions, puts, borrows
and releases, get/wait from inside tasks, actor calls (``_handle`` dispatches them).

A result resolves its task's return objects (``store_results``) or, for an error,
retries the task (``retry_exceptions``) or fails it. A worker blocked in
``get``/``wait`` lends its CPU back to the pool (``Scheduler.block``) until the reply is
sent; a reply is sent when every object is ready or the timeout fires
(a timer of the I/O loop). Methods of the Node (a mixin: coordination of the task table,
the object table, the scheduler and the actors), called with its lock held; the I/O loop
(``IOLoop.read_worker``) hands each read's messages to ``_handle_read``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions
from lightwork.engines.local import protocol as p
from lightwork.kernel import serialization
from lightwork.engines.local.cancel import cancelled_error, interrupted_error
from lightwork.kernel.calls import retry_classes, unschedulable_error
from lightwork.kernel.collector import keep_out_of_collector
from lightwork.kernel.events import TaskRecord
from lightwork.kernel.pauses import pause_line
from lightwork.engines.local.lineage import file_exists, keeps_lineage
from lightwork.engines.local.objects import PENDING, READY, ObjectEntry
from lightwork.engines.local.output import STDERR
from lightwork.engines.local.protocol import DONE
from lightwork.engines.local.scheduler import FINISHED, READY as TASK_READY, WAITING, TaskSpec
from lightwork.kernel.serialization import Stored, unbare

if TYPE_CHECKING:
    from lightwork.engines.local.node import NodeState, WorkerConn

    _Base = NodeState
else:
    _Base = object


class WorkerRequests(_Base):
    """Handlers of the messages a worker sends, for itself and its running task."""

    def _handle(self, conn: WorkerConn, message: tuple[Any, ...]) -> None:
        entry: ObjectEntry | None
        kind = message[0]
        if kind == p.SUBMIT:
            self._on_worker_submit(conn, message)
        elif kind == p.FUNCTION:
            self.task_table.add_function(message[1], message[2])
            conn.functions.add(message[1])
        elif kind == p.PUT:
            entry = self.objects.create(message[1], conn.worker_id)
            conn.holds.add(message[1])
            conn.owned.add(message[1])
            # An error instead of a value: a num_returns="dynamic" item (Worker.put_error).
            self._resolve(entry, message[2], message[3] if len(message) > 3 else None)
        elif kind == p.BORROW:
            entry = self.objects.get(message[1])
            if entry is not None:
                entry.add_holder(conn.worker_id)
                conn.holds.add(message[1])
                if entry.stream_pinned:  # a generator's item: the consumer holds it now
                    self.streams.on_consumer_hold(entry)
        elif kind == p.RELEASE:
            for object_id in message[1]:
                conn.holds.discard(object_id)
                entry = self.objects.get(object_id)
                if entry is not None:
                    entry.discard_holder(conn.worker_id)
                    self.objects.release_if_unheld(entry)
            if self.streams.streams:
                self.streams.release_unconsumed()
        elif kind == p.GET:
            self._on_worker_get(conn, message[1], message[2], message[3],
                                message[4] if len(message) > 4 else None)
        elif kind == p.WAIT:
            self._on_worker_wait(conn, *message[1:])
        elif kind == p.BOUNCE:
            task = self.tasks.get(message[1])
            if task is not None and task.worker is conn.slot:
                self._release_gpus(task.task_id)
                self.scheduler.take_back(conn.slot, task)
                if task.cancelled and self.scheduler.remove_ready(task):
                    self._fail_task(task, cancelled_error(task, "before it ran"))
        elif kind == p.RETIRE:
            self._retire_worker(conn)
        elif kind == p.CANCEL:
            self._cancel_ids(message[1], message[2], message[3])
        elif kind == p.CALL:
            self._on_worker_call(conn, message[1], message[2], message[3:])
        elif kind == p.MAPPED:
            self.store.add_reader(message[1], conn.worker_id)
            self.store.touch(message[1])
        elif kind == p.UNMAPPED:
            for path in message[1]:
                self.store.remove_reader(path, conn.worker_id)
        elif kind == p.OUTPUT:
            self.output.receive(conn.worker_id, conn.pid, message[1])
        elif kind == p.DEBUG:
            self._on_debug(conn, message[1], message[2])
        elif kind == p.ADVICE:
            if self.advisor is not None:
                self.advice_events.append(self._advice_event(conn, message))

    def _advice_event(self, conn: WorkerConn, message: tuple[Any, ...]) -> tuple[Any, ...]:
        """What a worker told the advisor, as ``advice_events`` keeps it: a call that
        rebound a module global carries its task's record (the user's call site)."""
        if message[1] == "global-write":
            task_id = message[2]
            task = self.tasks.get(task_id)
            if task is None and conn.actor is not None:
                task = conn.actor.inflight.get(task_id)
            record = task.record if task is not None else None
            return ("global-write", record, *message[3:])
        return (message[1], *message[2:])

    def _on_debug(self, conn: WorkerConn, event: str, info: dict[str, Any]) -> None:
        """A call paused in the debugger (one line printed, listed for ``lightwork
        debug``) or runs on (its pause joins its record's ``paused`` windows)."""
        if event == "paused":
            info["worker_id"] = conn.worker_id
            self.pauses.add(info)
            self.output.say(STDERR, pause_line(info))  # (printed outside the lock)
            return
        opened = self.pauses.remove(info["socket"])
        task = self.tasks.get(info["task_id"])
        if opened is not None and task is not None:
            task.record.paused += ((opened["since"], info["until"]),)

    def _end_pauses(self, conn: WorkerConn) -> None:
        """A worker ended: its paused calls are paused no more."""
        now = time.monotonic()
        for info in self.pauses.drop_worker(conn.worker_id):
            task = self.tasks.get(info["task_id"])
            if task is not None:
                task.record.paused += ((info["since"], now),)

    def _handle_read(self, conn: WorkerConn, messages: list[tuple[Any, ...]]) -> None:
        """The messages of one read from ``conn``, in order, with one clock reading for
        when the driver saw them (they were read together): a task worker's here, an
        actor's by its manager (``ActorManager.on_messages``). In a batch nearly every
        message is a DONE."""
        seen = time.monotonic()
        if conn.actor is None:
            self._on_task_messages(conn, messages, seen)
        else:
            self.actors.on_messages(conn, messages, seen)
        self.log.tally_now()  # the watcher's tally of the records just ended, still warm

    def _on_task_messages(self, conn: WorkerConn, messages: list[tuple[Any, ...]],
                          seen: float) -> None:
        """A task worker's messages of one read, in order. The DONE of a plain task
        that returned its value (nearly every message of a batch) ends in
        ``_end_plain``, its record logged with the others of the read; any other
        message, and every DONE while GPUs are held or ``ends_followed`` (which only the
        general way can change), goes the general way (``_on_done``, ``_handle``), the
        records ended so far logged first so that the log keeps the order they ended in."""
        slot = conn.slot
        tasks = self.tasks
        finish = self.scheduler.finish
        ended: list[TaskRecord] = []
        followed = self.gpus.held or self.ends_followed()  # (only the general way changes it)
        for message in messages:
            if message[0] == DONE and not followed:
                task = tasks.get(message[1])
                outcome = message[2]
                if (task is not None and task.plain and type(outcome) is bytes
                        and task.worker is slot and not task.cancelled):
                    record = task.record
                    try:
                        (_, _, _, record.started, record.args_loaded, record.finished,
                         record.stored, record.cpu_time) = message
                    except ValueError:  # a DONE with its memory read (protocol.py)
                        (_, _, _, record.started, record.args_loaded, record.finished,
                         record.stored, record.cpu_time,
                         record.rss_peak, record.rss_change) = message
                    finish(slot, task, record.finished - record.args_loaded)
                    ended.append(self._end_plain(task, outcome, seen))
                    continue
            if ended:
                self.log.finish_tasks(ended)
                ended = []
            if message[0] == DONE:
                self._on_done(conn, message, seen)
            else:
                self._handle(conn, message)
            followed = self.gpus.held or self.ends_followed()
        if ended:
            self.log.finish_tasks(ended)

    def ends_followed(self) -> bool:
        """Whether something follows tasks' ends one by one (a cancelled parent's
        children, a stream, a task listener): while nothing does, a plain task or call
        that returned its value ends in ``_end_plain``."""
        return bool(self.streams.streams or self.task_table.followed())

    def _end_plain(self, task: TaskSpec, data: bytes, seen: float) -> TaskRecord:
        """End plain ``task`` (a task or an actor call) that returned ``data``, its
        value's bytes, read at ``seen``, as ``store_bare`` and ``_end_task`` would
        while nothing follows ends (``ends_followed``); return its record, which the
        caller logs with the others of its read (``EventLog.finish_tasks``): ~100
        bytecodes a task less than the general way."""
        record = task.record
        record.seen = seen
        record.result_size = len(data)
        objects = self.objects
        entry = objects.entries.get(task.return_ids[0])
        if entry is not None and entry.state == PENDING:  # (else nobody holds it)
            for waiter in objects.resolve(entry, data, None, seen):
                waiter(entry)
        self.task_table.end_plain(task)
        return record

    def _on_done(self, conn: WorkerConn, done: tuple[Any, ...], seen: float) -> None:
        """A task's DONE (``protocol.py``: its outcome and its worker's times), read by
        the driver at ``seen``."""
        task = self.tasks.get(done[1])
        if task is None or task.worker is not conn.slot:
            return
        if conn.waits:  # a nested get/wait it left unanswered (cancelled in it)
            self._end_abandoned_waits(conn)
        outcome = done[2]
        record = task.record
        p.fill_done(record, done)
        self.scheduler.finish(conn.slot, task, record.finished - record.args_loaded)
        if self.gpus.held:  # (_release_gpus, without a call per task)
            self.gpus.release(task.task_id)
            self.scheduler.update_may_queue()  # a GPU worker may be idle now
        record.seen = seen
        if task.cancelled and (type(outcome) is bytes or type(outcome) is list) \
                and not self._returns_failed(task):
            # It caught the cancel's KeyboardInterrupt and returned anyway, or finished
            # before the cancel reached it: its results stand, as Ray's do.
            self.store_results(task, outcome)
            self._end_task(task, FINISHED)
        elif task.cancelled:
            if type(outcome) is list:  # its returns were failed when it was cancelled
                self.release_unread(outcome)
            elif type(outcome) is tuple and outcome[0] == "raised":
                self.release_unread(outcome[2])
            self._fail_task(task, interrupted_error(task) if outcome == "cancelled"
                            else cancelled_error(task, "before it finished"))
        elif type(outcome) is bytes or type(outcome) is list:  # its results: the common case
            self.store_results(task, outcome)
            self._end_task(task, FINISHED)
        elif outcome == "cancelled":  # a cancel signal meant for the task before this one
            self._requeue(task)
        elif outcome[0] == "lost":  # an argument's segment vanished: rebuild it, then rerun
            self.recover_lost_argument(task, outcome[1])
        elif outcome[0] == "error":
            if self._should_retry_error(task, outcome[1]):
                record.retries += ((record.seen, "exception"),)
                task.attempt += 1
                self._requeue_after_delay(task)
            else:
                self._fail_task(task, outcome[1])
        elif outcome[0] == "raised":  # a generator raised before it filled its returns
            if self._should_retry_error(task, outcome[1]):
                self.release_unread(outcome[2])  # a retry's items are all the retry's
                record.retries += ((record.seen, "exception"),)
                task.attempt += 1
                self._requeue_after_delay(task)
            else:
                self.store_partial(task, outcome[2], outcome[1])
        else:  # a runtime bug: fail loudly (the I/O loop stops the runtime, saying why)
            raise AssertionError(f"task {task.name} ended with an unknown outcome {outcome!r}")

    def _returns_failed(self, task: TaskSpec) -> bool:
        """Whether a cancel already failed ``task``'s objects (it was queued on its
        worker behind another call when the cancel came)."""
        entry = self.objects.entries.get(task.return_ids[0]) if task.return_ids else None
        return entry is not None and entry.state != PENDING

    def store_results(self, task: TaskSpec, results: list[Stored | bytes] | bytes) -> None:
        """Resolve a finished task's return objects (dropping those nobody holds) with
        the values of its DONE: a list of them (each a ``Stored`` or bare:
        ``serialization.bare``; none for num_returns=0), or one scalar's bytes alone."""
        if type(results) is bytes:  # the common value, in short (protocol.py)
            if task.plain:
                self.store_bare(task, results)
                return
            results = [results]
        elif task.plain and type(results[0]) is bytes:
            self.store_bare(task, results[0])
            return
        entries = self.objects.entries
        for object_id, item in zip(task.return_ids, results):
            # (a list here: mypy narrows only the bytes branch of the type() test above)
            stored = unbare(item)  # type: ignore[arg-type]
            task.record.result_size += stored.size
            entry = entries.get(object_id)
            if entry is None or entry.state != PENDING:
                # Every ref to it was dropped while the task ran, or it is a result that
                # was intact when the task re-ran to rebuild another (lineage.py).
                if stored.path is not None and (entry is None or entry.path != stored.path):
                    self.store.release(stored.path)
                continue
            if stored.path is not None:  # an inline value lives in this table: never lost
                entry.lineage = task if keeps_lineage(task) else None
            if stored.contained and self.advisor is not None:
                self.note_returned_refs(task, stored)
            self._resolve(entry, stored)

    def note_blocking_call(self, conn: WorkerConn, kind: str, ids: list[int],
                           context: Any) -> None:
        """For the advisor (lock held): a blocking get/wait on an async actor's event
        loop, or a task's get of refs that came to it inside a container argument
        (Ray's "calling get on task arguments"): ``advice_events``."""
        callsite = context[2] if context else None
        if context and context[0]:  # on the actor's event loop: every coroutine waits
            actor = conn.actor
            # Named only when it holds up the actor's other calls (running or queued):
            # a loop with nothing else to run loses nothing.
            others = len(getattr(actor, "inflight", ())) - 1 + len(getattr(actor, "queue", ()))
            if others > 0:
                self.advice_events.append((
                    "loop-blocked", kind, getattr(actor, "class_name", "?"), context[1],
                    callsite, others))
            return
        if conn.actor is None and conn.slot.inflight:
            task = conn.slot.inflight[0]
            contained = task.args.contained
            if contained and set(ids) <= set(contained):
                self.advice_events.append(
                    ("nested-arg-get", kind, task.record, len(ids), callsite))

    def note_returned_refs(self, task: TaskSpec, stored: Stored) -> None:
        """For the advisor (lock held): a task's result holding refs to values its own
        call put (Ray's "returning ray.put() ObjectRefs"); a num_returns="dynamic"
        generator's refs are lightwork's own way of returning, not this."""
        record = task.record
        entries = self.objects.entries
        put = [inner for inner in (entries.get(i) for i in stored.contained)
               if inner is not None and inner.task_id == 0 and inner.owner == record.worker_id
               and inner.created_at >= record.dispatched]
        if put and b"DynamicObjectRefGenerator" not in stored.data:
            self.advice_events.append(("returned-put", len(put), record))

    def store_partial(self, task: TaskSpec, values: list[Stored | bytes], error: Stored) -> None:
        """End a generator task that raised ``error`` before it filled its returns
        (``generators.GeneratorRaised``) and is not retried: ``values`` resolve its first
        returns, ``error`` the others; with none left over (a dynamic generator's one
        value, its refs with the error last) the task succeeded, as in Ray."""
        if values:
            self.store_results(task, values)
        if len(values) < len(task.return_ids):
            self._fail_task(task, error)  # (the returns resolved above stay as they are)
        else:
            self._end_task(task, FINISHED)

    def store_bare(self, task: TaskSpec, data: bytes) -> None:
        """Resolve the one return object of plain ``task`` with its bare value ``data``."""
        task.record.result_size = len(data)
        entry = self.objects.entries.get(task.return_ids[0])
        if entry is not None and entry.state == PENDING:  # (else nobody holds it)
            # Kept bare (objects.py); ready when the driver read it: one clock reading
            for waiter in self.objects.resolve(entry, data, None, task.record.seen):
                waiter(entry)

    def release_unread(self, results: list[Stored | bytes]) -> None:
        """A DONE's values that nobody will read (its task was cancelled meanwhile): the
        store takes their segments back."""
        for stored in results:
            if type(stored) is Stored and stored.path is not None:
                self.store.release(stored.path)

    def _should_retry_error(self, task: TaskSpec, error: Stored) -> bool:
        retry = task.retry_exceptions
        if not retry or not (task.max_retries < 0 or task.attempt < task.max_retries):
            return False
        if retry is True:
            return True
        try:
            cause = serialization.loads(error).cause
        except Exception:
            return False
        classes = retry_classes(retry)  # (a nested task's come packed)
        if isinstance(cause, exceptions.UnserializableException):
            # It could not travel as itself: match its class hierarchy by name.
            return cause.is_instance_of_any(classes)
        return isinstance(cause, classes)

    def _requeue_after_delay(self, task: TaskSpec) -> None:
        """Retry ``task`` for one of its ``retry_exceptions`` after ``retry_delay_s``, as
        Ray waits between retries: what failed (a service, a file) gets time to recover.
        The task waits meanwhile, so a ``cancel()`` then fails it at once."""
        delay = self.retry_delay_s
        if delay <= 0:
            self._requeue(task)
            return
        task.state = WAITING

        def retry() -> None:
            if task.task_id in self.tasks and not task.cancelled:
                self._requeue(task)

        self.io.add_timer(delay, retry)

    def _requeue(self, task: TaskSpec) -> None:
        task.record.dispatched = 0.0
        self._release_gpus(task.task_id)  # it was queued on a worker: its GPU ids go back
        self.scheduler.make_ready(task, front=True)

    def _on_worker_submit(self, conn: WorkerConn, message: tuple[Any, ...]) -> None:
        (_, task_id, key, name, args, deps, return_ids, shape, max_retries, retry, actor_id,
         parent) = message
        if args.path is not None:  # written into room the store reserved for this worker:
            self.store.track(args.path, args.size, 0)  # the call's now, even if it dies
        now = time.monotonic()
        record = TaskRecord(task_id, name, conn.worker_id, now, arg_size=args.size,
                            deps_ready=0.0 if deps else now)  # (see register_task)
        keep_out_of_collector(record)
        task = TaskSpec(task_id, key, name, args, deps, return_ids, len(return_ids), shape,
                        max_retries, retry, conn.worker_id, record, actor_id, parent)
        for object_id in return_ids:
            self.objects.create(object_id, conn.worker_id, task_id, record.submitted)
            conn.holds.add(object_id)
            conn.owned.add(object_id)
        try:
            if actor_id:
                self.actors.check_room(actor_id)
            self.register_task(task, args.contained, record.submitted)
        except (exceptions.ObjectLostError, exceptions.PendingCallsLimitExceeded) as exc:
            self._fail_task(task, exc)
            return
        if shape not in self._feasible_shapes and not actor_id:
            problem = self.scheduler.check_feasible(shape)
            if problem:  # never run; its worker warned the user (WorkerCalls.submit_task)
                if task.state == TASK_READY:
                    self.scheduler.remove_ready(task)
                self._fail_task(task, unschedulable_error("task", name, problem))
                return
            self._feasible_shapes.add(shape)
        if actor_id:
            self.actors.add_call(actor_id, task)
            if self.task_table.parent_cancelled(parent):
                self.actors.cancel_call(task, False)  # as below, for an actor call
        elif self.task_table.parent_cancelled(parent):
            # Its parent was cancelled (recursive) while this submission was on its way.
            self._cancel_task(task, False)

    def _on_worker_call(self, conn: WorkerConn, request_id: int, what: str, args: tuple) -> None:
        """A worker asks the driver to do something only the driver can (actor registry)."""
        try:
            if what == "create_actor":
                actor = args[0]
                actor.owner = conn.worker_id
                result: Any = self.actors.create(actor)  # why it can never run, or None
                conn.holds.add(actor.actor_id)
                conn.owned.add(actor.actor_id)
            elif what == "get_actor":
                found = self.actors.lookup_name(args[0], args[1])
                result = None if found is None else (found.actor_id, found.class_name, found.methods)
            elif what == "task_id_of":
                result = self.lookup(args[0]).task_id
            elif what == "kill":
                self.actors.kill(args[0], args[1])
                result = None
            elif what == "cancel":  # with force (actors.py refuses it for an actor's call)
                self._cancel_ids(args[0], args[1], args[2])
                result = None
            elif what == "placement_group":
                result = self.placement_group_request(*args)
            elif what == "stream":
                result = self.streams.request(*args)
            elif what == "resources":  # a task's available_resources(): the node's now
                result = self._resources_x()
            elif what == "room":
                self._on_room_request(conn, request_id, *args)
                return
            elif what == "actor_exiting":  # exit_actor() (Worker.leave)
                self.actors.on_exiting(conn.actor)
                result = None
            elif what == "unreserve":
                self.store.release(args[0])
                result = None
            else:
                raise ValueError(f"unknown request {what!r}")
            self._reply(conn, request_id, ("ok", result))
        except Exception as exc:  # noqa: BLE001 - the caller re-raises it
            self._reply(conn, request_id, ("err", exc))

    def _on_room_request(self, conn: WorkerConn, request_id: int, size: int, path: str) -> None:
        """A worker asks for room to write ``size`` bytes (``store.reserve``). Room that is
        there (or a pooled segment) is granted at once; room the spiller must make first
        is waited for on a short-lived thread, so the I/O loop never blocks on it."""
        try:
            granted = self.store.reserve(size, path, conn.worker_id, wait=False)
        except exceptions.ObjectStoreFullError as exc:
            self._reply(conn, request_id, ("err", exc))
            return
        if granted is not None:
            self._reply(conn, request_id, ("ok", granted))
            return

        def wait_for_room() -> None:
            try:
                reply: Any = ("ok", self.store.reserve_new(size, path, conn.worker_id))
            except Exception as exc:  # noqa: BLE001 - the worker raises it in its task
                reply = ("err", exc)
            with self.lock:
                if conn.dead and reply[0] == "ok":  # died waiting: nobody will write it
                    self.store.release(reply[1][0])
                self._reply(conn, request_id, reply)

        threading.Thread(target=wait_for_room, name="lightwork-room", daemon=True).start()

    def _reply(self, conn: WorkerConn, request_id: int, payload: Any) -> None:
        self._send(conn, [(p.REPLY, request_id, payload)])

    def _payload(self, object_id: int) -> tuple[str, Any]:
        entry = self.objects.entries.get(object_id)
        if entry is None:
            try:
                self.lookup(object_id)
            except exceptions.ObjectLostError as exc:
                return ("err", exc)
        assert entry is not None
        if entry.state == READY:
            return ("ok", entry.serialized)  # (a Stored or bare bytes: loads takes either)
        return ("err", entry.error)

    def _on_worker_get(self, conn: WorkerConn, request_id: int, ids: list[int], timeout: Any,
                       context: Any = None) -> None:
        for object_id in ids:
            entry = self.objects.entries.get(object_id)
            path = entry.path if entry is not None else None
            # The driver's own mapping does not help a worker: it opens the file by name.
            if path is not None and not file_exists(path, self.store):
                assert entry is not None
                self.recover_lost(entry)
        pending = [e for e in (self.objects.entries.get(i) for i in ids) if e is not None and e.state == PENDING]
        if not pending:
            self._reply(conn, request_id, [self._payload(i) for i in ids])
            return
        if self.advisor is not None:  # (only a get that blocks: a round trip anyway)
            self.note_blocking_call(conn, "get", ids, context)
        actor = conn.actor
        if actor is not None and context is not None:
            deadlock = self.actors.start_wait(actor, (conn.worker_id, request_id), pending,
                                              timeout, context)
            if deadlock:
                self._reply(conn, request_id, ("deadlock", deadlock))
                return
        self._run_first(pending)
        state = self._lend_cpu(conn, request_id, "get")

        def finish(timed_out: bool) -> None:
            if state["done"]:
                return
            state["done"] = True
            if actor is not None:
                actor.waits.pop((conn.worker_id, request_id), None)
            self._stop_lending(conn, request_id, state)
            payload = "timeout" if timed_out else [self._payload(i) for i in ids]
            self._reply(conn, request_id, payload)

        countdown = _CallbackCountdown(len(pending), lambda: finish(False))
        for entry in pending:
            entry.add_waiter(countdown.hit)
        if timeout is not None:
            self.io.add_timer(timeout, lambda: finish(True))

    def _on_worker_wait(self, conn: WorkerConn, request_id: int, ids: list[int],
                        num_returns: int, timeout: Any, context: Any = None) -> None:
        def ready_ids() -> list[int]:
            out = []
            for object_id in ids:
                entry = self.objects.entries.get(object_id)
                if entry is None or entry.state != PENDING:
                    out.append(object_id)
            return out

        ready = ready_ids()
        if len(ready) >= num_returns or timeout == 0:
            self._reply(conn, request_id, ready[:num_returns])
            return
        if self.advisor is not None:
            self.note_blocking_call(conn, "wait", ids, context)
        actor = conn.actor
        pending = [e for e in (self.objects.entries.get(i) for i in ids)
                   if e is not None and e.state == PENDING]
        if actor is not None and context is not None:  # as for get: can it ever return?
            deadlock = self.actors.start_wait(actor, (conn.worker_id, request_id), pending,
                                              timeout, context, need=num_returns - len(ready))
            if deadlock:
                self._reply(conn, request_id, ("deadlock", deadlock))
                return
        self._run_first(pending)
        state = self._lend_cpu(conn, request_id, "wait")

        def finish() -> None:
            if state["done"]:
                return
            state["done"] = True
            if actor is not None:
                actor.waits.pop((conn.worker_id, request_id), None)
            self._stop_lending(conn, request_id, state)
            self._reply(conn, request_id, ready_ids()[:num_returns])

        countdown = _CallbackCountdown(num_returns - len(ready), finish)
        for entry in pending:
            entry.add_waiter(countdown.hit)
        if timeout is not None:
            self.io.add_timer(timeout, finish)

    def _run_first(self, pending: list[ObjectEntry]) -> None:
        """A worker blocks for ``pending``: the queued tasks that make them run before
        tasks nobody waits for. Otherwise each blocked caller lends its CPU to the next
        caller in the queue, which blocks in turn on a new worker: a thousand callers
        of one nested call, or a recursion, would take a worker each."""
        tasks = self.tasks
        waited = []
        for entry in pending:
            task = tasks.get(entry.task_id) if entry.task_id else None
            if task is not None and not task.actor_id:
                waited.append(task)
        if waited:
            self.scheduler.run_first(waited)

    def _lend_cpu(self, conn: WorkerConn, request_id: int, call: str) -> dict[str, bool]:
        """The worker blocks in a nested ``call`` (get or wait): lend its CPU to the pool
        until it is answered (``_stop_lending``) or its task ends
        (``_end_abandoned_waits``)."""
        self.scheduler.block(conn.slot, call)
        state = {"done": False, "lending": True}
        conn.waits[request_id] = state
        return state

    def _stop_lending(self, conn: WorkerConn, request_id: int, state: dict[str, bool]) -> None:
        conn.waits.pop(request_id, None)
        if state["lending"]:
            state["lending"] = False
            if not conn.dead:
                self.scheduler.unblock(conn.slot)

    def _end_abandoned_waits(self, conn: WorkerConn) -> None:
        """A task worker's task ended while a nested get/wait of it was unanswered: the
        task left that call (cancelled by an interrupt in it, or its error unwound it),
        so the worker is no longer blocked and takes its CPU back before the task's end
        returns it. Left lending, the slot would stay blocked for good: the next task
        placed on it would lend nothing while it waits, and a task needing that CPU
        would never run. The call is still answered when its objects are ready (a thread
        the task left behind may be the one waiting); only the lending ends."""
        for request_id, state in list(conn.waits.items()):
            self._stop_lending(conn, request_id, state)


class _CallbackCountdown:
    __slots__ = ("remaining", "callback")

    def __init__(self, remaining: int, callback: Callable[[], None]) -> None:
        self.remaining = remaining
        self.callback = callback

    def hit(self, entry: ObjectEntry) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.callback()

