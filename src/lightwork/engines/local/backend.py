"""The local backend: the embedded runtime of ``lightwork.engines.local``.

:meth:`LocalBackend.open` builds a session: the driver's ``Node``, its memory monitor
and, when the advisor is loaded and wanted, its advisor. In the driver it wraps the ``Node``; inside one of its worker processes, the ``Worker``
(nested calls travel to the driver). Both already provide every operation of
:class:`~lightwork.kernel.backend.Backend` under the same names, so the backend binds the
core's methods onto itself when it is made: a call through the interface is a direct
call of the core's method, and the local hot path pays nothing for the seam. The class
also carries plain forwarders of the same names, so it implements the abstract interface
as a class (the instance's bound methods shadow them).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightwork.kernel import exceptions
from lightwork.kernel.backend import ActorInfo, Backend, SessionOptions

# The operations whose implementation is the core's method of the same name.
_BOUND = (
    "submit_task", "cancel", "next_object_id", "put", "get", "wait", "future",
    "task_id_of", "create_actor", "submit_actor_task", "runtime_context", "resources",
)


class LocalBackend(Backend):
    """The embedded runtime: ``core`` is the driver's Node or a worker's Worker."""

    name = "local"

    if TYPE_CHECKING:
        # Forwarders set on the class below (and the core's bound methods on each
        # instance): for the type checker, the interface's own signatures.
        submit_task = Backend.submit_task
        cancel = Backend.cancel
        next_object_id = Backend.next_object_id
        put = Backend.put
        get = Backend.get
        wait = Backend.wait
        future = Backend.future
        task_id_of = Backend.task_id_of
        create_actor = Backend.create_actor
        submit_actor_task = Backend.submit_actor_task
        runtime_context = Backend.runtime_context
        resources = Backend.resources

    def __init__(self, core: Any, in_driver: bool) -> None:
        self.core = core
        self.in_driver = in_driver
        self.node = core if in_driver else None
        for operation in _BOUND:  # see the module docstring: no wrapper on the hot path
            setattr(self, operation, getattr(core, operation))

    @classmethod
    def open(cls, options: SessionOptions) -> LocalBackend:
        """Start the embedded runtime in this process with ``init``'s options."""
        import os

        from lightwork.engines.local.memory_monitor import MemoryMonitor, configure
        from lightwork.engines.local.node import Node
        from lightwork.engines.local.store import check_budget
        from lightwork.kernel import tools
        from lightwork.kernel.session import SHM_ROOT

        threshold, refresh_s = configure(options.memory_usage_threshold,
                                         options.memory_monitor_refresh_ms)
        store_budget = options.object_store_memory
        if store_budget is not None:
            store_budget = check_budget(store_budget, SHM_ROOT + "/.")
        cpus = float(os.cpu_count() or 1) if options.num_cpus is None else options.num_cpus
        node = Node(cpus, options.num_gpus or 0.0, dict(options.resources or {}),
                    options.namespace, options.event_budget, store_budget, options.spill_dir,
                    runtime_env=options.runtime_env, memory=options.memory,
                    log_to_driver=options.log_to_driver, debugger=options.debugger,
                    post_mortem=options.post_mortem)
        node.memory_monitor = MemoryMonitor(node, threshold, refresh_s)
        node.memory_monitor.start()
        if options.advisor and options.event_budget and tools.advisor_loaded():
            node.advisor = tools.advisor().Advisor(node, init_callsite=options.init_callsite)
            node.advisor.start()
        return cls(node, in_driver=True)

    @property
    def closed(self) -> bool:
        return self.node is not None and self.node.closed

    def shutdown(self) -> None:
        node = self.node
        if node is None:
            return
        if node.advisor is not None:
            node.advisor.stop()
        node.shutdown()

    def address(self) -> str:
        return "local"

    def minted_before_session(self, object_id: int) -> bool:
        return self.in_driver and self.core.id_floor.minted_before(object_id)

    def put_error(self, exc: BaseException) -> Any:
        if self.in_driver:
            raise exc
        return self.core.put_error(exc)

    def actor_loop(self) -> Any:
        return None if self.in_driver else self.core.loop

    def is_canceled(self) -> bool:
        if self.in_driver:
            raise RuntimeError(
                "is_canceled() works only inside a task or an actor's method: the "
                "driver is never cancelled")
        if self.core.loop is not None:
            raise RuntimeError(
                "is_canceled() is not supported in an async actor: cancel() raises "
                "asyncio.CancelledError in the coroutine instead (catch it to clean up)")
        return bool(self.core.is_canceled())

    def exit_actor(self) -> None:
        from lightwork.engines.local.worker_exit import ActorExit

        worker = self.core
        if self.in_driver or worker.actor_id == 0:
            super().exit_actor()
        worker.request_exit()
        if worker.loop is not None:  # a SystemExit would end only the loop's thread
            raise exceptions.AsyncioActorExit()
        raise ActorExit(0)

    # -- the typed requests of the interface, carried by the engine's own request path --
    def find_actor(self, name: str, namespace: str | None) -> ActorInfo | None:
        found = self._request("get_actor", name, namespace)
        return None if found is None else ActorInfo(*found)

    def kill_actor(self, actor_id: int, no_restart: bool) -> None:
        self._request("kill", actor_id, no_restart)

    def create_placement_group(self, group_id: int, group_hex: str, name: str,
                               bundles: list[dict[str, float]], strategy: str) -> None:
        self._request("placement_group", "create", group_id, group_hex, name, bundles,
                      strategy)

    def remove_placement_group(self, group_id: int) -> None:
        self._request("placement_group", "remove", group_id)

    def placement_group_table(self) -> dict[str, dict[str, Any]]:
        table: dict[str, dict[str, Any]] = self._request("placement_group", "table")
        return table

    def stream_item(self, head_id: int, index: int) -> tuple[str, Any]:
        kind, object_id = self._request("stream", "item", head_id, index)
        return kind, object_id

    def _request(self, what: str, *args: Any) -> Any:
        return self.core.driver_request(what, *args)  # the Node, or a worker's Worker

    def nodes(self) -> list[dict[str, Any]]:
        total = self.core.resources()[0]
        return [{"NodeID": self.core.runtime_context()["node_id"], "Alive": True,
                 "Resources": total, "NodeManagerAddress": "127.0.0.1"}]


def _forward_to_core(operation: str) -> Callable[..., Any]:
    def forward(self: LocalBackend, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.core, operation)(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = operation
    return forward


for _operation in _BOUND:
    setattr(LocalBackend, _operation, _forward_to_core(_operation))
abc.update_abstractmethods(LocalBackend)
