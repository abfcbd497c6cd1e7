"""The worker plugin of the distributed backend (see :class:`ExportedRefs`).

Installed on every worker by the driver's ``init`` (``client.register_plugin``); imported
only with ``distributed``.
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from lightwork.backends import cluster_worker


class ExportedRefs(WorkerPlugin):
    """A worker plugin: the refs inside a task's result are released with that result.

    ``run_task`` keeps the futures of the refs inside a single result in
    ``exported_by_key`` under the result's key. When this worker lets the key go, and
    the scheduler holds no copy of it anywhere (it was released, not moved), those
    futures are dropped, so the inner objects are freed once no one else holds them.
    Refs inside other stored values (a ``put``, one of several returns, an actor call's
    result) are held as ``cluster_holds`` says.
    """

    name = "lightwork-exported-refs"

    def setup(self, worker: Any) -> None:
        self.worker = worker

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        backend = cluster_worker._backend
        if start == "memory" and backend is not None and key in backend.exported_by_key:
            self.worker.loop.add_callback(self._release_if_gone, key)

    async def _release_if_gone(self, key: Any) -> None:
        backend = cluster_worker._backend
        try:
            who_has = await self.worker.scheduler.who_has(keys=[key])
        except Exception:  # noqa: BLE001 - the scheduler is gone: so is the cluster
            return
        if not who_has.get(key) and backend is not None:
            with backend.lock:
                backend.exported_by_key.pop(key, None)
