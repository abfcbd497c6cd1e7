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

This module owns the state and the folding in, and the rules on the store and the
arguments (large-arg-repeated, unneeded-get's counting, refs-pinned, actor-deadlock).
The other rules are mixins by theme, each owning its thresholds, which this class
extends: ``_rules_gets.GetRules`` (get-in-loop, wait-for-slowest),
``_rules_load.LoadRules`` (how busy the slots and cores were: tiny-tasks, serial-driver,
actor-bottleneck, oversubscription, fewer-slots) and ``_catalogue.CatalogueRules`` (the
rules whose evidence is one event each: a definition pickled, a runtime report, a stuck
call, a global rebound; and the first-batch rule). :class:`Finding` lives in
``_finding``.

The thresholds are module constants; they are deliberately conservative.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from lightwork.kernel.events import DriverSpan, TaskRecord
from lightwork.diagnostics._catalogue import CatalogueRules
from lightwork.diagnostics._finding import Finding, _size
from lightwork.diagnostics._measure import SlotTime
from lightwork.diagnostics._rules_gets import SLOWEST_MIN_OBJECTS, GetRules
from lightwork.diagnostics._rules_load import CPU_BOUND_MIN_S, SERIAL_WINDOW, LoadRules

KINDS = (
    "get-in-loop", "tiny-tasks", "large-arg-repeated", "wait-for-slowest",
    "actor-bottleneck", "serial-driver", "oversubscription", "fewer-slots", "refs-pinned",
    "actor-deadlock", "stuck-task", "redefined-remote", "large-closure",
    "startup-dominated", "returned-put-ref", "get-of-nested-args", "blocking-in-async-actor",
    "fork-in-task", "unneeded-get", "global-changed", "global-write", "ref-out-of-band",
    "get-too-many",
)

LARGE_ARG_MIN_REPEATS = 3
# Records looked at in full per step; more are sampled. Reading one costs a look ~1.5-2
# µs (cold in the cache by then), so the sample is most of a look's cost; 128 keeps the
# advisor's own work within its 2% on the fastest batches (measured: see
# bench/HOTPATH.md, "The diagnostics' costs"). The statistical rules keep their last
# 512 run times per call site, filled in four looks or five (~1 s).
SAMPLE_PER_STEP = 128
PINNED_MIN_BYTES = 256 << 20
PINNED_MIN_AGE_S = 1.0  # objects ready for less time than this are probably about to be read
REPLAY_MAX_STEPS = 200  # a replayed log is checked at most this many times
# A get of several values that together are this share of the store's budget, and this
# many bytes at the least, holds them all at once (driver_calls.GET_SIZE_GATE sums them).
GET_MANY_SHARE = 0.5
GET_MANY_MIN_BYTES = 64 << 20
GET_MANY_MIN_OBJECTS = 2
GET_MANY_BATCH_SHARE = 0.1  # the batch size suggested: values of about this share each


@dataclass
class _Site:
    """What one call site of ``.remote()`` has done so far."""

    name: str
    count: int = 0
    run_times: deque[float] = field(default_factory=lambda: deque(maxlen=512))
    arg_counts: dict[tuple[int, ...], int] = field(default_factory=dict)
    arg_copy_s: dict[tuple[int, ...], float] = field(default_factory=dict)  # after the first
    recent: deque[TaskRecord] = field(default_factory=lambda: deque(maxlen=SERIAL_WINDOW))


class AdviceRules(GetRules, LoadRules, CatalogueRules):
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
        self.store_budget = 0  # the object store's budget in bytes, where known (else 0)
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
        if span.kind == "get" and span.nbytes and self.store_budget:
            self._check_get_too_many(span)
        if span.kind == "get" and span.object_count >= SLOWEST_MIN_OBJECTS:
            self._check_wait_for_slowest(span)
        if span.kind == "get" and span.object_count >= SLOWEST_MIN_OBJECTS and self._first_loads:
            self._check_startup(span)









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














    def _check_get_too_many(self, span: DriverSpan) -> None:
        """A get of several values that together took a large share of the store's
        budget: the store held them all at once, and so did the driver afterwards
        (Ray's "fetching too many objects at once"); one big value is not this."""
        total, budget = span.nbytes, self.store_budget
        if (span.object_count < GET_MANY_MIN_OBJECTS or total < GET_MANY_MIN_BYTES
                or total < GET_MANY_SHARE * budget):
            return
        per_value = total / span.object_count
        batch = max(1, int(GET_MANY_BATCH_SHARE * budget / per_value))
        earlier = self._by_identity.get(("get-too-many", span.callsite))
        if earlier is not None:  # reported once; its figures follow the biggest get
            if total > earlier.evidence["bytes"]:
                earlier.evidence.update(bytes=total, objects=span.object_count,
                                        share=round(total / budget, 3))
            return
        self._report(Finding(
            "get-too-many",
            f"one get() fetched {span.object_count} values of {_size(total)} in all, "
            f"{total / budget:.0%} of the object store's {_size(budget)}: the store and "
            "then the driver held every one of them at once",
            {"objects": span.object_count, "bytes": total, "store_budget": budget,
             "share": round(total / budget, 3), "suggested_batch": batch},
            f"fetch and handle them in batches of about {batch}: for i in range(0, "
            f"len(refs), {batch}): handle(lightwork.get(refs[i:i + {batch}])); or take "
            f"them as they finish with lightwork.wait(refs, num_returns={batch}), and let "
            "each batch go before the next",
            span.callsite,
        ))

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
