"""Refs inside stored values on the distributed backend: held while the outer value lives.

The ``InnerHolds`` part of ``DistributedBackend`` (``cluster.py``).

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
* An actor call's result (mode ``"taken"``): it goes back to its caller, not into the
  cluster. The caller takes its own futures of the inner objects when the reply comes
  (``cluster_actor_calls``), and the actor's process lets its holds go once the scheduler
  shows the caller's client wanting every inner key (so there is no moment when no one
  holds them), or after ``TAKEN_TIMEOUT_S`` (the caller is gone, or is this process).
  So that the actor's check sees it even when the result is dropped at once, the caller
  keeps its futures ``LINGER_S`` past the call's end (``linger``).

One daemon thread per process (``_watch_holds``) checks the armed holds once every
``WATCH_INTERVAL_S`` in one ``run_on_scheduler`` round trip (:func:`release_facts`), and
exits when none are left: nothing runs while no value with refs inside is released.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

WATCH_INTERVAL_S = 1.0
TAKEN_TIMEOUT_S = 60.0
LINGER_S = 5.0


@dataclass(slots=True, eq=False)
class Hold:
    """Futures of the objects inside one stored value, and when they may go."""

    held: list[Any]
    mode: str  # "forgotten" (the outer key) or "taken" (by the client ``taker``)
    inner_keys: tuple[Any, ...]
    taker: str = ""
    armed: bool = False  # watched now (a put: once this process dropped its own ref)
    deadline: float = 0.0  # "taken": let go then anyway


def release_facts(dask_scheduler: Any = None, outer: tuple[Any, ...] = (),
                  taken: tuple[tuple[Any, str, tuple[Any, ...]], ...] = ()) -> tuple[list, list]:
    """Run on the scheduler: the ``outer`` keys it has forgotten, and the holders among
    ``taken`` (holder, client id, inner keys) whose client wants every inner key."""
    tasks = dask_scheduler.tasks
    gone = [key for key in outer if key not in tasks]
    done = [holder for holder, client, keys in taken
            if all(key in tasks and any(c.client_key == client
                                        for c in tasks[key].who_wants or ())
                   for key in keys)]
    return gone, done


class InnerHolds:
    """Holding the refs inside stored values (a part of ``DistributedBackend``)."""

    lock: threading.Lock
    futures: dict[int, Any]

    def _init_holds(self) -> None:
        self._holds: dict[Any, Hold] = {}  # holder (a key, or an actor result's token)
        self._holds_thread: threading.Thread | None = None
        self._holds_start = threading.RLock()  # (linger may run inside, from a GC)
        self._lingering: deque[tuple[float, list[Any]]] = deque()

    def hold_keys(self, keys: dict[int, str]) -> list[Any]:
        """Futures of ``keys`` of this process's own, the scheduler told at once."""
        from distributed import Future

        client = self.client
        held = [Future(key, client) for key in keys.values()]
        # A Future made from a key only counts locally (see ``_on_borrow``).
        client.loop.add_callback(client._send_to_scheduler, {
            "op": "client-desires-keys", "keys": list(keys.values()), "client": client.id})
        return held

    def hold_inside(self, stored: Any, holder: Any, mode: str, taker: str = "",
                    armed: bool = True) -> None:
        """Hold the objects inside ``stored`` (a WithRefs) under ``holder`` until
        ``mode`` lets them go (see the module docstring); watched at once if ``armed``,
        else once ``_arm_hold`` is called (a put whose ref this process dropped)."""
        held = [self.futures[i] for i in stored.keys if i in self.futures]
        hold = Hold(held, mode, tuple(stored.keys.values()), taker, armed,
                    time.monotonic() + TAKEN_TIMEOUT_S)
        with self.lock:
            self._holds[holder] = hold
        if armed:
            self._start_watching()

    def linger(self, held: list[Any]) -> None:
        """Keep ``held`` (an ended actor call's inner futures) ``LINGER_S`` longer. Runs
        from a finalizer, in any thread: it only appends."""
        self._lingering.append((time.monotonic() + LINGER_S, held))
        self._start_watching()

    def _arm_hold(self, key: Any) -> None:
        """This process dropped its ref to the put ``key``."""
        hold = self._holds.get(key)
        if hold is not None and not hold.armed:
            hold.armed = True
            self._start_watching()

    def _start_watching(self) -> None:
        with self._holds_start:
            if self._holds_thread is None and not self._closed:
                self._holds_thread = threading.Thread(target=self._watch_holds, daemon=True,
                                                      name="lightwork-inner-refs")
                self._holds_thread.start()

    def _watch_holds(self) -> None:
        while not self._closed:
            time.sleep(WATCH_INTERVAL_S)
            now = time.monotonic()
            while self._lingering and self._lingering[0][0] < now:
                self._lingering.popleft()
            with self._holds_start, self.lock:
                armed = [(holder, hold) for holder, hold in self._holds.items() if hold.armed]
                if not armed and not self._lingering:
                    self._holds_thread = None
                    return
            if not armed:
                continue
            outer = tuple(holder for holder, hold in armed if hold.mode == "forgotten")
            taken = tuple((holder, hold.taker, hold.inner_keys) for holder, hold in armed
                          if hold.mode == "taken")
            late = [holder for holder, hold in armed
                    if hold.mode == "taken" and now > hold.deadline]
            try:
                gone, done = self.client.run_on_scheduler(release_facts, outer=outer,
                                                          taken=taken)
            except Exception:  # noqa: BLE001, S112 - the cluster is away: try next time
                continue
            with self.lock:
                for holder in (*gone, *done, *late):
                    self._holds.pop(holder, None)
