"""The API floor: ``init``/``get``/``put``/``wait``, ``@remote``, actors, generators.

It validates every call and hands it to the process's backend through the
:class:`~lightwork.kernel.backend.Backend` interface alone; it never reaches into an
engine. ``lightwork/__init__.py`` re-exports its public names.
"""

from lightwork.api.actor import ActorClass, ActorHandle, get_actor, kill, method
from lightwork.api.core import (
    available_resources,
    backend,
    cancel,
    cluster_resources,
    get,
    get_gpu_ids,
    get_runtime_context,
    init,
    is_initialized,
    nodes,
    put,
    remote,
    shutdown,
    wait,
)
from lightwork.api.generator import DynamicObjectRefGenerator, ObjectRefGenerator
from lightwork.kernel.object_ref import ObjectRef

__all__ = [
    "ActorClass",
    "ActorHandle",
    "DynamicObjectRefGenerator",
    "ObjectRef",
    "ObjectRefGenerator",
    "available_resources",
    "backend",
    "cancel",
    "cluster_resources",
    "get",
    "get_actor",
    "get_gpu_ids",
    "get_runtime_context",
    "init",
    "is_initialized",
    "kill",
    "method",
    "nodes",
    "put",
    "remote",
    "shutdown",
    "wait",
]
