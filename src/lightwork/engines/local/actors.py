"""Actors on the driver: one worker process each, calls delivered in order.

An actor is named by the id of a small *handle object* in the object table. Every
``ActorHandle`` holds an ``ObjectRef`` to it, so the ordinary reference counting tells
when no handle remains anywhere (driver, tasks, other actors, inside stored objects);
pending calls pin it too. When the handle object is freed the actor's process is asked to
exit — unless the actor is detached, which the registry pins until ``kill``/``shutdown``.

States: PENDING (waiting for resources to be placed) -> STARTING (process forked,
``__init__`` sent) -> ALIVE -> DEAD, or ALIVE -> RESTARTING -> ALIVE when the process
died and ``max_restarts`` allows. ``kill`` wins in every state: the actor is DEAD at
once (its calls fail naming kill, its name is free) and its process gets SIGKILL, at
once or as soon as the fork server reports its pid (``WorkerConn.doomed``); news from a
doomed process is ignored. ``kill(no_restart=False)`` within ``max_restarts`` makes it
RESTARTING instead. Placement needs the actor's ``place`` resources free
(1 CPU by default) and holds its ``hold`` resources for its lifetime (none by default,
as in Ray).

At most ``max_pending_calls`` calls (queued plus running) are accepted at once; the
next one raises ``PendingCallsLimitExceeded`` in the caller (from a task or an actor it
becomes the call's result error). Calls wait in ``queue`` until their arguments are ready
and the actor is ALIVE; each caller's calls are sent in the order it made them, and a
call waiting for its arguments holds back only its own caller's later calls (``pump``),
as in Ray. Sent calls are in ``inflight``. A call
made while every slot is taken (``inflight`` holds ``slots`` calls) stays queued: the
node sends what queued meanwhile in one frame when it next reads one of the actor's
frames (``IOLoop.read_worker``), so a burst of calls costs one send per batch, as tasks
do, instead of one each (measured: see bench/HOTPATH.md, "Actor calls in batches").
When the process dies they are re-sent after a restart (up to ``max_task_retries``) or fail with
``ActorDiedError`` naming the cause.

``cancel()`` of a call (``cancel_call``), as Ray does for actor tasks: a call still in
``queue`` leaves it and fails with TaskCancelledError; a sent one is named in the actor
worker's cancel file and the worker gets SIGINT. The worker never interrupts a running
call of a sync or threaded actor (``get_runtime_context().is_canceled()`` turns True in
it), cancels a running coroutine of an async actor on its loop, and skips a sent call
that has not started. Whatever the call then returns, a cancelled call's ``get`` raises
TaskCancelledError; it is never retried after a restart. ``force=True`` raises ValueError.

A ``get`` or ``wait`` (without a timeout) inside a call that can never return — it awaits
calls that cannot start until it ends — raises ActorDeadlockError (``start_wait``); a
``wait`` counts only when its ``num_returns`` cannot be met without those calls.

Runs under the node's lock; the node routes frames from actor workers here.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions
from lightwork.kernel.calls import ActorSpec, unschedulable_error
from lightwork.engines.local import protocol as p
from lightwork.engines.local import preload
from lightwork.kernel import serialization
from lightwork.engines.local.memory_monitor import OOM_REASON
from lightwork.engines.local.scheduler import FINISHED, TaskSpec, WorkerSlot

if TYPE_CHECKING:
    from lightwork.engines.local.node import Node, WorkerConn

PENDING = "PENDING_CREATION"
STARTING = "STARTING"
ALIVE = "ALIVE"
RESTARTING = "RESTARTING"
DEAD = "DEAD"
ASYNC_DEFAULT_CONCURRENCY = 1000  # the worker's default for async actors
MAX_DEADLOCK_REPORTS = 100
#: The death cause of an actor ended by kill(), in Ray's words (which tests match).
KILLED = "it was killed by `ray.kill` (lightwork.kill())"


@dataclass(eq=False)
class Actor(ActorSpec):
    """An actor as the local engine tracks it: what creating it asked (``ActorSpec``)
    and its life here (its process, its calls, its restarts)."""

    state: str = PENDING
    conn: WorkerConn | None = None
    creation_task: int = 0
    queue: deque[TaskSpec] = field(default_factory=deque)
    # True once ``queue`` may hold calls of more than one caller (``pump``): only then can
    # a call go past a head that waits for its arguments.
    callers_mixed: bool = False
    inflight: dict[int, TaskSpec] = field(default_factory=dict)
    restarts: int = 0
    no_restart: bool = False
    death_cause: str = ""
    unschedulable: str = ""  # why it can never be placed ("" if it can)
    init_error: Any = None
    calls_done: int = 0
    started_at: float = field(default_factory=time.monotonic)
    waits: dict[tuple[int, int], Wait] = field(default_factory=dict)  # blocked gets
    gpu_ids: tuple[int, ...] = ()  # its GPUs while its process lives (gpus.py)
    # How many calls run at once: the thread pool of a threaded or async actor. Worked
    # out once (its options are fixed at creation): it is read several times a call.
    slots: int = field(init=False, default=1)

    def __post_init__(self) -> None:
        if self.async_methods:
            self.slots = self.max_concurrency or ASYNC_DEFAULT_CONCURRENCY
        else:
            self.slots = self.max_concurrency or 1


@dataclass(eq=False)
class Wait:
    """A ``get`` blocked inside one of an actor's calls, and the actor calls it awaits."""

    key: tuple[int, int]  # (worker id, request id)
    calls: list[TaskSpec]  # the pending actor calls among the awaited objects
    on_loop: bool  # made on an async actor's event loop: no coroutine runs until it ends
    method: str | None  # the call that made it (from the worker)
    callsite: Any
    # How many of ``calls`` may never run while it still returns: 0 for a get (it needs
    # every object), the pending objects beyond num_returns for a wait.
    slack: int = 0
    op: str = "get"


