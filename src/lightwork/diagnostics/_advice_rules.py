"""The advisor's rules: what each finding is made from, apart from how records arrive.

:class:`AdviceRules` holds the statistics folded from task records and driver spans
(per call site, per actor, recent records, how busy the slots were) and the checks that
turn them into :class:`Finding` objects. Its owner feeds it (``_add_record``,
``_add_span``, ``_check_touched``, ``_check_pinned``) and holds ``_lock`` meanwhile; the
only thing a rule asks the live runtime (``node``, None offline) is an actor's
``max_concurrency``. :class:`lightwork.diagnostics.advisor.Advisor` is that owner, live
(a thread over the event log) or offline (a replayed log); its module docstring is the
design of both: the list of rules, the "never wrong" principle, how findings are
reported once per (kind, call site).

The rules whose evidence is one event each (a definition pickled, a runtime report, a
stuck call, a global rebound) and the first-batch rule are ``_catalogue.CatalogueRules``,
which this class extends; :class:`Finding` lives in ``_finding``.

The thresholds are module constants; they are deliberately conservative.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from lightwork.kernel.events import DriverSpan, TaskRecord
from lightwork.diagnostics._catalogue import CatalogueRules
from lightwork.diagnostics._chains import feeds_next_call
from lightwork.diagnostics._finding import Finding, _size
from lightwork.diagnostics._measure import SlotTime, most_at_once, union

KINDS = (
    "get-in-loop", "tiny-tasks", "large-arg-repeated", "wait-for-slowest",
    "actor-bottleneck", "serial-driver", "oversubscription", "fewer-slots", "refs-pinned",
    "actor-deadlock", "stuck-task", "redefined-remote", "large-closure",
    "startup-dominated", "returned-put-ref", "get-of-nested-args", "blocking-in-async-actor",
    "fork-in-task", "unneeded-get", "global-changed", "global-write", "ref-out-of-band",
)

GET_IN_LOOP_MIN = 4  # consecutive one-object gets from one call site
GET_IN_LOOP_MIN_IDLE = 0.5  # slots idle on average over those gets
TINY_MIN_TASKS = 200
TINY_RATIO = 3.0  # median run time below this many times the per-task overhead
# What a task costs the runtime, every process's CPU together, on the 2-core machine:
# between a task in a batch (~25 µs: the driver ~15, its worker ~9) and a synchronous
# call (~50 µs round trip), as the hot-path bench measured them when this was set.
TASK_OVERHEAD_S = 40e-6
LARGE_ARG_MIN_REPEATS = 3
SLOWEST_MIN_OBJECTS = 4
SLOWEST_MIN_WAIT_S = 0.2
SLOWEST_SPREAD = 0.5  # the results' spread is at least half of the blocked time
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
# Records looked at in full per step; more are sampled. Reading one costs a look ~1.5-2
# µs (cold in the cache by then), so the sample is most of a look's cost; 128 keeps the
# advisor's own work within its 2% on the fastest batches (measured: see
# bench/HOTPATH.md, "The diagnostics' costs"). The statistical rules keep their last
# 512 run times per call site, filled in four looks or five (~1 s).
SAMPLE_PER_STEP = 128
CPU_BOUND_MIN_S = 0.01  # tasks shorter than this say little about the cores' use
CORES_BUSY_SHARE = 0.75  # tasks at once kept this share of the cores busy
PINNED_MIN_BYTES = 256 << 20
PINNED_MIN_AGE_S = 1.0  # objects ready for less time than this are probably about to be read
CHAIN_MAX_LOOKUP = 256  # records visited looking for a dependency on the previous get
SLOWEST_WAVES_SLACK = 1.5  # spread up to this times what running in waves explains is fine
SLOWEST_OWN_CPU_SHARE = 0.25  # the slowest's extra CPU was this share of its extra time
SLOWEST_MIN_SHARE = 0.05  # a task's CPU share of its run, at the least (sleeping tasks)
SLOWEST_STALL_SHARE = 0.5  # waited for a core this share of its extra time: maybe load
WORKER_SAMPLE_MAX_WORKERS = 256  # workers whose waits are kept (the newest)
SLOWEST_MIN_IDLE_CORES = 0.5  # fewer idle cores than this: a runnable task may have waited
REPLAY_MAX_STEPS = 200  # a replayed log is checked at most this many times


@dataclass
class _Site:
    """What one call site of ``.remote()`` has done so far."""

    name: str
    count: int = 0
    run_times: deque[float] = field(default_factory=lambda: deque(maxlen=512))
    arg_counts: dict[tuple[int, ...], int] = field(default_factory=dict)
    arg_copy_s: dict[tuple[int, ...], float] = field(default_factory=dict)  # after the first
    recent: deque[TaskRecord] = field(default_factory=lambda: deque(maxlen=SERIAL_WINDOW))

class AdviceRules(CatalogueRules):
    """The rules and what they have seen so far (see the module docstring).

    ``cpus`` are the runtime's CPU slots and ``cores`` the machine's, both as they were
    where the records came from; ``init_callsite`` is where ``init`` was called (the
    fewer-slots finding points there).
    """

    def __init__(self, cpus: float, cores: int,
                 init_callsite: tuple[str, int, str] | None = None) -> None:
        self.cpus = cpus
        self.cores = cores
        self.init_callsite = init_callsite
        self.node: Any = None  # the live runtime; its owner sets it (None: offline)
        # The live advisor hears of big by-value arguments as they are submitted
        # (note_large_args); offline, they are counted from the ended records.
        self.large_args_at_submission = False
        self.findings: list[Finding] = []
        self.undelivered: deque[Finding] = deque()
        self._reported: set[tuple[str, Any]] = set()
        self._by_identity: dict[tuple[str, Any], Finding] = {}  # (kind, key) -> finding
        self._stale_titles: set[int] = set()  # ids of findings whose figures grew
        # function name -> (when seen, the global, its definition site): globals the
        # driver rebound after the function was shipped (``api.definitions``)
        self._global_changes: dict[str, tuple[float, str, Any]] = {}
        self._lock = threading.Lock()  # its owner's: held while the rules change
        self._sites: dict[Any, _Site] = {}
        self._records: dict[int, TaskRecord] = {}  # recent, by task id
        self._long_tasks: deque[tuple[float, float, float]] = deque(maxlen=64)
        self._recent: deque[TaskRecord] = deque(maxlen=4096)
        self._actor_calls: dict[int, deque[TaskRecord]] = {}
        self._touched_sites: set[Any] = set()
        self._touched_actors: set[int] = set()
        self._actor_cpu_checks: list[TaskRecord] = []
        self._spans: deque[DriverSpan] = deque(maxlen=4096)
        self._busy = SlotTime()  # every task's and call's run, for how busy slots were
        self._running: list[tuple[float, float, TaskRecord]] = []  # unended work
        self._now = 0.0  # log time of the current look
        self._get_runs: dict[Any, list[DriverSpan]] = defaultdict(list)
        self._definitions: dict[Any, list[float]] = {}  # def site -> [picklings, seconds]
        # The first run of each worker, and of each function on a worker: its start-up
        # and its loading of the function (imports) are in those records (task id ->
        # seconds spent so).
        self._workers_seen: set[int] = set()
        self._loads_seen: set[tuple[int, str]] = set()
        self._first_loads: dict[int, float] = {}
        self._startups: deque[tuple[float, float]] = deque(maxlen=256)  # (dispatched, started)
        self._replay_at: float | None = None  # log time of the step being replayed
        self._chains: dict[tuple[Any, Any], bool] = {}  # (get line, submit line) -> by value
        self._machine: deque[tuple[float, float]] = deque(maxlen=4096)  # (time, idle core-s)
        # worker id -> (time, seconds its main thread waited for a core so far)
        self._worker_waits: dict[int, deque[tuple[float, float]]] = {}
        # (start, end) of recent pauses in the debugger: the driver's gets meanwhile
        # waited for the user, not for the program (``_add_span`` leaves them out).
        self._pauses: deque[tuple[float, float]] = deque(maxlen=64)

    # -- reporting -------------------------------------------------------------------
    def _report(self, finding: Finding, key: Any = None) -> None:
        identity = (finding.kind, key if key is not None else finding.callsite)
        if identity in self._reported:
            return
        self._reported.add(identity)
        self._by_identity[identity] = finding
        if self._replay_at is not None:
            finding.seen_at = self._replay_at
        self.findings.append(finding)
        self.undelivered.append(finding)

    # -- folding records in -------------------------------------------------------------
    def _add_record(self, record: TaskRecord, weight: int = 1) -> None:
        # This runs once per task: keep it to a few dict and deque operations. ``weight``
        # is how many tasks a sampled record stands for (0: already counted).
        if record.paused:  # it sat in the debugger: its times are the user's, not the
            self._leave_out_paused(record, weight)  # program's; no rule reads them
            return
        self._records[record.task_id] = record
        self._recent.append(record)
        if len(self._records) > 8192:
            for old in list(self._records)[:4096]:
                del self._records[old]
        if record.cpu_time and record.finished - record.args_loaded >= CPU_BOUND_MIN_S:
            if record.actor_id:  # checked once the step's other calls are in (overlaps)
                self._actor_cpu_checks.append(record)
            else:
                self._check_oversubscription(record)
            if self.cpus > self.cores:
                self._check_fewer_slots(record)
        if record.started and not record.actor_id and record.worker_id >= 0:
            self._note_first_runs(record)
        if self._global_changes:  # (empty but for a program that rebinds a global)
            self._check_global_change(record)
        if record.actor_id:
            calls = self._actor_calls.get(record.actor_id)
            if calls is None:
                calls = self._actor_calls[record.actor_id] = deque(maxlen=64)
            calls.append(record)
            self._touched_actors.add(record.actor_id)
        if record.owner != 0 or record.callsite is None:
            return
        site = self._sites.get(record.callsite)
        if site is None:
            site = self._sites[record.callsite] = _Site(record.name)
        site.count += weight
        self._touched_sites.add(record.callsite)
        if record.finished:
            site.recent.append(record)
            site.run_times.append(record.finished - record.args_loaded)  # the last 512
        if record.large_args and not self.large_args_at_submission:
            self._count_large_args(site, record)

    def note_large_args(self, record: TaskRecord) -> None:
        """A driver call with big by-value arguments, as it is submitted (the live
        advisor: ``large_args_at_submission``). The evidence is complete at the third
        copy, whenever its tasks end: a program whose only get returns as they end would
        otherwise never be told (the finding came with the next get or wait)."""
        with self._lock:
            site = self._sites.get(record.callsite)
            if site is None:
                site = self._sites[record.callsite] = _Site(record.name)
            self._count_large_args(site, record)

    def _count_large_args(self, site: _Site, record: TaskRecord) -> None:
        for fingerprint in record.large_args:
            if len(fingerprint) > 2:  # a value get returned, sent back by value
                self._name_unneeded_get(record, fingerprint[1])
            repeats = site.arg_counts.get(fingerprint, 0) + 1
            site.arg_counts[fingerprint] = repeats
            copied = site.arg_copy_s.get(fingerprint, 0.0) + (record.copy_s if repeats > 1 else 0.0)
            site.arg_copy_s[fingerprint] = copied
            if repeats < LARGE_ARG_MIN_REPEATS:
                continue
            title = (f"the same {_size(fingerprint[1])} argument was passed by value to "
                     f"{record.name} {repeats} times ({copied:.2f} s copying it again)")
            earlier = self._by_identity.get(("large-arg-repeated", record.callsite))
            if earlier is not None:
                if earlier.evidence.get("bytes") == fingerprint[1] and repeats > earlier.evidence["times"]:
                    earlier.title, earlier.cost_s = title, copied  # its cost so far
                    earlier.evidence.update(times=repeats, copy_s=round(copied, 4))
                continue
            self._report(Finding(
                "large-arg-repeated", title,
                {"bytes": fingerprint[1], "times": repeats, "function": record.name,
                 "copy_s": round(copied, 4)},
                f"store it once with ref = lightwork.put(value) and pass ref to each "
                f"{record.name}.remote(...) call: each by-value call copies "
                f"{_size(fingerprint[1])} again",
                record.callsite, cost_s=copied,
            ))

    def _leave_out_paused(self, record: TaskRecord, weight: int) -> None:
        """A call that paused in the debugger: remember its pauses (the driver's gets
        meanwhile waited for the user), and take them out of how busy the slots were
        (its run was counted in full as it ended)."""
        slots = 1.0 if record.actor_id or record.num_cpus < 1.0 else record.num_cpus
        for start, end in record.paused:
            self._pauses.append((start, end))
            if weight and end > start:
                self._busy.add(start, end, -slots)

    def _add_span(self, span: DriverSpan) -> None:
        if span.kind == "define":
            self._add_definition(span)
            return
        if self._pauses and any(start < span.end and span.start < end
                                for start, end in self._pauses):
            return  # a get or wait that waited (also) for a call paused in the debugger
        self._spans.append(span)
        if self._may_be_get_in_loop(span):
            run = self._get_runs[span.callsite]
            run.append(span)
            self._check_get_in_loop(span.callsite, run)
        elif span.kind == "get":
            if span.object_count == 1:
                self._grow_get_in_loop(span)
            else:
                self._get_runs.pop(span.callsite, None)
        if span.kind == "get" and span.object_count >= SLOWEST_MIN_OBJECTS:
            self._check_wait_for_slowest(span)
        if span.kind == "get" and span.object_count >= SLOWEST_MIN_OBJECTS and self._first_loads:
            self._check_startup(span)

    def _may_be_get_in_loop(self, span: DriverSpan) -> bool:
        """Whether ``span`` is a get of one object at a call site not yet reported for
        get-in-loop. Once said, a site's gets are not followed: checking again would
        cost every later get of the loop ~20-40 µs of this thread (the chain's last 16
        gets against the site's recent tasks) to find what _report drops."""
        return (span.kind == "get" and span.object_count == 1
                and ("get-in-loop", span.callsite) not in self._reported)

    # -- the rules ---------------------------------------------------------------------
    def _check_get_in_loop(self, callsite: Any, run: list[DriverSpan]) -> None:
        # Keep only a chain in which each get's task was submitted after the previous
        # get returned: the driver waited for each result before starting the next.
        # A step that needs the previous one (its task depends, through refs, on the
        # previous get's task) or a call on the same actor (they run one at a time
        # anyway) gains nothing from submitting first: it starts a new chain.
        chain: list[DriverSpan] = []
        for span in run[-(GET_IN_LOOP_MIN * 4):]:
            record = self._records.get(span.first_task_id)
            if record is None or (chain and (
                    record.submitted < chain[-1].end
                    or self._needs_previous(record, chain[-1].first_task_id)
                    or self._others_in_flight(record, chain[-1].end, span.end))):
                chain = []
            if record is not None:
                chain.append(span)
        run[:] = chain
        if len(chain) < GET_IN_LOOP_MIN or self.cpus < 2:
            return
        blocked = sum(span.end - span.start for span in chain)
        begin, end = chain[0].start, chain[-1].end
        wall = end - begin
        if blocked < 0.5 * wall:
            return
        # Slots must have sat idle meanwhile (measured from the runs), else nothing
        # was lost: an actor pool, say, gets one result at a time with every actor busy.
        busy = self._busy_between(begin, end)
        idle_slots = self.cpus - busy / wall
        if idle_slots < GET_IN_LOOP_MIN_IDLE:
            return
        record = self._records[chain[-1].first_task_id]
        if self._feeds_next_call(callsite, record.callsite):
            return  # a by-value chain (x = get(f.remote(x))): each call needs the last result
        name = record.name
        self._report(Finding(
            "get-in-loop",
            f"get() waited for each {name} task before the next was submitted "
            f"({len(chain)} times in a row, {blocked:.2f} s blocked) while "
            f"{idle_slots:.1f} of {self.cpus:g} CPU slots sat idle on average",
            {"gets_in_a_row": len(chain), "blocked_s": round(blocked, 4),
             "cpus": self.cpus, "idle_slots": round(idle_slots, 2), "function": name},
            "submit all the tasks first and get once: refs = [f.remote(x) for x in items]; "
            "results = lightwork.get(refs)",
            callsite, cost_s=blocked,
        ))

    def _grow_get_in_loop(self, span: DriverSpan) -> None:
        """Another one-object get at a call site already named for get-in-loop: the
        finding's figures follow the loop (its cost so far), one dict lookup a get."""
        finding = self._by_identity.get(("get-in-loop", span.callsite))
        if finding is None:
            return
        finding.evidence["gets_in_a_row"] += 1
        finding.cost_s += span.end - span.start
        self._stale_titles.add(id(finding))  # rewritten once a look (_refresh_titles)

    def _refresh_titles(self) -> None:
        """Rewrite the titles of the get-in-loop findings whose loop went on."""
        if not self._stale_titles:
            return
        stale, self._stale_titles = self._stale_titles, set()
        for finding in self.findings:
            if id(finding) in stale and finding.kind == "get-in-loop":
                evidence = finding.evidence
                evidence["blocked_s"] = round(finding.cost_s, 4)
                finding.title = (
                    f"get() waited for each {evidence['function']} task before the next was "
                    f"submitted ({evidence['gets_in_a_row']} times, {finding.cost_s:.2f} s "
                    f"blocked so far) while {evidence['idle_slots']:.1f} of {self.cpus:g} CPU "
                    "slots sat idle on average")

    def _feeds_next_call(self, get_site: Any, submit_site: Any) -> bool:
        """Whether the loop's next call takes the get's result by value (from the source,
        once per pair of lines; unknown source: no, the records alone decide)."""
        if get_site is None or submit_site is None:
            return False
        key = (get_site, submit_site)
        known = self._chains.get(key)
        if known is None:
            known = self._chains[key] = bool(feeds_next_call(get_site, submit_site))
        return known

    def _busy_between(self, begin: float, end: float) -> float:
        """Slot-seconds of work done between ``begin`` and ``end``, ended or running."""
        return self._busy.between(begin, end) + sum(
            slots * max(0.0, min(self._now, end) - max(since, begin))
            for since, slots, _ in self._running
        )

    def _others_in_flight(self, record: TaskRecord, since: float, until: float) -> bool:
        """Whether the driver kept more of ``record``'s call site's tasks in flight than
        the one it waited for (a bounded pipeline, an actor pool): not one at a time."""
        site = self._sites.get(record.callsite)
        candidates = list(site.recent) if site is not None else []
        candidates += [task for _, _, task in self._running]
        return any(
            other.task_id != record.task_id and other.callsite == record.callsite
            and since <= other.submitted < until
            for other in candidates
        )

    def _needs_previous(self, record: TaskRecord, previous_task_id: int) -> bool:
        """Whether ``record``'s task could not run before the previous get's task."""
        previous = self._records.get(previous_task_id)
        if previous is not None and record.actor_id and previous.actor_id == record.actor_id:
            return True
        seen: set[int] = set()
        todo = list(record.dep_tasks)
        while todo and len(seen) < CHAIN_MAX_LOOKUP:
            task_id = todo.pop()
            if task_id == previous_task_id:
                return True
            if task_id in seen:
                continue
            seen.add(task_id)
            upstream = self._records.get(task_id)
            if upstream is not None:
                todo.extend(upstream.dep_tasks)
        return False

    def _check_touched(self) -> None:
        """Check the rules for the call sites and actors that got records since last time."""
        calls, self._actor_cpu_checks = self._actor_cpu_checks, []
        for record in calls:
            self._check_oversubscription(record)
        sites, self._touched_sites = self._touched_sites, set()
        actors, self._touched_actors = self._touched_actors, set()
        for callsite in sites:
            site = self._sites[callsite]
            self._check_tiny_tasks(callsite, site)
            self._check_serial_driver(callsite, site)
        for actor_id in actors:
            self._check_actor_bottleneck(actor_id, self._actor_calls[actor_id])

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

    def _check_wait_for_slowest(self, span: DriverSpan) -> None:
        blocked = span.end - span.start
        if blocked < SLOWEST_MIN_WAIT_S or not span.first_ready:
            return
        # The call site's tasks the get waited for, from their records: the time they
        # ran while the driver waited is what counts, not the workers' start-up before.
        first = self._records.get(span.first_task_id)
        if first is None:
            return
        waited = [r for r in self._recent
                  if r.callsite == first.callsite and r.started and r.owner == first.owner
                  and first.submitted <= r.submitted and r.finished <= span.end]
        if not waited:
            return
        active = span.end - max(span.start, min(r.started for r in waited))
        # Results spread out because the tasks took very different times (not because
        # they were submitted at different times: that is the serial-driver case).
        spread = span.last_ready - span.first_ready
        if spread < SLOWEST_SPREAD * active or span.longest - span.shortest < SLOWEST_SPREAD * active:
            return
        # Nor because there were more tasks than slots: equal tasks then finish in waves
        # about one task apart (the guide's "submit all, then get once" on 5 tasks and 4
        # CPUs).
        runs = [r.finished - r.started for r in waited]
        typical = statistics.median(runs)
        waves = math.ceil(max(1, span.object_count - span.ready_before) / max(self.cpus, 1.0))
        if spread <= SLOWEST_WAVES_SLACK * (waves - 1) * typical:
            return
        # And the slowest task itself ran much longer than the typical one: equal tasks
        # slowed by a loaded machine spread out too, and wait() would not help them.
        if max(runs) - typical < SLOWEST_SPREAD * active:
            return
        slowest = max(waited, key=lambda r: r.finished - r.started)
        if self._maybe_stalled(slowest, waited, typical):
            return
        self._report(Finding(
            "wait-for-slowest",
            f"get() of {span.object_count} results blocked {blocked:.2f} s while they became "
            f"ready over {spread:.2f} s: the first results sat idle until the slowest one "
            "arrived",
            {"objects": span.object_count, "blocked_s": round(blocked, 4),
             "spread_s": round(spread, 4), "ready_before": span.ready_before},
            "process results as they finish: while refs: done, refs = "
            "lightwork.wait(refs, num_returns=1); handle(lightwork.get(done[0]))",
            span.callsite, cost_s=spread,
        ))

    def _maybe_stalled(self, slowest: TaskRecord, waited: list[TaskRecord],
                       typical: float) -> bool:
        """Whether machine load, not its own work, may have made ``slowest`` slow.

        Its own work is CPU it used beyond the typical task's, or time it was not
        runnable (sleeping, I/O). Load is time its worker waited for a core (measured
        per worker); unmeasured, a runnable task waits for a core only while none is
        idle, so the machine's cores must have been all busy meanwhile (unknown as
        well, in an old saved log: the wall times decide).
        """
        extra = (slowest.finished - slowest.started) - typical
        typical_cpu = statistics.median(r.cpu_time for r in waited)
        # How much of a core the typical task got (CPU-bound tasks on a loaded machine
        # get a fraction): more CPU than that share of its extra time is its own work.
        share = min(1.0, max(SLOWEST_MIN_SHARE, typical_cpu / typical if typical > 0 else 1.0))
        if slowest.cpu_time - typical_cpu >= SLOWEST_OWN_CPU_SHARE * share * extra:
            return False
        # Best: how long its worker waited for a core meanwhile (sampled each look; the
        # samples around the run may add a neighbour's waits: towards no finding).
        waited_s = self._worker_waited_between(slowest.worker_id, slowest.started,
                                               slowest.finished)
        if waited_s is not None:
            return waited_s >= SLOWEST_STALL_SHARE * extra
        idle = self._idle_cores_between(slowest.started, slowest.finished)
        return idle is not None and idle < SLOWEST_MIN_IDLE_CORES

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
            actor = getattr(getattr(node, "actors", None), "actors", {}).get(record.actor_id)
            if actor is not None and (getattr(actor, "max_concurrency", 1) or 1) > 1:
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

    def _name_deadlock(self, report: dict[str, Any]) -> None:
        """Name a get the runtime refused because it could never return (it raised
        ``ActorDeadlockError`` in the actor; the finding keeps it in view)."""
        method = report.get("method") or "a method"
        waits_for = " -> ".join(report.get("waits_for") or ()) or "another call"
        where = report.get("callsite") or "(unknown line)"
        self._report(Finding(
            "actor-deadlock",
            f"get() in {method} of actor {report.get('class_name')} at {where} waited for "
            f"{waits_for}, which could not start until it returned (raised "
            "ActorDeadlockError)",
            {"actor_id": report.get("actor_id"), "method": method,
             "waits_for": list(report.get("waits_for") or ()), "callsite": where},
            "call the method directly (self.method(...)) instead of through the actor's "
            "handle, make the method async and await the ref, or raise max_concurrency",
            None,
        ), key=(report.get("actor_id"), method, where))

    def _check_pinned(self, total: int, count: int, by_task: dict[int, int]) -> None:
        if total < PINNED_MIN_BYTES or count < 4:
            return
        # Name the call site that made most of those bytes (put() has none).
        by_source: dict[Any, int] = defaultdict(int)
        for task_id, nbytes in by_task.items():
            record = self._records.get(task_id) if task_id else None
            source = (record.name, record.callsite) if record is not None else ("put()", None)
            by_source[source] += nbytes
        top, callsite = max(by_source, key=by_source.__getitem__)
        finding = Finding(
            "refs-pinned",
            f"{count} objects ({_size(total)}) stay in the object store only because the "
            f"driver still holds their ObjectRefs (most from {top})",
            {"objects": count, "bytes": total, "largest_source": top},
            "drop refs you no longer need (del refs, or keep only the results you use) so "
            "their memory is freed",
            callsite,
        )
        for earlier in self.findings:
            if earlier.kind == "refs-pinned":
                # Reported once; its figures follow the peak, not the first crossing.
                if total > earlier.evidence["bytes"]:
                    earlier.title, earlier.evidence = finding.title, finding.evidence
                    earlier.callsite = finding.callsite
                return
        self._report(finding, key="store")


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
