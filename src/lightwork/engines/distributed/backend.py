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
future until it ends (``orphans``): a task whose ref was dropped still runs.

Dropped refs are applied (``_drain``) at the next call into the backend, and from the
client's event loop, woken by the first one queued since the last drain
(``RefCounter.on_first_release``): a ref can go while no lightwork call runs and none may
follow. In a worker it is let go by a user's thread, the cycle collector, or the
worker's profiler, which holds the frames of a running task for a moment each 10 ms and
so may free a ``put``'s argument after the task's last drain (drained only at the next
call, that object would stay wanted by the worker's client for good). In the driver, a
program that drops a big ``put`` and then computes on its own, or waits for input, would
keep it in the cluster's memory until its next call (the local runtime's I/O thread
frees it at once too).

Where the rest lives
--------------------
``DistributedBackend`` is the coordinator of components, each owning the state it
changes, with its design in its module's docstring:

* ``tasks`` (``tasks.TaskSubmission``): submission, resources, retries and recovery,
  cancel, put; it owns the shapes, the workers' resources and the lineages;
* ``fetch`` (``fetch.Fetching``): get, wait, futures; no state of its own;
* ``actors`` (``actor_calls.ActorCalls``, with ``actor_restarts``): the caller's side of
  actors, the actor directory of this process (proxies, owned actors, restarts, call
  order, names);
* ``holds`` (``holds.InnerHolds``): the refs inside stored values, held while those live;
* ``streams`` (``streams.Streams``): generator tasks' streams;
* ``replies`` (``replies.Replies``, in the driver): the listener for the small results
  the workers send straight to it, and the table of those awaited.

The backend itself owns what they all read: the client, the session's lifetime, id
minting and the object table (``futures``, ``keys``, ``task_ids``, ``orphans``,
``exported_by_key``, the borrows), and the one ``lock`` under which every component
changes its state (one lock, as before the split: the event loop's callbacks and the
callers' threads take it, and no code holds it while it waits for the loop). A
component reaches another only through the backend's attribute for it and that
component's methods; the backend implements the ``Backend`` interface by handing each
call to the component that owns it. When a ref's last holder goes, ``_drain`` tells
each component through its ``ref_dropped`` (and ``holds`` through ``holding`` and
``arm_hold``). The actor's side, on a worker, is ``actors`` (``ActorHost``); what runs
on the workers, and the stored forms of values and errors, are in ``worker``.

Diagnostics: the driver's ``session_log`` (``record.ClusterLog``, the run's
``kernel.run.RunRecord``, which the tools read and nothing else of the backend) is the
event log of the run, filled from the workers' own stamps (``recorder``, what the task
path stamps, is the same log, or None with ``event_budget=0``); the state API
(``cluster_state``), ``task_records``, the timeline, ``stack``, the advisor, the
Dask-style callbacks and profilers (its task listeners), ``lightwork.dask.get``, the
``lightwork`` command from another terminal (``cluster_control``) and the live
dashboard (``cluster_dashboard``) read it. Tasks lost with their worker are heard from
the scheduler plugin ``cluster_plugin.TaskErrors`` (see ``cluster_tasks``).

Where a call's time goes
------------------------
A synchronous ``get(f.remote())`` crosses these hops, in order (``bench/cluster_hops.py``
times each from the scheduler's and the worker's own transitions):

