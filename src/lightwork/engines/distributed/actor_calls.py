"""The caller's side of actors on the distributed backend: creation, calls, names.

:class:`ActorCalls` is the backend's ``actors`` component (``backend.actors``), the
actor directory of this process: it owns the proxies, the actors this process created
(``_owned``) and their restarts (``actor_restarts.ActorRestarts``, its base), the call
order per caller, the names it published and the borrowed actors' calls in flight, all
changed under the backend's lock. The backend tells it when a handle's last ref goes
(``ref_dropped``) and at shutdown (``unpublish_names``); ``tasks`` asks it whether a
failed actor key concerns it (``tracks_actors``, ``actor_key_erred``). The actor's own
side, on a worker, is ``actors.py``, whose docstring has the design of a call.

Calls
-----
Each call is an :class:`ActorCall`: its message (kept until it is final, so it can be
sent again) and its ``outcome``, a ``concurrent.futures.Future`` resolved once with the
call's stored result(s). A call is sent as one ``actor_execute`` RPC to the actor's
worker, run on the client's (or, in a task, the worker's) event loop; the RPC's own
future resolves the outcome from a done callback. So ``get`` blocks on the outcome and
``wait`` counts outcomes with done callbacks, as for tasks: nothing polls. The refs of a
call map to :class:`ActorResult` entries in ``futures`` (``key`` None: the value lives
with its caller, not in the cluster). A call's arguments are pickled in band, unless
their large buffers (numpy arrays) come to ``SCATTER_MIN``: then they are joined into
one copy (the value as it was at the call, which a call sent again sends again) that
the RPC carries as a frame of its own (``cluster_worker.InlineBuffers``), one transfer
with no pickling of the bytes, and the actor's arrays view it read-only, as a task's do.

``.remote()`` never waits for the engine: while the actor's key is pending (its
constructor runs, or no worker has room yet) calls queue (``_building``) and go, in
order, from the key's done callback (``_built``). Every other wait on the engine in this
module is bounded (``ENGINE_POLL_S`` at a time, looking again whether the session closed
or the actor was killed), so a lost worker or scheduler ends in an error, not a hang.

Restarts: the owner of an actor decides them, handles elsewhere follow its decision
through the actor's key; calls lost in flight, or made meanwhile, wait for it there
(``cluster_actor_restarts``, the ``ActorRestarts`` part, whose docstring has the design).

Named actors are published as scheduler datasets (``lightwork-actor/<namespace>/<name>``:
the cluster's directory, found from any client); a detached one stays published after
its driver leaves. ``kill`` cancels the actor's key, which ends it on its worker.

Lifetime
--------
An actor lives while some process wants its key: distributed frees a key nobody wants,
and the actor with it (``ActorHost.__del__`` then stops its threads). In each process the
handles' ref (``futures``), the cached proxy (``_proxies``, whose own future wants the
key) and each unsettled call (``ActorCall.actor``) want it. When the last handle here is
dropped, ``forget_actor`` drops the proxy, the creator's ownership (``_owned``: nothing
can restart an actor without its key) and, for a named actor not detached, its directory
entry (the dataset wants the key too); calls already made still finish. So, as in Ray,
the actor ends once no process holds a handle (a proxy kept for the session would keep
every actor alive until its driver ended).

A process that meets a handle only after its actor was killed holds a key the scheduler
has forgotten; distributed ignores a want of an unknown key, so its future would stay
pending for good. The first call that finds such a key pending asks the scheduler
whether it knows it (``_key_exists``) and fails with ``ActorDiedError`` if it does not:
at once if the scheduler's plugin remembers forgetting it, after a short grace if the
key was never seen (its creation may still be on its way).
Left for the session: ``_killed`` and ``_policies``, a few bytes for each actor killed
here or met lost from a borrowed handle.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions
from lightwork.kernel.calls import unschedulable_error, warn_unschedulable
from lightwork.kernel.object_ref import ObjectRef, collecting_refs, ref_counter
from lightwork.kernel.serialization import pickle_value
from lightwork.engines.distributed.actor_restarts import (
    ENGINE_POLL_S,
    POLICY_ANNOTATION,
    ActorRestarts,
    BorrowedRestart,
    OwnedActor,
)
from lightwork.engines.distributed.holds import Handover
from lightwork.engines.distributed.tasks import CLUSTER_FIX, SCATTER_MIN
from lightwork.engines.distributed.worker import call_payload
from lightwork.engines.distributed.worker import ArgSlot, Failed, key_name, unsupported

if TYPE_CHECKING:
    from lightwork.engines.distributed.backend import DistributedBackend

_ACTOR_DATASET = "lightwork-actor/"
#: How long an actor key the scheduler does not know is asked about again before the
#: actor counts as gone (``_key_exists``).
ACTOR_KEY_GRACE_S = 3.0
ACTOR_KEY_POLL_S = 0.05


#: The death cause of an actor ended by kill(), in Ray's words (which tests match).
KILLED = "it was killed by `ray.kill` (lightwork.kill())"


def actor_key_state(dask_scheduler: Any = None, key: Any = None) -> str:
    """Run on the scheduler: "known" if it knows the actor key ``key``, "gone" if it
    forgot it (``cluster_plugin.TaskErrors.gone_actors``), else "unknown" (not yet
    submitted, or forgotten where no lightwork plugin of this version runs)."""
    from lightwork.engines.distributed.plugin import TaskErrors

    if key in dask_scheduler.tasks:
        return "known"
    plugin = dask_scheduler.plugins.get(TaskErrors.name)
    return "gone" if key in getattr(plugin, "gone_actors", ()) else "unknown"



def _actor_dataset(name: str, namespace: str | None) -> str:
    """The scheduler dataset under which a named actor is published."""
    return f"{_ACTOR_DATASET}{namespace or ''}/{name}"


def _has_runtime_env(blob: bytes) -> bool:
    """Whether an actor class's payload carries a runtime_env: it is then a pickled call of
    ``runtime_env.load_actor_class``, named first in its pickle (never unpickled here:
    that would apply the env to this process)."""
    return _ENV_LOADER in blob[:96]


_ENV_LOADER = b"lightwork.kernel.runtime_env\x94\x8c\x10load_actor_class"


class ActorCall:
    """One actor call from this process: its message, and its outcome once final."""

    __slots__ = ("__weakref__", "actor", "actor_id", "attempt", "held", "inner", "message",
                 "num_returns", "outcome", "recorder", "sends")

    def __init__(self, actor_id: int, actor: Any, message: tuple[Any, ...], num_returns: int,
                 recorder: Any = None) -> None:
        self.actor_id = actor_id
        # The actor's key as this process held it when the call was made: the call keeps
        # its actor alive, and can find it, until it is settled, even if every handle
        # here is dropped meanwhile (see "Lifetime" in the module docstring).
        self.actor: Any = actor
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
        self.actor = None
        if not self.outcome.done():
            self.outcome.set_result(stored)


@dataclass(frozen=True)
class UnschedulableActor:
    """What the key of an actor no worker can hold resolves to (``_create_unschedulable``):
    why, so that a process that meets its handle elsewhere (a task it was passed to)
    fails each call with the same ActorUnschedulableError as its creator does."""

    class_name: str
    problem: str

    def error(self) -> exceptions.ActorUnschedulableError:
        return unschedulable_error("actor", self.class_name, self.problem, CLUSTER_FIX)


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


class ActorCalls(ActorRestarts):
    """Creating and calling actors: the backend's ``actors`` component, the actor
    directory of this process (proxies, owned actors and their restarts, call order per
    caller, names, calls in flight). Its state changes under the backend's lock."""

    def __init__(self, backend: DistributedBackend) -> None:
        self.backend = backend
        self._proxies: dict[int, Any] = {}  # actor id -> distributed Actor proxy
        self._killed: dict[int, bool] = {}
        # actor id -> [this process's caller name, its next call number]: the actor runs
        # each caller's calls in order. Made afresh when a call finds none: the first
        # after a restart (a new incarnation counts from 0) or after forget_actor.
        self._seqs: dict[int, list[Any]] = {}
        self._caller_names = itertools.count()
        self._owned: dict[int, OwnedActor] = {}
        self._watched: set[str] = set()  # worker topics subscribed to
        # Named, not detached actors this process made (actor id -> dataset): unpublished
        # when its last handle here is dropped (forget_actor), or at shutdown.
        self._named: dict[int, str] = {}
        self._caller = uuid.uuid4().hex  # this process, as a caller of actors
        self._borrowed: dict[int, BorrowedRestart] = {}  # borrowed actors being restarted
        self._policies: dict[int, tuple[int, int] | None] = {}  # see _restart_policy
        # Calls of borrowed actors in flight (actor id -> call -> the proxy it went to):
        # settled when the actor's key fails (actor_key_erred), as the owner's are.
        self._sent: dict[int, dict[ActorCall, Any]] = {}
        # Calls waiting for their actor's key to be done (built, or rebuilt by its owner):
        # ``.remote()`` never waits for the engine (see _queue_while_building).
        self._building: dict[int, list[ActorCall]] = {}
        # Calls waiting for a top-level ref argument, and the calls made after them, by
        # actor: sent in order by a thread of their own (``_send_when_ready``).
        self._arguments_awaited: dict[int, collections.deque[Any]] = {}

    def actor_restarts(self, actor_id: int) -> int:
        """How many times this process restarted the actor (0 if it does not own it)."""
        owned = self._owned.get(actor_id)
        return owned.restarts if owned is not None else 0

    def owned_actors(self) -> list[tuple[int, OwnedActor]]:
        """The actors this process created and owns, with their restart state."""
        return list(self._owned.items())

    def was_killed(self, actor_id: int) -> bool:
        """Whether ``kill`` was called on the actor from this process."""
        return bool(self._killed.get(actor_id))

    def actor_lifecycle(self, actor_id: int) -> tuple[int, int, bool, str]:
        """(restarts, max_restarts, restarting now, why dead for good or "") of an actor
        this process owns; (0, 0, False, "") for one it does not."""
        owned = self._owned.get(actor_id)
        if owned is None:
            return 0, 0, False, ""
        return owned.restarts, owned.max_restarts, owned.restarting, owned.dead

    # -- creation ----------------------------------------------------------------------------
    def create_actor(self, actor: Any, blob: bytes) -> None:
        from lightwork.kernel import serialization
        from lightwork.engines.distributed.actors import ActorHost

        self.backend.check_open()
        self._check_reachable()
        namespace = actor.namespace if actor.namespace is not None else self.backend.namespace
        if actor.name is not None and self.find(actor.name, namespace) is not None:
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
            values = self.backend.fetch.get(list(actor.deps), None)
            args = [values[a.index] if type(a) is ArgSlot else a for a in args]
            kwargs = {k: values[v.index] if type(v) is ArgSlot else v
                      for k, v in kwargs.items()}
        with collecting_refs() as contained:
            payload = pickle_value((tuple(args), kwargs))
        shape = dict(actor.hold)
        restrictions = {r: a for r, a in shape.items() if a and not (r == "CPU" and a <= 1)}
        if restrictions:
            problem = self.backend.tasks.infeasible(restrictions, refresh=True)
            if problem:
                self._create_unschedulable(actor, problem)
                return
        keys = self.backend.keys_of(contained) if contained else None
        header = (actor.actor_id, actor.class_name, blob, payload, keys,
                  actor.max_concurrency, bool(actor.async_methods), self.backend.session_tag)
        import dask

        # Processes that borrow a handle read its restart policy from the key's annotation.
        policy = ({POLICY_ANNOTATION: (actor.max_restarts, actor.max_task_retries)}
                  if actor.max_restarts else {})
        with dask.annotate(**policy):
            future = self.backend.client.submit(
                ActorHost, header, actor=True, pure=False, resources=restrictions or None,
                key=f"{key_name(actor.class_name)}-{actor.actor_id:x}")
        owned = OwnedActor(actor.actor_id, actor.class_name, actor.max_restarts,
                           actor.max_task_retries,
                           [self.backend.futures[i] for i in keys] if keys and actor.max_restarts
                           else [])
        with self.backend.lock:
            self.backend.futures[actor.actor_id] = future
            self._owned[actor.actor_id] = owned
        # Watch its worker once it is placed: a loss is decided at once (restarted, or
        # given up, which handles elsewhere learn from the cancelled key).
        future.add_done_callback(lambda _f, owned=owned: self._watch(owned, 0))
        if self.backend.session_log is not None:  # (listed even with the event log off)
            self.backend.session_log.actor_created(actor.actor_id, actor.class_name, actor.name,
                                           namespace, actor.detached, actor.max_concurrency)
        if actor.name is not None:
            # The scheduler's datasets are the cluster's directory: whoever knows the name
            # finds the actor, and a published actor outlives this client (detached).
            entry = (actor.actor_id, actor.class_name, dict(actor.methods), future)
            self.backend.client.publish_dataset(entry, name=_actor_dataset(actor.name, namespace))
            if not actor.detached:
                self._named[actor.actor_id] = _actor_dataset(actor.name, namespace)

    def _create_unschedulable(self, actor: Any, problem: str) -> None:
        """An actor no worker can hold (``problem`` says why): warned of once per shape,
        and dead from birth, so that each of its calls fails with ActorUnschedulableError
        (``_actor_died``) instead of waiting forever; nothing is built on the cluster. Its
        key holds an :class:`UnschedulableActor`, so the calls of a handle passed to a
        task or an actor fail there the same way (``_actor``)."""
        backend = self.backend
        key = ("actor", actor.place, actor.hold)
        if key not in backend.tasks.warned_shapes:
            backend.tasks.warned_shapes.add(key)
            warn_unschedulable("actor", actor.class_name, problem, CLUSTER_FIX)
        owned = OwnedActor(actor.actor_id, actor.class_name, 0, 0, [],
                           dead=f"it can never be scheduled: {problem}", unschedulable=problem)
        # The handle's key: no actor behind it, only why (for handles passed elsewhere).
        [future] = backend.client.scatter([UnschedulableActor(actor.class_name, problem)],
                                          hash=False)
        with backend.lock:
            backend.futures[actor.actor_id] = future
            self._owned[actor.actor_id] = owned

    # -- calls -------------------------------------------------------------------------------
    def submit_actor_task(self, actor_id: int, method: str, name: str, args: tuple,
                          kwargs: dict, num_returns: int, callsite: Any = None) -> list[ObjectRef]:
        self.backend.check_open()
        self._check_reachable()
        if ref_counter._released:
            self.backend._drain()
        actor = self.backend.future_of(actor_id, actor=True)  # (an ended session's raises here)
        tops = [a.id for a in (*args, *kwargs.values()) if type(a) is ObjectRef]
        task_id = self.backend.next_object_id()
        call = ActorCall(actor_id, actor, (method, name, b"", None, num_returns, task_id),
                         num_returns, self.backend.recorder)
        ready = not tops or len(self.backend.fetch.wait(tops, len(tops), 0)) == len(tops)
        waiting = None
        if not ready or self._arguments_awaited:  # (else no call waits: the lock is skipped)
            with self.backend.lock:
                waiting = self._arguments_awaited.get(actor_id)
                if waiting is None and not ready:
                    waiting = self._arguments_awaited[actor_id] = collections.deque()
                    threading.Thread(target=self._send_when_ready, args=(actor_id, waiting),
                                     daemon=True, name="lightwork-actor-arguments").start()
                if waiting is not None:  # after the calls before it: see _send_when_ready
                    waiting.append((call, args, kwargs, tops))
        size = 0 if waiting is not None else self._fill(call, args, kwargs, tops)
        if self.backend.recorder is not None:
            self.backend.recorder.submitted(task_id, name, callsite, size, actor_id=actor_id,
                                            call=(args, kwargs))
        if waiting is None:
            self._dispatch(call)
        refs = []
        with self.backend.lock:
            indexes = [None] if num_returns == 1 else list(range(num_returns))
            for index in indexes:
                object_id = self.backend.next_object_id()
                self.backend.futures[object_id] = ActorResult(call, index)
                self.backend.task_ids[object_id] = task_id
                refs.append(ObjectRef(object_id))
        return refs

    def _fill(self, call: ActorCall, args: tuple, kwargs: dict, tops: list[int]) -> int:
        """Give ``call`` its message: the values of its top-level refs ``tops`` (ready by
        now) and the rest pickled. Returns the payload's size."""
        if tops:
            values = iter(self.backend.fetch.get(tops, None))
            args = tuple(next(values) if type(a) is ObjectRef else a for a in args)
            kwargs = {k: next(values) if type(v) is ObjectRef else v for k, v in kwargs.items()}
        # Large buffers go as a frame of their own in the call's RPC (``InlineBuffers``).
        payload, contained = call_payload(args, kwargs, SCATTER_MIN)
        keys = self.backend.keys_of(contained) if contained else None
        method, name, _, _, num_returns, task_id = call.message
        call.message = (method, name, payload, keys, num_returns, task_id)
        if keys:  # hold what the call borrows until it ends
            call.held = [self.backend.futures[i] for i in keys]
        return len(payload)

    def _send_when_ready(self, actor_id: int, waiting: collections.deque[Any]) -> None:
        """Send, in order, the calls made to the actor while one of them waited for a
        top-level ref argument (in a thread of its own, until none is left).

        As in Ray, ``.remote()`` returns at once and the actor runs this process's calls
        in the order they were made: a call whose argument is not ready holds back the
        calls made after it, which queue here behind it, and no one else's. A call whose
        argument failed fails with that argument's error."""
        while True:
            with self.backend.lock:
                if not waiting:
                    del self._arguments_awaited[actor_id]
                    return
                call, args, kwargs, tops = waiting[0]
            try:
                self._fill(call, args, kwargs, tops)
            except Exception as error:  # noqa: BLE001 - an argument's error is the call's
                call.fail(error if isinstance(error, exceptions.LightworkError)
                          else exceptions.RuntimeSystemError(repr(error)))
            else:
                try:
                    self._dispatch(call)
                except exceptions.LightworkError as error:  # the session closed, say
                    call.fail(error)
            del args, kwargs
            with self.backend.lock:
                waiting.popleft()

    def _dispatch(self, call: ActorCall, flushing: bool = False) -> None:
        """Send ``call`` now, queue it while its actor is built or restarts, or fail it if
        the actor is dead; never waits for the engine. ``flushing``: a queued call sent
        by the flush of its queue (the queue's own checks are skipped)."""
        actor_id = call.actor_id
        unreachable = self._unreachable()
        if unreachable:  # (queued calls sent after the scheduler was lost end here)
            call.fail(exceptions.RuntimeSystemError(unreachable))
            return
        owned = self._owned.get(actor_id)
        if owned is not None and owned.dead:
            # Its loss is decided (a call's RPC failed, or the scheduler said so) before
            # this process may have heard the key fail: sent now, the call would go to the
            # dead worker's address, which distributed retries for its connect timeout (30
            # s), and no decision is left to settle it sooner.
            call.fail(self._actor_died(actor_id, None))
            return
        if not flushing and self._queue_while_building(call, owned):
            return
        if owned is None and not flushing and self._queue_while_restarting(call):
            return
        try:
            proxy = self._actor(actor_id, call.actor)
        except exceptions.ActorUnschedulableError as error:
            call.fail(error)
            return
        except exceptions.ActorDiedError as died:
            if owned is None:
                if not self._await_restart(call, None):
                    call.fail(died)
                return
            if not self._begin_restart(owned, owned.incarnation):
                call.fail(died)
                return
            proxy = None
        if proxy is None and owned is None:  # its key is pending (again): wait for it
            self._queue_while_building(call, owned, pending=True, flushing=flushing)
            return
        with self.backend.lock:
            if owned is not None:
                if owned.restarting or (owned.flushing and not flushing):
                    owned.queued.append(call)
                    return
                # The proxy as of now (a restart may have replaced it since _actor()).
                proxy = self._proxies.get(actor_id, proxy)
                if proxy is None:  # pending again before its restart was decided
                    owned.queued.append(call)
                    return
            counter = self._seqs.get(actor_id)
            if counter is None:
                counter = self._seqs[actor_id] = [
                    f"{self._caller}-{next(self._caller_names)}", 0]
            caller, seq = counter
            counter[1] = seq + 1
            incarnation = owned.incarnation if owned is not None else 0
        self._send(proxy, call, caller, seq, incarnation)

    def _queue_while_building(self, call: ActorCall, owned: OwnedActor | None,
                              pending: bool = False, flushing: bool = False) -> bool:
        """Queue ``call`` if its actor's key is pending (being built, or rebuilt by an
        owner elsewhere; an owned actor's restart has a queue of its own): the calls
        go, in order, once the key is done (``_built``). So ``.remote()`` returns at
        once, even while a constructor runs or no worker can take the actor yet.
        ``pending``: the caller saw the key pending (the call is queued whatever else).
        The first call to queue for an actor this process did not create makes sure the
        scheduler knows the key (``_key_exists``; not when ``flushing``, in distributed's
        callback thread): if not, the actor is gone and the call fails."""
        actor_id = call.actor_id
        future = call.actor
        with self.backend.lock:
            waiting = self._building.get(actor_id)
            if waiting is not None:
                waiting.append(call)
                return True
            if not pending and (
                    actor_id in self._proxies or future is None
                    or getattr(future, "status", "finished") != "pending"
                    or owned is not None and (owned.restarting or owned.flushing)):
                return False
        if owned is None and not flushing and not self._key_exists(future):
            call.fail(self._actor_died(actor_id, None, forgotten=True))
            return True
        with self.backend.lock:
            waiting = self._building.get(actor_id)
            if waiting is not None:  # another call began the queue meanwhile
                waiting.append(call)
                return True
            self._building[actor_id] = [call]
        future.add_done_callback(lambda _f: self._built(actor_id))
        return True

    def _built(self, actor_id: int) -> None:
        """The key the calls of ``_building`` wait for is done (in distributed's callback
        thread): send them in order; calls made meanwhile join the queue until it is
        empty, so none overtakes an older one."""
        while True:
            with self.backend.lock:
                waiting = self._building.get(actor_id)
                if not waiting:
                    self._building.pop(actor_id, None)
                    return
                future = waiting[0].actor  # (the calls hold the key: see ActorCall.actor)
                if future is not None and future.status == "pending":
                    break  # pending again (rebuilt): wait for it once more
                calls = waiting[:]
                waiting.clear()
            for call in calls:
                try:
                    self._dispatch(call, flushing=True)
                except exceptions.LightworkError as error:  # the session closed, say
                    call.fail(error)
        future.add_done_callback(lambda _f: self._built(actor_id))

    def _send(self, proxy: Any, call: ActorCall, caller: str, seq: int,
              incarnation: int) -> None:
        from distributed.protocol import to_serialize

        method, name, payload, keys, num_returns, task_id = call.message
        arguments = (caller, seq, method, name, payload, keys, num_returns, task_id,
                     self.backend.client.id)
        owned = self._owned.get(call.actor_id)
        with self.backend.lock:
            call.sends += 1
            sends = call.sends
            # Settled at once if its actor is lost: _begin_restart for the owner, else
            # actor_key_erred (before its RPC may end, 30 s later for a dead address).
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
        with self.backend.lock:
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
                call.inner = self.backend.holds.take_over(stored, keep=True)  # the call lives
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
            self.backend.holds.take_over(reply["result"], keep=False)

    # -- the actor's proxy -------------------------------------------------------------------
    def _actor(self, actor_id: int, future: Any) -> Any:
        """The distributed proxy of the actor whose key ``future`` is; None while the key
        is pending (being built or rebuilt: never waited for here); ActorDiedError if it
        is gone."""
        proxy = self._proxies.get(actor_id)
        if proxy is None:
            try:
                proxy = self._result_at_hand(future)
            except exceptions.RuntimeSystemError:
                raise
            except Exception as exc:  # noqa: BLE001 - its worker died, or it was killed
                raise self._actor_died(actor_id, exc) from None
            if proxy is None:
                return None
            if type(proxy) is UnschedulableActor:
                raise proxy.error()
            self._cache_proxy(actor_id, proxy)
        # The actor's key, as this process holds it (the proxy's own future is private).
        if self._killed.get(actor_id) or future is not None and (
                getattr(future, "status", "finished") not in ("finished", "pending")):
            raise self._actor_died(actor_id, None)
        return proxy

    def ref_dropped(self, object_id: int) -> None:
        """The last ref in this process to ``object_id`` went (``_drain``, lock held): if
        it was an actor's handle, forget the actor here."""
        if object_id in self._proxies or object_id in self._owned:
            self.forget_actor(object_id)

    def export_result(self, object_id: int, result: ActorResult) -> Any:
        """A cluster key for an actor call's result whose ref leaves this process (in a
        task's arguments or result, in a ``put``): the ref's future becomes a bridge
        (``tasks.bridge``), whose key takes the call's answer when it comes. Never waits
        for the call, so a ref of a call still waiting for a later one can go."""
        bridge = self.backend.tasks.bridge(result)
        with self.backend.lock:
            futures = self.backend.futures
            if futures.get(object_id) is result:
                futures[object_id] = bridge
            return futures.get(object_id, bridge)

    def tracks_actors(self) -> bool:
        """Whether this process has an actor proxy or a borrowed actor's call in flight,
        which a failed actor key may concern."""
        return bool(self._proxies or self._sent)

    def unpublish_names(self) -> None:
        """At shutdown: the named, not detached actors this process made end with it
        (a lost scheduler forgot them already)."""
        for name in self._named.values():
            try:
                self.backend.client.unpublish_dataset(name)
            except Exception:  # noqa: BLE001 - the cluster may be gone already
                pass

    def forget_actor(self, actor_id: int) -> None:
        """The last handle in this process to ``actor_id`` was dropped (``_drain``, with
        the lock held): drop its cached proxy, which holds the actor's key, so the actor
        ends once no process holds a handle, as distributed frees any key nobody wants.
        Its creator gives up owning it: nothing here can restart it without the key (a
        handle elsewhere keeps the actor alive, without restarts). Calls still queued or
        in flight hold the key themselves (``ActorCall.actor``) and finish."""
        self._proxies.pop(actor_id, None)
        self._seqs.pop(actor_id, None)  # a handle that comes back calls as a new caller
        owned = self._owned.pop(actor_id, None)
        if owned is not None:
            owned.dead = owned.dead or "every handle to it in its creator was dropped"
            owned.held = []  # the refs its constructor borrowed, kept for restarts
        name = self._named.pop(actor_id, None)
        if name is not None:  # its directory entry holds the key too (Ray: no longer found)
            # Not from here: this may run on the event loop (_drain_soon), which the RPC
            # waits for, and with the lock held.
            threading.Thread(target=self._unpublish, args=(name,), daemon=True,
                             name="lightwork-actor-unpublish").start()

    def _unpublish(self, name: str) -> None:
        try:
            self.backend.client.unpublish_dataset(name)
        except Exception:  # noqa: BLE001, S110 - the cluster is gone: so is the entry
            pass

    def _cache_proxy(self, actor_id: int, proxy: Any) -> None:
        """Keep ``proxy`` for the next calls while this process holds a handle to the
        actor: the proxy holds the actor's key, so a proxy kept after the last handle
        would keep the actor alive (``_drain`` drops it with the handle)."""
        if actor_id in self.backend.futures:
            self._proxies[actor_id] = proxy

    def _key_exists(self, future: Any) -> bool:
        """Whether the scheduler knows the actor key ``future`` stands for, pending (being
        built, or rebuilt by its owner) or not. A process that meets a handle after its
        actor was killed holds a key the scheduler has forgotten, and distributed ignores
        a want of an unknown key: without this look the call would wait for a key nobody
        will make. The creator's submission may still be on its way when a handle comes
        by another path (an actor call's arguments go straight to its worker), so an
        unknown key is looked at again for ``ACTOR_KEY_GRACE_S`` before it counts as
        gone, unless the scheduler's plugin remembers forgetting it: then at once (rather
        than every such call waiting out the grace). Only a call that finds the key
        pending pays this (one read of the scheduler's tables); later calls queue behind
        it."""
        deadline = time.monotonic() + ACTOR_KEY_GRACE_S
        while True:
            try:
                state = self.backend.client.run_on_scheduler(actor_key_state, key=future.key)
            except Exception:  # noqa: BLE001 - the scheduler is away: the wait is bounded
                return True
            if state == "gone":
                return False
            if (state == "known" or future.status != "pending"
                    or time.monotonic() > deadline):
                return state == "known" or future.status != "pending"
            time.sleep(ACTOR_KEY_POLL_S)

    def _result_at_hand(self, future: Any) -> Any:
        """The result of a done ``future`` (raising its error); None if it is pending.
        Its value is here, but reading it takes a turn of the event loop: a busy loop is
        waited for ``ENGINE_POLL_S`` at a time while the session is open and the
        scheduler reachable (then a RuntimeSystemError says so), never without bound."""
        while future.status != "pending":
            try:
                return future.result(timeout=ENGINE_POLL_S)
            except (TimeoutError, concurrent.futures.TimeoutError):
                self.backend.check_open()
                self._check_reachable()
        return None

    def _actor_died(self, actor_id: int, exc: BaseException | None,
                    forgotten: bool = False) -> exceptions.ActorError:
        """``forgotten``: the scheduler no longer knows its key (``_key_exists``)."""
        owned = self._owned.get(actor_id)
        if owned is not None and owned.unschedulable:
            return unschedulable_error("actor", owned.class_name, owned.unschedulable,
                                       CLUSTER_FIX)
        if self._killed.get(actor_id):
            why = KILLED
        elif forgotten:
            why = ("the cluster no longer has it (it was killed, or every handle to it was "
                   "dropped)")
        elif owned is not None and owned.dead:
            why = owned.dead
        else:
            why = (f"its worker was lost ({type(exc).__name__}: {exc})" if exc else
                   "its worker was lost")
        advice = ("Create a new actor to go on" if owned is None or owned.max_restarts == 0
                  else "Find why its workers keep dying, or raise max_restarts (-1: no limit)")
        if owned is not None and owned.max_restarts == 0 and not self._killed.get(actor_id):
            advice += ", or create it with max_restarts to have it restarted on another worker"
        # "The actor is dead because ...": Ray's words, which programs and tests match.
        return exceptions.ActorDiedError(
            f"actor {actor_id:020x}: The actor is dead because {why}. {advice}")

    def _unreachable(self) -> str:
        """Why the cluster's scheduler cannot be reached now, or "" if it can (the
        client's status: it reconnects, then closes, after losing the scheduler)."""
        client = self.backend.client
        status = getattr(client, "status", "running")
        if status == "running":
            return ""
        return (f"the Dask cluster's scheduler does not answer (the client is {status!r}): it "
                "may have stopped, or the network is down. Restart the scheduler (workers "
                "reconnect), or call lightwork.shutdown() and init() again")

    def _check_reachable(self) -> None:
        unreachable = self._unreachable()
        if unreachable:
            raise exceptions.RuntimeSystemError(unreachable)

    def exit_actor(self) -> None:
        """``exit_actor()`` in an actor's method (or an asyncio task or thread of its):
        the actor ends inside its host (``ActorHost.request_exit``)."""
        from lightwork.engines.distributed.actors import host_here
        from lightwork.kernel.backend import NOT_IN_AN_ACTOR

        host = host_here()
        if self.backend.in_driver or host is None:
            raise TypeError(NOT_IN_AN_ACTOR)
        host.request_exit(exceptions.USER_EXIT)
        if host.is_async:  # a SystemExit would end only the loop's thread
            raise exceptions.AsyncioActorExit()
        raise SystemExit(0)

    def find(self, name: str, namespace: str | None) -> tuple[int, str, Any] | None:
        """(actor id, class name, methods) of the live actor ``name`` in ``namespace``
        (None: the session's), or None; this process then holds its key."""
        self._check_reachable()
        if namespace is None:
            namespace = self.backend.namespace
        entry = self.backend.client.get_dataset(_actor_dataset(name, namespace), default=None)
        if entry is None:
            return None
        actor_id, class_name, methods, future = entry
        with self.backend.lock:
            self.backend.futures.setdefault(actor_id, future)
        return actor_id, class_name, methods

    def kill(self, actor_id: int) -> None:
        """End the actor now, its name with it (``kill``; never restarted)."""
        self._check_reachable()
        future = self.backend.future_of(actor_id, actor=True)
        self._killed[actor_id] = True
        owned = self._owned.get(actor_id)
        if owned is not None:
            with self.backend.lock:
                owned.dead = owned.dead or "it was killed"
        for name in self._published_names_of(future):
            self.backend.client.unpublish_dataset(name)
        self.backend.client.cancel([future], force=True)

    def _published_names_of(self, future: Any) -> list[str]:
        return [name for name in self.backend.client.list_datasets()
                if isinstance(name, str) and name.startswith(_ACTOR_DATASET)
                and getattr(self.backend.client.get_dataset(name)[3], "key", None) == future.key]
