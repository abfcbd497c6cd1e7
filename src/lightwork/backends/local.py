"""The local backend: the embedded runtime of ``lightwork._runtime``.

In the driver it wraps the ``Node``; inside one of its worker processes, the ``Worker``
(nested calls travel to the driver). Both already provide every operation of
:class:`~lightwork.backends.base.Backend` under the same names, so the backend binds the
core's methods onto itself when it is made: a call through the interface is a direct
call of the core's method, and the local hot path pays nothing for the seam. The class
also carries plain forwarders of the same names, so it implements the abstract interface
as a class (the instance's bound methods shadow them).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from lightwork.backends.base import Backend

# The operations whose implementation is the core's method of the same name.
_BOUND = (
    "submit_task", "cancel", "next_object_id", "put", "get", "wait", "future",
    "task_id_of", "create_actor", "submit_actor_task", "driver_request",
    "runtime_context", "resources",
)


class LocalBackend(Backend):
    """The embedded runtime: ``core`` is the driver's Node or a worker's Worker."""

    name = "local"

    def __init__(self, core: Any, in_driver: bool) -> None:
        self.core = core
        self.in_driver = in_driver
        self.node = core if in_driver else None
        for operation in _BOUND:  # see the module docstring: no wrapper on the hot path
            setattr(self, operation, getattr(core, operation))

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
