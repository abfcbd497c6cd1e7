"""joblib's backend API on lightwork tasks: :class:`LightworkBackend`.

joblib cuts a ``Parallel`` call into *batches* (a picklable callable running a few of the
user's calls) and hands each to the backend's :meth:`~LightworkBackend.submit`, with a
callback to run when it is done. Here each batch is one lightwork task
(:func:`run_batch`, ``num_cpus=1`` unless ``ray_remote_args`` say otherwise); the
callback rides on the task's ``ref.future()``, and joblib reads the result back with
:meth:`~LightworkBackend.retrieve_result_callback`. joblib's own dispatching bounds how
many batches are in flight (``pre_dispatch``); lightwork's CPU slots bound how many run
at once. Batch sizes adapt to task durations (joblib's ``AutoBatchingMixin``), so tiny
calls are grouped until a task takes long enough to hide its overhead.

Pending batches are tracked (``_pending``, under ``_lock``: callbacks run on other
threads) so that :meth:`~LightworkBackend.abort_everything`, which joblib calls when a
call raised, can cancel the rest. Arguments travel through the object store, so joblib's
memory-mapping options (``max_nbytes``, ``mmap_mode``, ``temp_folder``) mean nothing here
and are accepted without effect, as joblib passes them to every backend.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from joblib.parallel import AutoBatchingMixin, ParallelBackendBase

from lightwork.api import cancel, cluster_resources, remote
from lightwork.kernel.object_ref import ObjectRef

__all__ = ["LightworkBackend", "run_batch"]

# What joblib's Parallel passes to every backend's configure(); see the module docstring.
_JOBLIB_CONFIGURE_ARGS = frozenset({"max_nbytes", "temp_folder", "mmap_mode", "verbose",
                                    "context"})


@remote
def run_batch(batch: Any) -> Any:
    """One joblib batch, run in a lightwork worker: the list of its calls' results."""
    return batch()


class LightworkBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's ``"ray"`` backend: every batch of a ``Parallel`` call is a lightwork task.

    ``ray_remote_args`` (a dict of task options, e.g. ``{"num_cpus": 2}``), given to
    ``parallel_backend("ray", ray_remote_args=...)`` or to ``Parallel(...)``, applies to
    every batch's task. ``n_jobs=-1`` means every CPU of the runtime (which starts if
    needed, as any lightwork call does).
    """

    default_n_jobs = -1
    supports_retrieve_callback = True
    supports_sharedmem = False  # batches run in other processes
    uses_threads = False

    def __init__(self, nesting_level: int | None = None,
                 inner_max_num_threads: int | None = None,
                 ray_remote_args: dict[str, Any] | None = None) -> None:
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads)
        self.ray_remote_args = _check_remote_args(ray_remote_args)
        self._task = run_batch
        self._pending: dict[Future[Any], ObjectRef] = {}
        self._lock = threading.Lock()

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning; give a positive "
                             "number, or -1 for every CPU of the lightwork runtime")
        if n_jobs is None:
            return 1
        if n_jobs < 0:  # joblib's convention: -1 is all CPUs, -2 all but one, ...
            cpus = int(cluster_resources().get("CPU", 1))
            return max(cpus + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs: int = 1, parallel: Any = None, prefer: str | None = None,
                  require: str | None = None, ray_remote_args: dict[str, Any] | None = None,
                  **backend_kwargs: Any) -> int:
        unknown = sorted(set(backend_kwargs) - _JOBLIB_CONFIGURE_ARGS)
        if unknown:
            raise TypeError(
                f"the lightwork (\"ray\") joblib backend got unexpected argument(s) "
                f"{', '.join(unknown)}; it takes ray_remote_args (a dict of task options)")
        args = self.ray_remote_args if ray_remote_args is None else _check_remote_args(
            ray_remote_args)
        self._task = run_batch.options(**args) if args else run_batch
        self.parallel = parallel
        return self.effective_n_jobs(n_jobs)

    def submit(self, func: Any, callback: Any = None) -> Future[Any]:
        ref = self._task.options(name=_batch_name(func)).remote(func)
        future = ref.future()
        with self._lock:
            self._pending[future] = ref
        future.add_done_callback(self._forget)
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._pending.pop(future, None)

    def retrieve_result_callback(self, out: Future[Any]) -> Any:
        return out.result()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """Cancel the batches still pending (joblib calls this after a call raised)."""
        with self._lock:
            refs = list(self._pending.values())
            self._pending.clear()
        for ref in refs:
            try:
                cancel(ref)
            except Exception:  # noqa: BLE001 - already done, or the runtime is gone
                pass


def _check_remote_args(args: Any) -> dict[str, Any]:
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise TypeError(f"ray_remote_args must be a dict of task options such as "
                        f"{{'num_cpus': 2}}, got {type(args).__name__}")
    run_batch.options(**args)  # the task options' own checks, with their messages
    return dict(args)


def _batch_name(batch: Any) -> str:
    """``joblib:<function>``, for the task lists and the timeline."""
    items = getattr(batch, "items", None)
    try:
        function = items[0][0] if items else None
    except (TypeError, IndexError, KeyError):
        function = None
    return f"joblib:{getattr(function, '__name__', 'batch')}"
