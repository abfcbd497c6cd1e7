"""Tasks on the distributed backend: submission, resources, retries, cancel and ``put``.

The ``TaskSubmission`` part of ``DistributedBackend`` (``cluster.py``).

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
"""

from __future__ import annotations

import threading
from typing import Any

import cloudpickle

from lightwork._object_ref import ObjectRef, collecting_refs, ref_counter
from lightwork.backends import cluster_worker
from lightwork.backends.cluster_worker import ArgSlot, key_name, unsupported


class TaskSubmission:
    """Submitting tasks and objects (a part of ``DistributedBackend``)."""

    lock: threading.Lock
    futures: dict[int, Any]
    task_ids: dict[int, int]
    _orphans: dict[int, Any]
    _shapes: dict[tuple, dict[str, float] | None]
    recorder: Any

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
        if spec.max_calls:
            # A Dask worker runs many tasks in one long-lived process: it cannot exit
            # after N calls of one function.
            raise unsupported(
                f"max_calls ({spec.name}, max_calls={spec.max_calls})",
                "declare the function without max_calls, or run the leaking work in an "
                "actor that you kill and create again")
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
        prefix = key_name(spec.name)
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