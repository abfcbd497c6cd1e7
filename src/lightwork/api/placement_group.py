"""Placement groups (Ray's ``ray.util.placement_group``), with one-machine semantics.

``placement_group(bundles, strategy)`` reserves resources: each bundle (a dict such as
``{"CPU": 2}``) is held for the group as soon as the whole group fits, in creation
order. Tasks and actors run in it with
``.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, bundle_index))``:
they use only the reservation (tasks outside the group cannot use it). On one machine
PACK, SPREAD and STRICT_PACK all place every bundle here; STRICT_SPREAD of more than one
bundle, or a bundle or group larger than the machine, can never be satisfied, and fails
at creation instead of waiting forever (Ray waits; lightwork is stricter on purpose).
Likewise a task asking for more than its bundle (or than any bundle, for index -1)
fails at ``.remote()``.

``pg.ready()`` is an ObjectRef that resolves (to ``pg``) once the group is reserved: as
in Ray, it is a tiny task that runs inside the group. ``remove_placement_group(pg)``
gives the resources back; actors in the group are killed, tasks still waiting for it
(and later submissions to it) fail with ``TaskPlacementGroupRemoved``, and running tasks
finish.

``placement_group_capture_child_tasks=True`` places the tasks and actors that a task
submits in its group (any bundle, capturing in turn) unless they name a strategy
themselves. Given to an actor, it does the same for the tasks and actors its methods
make: the actor's worker keeps the actor's shape (``Worker.placed_in``, sent with
``ACTOR_INIT``) because its calls carry none. ``get_current_placement_group()`` works
inside tasks and actors. A GPU bundle's calls get the bundle's own GPU ids.

A group belongs to its session: after ``shutdown()``, using an old group (in a strategy,
``ready()``, ``remove_placement_group``, ``placement_group_table``) raises
``SessionEndedError``, before any new ``init()`` (starting no runtime) and after one.

The bookkeeping is the scheduler's (``lightwork.engines.local.scheduler``); this module
checks arguments and talks to it through the backend's placement-group methods.
"""

from __future__ import annotations

import numbers
from typing import Any

from lightwork.api import core
from lightwork.kernel.resources import READY_CHECK_UNITS, STRATEGIES, Shape, group_shape

__all__ = [
    "PlacementGroup",
    "get_current_placement_group",
    "get_placement_group",
    "placement_group",
    "placement_group_table",
    "remove_placement_group",
]


class PlacementGroupID:
    """A group's id; ``hex()`` as in Ray."""

    __slots__ = ("_hex",)

    def __init__(self, hex_id: str) -> None:
        self._hex = hex_id

    def hex(self) -> str:
        return self._hex

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlacementGroupID) and other._hex == self._hex

    def __hash__(self) -> int:
        return hash(self._hex)

    def __repr__(self) -> str:
        return f"PlacementGroupID({self._hex})"


class PlacementGroup:
    """A handle on a placement group; pickles, so tasks and actors can use it too."""

    def __init__(self, group_id: int, bundles: list[dict[str, float]], strategy: str,
                 name: str = "") -> None:
        self._group_id = group_id
        self.id = PlacementGroupID(f"{group_id:016x}")
        self.bundle_specs = [dict(bundle) for bundle in bundles]
        self.strategy = strategy
        self.name = name

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_specs)

    @property
    def hex(self) -> str:
        return self.id.hex()

    def ready(self) -> Any:
        """An ObjectRef that resolves to this group once its resources are reserved."""
        from lightwork.api.scheduling_strategies import PlacementGroupSchedulingStrategy

        return _ready_check.options(
            num_cpus=0, resources={"bundle": READY_CHECK_UNITS},
            scheduling_strategy=PlacementGroupSchedulingStrategy(self),
        ).remote(self)

    def wait(self, timeout_seconds: float = 30) -> bool:
        """Whether the group is reserved within ``timeout_seconds``."""
        ready, _ = core.wait([self.ready()], timeout=timeout_seconds)
        return bool(ready)

    def __reduce__(self) -> tuple[Any, ...]:
        return (PlacementGroup, (self._group_id, self.bundle_specs, self.strategy, self.name))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlacementGroup) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        name = f", name={self.name!r}" if self.name else ""
        return f"PlacementGroup({self.hex}, {self.strategy}, {self.bundle_specs}{name})"


def _return_group(group: PlacementGroup) -> PlacementGroup:
    return group


_ready_check = core.remote(_return_group)


def placement_group(bundles: list[dict[str, float]], strategy: str = "PACK", name: str = "",
                    lifetime: str | None = None, _max_cpu_fraction_per_node: float | None = None,
                    _soft_target_node_id: str | None = None,
                    bundle_label_selector: Any = None) -> PlacementGroup:
    """Reserve ``bundles`` (a list of resource dicts) as one group; see the module doc.

    Returns at once; ``pg.ready()`` resolves when the reservation is made.
    """
    checked = _check_bundles(bundles)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {name!r}")
    if lifetime not in (None, "detached"):
        raise ValueError(f"lifetime must be None or 'detached', got {lifetime!r}")
    if lifetime == "detached":
        _warn_detached()
    backend = core._core()
    group_id = backend.next_object_id()
    group = PlacementGroup(group_id, checked, strategy, name)
    backend.create_placement_group(group_id, group.hex, name, checked, strategy)
    return group


