"""Task placement: which ready task runs on which worker, and when.

Pure decision logic with no I/O, so tests drive it without processes. The node calls it
while holding its lock and carries out the assignments it returns.

State, each piece owned here:

* ``available``: resources not held by running tasks (CPU, GPU, ``memory`` and custom
  names); ``total`` is fixed at ``init``. ``memory`` is Ray's logical memory resource, in
  bytes: a task or actor with ``memory=X`` reserves X for scheduling, nothing measures or
  limits what it really uses (``Node`` sets the total). A worker blocked in ``get``/``wait`` lends the
  resources of its task back, and takes them again when it resumes (which may briefly
  oversubscribe, as in Ray; nothing new is placed until ``available`` recovers).
* ``ready``: one FIFO queue per resource shape, so a task waiting for a GPU never holds
  back CPU-only tasks behind it.
* workers: ``idle`` ones, and busy ones with their ``inflight`` tasks in order.
  A worker is of one *kind* for its life, as in Ray: it runs either tasks that need no
  GPU or tasks that need one (:func:`needs_own_workers`), never both, so what a GPU task
  sets up in its process (``CUDA_VISIBLE_DEVICES``, a CUDA context, GPU libraries) is
  never what a CPU task finds, and a GPU task never waits behind a CPU task's worker.
  The GPU kind's idle workers are ``idle_gpu``; each slot knows its own idle set
  (``WorkerSlot.idle_set``), so a task's end files it without asking its kind. A ready
  GPU task with no idle GPU worker counts in ``starving_gpu``: the node starts a worker
  of that kind for it.

Policy: a ready task goes to an idle worker when its resources fit (the node starts a
worker when none is idle): to the one idle for the shortest time, so a run of
synchronous calls keeps one warm worker busy instead of waking each in turn, whose
caches would have gone cold. When they do not fit — every slot is busy — short tasks
(the function's recent mean run time below ``SHORT_TASK_S``) may be queued behind a
running short task of the same shape, up to a depth that covers a window of work, so
workers never wait for a round trip between tiny tasks. Long or unknown tasks are never
queued behind another, nor is anything queued behind them (it would wait for their end
while other slots free up), so they spread over the workers as slots free up.

The window follows the passes: it is the gap since the previous pass, between
``PIPELINE_WINDOW_S`` (5 ms, the interpreter's switch interval) and ``MAX_WINDOW_S``,
and the widest at once when the node registers more submissions queued while every
worker was busy than there are workers (``submitting``: a loop is submitting, and holds
the GIL); the depth's cap grows with it (``MAX_PIPELINE_DEPTH`` per 5 ms). Why: the
workers get work for the whole gap until the next pass, not for a fixed part of it,
while passes close together keep the narrow window, so what waits behind an outlier
stays small once the program stops submitting.

A task that a worker blocked in a nested ``get`` or ``wait`` waits for runs before the
tasks nobody waits for (``run_first``: to the front of its queue, and its shape's queue
to the front of the pass). The blocked worker lends its CPU; in FIFO order the next task
in the queue would take it, often another caller that blocks in turn on a new worker, so
a thousand callers of one nested call took two thousand workers, and a recursion
(``fib(n - 1)`` and ``fib(n - 2)`` from ``fib(n)``) ran breadth first with a worker per
blocked call. Waited-for tasks first finish each caller's chain before the next caller
starts: depth first, with a few workers per level. Ray reaches the same end by queueing
fairly across functions.

Measured: see bench/HOTPATH.md, "The scheduler's window".

Placement groups (Ray's, with one-machine semantics). A group reserves its bundles'
resources: they leave ``available`` and come back under group names, as in Ray —
``CPU_group_<hex>`` for the whole group and ``CPU_group_<i>_<hex>`` for bundle ``i``
(likewise GPU and custom resources, plus ``bundle_group_<hex>``, the sliver that
``PlacementGroup.ready()`` asks for). A task placed in the group asks for the group names
instead of the plain ones (:func:`group_shape`; a task for bundle ``i`` takes both names,
so bundle and group totals both hold), so tasks outside cannot use the reservation and
tasks inside use only it; nothing else in the policy changes. A task placed with
``placement_group_capture_child_tasks`` also takes a sliver of ``capture_group_<hex>``:
a worker seeing it in its running task's shape places that task's own tasks in the group
(:func:`captured_shape`). Groups are reserved in
creation order (``pending_groups``) as soon as their whole demand fits; the node hears of
each reservation (``newly_reserved``) to give its bundles their GPU ids (``gpus.py``). Every strategy
but STRICT_SPREAD is satisfied on one node; what can never fit (STRICT_SPREAD of more
than one bundle, a bundle or a group larger than the machine) is refused at creation.
Removing a group gives its resources back; its names leave ``total`` and keep a negative
``available``, so tasks still running in it give back into a name nothing can use, and
ready tasks for it are handed to the node to fail (``orphaned``).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lightwork.kernel.events import TaskRecord
from lightwork.kernel.resources import (
    BUNDLE_UNITS,
    CAPTURE,
    STRATEGIES,
    Shape,
    describe_amount,
    group_resource,
    make_shape,
)
from lightwork.kernel.serialization import Stored

SHORT_TASK_S = 0.001
PIPELINE_WINDOW_S = 0.005
MAX_PIPELINE_DEPTH = 32
MAX_WINDOW_S = 0.1
#: How far from its queue's tail ``run_first`` looks for a task before searching the queue.
FIRST_SCAN = 64
_EPS = 1e-9

# task states
WAITING = "PENDING_ARGS_AVAIL"
READY = "PENDING_NODE_ASSIGNMENT"
DISPATCHED = "SUBMITTED_TO_WORKER"
FINISHED = "FINISHED"
FAILED = "FAILED"


@dataclass(slots=True, eq=False)
class TaskSpec:
    task_id: int
    function_key: bytes
    name: str
    args: Stored
    deps: tuple[int, ...]  # ids of top-level ref arguments, in ArgSlot order
    return_ids: tuple[int, ...]
    num_returns: int
    shape: Shape
    max_retries: int
    retry_exceptions: Any
    owner: int
    record: TaskRecord
    # (These three next: callers pass them by position, as a keyword costs a search of
    # the parameters.)
    actor_id: int = 0  # a method call of this actor, else 0 for a task
    parent: int = 0  # the task that submitted this one from its worker, else 0 (the driver)
    # The common call, which the node registers and ends in fewer steps (node.py,
    # worker_requests.py): the driver's task or actor call with one return, no
    # dependencies and inline arguments without refs.
    plain: bool = False
    attempt: int = 0
    unready: int = 0
    state: str = WAITING
    cancelled: bool = False
    worker: WorkerSlot | None = None


def needs_own_workers(shape: Shape) -> bool:
    """Whether tasks of ``shape`` run on workers of the GPU kind (module docstring)."""
    return any(name == "GPU" or name.startswith(_GPU_GROUP) for name, _ in shape)


_GPU_GROUP = "GPU_group_"


@dataclass(slots=True, eq=False)
class WorkerSlot:
    worker_id: int
    inflight: deque[TaskSpec] = field(default_factory=deque)
    # The scheduler's idle set of this worker's kind (``idle`` or ``idle_gpu``) while it
    # is a pooled task worker; None for an actor's process, which is never idle here.
    idle_set: dict[int, WorkerSlot] | None = None
    held: Shape = ()
    blocked: int = 0
    blocked_in: str = ""  # "get" or "wait": the nested call the worker last blocked in
    alive: bool = True


class Scheduler:
    def __init__(self, total: dict[str, float]) -> None:
        self.total = dict(total)
        self.available = dict(total)
        self.ready: dict[Shape, deque[TaskSpec]] = {}
        self.workers: dict[int, WorkerSlot] = {}
        self.idle: dict[int, WorkerSlot] = {}  # insertion-ordered set
        self.idle_gpu: dict[int, WorkerSlot] = {}  # idle workers of the GPU kind
        # The idle set a shape's tasks draw from, by shape (one test per shape, ever).
        self.idle_for: dict[Shape, dict[int, WorkerSlot]] = {}
        # Whether a driver's submit may wait in the node lock's queue when no worker of
        # the CPU kind is idle (driver_calls.py): workers exist and none of the GPU kind
        # is idle, which a GPU task would have to wait for the queue's next taker for.
        self.may_queue = False
        self.mean_run_time: dict[bytes, float] = {}
        self.window_s = PIPELINE_WINDOW_S  # the work a pass may queue ahead on a worker
        self.last_pass: float | None = None  # when the last timed pass ran (schedule(now))
        # Set by the node when it registers a run of submissions queued while every
        # worker was busy: the program is submitting in a loop, so the next pass is late.
        self.submitting = False
        self.starving = 0  # ready tasks that fit but found no worker in the last pass
        self.starving_gpu = 0  # of which tasks that need a worker of the GPU kind
        self.groups: dict[int, PlacementGroupState] = {}
        self.pending_groups: deque[PlacementGroupState] = deque()
        self.removed_names: set[str] = set()  # resource names of removed groups
        self.orphaned: list[TaskSpec] = []  # ready tasks of removed groups, for the node to fail
        self.newly_reserved: list[PlacementGroupState] = []  # for the node (its GPU ids)

    # -- resources -------------------------------------------------------------------
    def check_feasible(self, shape: Shape) -> str | None:
        """Why a task of this shape can never run here, or None if it can."""
        for name, amount in shape:
            have = self.total.get(name, 0.0)
            if amount > have + _EPS:
                return (
                    f"it needs {describe_amount(name, amount)} but the runtime has "
                    f"{describe_amount(name, have)} in total"
                )
        return None

    def _fits(self, shape: Shape) -> bool:
        available = self.available
        for name, amount in shape:  # a loop, not all(<genexpr>): once per task placed
            if available.get(name, 0.0) + _EPS < amount:
                return False
        return True

    def _acquire(self, shape: Shape) -> None:
        for name, amount in shape:
            self.available[name] -= amount

    def _give_back(self, shape: Shape) -> None:
        for name, amount in shape:
            self.available[name] += amount

    # -- workers ---------------------------------------------------------------------
    def add_worker(self, worker_id: int, gpu: bool = False) -> WorkerSlot:
        """A new pooled task worker, of the GPU kind if ``gpu`` (module docstring)."""
        idle_set = self.idle_gpu if gpu else self.idle
        slot = WorkerSlot(worker_id, idle_set=idle_set)
        self.workers[worker_id] = slot
        idle_set[worker_id] = slot
        self.update_may_queue()
        return slot

    def update_may_queue(self) -> None:
        """Recompute ``may_queue`` after the GPU kind's idle set may have changed. It may
        stay False longer than needed (a submit then takes the locked way, which is
        right, only slower), never True while a GPU worker is idle."""
        self.may_queue = bool(self.workers) and not self.idle_gpu

    def take_starving_gpu(self) -> int:
        """The GPU kind's workers the last passes wanted, for the node to start."""
        wanted, self.starving_gpu = self.starving_gpu, 0
        return wanted

    def _idle_set_for(self, shape: Shape) -> dict[int, WorkerSlot]:
        idle_set = self.idle_gpu if needs_own_workers(shape) else self.idle
        self.idle_for[shape] = idle_set
        return idle_set

    def remove_worker(self, slot: WorkerSlot) -> list[TaskSpec]:
        """Forget a dead worker; return its inflight tasks (the first was running)."""
        slot.alive = False
        self.workers.pop(slot.worker_id, None)
        if slot.idle_set is not None:
            slot.idle_set.pop(slot.worker_id, None)
        self.update_may_queue()
        if slot.inflight and not slot.blocked:
            self._give_back(slot.held)
        slot.held = ()
        tasks = list(slot.inflight)
        slot.inflight.clear()
        for task in tasks:
            task.worker = None
        return tasks

    def block(self, slot: WorkerSlot, call: str = "get") -> None:
        """``slot``'s task blocked in a nested ``call`` ("get" or "wait"): its CPU goes
        back to the pool until :meth:`unblock`."""
        slot.blocked_in = call
        slot.blocked += 1
        if slot.blocked == 1 and slot.inflight:
            self._give_back(slot.held)

    def unblock(self, slot: WorkerSlot) -> None:
        slot.blocked -= 1
        if slot.blocked == 0 and slot.inflight:
            self._acquire(slot.held)

    # -- tasks -----------------------------------------------------------------------
    def make_ready(self, task: TaskSpec, front: bool = False) -> None:
        task.state = READY
        queue = self.ready.get(task.shape)
        if queue is None:
            queue = self.ready[task.shape] = deque()
        if front:
            queue.appendleft(task)
        else:
            queue.append(task)

    def run_first(self, tasks: list[TaskSpec]) -> None:
        """A worker blocks in a nested get or wait for ``tasks``: those of them that are
        ready go to the front of their queues, in the order given, ahead of the tasks
        nobody waits for (module docstring, "Policy").

        Each was most likely submitted just before the call, so it is looked for from
        the tail first (``FIRST_SCAN`` places), then anywhere. Their shapes' queues move
        to the front of ``ready`` too: a pass serves the shapes in that order, so a
        caller of another shape cannot take the CPU the blocked one lent first."""
        ready = self.ready
        first: set[Shape] = set()
        for task in reversed(tasks):
            queue = ready.get(task.shape) if task.state == READY else None
            if queue and (queue[0] is task or _take_out(queue, task)):
                if queue[0] is not task:
                    queue.appendleft(task)
                first.add(task.shape)
        if first and set(itertools.islice(ready, len(first))) != first:
            for shape in [shape for shape in ready if shape not in first]:
                ready[shape] = ready.pop(shape)  # (to the end, after the shapes first)

    def remove_ready(self, task: TaskSpec) -> bool:
        queue = self.ready.get(task.shape)
        if queue is None:
            return False
        try:
            queue.remove(task)
        except ValueError:
            return False
        return True

    def finish(self, slot: WorkerSlot, task: TaskSpec, run_time: float) -> None:
        """``task`` (the head of ``slot.inflight``) ended on its worker."""
        inflight = slot.inflight
        if inflight and inflight[0] is task:
            inflight.popleft()
        else:
            inflight.remove(task)
        task.worker = None
        run_times = self.mean_run_time
        key = task.function_key
        previous = run_times.get(key)
        run_times[key] = run_time if previous is None else 0.7 * previous + 0.3 * run_time
        if inflight:
            following = inflight[0].shape
            if following is not slot.held:  # (most often the same shape object)
                if following != slot.held and not slot.blocked:
                    self._give_back(slot.held)
                    self._acquire(following)
                slot.held = following
        else:
            if not slot.blocked:
                self._give_back(slot.held)
            slot.held = ()
            if slot.alive:
                # (a pooled worker's slot: only those finish tasks; the GPU kind's end
                # goes the node's general way, which updates ``may_queue``)
                slot.idle_set[slot.worker_id] = slot  # type: ignore[index]

    def take_back(self, slot: WorkerSlot, task: TaskSpec) -> None:
        """A queued, unstarted task came back from its worker: run it elsewhere first."""
        if task in slot.inflight:
            slot.inflight.remove(task)
            task.worker = None
            if not slot.inflight:
                if not slot.blocked:
                    self._give_back(slot.held)
                slot.held = ()
                if slot.alive and slot.idle_set is not None:
                    slot.idle_set[slot.worker_id] = slot
                    self.update_may_queue()
        self.make_ready(task, front=True)

    def schedule(self, now: float | None = None) -> list[TaskSpec]:
        """Assign ready tasks to workers, returning those placed (each on ``task.worker``:
        no pair per task, which a pass of thousands kept alive through young collections);
        set ``starving`` to the workers still wanted.

        ``now`` (the monotonic clock) times the pass: the window follows the gap since
        the last timed one, or is the widest while the program submits (``submitting``;
        see the module docstring); without ``now`` the window is kept."""
        if now is not None:
            if self.submitting:
                self.window_s = MAX_WINDOW_S
                self.submitting = False
            elif self.last_pass is not None:
                self.window_s = min(MAX_WINDOW_S, max(PIPELINE_WINDOW_S, now - self.last_pass))
            self.last_pass = now
        if self.pending_groups:
            self.reserve_groups()
        assignments: list[TaskSpec] = []
        starving = 0
        empty = []
        depths: dict[bytes, int] = {}  # each function's pipeline depth, for this pass
        idle_for = self.idle_for
        for shape, queue in self.ready.items():
            # An idle worker of the shape's kind for each task while the shape fits: the
            # one idle for the shortest time (its caches are warm, and a run of
            # synchronous calls keeps one worker busy rather than waking each in turn).
            idle = idle_for.get(shape) or self._idle_set_for(shape)
            fits = self._fits(shape)
            while queue and fits and idle:
                task = queue.popleft()
                _, slot = idle.popitem()
                self._acquire(shape)
                slot.held = shape
                task.state = DISPATCHED
                task.worker = slot
                slot.inflight.append(task)
                assignments.append(task)
                fits = self._fits(shape)
            if queue:
                if fits:  # but no worker is idle: the node starts one (a slot beats a queue)
                    wanted = min(len(queue), max(1, int(self.available.get("CPU", 1))))
                    starving += wanted
                    if idle is self.idle_gpu:
                        self.starving_gpu += wanted
                else:
                    self._queue_behind(shape, queue, depths, assignments)
                    if queue:
                        self._orphan_if_removed(shape, queue)
            if not queue:
                empty.append(shape)
        for shape in empty:
            del self.ready[shape]
        self.starving = starving
        return assignments

    def _queue_behind(self, shape: Shape, queue: deque[TaskSpec], depths: dict[bytes, int],
                      assignments: list[TaskSpec]) -> None:
        """Every slot of ``shape`` is busy: queue the short tasks at the head of
        ``queue`` behind running short tasks of this shape, each on the least loaded
        worker, within its function's pipeline depth; stop at the first that must wait.

        Nothing ends during a pass, so the workers running this shape and each
        function's depth are worked out once per pass, not per task (10,000 tasks: a
        scan of every worker and a depth per task); a run of one function's tasks then
        costs a scan of the running workers each."""
        run_times = self.mean_run_time
        running = [
            slot for slot in self.workers.values()
            if slot.inflight and not slot.blocked and slot.held == shape
            # behind a short running task only: one long or unknown would hold them
            and run_times.get(slot.inflight[0].function_key, SHORT_TASK_S) < SHORT_TASK_S]
        if not running:
            return
        queued = [len(slot.inflight) for slot in running]  # kept in step with them below
        key: bytes | None = None
        depth = 0
        while queue:
            task = queue[0]
            if task.function_key is not key:
                key = task.function_key
                found = depths.get(key)
                depth = depths[key] = self.pipeline_depth(key) if found is None else found
            fewest = min(queued)
            if fewest >= depth:  # (a depth of 1 queues nothing: long or unknown tasks spread)
                return
            index = queued.index(fewest)  # the first of the least loaded
            queued[index] = fewest + 1
            slot = running[index]
            queue.popleft()
            task.state = DISPATCHED
            task.worker = slot
            slot.inflight.append(task)
            assignments.append(task)

    def _orphan_if_removed(self, shape: Shape, queue: deque[TaskSpec]) -> None:
        if self.removed_names and any(name in self.removed_names for name, _ in shape):
            self.orphaned.extend(queue)
            queue.clear()

    def pipeline_depth(self, function_key: bytes) -> int:
        run_time = self.mean_run_time.get(function_key)
        if run_time is None or run_time >= SHORT_TASK_S:
            return 1
        window = self.window_s  # the cap grows with it: MAX_PIPELINE_DEPTH per base window
        cap = int(MAX_PIPELINE_DEPTH * window / PIPELINE_WINDOW_S)
        return max(2, min(cap, int(window / max(run_time, 1e-5))))

    def queued_count(self) -> int:
        return sum(len(queue) for queue in self.ready.values())

    def note_submitting(self) -> None:
        """More tasks were queued while every worker was busy than there are workers: a
        loop is submitting, so the next pass sends the widest batch (``schedule``)."""
        self.submitting = True

    def settle(self) -> None:
        """Nothing is ready, pending or orphaned: what a pass of ``schedule`` would
        conclude, without it (the node's dispatch finds this on most polls)."""
        self.starving = 0
        self.submitting = False  # (queued actor calls set it; no task needs it)

    def take_newly_reserved(self) -> list[PlacementGroupState]:
        """The groups reserved since the last call, for the node to give GPU ids."""
        reserved, self.newly_reserved = self.newly_reserved, []
        return reserved

    def take_orphaned(self) -> list[TaskSpec]:
        """The ready tasks of removed groups since the last call, for the node to fail."""
        orphaned, self.orphaned = self.orphaned, []
        return orphaned

    def worker_cap(self) -> int:
        blocked = sum(1 for slot in self.workers.values() if slot.blocked)
        return math.ceil(self.total.get("CPU", 1.0)) + blocked + 8

    # -- placement groups (see the module docstring) -----------------------------------
    def add_group(self, group_id: int, group_hex: str, name: str,
                  bundles: list[dict[str, float]], strategy: str) -> PlacementGroupState:
        """Register a group and reserve it now if its resources are free (else when they are).

        Raises ValueError, saying why, for a group this node can never hold."""
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        problem = _group_problem(self, bundles, strategy)
        if problem:
            raise ValueError(f"placement group {name or group_hex}: {problem}")
        group = PlacementGroupState(group_id, group_hex, name, [dict(b) for b in bundles], strategy)
        for index, bundle in enumerate(group.bundles):
            for resource, amount in [*bundle.items(), ("bundle", BUNDLE_UNITS),
                                     (CAPTURE, BUNDLE_UNITS)]:
                for key in (group_resource(resource, group_hex), group_resource(resource, group_hex, index)):
                    group.names[key] = group.names.get(key, 0.0) + amount
        for key, amount in group.names.items():
            self.total[key] = amount  # feasible from now on; usable once reserved
            self.available.setdefault(key, 0.0)
        self.groups[group_id] = group
        self.pending_groups.append(group)
        self.reserve_groups()
        return group

    def reserve_groups(self) -> None:
        """Reserve pending groups in creation order while their whole demand fits."""
        pending = self.pending_groups
        while pending:
            group = pending[0]
            demand = group.demand
            if not self._fits(demand):
                return
            self._acquire(demand)
            for key, amount in group.names.items():
                self.available[key] += amount
            group.state = GROUP_CREATED
            pending.popleft()
            self.newly_reserved.append(group)

    def remove_group(self, group_id: int) -> PlacementGroupState | None:
        """Give a group's reservation back; its ready tasks go to ``orphaned``."""
        group = self.groups.get(group_id)
        if group is None or group.state == GROUP_REMOVED:
            return group
        if group.state == GROUP_CREATED:
            self._give_back(group.demand)
        else:
            self.pending_groups.remove(group)
        for key, amount in group.names.items():
            self.total.pop(key, None)
            # Reserved and unused, this reaches 0; a running task's give-back brings it back to 0.
            self.available[key] -= amount
            self.removed_names.add(key)
        group.state = GROUP_REMOVED
        for shape, queue in list(self.ready.items()):
            self._orphan_if_removed(shape, queue)
            if not queue:
                del self.ready[shape]
        return group


