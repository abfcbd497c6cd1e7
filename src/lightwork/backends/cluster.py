"""The distributed backend: lightwork's API on a Dask distributed cluster.

Runs on the engine's own scheduler and workers (``dask scheduler`` / ``dask worker``,
dask-jobqueue, dask-kubernetes, ``LocalCluster``): there is no cluster of our own. The
same class serves the driver (a ``Client`` it connects or is given) and, inside a
worker process, the tasks' nested calls (the worker's own client). What runs on the
workers, and the stored forms of values and errors, are in ``cluster_worker.py``.

Objects
-------
An ``ObjectRef`` id maps to a distributed ``Future`` in ``futures`` (one owner: this
backend, under ``lock``). Every object has a key of its own — ``"<task name>-<id hex>"``
— so identical calls are never deduplicated, and the dashboard groups keys by task name.
Ids are ``prefix << 40 | counter`` with a random prefix per process, so any process
mints them without asking anyone. When the process's last ref to an id is gone
(``RefCounter.drain``), its future is dropped — but a task still running keeps its
future until it ends (``_orphans``): a task whose ref was dropped still runs.

Tasks
-----
``submit_task`` pickles the function's arguments itself, replacing each top-level ref by
an ``ArgSlot``, and passes those refs' futures to distributed as dependencies: the engine
resolves top-level refs to values; refs inside containers stay refs (borrowed: see
``cluster_worker``). ``num_returns=k`` is one task returning a tuple and ``k`` small
``pick`` tasks, each with its own key and ref. Retries: ``retry_exceptions`` (by type)
runs again on the worker up to ``max_retries``; a worker lost mid-task is rescheduled by
the scheduler up to its ``distributed.scheduler.allowed-failures`` (3 by default, like
``max_retries``), then the task fails with ``WorkerCrashedError``.

Resources: ``num_cpus`` up to 1 takes one worker thread, as every distributed task does
(no resource restriction, so the engine's fast path and its queuing apply, and a task
blocked in a nested ``get`` secedes and frees its thread, as Ray frees the CPU of a
blocked task). ``num_cpus`` above 1, ``num_gpus`` and ``resources`` become distributed
resource restrictions, which only count resources the workers declared: start them with
``--resources "CPU=n"`` (and ``GPU=``, custom names). A request no worker can meet fails
at submit, naming the resource.

Nested calls
------------
Inside a task, ``get`` and ``wait`` secede from the worker's thread pool while they
block and rejoin after, so a task waiting for its children never holds the slot they
need, even on a cluster of one single-thread worker.

Actors are in ``cluster_actors.py``. Diagnostics: the driver's ``recorder``
(``cluster_record.ClusterLog``) is the event log of the run, filled from the workers'
own stamps; the state API's task listing and summary, ``task_records``, the timeline,
``stack``, the advisor, the Dask-style callbacks and profilers (its task listeners) and
``lightwork.dask.get`` read it. Not done yet on this backend (UnsupportedOnBackend):
actor restarts, generator tasks.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import random
import threading
import time
import uuid
import zlib
from typing import Any

import cloudpickle

from lightwork import exceptions
from lightwork._object_ref import PROCESS_ID_SHIFT, ObjectRef, collecting_refs, ref_counter
from lightwork.backends import cluster_worker
from lightwork.backends.base import Backend
from lightwork.backends.cluster_record import ClusterLog
from lightwork.backends.cluster_worker import ArgSlot, Failed, WithRefs

CLUSTER_EXTRA = "pip install 'lightwork[cluster]'"
BACKEND = "distributed"


def unsupported(feature: str, instead: str) -> exceptions.UnsupportedOnBackend:
    return exceptions.UnsupportedOnBackend(
        f"{feature} is not supported on the {BACKEND} backend: {instead}")


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise ImportError(
            f"connecting to a Dask cluster needs the distributed package: {CLUSTER_EXTRA}"
        ) from exc
    return distributed


_ACTOR_DATASET = "lightwork-actor/"


def _actor_dataset(name: str, namespace: str | None) -> str:
    """The scheduler dataset under which a named actor is published."""
    return f"{_ACTOR_DATASET}{namespace or ''}/{name}"


def _key_name(name: str) -> str:
    """A task name as the first part of a distributed key (the dashboard's group name)."""
    return name.split(".<locals>.")[-1].replace("-", "_") or "task"


class DistributedBackend(Backend):
    """The API on a Dask distributed cluster (see the module docstring)."""

    name = BACKEND

    def __init__(self, client: Any, in_driver: bool, cluster: Any = None,
                 owns_client: bool = False, namespace: str | None = None,
                 event_budget: int = 0) -> None:
        self._client = client  # in a worker: made on first use (get_client)
        self._cluster = cluster  # a LocalCluster this backend started, or None
        self._owns_client = owns_client
        self.in_driver = in_driver
        self.namespace = namespace
        # Not a Node (lightwork.dask and the callbacks need one): the event log of the
        # cluster run, which the state API, timeline, stack and advisor read.
        self.node = None
        self.recorder: ClusterLog | None = (
            ClusterLog(self, event_budget) if in_driver and event_budget else None)
        self.lock = threading.Lock()
        self.futures: dict[int, Any] = {}
        self.keys: dict[int, str] = {}  # keys of refs this process may borrow
        self.task_ids: dict[int, int] = {}
        self._orphans: dict[int, Any] = {}
        self.exported: list[Any] = []  # futures of refs returned inside results
        self._prefix = random.getrandbits(PROCESS_ID_SHIFT - 17) + 1 << PROCESS_ID_SHIFT
        self._ids = itertools.count(1)
        self._shapes: dict[tuple, dict[str, float] | None] = {}
        self._proxies: dict[int, Any] = {}  # actor id -> distributed Actor proxy
        self._killed: dict[int, bool] = {}
        self._seqs: dict[int, int] = {}  # actor id -> next call number from this process
        self._caller = uuid.uuid4().hex  # this process, as a caller of actors
        self._call_borrows: list[tuple[Any, list[Any]]] = []
        self._named: list[str] = []  # named, not detached actors: unpublished at shutdown
        self._closed = False
        ref_counter.on_borrow = self._on_borrow
        ref_counter.on_first_release = None

    # -- lifetime ----------------------------------------------------------------------------
    @classmethod
    def connect(cls, target: Any, *, num_cpus: float | None, num_gpus: float | None,
                resources: dict[str, float], namespace: str | None,
                event_budget: int = 0) -> DistributedBackend:
        """Connect to the cluster ``target`` names (see ``lightwork.backends``)."""
        distributed = _import_distributed()
        if target == "local-cluster":
            workers = int(num_cpus) if num_cpus else os.cpu_count() or 1
            declared = {"CPU": 1.0, **resources}
            if num_gpus:
                raise ValueError("init(address='local-cluster') cannot share GPUs among its "
                                 "single-thread workers; start workers with the dask CLI "
                                 "and --resources 'GPU=n' instead")
            try:
                cluster = distributed.LocalCluster(
                    n_workers=max(1, workers), threads_per_worker=1, processes=True,
                    resources=declared, dashboard_address=None)
            except RuntimeError as exc:
                raise RuntimeError(
                    "init(address='local-cluster') could not start its worker processes "
                    f"({exc}). They start with multiprocessing's spawn, which imports the "
                    "main script again: put the script's top-level code under `if __name__ "
                    "== '__main__':`, or start workers with the dask CLI and pass the "
                    "scheduler's address") from exc
            client = distributed.Client(cluster)
            return cls(client, True, cluster=cluster, owns_client=True, namespace=namespace,
                       event_budget=event_budget)
        if num_cpus is not None or num_gpus is not None or resources:
            raise ValueError(
                "num_cpus, num_gpus and resources describe a runtime lightwork starts; a "
                "cluster's workers declare their own (dask worker --nthreads N --resources "
                "'CPU=N'). Drop them, or use address='local-cluster'")
        if isinstance(target, distributed.Client):
            return cls(target, True, owns_client=False, namespace=namespace,
                       event_budget=event_budget)
        if "://" in target:
            client = distributed.Client(target, timeout=30)
        else:
            client = distributed.Client(scheduler_file=target, timeout=30)
        return cls(client, True, owns_client=True, namespace=namespace,
                   event_budget=event_budget)

    @property
    def client(self) -> Any:
        client = self._client
        if client is None:
            from distributed import get_client

            client = self._client = get_client()
        return client

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        with self.lock:
            if self._closed:
                return
            self._closed = True
            if self.recorder is not None:
                self.recorder.stop()
            self.futures.clear()
            self._orphans.clear()
            self.exported.clear()
        if ref_counter.on_borrow == self._on_borrow:
            ref_counter.on_borrow = None
        for name in self._named:  # a named actor that is not detached ends with its driver
            try:
                self._client.unpublish_dataset(name)
            except Exception:  # noqa: BLE001 - the cluster may be gone already
                pass
        if self._owns_client:
            self._client.close()
        if self._cluster is not None:
            self._cluster.close()

    def address(self) -> str:
        return str(self.client.scheduler.address)

    # -- ids and references ------------------------------------------------------------------
    def next_object_id(self) -> int:
        return self._prefix | next(self._ids)

    def _on_borrow(self, object_id: int) -> None:
        """A ref was unpickled in this process: hold its object while any ref here lives."""
        key = self.keys.get(object_id)
        if key is not None and object_id not in self.futures:
            from distributed import Future

            client = self.client
            self.futures[object_id] = Future(key, client)
            # A Future made from a key only counts locally: tell the scheduler this client
            # wants the key, so it keeps it and reports its state here. From the client's
            # event loop: its batched stream is not woken by a send from another thread.
            client.loop.add_callback(client._send_to_scheduler, {
                "op": "client-desires-keys", "keys": [key], "client": client.id})

    def adopt(self, keys: dict[int, str]) -> None:
        """Learn the keys of refs about to be unpickled here (before they are)."""
        if keys:
            self.keys.update(keys)

    def _drain(self) -> None:
        gone = ref_counter.drain()
        if not gone:
            return
        with self.lock:
            for object_id in gone:
                if ref_counter.holds(object_id):
                    continue
                future = self.futures.pop(object_id, None)
                self.keys.pop(object_id, None)
                self.task_ids.pop(object_id, None)
                if future is not None and not future.done() and hasattr(
                        future, "add_done_callback"):  # (an actor call runs on regardless)
                    # A dropped ref's task still runs: hold its future until it ends.
                    self._orphans[object_id] = future
                    future.add_done_callback(
                        lambda _f, oid=object_id: self._orphans.pop(oid, None))

    def _future_of(self, object_id: int) -> Any:
        future = self.futures.get(object_id)
        if future is None:
            raise exceptions.ReferenceCountingAssertionError(
                f"{object_id:020x}",
                f"object {object_id:020x} is not known to this session of the {BACKEND} "
                "backend: it was freed, or it comes from an earlier session; keep the ref "
                "returned by .remote() or put() and use it within one session")
        return future

    def _keys_of(self, ids: list[int]) -> dict[int, str]:
        futures = self.futures
        return {i: futures[i].key for i in ids if i in futures and futures[i].key is not None}

    def encode(self, value: Any) -> Any:
        """``value`` as stored in the cluster (refs inside it are kept alive by us)."""
        stored = cluster_worker.encode(value, self._keys_of)
        if type(stored) is WithRefs:
            with self.lock:
                self.exported.extend(self.futures[i] for i in stored.keys if i in self.futures)
        return stored

    def decode(self, stored: Any) -> Any:
        """A stored value as the user's value (raising its error if it is one)."""
        kind = type(stored)
        if kind is Failed:
            error = stored.error
            if isinstance(error, exceptions.TaskError):
                raise error.as_instanceof_cause()
            raise error
        if kind is WithRefs:
            self.adopt(stored.keys)
            return cloudpickle.loads(stored.payload)
        return stored

    # -- tasks -------------------------------------------------------------------------------
    def _restrictions(self, spec: Any) -> dict[str, float] | None:
        """The distributed resource restrictions of ``spec``'s shape (None: none)."""
        shape = spec.shape
        try:
            return self._shapes[shape]
        except KeyError:
            pass
        restrictions = {r: a for r, a in shape if a and not (r == "CPU" and a <= 1)}
        if restrictions:
            problem = self._infeasible(restrictions)
            if problem:
                problem = self._infeasible(restrictions, refresh=True)
            if problem:
                raise ValueError(
                    f"task {spec.name} can never be scheduled on this cluster: {problem}. "
                    "Lower its request with .options(), or start workers that declare the "
                    "resource: dask worker --resources 'CPU=4,GPU=1' (distributed counts "
                    "only resources the workers declare)")
        self._shapes[shape] = restrictions or None
        return restrictions or None

    def _infeasible(self, restrictions: dict[str, float], refresh: bool = False) -> str:
        if refresh:
            self._worker_resources = None
        offered = self.worker_resources()
        if any(all(have.get(r, 0.0) >= a for r, a in restrictions.items())
               for have in offered.values()):
            return ""
        for resource, amount in restrictions.items():
            best = max((have.get(resource, 0.0) for have in offered.values()), default=0.0)
            if best < amount:
                return (f"it needs {amount:g} {resource} on one worker, and the most any of "
                        f"the {len(offered)} worker(s) declares is {best:g}")
        return f"no one worker declares all of {restrictions}"

    _worker_resources: dict[str, dict[str, float]] | None = None

    def worker_resources(self) -> dict[str, dict[str, float]]:
        """Each worker's declared resources (cached; refreshed when a request fails)."""
        if self._worker_resources is None:
            workers = self.client.scheduler_info(n_workers=-1)["workers"]
            self._worker_resources = {
                address: {k: float(v) for k, v in (info.get("resources") or {}).items()}
                for address, info in workers.items()}
        return self._worker_resources

    def submit_task(
        self, spec: Any, args: tuple, kwargs: dict, callsite: Any = None
    ) -> list[ObjectRef]:
        self._check_open()
        if spec.runtime_env:
            # A Dask worker runs several tasks in one process: environment variables, the
            # working directory and sys.path set for one task would leak into the others.
            raise unsupported(
                f"a per-task runtime_env ({spec.name})",
                "set the environment on the cluster's workers (dask worker's environment "
                "or a WorkerPlugin), or run the task without runtime_env")
        if spec.stream:
            raise unsupported(
                f"a generator task ({spec.name}, num_returns='streaming')",
                "return a list instead, or set num_returns=k for k values")
        if ref_counter._released:
            self._drain()
        restrictions = self._restrictions(spec)
        deps: list[Any] = []
        futures = self.futures
        dep_tasks: tuple[int, ...] = ()
        if any(type(a) is ObjectRef for a in args) or any(
                type(v) is ObjectRef for v in kwargs.values()):
            dep_tasks = tuple(self.task_ids.get(a.id, 0) for a in (*args, *kwargs.values())
                              if type(a) is ObjectRef)
            args, kwargs = self._slots(args, kwargs, deps)
        with collecting_refs() as contained:
            payload = cloudpickle.dumps((args, kwargs))
        keys = self._keys_of(contained) if contained else None
        task_id = self.next_object_id()
        num_returns = spec.num_returns
        prefix = _key_name(spec.name)
        shape = dict(spec.shape)
        header = (task_id, spec.key, spec.blob, spec.name, payload, keys, max(num_returns, 1),
                  spec.max_retries, spec.retry_exceptions, shape)
        recorder = self.recorder
        if recorder is not None:
            recorder.submitted(task_id, spec.name, callsite, len(payload),
                               num_cpus=shape.get("CPU", 1.0), dep_tasks=dep_tasks)
        client = self.client
        main = client.submit(cluster_worker.run_task, header, *deps, key=f"{prefix}-{task_id:x}",
                             resources=restrictions, pure=False)
        if num_returns <= 1:
            return_futures = [main]
        else:
            return_futures = [
                client.submit(cluster_worker.pick, main, index, pure=False,
                              key=f"{prefix}-{task_id:x}-{index}")
                for index in range(num_returns)]
        if keys:  # hold what the task borrows until it ends
            held = [futures[i] for i in keys]
            main.add_done_callback(lambda _f, held=held: held.clear())
        refs = []
        with self.lock:
            for future in return_futures if num_returns else []:
                object_id = self.next_object_id()
                futures[object_id] = future
                self.task_ids[object_id] = task_id
                refs.append(ObjectRef(object_id))
            if not num_returns:
                self._orphans[task_id] = main
                main.add_done_callback(lambda _f: self._orphans.pop(task_id, None))
        if recorder is not None:
            recorder.returned(task_id, [ref.id for ref in refs], main)
        return refs

    def _slots(self, args: tuple, kwargs: dict, deps: list[Any]) -> tuple[tuple, dict]:
        """Top-level refs replaced by ArgSlots; their futures appended to ``deps``."""

        def slot(value: Any) -> Any:
            if type(value) is not ObjectRef:
                return value
            future = self._future_of(value.id)
            if future.key is None:  # an actor call's result: not in the cluster, pass it
                return self.decode(future.stored(None))
            deps.append(future)
            return ArgSlot(len(deps) - 1)

        return tuple(slot(a) for a in args), {k: slot(v) for k, v in kwargs.items()}

    def cancel(self, object_ids: list[int], force: bool, recursive: bool = True) -> None:
        # recursive: tasks submitted from a task go through the same client; Dask keeps no
        # parent link, so only the named tasks are cancelled here.
        self._check_open()
        futures = [self._future_of(i) for i in object_ids]
        if force:
            running = self._running([f.key for f in futures])
            if running:
                raise unsupported(
                    "cancel(force=True) of a running task",
                    f"distributed cannot stop a task that is running ({running[0]!r}); call "
                    "cancel() without force to stop waiting for it (its get raises "
                    "TaskCancelledError), or let it finish")
        self.client.cancel(futures, force=True)
        if self.recorder is not None:
            self.recorder.cancelled([self.task_ids.get(i, 0) for i in object_ids])

    def _running(self, keys: list[Any]) -> list[Any]:
        def processing(dask_scheduler: Any, keys: list[Any] = keys) -> list[Any]:
            tasks = dask_scheduler.tasks
            return [k for k in keys if k in tasks and tasks[k].state == "processing"]

        return self.client.run_on_scheduler(processing)

    # -- objects -----------------------------------------------------------------------------
    def put(self, value: Any) -> ObjectRef:
        self._check_open()
        if ref_counter._released:
            self._drain()
        object_id = self.next_object_id()
        stored = self.encode(value)
        [future] = self.client.scatter([stored], hash=False)
        with self.lock:
            self.futures[object_id] = future
            self.task_ids[object_id] = 0
            return ObjectRef(object_id)

    def get(self, ids: list[int], timeout: float | None, callsite: Any = None) -> list[Any]:
        self._check_open()
        if ref_counter._released:
            self._drain()
        futures = [self._future_of(i) for i in ids]
        start = time.monotonic()
        try:
            stored = self._blocking(lambda: self._gather(futures, timeout))
        finally:
            if self.recorder is not None:
                self.recorder.blocked("get", start, ids, callsite, self.task_ids.get(ids[0], 0))
        return [self.decode(value) for value in stored]

    def _gather(self, futures: list[Any], timeout: float | None) -> list[Any]:
        from distributed import wait as wait_futures

        try:
            if any(f.key is None for f in futures):
                return self._gather_with_actor_results(futures, timeout)
            if timeout is not None:
                wait_futures(futures, timeout=timeout)
            return self.client.gather(futures)
        except TimeoutError:
            still = sum(1 for f in futures if not f.done())
            raise exceptions.GetTimeoutError(
                f"get timed out after {timeout} s: {still} of {len(futures)} object(s) "
                "not ready. Raise the timeout, or use wait() to take the ready ones "
                "first.") from None
        except BaseException as exc:
            raise self._system_error(exc, futures) from None

    def _gather_with_actor_results(self, futures: list[Any], timeout: float | None) -> list[Any]:
        from distributed import wait as wait_futures

        deadline = None if timeout is None else time.monotonic() + timeout
        cluster = [f for f in futures if f.key is not None]
        if cluster and timeout is not None:
            wait_futures(cluster, timeout=timeout)
        values = iter(self.client.gather(cluster) if cluster else [])
        return [next(values) if f.key is not None else f.stored(
            None if deadline is None else max(0.0, deadline - time.monotonic()))
            for f in futures]

    def _system_error(self, exc: BaseException, futures: list[Any]) -> BaseException:
        """distributed's failure of a future as lightwork's error."""
        from distributed.scheduler import KilledWorker

        if isinstance(exc, concurrent.futures.CancelledError):
            key = getattr(exc, "key", None) or next(
                (f.key for f in futures if f.cancelled()), "?")
            return exceptions.TaskCancelledError(f"task {key} was cancelled")
        if isinstance(exc, KilledWorker):
            key = exc.args[0] if exc.args else "?"
            return exceptions.WorkerCrashedError(
                f"task {key} was running on a worker that died, on every try allowed by "
                "the scheduler (distributed.scheduler.allowed-failures). Look at the "
                "workers' logs for why they died (memory limit, a crash in native code); "
                "if the task uses too much memory, give it more with resources or split it")
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return exc
        return exceptions.RuntimeSystemError(
            f"the {BACKEND} backend could not fetch a result: {type(exc).__name__}: {exc}")

    def wait(self, ids: list[int], num_returns: int, timeout: float | None,
             callsite: Any = None) -> list[int]:
        self._check_open()
        futures = [self._future_of(i) for i in ids]
        ready = [i for i, f in zip(ids, futures) if f.done()]
        if len(ready) < num_returns and timeout != 0:
            event = threading.Event()
            needed = [num_returns - len(ready)]
            count_lock = threading.Lock()

            def hit(_future: Any) -> None:
                with count_lock:
                    needed[0] -= 1
                    if needed[0] <= 0:
                        event.set()

            start = time.monotonic()
            if any(f.key is None for f in futures):  # actor calls: no done callbacks
                self._blocking(lambda: self._poll_until(futures, num_returns, timeout))
            else:
                for future in futures:
                    if not future.done():
                        future.add_done_callback(hit)
                self._blocking(lambda: event.wait(timeout))
            if self.recorder is not None:
                self.recorder.blocked("wait", start, ids, callsite,
                                      self.task_ids.get(ids[0], 0))
            ready = [i for i, f in zip(ids, futures) if f.done()]
        return ready[:num_returns]

    @staticmethod
    def _poll_until(futures: list[Any], num_returns: int, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while sum(1 for f in futures if f.done()) < num_returns:
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(0.002)

    def _blocking(self, call: Any) -> Any:
        """Run ``call``; inside a task, seceded from the worker's pool while it blocks."""
        if self.in_driver or getattr(cluster_worker.current, "task", None) is None:
            return call()
        from distributed import rejoin, secede

        secede()
        try:
            return call()
        finally:
            rejoin()

    def future(self, ref: ObjectRef) -> concurrent.futures.Future[Any]:
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def fetch() -> None:
            try:
                result.set_result(self.get([ref.id], None)[0])
            except BaseException as exc:  # noqa: BLE001 - delivered to the future
                result.set_exception(exc)

        threading.Thread(target=fetch, daemon=True, name="lightwork-future").start()
        return result

    def task_id_of(self, object_id: int) -> int:
        return self.task_ids.get(object_id, 0)

    def _check_open(self) -> None:
        if self._closed:
            raise exceptions.RuntimeSystemError(
                "the lightwork session on the cluster was shut down; call lightwork.init() "
                "to connect again")

    # -- actors (see cluster_actors.py) ---------------------------------------------------
    def create_actor(self, actor: Any, blob: bytes) -> None:
        from lightwork._runtime import serialization
        from lightwork.backends.cluster_actors import ActorHost

        self._check_open()
        namespace = actor.namespace if actor.namespace is not None else self.namespace
        if actor.name is not None and self.driver_request(
                "get_actor", actor.name, namespace) is not None:
            raise ValueError(
                f"an actor named {actor.name!r} already exists in namespace "
                f"{namespace!r}; pick another name, or pass get_if_exists=True")
        if actor.max_restarts:
            raise unsupported("max_restarts", "create the actor again after ActorDiedError")
        args, kwargs = serialization.loads(actor.args)
        if actor.deps:  # top-level refs of the constructor: this backend's own slots
            values = self.get(list(actor.deps), None)
            args = [values[a.index] if type(a) is ArgSlot else a for a in args]
            kwargs = {k: values[v.index] if type(v) is ArgSlot else v
                      for k, v in kwargs.items()}
        with collecting_refs() as contained:
            payload = cloudpickle.dumps((tuple(args), kwargs))
        shape = dict(actor.hold)
        restrictions = {r: a for r, a in shape.items() if a and not (r == "CPU" and a <= 1)}
        if restrictions:
            problem = self._infeasible(restrictions, refresh=True)
            if problem:
                raise ValueError(f"actor {actor.class_name} can never be placed on this "
                                 f"cluster: {problem}")
        header = (actor.actor_id, actor.class_name, blob, payload,
                  self._keys_of(contained) if contained else None, actor.max_concurrency,
                  bool(actor.async_methods))
        future = self.client.submit(
            ActorHost, header, actor=True, pure=False, resources=restrictions or None,
            key=f"{_key_name(actor.class_name)}-{actor.actor_id:x}")
        with self.lock:
            self.futures[actor.actor_id] = future
        if self.recorder is not None:
            self.recorder.actor_created(actor.actor_id, actor.class_name)
        if actor.name is not None:
            # The scheduler's datasets are the cluster's directory: whoever knows the name
            # finds the actor, and a published actor outlives this client (detached).
            entry = (actor.actor_id, actor.class_name, dict(actor.methods), future)
            self.client.publish_dataset(entry, name=_actor_dataset(actor.name, namespace))
            if not actor.detached:
                self._named.append(_actor_dataset(actor.name, namespace))

    def _actor(self, actor_id: int) -> Any:
        """The distributed proxy of the actor, once it exists; ActorDiedError if it is gone."""
        proxy = self._proxies.get(actor_id)
        if proxy is None:
            future = self._future_of(actor_id)
            try:
                proxy = future.result()
            except Exception as exc:  # noqa: BLE001 - its worker died, or it was killed
                raise self._actor_died(actor_id, exc) from None
            self._proxies[actor_id] = proxy
        if self._killed.get(actor_id) or proxy._future is not None and (
                proxy._future.status not in ("finished", "pending")):
            raise self._actor_died(actor_id, None)
        return proxy

    def _actor_died(self, actor_id: int, exc: BaseException | None) -> exceptions.ActorDiedError:
        why = "it was killed" if self._killed.get(actor_id) else (
            f"its worker was lost ({type(exc).__name__}: {exc})" if exc else
            "its worker was lost")
        return exceptions.ActorDiedError(
            f"actor {actor_id:020x} is dead: {why}. Create a new actor to go on "
            "(max_restarts is not supported on the distributed backend)")

    def submit_actor_task(self, actor_id: int, method: str, name: str, args: tuple,
                          kwargs: dict, num_returns: int, callsite: Any = None) -> list[ObjectRef]:
        from lightwork.backends.cluster_actors import ActorResult

        self._check_open()
        if ref_counter._released:
            self._drain()
        tops = [a for a in (*args, *kwargs.values()) if type(a) is ObjectRef]
        if tops:  # resolved here, before the call is sent: its order is kept
            values = iter(self.get([ref.id for ref in tops], None))
            args = tuple(next(values) if type(a) is ObjectRef else a for a in args)
            kwargs = {k: next(values) if type(v) is ObjectRef else v for k, v in kwargs.items()}
        with collecting_refs() as contained:
            payload = cloudpickle.dumps((args, kwargs))
        keys = self._keys_of(contained) if contained else None
        with self.lock:
            seq = self._seqs.get(actor_id, 0)
            self._seqs[actor_id] = seq + 1
        task_id = self.next_object_id()
        if self.recorder is not None:
            self.recorder.submitted(task_id, name, callsite, len(payload), actor_id=actor_id)
        try:
            proxy = self._actor(actor_id)
            call = proxy.call(self._caller, seq, method, name, payload, keys, num_returns,
                              task_id)
        except exceptions.ActorDiedError as died:
            from distributed.actor import EagerActorFuture

            call = EagerActorFuture(Failed(died) if num_returns <= 1
                                    else (Failed(died),) * num_returns)
        if keys:  # hold what the call borrows until it ends (no callback on ActorFuture)
            if len(self._call_borrows) > 64:
                self._call_borrows = [(c, h) for c, h in self._call_borrows if not c.done()]
            self._call_borrows.append((call, [self.futures[i] for i in keys]))
        refs = []
        with self.lock:
            indexes = [None] if num_returns == 1 else list(range(num_returns))
            for index in indexes:
                object_id = self.next_object_id()
                self.futures[object_id] = ActorResult(call, index)
                self.task_ids[object_id] = task_id
                refs.append(ObjectRef(object_id))
        return refs

    def driver_request(self, what: str, *args: Any) -> Any:
        if what == "get_actor":
            name, namespace = args[0], args[1] if args[1] is not None else self.namespace
            entry = self.client.get_dataset(_actor_dataset(name, namespace), default=None)
            if entry is None:
                return None
            actor_id, class_name, methods, future = entry
            with self.lock:
                self.futures.setdefault(actor_id, future)
            return actor_id, class_name, methods
        if what == "kill":
            actor_id = args[0]
            future = self._future_of(actor_id)
            self._killed[actor_id] = True
            for name in self._published_names_of(future):
                self.client.unpublish_dataset(name)
            self.client.cancel([future], force=True)
            return None
        raise unsupported(f"{what!r}", "it is not implemented on this backend; run on the "
                          "embedded runtime (init() with no address)")

    def _published_names_of(self, future: Any) -> list[str]:
        return [name for name in self.client.list_datasets()
                if isinstance(name, str) and name.startswith(_ACTOR_DATASET)
                and getattr(self.client.get_dataset(name)[3], "key", None) == future.key]

    # -- introspection -----------------------------------------------------------------------
    def runtime_context(self) -> dict[str, Any]:
        task = getattr(cluster_worker.current, "task", None)
        if self.in_driver:
            worker_id, node_id = 0, str(self.client.scheduler.address)
        else:
            from distributed import get_worker

            node_id = str(get_worker().address)
            worker_id = zlib.crc32(node_id.encode())
        return {"actor_id": None, "actor_name": None, "job_id": 1,
                "task_id": task[0] if task else None, "worker_id": worker_id,
                "node_id": node_id, "resources": dict(task[2]) if task else {},
                "gpu_ids": (), "namespace": self.namespace, "pid": os.getpid()}

    def resources(self) -> tuple[dict[str, float], dict[str, float]]:
        def usage(dask_scheduler: Any) -> list[tuple[int, dict, dict]]:
            return [(ws.nthreads, dict(ws.resources), dict(ws.used_resources))
                    for ws in dask_scheduler.workers.values()]

        total: dict[str, float] = {"CPU": 0.0}
        available: dict[str, float] = {"CPU": 0.0}
        for nthreads, declared, used in self.client.run_on_scheduler(usage):
            declared = {"CPU": float(nthreads), **declared}
            for name, amount in declared.items():
                total[name] = total.get(name, 0.0) + float(amount)
                free = float(amount) - float(used.get(name, 0.0))
                available[name] = available.get(name, 0.0) + max(0.0, free)
        return total, available

    def nodes(self) -> list[dict[str, Any]]:
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        return [{"NodeID": address, "Alive": True,
                 "Resources": {"CPU": float(info.get("nthreads", 1)),
                               **{k: float(v) for k, v in (info.get("resources") or {}).items()}},
                 "NodeManagerAddress": info.get("host", address)}
                for address, info in workers.items()]
