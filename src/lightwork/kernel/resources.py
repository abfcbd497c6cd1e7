"""Resource shapes: what a task or actor asks for, as the scheduler and the API see it.

A shape is a sorted tuple of (resource name, amount), amounts > 0: hashable, so the
scheduler groups queued tasks by it, and cheap to compare. Placement groups reserve
bundles as resources named as Ray names them (``CPU_group_<hex>``,
``CPU_group_<index>_<hex>``); a task placed in a group asks for those instead.
"""

from __future__ import annotations

#: A resource request: sorted (name, amount) pairs, no zero amounts.
Shape = tuple[tuple[str, float], ...]


def describe_amount(name: str, amount: float) -> str:
    """``amount`` of resource ``name`` for a message: memory in bytes and GiB."""
    if name == "memory" or name.startswith("memory_group_"):
        return f"{amount:,.0f} bytes of {name} ({amount / 2**30:.2f} GiB)"
    return f"{amount:g} {name}"


def make_shape(resources: dict[str, float]) -> Shape:
    return tuple(sorted((name, float(amount)) for name, amount in resources.items() if amount))



# -- placement groups ------------------------------------------------------------------
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
BUNDLE_UNITS = 1000.0  # each bundle's "bundle" resource; a ready() check takes a sliver
READY_CHECK_UNITS = 0.001
CAPTURE = "capture"  # a group resource whose sliver marks a task whose children it captures
CAPTURE_PREFIX = f"{CAPTURE}_group_"


def group_resource(name: str, group_hex: str, index: int = -1) -> str:
    """Ray's name for resource ``name`` reserved by a group (``index`` -1: any bundle)."""
    return f"{name}_group_{group_hex}" if index < 0 else f"{name}_group_{index}_{group_hex}"


def group_shape(shape: Shape, group_hex: str, index: int, capture: bool = False) -> Shape:
    """The shape a task of ``shape`` asks for inside a group (bundle ``index``, -1: any).

    ``capture``: the task's own tasks run in the group too; it carries a sliver of the
    group's ``capture`` resource, which the worker reads (see :func:`captured_shape`)."""
    demand: dict[str, float] = {}
    for name, amount in shape:
        demand[group_resource(name, group_hex)] = amount
        if index >= 0:
            demand[group_resource(name, group_hex, index)] = amount
    if capture:
        demand[group_resource(CAPTURE, group_hex)] = READY_CHECK_UNITS
    return make_shape(demand)


def captured_shape(shape: Shape, parent: Shape) -> Shape:
    """The shape of a task submitted from a task of shape ``parent``: if the parent runs
    with ``placement_group_capture_child_tasks``, the same group (any bundle, capturing
    in turn) unless the task names a group itself; else ``shape`` unchanged."""
    for name, _ in parent:
        if name.startswith(CAPTURE_PREFIX):
            if any("_group_" in own for own, _ in shape):
                return shape
            return group_shape(shape, name.rsplit("_", 1)[1], -1, capture=True)
    return shape