def remove_placement_group(placement_group: PlacementGroup) -> None:
    """Give the group's resources back; its actors are killed, its waiting tasks fail."""
    _check_group(placement_group, "remove_placement_group")
    _check_session(placement_group)
    core._core().remove_placement_group(placement_group._group_id)


def placement_group_table(placement_group: PlacementGroup | None = None) -> dict[str, Any]:
    """Every group of the session by id (or the one given): bundles, strategy, state
    (PENDING, CREATED or REMOVED)."""
    if placement_group is not None:
        _check_group(placement_group, "placement_group_table")
        _check_session(placement_group)
    table = core._core().placement_group_table()
    if placement_group is None:
        return table
    return table.get(placement_group.hex, {})


def get_placement_group(placement_group_name: str) -> PlacementGroup:
    """The live group created with ``name=placement_group_name``."""
    for row in placement_group_table().values():
        if row["name"] == placement_group_name and row["state"] != "REMOVED":
            return _from_row(row)
    raise ValueError(
        f"no placement group named {placement_group_name!r}; create it with "
        f"placement_group(bundles, name={placement_group_name!r})")


def get_current_placement_group() -> PlacementGroup | None:
    """The group the calling task runs in, or None (in the driver, or outside groups)."""
    resources = core.get_runtime_context().get_assigned_resources()
    for resource in resources:
        if "_group_" in resource:
            group_hex = resource.rsplit("_", 1)[1]
            row = placement_group_table().get(group_hex)
            if row is not None:
                return _from_row(row)
    return None


def _from_row(row: dict[str, Any]) -> PlacementGroup:
    bundles = [row["bundles"][index] for index in sorted(row["bundles"])]
    return PlacementGroup(int(row["placement_group_id"], 16), bundles, row["strategy"], row["name"])


def _check_group(value: Any, call: str) -> None:
    if not isinstance(value, PlacementGroup):
        raise TypeError(f"{call}() needs a PlacementGroup (from placement_group(...)), "
                        f"got {type(value).__name__}: {value!r:.80}")


def _warn_detached() -> None:
    from lightwork.kernel.runtime_env import warn_once
    from lightwork.kernel.exceptions import IgnoredOptionWarning

    warn_once(
        "placement_group:detached",
        "placement_group(lifetime='detached') has no effect in lightwork: every group already "
        "lives until remove_placement_group() or shutdown(), and nothing outlives the session "
        "(there is no cluster to keep it); call remove_placement_group() when done with it.",
        IgnoredOptionWarning)


def _check_session(group: PlacementGroup) -> None:
    """Raise SessionEndedError if ``group`` was made in a session that has ended."""
    from lightwork.kernel.exceptions import SessionEndedError

    backend = core._backend
    if backend is not None and not backend.closed:
        if not backend.minted_before_session(group._group_id):
            return  # this session's (a worker or the cluster backend cannot tell: trusted)
        now = "This session cannot see it"
    else:
        now = "No lightwork runtime is running now, and none was started for it"
    raise SessionEndedError(group.hex, (
        f"placement group {group.hex} belongs to a lightwork session that has ended "
        f"(shutdown() was called after it was made), so its reservation is gone. {now}: "
        "placement groups do not outlive their session. Call lightwork.init() if needed, "
        "then create the group again with placement_group(...)."))


def _check_bundles(bundles: Any) -> list[dict[str, float]]:
    if not isinstance(bundles, (list, tuple)) or not bundles:
        raise ValueError(f"bundles must be a non-empty list of resource dicts such as "
                         f"[{{'CPU': 1}}, {{'CPU': 1}}], got {bundles!r:.80}")
    checked = []
    for index, bundle in enumerate(bundles):
        if not isinstance(bundle, dict):
            raise TypeError(f"bundle {index} must be a dict of resource -> amount, got {bundle!r:.80}")
        clean: dict[str, float] = {}
        for resource, amount in bundle.items():
            if not isinstance(resource, str):
                raise TypeError(f"bundle {index}: resource names are strings, got {resource!r}")
            if isinstance(amount, bool) or not isinstance(amount, numbers.Real) or amount < 0:
                raise ValueError(f"bundle {index}: {resource} must be a number >= 0, got {amount!r}")
            if not amount:
                continue
            clean[resource] = float(amount)
        if not clean:
            raise ValueError(f"bundle {index} ({bundle}) reserves nothing: a bundle needs at "
                             "least one resource above 0, such as {'CPU': 1}")
        checked.append(clean)
    return checked


def shape_in_group(shape: Shape, strategy: Any, what: str) -> Shape:
    """The resource shape of a call run under ``strategy`` (a PlacementGroupSchedulingStrategy).

    Raises ValueError when the call can never fit its bundle (any bundle, for index -1).
    """
    group: PlacementGroup = strategy.placement_group
    _check_session(group)
    index = strategy.placement_group_bundle_index
    demand = {name: amount for name, amount in shape if name != "bundle"}
    candidates = range(group.bundle_count) if index < 0 else [index]
    if not any(all(group.bundle_specs[i].get(name, 0.0) + 1e-9 >= amount
                   for name, amount in demand.items()) for i in candidates):
        where = "any bundle" if index < 0 else f"bundle {index}"
        raise ValueError(
            f"{what} needs {demand} but {where} of {group!r} reserves less, so it could "
            "never run there; ask for less with .options(), or make the bundle bigger")
    return group_shape(shape, group.hex, index,
                       capture=bool(strategy.placement_group_capture_child_tasks))
