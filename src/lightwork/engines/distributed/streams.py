"""Generator tasks (``num_returns="streaming"``) on the distributed backend.

:class:`Streams` is the backend's ``streams`` component, which owns each open stream's
state (by head id, under the backend's lock) and files the items it consumes in the
backend's object table; and
:func:`run_stream_task`, what such a task runs on its worker.

A streaming task runs :func:`run_stream_task`. It stores each yielded item as a key of
its own (``scatter`` from the worker) and puts that item's future on a distributed
``Queue`` named after the task (the scheduler's queue extension: the queue holds the key
until the caller takes it, so nothing is lost before the caller listens, and an item is
never fetched twice). The queue carries, in order: ``"start"`` (once per run), each
item's future, then ``"end"`` or ``"error"``. The task's own result (its *head*, the
ref behind ``completed()``) is None, or the generator's error, which ``get`` of the head
raises: that is where ``ObjectRefGenerator`` delivers a mid-stream error, after the last
good item.

On the caller's side one thread per open stream (``_consume``) blocks in the queue's
``get`` (on the scheduler: nothing polls) and files each item under a fresh object id
in :class:`StreamState`. ``stream_item(head, index)`` (the backend's) answers from
that state: an item's id, ``"end"``, ``"error"``, or ``"wait"`` with a placeholder
(:class:`ItemSlot`, a future-like entry of ``futures``) that ``wait`` blocks on until
item ``index`` (or the end) arrives. When the task ends without ``"end"``/``"error"``
(its worker lost for good, a cancel), the head's done callback puts ``"head-done"`` on the
queue, so the consumer never waits forever. A retried run starts with ``"start"`` again
and its first items, already delivered, are dropped, as the embedded runtime does.

Dropping the generator releases its head; the stream's state then goes, with the items
not yet read (their keys are released), and the consumer drops what still arrives. The
task runs to its end, as in Ray. ``num_returns="dynamic"`` needs nothing of this: its
function runs inside ``DynamicReturns``, whose ``put`` calls store each item.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightwork.engines.distributed import worker as cluster_worker

if TYPE_CHECKING:
    from lightwork.engines.distributed.backend import DistributedBackend


_QUEUE = "lightwork-stream-"


def _queue_name(task_id: int) -> str:
    return f"{_QUEUE}{task_id:x}"


class ItemSlot:
    """A placeholder ``wait`` blocks on until a stream's next item (or end) arrives."""

    __slots__ = ("arrived", "key")

    def __init__(self) -> None:
        self.arrived: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.key = None  # not a cluster key

    def done(self) -> bool:
        return self.arrived.done()

    def add_done_callback(self, callback: Any) -> None:
        self.arrived.add_done_callback(lambda _arrived: callback(self))

    def stored(self, timeout: float | None) -> Any:
        try:
            return self.arrived.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError from None

    def fill(self) -> None:
        if not self.arrived.done():
            self.arrived.set_result(None)


@dataclass(slots=True, eq=False)
class StreamState:
    """What the caller knows of one streaming task (see the module docstring)."""

    head_id: int
    items: list[int] = field(default_factory=list)  # object ids, in yield order
    ended: str = ""  # "", "end" or "error"
    slots: dict[int, tuple[int, ItemSlot]] = field(default_factory=dict)  # index -> slot
    closed: bool = False  # the generator was dropped


