"""Ray's ``ray.util``: ``ActorPool``, ``inspect_serializability``, ``get_node_ip_address``,
placement groups, and the submodules ``queue``, ``multiprocessing``, ``joblib``, ``state``,
``scheduling_strategies`` and ``placement_group`` (as in Ray,
``lightwork.util.placement_group`` is the function; the module is reached by
``from lightwork.util.placement_group import ...``)."""

from __future__ import annotations

from typing import Any

from lightwork.util import state
from lightwork.util import scheduling_strategies
from lightwork.util.actor_pool import ActorPool
from lightwork.util.node_ip import get_node_ip_address
from lightwork.util.placement_group import (  # the function shadows its module, as in Ray
    PlacementGroup,
    get_current_placement_group,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from lightwork.util.serializability import inspect_serializability

__all__ = ["ActorPool", "PlacementGroup", "get_current_placement_group", "get_node_ip_address",
           "get_placement_group", "inspect_serializability", "joblib", "multiprocessing",
           "placement_group", "placement_group_table", "queue", "remove_placement_group",
           "scheduling_strategies", "state"]


def __getattr__(name: str) -> Any:
    # Imported when first used, as `ray.util.queue` / `ray.util.multiprocessing` are.
    if name in ("queue", "multiprocessing", "joblib"):
        import importlib

        return importlib.import_module(f"lightwork.util.{name}")
    raise AttributeError(f"module 'lightwork.util' has no attribute {name!r}")
