"""The backend interface: what the public API asks of whatever runs its tasks.

``lightwork._api`` validates every call, then hands it to the process's backend, an
instance of a :class:`Backend` subclass. Two implementations:

* ``local`` (:mod:`lightwork.backends.local`): the embedded runtime of ``_runtime/`` (the
  driver's ``Node``, or, inside one of its worker processes, the ``Worker``);
* ``distributed`` (:mod:`lightwork.backends.distributed`): a Dask distributed cluster.

As with httpx's ``BaseTransport``, the interface is a handful of methods, each documented
here; a backend overrides them all. Ids are plain ints (``ObjectRef.id``); values cross
the interface as Python objects, never as frames. The API has already checked the
arguments (types, ranges, duplicates), so a backend checks only what it alone can know
(is this resource request possible on this cluster?).

A feature the engine cannot provide raises :class:`~lightwork.exceptions.UnsupportedOnBackend`
naming the feature, the backend and what to do instead; a backend never silently does
something else.

Diagnostics read ``node``: the driver-side record of the run (event log ``log``, task
table ``tasks``, the ``lock`` guarding them, the ``advisor``). It is None where there is
none (inside a worker process).
"""

from __future__ import annotations

import abc
import concurrent.futures
from typing import Any

from lightwork._object_ref import ObjectRef


class Backend(abc.ABC):
    """What runs this process's tasks. Subclasses implement every method below (they are
    abstract: a backend that misses one cannot be made)."""

    #: "local" or "distributed": what ``lightwork.backend()`` returns.
    name: str = ""
    #: The driver-side runtime state the diagnostics read, or None (see the module doc).
    node: Any = None
    #: False in a worker process: there the API serves a task's nested calls, and
    #: init/shutdown belong to the driver.
    in_driver: bool = True

    # -- lifetime ------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once shut down (the API then starts a new default backend on demand)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release everything this backend started. Safe to call twice."""

    @abc.abstractmethod
    def address(self) -> str:
        """Where it runs: "local", or the cluster's scheduler address."""

    # -- tasks -----------------------------------------------------------------------------
    @abc.abstractmethod
    def submit_task(
        self, spec: Any, args: tuple, kwargs: dict, callsite: Any = None
    ) -> list[ObjectRef]:
        """Start one task of ``spec`` (a ``_runtime.calls.CallSpec``: function key and
        pickled code, name, resource shape, num_returns, retries); return its
        ``spec.num_returns`` refs. Top-level ref arguments are resolved to values before
        the function runs; refs inside containers stay refs (borrowed)."""

    @abc.abstractmethod
    def cancel(self, object_ids: list[int], force: bool, recursive: bool = True) -> None:
        """Cancel the tasks making ``object_ids``; their ``get`` raises TaskCancelledError.

        ``recursive``: also cancel the tasks they submitted that are still pending or
        running (and theirs), as Ray does by default; a backend that cannot says so."""

    # -- objects ---------------------------------------------------------------------------
    @abc.abstractmethod
    def next_object_id(self) -> int:
        """A fresh object id, unique across every process of the session."""

    @abc.abstractmethod
    def put(self, value: Any) -> ObjectRef:
        """Store ``value``; return its ref."""

    @abc.abstractmethod
    def get(self, ids: list[int], timeout: float | None, callsite: Any = None) -> list[Any]:
        """The values of ``ids`` in order, blocking up to ``timeout`` seconds
        (GetTimeoutError). A task's error is raised as ``TaskError.as_instanceof_cause()``;
        a runtime failure as its own error type. ``callsite`` is the user's (file, line,
        function), for the event log."""

    @abc.abstractmethod
    def wait(self, ids: list[int], num_returns: int, timeout: float | None,
             callsite: Any = None) -> list[int]:
        """Up to ``num_returns`` ready ids, in input order, once that many are ready or
        ``timeout`` passed (``0``: only look). ``ids`` are unique."""

    @abc.abstractmethod
    def future(self, ref: ObjectRef) -> concurrent.futures.Future[Any]:
        """A future completed with the value of ``ref`` (or its error)."""

    @abc.abstractmethod
    def task_id_of(self, object_id: int) -> int:
        """The id of the task that makes ``object_id`` (0 for a ``put``)."""

    # -- actors ----------------------------------------------------------------------------
    @abc.abstractmethod
    def create_actor(self, actor: Any, blob: bytes) -> None:
        """Start the actor described by ``actor`` (a ``_runtime.actors.Actor``: id, class
        key, constructor arguments, resources, name, restarts, concurrency); ``blob`` is
        its pickled class. Returns at once; calls queue until it is up."""

    @abc.abstractmethod
    def submit_actor_task(self, actor_id: int, method: str, name: str, args: tuple,
                          kwargs: dict, num_returns: int, callsite: Any = None) -> list[ObjectRef]:
        """Queue a call of ``method`` on the actor; calls from one caller run in order."""

    @abc.abstractmethod
    def driver_request(self, what: str, *args: Any) -> Any:
        """A named request to the session's directory: ``("get_actor", name, namespace)``
        returns ``(actor_id, class_name, methods)`` or None; ``("kill", actor_id,
        no_restart)``. A backend raises UnsupportedOnBackend for a request it cannot do."""

    # -- introspection ---------------------------------------------------------------------
    @abc.abstractmethod
    def runtime_context(self) -> dict[str, Any]:
        """Facts about the caller: job_id, task_id, worker_id, node_id, actor_id,
        actor_name, resources, gpu_ids, namespace, pid (see ``RuntimeContext``)."""

    @abc.abstractmethod
    def resources(self) -> tuple[dict[str, float], dict[str, float]]:
        """(total, available) resources of the whole runtime or cluster."""

    @abc.abstractmethod
    def nodes(self) -> list[dict[str, Any]]:
        """One entry per machine (Ray's ``nodes()``)."""
