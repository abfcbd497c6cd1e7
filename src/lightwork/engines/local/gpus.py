"""Which GPU ids a task or actor gets: ``get_gpu_ids()`` and ``CUDA_VISIBLE_DEVICES``.

The scheduler counts GPUs as a number (``scheduler.py``); this picks *which* GPUs. Each
GPU id has a free share from 0 to 1, so fractional requests (``num_gpus=0.5``) share a
GPU and a whole request takes whole GPUs, most free first, as in Ray. A holder (a task
id while it is dispatched, an actor id while its process lives) keeps what it took until
``release``.

Placement groups (Ray's semantics on one machine): when a group is reserved, each bundle
that asks for GPUs takes its ids from the node's pool into a pool of its own, so the
group's GPUs are the same ids for all of its life and nothing outside the group gets
them. A task or actor placed in bundle ``i`` takes from that bundle's pool; one placed in
the group without an index takes from its bundles in order. Removing a group gives its
bundles' free shares back to the node; shares still held by a running task go back to
the node when it ends.

State is owned by the node and touched under its lock; no I/O here.
"""

from __future__ import annotations

from lightwork.engines.local.scheduler import PlacementGroupState, Shape

_EPS = 1e-9
_GROUP_GPU = "GPU_group_"


class GpuPool:
    """Free shares of some GPU ids: the node's, or one bundle's."""

    __slots__ = ("free", "removed")

    def __init__(self, free: dict[int, float]) -> None:
        self.free = free
        self.removed = False  # a removed group's bundle: shares given back go to the node

    def take(self, need: float, chosen: list[tuple[GpuPool, int, float]]) -> float:
        """Take up to ``need`` GPUs (a whole GPU per unit, most free first) into
        ``chosen``; return what is still needed."""
        free = self.free
        for gpu_id in sorted(free, key=lambda i: (-free[i], i)):
            if need <= _EPS:
                break
            share = min(1.0, need)
            if free[gpu_id] + _EPS >= share:
                free[gpu_id] -= share
                chosen.append((self, gpu_id, share))
                need -= share
        return need


class GpuIds:
    """The node's GPU ids, the placement groups' bundles of them, and who holds what."""

    def __init__(self, count: int) -> None:
        self.node = GpuPool({gpu_id: 1.0 for gpu_id in range(count)})
        self.any = count > 0  # no GPUs: every assignment is () without looking at shapes
        self.bundles: dict[str, list[GpuPool | None]] = {}  # group hex -> a pool per bundle
        self.held: dict[int, list[tuple[GpuPool, int, float]]] = {}

    def assign(self, holder: int, shape: Shape) -> tuple[int, ...]:
        """Take GPU ids for a task or actor of ``shape``; return them (sorted)."""
        if self.held:
            self.release(holder)  # a task dispatched again (requeued) takes afresh
        chosen: list[tuple[GpuPool, int, float]] = []
        for name, amount in shape:
            if name == "GPU":
                self.node.take(amount, chosen)
            elif name.startswith(_GROUP_GPU):
                where = name[len(_GROUP_GPU):].split("_")
                if len(where) == 1:  # GPU_group_<hex>: the group's total
                    if not any(n.startswith(_GROUP_GPU) and n.count("_") == 3
                               for n, _ in shape):
                        self._take_in_group(where[0], amount, chosen)
                else:  # GPU_group_<index>_<hex>: one bundle
                    self._take_in_group(where[1], amount, chosen, int(where[0]))
        if not chosen:
            return ()
        self.held[holder] = chosen
        return tuple(sorted({gpu_id for _, gpu_id, _ in chosen}))

    def _take_in_group(self, group_hex: str, need: float,
                       chosen: list[tuple[GpuPool, int, float]], index: int = -1) -> None:
        pools = self.bundles.get(group_hex, [])
        if index >= 0:
            pools = pools[index:index + 1]
        for pool in pools:
            if pool is not None and need > _EPS:
                need = pool.take(need, chosen)

    def release(self, holder: int) -> None:
        for pool, gpu_id, share in self.held.pop(holder, ()):
            (self.node if pool.removed else pool).free[gpu_id] += share

    def reserve_group(self, group: PlacementGroupState) -> None:
        """Give each bundle of a just-reserved group that asks for GPUs its own ids."""
        pools: list[GpuPool | None] = []
        for bundle in group.bundles:
            need = bundle.get("GPU", 0.0)
            if not need:
                pools.append(None)
                continue
            taken: list[tuple[GpuPool, int, float]] = []
            self.node.take(need, taken)
            pool = GpuPool({})
            for _, gpu_id, share in taken:
                pool.free[gpu_id] = pool.free.get(gpu_id, 0.0) + share
            pools.append(pool)
        if any(pool is not None for pool in pools):
            self.bundles[group.hex] = pools

    def remove_group(self, group_hex: str) -> None:
        for pool in self.bundles.pop(group_hex, ()):
            if pool is not None:
                pool.removed = True
                for gpu_id, share in pool.free.items():
                    self.node.free[gpu_id] += share
                pool.free.clear()
