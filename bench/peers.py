"""The peers the benchmark compares, behind one small interface.

Every workload in ``workloads.py`` talks to a :class:`Peer` and nothing else, so a
figure is measured by the same code for every runtime. The interface is the part of
Ray's core API the figures need:

    load()      import the runtime (timed apart from start-up)
    start()     bring up 4 worker slots                     ~ ray.init(num_cpus=4)
    submit()    run ``fn(*args)`` somewhere, return a handle ~ f.remote(*args)
    get()       wait for a list of handles, return values  ~ ray.get([...])
    put()       store a value once, return a handle         ~ ray.put(value)
    shutdown()  stop everything                            ~ ray.shutdown()

and, for the actor figures:

    start_actor(cls)        start an actor, return its handle   ~ Cls.remote()
    call(actor, "m", *a)    call a method, return a handle      ~ actor.m.remote(*a)
    ready(handles, timeout) how many handles have a value       ~ ray.wait(...)

A handle from ``call`` goes to ``get`` like any other. Actors are dropped by
dropping their handles, as the Ray lessons do.

Lightwork and Ray have the same module API, so one adapter (:class:`RayApiPeer`)
serves both; only the ``init`` keywords differ. Dask and ``concurrent.futures`` get
thin adapters. A peer without a concept raises :class:`NotSupported`, which the
harness reports as "n/a" rather than as a failure: ``concurrent.futures`` has no
actors, and a Dask actor is an object living in a worker process (its calls run on
that worker's actor thread), not a process of its own, so it has no per-actor
memory figure (``actors_have_processes``).

:class:`SerialPeer` is not a runtime: it runs each task at submit time in the
driver, giving the "plain Python loop" baseline for the sleep figure.

Each peer runs in its own fresh subprocess (see ``run.py``), so an adapter may assume
it is the only runtime in its process.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

WORKER_SLOTS = 4


class NotSupported(Exception):
    """The peer has no such concept (e.g. ``put`` for a process pool): report n/a."""


class Peer(ABC):
    """One runtime under test, with ``WORKER_SLOTS`` worker slots."""

    name: str
    #: False for the serial baseline: there is no runtime to start, stop or measure.
    has_runtime: bool = True
    #: Whether each actor runs in a process of its own (Ray's model).
    actors_have_processes: bool = True

    @abstractmethod
    def load(self) -> None:
        """Import the runtime's modules."""

    @abstractmethod
    def start(self) -> None:
        """Start the runtime with ``WORKER_SLOTS`` worker slots."""

    @abstractmethod
    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Schedule ``fn(*args)``; return a handle for :meth:`get`."""

    @abstractmethod
    def get(self, handles: Sequence[Any]) -> list[Any]:
        """Block until every handle has a value; return the values in order."""

    def put(self, value: Any) -> Any:
        """Store ``value`` once; the handle can be passed to :meth:`submit`."""
        raise NotSupported(f"{self.name} has no object store (no put)")

    def start_actor(self, cls: type) -> Any:
        """Start an actor of ``cls`` (no arguments); return its handle at once."""
        raise NotSupported(f"{self.name} has no actors")

    def call(self, actor: Any, method: str, *args: Any) -> Any:
        """Call ``actor.method(*args)``; return a handle for :meth:`get`."""
        raise NotSupported(f"{self.name} has no actors")

    def ready(self, handles: Sequence[Any], timeout: float) -> int:
        """Wait up to ``timeout`` seconds for every handle; return how many have a value."""
        raise NotSupported(f"{self.name} cannot wait with a timeout")

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the runtime and its worker processes."""

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Versions of the packages that make up this peer."""


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed as a distribution)"


class RayApiPeer(Peer):
    """Any module with Ray's core API: ``lightwork`` or ``ray`` itself."""

    def __init__(self, name: str, module: str, init_kwargs: dict[str, Any]) -> None:
        self.name = name
        self._module_name = module
        self._init_kwargs = init_kwargs
        self._api: Any = None
        # ``remote(fn)`` once per function or actor class: Ray registers (pickles and
        # exports) it when it is wrapped, and we time calls, not registrations.
        self._remote_fns: dict[Callable[..., Any], Any] = {}

    def load(self) -> None:
        self._api = importlib.import_module(self._module_name)

    def start(self) -> None:
        self._api.init(**self._init_kwargs)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        remote_fn = self._remote_fns.get(fn)
        if remote_fn is None:
            remote_fn = self._remote_fns[fn] = self._api.remote(fn)
        return remote_fn.remote(*args)

    def get(self, handles: Sequence[Any]) -> list[Any]:
        return list(self._api.get(list(handles)))

    def put(self, value: Any) -> Any:
        return self._api.put(value)

    def start_actor(self, cls: type) -> Any:
        actor_cls = self._remote_fns.get(cls)
        if actor_cls is None:
            actor_cls = self._remote_fns[cls] = self._api.remote(cls)
        return actor_cls.remote()

    def call(self, actor: Any, method: str, *args: Any) -> Any:
        return getattr(actor, method).remote(*args)

    def ready(self, handles: Sequence[Any], timeout: float) -> int:
        done, _ = self._api.wait(list(handles), num_returns=len(handles), timeout=timeout)
        return len(done)

    def shutdown(self) -> None:
        self._api.shutdown()

    def versions(self) -> dict[str, str]:
        version = getattr(self._api, "__version__", None) or _dist_version(self._module_name)
        return {self._module_name: str(version)}


