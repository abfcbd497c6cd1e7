"""What the parts of a worker share, declared for the type checker only.

:class:`worker.Worker` is one object made of mixins, each owning one side of the worker
(``worker_calls``, ``worker_results``, ``worker_cancels``, ``worker_exit``; the task loop
and the call's execution are ``worker.py``'s own). They read and set the same state,
all of it made in ``Worker.__init__``. Each mixin subclasses :class:`WorkerState` under
``TYPE_CHECKING`` (``object`` at run time, so nothing is added to a lookup), which names
that state and the methods one part calls on another. ``Worker`` cannot be their base:
it subclasses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import itertools
    import threading
    from collections import deque
    from typing import Any

    from lightwork.engines.local.actor_runners import AsyncRunner, CallPool

    class WorkerState:
        """The worker's state and cross-part methods (see the module docstring)."""

        _cond: threading.Condition
        _inherited_payloads: dict[tuple[bytes, str], tuple[bytes, bytes]]
        _requests: itertools.count[int]
        _waiting: int
        actor: Any
        actor_gpu_ids: tuple[int, ...]
        actor_id: int
        actor_name: str | None
        bounce_when_waiting: bool
        function_blobs: dict[bytes, bytes]
        functions: dict[bytes, Any]
        job_id: int
        loop: AsyncRunner | None
        node_id: str
        outbox: deque[tuple[Any, ...]]
        placed_in: Any  # the actor's place shape: a group its calls may capture
        pool: CallPool | None
        replies: dict[int, Any]
        sent_functions: set[bytes]
        total: dict[str, float]
        worker_id: int
        inbox: deque[tuple[Any, ...]]
        shm_dir: str
        # the cancels read (worker_cancels.py)
        cancel_path: str
        cancel_signals: int
        _signals_read: int
        _cancel_offset: int
        cancelled_ids: set[int]
        # the worker's end (worker_exit.py)
        exiting: bool
        retiring: bool
        exit_call: int
        actor_started: bool
        _exit_lock: threading.Lock
        _exit_thread: threading.Thread | None

        @property
        def current(self) -> tuple[Any, ...] | None: ...
        def next_object_id(self) -> int: ...
        def send(self, messages: list[tuple[Any, ...]]) -> None: ...
        def _take_turn(self, done: Any) -> Any: ...
        def driver_request(self, what: str, *args: Any) -> Any: ...
        def room(self, size: int, path: str) -> tuple[str, bool]: ...
