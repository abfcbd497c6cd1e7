"""Actor restarts on the distributed backend, seen from the caller's side.

``ActorRestarts`` is the restart half of the backend's ``actors`` component, the base of
``actor_calls.ActorCalls``, whose state it shares: what happens to an actor's calls when
the worker holding it is lost.

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
ignored (``ActorCall.sends``). Sequence numbers (``_seqs``, per caller) start
again at 0, under a new caller name, for each incarnation of the actor, always
(``_restarted``: a caller waiting on the same future may hold the new proxy already,
distributed batching concurrent gathers of a key).

Handles in other processes (passed to a task or another actor, or found by name) behave
the same, without deciding anything: their process follows the owner's decision through
the actor's key. The key carries the actor's ``(max_restarts, max_task_retries)`` as an
annotation, which such a process reads from the scheduler when it first meets a loss
(``_restart_policy``). It meets one as a call whose RPC failed, or as the key failed (the
scheduler plugin's message, ``cluster_plugin.TaskErrors``, drops its cached proxy,
``actor_key_erred``). With restarts
allowed, its calls then wait (:class:`BorrowedRestart`) while one thread follows the
key's state: back in memory on another worker (restarted: the calls go, in order),
cancelled (killed, or out of restarts: they fail with ``ActorDiedError``), or still
failed after ``RESTART_WAIT_S`` (the owner is gone: they fail). Its calls in flight
(``_sent``) are settled when the key fails, as the owner's are when it decides: sent
again first under ``max_task_retries``, else failed — never left to an RPC that waits
out the connect timeout on the dead address. So that a handle elsewhere never
waits for a decision that cannot come, the owner watches every actor it creates and
gives up (cancels the key of) a lost one without restarts at once.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions

if TYPE_CHECKING:
    from lightwork.engines.distributed.actor_calls import ActorCall

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
POLICY_ANNOTATION = "lightwork_actor_restarts"


if TYPE_CHECKING:
    from lightwork.engines.distributed.backend import DistributedBackend


def _task_id_of_key(key: Any) -> int | None:
    """The id in a key ``"<name>-<id hex>"`` (an actor's: its actor id), or None."""
    try:
        return int(str(key).split("-")[1], 16)
    except (IndexError, ValueError):
        return None


def _in_order(calls: list[ActorCall]) -> list[ActorCall]:
    """``calls`` in the order this process made them (task ids grow with each call)."""
    return sorted(calls, key=lambda call: call.message[5])


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
    unschedulable: str = ""  # why no worker can ever hold it ("" if one can)
    address: str = ""  # the worker holding it, once placed
    queued: list[ActorCall] = field(default_factory=list)  # made while it restarts
    retried: list[ActorCall] = field(default_factory=list)  # lost in flight: sent first
    inflight: dict[ActorCall, int] = field(default_factory=dict)  # call -> incarnation

    def out_of_restarts(self) -> bool:
        return 0 <= self.max_restarts <= self.restarts

    def may_retry(self, call: ActorCall) -> bool:
        """Whether ``call``, lost in flight, may run again (``max_task_retries``)."""
        return self.max_task_retries < 0 or call.attempt < self.max_task_retries


class ActorRestarts:
    """Restarting actors and following restarts: the restart half of the backend's
    ``actors`` component (``actor_calls.ActorCalls``), whose state it shares."""

    backend: DistributedBackend

    if TYPE_CHECKING:  # the calls half's own methods that restarts use (ActorCalls)
        def _dispatch(self, call: ActorCall, flushing: bool = False) -> None: ...
        def _actor_died(self, actor_id: int, exc: BaseException | None,
                        forgotten: bool = False) -> exceptions.ActorError: ...
        def _cache_proxy(self, actor_id: int, proxy: Any) -> None: ...
        def _result_at_hand(self, future: Any) -> Any: ...
        def _unreachable(self) -> str: ...
    _owned: dict[int, OwnedActor]
    _proxies: dict[int, Any]
    _seqs: dict[int, list[Any]]
    _killed: dict[int, bool]
    _watched: set[str]
    _borrowed: dict[int, BorrowedRestart]
    _policies: dict[int, tuple[int, int] | None]
    _sent: dict[int, dict[ActorCall, Any]]

    def _call_lost(self, call: ActorCall, proxy: Any, incarnation: int,
                   exc: BaseException) -> None:
        """A call whose worker died: retry it after the restart, or fail it."""
        actor_id = call.actor_id
        with self.backend.lock:
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
        with self.backend.lock:
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
        if self.backend.recorder is not None:
            self.backend.recorder.call_retried(call.message[5], "actor restarted: its worker "
                                       f"{owned.address} was lost ({type(exc).__name__})")

    def _watch(self, owned: OwnedActor, incarnation: int) -> None:
        """Subscribe to the scheduler's events of the worker now holding ``owned``."""
        future = self.backend.futures.get(owned.actor_id)
        if future is None or self.backend.closed:
            return
        if future.status != "finished":
            if future.status == "error":  # lost already
                self._begin_restart(owned, incarnation)
            return
        try:
            proxy = self._result_at_hand(future)
        except exceptions.RuntimeSystemError:
            return  # the session closed, or the scheduler is lost
        except Exception:  # noqa: BLE001 - lost in the meantime
            self._begin_restart(owned, incarnation)
            return
        if proxy is None:  # pending again: whoever made it so watches it
            return
        owned.address = address = proxy._address
        client = self.backend.client
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
        with self.backend.lock:
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
        future = self.backend.futures.get(actor_id)
        deadline = time.monotonic() + LOSS_NOTICE_TIMEOUT_S
        while future is not None and future.status == "finished" and not self.backend.closed:
            if time.monotonic() > deadline:  # the worker answers again: nothing was lost
                with self.backend.lock:
                    owned.restarts -= 1
                self._restarted(owned, None)
                return
            time.sleep(0.05)  # the scheduler has not yet removed the worker
        while True:
            unreachable = self._unreachable()
            if future is None or self.backend.closed or self._killed.get(actor_id) or unreachable:
                with self.backend.lock:
                    owned.dead = owned.dead or unreachable or "it was killed"
                self._give_up(owned)
                return
            if self.backend.recorder is not None:
                self.backend.recorder.actor_restarted(actor_id, f"its worker {owned.address} was lost")
            try:
                self.backend.client.retry([future])
            except Exception:  # noqa: BLE001, S112 - the scheduler is lost: said at the top
                continue
            proxy = self._placed(future, actor_id)
            if proxy is None:  # lost again while rebuilt (or killed, closed, unreachable)
                if self.backend.closed or self._killed.get(actor_id) or self._unreachable():
                    continue
                with self.backend.lock:
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
        while not self.backend.closed and not self._killed.get(actor_id) and not self._unreachable():
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
        with self.backend.lock:
            if proxy is not None:
                # Always a new incarnation, whatever is cached: a caller's _actor() waiting
                # on the same future may have cached this very proxy object already
                # (distributed batches concurrent gathers of one key), and the new actor
                # counts each caller's calls from 0.
                self._cache_proxy(owned.actor_id, proxy)
                self._seqs.pop(owned.actor_id, None)  # its callers count from 0 again
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
            with self.backend.lock:
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
        with self.backend.lock:
            owned.restarting = owned.flushing = False
            queued = owned.retried + owned.queued
            owned.retried, owned.queued = [], []
            future = self.backend.futures.get(owned.actor_id)
        if future is not None and not self.backend.closed and not self._unreachable():
            try:
                self.backend.client.cancel([future], force=True)  # handles elsewhere see it dead
            except Exception:  # noqa: BLE001, S110 - the scheduler was lost meanwhile
                pass
        if self.backend.recorder is not None:
            self.backend.recorder.actor_died(owned.actor_id, owned.dead)
        for call in queued:
            call.fail(self._actor_died(owned.actor_id, None))

    def _restart_policy(self, actor_id: int) -> tuple[int, int] | None:
        """(max_restarts, max_task_retries) of an actor created elsewhere, from its key's
        annotation on the scheduler (cached); None if it has none (no restarts)."""
        if actor_id in self._policies:
            return self._policies[actor_id]
        future = self.backend.futures.get(actor_id)
        key = getattr(future, "key", None)
        if key is None:
            return None

        def annotation(dask_scheduler: Any, key: Any = key) -> Any:
            task = dask_scheduler.tasks.get(key)
            return None if task is None else (task.annotations or {}).get(POLICY_ANNOTATION)

        try:
            policy = self.backend.client.run_on_scheduler(annotation)
        except Exception:  # noqa: BLE001 - the scheduler cannot say: no restarts known
            return None
        policy = tuple(policy) if policy else None
        self._policies[actor_id] = policy
        return policy

    def _queue_while_restarting(self, call: ActorCall) -> bool:
        """Queue ``call`` if its (borrowed) actor is being restarted by its owner, or the
        calls that waited for that are being sent."""
        with self.backend.lock:
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
        if policy is None or not policy[0] or self.backend.closed:
            return False
        with self.backend.lock:
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
        threading.Thread(target=self._follow_restart, args=(actor_id, borrowed, call.actor),
                         daemon=True,
                         name=f"lightwork-actor-restart-{actor_id:x}").start()
        return True

    def _follow_restart(self, actor_id: int, borrowed: BorrowedRestart, future: Any) -> None:
        """Follow the owner's restart of a borrowed actor through its key's state on the
        scheduler (``future``, this process's, held by the call that met the loss), then
        send the queued calls in order."""
        deadline = time.monotonic() + RESTART_WAIT_S
        proxy, why = None, ""
        while future is not None and not self.backend.closed:
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
        with self.backend.lock:
            borrowed.flushing = True
            if proxy is not None:
                self._cache_proxy(actor_id, proxy)
                self._seqs.pop(actor_id, None)  # the new incarnation counts callers from 0
        # Lost calls first, then those made meanwhile, in order; calls made during the
        # flush join the queue (none overtakes an older one) until it is empty.
        while True:
            with self.backend.lock:
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
                        f"actor {actor_id:020x}: The actor is dead because its worker was lost and "
                        f"{why or 'the session closed'}"))

    def actor_key_erred(self, key: Any) -> None:
        """The scheduler failed ``key`` (on the event loop): if it is a borrowed actor's,
        its cached proxy is stale (its worker is gone); the next call looks it up again
        and, finding it lost, waits for the owner's restart. If this process owns the
        actor, the loss is decided now unless it was already: the owner hears of it from
        its worker's remove-worker event (``_watch``), but that subscription is asked
        for when the actor is placed and may take effect only after the worker died (an
        actor killed as soon as it was restarted), and its calls in flight would then
        wait out the connect timeout (30 s)."""
        actor_id = _task_id_of_key(key)
        if actor_id is None:
            return
        owned = self._owned.get(actor_id)
        if owned is not None:
            future = self.backend.futures.get(actor_id)
            if future is not None and future.key == key and future.status == "error":
                self._begin_restart(owned, owned.incarnation)  # (decided already: nothing)
            return
        with self.backend.lock:
            proxy = self._proxies.get(actor_id)
            if proxy is not None and proxy.key == key:
                del self._proxies[actor_id]
                self._seqs.pop(actor_id, None)  # a new incarnation counts callers from 0
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

    @staticmethod
    def _out_of_restarts(owned: OwnedActor) -> str:
        if not owned.max_restarts:
            return f"its worker ({owned.address}) was lost, and max_restarts=0"
        return (f"its worker ({owned.address}) was lost, and it was restarted "
                f"{owned.restarts} time(s), all that max_restarts={owned.max_restarts} allows")
