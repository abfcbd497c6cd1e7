"""Tasks on the distributed backend: submission, resources, retries, cancel and ``put``.

:class:`TaskSubmission` is the backend's ``tasks`` component: it owns the resource shapes
seen, the workers' declared resources and the lineages of the tasks that can run again
(``ref_dropped`` lets a lineage go with its last ref), and files what it submits in the
backend's object table under the backend's lock. It asks ``streams`` to open a
generator's stream and ``holds`` to hold the refs inside stored values.

Tasks
-----
``submit_task`` pickles the function's arguments itself, replacing each top-level ref by
an ``ArgSlot``, and passes those refs' futures to distributed as dependencies: the engine
resolves top-level refs to values; refs inside containers stay refs (borrowed: see
``cluster_worker``). ``num_returns=k`` is one task returning a tuple and ``k`` small
``pick`` tasks, each with its own key and ref.

Large arguments
---------------
The arguments are pickled once, with protocol 5, buffers of at least ``OUT_OF_BAND_MIN``
(numpy arrays, anywhere in the arguments) out of band. Below ``SCATTER_MIN`` in all,
they are pickled in band and travel in the task's header: with the task, through the
scheduler, to the worker (two transfers, nothing else to wait for). From it, the task's
buffers are copied once into one block (each at an aligned offset,
``cluster_worker.join_buffers``) and that block is
scattered straight to a worker that can run the task (``Client.scatter(direct=True)``:
one transfer, client to worker; then the scheduler hears of the key and its size); the
header carries only the pickle and where each buffer lies (``Scattered``), and the task
depends on the block's key, so the scheduler runs it where the block already is. The
worker unpickles with views into the block: the arrays are read-only, as in Ray and on
the embedded runtime. The copy is what "by value" means: the value as it was at the
call, whatever the caller does to its arrays after, and what a retry sends again.

The block's key has no lineage of its own: once the task ends nothing holds it, and
the worker frees it. If the worker that held it dies with the task's result, the
scheduler cannot compute that result again and forgets it (a cancelled future for the
client); a ``get`` or ``wait`` that meets such a future ``revive``-s the task from its
lineage, the block scattered again from the copy, unless the program cancelled it
(``cancel`` makes the lineage final), an argument without a lineage (a ``put``) went
too, or it was revived ``REVIVALS_MAX`` times already; its get then raises
``TaskCancelledError``.

Retries
-------
``retry_exceptions`` (by type) runs again on the worker, up to ``max_retries``, after the
driver's retry delay (``LIGHTWORK_TASK_RETRY_DELAY_MS``, 1 s as in Ray), which travels
in the task's header. The task waits on its worker thread, keeping its slot (the
scheduler knows no other way to hold a task back), and a cancel during the wait ends it
without the retry (``cluster_worker.wait_before_retry``). A lost
worker counts against each task's own ``max_retries`` too, from the driver: every task
keeps its :class:`Lineage` (how to submit it again) while its refs live. When the
scheduler fails a task with ``KilledWorker`` (its worker died while running it, on
``allowed-failures + 1`` workers: start the scheduler with ``allowed-failures=0`` so each
loss is one attempt, as ``init(address="local-cluster")`` does; with another value
``init`` warns once and each failure counts ``allowed-failures + 1`` losses, see
``check_allowed_failures``), the scheduler
plugin ``cluster_plugin.TaskErrors`` publishes it on a topic every lightwork client
subscribes to (``watch_task_errors``), and the task is submitted again
under a new key (``…-r<n>``), its refs now naming the new futures, until its attempts
are used up; then its get raises ``WorkerCrashedError``. Tasks that failed only because a
dependency was lost are submitted again too, on the dependency's new futures, without
counting an attempt. Recovery runs on one thread (``recover``), started by the message
or by a ``get`` that met the error first, whichever comes first; it is idempotent.

Actor results as arguments
--------------------------
An actor call's result lives with its caller, not in the cluster. Passed to a task once
it has come, it is passed by value. Passed while the call still runs, it becomes a
*bridge* (``bridge``): a small task, the argument's dependency, that secedes from its
worker's pool and waits on a distributed ``Variable``; the caller sets the Variable to
the result's scattered key when the call ends. So ``.remote()`` never waits for an actor
call, and nothing polls. A ref of a call that leaves its caller inside a value (a task's
arguments or result, a ``put``) becomes a bridge the same way
(``ActorCalls.export_result``).

Resources: ``num_cpus`` up to 1 takes one worker thread, as every distributed task does
(no resource restriction, so the engine's fast path and its queuing apply, and a task
blocked in a nested ``get`` secedes and frees its thread, as Ray frees the CPU of a
blocked task). ``num_cpus`` above 1, ``num_gpus`` and ``resources`` become distributed
resource restrictions, which only count resources the workers declared: start them with
``--resources "CPU=n"`` (and ``GPU=``, custom names). A request no worker can meet
(judged against the workers of the moment, asked again before each such submission, so a
worker that joins later counts) is warned of once per shape, and its refs fail at once
with ``TaskUnschedulableError`` naming the resource (``kernel/calls.py``); the program
goes on, as on Ray.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions
from lightwork.kernel.calls import pack_retry_exceptions, unschedulable_error, warn_unschedulable
from lightwork.kernel.object_ref import ObjectRef, collecting_refs, ref_counter
from lightwork.kernel import serialization
from lightwork.kernel.serialization import pickle_value
from lightwork.engines.distributed import streams as cluster_streams
from lightwork.engines.distributed import worker as cluster_worker
from lightwork.engines.distributed.worker import ArgSlot, Scattered, key_name, unsupported


@dataclass(slots=True, eq=False)
class Lineage:
    """How to submit a task again after its worker was lost (see *Retries*)."""

    task_id: int
    name: str
    header: tuple[Any, ...]
    sources: tuple[tuple[Lineage | None, int, Any], ...]  # per dep: (task, index, future)
    restrictions: dict[str, float] | None
    prefix: str
    num_returns: int
    max_retries: int
    return_ids: list[int]
    futures: list[Any]  # its current return futures (the main one if it returns none)
    key: str  # its current main key
    stream: bool  # a streaming generator task (see cluster_streams)
    by_value: tuple[memoryview, ...]  # its scattered buffers' copies (*Large arguments*)
    live: int = 0  # refs of its returns still held here
    lost: int = 0  # attempts lost with their worker
    resubmits: int = 0
    revivals: int = 0  # times submitted again after the scheduler forgot it (``revive``)
    final: str = ""  # why it will not be submitted again


if TYPE_CHECKING:
    from lightwork.engines.distributed.backend import DistributedBackend


#: A task's arguments whose out-of-band buffers (numpy arrays, ...) come to this many
#: bytes are scattered to a worker on their own; below it they travel with the task.
SCATTER_MIN = 1 << 20
#: How many times one task is submitted again after the scheduler forgot it (``revive``):
#: a bound, so that a value lost again and again ends in an error, not in a loop.
REVIVALS_MAX = 8


def _losses(killed: Any) -> int:
    """How many lost workers a ``KilledWorker`` stands for: the scheduler tried the task
    ``allowed-failures + 1`` times before giving up (see ``check_allowed_failures``)."""
    return max(0, int(getattr(killed, "allowed_failures", 0) or 0)) + 1


_warned_allowed_failures: set[str] = set()  # scheduler addresses warned about


def check_allowed_failures(client: Any) -> int:
    """The scheduler's ``allowed-failures``; warns once per scheduler when it is not 0.

    The scheduler itself runs a task again on another worker after each lost worker, up
    to ``allowed-failures`` times, before it fails the task (``KilledWorker``). lightwork
    counts those losses against the task's own ``max_retries`` (``_losses``), so no task
    runs more than ``max_retries + 1`` times unless the scheduler's own retries go
    beyond it; with 0 each lost worker is exactly one of the task's tries.
    """
    def allowed(dask_scheduler: Any = None) -> int:
        return int(getattr(dask_scheduler, "allowed_failures", 0) or 0)

    try:
        value = client.run_on_scheduler(allowed)
    except Exception:  # noqa: BLE001 - a scheduler that will not run functions: no check
        return 0
    address = str(getattr(client.scheduler, "address", ""))
    if value and address not in _warned_allowed_failures:
        _warned_allowed_failures.add(address)
        import warnings

        warnings.warn(
            f"the Dask scheduler at {address} retries a task lost with its worker itself, "
            f"up to allowed-failures={value} time(s), before lightwork hears of it: a task "
            f"may then run up to {value + 1} times however low its max_retries (max_retries"
            f"=0 included), and each loss counts {value + 1} of its max_retries. Start the "
            "scheduler with allowed-failures=0 (DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES"
            "=0 in its environment, or distributed.scheduler.allowed-failures: 0 in its "
            "config), so that each lost worker is one of a task's tries, as in Ray",
            RuntimeWarning, stacklevel=4)
    return value


def _task_id_of_key(key: Any) -> int | None:
    try:
        return int(str(key).split("-")[1], 16)
    except (IndexError, ValueError):
        return None


#: What to do about a request no worker of the cluster can meet.
CLUSTER_FIX = ("lower its request with .options(), or start workers that declare the "
               "resource: dask worker --resources 'CPU=4,GPU=1' (distributed counts only "
               "resources the workers declare)")


class TaskSubmission:
    """Submitting tasks and objects, and recovering lost ones: the backend's ``tasks``
    component. Owns the resource shapes seen, the workers' declared resources and the
    lineages of tasks that can be run again (see the module docstring); reads and
    writes the backend's object table under its lock."""

    def __init__(self, backend: DistributedBackend) -> None:
        self.backend = backend
        self._shapes: dict[tuple, dict[str, float] | None] = {}
        self.warned_shapes: set[tuple] = set()  # shapes no worker offers, warned of
        self._lineages: dict[int, Lineage] = {}  # task id -> Lineage
        self._recover_lock = threading.Lock()
        # each worker's declared resources, by address (None: ask the scheduler again)
        self._worker_resources: dict[str, dict[str, float]] | None = None

    def _restrictions(self, spec: Any) -> dict[str, float] | None:
        """The distributed resource restrictions of ``spec``'s shape (None: none)."""
        shape = spec.shape
        try:
            return self._shapes[shape]
        except KeyError:
            pass
        restrictions = {r: a for r, a in shape if a and not (r == "CPU" and a <= 1)}
        if restrictions:
            problem = self.infeasible(restrictions)
            if problem:
                problem = self.infeasible(restrictions, refresh=True)
            if problem:  # (not cached: a worker that joins later may offer it)
                if shape not in self.warned_shapes:
                    self.warned_shapes.add(shape)
                    warn_unschedulable("task", spec.name, problem, CLUSTER_FIX)
                raise unschedulable_error("task", spec.name, problem, CLUSTER_FIX)
        self._shapes[shape] = restrictions or None
        return restrictions or None

    def _submit_unschedulable(self, spec: Any, error: exceptions.LightworkError,
                              callsite: Any) -> list[ObjectRef]:
        """Refs that raise ``error`` (a task no worker can run: see *Resources*); its
        record ends FAILED at once. Nothing is sent to the scheduler but the errors."""
        backend = self.backend
        task_id = backend.next_object_id()
        if backend.recorder is not None:
            backend.recorder.submitted(task_id, spec.name, callsite, 0,
                                       num_cpus=dict(spec.shape).get("CPU", 1.0))
            backend.recorder.call_failed(task_id, error)
        count = spec.num_returns
        futures = backend.client.scatter([cluster_worker.Failed(error)] * count,
                                         hash=False) if count else []
        refs = []
        with backend.lock:
            for future in futures:
                object_id = backend.next_object_id()
                backend.futures[object_id] = future
                backend.task_ids[object_id] = task_id
                refs.append(ObjectRef(object_id))
        return refs

    def infeasible(self, restrictions: dict[str, float], refresh: bool = False) -> str:
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

    def worker_resources(self) -> dict[str, dict[str, float]]:
        """Each worker's declared resources (cached; refreshed when a request fails)."""
        if self._worker_resources is None:
            workers = self.backend.client.scheduler_info(n_workers=-1)["workers"]
            self._worker_resources = {
                address: {k: float(v) for k, v in (info.get("resources") or {}).items()}
                for address, info in workers.items()}
        return self._worker_resources

    def submit_task(
        self, spec: Any, args: tuple, kwargs: dict, callsite: Any = None
    ) -> list[ObjectRef]:
        self.backend.check_open()
        if spec.runtime_env:
            # A Dask worker runs several tasks in one process: environment variables, the
            # working directory and sys.path set for one task would leak into the others.
            raise unsupported(
                f"a per-task runtime_env ({spec.name})",
                "set the environment on the cluster's workers (dask worker's environment "
                "or a WorkerPlugin), or run the task without runtime_env")
        if spec.max_calls:
            # A Dask worker runs many tasks in one long-lived process: it cannot exit
            # after N calls of one function.
            raise unsupported(
                f"max_calls ({spec.name}, max_calls={spec.max_calls})",
                "declare the function without max_calls, or run the leaking work in an "
                "actor that you kill and create again")
        if ref_counter._released:
            self.backend._drain()
        try:
            restrictions = self._restrictions(spec)
        except exceptions.TaskUnschedulableError as error:
            return self._submit_unschedulable(spec, error, callsite)
        deps: list[Any] = []
        sources: list[tuple[Lineage | None, int, Any]] = []
        futures = self.backend.futures
        dep_tasks: tuple[int, ...] = ()
        if any(type(a) is ObjectRef for a in args) or any(
                type(v) is ObjectRef for v in kwargs.values()):
            dep_tasks = tuple(self.backend.task_ids.get(a.id, 0) for a in (*args, *kwargs.values())
                              if type(a) is ObjectRef)
            args, kwargs = self._slots(args, kwargs, deps, sources)
        payload, contained, by_value = self._pickle_arguments(args, kwargs, deps, restrictions)
        keys = self.backend.keys_of(contained) if contained else None
        task_id = self.backend.next_object_id()
        num_returns = spec.num_returns
        prefix = key_name(spec.name)
        shape = dict(spec.shape)
        replies = self.backend.replies
        reply_to = None
        if replies is not None and num_returns == 1 and not spec.stream:
            replies.expect(task_id)  # before it is sent: the reply may come first
            reply_to = replies.reply_to
        retry_delay_s = (getattr(cluster_worker.current, "retry_delay_s", None)
                         if not self.backend.in_driver else None)
        if retry_delay_s is None:
            retry_delay_s = self.backend.retry_delay_s
        retry = pack_retry_exceptions(spec.retry_exceptions)
        header = (task_id, spec.key, spec.blob, spec.name, payload, keys, max(num_returns, 1),
                  spec.max_retries, retry, retry_delay_s, shape, self.backend.session_tag,
                  reply_to)
        recorder = self.backend.recorder
        if recorder is not None:
            recorder.submitted(task_id, spec.name, callsite, len(payload),
                               num_cpus=shape.get("CPU", 1.0), dep_tasks=dep_tasks,
                               call=(args, kwargs))
        main_key = f"{prefix}-{task_id:x}"
        main, return_futures = self._submit_main(header, deps, restrictions, main_key,
                                                 num_returns, spec.stream)
        if keys:  # hold what the task borrows until it ends
            held = [futures[i] for i in keys]
            main.add_done_callback(lambda _f, held=held: held.clear())
        refs = []
        lineage = Lineage(task_id, spec.name, header, tuple(sources), restrictions, prefix,
                          num_returns, spec.max_retries, [], return_futures, main_key,
                          spec.stream, by_value)
        with self.backend.lock:
            for future in return_futures if num_returns else []:
                object_id = self.backend.next_object_id()
                futures[object_id] = future
                self.backend.task_ids[object_id] = task_id
                lineage.return_ids.append(object_id)
                refs.append(ObjectRef(object_id))
            lineage.live = len(refs)
            self._lineages[task_id] = lineage
            if not num_returns:
                self.backend.orphans[task_id] = main
                main.add_done_callback(lambda _f: self._task_ended(task_id))
        if spec.stream:
            self.backend.streams.open_stream(refs[0].id, task_id, main)
        if recorder is not None:
            recorder.returned(task_id, [ref.id for ref in refs], main)
        return refs

    def _submit_main(self, header: tuple[Any, ...], deps: list[Any],
                     restrictions: dict[str, float] | None, main_key: str,
                     num_returns: int, stream: bool) -> tuple[Any, list[Any]]:
        """Submit one attempt of a task: its main future, and its return futures."""
        client = self.backend.client
        runner = cluster_streams.run_stream_task if stream else cluster_worker.run_task
        main = client.submit(runner, header, *deps, key=main_key, resources=restrictions,
                             pure=False)
        if num_returns <= 1:
            return main, [main]
        return main, [client.submit(cluster_worker.pick, main, index, pure=False,
                                    key=f"{main_key}-{index}")
                      for index in range(num_returns)]

    def _pickle_arguments(self, args: tuple, kwargs: dict, deps: list[Any],
                          restrictions: dict[str, float] | None
                          ) -> tuple[bytes | Scattered, list[int], tuple[memoryview, ...]]:
        """A task's arguments pickled: the payload, the ids of the refs inside, and the
        copies of the buffers scattered (see *Large arguments*), whose futures are
        appended to ``deps``."""
        data, buffers, contained = serialization.dumps((args, kwargs))
        if not buffers:
            return data, contained, ()
        if sum(buffer.raw().nbytes for buffer in buffers) < SCATTER_MIN:
            with collecting_refs() as contained:
                return pickle_value((args, kwargs)), contained, ()
        # One copy of all the buffers (what a retry after a lost worker sends again), and
        # one key to scatter.
        copy, bounds = cluster_worker.join_buffers(buffers)
        deps.append(self._scatter(copy, restrictions))
        return Scattered(data, len(deps) - 1, bounds), contained, (copy,)

    def _scatter(self, copy: memoryview, restrictions: dict[str, float] | None) -> Any:
        """A future of ``copy``, sent straight to a worker that can run the task (the
        scheduler then runs the task there); inside a task, kept by its own worker."""
        candidates = None
        if restrictions:
            candidates = [address for address, have in self.worker_resources().items()
                          if all(have.get(r, 0.0) >= a for r, a in restrictions.items())]
        [future] = self.backend.client.scatter([copy], workers=candidates or None,
                                               direct=True, hash=False)
        return future

    def bridge(self, result: Any) -> Any:
        """A cluster key for a pending actor call's ``result`` (see *Actor results as
        arguments*): a task that waits, seceded, on a distributed ``Variable`` this
        process sets to the result's key once the call has finished."""
        name = f"lightwork-bridge-{uuid.uuid4().hex}"
        bridge = self.backend.client.submit(cluster_worker.await_bridged, name, pure=False,
                                    key=f"actor_result-{self.backend.next_object_id():x}")

        def set_variable() -> None:
            from distributed import Variable

            stored = result.stored(None)
            if result.call.inner:  # refs inside: alive while the bridge's key is
                self.backend.holds.hold_under(bridge.key, result.call.inner)
            try:
                [value] = self.backend.client.scatter([stored], hash=False)
                Variable(name, client=self.backend.client).set(value)
            except Exception:  # noqa: BLE001 - the session closed meanwhile
                pass

        # The call ends on the event loop: the scatter and set run in a thread of their own.
        result.add_done_callback(lambda _r: threading.Thread(
            target=set_variable, daemon=True, name="lightwork-bridge").start())
        return bridge

    def _task_ended(self, task_id: int) -> None:
        self.backend.orphans.pop(task_id, None)
        self._lineages.pop(task_id, None)

    def _slots(self, args: tuple, kwargs: dict, deps: list[Any],
               sources: list[tuple[Lineage | None, int, Any]]) -> tuple[tuple, dict]:
        """Top-level refs replaced by ArgSlots; their futures appended to ``deps``, and
        where each came from to ``sources`` (to submit the task again: see *Retries*)."""

        def slot(value: Any) -> Any:
            if type(value) is not ObjectRef:
                return value
            future = self.backend.future_of(value.id)
            if future.key is None:  # an actor call's result: it lives here, not in the cluster
                if future.done():
                    return self.backend.decode(future.stored(None))  # passed by value
                future = self.bridge(future)  # a key that becomes its value when it comes
                deps.append(future)
                sources.append((None, 0, future))
                return ArgSlot(len(deps) - 1)
            deps.append(future)
            source = self._lineages.get(self.backend.task_ids.get(value.id, 0))
            index = source.return_ids.index(value.id) if source is not None else 0
            sources.append((source, index, future))
            return ArgSlot(len(deps) - 1)

        return tuple(slot(a) for a in args), {k: slot(v) for k, v in kwargs.items()}

    # -- retries after a lost worker (see *Retries*) ---------------------------------------
    def watch_task_errors(self, client: Any) -> None:
        """Hear of every task the scheduler fails because a worker was lost (the
        scheduler plugin ``cluster_plugin.TaskErrors`` publishes them on a topic): a lost
        task starts recovery; a borrowed actor's key drops its cached proxy."""
        from lightwork.engines.distributed.plugin import TASK_ERRORS_TOPIC

        def task_erred(event: tuple[float, dict[str, Any]]) -> None:  # on the event loop
            message = event[1]
            key = message["key"]
            killed = message.get("killed")
            if killed is not None and (_task_id_of_key(key) in self._lineages
                                       or _task_id_of_key(killed) in self._lineages):
                # Never block the loop: recovery submits and may wait.
                threading.Thread(target=self.recover, args=(killed, key,
                                                             int(message.get("losses", 1))),
                                 daemon=True, name="lightwork-retry").start()
            if message.get("actor") and self.backend.actors.tracks_actors():
                # a borrowed actor's key: its proxy is stale, its calls in flight lost
                self.backend.actors.actor_key_erred(key)

        # From the client's loop: its stream to the scheduler is woken only from there.
        client.loop.add_callback(client.subscribe_topic, TASK_ERRORS_TOPIC, task_erred)

    def recover(self, killed_key: Any, erred_key: Any, losses: int = 1) -> bool:
        """Submit again the task lost with its worker (``killed_key``: ``losses`` workers
        died running it, see ``_losses``) and the task whose key failed with it
        (``erred_key``, a dependent); True if anything was."""
        with self._recover_lock:
            if self.backend.closed:
                return False
            killed = self._lineages.get(_task_id_of_key(killed_key) or 0)
            erred = self._lineages.get(_task_id_of_key(erred_key) or 0)
            if killed is None and erred is not None:  # a dependency whose refs are gone
                killed = next((source for source, _i, _f in erred.sources
                               if source is not None and source.key == str(killed_key)), None)
            again = False
            if killed is not None and killed.key == str(killed_key) and not killed.final:
                killed.lost += losses
                limit = killed.max_retries
                if limit >= 0 and killed.lost > limit:
                    killed.final = (f"its worker died {killed.lost} time(s) while running "
                                    f"it, and max_retries={limit}")
                else:
                    self._resubmit(killed)
                    again = True
            if erred is not None and erred is not killed and not erred.final and any(
                    source is not None and source.futures[index] is not future
                    for source, index, future in erred.sources):
                self._resubmit(erred)  # its dependency is back: it did not fail itself
                again = True
            return again

    def revive(self, futures: list[Any]) -> bool:
        """Submit again the tasks of the cancelled ``futures`` that the scheduler forgot
        because a value they were given was lost with its worker (see *Large
        arguments*), not because the program cancelled them; True if any was. A task
        whose own source was forgotten so has that source revived first."""
        with self._recover_lock:
            if self.backend.closed:
                return False
            return any([self._revive(future) for future in futures])

    def _revive(self, future: Any) -> bool:
        lineage = self._lineages.get(_task_id_of_key(future.key) or 0)
        if (lineage is None or lineage.final or lineage.key != str(future.key)
                or not future.cancelled() or lineage.revivals >= REVIVALS_MAX):
            return False
        # An argument with no lineage (a put's value, say) that is gone cannot come back:
        # the task stays cancelled, as before it could be revived.
        if any(source is None and dep is not None and dep.status != "finished"
               for source, _index, dep in lineage.sources):
            return False
        for source, index, _dep in lineage.sources:
            if source is not None and source.futures[index].cancelled():
                self._revive(source.futures[index])
        lineage.revivals += 1
        self._resubmit(lineage)
        return True

    def _resubmit(self, lineage: Lineage) -> None:
        """Submit ``lineage``'s task again under a new key; its refs follow (recovering
        first the dependencies lost with it)."""
        deps = [source.futures[index] if source is not None else future
                for source, index, future in lineage.sources]
        lineage.sources = tuple((source, index, dep) for (source, index, _f), dep
                                in zip(lineage.sources, deps))
        if lineage.by_value:  # sent again: the worker that had them may be the lost one
            deps.extend(self._scatter(copy, lineage.restrictions) for copy in lineage.by_value)
        lineage.resubmits += 1
        key = f"{lineage.prefix}-{lineage.task_id:x}-r{lineage.resubmits}"
        main, return_futures = self._submit_main(lineage.header, deps, lineage.restrictions,
                                                 key, lineage.num_returns, lineage.stream)
        with self.backend.lock:
            lineage.key, lineage.futures = key, return_futures
            for object_id, future in zip(lineage.return_ids, return_futures):
                if object_id in self.backend.futures:
                    self.backend.futures[object_id] = future
            if not lineage.num_returns:
                self.backend.orphans[lineage.task_id] = main
                main.add_done_callback(lambda _f: self._task_ended(lineage.task_id))

    def ref_dropped(self, task_id: int) -> None:
        """A ref to one of ``task_id``'s results went (lock held): its lineage goes with
        the last one (a dependent still holds it, if it needs it)."""
        lineage = self._lineages.get(task_id)
        if lineage is not None:
            lineage.live -= 1
            if lineage.live <= 0:
                del self._lineages[lineage.task_id]
                if self.backend.replies is not None:
                    self.backend.replies.forget(lineage.task_id)

    def cancel(self, object_ids: list[int], force: bool, recursive: bool = True) -> None:
        # recursive: tasks submitted from a task go through the same client; Dask keeps no
        # parent link, so only the named tasks are cancelled here.
        self.backend.check_open()
        futures = [self.backend.future_of(i) for i in object_ids]
        if force:
            running = self._running([f.key for f in futures])
            if running:
                raise unsupported(
                    "cancel(force=True) of a running task",
                    f"distributed cannot stop a task that is running ({running[0]!r}); call "
                    "cancel() without force to stop waiting for it (its get raises "
                    "TaskCancelledError), or let it finish")
        with self._recover_lock:  # cancelled by the program: never revived
            for object_id in object_ids:
                lineage = self._lineages.get(self.backend.task_ids.get(object_id, 0))
                if lineage is not None:
                    lineage.final = lineage.final or "cancelled"
                    if self.backend.replies is not None:  # its get says it was cancelled
                        self.backend.replies.forget(lineage.task_id)
        self.backend.client.cancel(futures, force=True)
        if self.backend.recorder is not None:
            self.backend.recorder.cancelled([self.backend.task_ids.get(i, 0) for i in object_ids])

    def _running(self, keys: list[Any]) -> list[Any]:
        def processing(dask_scheduler: Any, keys: list[Any] = keys) -> list[Any]:
            tasks = dask_scheduler.tasks
            return [k for k in keys if k in tasks and tasks[k].state == "processing"]

        return self.backend.client.run_on_scheduler(processing)

    def put_error(self, exc: BaseException) -> ObjectRef:
        """An object whose ``get`` raises ``exc`` as the running task's error: where a
        ``num_returns="dynamic"`` generator stopped with it (``_generator._error_item``),
        the items before it staying readable, as on the embedded runtime."""
        self.backend.check_open()
        task = getattr(cluster_worker.current, "task", None)
        stored = cluster_worker.error_of(task[1] if task else "(unknown task)", exc)
        object_id = self.backend.next_object_id()
        [future] = self.backend.client.scatter([stored], hash=False)
        with self.backend.lock:
            self.backend.futures[object_id] = future
            self.backend.task_ids[object_id] = 0
            return ObjectRef(object_id)

    def put(self, value: Any) -> ObjectRef:
        self.backend.check_open()
        if ref_counter._released:
            self.backend._drain()
        object_id = self.backend.next_object_id()
        stored = self.backend.encode(value)
        [future] = self.backend.client.scatter([stored], hash=False)
        if type(stored) is cluster_worker.WithRefs:  # held until no one can read it
            self.backend.holds.hold_inside(stored, future.key, "forgotten", armed=False)
        with self.backend.lock:
            self.backend.futures[object_id] = future
            self.backend.task_ids[object_id] = 0
            return ObjectRef(object_id)