1. client to scheduler: ``Client.submit`` hands the task to the client's event loop,
   which queues it on the client's batched stream. That stream sends a message at once
   if nothing went in its last interval, else at the interval's end. In a loop of sync
   calls the previous call's result is released just before the next submission (its
   ref dies as ``get`` returns, and the drain runs on the event loop at once), so the
   release opens an interval that the submission then waits out: with distributed's
   10 ms, that wait was most of a sync call on a quiet machine. The backend sets the
   stream of every client it uses to ``CLIENT_STREAM_INTERVAL_S`` (2 ms; a stream made
   again after a reconnect has distributed's own). The rest of the hop is the hand-off
   to the event loop and the scheduler's reading of the graph.
2. scheduler: unpickling the graph and placing the task, a small part.
3. scheduler to worker: the scheduler's own batched stream to that worker (5 ms) and
   the link. It is the cluster's, shared by every client, so it is left as it is.
4. run: the worker's event loop hands the task to a pool thread and takes it back, and
   ``run_task`` loads the arguments, runs, and stamps the event log.
5. worker to scheduler: the worker's batched stream (2 ms) and the link again.
6. scheduler to client: the key-in-memory report.
7. fetch: the client asks the scheduler for the value, and the scheduler fetches it
   from the worker: two more crossings of the link, the costliest hop of a small
   result. Gathering from the worker directly saves no crossing (it asks the
   scheduler where the key is first) and measured no quicker.

So a small result would cross the worker's link three times after it is made, where
Ray's owner receives it with the task's reply, once; hops 3, 5 and 7 are what a cluster
of real hosts adds, and batching intervals the scheduler and workers own set hops 3 and
5. The worker therefore also sends a small result straight to the driver that submitted
the task (``replies``: a listener in the driver, which every worker reaches as it
reaches the scheduler), and ``get`` takes it from there: hops 5 to 7 leave a sync
call's path, while the scheduler still hears of the end through them (it frees the
task's resources, feeds its dependents, counts its retries). What is left is hops 1 to 4
and one crossing back. Large values take other routes: arguments go straight to a worker
(``tasks``, *Large arguments*); a large result stays on its worker, where dependents
read it worker to worker, and the driver fetches it as in 7 (two crossings).

A batch of tasks is not bound by the hops but by CPU: the hops of many tasks overlap,
and what is left is each part's work per task. distributed's scheduler and workers spend
about 2 ms of CPU on a no-op task between them (the scheduler's transitions and its
streams; the worker's event loop, state machine and pool-thread hand-off), the
driver's submit and gather half a millisecond, and on a machine of few cores their sum
over the cores is the floor a batch reaches (``bench/cluster_cpu.py`` measures it by
process). The backend's own share is the reply a worker sends (under a tenth of its
work) and the driver's encoding and event log; the rest is the engine's, which a
driver cannot change.

Which distributed: ``cluster_compat`` checks at connect (and in each worker) that the
installed one has the few private parts the backend relies on, and names the supported
range if not.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import random
import threading
import time
import zlib
from typing import Any

import cloudpickle

from lightwork.kernel import exceptions
from lightwork.kernel.object_ref import (
    PROCESS_ID_SHIFT,
    ObjectRef,
    ended_session_message,
    keep_out_of_band,
    ref_counter,
)
from lightwork.engines.distributed import compat as cluster_compat
from lightwork.engines.distributed import worker as cluster_worker
from lightwork.kernel.backend import ActorInfo, Backend, SessionOptions
from lightwork.kernel.environ import DEFAULT_RETRY_DELAY_MS, retry_delay_from_env
from lightwork.engines.distributed.actor_calls import ActorCalls, ActorResult
from lightwork.engines.distributed.fetch import Fetching
from lightwork.engines.distributed.holds import InnerHolds
from lightwork.engines.distributed import replies as replies_module
from lightwork.engines.distributed.record import ClusterLog
from lightwork.engines.distributed.replies import Replies
from lightwork.engines.distributed.streams import Streams
from lightwork.engines.distributed.tasks import TaskSubmission
from lightwork.engines.distributed.worker import BACKEND, Failed, WithRefs, unsupported

__all__ = ["CLUSTER_EXTRA", "DistributedBackend", "unsupported"]

CLUSTER_EXTRA = "pip install 'lightwork[cluster]'"
def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise ImportError(
            f"connecting to a Dask cluster needs the distributed package: {CLUSTER_EXTRA}"
        ) from exc
    cluster_compat.check(distributed)  # before anything starts: a clear error, not a late one
    return distributed


#: The id prefixes of this process's ended driver sessions: a ref or handle of one says its
#: session ended (``SessionEndedError``, as on the local runtime), where an unknown id of
#: the current session is a ref counting error. A few ints per session for good.
_ENDED_SESSIONS: set[int] = set()
#: How long a task or actor call waits, at most, for the scheduler to know of the keys it
#: borrowed (``DistributedBackend.confirm_borrows``); milliseconds, normally.
BORROW_CONFIRM_S = 10.0
#: The longest a message waits on this process's client stream to the scheduler, in
#: seconds (distributed's own is 10 ms: see *Where a call's time goes*).
CLIENT_STREAM_INTERVAL_S = 0.002
#: How long closing a ``local-cluster`` waits for its workers to silence their logs.
QUIET_WORKERS_WAIT_S = 2.0


def _quiet_distributed_logs() -> None:
    """Run on a worker of a closing ``local-cluster``: see ``_quiet_own_cluster``."""
    logging.getLogger("distributed").setLevel(logging.CRITICAL)


def _not_yet_wanted(dask_scheduler: Any = None, keys: list[Any] = (),  # type: ignore[assignment]
                    client: str = "") -> list[Any]:
    """Run on the scheduler: those of ``keys`` it holds but not yet for ``client``."""
    tasks = dask_scheduler.tasks
    missing = []
    for key in keys:
        task = tasks.get(key)
        if task is not None and not any(
                wanter.client_key == client for wanter in task.who_wants or ()):
            missing.append(key)
    return missing


def _no_placement_groups() -> Exception:
    return unsupported(
        "placement groups (placement_group())",
        "distributed reserves no resources ahead of tasks; declare resources on the "
        "workers (dask worker --resources 'CPU=n,name=1') and ask for them per task "
        "and actor (num_cpus=, resources=), or run on the embedded runtime (init() "
        "with no address)")


def _worker_pids(client: Any) -> dict[str, int]:
    """Each worker's process id, by address (one round trip; none if it cannot ask)."""
    try:
        return client.run(os.getpid, on_error="ignore")
    except Exception:  # noqa: BLE001 - a cluster that cannot answer fails on the next call
        return {}


class DistributedBackend(Backend):
    """The API on a Dask distributed cluster (see the module docstring): the coordinator
    of its components, and the owner of the object table and the lock they share."""

    name = BACKEND

    def __init__(self, client: Any, in_driver: bool, cluster: Any = None,
                 owns_client: bool = False, namespace: str | None = None,
                 event_budget: int = 0,
                 retry_delay_s: float = DEFAULT_RETRY_DELAY_MS / 1000.0) -> None:
        self._client = client  # in a worker: made on first use (get_client)
        self._cluster = cluster  # a LocalCluster this backend started, or None
        self._owns_client = owns_client
        self.in_driver = in_driver
        self.namespace = namespace
        # The wait before a retry for retry_exceptions, which every task carries to its
        # worker (a task's own submissions carry that task's: cluster_worker.current).
        self.retry_delay_s = retry_delay_s
        # No Node: the run's record (``kernel.run.RunRecord``) is the driver's session
        # log of the cluster run, which the state API, timeline, stack, advisor, the
        # dashboard and the `lightwork` command read. It serves the command even with event_budget=0, as a
        # local session does; ``recorder`` (what the task path stamps) is it only while
        # the event log is on, so with the log off the task path stamps nothing.
        self.node = None
        self.session_log: ClusterLog | None = (
            ClusterLog(self, event_budget) if in_driver else None)
        self.recorder: ClusterLog | None = self.session_log if event_budget else None
        if self.session_log is not None:
            self.session_log.serve()  # the `lightwork` command from another terminal
        self.lock = threading.Lock()
        # In a worker, each entry is tagged with its driver session (for the listings).
        self.futures: dict[int, Any] = {} if in_driver else cluster_worker.SessionFutures()
        self.keys: dict[int, str] = {}  # keys of refs this process may borrow
        self.task_ids: dict[int, int] = {}
        self.orphans: dict[int, Any] = {}
        # The refs inside a task's single result, by its key: released with it
        # (cluster_plugin.ExportedRefs); inside other stored values: cluster_holds.
        self.exported_by_key: dict[Any, cluster_worker.Exported] = {}
        # The components (see the module docstring), each owning its own state.
        self.holds = InnerHolds(self)
        self.tasks = TaskSubmission(self)
        self.fetch = Fetching(self)
        self.actors = ActorCalls(self)
        self.streams = Streams(self)
        # The driver's listener for small results sent by the workers (cluster_replies).
        self.replies: Replies | None = None
        if in_driver and client is not None and replies_module.PUSH_MAX > 0:
            host = replies_module.listen_host(client)
            if host is not None:
                self.replies = Replies(self, host, replies_module.PUSH_MAX)
        # (object id, key) of the refs the running task or call borrowed, per thread:
        # confirm_borrows waits until the scheduler knows of them.
        self._borrowing = threading.local()
        self._prefix = random.getrandbits(PROCESS_ID_SHIFT - 17) + 1 << PROCESS_ID_SHIFT
        self._ids = itertools.count(1)
        if client is not None:
            self._watch_client(client)
        if in_driver and client is not None:
            from lightwork.engines.distributed.plugin import ExportedRefs, TaskErrors
            from lightwork.engines.distributed.tasks import check_allowed_failures

            def close_what_init_opened() -> None:  # before refusing the cluster
                if owns_client:
                    client.close()
                if cluster is not None:
                    cluster.close()

            if os.getpid() in _worker_pids(client).values():
                close_what_init_opened()
                raise RuntimeError(cluster_worker.WORKER_IN_DRIVER)
            try:  # (idempotent: a driver before this one may have installed it)
                client.register_plugin(TaskErrors(), name=TaskErrors.name)
            except Exception as exc:  # said plainly, with what to do
                close_what_init_opened()
                raise RuntimeError(
                    f"the Dask scheduler at {client.scheduler.address} could not load "
                    f"lightwork's scheduler plugin ({type(exc).__name__}: {exc}); install "
                    "lightwork (the same version) where the scheduler runs") from exc
            client.register_plugin(ExportedRefs(), name=ExportedRefs.name)
            check_allowed_failures(client)  # warns once if each loss is not one try
        self.debugging: Any = None  # the driver's ClusterDebugging, once open() made it
        self.output_forwarding: Any = None  # its ClusterOutput, once open() made it
        self.output: Any = None  # that one's DriverOutput (get and wait settle it)
        self._closed = False
        ref_counter.on_borrow = self._on_borrow
        ref_counter.on_first_release = self._drain_soon
        ref_counter.on_out_of_band = keep_out_of_band  # a ref the user pickled is kept

    # -- the interface's calls, each carried by the component that owns it ----------------
    def submit_task(self, spec: Any, args: tuple, kwargs: dict,
                    callsite: Any = None) -> list[ObjectRef]:
        return self.tasks.submit_task(spec, args, kwargs, callsite)

    def cancel(self, object_ids: list[int], force: bool, recursive: bool = True) -> None:
        self.tasks.cancel(object_ids, force, recursive)

    def put(self, value: Any) -> ObjectRef:
        return self.tasks.put(value)

    def put_error(self, exc: BaseException) -> ObjectRef:
        return self.tasks.put_error(exc)

    def get(self, ids: list[int], timeout: float | None, callsite: Any = None) -> list[Any]:
        return self.fetch.get(ids, timeout, callsite)

    def wait(self, ids: list[int], num_returns: int, timeout: float | None,
             callsite: Any = None) -> list[int]:
        return self.fetch.wait(ids, num_returns, timeout, callsite)

    def future(self, ref: ObjectRef) -> concurrent.futures.Future[Any]:
        return self.fetch.future(ref)

    def create_actor(self, actor: Any, blob: bytes) -> None:
        self.actors.create_actor(actor, blob)

    def submit_actor_task(self, actor_id: int, method: str, name: str, args: tuple,
                          kwargs: dict, num_returns: int,
                          callsite: Any = None) -> list[ObjectRef]:
        return self.actors.submit_actor_task(actor_id, method, name, args, kwargs,
                                             num_returns, callsite)

    def exit_actor(self) -> None:
        self.actors.exit_actor()

    def stream_item(self, head_id: int, index: int) -> tuple[str, Any]:
        return self.streams.stream_item(head_id, index)

    # -- lifetime ----------------------------------------------------------------------------
    ends_before_thread_pools = True

    def run_record(self, session: bool = False) -> ClusterLog | None:
        return self.session_log if session else self.recorder

    def find_actor(self, name: str, namespace: str | None) -> ActorInfo | None:
        found = self.actors.find(name, namespace)
        return None if found is None else ActorInfo(*found)

    def kill_actor(self, actor_id: int, no_restart: bool) -> None:
        self.actors.kill(actor_id)  # (a killed actor is never restarted here)

    def create_placement_group(self, group_id: int, group_hex: str, name: str,
                               bundles: list[dict[str, float]], strategy: str) -> None:
        raise _no_placement_groups()

    def remove_placement_group(self, group_id: int) -> None:
        raise _no_placement_groups()

    def placement_group_table(self) -> dict[str, dict[str, Any]]:
        raise _no_placement_groups()

    @classmethod
    def open(cls, target: Any, options: SessionOptions) -> DistributedBackend:
        """A new session on the cluster ``target`` names, with ``init``'s options."""
        if (options.runtime_env is not None or options.object_store_memory is not None
                or options.spill_dir):
            raise unsupported(
                "init()'s runtime_env, object_store_memory and spilling options",
                "the cluster's workers have their own environment and memory settings "
                "(dask worker --memory-limit, --preload); pass runtime_env per task "
                "with .options() only on the embedded runtime")
        backend = cls.connect(
            target, num_cpus=options.num_cpus, num_gpus=options.num_gpus,
            resources=options.resources or {}, namespace=options.namespace,
            event_budget=options.event_budget)
        try:
            backend.start_output(options.log_to_driver)
            backend.start_debugging(options.debugger, options.post_mortem)
        except BaseException:
            backend.shutdown()
            raise
        return backend

    def start_output(self, echo: bool) -> None:
        """Workers' output on this driver's terminal (``cluster_output``); ``echo``:
        ``init(log_to_driver=)``."""
        from lightwork.engines.distributed.output import ClusterOutput

        self.output_forwarding = ClusterOutput(self, echo)
        self.output = self.output_forwarding.output
        if self.session_log is not None:
            self.session_log.output = self.output

    def start_debugging(self, kind: str, post_mortem: bool) -> None:
        """The in-task debugger for this driver session's calls (``cluster_debugging``)."""
        from lightwork.engines.distributed.debugging import ClusterDebugging

        assert self.session_log is not None
        self.debugging = ClusterDebugging(self, kind, post_mortem)
        self.session_log.debugging = self.debugging
        self.session_log.pauses = self.debugging.pauses

    @classmethod
    def connect(cls, target: Any, *, num_cpus: float | None, num_gpus: float | None,
                resources: dict[str, float], namespace: str | None,
                event_budget: int = 0) -> DistributedBackend:
        """Connect to the cluster ``target`` names (see ``lightwork.engines``)."""
        distributed = _import_distributed()
        retry_delay_s = retry_delay_from_env()  # (a bad setting refused before any start)
        if target == "local-cluster":
            workers = int(num_cpus) if num_cpus else os.cpu_count() or 1
            declared = {"CPU": 1.0, **resources}
            if num_gpus:
                raise ValueError("init(address='local-cluster') cannot share GPUs among its "
                                 "single-thread workers; start workers with the dask CLI "
                                 "and --resources 'GPU=n' instead")
            import dask

            try:
                # Each lost worker is one of a task's max_retries (see cluster_tasks).
                with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
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
                       event_budget=event_budget, retry_delay_s=retry_delay_s)
        if num_cpus is not None or num_gpus is not None or resources:
            raise ValueError(
                "num_cpus, num_gpus and resources describe a runtime lightwork starts; a "
                "cluster's workers declare their own (dask worker --nthreads N --resources "
                "'CPU=N'). Drop them, or use address='local-cluster'")
        if isinstance(target, distributed.Client):
            return cls(target, True, owns_client=False, namespace=namespace,
                       event_budget=event_budget, retry_delay_s=retry_delay_s)
        if "://" in target:
            client = distributed.Client(target, timeout=30)
        else:
            client = distributed.Client(scheduler_file=target, timeout=30)
        return cls(client, True, owns_client=True, namespace=namespace,
                   event_budget=event_budget, retry_delay_s=retry_delay_s)

    @property
    def client(self) -> Any:
        client = self._client
        if client is None:
            from distributed import get_client

            client = self._client = get_client()
            self._watch_client(client)
        return client

    def _watch_client(self, client: Any) -> None:
        import distributed

        cluster_compat.check(distributed)  # (in a worker: the first check of this process)
        self.tasks.watch_task_errors(client)
        # The client's batched stream to the scheduler (see *Where a call's time goes*).
        stream: Any = getattr(client, "scheduler_comm", None)
        if stream is not None and getattr(stream, "interval", 0) > CLIENT_STREAM_INTERVAL_S:
            stream.interval = CLIENT_STREAM_INTERVAL_S

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        with self.lock:
            if self._closed:
                return
            self._closed = True
        if self.in_driver:  # its refs and handles now say their session ended
            _ENDED_SESSIONS.add(self._prefix)
        # Not under the lock: stopping waits on the event loop, whose callbacks (an
        # actor call's reply, a failed key) take the lock.
        if self.debugging is not None:  # its calls still paused quit on the workers
            self.debugging.stop()
        if self.output_forwarding is not None:  # the workers' last lines, then no more
            self.output_forwarding.stop()
        quieted = self._quiet_own_cluster() if self._cluster is not None else None
        if self.session_log is not None:
            self.session_log.stop()
        if self.replies is not None:
            self.replies.close()
        with self.lock:
            self.futures.clear()
            self.orphans.clear()
            self.exported_by_key.clear()
            self.holds.clear()
        if ref_counter.on_borrow == self._on_borrow:
            ref_counter.on_borrow = None
        if ref_counter.on_first_release == self._drain_soon:
            ref_counter.on_first_release = None
        if ref_counter.on_out_of_band is keep_out_of_band:
            ref_counter.on_out_of_band = None
            ref_counter.pinned.clear()
        reachable = getattr(self._client, "status", "running") == "running"
        if reachable:
            self.actors.unpublish_names()
        if self._owns_client:
            self._client.close()
        if self._cluster is not None:
            self._cluster.close()
        if quieted is not None:
            logging.getLogger("distributed").setLevel(quieted)

    def _quiet_own_cluster(self) -> int:
        """The local cluster ``init`` started is about to close, and the program's work in
        it with it: its processes' reports of that (each cancelled task, a worker killed
        when the nanny's 4 s wait ran out, a broadcast to a closed actor) are what the
        user asked for, not trouble, and filled the terminal at every exit. Silenced in
        the workers and, until it is closed, here (where its scheduler and nannies log);
        returns the level to restore."""
        previous = logging.getLogger("distributed").level
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
        if getattr(self._client, "status", "") == "running":
            # Waited for QUIET_WORKERS_WAIT_S at most: a worker whose task holds the GIL in
            # C code answers late, and the shutdown must not wait for it.
            quieting = threading.Thread(target=self._quiet_workers, daemon=True,
                                        name="lightwork-quiet-workers")
            quieting.start()
            quieting.join(QUIET_WORKERS_WAIT_S)
        return previous

    def _quiet_workers(self) -> None:
        try:
            self._client.run(_quiet_distributed_logs)
        except Exception:  # noqa: BLE001, S110 - a worker may be gone: it says nothing
            pass

    def address(self) -> str:
        return str(self.client.scheduler.address)

    # -- ids and references ------------------------------------------------------------------
    @property
    def session_tag(self) -> int:
        """The driver session a submission belongs to, which tags the workers' stamps
        (``cluster_record``: each driver pulls only its own): the driver's id prefix; in
        a worker, that of the task or actor call running in this thread."""
        if self.in_driver:
            return self._prefix
        return getattr(cluster_worker.current, "session", 0)

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
            if not self.in_driver:  # the task or actor call borrowing it confirms it
                borrowed = getattr(self._borrowing, "pairs", None)
                if borrowed is None:
                    borrowed = self._borrowing.pairs = []
                borrowed.append((object_id, key))

    def confirm_borrows(self) -> None:
        """Before a task or an actor call that borrowed refs returns: wait until the
        scheduler knows this process wants each borrowed key it still holds.

        The want goes on the client's stream when the ref is unpickled, while the call's
        end reaches the caller by another path (an actor call's reply comes straight from
        this worker); the caller then drops its own hold on the refs it passed, and the
        scheduler, getting that first, could free an object this process had kept (an
        actor storing a ref passed inside a list, say).
        One read of the scheduler's state per call that borrowed (``_not_yet_wanted``);
        read-only, so a key this process let go of meanwhile is never wanted again by
        mistake."""
        pairs = getattr(self._borrowing, "pairs", None)
        if not pairs:
            return
        self._borrowing.pairs = []
        client = self.client
        deadline = time.monotonic() + BORROW_CONFIRM_S
        while True:
            keys = [key for object_id, key in pairs if object_id in self.futures]
            if not keys:
                return
            try:
                missing = set(client.run_on_scheduler(_not_yet_wanted, keys=keys,
                                                      client=client.id))
            except Exception:  # noqa: BLE001 - the scheduler is away: calls will say so
                return
            pairs = [(object_id, key) for object_id, key in pairs if key in missing]
            if not pairs or time.monotonic() > deadline:
                return
            time.sleep(0.002)

    def adopt(self, keys: dict[int, str]) -> None:
        """Learn the keys of refs about to be unpickled here (before they are)."""
        if keys:
            self.keys.update(keys)

    def _drain_soon(self) -> None:
        """A dropped ref was queued, maybe outside any call (see the module docstring).
        Applied from the event loop, since this runs wherever the ref died, inside a
        ``__del__``, perhaps while this thread holds ``lock`` (no code holds ``lock``
        while it waits for the loop: the loop's callbacks take it)."""
        client = self._client  # (none yet: no future in this process to drop)
        if client is None or self._closed:
            return
        try:
            client.loop.add_callback(self._drain)
        except RuntimeError:  # the loop is closed: the worker is going away
            pass

    def _drain(self) -> None:
        gone = ref_counter.drain()
        if not gone:
            return
        dropped_puts = []  # of values with refs inside: their holds are watched now
        with self.lock:
            for object_id in gone:
                if ref_counter.holds(object_id):
                    continue
                future = self.futures.pop(object_id, None)
                self.keys.pop(object_id, None)
                self.actors.ref_dropped(object_id)  # the last handle here to an actor?
                if self.holds.holding(getattr(future, "key", None)):
                    dropped_puts.append(future.key)
                self.streams.ref_dropped(object_id)  # a generator: its unread items go
                self.tasks.ref_dropped(self.task_ids.pop(object_id, 0))
                if future is not None and not future.done() and hasattr(
                        future, "add_done_callback"):  # (an actor call runs on regardless)
                    # A dropped ref's task still runs: hold its future until it ends.
                    self.orphans[object_id] = future
                    future.add_done_callback(
                        lambda _f, oid=object_id: self.orphans.pop(oid, None))
        for key in dropped_puts:
            self.holds.arm_hold(key)

    def future_of(self, object_id: int, actor: bool = False) -> Any:
        future = self.futures.get(object_id)
        if future is None:
            if object_id >> PROCESS_ID_SHIFT << PROCESS_ID_SHIFT in _ENDED_SESSIONS:
                what = (f"actor handle {object_id:020x}" if actor
                        else f"ObjectRef({object_id:020x})")
                raise exceptions.SessionEndedError(
                    f"{object_id:020x}", ended_session_message(what, running=True))
            raise exceptions.ReferenceCountingAssertionError(
                f"{object_id:020x}",
                f"object {object_id:020x} is not known to this session of the {BACKEND} "
                "backend: it was freed, or it comes from an earlier session; keep the ref "
                "returned by .remote() or put() and use it within one session")
        return future

    def keys_of(self, ids: list[int]) -> dict[int, str]:
        """The cluster keys of the refs in a value leaving this process. An actor call's
        result has none (its value lives with its caller): it becomes a bridge here, a
        key that takes the call's answer when it comes (``ActorCalls.export_result``)."""
        futures = self.futures
        keys = {}
        for i in ids:
            future = futures.get(i)
            if future is None:
                continue
            if future.key is None and type(future) is ActorResult:
                future = self.actors.export_result(i, future)
            if future.key is not None:
                keys[i] = future.key
        return keys

    def encode(self, value: Any, result_key: Any = None, session: int = 0) -> Any:
        """``value`` as stored in the cluster. Refs inside it are kept alive while the
        task result ``result_key`` of driver session ``session`` lives, if given
        (``cluster_plugin.ExportedRefs``); else the caller holds them (``hold_inside``,
        see ``cluster_holds``)."""
        stored = cluster_worker.encode(value, self.keys_of)
        if type(stored) is WithRefs and result_key is not None:
            futures, task_ids = self.futures, self.task_ids
            held = {i: (futures[i], task_ids.get(i, 0)) for i in stored.keys if i in futures}
            with self.lock:
                exported = self.exported_by_key.get(result_key)
                if exported is None:
                    exported = self.exported_by_key[result_key] = cluster_worker.Exported(
                        session or self.session_tag)
                exported.refs.update(held)
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

    # -- shared by the parts -------------------------------------------------------------
    def task_id_of(self, object_id: int) -> int:
        return self.task_ids.get(object_id, 0)

    def check_open(self) -> None:
        if self._closed:
            raise exceptions.RuntimeSystemError(
                "the lightwork session on the cluster was shut down; call lightwork.init() "
                "to connect again")

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
        """(total, available) over the cluster's workers: ``cluster_state.resource_use``
        (a task with ``num_cpus <= 1`` takes a thread, counted as one CPU in use)."""
        from lightwork.engines.distributed.state import resource_use, scheduler_facts

        use = resource_use(self.client.run_on_scheduler(scheduler_facts)["workers"])
        # As in Ray, a resource none of which is free now is left out of ``available``.
        return ({name: total for name, (_, total) in use.items()},
                {name: total - used for name, (used, total) in use.items() if total > used})

    def nodes(self) -> list[dict[str, Any]]:
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        return [{"NodeID": address, "Alive": True,
                 "Resources": {"CPU": float(info.get("nthreads", 1)),
                               **{k: float(v) for k, v in (info.get("resources") or {}).items()}},
                 "NodeManagerAddress": info.get("host", address)}
                for address, info in workers.items()]
