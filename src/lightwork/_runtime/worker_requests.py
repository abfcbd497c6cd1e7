"""Requests from workers: nested submissions, get/wait from inside tasks, actor calls.

A worker blocked in ``get``/``wait`` lends its CPU back to the pool (``Scheduler.block``)
until the reply is sent; a reply is sent when every object is ready or the timeout fires
(a timer of the I/O loop). Methods of the Node (a mixin), called with its lock held.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightwork import exceptions
from lightwork._runtime import protocol as p
from lightwork._runtime.events import TaskRecord
from lightwork._runtime.lineage import file_exists
from lightwork._runtime.objects import PENDING, READY, ObjectEntry
from lightwork._runtime.scheduler import TaskSpec

if TYPE_CHECKING:
    from lightwork._runtime.node import Node, WorkerConn

    _Base = Node
else:
    _Base = object


class WorkerRequests(_Base):
    """Handlers of the requests a worker sends on behalf of its running task."""

    def _on_worker_submit(self, conn: WorkerConn, message: tuple[Any, ...]) -> None:
        (_, task_id, key, name, args, deps, return_ids, shape, max_retries, retry, actor_id,
         parent) = message
        record = TaskRecord(task_id, name, conn.worker_id, time.monotonic(), arg_size=args.size)
        task = TaskSpec(task_id, key, name, args, deps, return_ids, len(return_ids), shape,
                        max_retries, retry, conn.worker_id, record, actor_id=actor_id,
                        parent=parent)
        for object_id in return_ids:
            self.objects.create(object_id, conn.worker_id, task_id)
            conn.holds.add(object_id)
            conn.owned.add(object_id)
        try:
            if actor_id:
                self.actors.check_room(actor_id)
            self.register_task(task, args.contained)
        except (exceptions.ObjectLostError, exceptions.PendingCallsLimitExceeded) as exc:
            self._fail_task(task, exc)
            return
        if actor_id:
            self.actors.add_call(actor_id, task)
            if self.cancelled_parents and parent in self.cancelled_parents:
                self.actors.cancel_call(task, False)  # as below, for an actor call
        elif self.cancelled_parents and parent in self.cancelled_parents:
            # Its parent was cancelled (recursive) while this submission was on its way.
            self._cancel_task(task, False)

    def _on_worker_call(self, conn: WorkerConn, request_id: int, what: str, args: tuple) -> None:
        """A worker asks the driver to do something only the driver can (actor registry)."""
        try:
            if what == "create_actor":
                actor = args[0]
                actor.owner = conn.worker_id
                self.actors.create(actor)
                conn.holds.add(actor.actor_id)
                conn.owned.add(actor.actor_id)
                result: Any = None
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
            elif what == "room":
                self._on_room_request(conn, request_id, *args)
                return
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
            return ("ok", entry.stored)
        return ("err", entry.error)

    def _on_worker_get(self, conn: WorkerConn, request_id: int, ids: list[int], timeout: Any,
                       context: Any = None) -> None:
        for object_id in ids:
            entry = self.objects.entries.get(object_id)
            stored = entry.stored if entry is not None else None
            # The driver's own mapping does not help a worker: it opens the file by name.
            if stored is not None and stored.path is not None and not file_exists(
                    stored.path, self.store):
                self.recover_lost(entry)
        pending = [e for e in (self.objects.entries.get(i) for i in ids) if e is not None and e.state == PENDING]
        if not pending:
            self._reply(conn, request_id, [self._payload(i) for i in ids])
            return
        actor = conn.actor
        if actor is not None and context is not None:
            deadlock = self.actors.start_wait(actor, (conn.worker_id, request_id), pending,
                                              timeout, context)
            if deadlock:
                self._reply(conn, request_id, ("deadlock", deadlock))
                return
        conn.slot.blocked_in = "get"
        self.scheduler.block(conn.slot)
        state = {"done": False}

        def finish(timed_out: bool) -> None:
            if state["done"]:
                return
            state["done"] = True
            if actor is not None:
                actor.waits.pop((conn.worker_id, request_id), None)
            if not conn.dead:
                self.scheduler.unblock(conn.slot)
            payload = "timeout" if timed_out else [self._payload(i) for i in ids]
            self._reply(conn, request_id, payload)

        countdown = _CallbackCountdown(len(pending), lambda: finish(False))
        for entry in pending:
            entry.add_waiter(countdown.hit)
        if timeout is not None:
            self._add_timer(timeout, lambda: finish(True))

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
        actor = conn.actor
        if actor is not None and context is not None:  # as for get: can it ever return?
            pending = [e for e in (self.objects.entries.get(i) for i in ids)
                       if e is not None and e.state == PENDING]
            deadlock = self.actors.start_wait(actor, (conn.worker_id, request_id), pending,
                                              timeout, context, need=num_returns - len(ready))
            if deadlock:
                self._reply(conn, request_id, ("deadlock", deadlock))
                return
        conn.slot.blocked_in = "wait"
        self.scheduler.block(conn.slot)
        state = {"done": False}

        def finish() -> None:
            if state["done"]:
                return
            state["done"] = True
            if actor is not None:
                actor.waits.pop((conn.worker_id, request_id), None)
            if not conn.dead:
                self.scheduler.unblock(conn.slot)
            self._reply(conn, request_id, ready_ids()[:num_returns])

        countdown = _CallbackCountdown(num_returns - len(ready), finish)
        for object_id in ids:
            entry = self.objects.entries.get(object_id)
            if entry is not None and entry.state == PENDING:
                entry.add_waiter(countdown.hit)
        if timeout is not None:
            self._add_timer(timeout, finish)


class _CallbackCountdown:
    __slots__ = ("remaining", "callback")

    def __init__(self, remaining: int, callback: Callable[[], None]) -> None:
        self.remaining = remaining
        self.callback = callback

    def hit(self, entry: ObjectEntry) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.callback()

