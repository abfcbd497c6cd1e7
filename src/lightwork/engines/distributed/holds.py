"""Refs inside stored values on the distributed backend: held while the outer value lives.

:class:`InnerHolds` is the backend's ``holds`` component: it owns the holds (by holder)
and the thread that watches them; the holds change under the backend's lock.

A value with refs inside is stored as ``cluster_worker.WithRefs`` (its pickle and the key
of each ref inside). Whoever unpickles it borrows those objects (``cluster_worker``,
*Borrowing*); until then the process that stored it must keep them alive: it holds a
future of each inner object under the outer value's *holder*, and lets them go once no
one can unpickle the value any more. What tells it depends on where the value lives:

* A task's single result: the key lives on the worker that made it. The worker plugin
  ``cluster_plugin.ExportedRefs`` drops the holds when that key leaves the worker's
  memory and no copy is left anywhere (``exported_by_key``).
* A ``put`` value (mode ``"forgotten"``): once this process has dropped its own ref to
  it, and the scheduler has forgotten its key (no client, queue or task wants it).
* One of a task's ``num_returns=k`` parts, and a generator's item (``"forgotten"`` too):
  held under the part's own key (``<main key>-<index>``) or the item's, watched at once
  (the storing process holds no ref to them).
* An actor call's result: it goes back to its caller, not into the cluster, so it is
  *handed over* (:class:`Handover`), with no hold and no watching. Before it replies, the
  actor's process makes a pseudo client of the scheduler, named for this result (its
  *holder*), want every inner key (:func:`hand_over`, one ``run_on_scheduler`` round
  trip: done when the reply leaves). The actor's process then drops its own refs at once.
  The caller, on the reply (``cluster_actor_calls``), takes futures of its own (its
  client wants the keys) and then releases the holder, both on its client's stream to
  the scheduler, which handles them in order: from the reply on, someone the scheduler
  knows always wants the keys, and the caller's own release of an older ref to one of
  them can never land after its new want. A caller in the actor's own process does the
  same (no special case, no timeout). Released holders are dropped from the scheduler's
  clients by the next hand-over, which also lets go of those whose caller has left.

One daemon thread per process (``_watch_holds``) checks the armed holds once every
``WATCH_INTERVAL_S`` in one ``run_on_scheduler`` round trip (:func:`release_facts`), and
exits when none are left: nothing runs while no value with refs inside is released.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightwork.engines.distributed.backend import DistributedBackend


WATCH_INTERVAL_S = 1.0
#: The scheduler's pseudo clients that hold an actor result's inner keys are named so.
HOLDER_PREFIX = "lightwork-result-"


@dataclass(slots=True, eq=False)
class Hold:
    """Futures of the objects inside one stored value, and when they may go."""

    held: list[Any]
    armed: bool = False  # watched now (a put: once this process dropped its own ref)


class Handover:
    """An actor call's stored result whose inner keys the scheduler's pseudo client
    ``holder`` wants until the caller takes them over (see the module docstring)."""

    __slots__ = ("holder", "keys", "stored")

    def __init__(self, stored: Any, holder: str, keys: list[Any]) -> None:
        self.stored = stored
        self.holder = holder
        self.keys = keys

    def __reduce__(self) -> tuple[Any, ...]:
        return (Handover, (self.stored, self.holder, self.keys))


def release_facts(dask_scheduler: Any = None, outer: tuple[Any, ...] = ()) -> list[Any]:
    """Run on the scheduler: the ``outer`` keys it has forgotten."""
    tasks = dask_scheduler.tasks
    return [key for key in outer if key not in tasks]


#: In the scheduler's process: the holders :func:`hand_over` made -> their caller's client.
_holders: dict[str, str] = {}


def hand_over(dask_scheduler: Any = None, keys: tuple[Any, ...] = (), holder: str = "",
              caller: str = "") -> None:
    """Run on the scheduler: the pseudo client ``holder`` wants ``keys`` until the client
    ``caller`` releases it. First drops the holders released since (an empty pseudo
    client is left otherwise), and lets go of those whose caller has left the cluster."""
    clients = dask_scheduler.clients
    for name, taker in list(_holders.items()):
        state = clients.get(name)
        if state is None or not state.wants_what:
            clients.pop(name, None)
            del _holders[name]
        elif taker not in clients:  # the caller is gone: nobody will take them over
            dask_scheduler.client_releases_keys(
                keys=[task.key for task in state.wants_what], client=name)
    dask_scheduler.client_desires_keys(keys=list(keys), client=holder)
    _holders[holder] = caller


class InnerHolds:
    """Holding the refs inside stored values: the backend's ``holds`` component. Owns
    the holds and their watching thread; the holds change under the backend's lock."""

    def __init__(self, backend: DistributedBackend) -> None:
        self.backend = backend
        self._holds: dict[Any, Hold] = {}  # holder (a key, or an actor result's token)
        self._holds_thread: threading.Thread | None = None
        self._holds_start = threading.Lock()

    def hold_inside(self, stored: Any, holder: Any, mode: str = "forgotten",
                    armed: bool = True) -> None:
        """Hold the objects inside ``stored`` (a WithRefs) until the scheduler has
        forgotten the key ``holder`` (the only ``mode``); watched at once if ``armed``,
        else once ``arm_hold`` is called (a put whose ref this process dropped)."""
        held = [self.backend.futures[i] for i in stored.keys if i in self.backend.futures]
        with self.backend.lock:
            self._holds[holder] = Hold(held, armed)
        if armed:
            self._start_watching()

    def hold_under(self, key: Any, held: list[Any]) -> None:
        """Hold the futures ``held`` until the scheduler has forgotten ``key`` (an actor
        result's inner refs, under the key that carries that result to a task)."""
        with self.backend.lock:
            self._holds[key] = Hold(list(held), True)
        self._start_watching()

    def hand_over_result(self, stored: Any, keys: list[Any], caller: str) -> Handover:
        """An actor result ``stored`` with ``keys`` inside, for the client ``caller``:
        the scheduler holds them for it from now on (see the module docstring)."""
        import uuid

        holder = f"{HOLDER_PREFIX}{uuid.uuid4().hex}"
        self.backend.client.run_on_scheduler(hand_over, keys=tuple(keys), holder=holder,
                                     caller=caller)
        return Handover(stored, holder, keys)

    def take_over(self, handover: Handover, keep: bool) -> list[Any]:
        """The caller's side: futures of the handed-over keys (none unless ``keep``: the
        result is not wanted), then the holder released, in this order on this client's
        stream to the scheduler (see the module docstring). On the event loop too."""
        client = self.backend.client
        if keep:
            from distributed import Future

            held: list[Any] = [Future(key, client) for key in handover.keys]
        else:
            held = []
        messages = [{"op": "client-releases-keys", "keys": list(handover.keys),
                     "client": handover.holder}]
        if keep:  # (a Future made from a key only counts locally)
            messages.insert(0, {"op": "client-desires-keys", "keys": list(handover.keys),
                                "client": client.id})

        def send() -> None:
            for message in messages:
                client._send_to_scheduler(message)

        client.loop.add_callback(send)
        return held

    def holding(self, holder: Any) -> bool:
        """Whether the refs inside a value are held under ``holder`` (lock held)."""
        return bool(self._holds) and holder in self._holds

    def clear(self) -> None:
        """At shutdown (lock held): let every hold go."""
        self._holds.clear()

    def arm_hold(self, key: Any) -> None:
        """This process dropped its ref to the put ``key``."""
        hold = self._holds.get(key)
        if hold is not None and not hold.armed:
            hold.armed = True
            self._start_watching()

    def _start_watching(self) -> None:
        with self._holds_start:
            if self._holds_thread is None and not self.backend.closed:
                self._holds_thread = threading.Thread(target=self._watch_holds, daemon=True,
                                                      name="lightwork-inner-refs")
                self._holds_thread.start()

    def _watch_holds(self) -> None:
        while not self.backend.closed:
            time.sleep(WATCH_INTERVAL_S)
            with self._holds_start, self.backend.lock:
                outer = tuple(holder for holder, hold in self._holds.items() if hold.armed)
                if not outer:
                    self._holds_thread = None
                    return
            try:
                gone = self.backend.client.run_on_scheduler(release_facts, outer=outer)
            except Exception:  # noqa: BLE001, S112 - the cluster is away: try next time
                continue
            with self.backend.lock:
                for holder in gone:
                    self._holds.pop(holder, None)
