"""The backend interface: what the API asks of whatever runs its tasks.

``lightwork.api.core`` validates every call, then hands it to the process's backend, an
instance of a :class:`Backend` subclass that :func:`lightwork.engines.open_backend`
made. Two engines implement it:

* ``local`` (:mod:`lightwork.engines.local`): the embedded runtime (the driver's
  ``Node``, or, inside one of its worker processes, the ``Worker``);
* ``distributed`` (:mod:`lightwork.engines.distributed`): a Dask distributed cluster.

As with httpx's ``BaseTransport``, the interface is a handful of methods in plain types,
each documented here. Ids are plain ints (``ObjectRef.id``); values cross the interface
as Python objects, never as frames; a session starts from a :class:`SessionOptions`, an
actor from a :class:`~lightwork.kernel.calls.ActorSpec`. The API has already checked the
arguments (types, ranges, duplicates), so a backend checks only what it alone can know
(is this resource request possible on this cluster?).

A feature the engine cannot provide raises :class:`~lightwork.exceptions.UnsupportedOnBackend`
naming the feature, the backend and what to do instead; a backend never silently does
something else.

Diagnostics read the run's record (:meth:`Backend.run_record`, a
:class:`~lightwork.kernel.run.RunRecord`): the event log, the task table, the lock
guarding them, the advisor, the control server, and the record's typed questions about
the engine's parts. It is None where there is none (inside a worker process).

The process's backend is the API's; code below the API reaches it through
:func:`current`, :func:`install` and :func:`installed`, which the API connects when it
loads (:func:`connect_api`), so the kernel names no layer above it.
"""

from __future__ import annotations

import abc
import concurrent.futures
from typing import TYPE_CHECKING, Any, NamedTuple

from collections.abc import Callable
from dataclasses import dataclass

from lightwork.kernel.object_ref import ObjectRef

if TYPE_CHECKING:
    from lightwork.kernel.calls import ActorSpec
    from lightwork.kernel.run import RunRecord

# The process's backend is owned by the API floor (``lightwork.api.core``); it hands the
# kernel three functions when it loads (:func:`connect_api`), so code below the API
# reaches that backend without naming a layer above it.
_resolve: Callable[..., Backend] | None = None
_install: Callable[[Backend], None] | None = None
_installed: Callable[[], Backend | None] | None = None


def connect_api(resolve: Callable[..., Backend], install: Callable[[Backend], None],
                installed: Callable[[], Backend | None]) -> None:
    """``resolve(uses)``: the backend, starting the default one if none runs;
    ``install(backend)``: route this process's calls to ``backend`` (a worker's);
    ``installed()``: the backend now installed, or None, starting nothing."""
    global _resolve, _install, _installed
    _resolve, _install, _installed = resolve, install, installed


def _api_loaded() -> None:
    if _resolve is None:
        raise RuntimeError("lightwork's API is not loaded: import lightwork first")


def current(uses: tuple[object, ...] = ()) -> Backend:
    """The backend running this process's calls, starting the default one if none does."""
    _api_loaded()
    assert _resolve is not None
    return _resolve(uses)


def install(backend: Backend) -> None:
    """In an engine's worker process: route this process's API calls to ``backend``."""
    _api_loaded()
    assert _install is not None
    _install(backend)


def installed() -> Backend | None:
    """The backend installed in this process, if any (starts nothing)."""
    _api_loaded()
    assert _installed is not None
    return _installed()


class ActorInfo(NamedTuple):
    """What a backend knows of a live actor by name."""

    actor_id: int
    class_name: str
    methods: dict[str, int | str]


#: exit_actor() outside an actor (the words Ray's tests match come first).
NOT_IN_AN_ACTOR = (
    "exit_actor API is called on a non-actor worker (the driver or a task): call "
    "exit_actor() inside an actor's method to end that actor; to end an actor from "
    "outside, use kill(handle) or handle.__ray_terminate__.remote()")


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """What ``init`` asked of a new session, checked by the API (an engine checks only
    what it alone knows). ``None`` means "the engine's default"."""

    num_cpus: float | None = None
    num_gpus: float | None = None
    resources: dict[str, float] | None = None
    namespace: str | None = None
    #: Task records the event log keeps; 0 turns it off (and the advisor with it).
    event_budget: int = 200_000
    advisor: bool = True
    #: The user's (file, line, function) of the ``init`` call, for the advisor's findings.
    init_callsite: Any = None
    #: The job-wide runtime_env, normalized (``kernel.runtime_env.normalize``).
    runtime_env: dict[str, Any] | None = None
    object_store_memory: int | None = None
    spill_dir: str | None = None
    #: Ray's ``_memory``: the node's ``memory`` resource, in bytes.
    memory: float | None = None
    memory_usage_threshold: float | None = None
    memory_monitor_refresh_ms: float | None = None
    #: Ray's ``log_to_driver``: print what tasks write, labelled, on the driver's terminal.
    log_to_driver: bool = True
    #: What ``breakpoint()`` in a worker starts: "pdb" (``lightwork debug`` attaches) or
    #: "debugpy" (an editor attaches); see ``kernel/debugger.py``.
    debugger: str = "pdb"
    #: A call that raises pauses in the debugger before its error is sent.
    post_mortem: bool = False


