"""Ray's scheduling strategies, passed as ``.options(scheduling_strategy=...)``.

On one machine every strategy places on this node; what they still mean:

* ``PlacementGroupSchedulingStrategy`` runs the task or actor inside a placement group's
  bundle, on the resources the bundle reserved (see ``lightwork.util.placement_group``);
* ``NodeAffinitySchedulingStrategy`` names a node: this node's id works, and any other
  id fails at submission unless ``soft=True`` (then it runs here, as Ray would fall back);
* the strings ``"DEFAULT"`` and ``"SPREAD"`` are accepted and place here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["STRATEGY_NAMES", "NodeAffinitySchedulingStrategy",
           "PlacementGroupSchedulingStrategy"]

STRATEGY_NAMES = ("DEFAULT", "SPREAD")


class PlacementGroupSchedulingStrategy:
    """Run inside ``placement_group``: in bundle ``placement_group_bundle_index`` (-1: any).

    ``placement_group_capture_child_tasks=True`` on a task or an actor makes the tasks
    and actors it (or its methods) submits run in the same group (any bundle, capturing in
    turn) unless they name a strategy themselves (see ``lightwork.util.placement_group``).
    """

    def __init__(self, placement_group: Any, placement_group_bundle_index: int = -1,
                 placement_group_capture_child_tasks: bool | None = None) -> None:
        from lightwork.api.placement_group import PlacementGroup

        if not isinstance(placement_group, PlacementGroup):
            raise TypeError(
                "PlacementGroupSchedulingStrategy needs the PlacementGroup returned by "
                f"placement_group(...), got {type(placement_group).__name__}: "
                f"{placement_group!r:.80}")
        index = placement_group_bundle_index
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"placement_group_bundle_index must be an int, got {index!r}")
        if index < -1 or index >= placement_group.bundle_count:
            raise ValueError(
                f"placement_group_bundle_index={index} is out of range for {placement_group!r}, "
                f"which has {placement_group.bundle_count} bundle(s): use 0.."
                f"{placement_group.bundle_count - 1}, or -1 for any bundle")
        self.placement_group = placement_group
        self.placement_group_bundle_index = index
        self.placement_group_capture_child_tasks = placement_group_capture_child_tasks

    def __repr__(self) -> str:
        return (f"PlacementGroupSchedulingStrategy({self.placement_group!r}, "
                f"bundle_index={self.placement_group_bundle_index}, "
                f"capture_child_tasks={self.placement_group_capture_child_tasks})")


class NodeAffinitySchedulingStrategy:
    """Run on the node ``node_id`` (``soft=True``: anywhere if that node cannot)."""

    def __init__(self, node_id: str, soft: bool, _spill_on_unavailable: bool = False,
                 _fail_on_unavailable: bool = False) -> None:
        if not isinstance(node_id, str):
            raise TypeError(
                f"NodeAffinitySchedulingStrategy needs a node id string (from "
                f"lightwork.get_runtime_context().get_node_id()), got {node_id!r:.80}")
        self.node_id = node_id
        self.soft = bool(soft)
        self._spill_on_unavailable = _spill_on_unavailable
        self._fail_on_unavailable = _fail_on_unavailable

    def __repr__(self) -> str:
        return f"NodeAffinitySchedulingStrategy(node_id={self.node_id!r}, soft={self.soft})"


def check_strategy(strategy: Any, what: str) -> None:
    """Refuse a ``scheduling_strategy`` option that is none of Ray's kinds."""
    if strategy is None or strategy in STRATEGY_NAMES:
        return
    if isinstance(strategy, (PlacementGroupSchedulingStrategy, NodeAffinitySchedulingStrategy)):
        return
    raise ValueError(
        f"scheduling_strategy={strategy!r:.80} for {what} is not one of Ray's strategies: "
        "use None, 'DEFAULT', 'SPREAD', PlacementGroupSchedulingStrategy(...) or "
        "NodeAffinitySchedulingStrategy(...) from lightwork.util.scheduling_strategies")


def shape_for(options: dict[str, Any], shape: Any, what: str) -> Any:
    """The resource shape of a call with these options, once its strategy is applied:
    inside a placement group, the group's resource names; elsewhere ``shape`` itself.
    A NodeAffinity to another node (not soft) fails here, at ``.remote()``."""
    strategy = options.get("scheduling_strategy")
    legacy_group = options.get("placement_group")  # Ray's older options
    if strategy is None and legacy_group not in (None, "default"):
        strategy = PlacementGroupSchedulingStrategy(
            legacy_group, options.get("placement_group_bundle_index", -1))
    if strategy is None or isinstance(strategy, str):
        return shape
    if isinstance(strategy, NodeAffinitySchedulingStrategy):
        if not strategy.soft:
            from lightwork.api import core

            if core.backend() != "local":  # (soft: a preference, met anywhere)
                from lightwork.kernel.exceptions import UnsupportedOnBackend

                raise UnsupportedOnBackend(
                    f"NodeAffinitySchedulingStrategy(soft=False) for {what} is not supported "
                    f"on the {core.backend()} backend: lightwork does not pin tasks to "
                    "one Dask worker; declare a resource on that worker (dask worker "
                    "--resources 'node_a=1') and ask for it with resources={'node_a': 1}, "
                    "or pass soft=True")
            here = core.get_runtime_context().get_node_id()
            if strategy.node_id != here:
                raise ValueError(
                    f"{what} has NodeAffinitySchedulingStrategy(node_id={strategy.node_id!r}, "
                    f"soft=False), but this runtime is one node, {here!r}; use that id "
                    "(lightwork.get_runtime_context().get_node_id()) or soft=True")
        return shape
    from lightwork.api.placement_group import shape_in_group

    return shape_in_group(shape, strategy, what)
