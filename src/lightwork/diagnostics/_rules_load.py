"""The advisor's rules about how busy the slots and the cores were.

:class:`LoadRules` is a part of :class:`~lightwork.diagnostics._advice_rules.AdviceRules`
(which subclasses it and owns every attribute it reads; the annotations below only name
them): the rules that weigh work against the slots, the cores and the driver's own time
(tiny-tasks, serial-driver, actor-bottleneck, oversubscription, fewer-slots), and the
machine's and the workers' samples of waiting for a core that tell a program's own
slowness from other programs' load. Each is reported once per (kind, key) through
``_report``.

The thresholds are module constants; they are deliberately conservative.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import TYPE_CHECKING, Any

from lightwork.kernel.events import TaskRecord
from lightwork.diagnostics._finding import Finding
from lightwork.diagnostics._measure import most_at_once, union

if TYPE_CHECKING:
    from lightwork.diagnostics._advice_rules import _Site

TINY_MIN_TASKS = 200
TINY_RATIO = 3.0  # median run time below this many times the per-task overhead
# What a task costs the runtime, every process's CPU together, on the 2-core machine:
# between a task in a batch (~25 µs: the driver ~15, its worker ~9) and a synchronous
# call (~50 µs round trip), as the hot-path bench measured them when this was set.
TASK_OVERHEAD_S = 40e-6
ACTOR_MIN_CALLS = 5
ACTOR_QUEUE_RATIO = 3.0  # calls waited this many times their run time on average
ACTOR_MIN_BUSY_S = 0.3  # total work of those calls: tiny calls are the tiny-tasks case
ACTOR_MIN_UTILIZATION = 0.7  # the actor was busy this much of the time
SERIAL_MIN_TASKS = 5
SERIAL_WINDOW = 20  # the last submissions of a call site the serial-driver rule looks at
SERIAL_FRACTION = 0.3
SERIAL_MIN_S = 0.25  # less serial work than this is not worth a finding
SERIAL_MAX_UTILIZATION = 0.6
SERIAL_MIN_WORK_SHARE = 0.5  # the call site's tasks did at least this share of that time
OVERSUBSCRIBED_CPU = 1.6  # cores used by one single-CPU task's process
OVERSUBSCRIBED_MIN_S = 0.2  # only tasks long enough for CPU time to mean something
CORES_MEASURE_SLACK = 1.1  # CPU time over wall time above this times the cores: not real
CPU_BOUND_MIN_S = 0.01  # tasks shorter than this say little about the cores' use
CORES_BUSY_SHARE = 0.75  # tasks at once kept this share of the cores busy
WORKER_SAMPLE_MAX_WORKERS = 256  # workers whose waits are kept (the newest)


class LoadRules:
    """The load rules (see the module docstring); a mixin of ``AdviceRules``."""

    if TYPE_CHECKING:
        cpus: float
        cores: int
        init_callsite: tuple[str, int, str] | None
        node: Any
        _recent: Any
        _spans: Any
        _reported: set[tuple[str, Any]]
        _actor_calls: dict[int, deque[TaskRecord]]
        _long_tasks: deque[tuple[float, float, float]]
        _machine: deque[tuple[float, float]]
        _worker_waits: dict[int, deque[tuple[float, float]]]

        def _report(self, finding: Finding, key: Any = None) -> None: ...
        def _busy_between(self, begin: float, end: float) -> float: ...
        def _all_slots_starting(self, begin: float, end: float) -> float: ...

    def _check_tiny_tasks(self, callsite: Any, site: _Site) -> None:
        if ("tiny-tasks", callsite) in self._reported:
            return
        if site.count < TINY_MIN_TASKS or len(site.run_times) < TINY_MIN_TASKS // 2:
            return
        median = statistics.median(site.run_times)
        if median >= TINY_RATIO * TASK_OVERHEAD_S:
            return
        target = max(10 * TASK_OVERHEAD_S, 1e-3)
        batch = min(10_000, max(2, round(target / max(median, 1e-7))))
        # The rule fires up to TINY_RATIO times the overhead, so the message says what
        # share of the time the overhead takes, not that the run is shorter than it.
        overhead_share = TASK_OVERHEAD_S / (TASK_OVERHEAD_S + median)
        self._report(Finding(
            "tiny-tasks",
            f"{site.name} tasks run for {median * 1e6:.1f} µs (median of "
            f"{len(site.run_times)}); each task also costs the runtime about "
            f"{TASK_OVERHEAD_S * 1e6:.0f} µs (submitting, scheduling, returning the "
            f"result), so about {overhead_share:.0%} of the time goes to that, not to "
            "the work",
            {"median_run_s": median, "tasks": site.count,
             "overhead_s": TASK_OVERHEAD_S, "suggested_batch": batch},
            f"give each task more work: process about {batch} items per task (a list or "
            "a range per call) so the work outweighs the per-task cost",
            callsite, cost_s=site.count * TASK_OVERHEAD_S / max(self.cpus, 1.0),
        ))

    def _check_serial_driver(self, callsite: Any, site: _Site) -> None:
        # Over the last submissions from one call site: the time between the first and
        # the last submission, less the driver's time blocked in get/wait and the time
        # lightwork itself spent copying big arguments inside .remote(), is the driver's
        # own serial work; how busy the slots were over that time (every task and
        # actor call that ran, from their spans) says whether it cost the workers.
        if len(site.recent) < SERIAL_MIN_TASKS or ("serial-driver", callsite) in self._reported:
            return
        window = sorted(site.recent, key=lambda r: r.submitted)
        first, last = window[0].submitted, window[-1].submitted
        seen = max(r.seen for r in window)
        # Worker start-up is left out: while every slot's worker was starting nothing
        # could run, however the driver submitted (the window is at least the loop).
        tail = window[-1].finished - window[-1].started if window[-1].started else 0.0
        wall = max(seen - first - self._all_slots_starting(first, seen), last - first + tail)
        blocked = self._blocked_between(first, last)
        copying = sum(r.copy_s for r in window[:-1])  # the last copy is after ``last``
        serial = (last - first) - blocked - copying
        if wall <= 0 or serial < SERIAL_MIN_S or serial / wall < SERIAL_FRACTION:
            return
        # Wall time is an upper bound of the driver's own work: a driver that slept was
        # not working. Where the submissions carry how long the main thread ran or was
        # ready to run (``driver_busy``: its CPU time plus its waits for a core, which a
        # loaded machine adds to real work), the work is at most that, less the blocked
        # and copying time, which are lightwork's (at most their wall time).
        sampled = [r for r in window if r.driver_busy]
        at_full_speed = serial
        if len(sampled) >= 2:
            begin, end = sampled[0].submitted, sampled[-1].submitted
            busy = sampled[-1].driver_busy - sampled[0].driver_busy
            serial = min(serial, busy - self._blocked_between(begin, end) - sum(
                r.copy_s for r in sampled[:-1]))
            if serial < SERIAL_MIN_S or serial / wall < SERIAL_FRACTION:
                return
            # What that work would take on a core of its own (its CPU share of it).
            cpu = sampled[-1].driver_cpu - sampled[0].driver_cpu
            at_full_speed = serial * min(1.0, cpu / busy) if busy > 0 else serial
        # Submitting first can only overlap the driver's work with these tasks' own work:
        # calls that do next to nothing (polling a progress actor) gain nothing from it.
        work = sum(r.finished - r.started for r in window if r.started)
        if work < SERIAL_MIN_WORK_SHARE * at_full_speed:
            return
        busy = self._busy_between(first, seen)
        utilization = busy / (self.cpus * wall)
        if utilization >= SERIAL_MAX_UTILIZATION:
            return
        self._report(Finding(
            "serial-driver",
            f"the driver spent {serial:.2f} s of {wall:.2f} s ({serial / wall:.0%}) in its "
            f"own code between submissions of {site.name}, so the {self.cpus:g} "
            f"CPU slots were only {utilization:.0%} busy: the speed-up cannot exceed "
            f"{wall / serial:.1f}x (Amdahl's law)",
            {"serial_s": round(serial, 4), "wall_s": round(wall, 4),
             "slot_utilization": round(utilization, 3), "tasks": len(window)},
            "submit the tasks before the driver's own work (or make that work a task "
            "too), so workers run while the driver computes",
            callsite, cost_s=serial,
        ))

    def _blocked_between(self, begin: float, end: float) -> float:
        """The driver's time in get/wait/put spans between ``begin`` and ``end``."""
        blocked = 0.0
        for span in reversed(self._spans):
            if span.end < begin:
                break
            blocked += max(0.0, min(span.end, end) - max(span.start, begin))
        return blocked

    def _check_actor_bottleneck(self, actor_id: int, calls: deque[TaskRecord]) -> None:
        if len(calls) < ACTOR_MIN_CALLS or ("actor-bottleneck", actor_id) in self._reported:
            return
        records = [r for r in calls if r.started]
        if len(records) < ACTOR_MIN_CALLS:
            return
        busy = sum(r.finished - r.started for r in records)
        run = busy / len(records)
        # Queued behind the actor's other calls: from when the call could run (its
        # arguments ready), not from its submission (waiting for arguments is a chain).
        queued = sum(r.started - max(r.submitted, r.deps_ready) for r in records) / len(records)
        if busy < ACTOR_MIN_BUSY_S or queued < ACTOR_QUEUE_RATIO * run:
            return
        # Was the actor busy from its first call on (its start-up is not idleness)?
        begin = min(r.submitted for r in records)
        end = max(r.finished for r in records)
        if busy < ACTOR_MIN_UTILIZATION * (end - min(r.started for r in records)):
            return  # the actor itself was often idle: not the bottleneck
        # Were task slots idle meanwhile? Little else ran during those calls: tasks and
        # other actors' calls (a pool of busy actors, each with its queue, is no
        # bottleneck: multiprocessing.Pool's map queues chunks on every process).
        task_time = sum(
            min(r.finished, end) - max(r.started, begin) for r in self._recent
            if r.actor_id != actor_id and r.started and r.finished > begin and r.started < end
        )
        idle_slots = self.cpus - 1 - task_time / max(end - begin, 1e-9)
        if idle_slots < 1:
            return
        name = records[-1].name
        self._report(Finding(
            "actor-bottleneck",
            f"calls to one actor ({name.rsplit('.', 2)[-2] if '.' in name else name}) waited {queued:.3f} s on average "
            f"for {run:.3f} s of work each ({len(records)} calls) while about "
            f"{idle_slots:.0f} CPU slots were idle",
            {"calls": len(records), "mean_queued_s": round(queued, 4),
             "mean_run_s": round(run, 4), "idle_slots": round(idle_slots, 1),
             "method": name},
            "create several actors and spread the calls (lightwork.util.ActorPool), or "
            "make the work a task if it needs no actor state",
            records[-1].callsite, cost_s=queued * len(records),
        ), key=actor_id)

    def _check_oversubscription(self, record: TaskRecord) -> None:
        wall = record.finished - record.args_loaded
        if wall < OVERSUBSCRIBED_MIN_S or not record.cpu_time:
            return
        cores = record.cpu_time / wall
        share = max(record.num_cpus, 1.0)
        if cores <= OVERSUBSCRIBED_CPU * share:
            return
        # A process cannot use more cores than the machine has: such a figure is not a
        # measurement of the call. Nor is the fix possible when the runtime has fewer
        # CPU slots than the num_cpus it would advise.
        wanted = max(2, round(cores))
        if cores > self.cores * CORES_MEASURE_SLACK or wanted > self.cpus:
            return
        if record.actor_id and self._concurrent_call(record):
            return  # the process's CPU time covers the actor's other calls too
        name = record.name
        self._report(Finding(
            "oversubscription",
            f"a {name} task used {cores:.1f} cores for {wall:.2f} s but asked for "
            f"{record.num_cpus:g} CPU: such tasks side by side compete for the same cores",
            {"cores_used": round(cores, 2), "num_cpus": record.num_cpus,
             "run_s": round(wall, 3), "function": name},
            f"limit the library's threads inside the task (OMP_NUM_THREADS=1, threadpoolctl), "
            f"or declare them: {name}.options(num_cpus={wanted})",
            record.callsite,
        ), key=name)

    def _concurrent_call(self, record: TaskRecord) -> bool:
        """Whether another call of ``record``'s actor ran while it did (threaded actors)."""
        node = self.node
        if node is not None:
            if node.actor_concurrency(record.actor_id) > 1:
                return True
        return any(
            other is not record and other.started < record.finished
            and other.finished > record.started
            for other in self._actor_calls.get(record.actor_id, ())
        )

    def _check_fewer_slots(self, record: TaskRecord) -> None:
        # More slots than cores is right for tasks that wait (I/O, sleeps); it is the
        # mistake when more tasks than cores ran at once and together kept every core
        # busy: CPU-bound work sharing cores.
        run = record.finished - record.args_loaded
        if run < CPU_BOUND_MIN_S:
            return
        recent = self._long_tasks
        recent.append((record.args_loaded, record.finished, record.cpu_time))
        cores = self.cores
        at_once = most_at_once([(start, end) for start, end, _ in recent])
        if at_once <= cores:
            return
        busy_cores = sum(cpu for _, _, cpu in recent) / union([(s, e) for s, e, _ in recent])
        if busy_cores < CORES_BUSY_SHARE * cores:
            return
        self._report(Finding(
            "fewer-slots",
            f"lightwork.init(num_cpus={self.cpus:g}) on a machine with {cores} cores: "
            f"{at_once} CPU-bound tasks (like {record.name}) ran at once and kept "
            f"{busy_cores:.1f} of {cores} cores busy: they shared the cores, so the work "
            f"speeds up at most {cores}x",
            {"num_cpus": self.cpus, "cores": cores, "tasks_at_once": at_once,
             "busy_cores": round(busy_cores, 2)},
            f"use num_cpus={cores} (the default) for CPU-bound work; more slots than cores "
            "only help tasks that wait (I/O, sleeps)",
            self.init_callsite,
        ), key="init")

    def add_worker_sample(self, worker_id: int, at: float, waited_s: float) -> None:
        """Seconds worker ``worker_id`` has waited for a core so far, at log time ``at``."""
        samples = self._worker_waits.get(worker_id)
        if samples is None:
            if len(self._worker_waits) >= WORKER_SAMPLE_MAX_WORKERS:
                del self._worker_waits[next(iter(self._worker_waits))]  # the oldest worker
            samples = self._worker_waits[worker_id] = deque(maxlen=2400)
        if not samples or at > samples[-1][0]:
            samples.append((at, waited_s))

    def _worker_waited_between(self, worker_id: int, begin: float,
                               end: float) -> float | None:
        """How long worker ``worker_id`` waited for a core over ``begin``..``end``:
        from the samples around it, or, for a worker first sampled during it (a new
        worker's first task), scaled up from the samples covering at least half of it
        (None: less than that)."""
        samples = self._worker_waits.get(worker_id) or ()
        around = _delta_around(samples, begin, end)
        if around is not None or not samples:
            return around
        inside = [sample for sample in samples if begin <= sample[0]]
        if len(inside) < 2:
            return None
        last = next((sample for sample in inside if sample[0] >= end), inside[-1])
        covered = min(last[0], end) - inside[0][0]
        if covered < 0.5 * (end - begin) or last[0] <= inside[0][0]:
            return None
        return (last[1] - inside[0][1]) * (end - begin) / (last[0] - inside[0][0])

    def add_machine_sample(self, at: float, idle_core_s: float) -> None:
        """The machine's idle core-seconds so far (``/proc/stat``), at log time ``at``."""
        if not self._machine or at > self._machine[-1][0]:
            self._machine.append((at, idle_core_s))

    def _idle_cores_between(self, begin: float, end: float) -> float | None:
        """Idle cores on average over the samples around ``begin``..``end`` (None: no
        sample at or before ``begin``, or none at or after ``end``)."""
        return _delta_around(self._machine, begin, end, per_second=True)


def _delta_around(samples: Any, begin: float, end: float,
                  per_second: bool = False) -> float | None:
    """The growth of a sampled counter ((time, value) pairs, in time order) from the
    last sample at or before ``begin`` to the first at or after ``end`` (per second of
    that span with ``per_second``), or None without samples on both sides."""
    before = after = None
    for sample in samples:
        if sample[0] <= begin:
            before = sample
        elif sample[0] >= end:
            after = sample
            break
    if before is None or after is None or after[0] <= before[0]:
        return None
    growth = after[1] - before[1]
    return growth / (after[0] - before[0]) if per_second else growth
