"""The advisor's rules about the driver's gets: get-in-loop and wait-for-slowest.

:class:`GetRules` is a part of :class:`~lightwork.diagnostics._advice_rules.AdviceRules`
(which subclasses it and owns every attribute it reads; the annotations below only name
them). Its rules run on the driver's blocked ``get`` spans as ``_add_span`` folds them
in: a run of one-object gets from one line, each waiting for a task submitted after the
previous get returned (get-in-loop, whose figures keep following the loop once named),
and a get of many results that became ready far apart because one task ran long by its
own work (wait-for-slowest). Each is reported once per (kind, call site) through
``_report``.

The thresholds are module constants; they are deliberately conservative.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

from lightwork.kernel.events import DriverSpan, TaskRecord
from lightwork.diagnostics._chains import feeds_next_call
from lightwork.diagnostics._finding import Finding

GET_IN_LOOP_MIN = 4  # consecutive one-object gets from one call site
GET_IN_LOOP_MIN_IDLE = 0.5  # slots idle on average over those gets
CHAIN_MAX_LOOKUP = 256  # records visited looking for a dependency on the previous get
SLOWEST_MIN_OBJECTS = 4
SLOWEST_MIN_WAIT_S = 0.2
SLOWEST_SPREAD = 0.5  # the results' spread is at least half of the blocked time
SLOWEST_WAVES_SLACK = 1.5  # spread up to this times what running in waves explains is fine
SLOWEST_OWN_CPU_SHARE = 0.25  # the slowest's extra CPU was this share of its extra time
SLOWEST_MIN_SHARE = 0.05  # a task's CPU share of its run, at the least (sleeping tasks)
SLOWEST_STALL_SHARE = 0.5  # waited for a core this share of its extra time: maybe load
SLOWEST_MIN_IDLE_CORES = 0.5  # fewer idle cores than this: a runnable task may have waited


class GetRules:
    """The gets' rules (see the module docstring); a mixin of ``AdviceRules``."""

    if TYPE_CHECKING:
        cpus: float
        findings: list[Finding]
        _now: float
        _records: dict[int, TaskRecord]
        _recent: Any
        _running: list[tuple[float, float, TaskRecord]]
        _sites: dict[Any, Any]
        _busy: Any
        _chains: dict[tuple[Any, Any], bool]
        _reported: set[tuple[str, Any]]
        _by_identity: dict[tuple[str, Any], Finding]
        _stale_titles: set[int]

        def _report(self, finding: Finding, key: Any = None) -> None: ...
        def _worker_waited_between(self, worker_id: int, begin: float,
                                   end: float) -> float | None: ...
        def _idle_cores_between(self, begin: float, end: float) -> float | None: ...

    def _may_be_get_in_loop(self, span: DriverSpan) -> bool:
        """Whether ``span`` is a get of one object at a call site not yet reported for
        get-in-loop. Once said, a site's gets are not followed: checking again would
        cost every later get of the loop ~20-40 µs of this thread (the chain's last 16
        gets against the site's recent tasks) to find what _report drops."""
        return (span.kind == "get" and span.object_count == 1
                and ("get-in-loop", span.callsite) not in self._reported)

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