class ActorManager:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.actors: dict[int, Actor] = {}
        self.names: dict[tuple[str | None, str], int] = {}
        self.pending: deque[Actor] = deque()
        # Gets that could never return, answered with ActorDeadlockError: the state API
        # and the advisor read them (newest last).
        self.deadlocks: deque[dict[str, Any]] = deque(maxlen=MAX_DEADLOCK_REPORTS)

    # -- creation --------------------------------------------------------------------
    def create(self, spec: ActorSpec) -> str | None:
        """Register a new actor and place it if its resources are free. Returns why it
        can never be placed, if it cannot: it is then dead from birth, and each of its
        calls fails with ActorUnschedulableError (the caller warns the user)."""
        actor = Actor(**spec.fields())
        node = self.node
        if actor.namespace is None:
            actor.namespace = node.namespace
        problem = node.scheduler.check_feasible(actor.place) or node.scheduler.check_feasible(actor.hold)
        if actor.name is not None:
            key = (actor.namespace, actor.name)
            if key in self.names and self.actors[self.names[key]].state != DEAD:
                raise ValueError(
                    f"an actor named {actor.name!r} already exists in namespace "
                    f"{actor.namespace!r}; pick another name, or use get_if_exists=True"
                )
        entries = [node.lookup(object_id) for object_id in actor.deps]
        for object_id in actor.args.contained:  # a ref inside an argument, from an ended session
            if object_id not in node.objects.entries and node.id_floor.minted_before(object_id):
                raise node.ended_session_error(object_id)
        entry = node.objects.create(actor.actor_id, actor.owner)
        node.objects.add_actor_handle(entry)
        node.objects.resolve(entry, serialization.serialize(None, None))
        if actor.detached:
            entry.task_uses += 1  # the registry keeps a detached actor alive
        for dep in entries:
            dep.task_uses += 1  # until the constructor has run
        self.actors[actor.actor_id] = actor
        if actor.name is not None:
            self.names[(actor.namespace, actor.name)] = actor.actor_id
        if problem:
            actor.unschedulable = problem
            actor.no_restart = True
            self._die(actor, f"it can never be scheduled: {problem}")
            return problem
        self.pending.append(actor)
        self.place_pending()
        return None

    def place_pending(self) -> None:
        """Start the actors whose resources are free, in creation order."""
        scheduler = self.node.scheduler
        waiting: deque[Actor] = deque()
        while self.pending:
            actor = self.pending.popleft()
            if actor.state == DEAD:
                continue
            ready = all(
                self.node.objects.entries[d].state != 0 for d in actor.deps
                if d in self.node.objects.entries
            )
            if ready and scheduler._fits(actor.place) and scheduler._fits(actor.hold):
                scheduler._acquire(actor.hold)
                self._start(actor)
            else:
                waiting.append(actor)
        self.pending = waiting

    def _start(self, actor: Actor) -> None:
        node = self.node
        conn = node.pool.start(pooled=False, work=lambda: preload.actor_pickles(node, actor))
        conn.actor = actor
        actor.conn = conn
        actor.state = STARTING if actor.state == PENDING else RESTARTING
        actor.creation_task = node.next_object_id()
        dep_values = []
        for object_id in actor.deps:
            dep = node.objects.entries.get(object_id)
            if dep is None or dep.state != 1:  # a dependency failed or vanished
                self._die(actor, f"an argument of its constructor failed: {_describe(dep)}")
                return
            dep_values.append(dep.stored)
        messages: list[tuple[Any, ...]] = []
        if actor.class_key not in conn.functions:
            conn.functions.add(actor.class_key)
            messages.append((p.FUNCTION, actor.class_key, node.task_table.functions[actor.class_key]))
        actor.gpu_ids = node.gpus.assign(actor.actor_id, actor.hold) if node.gpus.any else ()
        messages.append((p.ACTOR_INIT, (
            actor.creation_task, actor.class_key, actor.class_name, actor.args, dep_values,
            actor.actor_id, actor.name, actor.max_concurrency, actor.gpu_ids, actor.place,
        )))
        node._send(conn, messages)

    # -- calls -----------------------------------------------------------------------
    def check_room(self, actor_id: int) -> None:
        """Refuse a new call while ``max_pending_calls`` calls are queued or running."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.max_pending_calls < 0:
            return
        pending = len(actor.queue) + len(actor.inflight)
        if pending >= actor.max_pending_calls:
            raise exceptions.PendingCallsLimitExceeded(
                f"actor {actor.class_name} (id {actor.actor_id:020x}) already has {pending} "
                f"pending calls, its max_pending_calls={actor.max_pending_calls}: this call "
                "was refused. Wait for some results (get or wait) before calling again, or "
                "raise max_pending_calls with .options().")

    def add_call(self, actor_id: int, task: TaskSpec) -> None:
        actor = self.actors.get(actor_id)
        if actor is None and self.node.id_floor.minted_before(actor_id):
            self.node._fail_task(task, self.node.ended_session_error(actor_id, actor=True))
            return
        if actor is None or actor.state == DEAD:
            self.node._fail_task(task, self._died_error(actor, task.name))
            return
        queue = actor.queue
        if queue and not actor.callers_mixed and queue[0].owner != task.owner:
            actor.callers_mixed = True
        queue.append(task)
        self.node.lookup(actor_id).task_uses += 1  # a pending call keeps the actor alive
        if len(actor.inflight) < actor.slots:
            self.pump(actor)
        # else: every slot is taken; the call waits here and goes with the others queued
        # meanwhile, in one frame, when the actor's next frame is read (IOLoop.read_worker).

    def pump(self, actor: Actor) -> None:
        """Send the queued calls whose arguments are ready, in order for each caller.

        As in Ray, calls are ordered per caller (the process that made them, the task's
        ``owner``), not across callers: a call waiting for its arguments holds back the
        later calls of its own caller only. The head goes first; only when it waits and
        other callers' calls are queued is the rest of the queue scanned.
        """
        if actor.state != ALIVE or actor.conn is None or actor.conn.doomed:
            return
        node = self.node
        batch: list[tuple[Any, ...]] = []
        now = time.monotonic()
        queue = actor.queue
        while queue:
            task = queue[0]
            if task.state == "FAILED":  # an argument failed: the call already has its error
                queue.popleft()
                node._unuse(task.actor_id)
                continue
            if task.unready:
                if actor.callers_mixed:
                    self._pass_waiting_callers(actor, batch, now)
                break
            queue.popleft()
            batch.append(self._sent(actor, task, now))
        if batch:
            node._send(actor.conn, batch)

    def _pass_waiting_callers(self, actor: Actor, batch: list[tuple[Any, ...]],
                              now: float) -> None:
        """Send the ready calls of the callers that have no earlier call still waiting
        for its arguments; the rest stay queued in their order."""
        held: set[int] = set()  # the callers with a waiting call
        kept: deque[TaskSpec] = deque()
        for task in actor.queue:
            if task.state == "FAILED":
                self.node._unuse(task.actor_id)
            elif task.unready or task.owner in held:
                held.add(task.owner)
                kept.append(task)
            else:
                batch.append(self._sent(actor, task, now))
        actor.queue = kept
        actor.callers_mixed = len(held) > 1

    def _sent(self, actor: Actor, task: TaskSpec, now: float) -> tuple[Any, ...]:
        """The frame that sends one call to its actor, the call now in flight there."""
        assert actor.conn is not None
        task.state = "SUBMITTED_TO_WORKER"
        record = task.record
        record.dispatched = now
        record.worker_id = actor.conn.worker_id
        record.attempt = task.attempt
        record.state = task.state
        dep_values = ([self.node.objects.entries[d].stored for d in task.deps] if task.deps
                      else ())
        actor.inflight[task.task_id] = task
        return (p.TASK, (
            task.task_id, task.function_key, task.name, serialization.bare(task.args),
            dep_values, task.return_ids, task.shape, actor.gpu_ids,
        ))

    def cancel_call(self, task: TaskSpec, force: bool) -> None:
        """``cancel()`` of an actor's call, with Ray's semantics for actor tasks.

        Queued here (the actor is starting, or earlier calls or arguments are not done):
        the call leaves the queue and fails now. Sent to the actor: its id goes to the
        actor's cancel file, then SIGINT (``WorkerPool.interrupt``). The worker never
        interrupts a running call of a sync or threaded actor (its state could be left
        half-changed): ``get_runtime_context().is_canceled()`` turns True in it, and its
        ``get`` raises TaskCancelledError once it returns. A coroutine of an async actor
        gets ``asyncio.CancelledError``. A call queued in the actor behind its running
        ones (past its slots) fails now and never starts. ``force=True`` raises
        ValueError, as in Ray: killing the process would end the actor (use ``kill``).
        """
        if force:
            raise self.force_refused(task)
        actor = self.actors.get(task.actor_id)
        if task.cancelled or actor is None:
            return
        task.cancelled = True
        node = self.node
        if task in actor.queue:  # not sent yet (a scan: cancels are rare)
            actor.queue.remove(task)
            if task.state != "FAILED":
                node._fail_task(task, _cancelled_call(task, "before it ran"))
            node._unuse(task.actor_id)
            self.pump(actor)  # the calls behind it may go now
            return
        if task.task_id in actor.inflight and actor.conn is not None:
            if list(actor.inflight).index(task.task_id) >= actor.slots:
                node._fail_returns(task, _cancelled_call(task, "before it ran"))
            node.pool.interrupt(actor.conn, task.task_id, False)

    def force_refused(self, task: TaskSpec) -> ValueError:
        return ValueError(
            f"force=True is not supported for actor tasks: cancel({task.name}) would "
            "have to kill the actor's process, and with it the actor. Call cancel() "
            "without force (a sync method can check "
            "get_runtime_context().is_canceled()), or kill(actor) to end the actor.")

    def on_messages(self, conn: WorkerConn, messages: list[tuple[Any, ...]],
                    seen: float) -> None:
        """An actor's worker's messages of one read, in order. The DONE of a plain
        call that returned its value (nearly every message while calls stream in) ends
        in ``Node._end_plain``, its record logged with the others of the read and its
        hold on the actor's handle let go with theirs; any other message, and every
        DONE while the node's ``ends_followed`` (which only the general way can change),
        goes the general way (``on_done``, ``Node._handle``), what ended so far
        accounted for first, in order."""
        actor = conn.actor
        node = self.node
        inflight = actor.inflight
        ended: list[Any] = []
        followed = node.ends_followed()  # (only the general way changes it)
        for message in messages:
            if message[0] == p.DONE and not followed and not conn.doomed and actor.state != DEAD:
                task = inflight.get(message[1])
                outcome = message[2]
                if (task is not None and task.plain and type(outcome) is bytes
                        and not task.cancelled and task.function_key != "__ray_terminate__"):
                    del inflight[message[1]]
                    record = task.record
                    try:
                        (_, _, _, record.started, record.args_loaded, record.finished,
                         record.stored, record.cpu_time) = message
                    except ValueError:  # a DONE with its memory read (protocol.py)
                        (_, _, _, record.started, record.args_loaded, record.finished,
                         record.stored, record.cpu_time,
                         record.rss_peak, record.rss_change) = message
                    record.pid = conn.pid
                    ended.append(node._end_plain(task, outcome, seen))
                    continue
            if ended:
                self._account_ended(actor, ended)
                ended = []
            if message[0] == p.DONE:
                self.on_done(conn, message, seen)
            else:
                node._handle(conn, message)
            followed = node.ends_followed()
        if ended:
            self._account_ended(actor, ended)

    def _account_ended(self, actor: Actor, records: list[Any]) -> None:
        """Plain calls of ``actor`` ended (``on_messages``): count them, log their
        records, and let go of their holds on the actor's handle (``add_call``)."""
        actor.calls_done += len(records)
        self.node.log.finish_tasks(records)
        self.node._unuse(actor.actor_id, len(records))

    def on_done(self, conn: WorkerConn, done: tuple[Any, ...], seen: float) -> None:
        """A DONE from the actor's worker (``protocol.py``), read by the driver at
        ``seen``: its constructor's or one of its calls'."""
        task_id, outcome = done[1], done[2]
        actor = conn.actor
        node = self.node
        if conn.doomed or actor.state == DEAD:
            return  # killed: its calls are failed or retried when its process is gone
        if task_id == actor.creation_task:
            if outcome and outcome[0] == "exit":  # exit_actor() in the constructor
                actor.no_restart = True
                self._die(actor, f"{exceptions.USER_EXIT} while it was being created")
                node._send(conn, [(p.EXIT,)])  # its process ends gracefully (atexit)
                return
            if outcome:  # ("error", Stored): the constructor raised
                actor.init_error = outcome[1]
                actor.no_restart = True
                self._die(actor, "its constructor (__init__) raised:\n" + _traceback_of(outcome[1]))
                node._send(conn, [(p.EXIT,)])
                return
            actor.state = ALIVE
            self.pump(actor)
            return
        task = actor.inflight.pop(task_id, None)
        if task is None:
            return
        record = task.record
        p.fill_done(record, done)
        record.seen = seen
        record.pid = conn.pid
        actor.calls_done += 1
        if (type(outcome) is bytes or type(outcome) is list) and not task.cancelled:  # results
            self._store_call(actor, task, outcome)
            return
        exited = isinstance(outcome, tuple) and outcome[0] == "exit"
        if exited:
            actor.no_restart = True
            actor.death_cause = exceptions.USER_EXIT
        raised = isinstance(outcome, tuple) and outcome[0] == "raised"
        if task.cancelled or outcome == "cancelled":
            if type(outcome) is list:  # it returned after the cancel: nobody reads these
                node.release_unread(outcome)
            elif raised:
                node.release_unread(outcome[2])
            self._finish_call(task, error=_cancelled_call(
                task, "before it ran" if outcome == "cancelled" else "while it ran", actor))
            return
        if exited:
            self._finish_call(task, error=exceptions.exit_actor_called(actor.class_name,
                                                                       task.name))
            return
        if isinstance(outcome, tuple) and outcome[0] == "error":
            self._finish_call(task, error=outcome[1])
            return
        if raised:  # a generator method raised before it filled its returns
            node.store_partial(task, outcome[2], outcome[1])
            node._unuse(task.actor_id)
            return
        if isinstance(outcome, tuple) and outcome[0] == "lost":
            # Re-sending the call after a rebuild would reorder it behind later calls.
            self._finish_call(task, error=exceptions.ObjectLostError(
                f"{task.task_id:020x}",
                f"an argument of actor call {task.name} vanished from shared memory "
                f"({outcome[1]}) before the call could read it; actor calls are not re-run "
                "to rebuild arguments. Keep /dev/shm intact while lightwork runs."))
            return
        self._store_call(actor, task, outcome)

    def on_exiting(self, actor: Actor | None) -> None:
        """The actor's process said it ends on ``exit_actor()`` (from an asyncio task or
        a thread of the actor's, no call may say so): no restart, and its calls fail
        naming the cause when the process is gone."""
        if actor is None or actor.state == DEAD:
            return
        actor.no_restart = True
        if not actor.death_cause:
            actor.death_cause = exceptions.USER_EXIT

    def _store_call(self, actor: Actor, task: TaskSpec, results: list[Any] | bytes) -> None:
        """A call returned ``results``: they resolve its return objects, and it ends."""
        if task.function_key == "__ray_terminate__":
            actor.no_restart = True
            actor.death_cause = "it was terminated with __ray_terminate__"
        self.node.store_results(task, results)
        self._finish_call(task)

    def _finish_call(self, task: TaskSpec, error: Any = None) -> None:
        node = self.node
        if error is not None:
            node._fail_task(task, error)
        else:
            node._end_task(task, FINISHED)
        node._unuse(task.actor_id)

    # -- gets that can never return ----------------------------------------------------
    def start_wait(self, actor: Actor, key: tuple[int, int], pending: list[Any],
                   timeout: Any, context: tuple[bool, str | None, Any],
                   need: int | None = None) -> str | None:
        """Record a get blocked in one of ``actor``'s calls; say why it deadlocks, if so.

        ``need`` (a ``wait``): how many of the ``pending`` objects it needs; it can never
        return when more of the awaited actor calls can never run than it can spare.

        The get can never return when one of the calls it awaits can never run: that
        call's actor has no slot free for it (its slots, or for a coroutine its event
        loop, are all held by blocked gets) and each of those gets can itself never return.
        This get counts as one that cannot (the check is coinductive), so a method of a
        ``max_concurrency=1`` actor getting its own call, an async method blocking its
        loop on a coroutine of its own actor, and cycles through other actors (A waits for
        B which waits for A) are found, while a threaded or async actor with a slot free
        for the awaited call is left to run. A get with a timeout is never a deadlock.
        """
        node = self.node
        calls = []
        for entry in pending:
            task = node.tasks.get(entry.task_id)
            if task is not None and task.actor_id:
                calls.append(task)
        on_loop, method, callsite = context
        wait = Wait(key, calls, on_loop, method, callsite)
        if need is not None:
            wait.slack, wait.op = len(pending) - need, "wait"
        if not calls or timeout is not None:
            return None  # it returns in time: not counted (its slot looks free, so no
            # deadlock is ever claimed because of it)
        actor.waits[key] = wait
        path = self._stuck(wait, set())
        if path is None:
            return None
        del actor.waits[key]
        return self._deadlock_message(actor, wait, path)

    def _stuck(self, wait: Wait, assumed: set[tuple[int, int]]) -> list[TaskSpec] | None:
        """The chain of calls that keeps ``wait`` from ever returning, or None."""
        if wait.key in assumed:
            return []
        assumed.add(wait.key)
        never = 0
        for call in wait.calls:
            target = self.actors.get(call.actor_id)
            if target is None or target.state == DEAD:
                continue  # the call fails: the get returns
            rest = self._never_runs(target, call.function_key, assumed)
            if rest is not None:
                never += 1
                if never > wait.slack:
                    return [call, *rest]
        assumed.discard(wait.key)
        return None

    def _never_runs(self, actor: Actor, method: Any, assumed: set[tuple[int, int]]) -> list[TaskSpec] | None:
        blocked = [w for w in actor.waits.values() if w.calls]
        if actor.async_methods:  # an async actor runs every method on its loop: held?
            blocked = [w for w in blocked if w.on_loop]
            if not blocked:
                return None
        elif len(blocked) < actor.slots:
            return None  # a slot is free, or held by work that is not waiting
        chain: list[TaskSpec] = []
        for wait in blocked:
            rest = self._stuck(wait, assumed)
            if rest is None:
                return None
            chain = chain or rest
        return chain

    def _deadlock_message(self, actor: Actor, wait: Wait, path: list[TaskSpec]) -> str:
        where = _format_site(wait.callsite)
        caller = wait.method or f"a method of {actor.class_name}"
        chain = " -> ".join(call.name for call in path)
        first = path[0]
        if first.actor_id == actor.actor_id and len(path) == 1:
            why = (f"{first.name} is a call on the same actor, and it cannot start until "
                   f"{caller} returns: " + (
                       "the get blocks the actor's event loop" if wait.on_loop else
                       f"every one of its {actor.slots} slot(s) is taken by a caller waiting"
                       if actor.slots > 1 else "the caller holds the actor's only slot "
                       "(max_concurrency=1)"))
        else:
            why = (f"it waits for {chain}, which waits, through the actors in between, for "
                   f"a call that cannot start until {caller} returns (a cycle of actors "
                   "waiting on each other)")
        self.deadlocks.append({
            "time": time.time(), "actor_id": actor.actor_id, "class_name": actor.class_name,
            "method": wait.method, "callsite": where, "waits_for": [c.name for c in path],
        })
        if wait.op == "wait":
            why += (" (wait() needs more of its objects than can come without "
                    f"{first.name})")
        return (
            f"{wait.op}() in {caller} (actor {actor.class_name}, id {actor.actor_id:020x}) at "
            f"{where} would wait forever: {why}. Fix: call the method directly "
            "(self.method(...)) instead of through the actor's handle, make the method async "
            "and `await` the ref, or raise max_concurrency so a slot is free for the awaited "
            "call" + (", or give wait() a timeout." if wait.op == "wait" else "."))

    # -- death -----------------------------------------------------------------------
    def on_worker_death(self, conn: WorkerConn, how: str) -> None:
        actor = conn.actor
        node = self.node
        node.scheduler._give_back(actor.hold)
        if node.gpus.held:
            node.gpus.release(actor.actor_id)
        actor.conn = None
        actor.waits.clear()
        if actor.state == DEAD:
            return
        if not actor.death_cause:
            actor.death_cause = f"its worker process has died (pid {conn.pid}): {how}"
        if not self._can_restart(actor):
            self._die(actor, actor.death_cause)
            return
        actor.restarts += 1
        retry = []
        for task in actor.inflight.values():
            if task.cancelled:  # a cancelled call is never retried (Ray)
                self._finish_call(task, _cancelled_call(task, "while it ran", actor))
            elif actor.max_task_retries < 0 or task.attempt < actor.max_task_retries:
                task.attempt += 1
                task.record.retries += ((time.monotonic(), f"actor restarted: {how}"),)
                retry.append(task)
            else:
                self._finish_call(task, self._died_error(actor, task.name))
        actor.inflight.clear()
        actor.queue.extendleft(reversed(retry))
        actor.callers_mixed = True  # (the retried calls' callers are not looked at)
        actor.death_cause = ""
        actor.state = RESTARTING
        self.pending.appendleft(actor)
        self.place_pending()

    def _die(self, actor: Actor, cause: str) -> None:
        actor.state = DEAD
        actor.death_cause = actor.death_cause or cause
        for task in list(actor.inflight.values()) + list(actor.queue):
            if task.state != "FAILED":
                self._finish_call(task, self._died_error(actor, task.name))
            else:
                self.node._unuse(task.actor_id)
        actor.inflight.clear()
        actor.queue.clear()
        for object_id in actor.deps:  # the constructor's arguments, kept for restarts
            self.node._unuse(object_id)
        actor.deps = ()
        if actor in self.pending:
            self.pending.remove(actor)
        if actor.name is not None and self.names.get((actor.namespace, actor.name)) == actor.actor_id:
            del self.names[(actor.namespace, actor.name)]
        entry = self.node.objects.entries.get(actor.actor_id)
        if actor.detached and entry is not None:
            actor.detached = False
            entry.task_uses -= 1
            self.node.objects.release_if_unheld(entry)

    def _died_error(self, actor: Actor | None, method: str) -> exceptions.ActorError:
        if actor is not None and actor.unschedulable:
            return unschedulable_error("actor", actor.class_name, actor.unschedulable)
        if actor is None:
            return exceptions.ActorDiedError(
                f"cannot call {method}: the actor is unknown to this runtime (it ended, or "
                "its handle came from another session)")
        what = f"actor {actor.class_name} (id {actor.actor_id:020x})"
        # The memory monitor's message (memory used, threshold, actor, policy) is the cause.
        error = (exceptions.ActorOutOfMemoryError if OOM_REASON in actor.death_cause
                 else exceptions.ActorDiedError)
        if actor.state != DEAD:  # its process died during this call; it is being restarted
            return error(
                f"{what} lost the call {method}: {actor.death_cause}. The actor is being "
                f"restarted (max_restarts={actor.max_restarts}), but calls that were running "
                f"are not retried (max_task_retries={actor.max_task_retries}); set "
                "max_task_retries (-1: no limit) if the call is safe to run twice.")
        # "The actor is dead because ...": Ray's words, which programs and tests match.
        return error(
            f"{what} cannot run {method}. The actor is dead because "
            f"{actor.death_cause or 'it ended'}. {_after_death_advice(actor)}")

    def kill(self, actor_id: int, no_restart: bool) -> None:
        """``kill()``: the actor ends now, whatever state it is in (Ray's semantics).

        With ``no_restart`` (the default), or when ``max_restarts`` is used up, the actor
        is DEAD at once: its queued and running calls fail naming ``kill``, later calls
        fail, its name is free, and its process (if any) gets SIGKILL. Otherwise its
        process is killed and it restarts as after a crash (RESTARTING at once, so no call
        is sent to the doomed process).
        """
        actor = self.actors.get(actor_id)
        if actor is None and self.node.id_floor.minted_before(actor_id):
            raise self.node.ended_session_error(actor_id, actor=True)
        if actor is None or actor.state == DEAD:
            return
        conn = actor.conn
        if no_restart or not self._can_restart(actor):
            actor.no_restart = True
            actor.death_cause = KILLED
            self._die(actor, actor.death_cause)
            if conn is not None:
                self._end_process(conn)
            return
        if conn is None:  # waiting for placement: no process to kill, a restart all the same
            actor.restarts += 1
            return
        actor.death_cause = KILLED + " with no_restart=False"
        actor.state = RESTARTING
        self._end_process(conn)

    def _end_process(self, conn: WorkerConn) -> None:
        """SIGKILL an actor's process now, or as soon as the fork server gives its pid."""
        self.node.pool.kill(conn)

    def _can_restart(self, actor: Actor) -> bool:
        return not actor.no_restart and (
            actor.max_restarts < 0 or actor.restarts < actor.max_restarts)

    def handle_freed(self, actor_id: int) -> None:
        """No handle to the actor remains anywhere: end its process."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.state == DEAD:
            return
        actor.no_restart = True
        actor.death_cause = "all handles to it went out of scope"
        if actor.name is not None and self.names.get((actor.namespace, actor.name)) == actor_id:
            del self.names[(actor.namespace, actor.name)]  # ending: no longer found by name
        if actor.conn is not None:
            self.node._send(actor.conn, [(p.EXIT,)])
        else:
            self._die(actor, actor.death_cause)

    def forget(self, actor: Actor) -> None:
        if actor.state == DEAD and actor.conn is None:
            self.actors.pop(actor.actor_id, None)

    def lookup_name(self, name: str, namespace: str | None) -> Actor | None:
        actor_id = self.names.get((namespace or self.node.namespace, name))
        actor = self.actors.get(actor_id) if actor_id is not None else None
        return actor if actor is not None and actor.state != DEAD else None

    def shutdown(self) -> None:
        for actor in self.actors.values():
            actor.state = DEAD


def _after_death_advice(actor: Actor) -> str:
    """What the user can do, given how the actor was configured and why it died."""
    if actor.no_restart:  # killed, exit_actor(), constructor failed, no handle left
        return "Calls made after an actor's death fail; create a new actor."
    if actor.max_restarts == 0:
        return ("Calls made after an actor's death fail; create a new actor, or set "
                "max_restarts (and max_task_retries) to have it restarted when its process dies.")
    return (f"It was restarted {actor.restarts} time(s), all that max_restarts="
            f"{actor.max_restarts} allows; find why its process keeps dying (its output is "
            "above), or raise max_restarts (-1: no limit).")


def _cancelled_call(task: TaskSpec, when: str, actor: Actor | None = None) -> exceptions.TaskCancelledError:
    what = f"actor call {task.name} was cancelled with cancel()"
    if when == "before it ran":
        return exceptions.TaskCancelledError(f"{what} before it ran")
    if actor is not None and task.function_key in actor.async_methods:
        return exceptions.TaskCancelledError(
            f"{what} while it ran: asyncio.CancelledError was raised in the coroutine")
    return exceptions.TaskCancelledError(
        f"{what} while it ran. A sync or threaded actor's method is not interrupted (as "
        "in Ray): it ran to its end and its result was dropped. To stop early, check "
        "lightwork.get_runtime_context().is_canceled() in the method")


def _format_site(site: Any) -> str:
    if isinstance(site, (tuple, list)) and len(site) == 3:
        return f"{site[0]}:{site[1]} in {site[2]}"
    return "(unknown call site)"


def _traceback_of(error: Any) -> str:
    try:
        loaded = serialization.loads(error) if isinstance(error, serialization.Stored) else error
    except Exception:
        return "(the error could not be loaded)"
    return getattr(loaded, "traceback_str", str(loaded))


def _describe(entry: Any) -> str:
    if entry is None:
        return "it was freed"
    error = entry.error
    if isinstance(error, serialization.Stored):
        return _traceback_of(error)
    return str(error)


__all__ = ["Actor", "ActorManager", "WorkerSlot"]
