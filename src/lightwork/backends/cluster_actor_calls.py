"""The caller's side of actors on the distributed backend: creation, calls, restarts.

The ``ActorCalls`` part of ``DistributedBackend`` (``cluster.py``); the actor's own side,
on a worker, is ``cluster_actors.py``, whose docstring has the design of a call.

Calls
-----
Each call is an :class:`ActorCall`: its message (kept until it is final, so it can be
sent again) and its ``outcome``, a ``concurrent.futures.Future`` resolved once with the
call's stored result(s). A call is sent as one ``actor_execute`` RPC to the actor's
worker, run on the client's (or, in a task, the worker's) event loop; the RPC's own
future resolves the outcome from a done callback. So ``get`` blocks on the outcome and
``wait`` counts outcomes with done callbacks, as for tasks: nothing polls. The refs of a
call map to :class:`ActorResult` entries in ``futures`` (``key`` None: the value lives
with its caller, not in the cluster).

``.remote()`` never waits for the engine: while the actor's key is pending (its
constructor runs, or no worker has room yet) calls queue (``_building``) and go, in
order, from the key's done callback (``_built``). Every other wait on the engine in this
module is bounded (``ENGINE_POLL_S`` at a time, looking again whether the session closed
or the actor was killed), so a lost worker or scheduler ends in an error, not a hang.

Restarts (the owner decides)
----------------------------
The process that created an actor owns it (``OwnedActor``): it alone counts restarts and
decides. When the worker holding an actor is lost, the scheduler marks the actor's key
*erred* (distributed never recomputes an actor behind our back). The owner learns it
from the scheduler's ``remove-worker`` event on that worker's topic (subscribed once the
actor is placed), or from a call whose RPC failed, whichever comes first. Then, with
restarts left (``max_restarts``, -1: forever), it asks the scheduler to ``retry`` the key:
the same ``ActorHost`` is built again on another worker, re-running the constructor. A
killed actor and one out of restarts stay dead; the owner cancels the key, so handles
elsewhere see it dead too.

While an actor restarts, new calls from its owner queue (``OwnedActor.queued``). A call
in flight when the worker died is sent again after the restart if ``max_task_retries``
allows (-1: always), otherwise it fails with ``ActorDiedError`` (Ray's semantics: the
call may have run partly). Once the actor is back, the calls lost in flight go first, in
the order they were made, then those queued meanwhile (``_flush``; calls made during the
flush join its queue, so none overtakes an older one). Calls in flight are
settled as soon as the loss is decided, not when their RPCs fail: an RPC sent to a worker
that had just died may wait out distributed's connect timeout (30 s); its late end is
ignored (``ActorCall.sends``). Sequence numbers (``_seqs``, per caller) start again at 0
for each incarnation of the actor, always (``_restarted``: a caller waiting on the same
future may hold the new proxy already, distributed batching concurrent gathers of a key).

Handles in other processes (passed to a task or another actor, or found by name) behave
the same, without deciding anything: their process follows the owner's decision through
the actor's key. The key carries the actor's ``(max_restarts, max_task_retries)`` as an
annotation, which such a process reads from the scheduler when it first meets a loss
(``_restart_policy``). It meets one as a call whose RPC failed, or as the key failed (the
scheduler plugin's message, ``cluster_plugin.TaskErrors``, drops its cached proxy,
``_actor_key_erred``). With restarts
allowed, its calls then wait (:class:`BorrowedRestart`) while one thread follows the
key's state: back in memory on another worker (restarted: the calls go, in order),
cancelled (killed, or out of restarts: they fail with ``ActorDiedError``), or still
failed after ``RESTART_WAIT_S`` (the owner is gone: they fail). Its calls in flight
(``_sent``) are settled when the key fails, as the owner's are when it decides: sent
again first under ``max_task_retries``, else failed — never left to an RPC that waits
out the connect timeout on the dead address. So that a handle elsewhere never
waits for a decision that cannot come, the owner watches every actor it creates and
gives up (cancels the key of) a lost one without restarts at once.

Named actors are published as scheduler datasets (``lightwork-actor/<namespace>/<name>``:
the cluster's directory, found from any client); a detached one stays published after
its driver leaves. ``kill`` cancels the actor's key, which ends it on its worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from lightwork import exceptions
from lightwork._object_ref import ObjectRef, collecting_refs, ref_counter
from lightwork._runtime import pickler
from lightwork.backends.cluster_holds import Handover
from lightwork.backends.cluster_worker import ArgSlot, Failed, key_name, unsupported

_ACTOR_DATASET = "lightwork-actor/"
#: How long a restart waits for the scheduler to notice a worker the RPC found dead.
LOSS_NOTICE_TIMEOUT_S = 30.0
#: How long a borrowed handle waits for the owner to restart a lost actor, and how often
#: it looks at the actor's key meanwhile (only during a restart).
RESTART_WAIT_S = 60.0
RESTART_POLL_S = 0.05
#: How long one wait on the engine for a result that should be at hand blocks before it
#: looks again (closed? killed?): no wait on the engine is unbounded.
ENGINE_POLL_S = 1.0
#: The annotation of an actor's key carrying (max_restarts, max_task_retries), read by
#: the processes that borrow a handle to it.
_POLICY = "lightwork_actor_restarts"


def _task_id_of_key(key: Any) -> int | None:
    """The id in a key ``"<name>-<id hex>"`` (an actor's: its actor id), or None."""
    try:
        return int(str(key).split("-")[1], 16)
    except (IndexError, ValueError):
        return None


def _in_order(calls: list[ActorCall]) -> list[ActorCall]:
    """``calls`` in the order this process made them (task ids grow with each call)."""
    return sorted(calls, key=lambda call: call.message[5])


def _actor_dataset(name: str, namespace: str | None) -> str:
    """The scheduler dataset under which a named actor is published."""
    return f"{_ACTOR_DATASET}{namespace or ''}/{name}"


def _has_runtime_env(blob: bytes) -> bool:
    """Whether an actor class's payload carries a runtime_env: it is then a pickled call of
    ``runtime_env.load_actor_class``, named first in its pickle (never unpickled here:
    that would apply the env to this process)."""
    return _ENV_LOADER in blob[:96]


_ENV_LOADER = b"lightwork._runtime.runtime_env\x94\x8c\x10load_actor_class"


class ActorCall:
    """One actor call from this process: its message, and its outcome once final."""

    __slots__ = ("__weakref__", "actor_id", "attempt", "held", "inner", "message",
                 "num_returns", "outcome", "recorder", "sends")

    def __init__(self, actor_id: int, message: tuple[Any, ...], num_returns: int,
                 recorder: Any = None) -> None:
        self.actor_id = actor_id
        self.message = message  # (method, name, payload, keys, num_returns, task_id)
        self.num_returns = num_returns
        self.attempt = 0
        self.held: list[Any] = []  # futures of the refs the call borrows, until it ends
        self.inner: list[Any] = []  # futures of the refs inside its result (cluster_holds)
        self.outcome: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.recorder = recorder  # the driver's event log (cluster_record), or None
        self.sends = 0  # RPCs made for it: only the latest one's end counts

    def finish(self, stored: Any) -> None:
        """The actor answered with ``stored``."""
        if self.recorder is not None:
            self.recorder.call_answered(self.message[5])
        self._settle(stored)

    def fail(self, error: exceptions.LightworkError) -> None:
        """The call failed here (its actor died): the actor will not report it."""
        if self.recorder is not None:
            self.recorder.call_failed(self.message[5], error)
        failed = Failed(error)
        self._settle(failed if self.num_returns <= 1 else (failed,) * self.num_returns)

    def _settle(self, stored: Any) -> None:
        self.held = []
        if not self.outcome.done():
            self.outcome.set_result(stored)


class ActorResult:
    """The caller's side of one actor call's result (``index``: which of several)."""

    __slots__ = ("call", "index", "key")

    def __init__(self, call: ActorCall, index: int | None) -> None:
        self.call = call
        self.index = index
        self.key = None  # not a cluster key: the value lives with the caller

    def done(self) -> bool:
        return self.call.outcome.done()

    def add_done_callback(self, callback: Any) -> None:
        self.call.outcome.add_done_callback(lambda _outcome: callback(self))

    def stored(self, timeout: float | None) -> Any:
        """The call's stored result; raises TimeoutError if not final in time."""
        try:
            value = self.call.outcome.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError from None
        return value if self.index is None else value[self.index]


@dataclass(slots=True, eq=False)
class BorrowedRestart:
    """An actor this process did not create, lost and maybe being restarted by its owner:
    the calls made meanwhile wait here (see *Restarts*)."""

    lost_address: str | None  # the worker it was lost with, if known
    queued: list[ActorCall]  # made meanwhile, in order
    retried: list[ActorCall] = field(default_factory=list)  # lost in flight: sent first
    flushing: bool = False  # restarted: its calls are being sent (new ones join queued)


@dataclass(slots=True)
class OwnedActor:
    """An actor this process created: its restart budget and state (see the docstring)."""

    actor_id: int
    class_name: str
    max_restarts: int
    max_task_retries: int
    held: list[Any]  # futures of refs its constructor borrows: a restart needs them
    restarts: int = 0
    incarnation: int = 0
    restarting: bool = False
    flushing: bool = False  # back: its queued calls are being sent (new ones join them)
    dead: str = ""  # why it is dead for good ("" while it may live)
    address: str = ""  # the worker holding it, once placed
    queued: list[ActorCall] = field(default_factory=list)  # made while it restarts
    retried: list[ActorCall] = field(default_factory=list)  # lost in flight: sent first
    inflight: dict[ActorCall, int] = field(default_factory=dict)  # call -> incarnation

    def out_of_restarts(self) -> bool:
        return 0 <= self.max_restarts <= self.restarts

    def may_retry(self, call: ActorCall) -> bool:
        """Whether ``call``, lost in flight, may run again (``max_task_retries``)."""
        return self.max_task_retries < 0 or call.attempt < self.max_task_retries


class ActorCalls:
    """Creating and calling actors (a part of ``DistributedBackend``)."""

    lock: threading.Lock
    futures: dict[int, Any]
    task_ids: dict[int, int]
    namespace: str | None
    recorder: Any
    session_log: Any
    in_driver: bool

    def _init_actor_calls(self) -> None:
        self._proxies: dict[int, Any] = {}  # actor id -> distributed Actor proxy
        self._killed: dict[int, bool] = {}
        self._seqs: dict[int, int] = {}  # actor id -> next call number from this process
        self._owned: dict[int, OwnedActor] = {}
        self._watched: set[str] = set()  # worker topics subscribed to
        self._named: list[str] = []  # named, not detached actors: unpublished at shutdown
        self._caller = uuid.uuid4().hex  # this process, as a caller of actors
        self._borrowed: dict[int, BorrowedRestart] = {}  # borrowed actors being restarted
        self._policies: dict[int, tuple[int, int] | None] = {}  # see _restart_policy
        # Calls of borrowed actors in flight (actor id -> call -> the proxy it went to):
        # settled when the actor's key fails (_actor_key_erred), as the owner's are.
        self._sent: dict[int, dict[ActorCall, Any]] = {}
        # Calls waiting for their actor's key to be done (built, or rebuilt by its owner):
        # ``.remote()`` never waits for the engine (see _queue_while_building).
        self._building: dict[int, list[ActorCall]] = {}

    def actor_restarts(self, actor_id: int) -> int:
        """How many times this process restarted the actor (0 if it does not own it)."""
        owned = self._owned.get(actor_id)
        return owned.restarts if owned is not None else 0

    def actor_lifecycle(self, actor_id: int) -> tuple[int, int, bool, str]:
        """(restarts, max_restarts, restarting now, why dead for good or "") of an actor
        this process owns; (0, 0, False, "") for one it does not."""
        owned = self._owned.get(actor_id)
        if owned is None:
            return 0, 0, False, ""
        return owned.restarts, owned.max_restarts, owned.restarting, owned.dead

    # -- creation ----------------------------------------------------------------------------
    def create_actor(self, actor: Any, blob: bytes) -> None:
        from lightwork._runtime import serialization
        from lightwork.backends.cluster_actors import ActorHost

        self._check_open()
        namespace = actor.namespace if actor.namespace is not None else self.namespace
        if actor.name is not None and self.driver_request(
                "get_actor", actor.name, namespace) is not None:
            raise ValueError(
                f"an actor named {actor.name!r} already exists in namespace "
                f"{namespace!r}; pick another name, or pass get_if_exists=True")
        if _has_runtime_env(blob):
            raise unsupported(
                f"an actor's runtime_env ({actor.class_name})",
                "an actor shares its worker's process with tasks and other actors, so its "
                "environment variables would leak into them; set the environment on the "
                "cluster's workers (dask worker's environment or a WorkerPlugin)")
        args, kwargs = serialization.loads(actor.args)
        if actor.deps:  # top-level refs of the constructor: this backend's own slots
            values = self.get(list(actor.deps), None)
            args = [values[a.index] if type(a) is ArgSlot else a for a in args]
            kwargs = {k: values[v.index] if type(v) is ArgSlot else v
                      for k, v in kwargs.items()}
        with collecting_refs() as contained:
            payload = pickler.dumps((tuple(args), kwargs))
        shape = dict(actor.hold)
        restrictions = {r: a for r, a in shape.items() if a and not (r == "CPU" and a <= 1)}
        if restrictions:
            problem = self._infeasible(restrictions, refresh=True)
            if problem:
                raise ValueError(f"actor {actor.class_name} can never be placed on this "
                                 f"cluster: {problem}")
        keys = self._keys_of(contained) if contained else None
        header = (actor.actor_id, actor.class_name, blob, payload, keys,
                  actor.max_concurrency, bool(actor.async_methods), self.session_tag)
        import dask

        # Processes that borrow a handle read its restart policy from the key's annotation.
        policy = ({_POLICY: (actor.max_restarts, actor.max_task_retries)}
                  if actor.max_restarts else {})
        with dask.annotate(**policy):
            future = self.client.submit(
                ActorHost, header, actor=True, pure=False, resources=restrictions or None,
                key=f"{key_name(actor.class_name)}-{actor.actor_id:x}")
        owned = OwnedActor(actor.actor_id, actor.class_name, actor.max_restarts,
                           actor.max_task_retries,
                           [self.futures[i] for i in keys] if keys and actor.max_restarts
                           else [])
        with self.lock:
            self.futures[actor.actor_id] = future
            self._owned[actor.actor_id] = owned
        # Watch its worker once it is placed: a loss is decided at once (restarted, or
        # given up, which handles elsewhere learn from the cancelled key).
        future.add_done_callback(lambda _f, owned=owned: self._watch(owned, 0))
        if self.session_log is not None:  # (listed even with the event log off)
            self.session_log.actor_created(actor.actor_id, actor.class_name, actor.name,
                                           namespace, actor.detached, actor.max_concurrency)
        if actor.name is not None:
            # The scheduler's datasets are the cluster's directory: whoever knows the name
            # finds the actor, and a published actor outlives this client (detached).
            entry = (actor.actor_id, actor.class_name, dict(actor.methods), future)
            self.client.publish_dataset(entry, name=_actor_dataset(actor.name, namespace))
            if not actor.detached:
                self._named.append(_actor_dataset(actor.name, namespace))

    # -- calls -------------------------------------------------------------------------------
    def submit_actor_task(self, actor_id: int, method: str, name: str, args: tuple,
                          kwargs: dict, num_returns: int, callsite: Any = None) -> list[ObjectRef]:
        self._check_open()
        if ref_counter._released:
            self._drain()
        tops = [a for a in (*args, *kwargs.values()) if type(a) is ObjectRef]
        if tops:  # resolved here, before the call is sent: its order is kept
            values = iter(self.get([ref.id for ref in tops], None))
            args = tuple(next(values) if type(a) is ObjectRef else a for a in args)
            kwargs = {k: next(values) if type(v) is ObjectRef else v for k, v in kwargs.items()}
        with collecting_refs() as contained:
            payload = pickler.dumps((args, kwargs))
        keys = self._keys_of(contained) if contained else None
        task_id = self.next_object_id()
        if self.recorder is not None:
            self.recorder.submitted(task_id, name, callsite, len(payload), actor_id=actor_id,
                                    call=(args, kwargs))
        call = ActorCall(actor_id, (method, name, payload, keys, num_returns, task_id),
                         num_returns, self.recorder)
        if keys:  # hold what the call borrows until it ends
            call.held = [self.futures[i] for i in keys]
        self._dispatch(call)
        refs = []
        with self.lock:
            indexes = [None] if num_returns == 1 else list(range(num_returns))
            for index in indexes:
                object_id = self.next_object_id()
                self.futures[object_id] = ActorResult(call, index)
                self.task_ids[object_id] = task_id
                refs.append(ObjectRef(object_id))
        return refs

    def _dispatch(self, call: ActorCall, flushing: bool = False) -> None:
        """Send ``call`` now, queue it while its actor is built or restarts, or fail it if
        the actor is dead; never waits for the engine. ``flushing``: a queued call sent
        by the flush of its queue (the queue's own checks are skipped)."""
        actor_id = call.actor_id
        owned = self._owned.get(actor_id)
        if not flushing and self._queue_while_building(call, owned):
            return
        if owned is None and not flushing and self._queue_while_restarting(call):
            return
        try:
            proxy = self._actor(actor_id)
        except exceptions.ActorDiedError as died:
            if owned is None:
                if not self._await_restart(call, None):
                    call.fail(died)
                return
            if not self._begin_restart(owned, owned.incarnation):
                call.fail(died)
                return
            proxy = None
        if proxy is None and owned is None:  # its key is pending again: rebuilt elsewhere
            if not self._await_restart(call, None):
                call.fail(self._actor_died(actor_id, None))
            return
        with self.lock:
            if owned is not None:
                if owned.restarting or (owned.flushing and not flushing):
                    owned.queued.append(call)
                    return
                # The proxy as of now (a restart may have replaced it since _actor()).
                proxy = self._proxies.get(actor_id, proxy)
                if proxy is None:  # pending again before its restart was decided
                    owned.queued.append(call)
                    return
            seq = self._seqs.get(actor_id, 0)
            self._seqs[actor_id] = seq + 1
            incarnation = owned.incarnation if owned is not None else 0
        self._send(proxy, call, seq, incarnation)

    def _queue_while_building(self, call: ActorCall, owned: OwnedActor | None) -> bool:
        """Queue ``call`` if its actor's key is pending (being built, or rebuilt by an
        owner elsewhere; an owned actor's restart has a queue of its own): the calls
        go, in order, once the key is done (``_built``). So ``.remote()`` returns at
        once, even while a constructor runs or no worker can take the actor yet."""
        actor_id = call.actor_id
        future = self.futures.get(actor_id)
        with self.lock:
            waiting = self._building.get(actor_id)
            if waiting is not None:
                waiting.append(call)
                return True
            if (actor_id in self._proxies or future is None
                    or getattr(future, "status", "finished") != "pending"
                    or owned is not None and (owned.restarting or owned.flushing)):
                return False
            self._building[actor_id] = [call]
        future.add_done_callback(lambda _f: self._built(actor_id))
        return True

    def _built(self, actor_id: int) -> None:
        """The key the calls of ``_building`` wait for is done (in distributed's callback
        thread): send them in order; calls made meanwhile join the queue until it is
        empty, so none overtakes an older one."""
        while True:
            with self.lock:
                waiting = self._building.get(actor_id)
                future = self.futures.get(actor_id)
                if waiting and future is not None and future.status == "pending":
                    break  # pending again (rebuilt): wait for it once more
                if not waiting:
                    self._building.pop(actor_id, None)
                    return
                calls = waiting[:]
                waiting.clear()
            for call in calls:
                try:
                    self._dispatch(call, flushing=True)
                except exceptions.LightworkError as error:  # the session closed, say
                    call.fail(error)
        future.add_done_callback(lambda _f: self._built(actor_id))

    def _send(self, proxy: Any, call: ActorCall, seq: int, incarnation: int) -> None:
        from distributed.protocol import to_serialize

        method, name, payload, keys, num_returns, task_id = call.message
        arguments = (self._caller, seq, method, name, payload, keys, num_returns, task_id,
                     self.client.id)
        owned = self._owned.get(call.actor_id)
        with self.lock:
            call.sends += 1
            sends = call.sends
            # Settled at once if its actor is lost: _begin_restart for the owner, else
            # _actor_key_erred (before its RPC may end, 30 s later for a dead address).
            if owned is not None:
                owned.inflight[call] = incarnation
            else:
                self._sent.setdefault(call.actor_id, {})[call] = proxy

        async def execute() -> Any:
            return await proxy._worker_rpc.actor_execute(
                function="call", actor=proxy.key,
                args=[to_serialize(argument) for argument in arguments], kwargs={})

        sent = asyncio.run_coroutine_threadsafe(execute(), proxy._io_loop.asyncio_loop)
        sent.add_done_callback(
            lambda done: self._call_done(call, proxy, incarnation, done, sends))

    def _call_done(self, call: ActorCall, proxy: Any, incarnation: int,
                   done: concurrent.futures.Future[Any], sends: int) -> None:
        """The RPC of ``call`` ended (on the event loop: never block here); ignored if
        the call was settled or sent again meanwhile (its actor's loss was decided)."""
        owned = self._owned.get(call.actor_id)
        with self.lock:
            if sends != call.sends or call.outcome.done():
                self._drop_handover(done)  # nobody wants this reply's inner objects
                return
            if owned is not None:
                owned.inflight.pop(call, None)
            else:
                sent = self._sent.get(call.actor_id)
                if sent is not None:
                    sent.pop(call, None)
                    if not sent:
                        del self._sent[call.actor_id]
        try:
            reply = done.result()
        except OSError as exc:  # the actor's worker is gone
            threading.Thread(target=self._call_lost, args=(call, proxy, incarnation, exc),
                             daemon=True, name="lightwork-actor-retry").start()
            return
        except BaseException as exc:  # noqa: BLE001 - delivered to the call's getter
            call.fail(exceptions.ActorDiedError(
                f"a call to actor {call.actor_id:020x} failed in the runtime "
                f"({type(exc).__name__}: {exc})"))
            return
        if reply.get("status") == "OK":
            stored = reply["result"]
            if type(stored) is Handover:  # refs inside: held here from now on, while
                call.inner = self.take_over(stored, keep=True)  # the call lives
                stored = stored.stored
            call.finish(stored)
        else:
            error = reply.get("exception")
            call.fail(exceptions.ActorDiedError(
                f"actor {call.actor_id:020x} could not run {call.message[1]}: {error!r}"))

    def _drop_handover(self, done: concurrent.futures.Future[Any]) -> None:
        """A reply that comes too late (its call was settled): release what it hands
        over, if anything (``cluster_holds``)."""
        if done.cancelled() or done.exception() is not None:
            return
        reply = done.result()
        if reply.get("status") == "OK" and type(reply.get("result")) is Handover:
            self.take_over(reply["result"], keep=False)

    def _call_lost(self, call: ActorCall, proxy: Any, incarnation: int,
                   exc: BaseException) -> None:
        """A call whose worker died: retry it after the restart, or fail it."""
        actor_id = call.actor_id
        with self.lock:
            if proxy is not None and self._proxies.get(actor_id) is proxy:
                del self._proxies[actor_id]  # stale: the next call looks the actor up again
        owned = self._owned.get(actor_id)
        name = call.message[1]
        if owned is None:
            policy = self._restart_policy(actor_id)
            if policy is not None and policy[0] and (policy[1] < 0 or call.attempt < policy[1]):
                call.attempt += 1  # sent again, first, once its owner has restarted it
                if self._await_restart(call, proxy._address, retry=True):
                    return
            more = ("" if policy is None or not policy[0] else
                    "; calls in flight are not retried (max_task_retries="
                    f"{policy[1]}): set max_task_retries (-1: no limit) if the call is safe to "
                    "run twice. Calls made after its owner restarts it reach the new one")
            call.fail(exceptions.ActorDiedError(
                f"actor {actor_id:020x} was lost with its worker ({type(exc).__name__}: "
                f"{exc}) while running {name}{more}"))
            return
        if not self._begin_restart(owned, incarnation):
            call.fail(self._actor_died(actor_id, exc))  # dead for good
            return
        if not owned.may_retry(call):
            call.fail(self._not_retried(owned, name))
            return
        call.attempt += 1
        self._note_retry(owned, call, exc)
        with self.lock:
            if owned.restarting or owned.flushing:
                owned.retried.append(call)  # sent first, in order (_flush)
                return
        self._dispatch(call)

    def _not_retried(self, owned: OwnedActor, name: str) -> exceptions.ActorDiedError:
        return exceptions.ActorDiedError(
            f"actor {owned.class_name} ({owned.actor_id:020x}) lost its worker while running "
            f"{name}; calls in flight are not retried (max_task_retries="
            f"{owned.max_task_retries}): set max_task_retries (-1: no limit) if the call "
            "is safe to run twice")

    def _note_retry(self, owned: OwnedActor, call: ActorCall, exc: BaseException) -> None:
        if self.recorder is not None:
            self.recorder.call_retried(call.message[5], "actor restarted: its worker "
                                       f"{owned.address} was lost ({type(exc).__name__})")

    # -- restarts ----------------------------------------------------------------------------
    def _watch(self, owned: OwnedActor, incarnation: int) -> None:
        """Subscribe to the scheduler's events of the worker now holding ``owned``."""
        future = self.futures.get(owned.actor_id)
        if future is None or self._closed:
            return
        if future.status != "finished":
            if future.status == "error":  # lost already
                self._begin_restart(owned, incarnation)
            return
        try:
            proxy = future.result(timeout=ENGINE_POLL_S)
        except (TimeoutError, concurrent.futures.TimeoutError):
            return  # pending again: whoever made it so watches it
        except Exception:  # noqa: BLE001 - lost in the meantime
            self._begin_restart(owned, incarnation)
            return
        owned.address = address = proxy._address
        client = self.client
        if address not in self._watched:
            self._watched.add(address)
            client.loop.add_callback(
                client.subscribe_topic, address,
                lambda event, address=address: self._worker_event(address, event))
        if future.status == "error":  # lost before the subscription took
            self._begin_restart(owned, incarnation)

    def _worker_event(self, address: str, event: tuple[float, Any]) -> None:
        """A scheduler event of a watched worker (on the event loop: never block)."""
        message = event[1]
        if not isinstance(message, dict) or message.get("action") != "remove-worker":
            return
        for owned in list(self._owned.values()):
            if owned.address == address and not owned.dead:
                self._begin_restart(owned, owned.incarnation)

    def _begin_restart(self, owned: OwnedActor, incarnation: int) -> bool:
        """Decide on the loss of ``owned``'s ``incarnation`` (once per loss): restart it, or
        give it up. False if it is dead for good (killed, or out of restarts). Runs on
        the event loop too: the effects run in a thread of their own."""
        with self.lock:
            if owned.dead:
                return False
            if owned.restarting or owned.incarnation != incarnation:
                return True  # decided already
            if self._killed.get(owned.actor_id) or owned.out_of_restarts():
                owned.dead = ("it was killed" if self._killed.get(owned.actor_id)
                              else self._out_of_restarts(owned))
                effect: Any = self._give_up
            else:
                owned.restarting = True
                owned.restarts += 1
                effect = self._restart
            # Its calls in flight are lost now: their RPCs to the lost worker may take the
            # connect timeout (30 s) to fail. A late end of one is ignored (``sends``).
            # Those that may run again are sent first after the restart, in their order.
            lost = _in_order([call for call, sent_to in owned.inflight.items()
                              if sent_to == incarnation])
            failed = []
            for call in lost:
                del owned.inflight[call]
                call.sends += 1
                if effect == self._restart and owned.may_retry(call):
                    call.attempt += 1
                    owned.retried.append(call)
                else:
                    failed.append(call)
        threading.Thread(target=effect, args=(owned,), daemon=True,
                         name=f"lightwork-restart-{owned.class_name}").start()
        if lost:
            threading.Thread(target=self._settle_lost, args=(owned, lost, failed),
                             daemon=True, name="lightwork-actor-retry").start()
        return effect == self._restart

    def _settle_lost(self, owned: OwnedActor, lost: list[ActorCall],
                     failed: list[ActorCall]) -> None:
        """Fail the calls lost in flight that may not run again; record the others'
        retry (queued already by ``_begin_restart``)."""
        loss = ConnectionError(f"its worker {owned.address} was lost")
        for call in lost:
            if call not in failed:
                self._note_retry(owned, call, loss)
            elif owned.dead:
                call.fail(self._actor_died(owned.actor_id, loss))
            else:
                call.fail(self._not_retried(owned, call.message[1]))

    def _restart(self, owned: OwnedActor) -> None:
        """Rebuild ``owned`` on another worker (its restart is counted already)."""
        actor_id = owned.actor_id
        future = self.futures.get(actor_id)
        deadline = time.monotonic() + LOSS_NOTICE_TIMEOUT_S
        while future is not None and future.status == "finished" and not self._closed:
            if time.monotonic() > deadline:  # the worker answers again: nothing was lost
                with self.lock:
                    owned.restarts -= 1
                self._restarted(owned, None)
                return
            time.sleep(0.05)  # the scheduler has not yet removed the worker
        while True:
            if future is None or self._closed or self._killed.get(actor_id):
                with self.lock:
                    owned.dead = owned.dead or "it was killed"
                self._give_up(owned)
                return
            if self.recorder is not None:
                self.recorder.actor_restarted(actor_id, f"its worker {owned.address} was lost")
            self.client.retry([future])
            proxy = self._placed(future, actor_id)
            if proxy is None:  # lost again while rebuilt (or killed, or closed: see above)
                if self._closed or self._killed.get(actor_id):
                    continue
                with self.lock:
                    if owned.out_of_restarts():
                        owned.dead = self._out_of_restarts(owned)
                    else:
                        owned.restarts += 1
                if owned.dead:
                    self._give_up(owned)
                    return
                continue
            self._restarted(owned, proxy)
            return

    def _placed(self, future: Any, actor_id: int) -> Any:
        """The proxy of ``future``'s actor once it is placed; None if it failed, or if the
        actor is killed or the session closes while it waits (the wait is not bounded
        otherwise: a cluster may take long to find room, and calls queue meanwhile)."""
        while not self._closed and not self._killed.get(actor_id):
            try:
                return future.result(timeout=ENGINE_POLL_S)
            except (TimeoutError, concurrent.futures.TimeoutError):
                continue
            except Exception:  # noqa: BLE001 - lost (again), or cancelled
                return None
        return None

    def _restarted(self, owned: OwnedActor, proxy: Any) -> None:
        """``owned`` is back: a new incarnation at ``proxy``, or (None) the same one, which
        was never lost. Then the calls queued meanwhile go, in order."""
        with self.lock:
            if proxy is not None:
                # Always a new incarnation, whatever is cached: a caller's _actor() waiting
                # on the same future may have cached this very proxy object already
                # (distributed batches concurrent gathers of one key), and the new actor
                # counts each caller's calls from 0.
                self._proxies[owned.actor_id] = proxy
                self._seqs[owned.actor_id] = 0
                owned.incarnation += 1
            owned.restarting = False
            owned.flushing = True
        self._watch(owned, owned.incarnation)
        self._flush(owned)

    def _flush(self, owned: OwnedActor) -> None:
        """Send the calls of ``owned`` that waited for its restart: those lost in flight
        first, then those made meanwhile, in order; calls made during the flush join the
        queue, so none overtakes an older one. Stops if it is lost again meanwhile (the
        next restart sends the rest)."""
        while True:
            with self.lock:
                calls = _in_order(owned.retried) + owned.queued
                owned.retried, owned.queued = [], []
                if not calls or owned.restarting:
                    owned.queued[:0] = calls
                    owned.flushing = False
                    return
            for call in calls:  # (if it died for good meanwhile, they fail)
                self._dispatch(call, flushing=True)

    def _give_up(self, owned: OwnedActor) -> None:
        """``owned`` is dead for good (``owned.dead`` says why): end it everywhere."""
        with self.lock:
            owned.restarting = owned.flushing = False
            queued = owned.retried + owned.queued
            owned.retried, owned.queued = [], []
            future = self.futures.get(owned.actor_id)
        if future is not None and not self._closed:
            self.client.cancel([future], force=True)  # handles elsewhere see it dead
        if self.recorder is not None:
            self.recorder.actor_died(owned.actor_id, owned.dead)
        for call in queued:
            call.fail(self._actor_died(owned.actor_id, None))

    # -- restarts seen from a handle this process does not own --------------------------
    def _restart_policy(self, actor_id: int) -> tuple[int, int] | None:
        """(max_restarts, max_task_retries) of an actor created elsewhere, from its key's
        annotation on the scheduler (cached); None if it has none (no restarts)."""
        if actor_id in self._policies:
            return self._policies[actor_id]
        future = self.futures.get(actor_id)
        key = getattr(future, "key", None)
        if key is None:
            return None

        def annotation(dask_scheduler: Any, key: Any = key) -> Any:
            task = dask_scheduler.tasks.get(key)
            return None if task is None else (task.annotations or {}).get(_POLICY)

        try:
            policy = self.client.run_on_scheduler(annotation)
        except Exception:  # noqa: BLE001 - the scheduler cannot say: no restarts known
            return None
        policy = tuple(policy) if policy else None
        self._policies[actor_id] = policy
        return policy

    def _queue_while_restarting(self, call: ActorCall) -> bool:
        """Queue ``call`` if its (borrowed) actor is being restarted by its owner, or the
        calls that waited for that are being sent."""
        with self.lock:
            borrowed = self._borrowed.get(call.actor_id)
            if borrowed is None:
                return False
            borrowed.queued.append(call)
            return True

    def _await_restart(self, call: ActorCall, lost_address: str | None,
                       retry: bool = False) -> bool:
        """The actor of ``call``, borrowed from its owner, was lost (at ``lost_address``,
        if known): queue the call until its owner has restarted it, if it may be
        (``max_restarts``); a ``retry`` (lost in flight) goes before the calls made
        meanwhile. False if it will not be: the call is not queued."""
        actor_id = call.actor_id
        policy = self._restart_policy(actor_id)
        if policy is None or not policy[0] or self._closed:
            return False
        with self.lock:
            borrowed = self._borrowed.get(actor_id)
            if borrowed is not None and not borrowed.flushing:
                (borrowed.retried if retry else borrowed.queued).append(call)
                return True
            cached = self._proxies.get(actor_id)
            if cached is not None and lost_address in (None, cached._address):
                del self._proxies[actor_id]  # stale: its worker is gone
                lost_address = cached._address
            borrowed = self._borrowed[actor_id] = BorrowedRestart(
                lost_address, [] if retry else [call], [call] if retry else [])
        threading.Thread(target=self._follow_restart, args=(actor_id, borrowed), daemon=True,
                         name=f"lightwork-actor-restart-{actor_id:x}").start()
        return True

    def _follow_restart(self, actor_id: int, borrowed: BorrowedRestart) -> None:
        """Follow the owner's restart of a borrowed actor through its key's state on the
        scheduler (this process's future of it), then send the queued calls in order."""
        future = self.futures.get(actor_id)
        deadline = time.monotonic() + RESTART_WAIT_S
        proxy, why = None, ""
        while future is not None and not self._closed:
            status = future.status
            if status == "finished":
                try:
                    candidate = future.result(timeout=ENGINE_POLL_S)
                except Exception:  # noqa: BLE001 - lost again meanwhile: go on watching
                    candidate = None
                if candidate is not None and (candidate._address != borrowed.lost_address
                                              or time.monotonic() > deadline):
                    proxy = candidate  # restarted (or, at the deadline, never lost)
                    break
            elif status not in ("error", "pending"):  # cancelled: killed, or out of restarts
                why = "its owner gave it up (it was killed, or its restarts are used up)"
                break
            if time.monotonic() > deadline:
                why = (f"its owner did not restart it within {RESTART_WAIT_S:g} s (the "
                       "process that created it may have exited)")
                break
            time.sleep(RESTART_POLL_S)  # only while an actor restarts
        with self.lock:
            borrowed.flushing = True
            if proxy is not None:
                self._proxies[actor_id] = proxy
                self._seqs[actor_id] = 0  # the new incarnation counts each caller from 0
        # Lost calls first, then those made meanwhile, in order; calls made during the
        # flush join the queue (none overtakes an older one) until it is empty.
        while True:
            with self.lock:
                calls = _in_order(borrowed.retried) + borrowed.queued
                borrowed.retried, borrowed.queued = [], []
                if not calls:
                    if self._borrowed.get(actor_id) is borrowed:
                        del self._borrowed[actor_id]
                    return
            for call in calls:
                if proxy is not None:
                    self._dispatch(call, flushing=True)
                else:
                    call.fail(exceptions.ActorDiedError(
                        f"actor {actor_id:020x} is dead: its worker was lost and "
                        f"{why or 'the session closed'}"))

    def _actor_key_erred(self, key: Any) -> None:
        """The scheduler failed ``key`` (on the event loop): if it is a borrowed actor's,
        its cached proxy is stale (its worker is gone); the next call looks it up again
        and, finding it lost, waits for the owner's restart."""
        actor_id = _task_id_of_key(key)
        if actor_id is None or actor_id in self._owned:
            return
        with self.lock:
            proxy = self._proxies.get(actor_id)
            if proxy is not None and proxy.key == key:
                del self._proxies[actor_id]
                self._seqs[actor_id] = 0  # a new incarnation counts each caller from 0
            # Its calls in flight are lost now (the RPC of one sent to the dead address
            # would fail only at the connect timeout, 30 s): settled as the owner's are.
            lost = self._sent.pop(actor_id, {})
            for call in lost:
                call.sends += 1  # a late end of its RPC is ignored
        if lost:
            threading.Thread(target=self._borrowed_calls_lost, args=(list(lost.items()),),
                             daemon=True, name="lightwork-actor-retry").start()

    def _borrowed_calls_lost(self, lost: list[tuple[ActorCall, Any]]) -> None:
        for call, proxy in sorted(lost, key=lambda item: item[0].message[5]):
            self._call_lost(call, proxy, 0, ConnectionError(
                f"its worker {proxy._address} was lost"))

    # -- the actor's proxy -------------------------------------------------------------------
    def _actor(self, actor_id: int) -> Any:
        """The distributed proxy of the actor; None while its key is pending (being built
        or rebuilt: never waited for here); ActorDiedError if it is gone."""
        proxy = self._proxies.get(actor_id)
        if proxy is None:
            future = self._future_of(actor_id)
            if future.status == "pending":
                return None
            try:  # done: at hand (bounded all the same, in case it went pending again)
                proxy = future.result(timeout=ENGINE_POLL_S)
            except (TimeoutError, concurrent.futures.TimeoutError):
                return None
            except Exception as exc:  # noqa: BLE001 - its worker died, or it was killed
                raise self._actor_died(actor_id, exc) from None
            self._proxies[actor_id] = proxy
        # The actor's key, as this process holds it (the proxy's own future is private).
        held = self.futures.get(actor_id)
        if self._killed.get(actor_id) or held is not None and (
                getattr(held, "status", "finished") not in ("finished", "pending")):
            raise self._actor_died(actor_id, None)
        return proxy

    @staticmethod
    def _out_of_restarts(owned: OwnedActor) -> str:
        if not owned.max_restarts:
            return f"its worker ({owned.address}) was lost, and max_restarts=0"
        return (f"its worker ({owned.address}) was lost, and it was restarted "
                f"{owned.restarts} time(s), all that max_restarts={owned.max_restarts} allows")

    def _actor_died(self, actor_id: int, exc: BaseException | None) -> exceptions.ActorDiedError:
        owned = self._owned.get(actor_id)
        if self._killed.get(actor_id):
            why = "it was killed"
        elif owned is not None and owned.dead:
            why = owned.dead
        else:
            why = (f"its worker was lost ({type(exc).__name__}: {exc})" if exc else
                   "its worker was lost")
        advice = ("Create a new actor to go on" if owned is None or owned.max_restarts == 0
                  else "Find why its workers keep dying, or raise max_restarts (-1: no limit)")
        if owned is not None and owned.max_restarts == 0 and not self._killed.get(actor_id):
            advice += ", or create it with max_restarts to have it restarted on another worker"
        return exceptions.ActorDiedError(f"actor {actor_id:020x} is dead: {why}. {advice}")

    def driver_request(self, what: str, *args: Any) -> Any:
        if what == "stream" and args[0] == "item":  # a generator task's next item
            return self.stream_item(args[1], args[2])
        if what == "get_actor":
            name, namespace = args[0], args[1] if args[1] is not None else self.namespace
            entry = self.client.get_dataset(_actor_dataset(name, namespace), default=None)
            if entry is None:
                return None
            actor_id, class_name, methods, future = entry
            with self.lock:
                self.futures.setdefault(actor_id, future)
            return actor_id, class_name, methods
        if what == "kill":
            actor_id = args[0]
            future = self._future_of(actor_id)
            self._killed[actor_id] = True
            owned = self._owned.get(actor_id)
            if owned is not None:
                with self.lock:
                    owned.dead = owned.dead or "it was killed"
            for name in self._published_names_of(future):
                self.client.unpublish_dataset(name)
            self.client.cancel([future], force=True)
            return None
        raise unsupported(f"{what!r}", "it is not implemented on this backend; run on the "
                          "embedded runtime (init() with no address)")

    def _published_names_of(self, future: Any) -> list[str]:
        return [name for name in self.client.list_datasets()
                if isinstance(name, str) and name.startswith(_ACTOR_DATASET)
                and getattr(self.client.get_dataset(name)[3], "key", None) == future.key]