class Streams:
    """Streaming generator tasks: the backend's ``streams`` component. Owns the state of
    each open stream, by head id, under the backend's lock; files the items it consumes
    in the backend's object table."""

    def __init__(self, backend: DistributedBackend) -> None:
        self.backend = backend
        self._streams: dict[int, StreamState] = {}  # head id -> its stream

    def open_stream(self, head_id: int, task_id: int, head: Any) -> None:
        """Start consuming the queue of the streaming task whose head is ``head_id``."""
        from distributed import Queue

        state = StreamState(head_id)
        with self.backend.lock:
            self._streams[head_id] = state
        client = self.backend.client
        queue = Queue(_queue_name(task_id), client=client)
        head.add_done_callback(lambda _head: self._head_done(state, queue))
        # (In a worker, the items are tagged with the session of the task reading them,
        # as that task's own refs are: cluster_worker.SessionFutures.)
        session = getattr(cluster_worker.current, "session", 0)
        threading.Thread(target=self._consume, args=(state, queue, session), daemon=True,
                         name=f"lightwork-stream-{task_id:x}").start()

    @staticmethod
    def _head_done(state: StreamState, queue: Any) -> None:
        if state.ended:  # the usual case: "end" or "error" came first
            return
        try:
            queue.put("head-done")
        except Exception:  # noqa: BLE001 - the session is closing
            pass

    def _consume(self, state: StreamState, queue: Any, session: int = 0) -> None:
        cluster_worker.current.session = session
        delivered_in_run = 0
        while not self.backend.closed:
            try:
                message = queue.get()
            except Exception:  # noqa: BLE001 - the client closed: the session ended
                return
            if message == "start":  # a run begins (again, if it was retried)
                delivered_in_run = 0
                continue
            if isinstance(message, str):  # "end", "error" or "head-done": the last one
                with self.backend.lock:
                    if not state.ended:  # "head-done" first: the task failed outside
                        state.ended = "end" if message == "end" else "error"
                    slots, state.slots = state.slots, {}
                for _id, slot in slots.values():
                    slot.fill()
                self._close_queue(queue)
                return
            delivered_in_run += 1
            with self.backend.lock:
                if state.closed or delivered_in_run <= len(state.items):
                    continue  # dropped by the caller, or delivered by an earlier run
                object_id = self.backend.next_object_id()
                self.backend.futures[object_id] = message
                self.backend.task_ids[object_id] = self.backend.task_ids.get(state.head_id, 0)
                state.items.append(object_id)
                waiting = state.slots.pop(len(state.items) - 1, None)
            if waiting is not None:
                waiting[1].fill()

    @staticmethod
    def _close_queue(queue: Any) -> None:
        try:
            queue.close()
        except Exception:  # noqa: BLE001 - gone already
            pass

    def stream_item(self, head_id: int, index: int) -> tuple[str, int]:
        """The backend's ``stream_item``: see the module docstring."""
        with self.backend.lock:
            state = self._streams.get(head_id)
            if state is None:
                return "end", 0
            if index < len(state.items):
                return "item", state.items[index]
            if state.ended == "error" and index == len(state.items):
                return "error", 0  # the item after the last good one; then the end
            if state.ended:
                return "end", 0
            waiting = state.slots.get(index)
            if waiting is None:
                slot_id = self.backend.next_object_id()
                waiting = state.slots[index] = (slot_id, ItemSlot())
                self.backend.futures[slot_id] = waiting[1]
            return "wait", waiting[0]

    def ref_dropped(self, object_id: int) -> None:
        """The last ref here to ``object_id`` went (lock held): if it was a generator's
        head, its stream closes."""
        if object_id in self._streams:
            self.close_stream(object_id)

    def close_stream(self, head_id: int) -> None:
        """The head's last ref is gone: release the items never read (under ``lock``)."""
        state = self._streams.pop(head_id, None)
        if state is None:
            return
        state.closed = True
        from lightwork.kernel.object_ref import ref_counter

        for object_id in state.items:
            if not ref_counter.holds(object_id):
                self.backend.futures.pop(object_id, None)
                self.backend.task_ids.pop(object_id, None)


def run_stream_task(header: tuple[Any, ...], *dep_values: Any) -> Any:
    """Run a streaming task on its worker: items onto its queue (see the docstring)."""
    from distributed import Queue, get_client

    task_id = header[0]
    client = get_client()
    queue = Queue(_queue_name(task_id), client=client)
    backend = cluster_worker.worker_backend()

    class Feed:
        """Where ``run_task`` sends a generator's runs and items."""

        @staticmethod
        def start() -> None:
            queue.put("start")

        @staticmethod
        def item(value: Any) -> None:
            stored = backend.encode(value)
            [future] = client.scatter([stored], hash=False)
            if type(stored) is cluster_worker.WithRefs:  # held while the item's key lives
                backend.holds.hold_inside(stored, future.key, "forgotten")
            queue.put(future)

    try:
        result = cluster_worker.run_task(header, *dep_values, stream=Feed)
        queue.put("error" if type(result) is cluster_worker.Failed else "end")
    finally:
        queue.close()  # this run's handle (the scheduler drops the queue after the caller's)
    return result