class Backend(abc.ABC):
    """What runs this process's tasks. Subclasses implement every method below (they are
    abstract: a backend that misses one cannot be made)."""

    #: "local" or "distributed": what ``lightwork.backend()`` returns.
    name: str = ""
    #: The embedded runtime's driver ``Node``, or None: the API delivers its advisor's
    #: warnings from it (one attribute read per call); tools use :meth:`run_record`.
    node: Any = None
    #: False in a worker process: there the API serves a task's nested calls, and
    #: init/shutdown belong to the driver.
    in_driver: bool = True
    #: True when the session must end before Python stops its thread pools at exit
    #: (an engine whose client runs on them).
    ends_before_thread_pools: bool = False

    # -- the run's record, for the diagnostics -------------------------------------------
    def run_record(self, session: bool = False) -> RunRecord | None:
        """The driver-side record of the run the diagnostics read (``kernel.run``), or
        None (a worker, or the event log is off). ``session``: the record the state API
        reads, which answers even with the event log off."""
        return self.node

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
        """Start one task of ``spec`` (a ``kernel.calls.CallSpec``: function key and
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
    def create_actor(self, actor: ActorSpec, blob: bytes) -> None:
        """Start the actor ``actor`` describes (id, class key, constructor arguments,
        resources, name, restarts, concurrency); ``blob`` is its pickled class. Returns at once; calls queue until it is up."""

    @abc.abstractmethod
    def submit_actor_task(self, actor_id: int, method: str, name: str, args: tuple,
                          kwargs: dict, num_returns: int, callsite: Any = None) -> list[ObjectRef]:
        """Queue a call of ``method`` on the actor; calls from one caller run in order."""

    @abc.abstractmethod
    def find_actor(self, name: str, namespace: str | None) -> ActorInfo | None:
        """The live actor named ``name`` in ``namespace`` (None: the session's), or None."""

    @abc.abstractmethod
    def kill_actor(self, actor_id: int, no_restart: bool) -> None:
        """End the actor's process now; its pending and later calls raise ActorDiedError."""

    # -- placement groups --------------------------------------------------------------
    @abc.abstractmethod
    def create_placement_group(self, group_id: int, group_hex: str, name: str,
                               bundles: list[dict[str, float]], strategy: str) -> None:
        """Reserve ``bundles`` (checked by the API) as group ``group_id``; returns at once,
        the reservation is made when the resources are free. A backend that reserves
        nothing ahead of tasks raises UnsupportedOnBackend."""

    @abc.abstractmethod
    def remove_placement_group(self, group_id: int) -> None:
        """Release the group's reservation; its tasks fail with TaskPlacementGroupRemoved."""

    @abc.abstractmethod
    def placement_group_table(self) -> dict[str, dict[str, Any]]:
        """Every group of the session by hex id: bundles, strategy, state, name."""

    # -- streaming generators --------------------------------------------------------------
    @abc.abstractmethod
    def stream_item(self, head_id: int, index: int) -> tuple[str, Any]:
        """Item ``index`` of the generator task whose head ref is ``head_id``:
        ``("item", id)`` (its ref), ``("wait", id)`` (not yet: a ref that becomes ready
        when it comes), ``("error", None)`` (the head raises the task's error) or
        ``("end", None)``."""

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

    # -- inside a task -----------------------------------------------------------------
    def put_error(self, exc: BaseException) -> ObjectRef:
        """A ref whose ``get`` raises ``exc`` (a dynamic generator's last item). Only a
        task can make one: elsewhere the error is raised to the caller."""
        raise exc

    def minted_before_session(self, object_id: int) -> bool:
        """Whether ``object_id`` was made by an earlier session of this process (so a
        ref, handle or group carrying it is stale). False where the engine cannot tell."""
        return False

    def actor_loop(self) -> Any:
        """The running async actor's event loop runner, or None (not in an async actor)."""
        return None

    def is_canceled(self) -> bool:
        """Whether ``cancel()`` was called on the running task (False where the engine
        keeps no cancel flags). RuntimeError where the question has no answer."""
        return False

    def exit_actor(self) -> None:
        """End the running actor after its current method returns (raises to unwind)."""
        raise TypeError(NOT_IN_AN_ACTOR)