class _DaskActor:
    """A Dask actor being created: the creation future, then the proxy to call."""

    __slots__ = ("future", "proxy")

    def __init__(self, future: Any) -> None:
        self.future = future
        self.proxy: Any = None

    def resolve(self) -> Any:
        # ``submit(cls, actor=True)`` gives a future of the proxy; waiting for it here,
        # on the first call, lets many actors be created at once (submit all, then call).
        if self.proxy is None:
            self.proxy = self.future.result()
        return self.proxy


class DaskPeer(Peer):
    """``distributed.LocalCluster`` with 4 single-threaded worker processes."""

    name = "dask"
    actors_have_processes = False

    def __init__(self) -> None:
        self._distributed: Any = None
        self._actor_future: Any = None
        self._cluster: Any = None
        self._client: Any = None

    def load(self) -> None:
        self._distributed = importlib.import_module("distributed")
        self._actor_future = importlib.import_module("distributed.actor").BaseActorFuture

    def start(self) -> None:
        dist = self._distributed
        self._cluster = dist.LocalCluster(
            n_workers=WORKER_SLOTS,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
        self._client = dist.Client(self._cluster)
        # Dask warns when a large array travels inside a task; that is exactly what the
        # by-value figure measures, so the warning is noise here.
        warnings.filterwarnings("ignore", message=r"(?s).*(large graph|[Ll]arge object)")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        # pure=False: otherwise identical calls share one key and Dask runs them once.
        return self._client.submit(fn, *args, pure=False)

    def get(self, handles: Sequence[Any]) -> list[Any]:
        if handles and all(isinstance(h, self._actor_future) for h in handles):
            # Actor calls return ActorFutures, which ``gather`` does not take.
            return [h.result() for h in handles]
        return list(self._client.gather(list(handles)))

    def start_actor(self, cls: type) -> Any:
        return _DaskActor(self._client.submit(cls, actor=True, pure=False))

    def call(self, actor: Any, method: str, *args: Any) -> Any:
        return getattr(actor.resolve(), method)(*args)

    def ready(self, handles: Sequence[Any], timeout: float) -> int:
        # ActorFutures have no ``wait``; they are few and cheap to poll.
        deadline = time.perf_counter() + timeout
        while True:
            done = sum(1 for h in handles if h.done())
            if done == len(handles) or time.perf_counter() >= deadline:
                return done
            time.sleep(0.01)

    def put(self, value: Any) -> Any:
        # hash=False: ray.put does not hash the data either; hashing 160 MB is not
        # part of "store it once".
        return self._client.scatter(value, hash=False)

    def shutdown(self) -> None:
        self._client.close()
        self._cluster.close()

    def versions(self) -> dict[str, str]:
        return {"dask": _dist_version("dask"), "distributed": _dist_version("distributed")}


class FuturesPeer(Peer):
    """``concurrent.futures.ProcessPoolExecutor(4)`` with the platform's start method."""

    name = "futures"

    def __init__(self) -> None:
        self._pool: Any = None

    def load(self) -> None:
        importlib.import_module("concurrent.futures")

    def start(self) -> None:
        from concurrent.futures import ProcessPoolExecutor

        self._pool = ProcessPoolExecutor(WORKER_SLOTS)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._pool.submit(fn, *args)

    def get(self, handles: Sequence[Any]) -> list[Any]:
        return [future.result() for future in handles]

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    def versions(self) -> dict[str, str]:
        import multiprocessing
        import platform

        return {
            "python": platform.python_version(),
            "start_method": multiprocessing.get_start_method(allow_none=False),
        }


class SerialPeer(Peer):
    """Runs each task immediately in the driver: the plain-Python baseline."""

    name = "serial"
    has_runtime = False

    def load(self) -> None:
        pass

    def start(self) -> None:
        pass

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def get(self, handles: Sequence[Any]) -> list[Any]:
        return list(handles)

    def shutdown(self) -> None:
        pass

    def versions(self) -> dict[str, str]:
        import platform

        return {"python": platform.python_version()}


def _quiet_ray_kwargs() -> dict[str, Any]:
    return {
        "num_cpus": WORKER_SLOTS,
        "include_dashboard": False,
        "logging_level": logging.ERROR,
        "log_to_driver": False,
    }


#: Environment for a peer's subprocess, on top of the harness's own.
PEER_ENV: dict[str, dict[str, str]] = {
    # No usage-stats prompt or upload attempt, and no log deduplication messages.
    "ray": {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"},
}


def lightwork_peer(**init_kwargs: Any) -> Peer:
    """Lightwork started with ``init(num_cpus=4, **init_kwargs)``; the cost figures use
    ``event_budget=0`` and ``advisor=False`` to measure what the defaults cost."""
    return RayApiPeer("lightwork", "lightwork", {"num_cpus": WORKER_SLOTS, **init_kwargs})


def make_peer(name: str) -> Peer:
    """The adapter for one peer name (see ``PEERS``)."""
    if name == "lightwork":
        return lightwork_peer()
    if name == "ray":
        return RayApiPeer("ray", "ray", _quiet_ray_kwargs())
    if name == "dask":
        return DaskPeer()
    if name == "futures":
        return FuturesPeer()
    if name == "serial":
        return SerialPeer()
    raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEERS)}")


#: Runtimes compared column by column, lightwork first.
PEERS: tuple[str, ...] = ("lightwork", "ray", "dask", "futures")
#: Baselines that only run some figures.
BASELINES: tuple[str, ...] = ("serial",)

__all__ = [
    "BASELINES",
    "PEERS",
    "PEER_ENV",
    "NotSupported",
    "Peer",
    "lightwork_peer",
    "make_peer",
]
