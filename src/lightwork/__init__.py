"""lightwork: parallel tasks and actors with Ray's core API, and diagnostics you can see.

Importing this package starts nothing: no thread, no process. ``init()`` (or the first
call that needs it) starts the embedded runtime.
"""

import os as _os

from lightwork import (
    actor,  # ray.actor
    cloudpickle,  # ray.cloudpickle
    exceptions,  # ray.exceptions
    job_config,  # ray.job_config
    runtime_context,  # ray.runtime_context
)
from lightwork.api import (
    ActorClass,
    ActorHandle,
    DynamicObjectRefGenerator,
    ObjectRef,
    ObjectRefGenerator,
    available_resources,
    backend,
    cancel,
    cluster_resources,
    get,
    get_actor,
    get_gpu_ids,
    get_runtime_context,
    init,
    is_initialized,
    kill,
    method,
    nodes,
    put,
    remote,
    shutdown,
    wait,
)
from lightwork.kernel.ray_alias import install_as_ray

ObjectID = ObjectRef  # Ray's old name for ObjectRef

# The diagnostics, ray.util and ray.util.state are a third of this package's import time.
# The driver imports them here (so ``init()`` pays none of it); the fork server, which
# imports this package before it can start the first worker, leaves them to first use
# (PEP 562 ``__getattr__``), so the first tasks start sooner.
_WORKER_IMPORT_VARIABLE = "_LIGHTWORK_WORKER_IMPORT"  # set by the fork server while it imports
_LAZY = {
    "advise": ("lightwork.diagnostics.advisor", "advise"),
    "stack": ("lightwork.diagnostics.stack", "stack"),
    "profile": ("lightwork.diagnostics.timeline", "profile"),
    "profile_tasks": ("lightwork.diagnostics.task_profiler", "profile_tasks"),
    "timeline": ("lightwork.diagnostics.timeline", "timeline"),
    "state": ("lightwork.state", None),
    "util": ("lightwork.util", None),
}
# Modules imported only when a program names them, in the driver too: Ray programs
# rarely use them, so `import lightwork` does not pay for them.
_ON_USE = {
    "_raylet": ("lightwork._raylet", None),
    "dag": ("lightwork.dag", None),
    "experimental": ("lightwork.experimental", None),
    "ray_constants": ("lightwork.ray_constants", None),
}


def __getattr__(name: str) -> object:
    import importlib

    where = _LAZY.get(name) or _ON_USE.get(name)
    if where is None:
        raise AttributeError(f"module 'lightwork' has no attribute {name!r}")
    module = importlib.import_module(where[0])
    value = module if where[1] is None else getattr(module, where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

__version__ = "0.1.0"  # the package version: pyproject.toml reads this literal

__all__ = [
    "ActorClass",
    "ActorHandle",
    "DynamicObjectRefGenerator",
    "ObjectID",
    "ObjectRef",
    "ObjectRefGenerator",
    "actor",
    "advise",
    "available_resources",
    "backend",
    "cancel",
    "cloudpickle",
    "cluster_resources",
    "dag",
    "exceptions",
    "experimental",
    "get",
    "get_actor",
    "get_gpu_ids",
    "get_runtime_context",
    "init",
    "install_as_ray",
    "is_initialized",
    "job_config",
    "kill",
    "method",
    "nodes",
    "profile",
    "profile_tasks",
    "put",
    "ray_constants",
    "remote",
    "runtime_context",
    "shutdown",
    "stack",
    "state",
    "timeline",
    "util",
    "wait",
]


if _os.environ.get(_WORKER_IMPORT_VARIABLE) != "1":
    for _name in _LAZY:
        __getattr__(_name)
    del _name
    # The tools the layers below use by registration (see lightwork.kernel.tools).
    from lightwork import dashboard as _dashboard

    _dashboard.register()
    del _dashboard
