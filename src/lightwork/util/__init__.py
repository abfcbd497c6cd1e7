"""Ray's ``ray.util``: ``ActorPool``, ``inspect_serializability``, placement groups, and the
submodules ``queue``, ``multiprocessing``, ``state`` and ``scheduling_strategies``."""

from __future__ import annotations

from typing import Any

from lightwork.util import scheduling_strategies, state
from lightwork.util.actor_pool import ActorPool
from lightwork.util.serializability import inspect_serializability

__all__ = ["ActorPool", "inspect_serializability", "multiprocessing", "queue",
           "scheduling_strategies", "state"]


def __getattr__(name: str) -> Any:
    # Imported when first used, as `ray.util.queue` / `ray.util.multiprocessing` are.
    if name in ("queue", "multiprocessing"):
        import importlib

        return importlib.import_module(f"lightwork.util.{name}")
    raise AttributeError(f"module 'lightwork.util' has no attribute {name!r}")
