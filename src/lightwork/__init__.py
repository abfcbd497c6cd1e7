"""lightwork: parallel tasks and actors with Ray's core API, and diagnostics you can see.

Importing this package starts nothing: no thread, no process. ``init()`` (or the first
call that needs it) starts the embedded runtime.
"""

from lightwork import exceptions
from lightwork._actor import ActorClass, ActorHandle, get_actor, kill, method
from lightwork._generator import DynamicObjectRefGenerator, ObjectRefGenerator
from lightwork._api import (
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
from lightwork._object_ref import ObjectRef
from lightwork._runtime.ray_alias import install_as_ray
from lightwork.diagnostics.advisor import advise
from lightwork.diagnostics.stack import stack
from lightwork.diagnostics.timeline import profile, timeline

from lightwork import actor, state, util  # noqa: E402  (ray.actor, ray.util, ray.util.state)

__version__ = "0.1.0"

__all__ = [
    "ActorClass",
    "ActorHandle",
    "DynamicObjectRefGenerator",
    "ObjectRef",
    "ObjectRefGenerator",
    "actor",
    "advise",
    "available_resources",
    "backend",
    "cancel",
    "cluster_resources",
    "exceptions",
    "get",
    "get_actor",
    "get_gpu_ids",
    "get_runtime_context",
    "init",
    "install_as_ray",
    "is_initialized",
    "kill",
    "method",
    "nodes",
    "profile",
    "put",
    "remote",
    "shutdown",
    "stack",
    "state",
    "timeline",
    "util",
    "wait",
]