# -- placement groups ----------------------------------------------------------------------
GROUP_PENDING, GROUP_CREATED, GROUP_REMOVED = "PENDING", "CREATED", "REMOVED"


@dataclass(slots=True, eq=False)
class PlacementGroupState:
    group_id: int
    hex: str
    name: str
    bundles: list[dict[str, float]]
    strategy: str
    state: str = GROUP_PENDING
    names: dict[str, float] = field(default_factory=dict)  # group resource name -> amount

    @property
    def demand(self) -> Shape:
        """The plain resources the whole group takes from ``available`` when reserved."""
        total: dict[str, float] = {}
        for bundle in self.bundles:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0.0) + amount
        return make_shape(total)

    def row(self, node_id: str) -> dict[str, Any]:
        return {
            "placement_group_id": self.hex,
            "name": self.name,
            "bundles": {index: dict(bundle) for index, bundle in enumerate(self.bundles)},
            "bundles_to_node_id": {index: node_id for index in range(len(self.bundles))},
            "strategy": self.strategy,
            "state": self.state,
        }


def _take_out(queue: deque[TaskSpec], task: TaskSpec) -> bool:
    """Remove ``task`` from ``queue``, looking from the tail first; False if absent."""
    for back, queued in enumerate(reversed(queue)):
        if queued is task:
            del queue[-1 - back]
            return True
        if back == FIRST_SCAN:
            break
    try:
        queue.remove(task)
    except ValueError:
        return False
    return True


def _group_problem(scheduler: Scheduler, bundles: list[dict[str, float]], strategy: str) -> str | None:
    if strategy == "STRICT_SPREAD" and len(bundles) > 1:
        return (f"STRICT_SPREAD puts each of its {len(bundles)} bundles on a different node, "
                "and this runtime is one node; use PACK or SPREAD (on one machine they place "
                "every bundle here), or a single bundle")
    for index, bundle in enumerate(bundles):
        problem = scheduler.check_feasible(make_shape(bundle))
        if problem:
            return f"bundle {index} ({bundle}) can never be reserved: {problem}"
    group = PlacementGroupState(0, "", "", bundles, strategy)
    problem = scheduler.check_feasible(group.demand)
    if problem:
        return f"the {len(bundles)} bundles together can never be reserved on this node: {problem}"
    return None


