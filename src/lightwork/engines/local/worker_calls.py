"""The API as seen from inside a task: what a worker does for ``remote``, ``put``,
``get``, ``wait``, actors and the rest (a mixin of :class:`worker.Worker`).

A task may call the API itself. Submissions and puts are one-way messages with ids
minted here; they go at once (``send``), so the driver places a child while its parent
goes on. ``get``/``wait`` send a request and then read the socket until the reply
arrives (``Worker._take_turn``: whichever thread needs the next frame reads it). While
a thread waits, this worker does not start new tasks, so task frames in its inbox are
bounced back for the driver to place elsewhere, and the driver lends this worker's CPU
back to the pool; an actor's calls are never bounced (they can run nowhere else).

Large values a task produces (results, puts, generator items, the arguments of calls
it submits: :class:`SharedMemoryWriter`) are written only after the driver's store
granted room (a ``room`` request, one round trip per value of ``SHARED_MEMORY_MIN`` or
more): they count against the budget before they exist, may make the spiller work
first or fail with ``ObjectStoreFullError``, and may be written over a pooled segment
(already allocated, so no page is allocated or zeroed). Queued tasks are not bounced
while that request waits (it is short).

A task submitted from here carries the running task's id (its parent, for recursive
cancel), inherits its ``runtime_env`` (``runtime_env.py``) and, in a placement group
that captures child tasks, its placement (``placement``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions
from lightwork.kernel.object_ref import ObjectRef
from lightwork.engines.local import protocol as p
from lightwork.kernel import runtime_env
from lightwork.kernel import serialization
from lightwork.engines.local.actor_runners import leave_sigint_to_the_main_thread
from lightwork.engines.local.call_outcomes import error_outcome
from lightwork.kernel.calls import (
    ActorSpec,
    CallSpec,
    pack_retry_exceptions,
    prepare_args,
    warn_actor_unschedulable,
    warn_unschedulable,
)
from lightwork.kernel.resources import captured_shape, describe_amount
from lightwork.kernel.serialization import Stored

if TYPE_CHECKING:
    from lightwork.engines.local.worker_state import WorkerState

    _Base = WorkerState
else:
    _Base = object


#: The shapes this worker has warned of as never schedulable (once each).
_warned_shapes: set[tuple] = set()


class WorkerCalls(_Base):
    """The public API's operations in a worker process."""

    def submit_task(
        self, spec: CallSpec, args: tuple, kwargs: dict, callsite: Any = None
    ) -> list[ObjectRef]:
        if spec.shape not in _warned_shapes:
            for resource, amount in spec.shape:
                have = self.total.get(resource, 0.0)
                # A placement group's resources are newer than this worker's totals: the
                # strategy already checked the bundle, and the driver fails a removed group's.
                if amount > have + 1e-9 and "_group_" not in resource:
                    # Told here, at the user's line; the driver fails its refs
                    # (WorkerRequests._on_worker_submit).
                    _warned_shapes.add(spec.shape)
                    warn_unschedulable("task", spec.name, (
                        f"it needs {describe_amount(resource, amount)} but the runtime has "
                        f"{describe_amount(resource, have)} in total"))
                    break
        shape = spec.shape
        frame = self.current
        # A task or actor in a placement group may capture this one (see placement()).
        parent = (frame[6] if frame is not None else ()) or self.placed_in
        if parent:
            shape = captured_shape(shape, parent)
        task_id = self.next_object_id()
        stored, deps = prepare_args(args, kwargs, SharedMemoryWriter(self, task_id, "a"))
        return_ids = tuple(self.next_object_id() for _ in range(spec.num_returns))
        refs = [ObjectRef(object_id) for object_id in return_ids]
        key, blob = spec.key, spec.blob
        parent_env = runtime_env.inherited()
        if parent_env is not None:  # the running task's runtime_env: the child inherits it
            key, blob = self._payload_in_env(key, blob, parent_env, actor=False)
        if key not in self.sent_functions:
            self.sent_functions.add(key)
            self.outbox.append((p.FUNCTION, key, blob))
            if key not in self.functions:  # the driver may run it here: keep the code
                self.function_blobs[key] = blob
        self.outbox.append((
            p.SUBMIT, task_id, key, spec.name, stored, deps, return_ids, shape,
            spec.max_retries, pack_retry_exceptions(spec.retry_exceptions), 0,
            frame[0] if frame is not None else 0,
        ))
        self.send([])  # now: the driver places it while this task goes on
        return refs

    def placement(self) -> Any:
        """The resource shape the running call was placed with: a task's own, or for an
        actor's call the actor's (its calls carry none); () outside placement groups."""
        frame = self.current
        return (frame[6] if frame is not None else ()) or self.placed_in

    def _payload_in_env(self, key: bytes, blob: bytes, env: runtime_env.Env,
                        actor: bool) -> tuple[bytes, bytes]:
        """(key, blob) of a payload run inside ``env`` (inherited), made once per pair."""
        cache_key = (key, runtime_env.cache_key(env))
        found = self._inherited_payloads.get(cache_key)
        if found is None:
            found = runtime_env.payload_with_env(blob, env, actor=actor)
            if len(self._inherited_payloads) < 256:
                self._inherited_payloads[cache_key] = found
        return found

    def create_actor(self, actor: ActorSpec, blob: bytes) -> None:
        parent = self.placement()
        if parent:  # created by a call that captures its children: in the same group
            actor.place = captured_shape(actor.place, parent)
            if actor.hold:
                actor.hold = captured_shape(actor.hold, parent)
        parent_env = runtime_env.inherited()
        if parent_env is not None:  # the running task's or actor's runtime_env: inherited
            actor.class_key, blob = self._payload_in_env(actor.class_key, blob, parent_env,
                                                         actor=True)
        if actor.class_key not in self.sent_functions:
            self.sent_functions.add(actor.class_key)
            self.outbox.append((p.FUNCTION, actor.class_key, blob))
        problem = self.driver_request("create_actor", actor)
        if problem:  # dead from birth: each of its calls says why (ActorManager.create)
            warn_actor_unschedulable(_warned_shapes, actor, problem)

    def submit_actor_task(
        self, actor_id: int, method: str, name: str, args: tuple, kwargs: dict,
        num_returns: int, callsite: Any = None,
    ) -> list[ObjectRef]:
        task_id = self.next_object_id()
        stored, deps = prepare_args(args, kwargs, SharedMemoryWriter(self, task_id, "a"))
        return_ids = tuple(self.next_object_id() for _ in range(num_returns))
        refs = [ObjectRef(object_id) for object_id in return_ids]
        frame = self.current
        self.outbox.append((p.SUBMIT, task_id, method, name, stored, deps, return_ids, (), 0,
                            False, actor_id, frame[0] if frame is not None else 0))
        self.send([])
        return refs

    def driver_request(self, what: str, *args: Any) -> Any:
        self.send([])
        kind, result = self.request((p.CALL, what, *args))
        if kind == "err":
            raise result
        return result

    def get(self, ids: list[int], timeout: float | None, callsite: Any = None) -> list[Any]:
        self.send([])
        # A task's get says where it is called too (the advisor names that line).
        context = self._wait_context(callsite) if self.actor_id else (
            (False, None, callsite) if callsite else None)
        reply = self.request((p.GET, ids, timeout, context))
        if reply == "timeout":
            raise exceptions.GetTimeoutError(
                f"get timed out after {timeout} s waiting for {len(ids)} object(s)")
        if type(reply) is tuple:  # ("deadlock", message)
            raise exceptions.ActorDeadlockError(reply[1])
        values = []
        for kind, payload in reply:
            if kind == "ok":
                values.append(serialization.loads(payload))
                continue
            error = serialization.loads(payload) if isinstance(payload, Stored) else payload
            if isinstance(error, exceptions.TaskError):
                raise error.as_instanceof_cause()
            raise error
        return values

    def wait(
        self, ids: list[int], num_returns: int, timeout: float | None, callsite: Any = None
    ) -> list[int]:
        self.send([])
        context = self._wait_context(callsite) if self.actor_id else None
        reply = self.request((p.WAIT, ids, num_returns, timeout, context))
        if type(reply) is tuple:  # ("deadlock", message), as for get
            raise exceptions.ActorDeadlockError(reply[1])
        return reply

    def _wait_context(self, callsite: Any) -> tuple[bool, str | None, Any]:
        """What lets the driver tell a get/wait in an actor that can never return
        (``actors.py``): on the event loop?, the calling method, the call site."""
        on_loop = self.loop is not None and threading.current_thread() is self.loop.thread
        return (on_loop, self.current[2] if self.current else None, callsite)

    def cancel(self, ids: list[int], force: bool, recursive: bool = True) -> None:
        if force:  # a request, so its refusal (force on an actor's call) reaches the caller
            self.driver_request("cancel", ids, True, recursive)
            return
        self.send([(p.CANCEL, ids, force, recursive)])

    def future(self, ref: ObjectRef) -> Any:
        import concurrent.futures

        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def fetch() -> None:
            leave_sigint_to_the_main_thread()
            try:
                value = self.get([ref.id], None)[0]
            except BaseException as exc:  # noqa: BLE001 - delivered to the future
                if future.set_running_or_notify_cancel():
                    future.set_exception(exc)
                return
            # The caller may have given up on it (an asyncio.wait_for that timed out
            # cancels the future): a cancelled future takes no result.
            if future.set_running_or_notify_cancel():
                future.set_result(value)

        threading.Thread(target=fetch, daemon=True).start()
        return future

    def task_id_of(self, object_id: int) -> int:
        return self.driver_request("task_id_of", object_id)

    def runtime_context(self) -> dict[str, Any]:
        frame = self.current
        return {
            "actor_id": f"{self.actor_id:020x}" if self.actor_id else None,
            "actor_name": self.actor_name,
            "job_id": self.job_id,
            "task_id": frame[0] if frame else None,
            "worker_id": self.worker_id,
            "node_id": self.node_id,
            "resources": dict(self.placement()),
            "gpu_ids": frame[7] if frame else self.actor_gpu_ids,
            "namespace": None,
            "pid": os.getpid(),
        }

    def resources(self) -> tuple[dict[str, float], dict[str, float]]:
        """The node's (total, available) now, as the driver sees them (as in Ray, a
        task sees the cluster's, its own reservation taken)."""
        total, available = self.driver_request("resources")
        return dict(total), dict(available)

    def put(self, value: Any) -> ObjectRef:
        object_id = self.next_object_id()
        stored = serialization.serialize(value, SharedMemoryWriter(self, object_id))
        ref = ObjectRef(object_id)
        self.send([(p.PUT, object_id, stored)])
        return ref

    def put_error(self, exc: BaseException) -> ObjectRef:
        """An object that raises ``exc`` (as the running task's error) on ``get``: the
        last item of a num_returns="dynamic" generator that raised, as in Ray."""
        object_id = self.next_object_id()
        frame = self.current
        error = error_outcome(frame[2] if frame is not None else "(unknown task)", exc)
        self.send([(p.PUT, object_id, None, error)])
        return ObjectRef(object_id)

    def request(self, message: tuple[Any, ...], bounce: bool = True) -> Any:
        """Send a GET/WAIT/CALL request and wait for its reply, bouncing queued tasks
        (unless ``bounce`` is False: a short request that keeps this worker's queue).
        An actor's calls are never bounced: they can run nowhere else, and the driver
        ignores the BOUNCE of one (such a call was lost, and its get hung)."""
        request_id = next(self._requests)
        bounced: list[tuple[Any, ...]] = []
        bounce = bounce and self.bounce_when_waiting
        if bounce:
            with self._cond:
                self._waiting += 1
                bounced = [(p.BOUNCE, m[1][0]) for m in self.inbox if m[0] == p.TASK]
                self.inbox = deque(m for m in self.inbox if m[0] != p.TASK)
        try:
            self.send(bounced + [(message[0], request_id, *message[1:])])
            return self._take_turn(lambda: self.replies.pop(request_id, None))
        finally:
            if bounce:
                with self._cond:
                    self._waiting -= 1
            if self.outbox:
                self.send([])

    def room(self, size: int, path: str) -> tuple[str, bool]:
        """Ask the driver's store for room to write ``size`` bytes (see the module
        docstring): returns where to write, and whether it is a recycled segment."""
        self.send([])
        kind, result = self.request((p.CALL, "room", size, path), bounce=False)
        if kind == "err":
            try:
                raise result
            finally:  # no cycle through this frame: the task's frames (and refs) free at once
                del result
        return result


class SharedMemoryWriter:
    """Where a worker writes a large value (a ``serialization.SegmentWriter``): room is
    granted by the driver first (``Worker.room``). ``prefix`` "a" names the arguments of
    a call this worker submits (the driver's ``_on_worker_submit`` takes them over)."""

    __slots__ = ("object_id", "prefix", "worker")

    def __init__(self, worker: WorkerState, object_id: int, prefix: str = "") -> None:
        self.worker = worker
        self.object_id = object_id
        self.prefix = prefix

    def write(self, data: bytes, raws: list[memoryview]) -> str:
        worker = self.worker
        size = serialization.layout(data, raws).total
        path, recycled = worker.room(size, f"{worker.shm_dir}/{self.prefix}{self.object_id:x}")
        try:
            serialization.write_segment(path, data, raws, recycled)
        except BaseException:
            with contextlib.suppress(Exception):  # the write's own error is the one to report
                worker.driver_request("unreserve", path)
            raise
        return path
