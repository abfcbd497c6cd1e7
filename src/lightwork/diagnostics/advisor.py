"""The advisor: name the classic parallel-programming mistakes while the program runs.

Reads the always-on event log (task records and the driver's blocked get/wait spans)
and a few runtime facts; never touches the hot path. A daemon thread
(``kernel.periodic.PeriodicThread``) wakes every ``interval`` seconds, takes the
records added since its last look (``EventLog.take_fresh``, under the runtime's lock:
the log's records, read from its ring, so nothing is kept for the advisor between
looks), folds them into per-call-site statistics, and checks each rule. This module is that
collection (the thread, the replay, the public functions); the statistics and the rules
themselves are :class:`~lightwork.diagnostics._advice_rules.AdviceRules`, which
:class:`Advisor` extends. A rule that fires produces a :class:`Finding`: what was seen
(evidence numbers), where (file, line and function of the user's call), and the fix, in
the user's terms.

Each finding is reported once per (kind, call site):

* queued for the driver's thread, which emits it as a Python warning of category
  :class:`AdviceWarning` at its next ``get``/``wait`` — so ``warnings`` filters apply,
  including turning advice into errors — pointing at the user's line;
* kept for :func:`advise` (data plus a printed report), ``lightwork advise`` and the
  timeline, which shows each finding as an instant event at the time it was seen.

Without a live advisor (``init(advisor=False)``, or a saved timeline file), the same
rules run on records given to :meth:`Advisor.feed`, which replays them in the order the
log received them, in steps like the live thread's, so each finding's ``seen_at`` is the
log time at which its evidence was complete. An ``Advisor`` needs no runtime for that:
``Advisor(cpus=..., cores=...)``. :func:`analysis_input` turns the log into plain JSON
(embedded in timeline files) and :func:`analyse` re-runs the rules on it.

Rules (``KINDS``), with what each looks at:

get-in-loop       consecutive blocked ``get`` of one object from one call site, each
                  task submitted after the previous get returned and alone in flight,
                  not needing the previous step (no dependency through refs, not a call
                  on the same actor, not a chain by value: ``_chains`` reads the loop's
                  source), while slots sat idle (measured)
tiny-tasks        a function's median run time below a few times the per-task overhead
large-arg-repeated the same big value (same object, same size) passed by value again
                  and again from one call site
wait-for-slowest  a ``get`` of many objects whose results became ready over a wide spread
                  because one task ran much longer than the typical one by its own work
                  (more CPU, or time its worker did not spend waiting for a core:
                  not machine load)
actor-bottleneck  calls queue on one busy actor while task slots sit idle
serial-driver     the driver's own work between submissions (its main thread's time
                  running or waiting for a core, less get/wait/put and argument
                  copying) while the slots idled and the tasks had work of their own to
                  overlap with it (Amdahl)
oversubscription  a task whose process used more CPU time than its share (threads)
fewer-slots       more CPU-bound tasks at once than the machine has cores (num_cpus too high)
refs-pinned       the object store filling with settled objects only driver refs hold
actor-deadlock    a get in an actor the runtime refused because it could never return
                  (its own call on a busy actor, a cycle of actors; the runtime's report)
memory-growth     a function whose worker's resident memory rose across nearly every
                  one of its last calls there and stayed: its calls' peaks rose by
                  ``LEAK_MIN_GROWTH`` or more (records' ``rss_change``, ``rss_peak``:
                  a likely leak; :class:`_MemoryGrowth`)
stuck-task        a call running far past its function's history (or the user's threshold,
                  ``LIGHTWORK_STUCK_AFTER_S``, without one) while its worker uses no CPU
                  or the driver waits on it, named with where it waits (``_stuck``)
redefined-remote  one ``@remote`` definition pickled again and again (a ``define`` span
                  per pickling, logged by the API at a definition's first call)
large-closure     a function or class whose pickle is big because of a value it
                  captures (the span names the biggest)
startup-dominated a get of a batch that waited mostly for workers loading the function
                  (its imports) before their first run
returned-put-ref  a task's result holding refs to values its own call put
get-of-nested-args a task's get of refs it was passed inside a container argument
blocking-in-async-actor a blocking get/wait on an async actor's event loop while the
                  actor had other calls to run
unneeded-get      a big by-value argument that points into the object store (a value get
                  returned, passed back: ``kernel.calls.large_arguments`` marks it)
global-changed    a call after the driver rebound a global its function read when shipped
                  (``api.definitions.changed_globals``, read each look)
fork-in-task      a fork inside a call (the worker's fork hook sends ``ADVICE``), or in
                  the driver while a live advisor runs (``_watch_driver_forks``)
global-write      a call that rebound a module global holding a value (the worker
                  watches the functions whose code assigns one: ``kernel.global_writes``)
ref-out-of-band   a ref the program pickled outside lightwork's serializer, or rebuilt
                  from its id (``RefCounter.on_out_of_band``, in the driver or a worker)
get-too-many      one get of several values that together were a large share of the
                  store's budget (a blocked get's span carries their bytes while the
                  store's segments hold ``driver_calls.GET_SIZE_GATE`` or more)

returned-put-ref, get-of-nested-args, blocking-in-async-actor, fork-in-task,
global-write and ref-out-of-band come from the local engine serving the workers'
requests (the run record's ``take_advice_events``, filled only while an advisor runs, on
paths that already block or carry refs), read at each look. Big by-value arguments are
counted as they are submitted (``note_large_args``, on the copying path only) and warned
about at the ``.remote()`` that makes the third copy. Each finding carries its cost so far
(``Finding.cost_s``); ``advise()`` and the report rank by it.

Never wrong: a finding is made only on evidence computed from what happened, and a
false one teaches users to ignore the advisor. How busy the slots were comes from the
spans of every task and actor call that ran (``_measure.SlotTime``, plus the runs still
going), never from the call site's own tasks alone; a task's CPU is its worker's process
CPU time over the call itself (arguments loaded, result not yet stored); the driver's
serial time leaves out its blocked get/wait time and lightwork's own copying of big
values (``put`` spans, and big arguments inside ``.remote()``: ``TaskRecord.copy_s``),
and is at most what its main thread spent running or waiting for a core
(``TaskRecord.driver_busy``, sampled at submission at most every 5 ms): sleeping is not
work, and a loaded machine stretches work without creating it. A slow task is slow by its
own work when it used more CPU than the typical one (for the CPU share it got), or when
its worker did not wait for a core for most of its extra time (each worker's
``schedstat`` run-queue wait, sampled each look; where that is unknown, as in a saved
log, cores sat idle meanwhile: the machine's idle time, sampled each look and saved);
otherwise other programs may have kept it off the cores. No finding advises a fix the
runtime cannot carry out (``num_cpus`` above its CPU slots) or reports a figure no
process can reach (more cores than the machine has). ``tests/diagnostics/test_advisor_corpus.py``
holds correct programs in the styles Ray's docs teach; each must get no finding.

The thresholds are module constants; they are deliberately conservative: a finding must
be worth the user's attention, and well-written programs must get none.

What the advisor costs the program, by design a cost per look rather than per task:
its looks, on its own thread, and its tally (``_measure.RunTally``), which the event log
calls with the records that ended in each read of the workers, on the thread that wrote
them, while they are still warm in the cache. A look folds in the tally's sums and reads
in full only its sample (``SAMPLE_PER_STEP`` records), the records the tally named (big
arguments, long runs) and those a one-object get waited for while get-in-loop may still
be found at its call site (that rule follows each such get to its task's record, which
a sample would miss in a fast loop of tiny calls). ``make bench``'s ``advisor_looks``
row reports the looks' and the tally's CPU per task against the time per task in one
session (the target: 2% of a batch of no-op tasks), beside a row that times fresh
sessions with and without the advisor, whose difference swings with the noise between
sessions.
Measured: see bench/HOTPATH.md, "The diagnostics' costs".
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Sequence
from itertools import groupby
from typing import Any

from lightwork.api.definitions import changed_globals
from lightwork.kernel import tools as _tools
from lightwork.kernel.introspect import forking_callsite
from lightwork.kernel.events import DriverSpan, TaskRecord
from lightwork.kernel.periodic import PeriodicThread
from lightwork.diagnostics._advice_rules import (
    CPU_BOUND_MIN_S,
    KINDS as _RULE_KINDS,
    PINNED_MIN_AGE_S,
    PINNED_MIN_BYTES,
    REPLAY_MAX_STEPS,
    SAMPLE_PER_STEP,
    AdviceRules,
    Finding,
)
from lightwork.diagnostics._finding import ranked
from lightwork.diagnostics._stuck import (
    StuckWatch,
    describe,
    driver_blocked_in_get,
    stuck_elsewhere,
    where_waiting,
    worker_stack,
)
from lightwork.diagnostics._measure import (
    RunTally,
    logged_at,
    plain,
    restore,
    running_work,
    sample_places,
)

__all__ = ["KINDS", "AdviceWarning", "Advisor", "Finding", "advise", "analyse",
           "analysis_input", "current_findings", "report"]


Finding.__module__ = __name__  # its public home, for reprs and pickles

KINDS = _RULE_KINDS + ("memory-growth",)

LEAK_MIN_CALLS = 5  # measured calls of one function on one worker
LEAK_MIN_GROWTH = 32 << 20  # its worker's resident memory grew this much over them, or more
LEAK_MIN_RISING = 0.8  # ... rising across at least this share of them
LEAK_MIN_KEPT = 0.5  # ... and at least this share of what they added stayed (the peaks)
LEAK_WINDOW = 32  # the last measured calls of a function on a worker that are looked at


class _MemoryGrowth:
    """The memory-growth rule: per (function, worker), its last measured calls' changes
    of resident memory (``TaskRecord.rss_change``; ``rss_peak`` 0 is not measured).

    A leak grows the worker call after call: nearly every call ends with more resident
    than it began with, and it stays, so each call's peak is above the last one's. A
    task that allocates and frees ends about where it began (the allocator keeps some
    pages after the first call, which then stay flat), so it rises in few calls, however
    big its peak. A task that reads a big argument from shared memory ends with more
    resident than it began with (the pages it read), every call, but the runtime unmaps
    the argument after the call: the next one begins where the last began, and the
    peaks stay flat."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, int], deque[TaskRecord]] = {}

    def add(self, record: TaskRecord) -> Finding | None:
        key = (record.name, record.worker_id)
        calls = self.calls.get(key)
        if calls is None:
            calls = self.calls[key] = deque(maxlen=LEAK_WINDOW)
        calls.append(record)
        if len(calls) < LEAK_MIN_CALLS:
            return None
        added = sum(r.rss_change for r in calls)
        rising = sum(1 for r in calls if r.rss_change > 0)
        growth = calls[-1].rss_peak - calls[0].rss_peak  # what stayed, call after call
        if (growth < LEAK_MIN_GROWTH or rising < LEAK_MIN_RISING * len(calls)
                or growth < LEAK_MIN_KEPT * added * (len(calls) - 1) / len(calls)):
            return None
        mb = 1 << 20
        per_call = growth / (len(calls) - 1)
        first = calls[0].rss_peak - max(calls[0].rss_change, 0)
        last = calls[-1].rss_peak
        return Finding(
            "memory-growth",
            f"{record.name} grows its worker's memory call after call (a likely leak): "
            f"{per_call / mb:+.1f} MB a call over its last {len(calls)} calls on worker "
            f"{record.worker_id}, {growth / mb:.0f} MB in all, resident up to {last / mb:.0f} MB",
            {"function": record.name, "worker_id": record.worker_id, "calls": len(calls),
             "rising_calls": rising, "growth_bytes": growth, "added_bytes": added,
             "per_call_bytes": per_call,
             "resident_before_bytes": first, "rss_peak_bytes": last},
            f"something in {record.name} keeps what each call makes: a module-level list, "
            "dict or cache that only grows, a global that collects results, an lru_cache "
            "on unbounded arguments. Bound it or let it go at the end of the call; "
            "lightwork.profile_tasks(memory=True) names the lines that allocate it; "
            "max_calls=N on the function restarts its worker every N calls meanwhile",
            record.callsite)


class AdviceWarning(UserWarning):
    """A lightwork advisor finding; filter it with ``warnings`` like any warning."""


class Advisor(AdviceRules):
    """The rules (:class:`AdviceRules`) fed from a runtime's log, or from records.

    Live: ``Advisor(node)`` reads the node's log (``start`` runs the thread, ``step`` one
    look). Offline: ``Advisor(cpus=n, cores=m)`` with no node analyses only what
    :meth:`feed` gives it; ``cpus`` are the runtime's CPU slots and ``cores`` the
    machine's (both as they were where the records came from); ``started_at`` (the log
    time the records begin at) is accepted for saved files and not needed.
    """

    def __init__(
        self, node: Any = None, interval: float = 0.25, watch: bool = True,
        init_callsite: tuple[str, int, str] | None = None, *,
        cpus: float | None = None, cores: int | None = None, started_at: float | None = None,
    ) -> None:
        if node is None and cpus is None:
            raise TypeError("Advisor() needs a runtime node or, to analyse records, cpus=")
        super().__init__(
            cpus=float(cpus if cpus is not None else node.cpu_total()),
            cores=int(cores or os.cpu_count() or 1), init_callsite=init_callsite)
        self.node = node
        if node is not None:
            self.store_budget = node.store_budget()
        self.interval = interval
        self._lock = threading.Lock()  # the rules' state: this thread, advise(), feed()
        # One look at a time (see step).
        self._looking = threading.Lock()
        self._thread = PeriodicThread("lightwork-advisor", interval, self.step,
                                      self._give_up)
        # Live: the runs are summed as the records end (the log calls this under the
        # runtime's lock); each look takes the sums (_measure.RunTally says why).
        self._fresh_runs = RunTally(long_s=CPU_BOUND_MIN_S)
        self._stuck = StuckWatch()  # calls running far too long, doing nothing
        if watch and node is not None:
            node.log.watch(self._fresh_runs.ended)
        self._memory_growth = _MemoryGrowth()

    def _add_record(self, record: TaskRecord, weight: int = 1) -> None:
        super()._add_record(record, weight)
        if record.rss_peak:  # its memory was measured (the memory-growth rule)
            finding = self._memory_growth.add(record)
            if finding is not None:
                self._report(finding, key=record.name)

    def feed(self, tasks: list[TaskRecord], spans: list[DriverSpan]) -> None:
        """Analyse records given directly (the whole log when no advisor was running).

        They are replayed in the order the log received them (a task when the driver
        saw it end, a span when it ended), in steps of ``interval`` seconds of log time
        (longer for a long log: at most ``REPLAY_MAX_STEPS``), each step checked as the
        live thread checks it; a finding's ``seen_at`` is the last log time of its step.
        """
        timed: list[tuple[float, int, Any]] = [(logged_at(r), 0, r) for r in tasks]
        timed += [(span.end, 1, span) for span in spans]
        if not timed:
            return
        timed.sort(key=lambda item: (item[0], item[1]))
        first, last = timed[0][0], timed[-1][0]
        width = max(self.interval, (last - first) / REPLAY_MAX_STEPS, 1e-9)
        with self._lock:
            # How busy the slots were comes from every run in the records (the replay
            # knows the runs that had not ended yet at a step, unlike the live thread).
            tally = RunTally(self._busy)
            tally.ended(tasks)
            tally.flush()
            try:
                for _, group in groupby(timed, key=lambda item: (item[0] - first) // width):
                    step = list(group)
                    self._replay_at = self._now = step[-1][0]
                    for _, kind, item in step:  # tasks first, as take_fresh hands them out
                        if kind == 0:
                            self._add_record(item)
                    for _, kind, item in step:
                        if kind == 1:
                            self._add_span(item)
                    self._check_touched()
                self._refresh_titles()
            finally:
                self._replay_at = None

    # -- the thread ------------------------------------------------------------------
    def start(self) -> None:
        # Running for a node (its ``advisor``): big arguments are counted as they are
        # submitted (``note_large_args``), not when their tasks end.
        self.large_args_at_submission = self.node is not None
        _watch_driver_forks()
        idle = machine_idle_core_s()  # the first sample: tasks may start before the first look
        if idle is not None:
            with self._lock:
                self.add_machine_sample(time.monotonic(), idle)
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def _give_up(self, error: Exception) -> bool:
        import traceback

        # The advisor must never disturb the program: say what broke, then stop looking,
        # and stop the log keeping anything for looks that will not come.
        traceback.print_exception(type(error), error, error.__traceback__)
        node = self.node
        if node is not None:
            with node.lock:
                node.log.unwatch()
        return False

    def step(self) -> None:
        """Take the new records and check every rule (also called by ``advise``).

        One look at a time: a look takes what was logged since the last one, then reads
        ``/proc`` (outside the runtime's lock), then folds it all into the rules. Had
        ``advise()`` looked while this thread was between taking and folding, it would
        have found nothing new and answered without the records this thread held (the
        likely reason the demo's serial-driver finding went missing twice in about 60
        runs; ``test_advisor.py`` holds a look between the two)."""
        node = self.node
        if node is None:
            return  # an offline advisor sees only what feed() gives it
        with self._looking:
            self._look(node)

    def _look(self, node: Any) -> None:
        with node.lock:
            if node.closed:
                return
            records, spans, notable = node.log.take_fresh()
            # Every run counted towards how busy the slots were as it ended (the tally).
            # A flood of tasks: a sample tells the statistical rules as much, for a
            # fraction of the time this thread takes from the program. Big arguments and
            # long tasks are always looked at (in log order, with the sample), and so are
            # the tasks one-object gets waited for (get-in-loop). Read out of the ring
            # here, under the lock (the log's FreshRecords); the rules keep the log's own
            # records (they only read them).
            count = len(records)
            stride = max(1, count // SAMPLE_PER_STEP)
            if stride > 1:
                notable = self._with_waited_for(records, spans, notable)
            picked = [(records[place], weight)
                      for place, weight in sample_places(count, stride, notable)]
            runs = self._fresh_runs.take()
            # (results just made are about to be read: only the settled ones count)
            pinned = (node.driver_pinned(time.monotonic() - PINNED_MIN_AGE_S)
                      if node.shared_memory_bytes() >= PINNED_MIN_BYTES else None)
            running = running_work(node)
            calls = node.running_calls()
            workers = node.worker_pids()
            # The runtime's own reports of gets in actors that could never return.
            deadlocks = node.actor_deadlocks()
            # What serving the workers' requests showed (the local engine's).
            shown = node.take_advice_events()
        idle = machine_idle_core_s()
        waits = [(worker_id, worker_waited_s(pid)) for worker_id, pid in workers]
        rebound = changed_globals()  # the driver's globals, read (off its threads)
        with self._lock:
            self._now = time.monotonic()
            if idle is not None:
                self.add_machine_sample(self._now, idle)
            for worker_id, waited in waits:
                if waited is not None:
                    self.add_worker_sample(worker_id, self._now, waited)
            self._running = running
            if rebound:
                self.note_global_changes(rebound)
            self._busy.merge(runs)
            for record, weight in picked:
                self._add_record(record, weight)
            for span in spans:
                self._add_span(span)
            if count or spans:  # the rules below only change when records arrive
                self._check_touched()
            if pinned is not None:
                self._check_pinned(*pinned)
            for deadlock in deadlocks:
                self._name_deadlock(deadlock)
            for event in shown:
                self._name_runtime_event(event)
            self._grow_stuck(calls)
            stuck = self._stuck.stuck(self._now, calls, driver_blocked_in_get,
                                      self._history_of)
            self._refresh_titles()
        for record, worker_id, pid, ran, why, longest in stuck:
            if ("stuck-task", record.task_id) in self._reported:
                continue
            # One worker's dump, as `lightwork stack` shows it (off every lock).
            where = where_waiting(worker_stack(node.session.directory, worker_id, pid),
                                  record.name)
            with self._lock:
                self._name_stuck(record, ran, why, longest, describe(where), where)

    def name_stuck_elsewhere(self, node: Any) -> None:
        """Stuck tasks on workers elsewhere (a cluster's), named with where they wait
        (``_stuck.stuck_elsewhere``; a second look a second later when a task is a
        candidate)."""
        def history(name: str) -> tuple[int, float]:
            with self._lock:
                return self._history_of(name)

        stuck = stuck_elsewhere(self._stuck, node, history, driver_blocked_in_get)
        with self._lock:
            for record, ran, why, longest, where in stuck:
                self._name_stuck(record, ran, why, longest, describe(where), where)

    def note_large_args(self, record: TaskRecord) -> None:
        """``AdviceRules.note_large_args``, then the warning at once: the call is the
        user's ``.remote()``, in the user's thread, and pointing at it is the fix."""
        if not self.large_args_at_submission:
            return
        super().note_large_args(record)
        if self.undelivered:
            self.deliver_warnings()

    def _with_waited_for(self, records: Sequence[TaskRecord], spans: list[DriverSpan],
                         notable: list[int]) -> list[int]:
        """``notable`` and the places of the records that a get of one object waited for,
        while its call site is not yet reported for get-in-loop: that rule follows each
        such get to its task's record, and a sample would leave most of them out (a fast
        loop of tiny tasks, thousands a look, would go unreported). One
        pass over the step's records, only while such gets come."""
        wanted = {span.first_task_id for span in spans if self._may_be_get_in_loop(span)}
        if not wanted:
            return notable
        waited_for = [place for place, record in enumerate(records)
                      if record.task_id in wanted]
        return sorted(set(notable).union(waited_for))

    def deliver_warnings(self) -> None:
        """Emit queued findings as warnings (called in the driver's thread by the API)."""
        while self.undelivered:
            try:
                finding = self.undelivered.popleft()
            except IndexError:
                return
            filename, line = ("lightwork", 0) if finding.callsite is None else finding.callsite[:2]
            warnings.warn_explicit(
                finding.message(), AdviceWarning, filename, line, module="lightwork.advisor")



_fork_watched = False


def _watch_driver_forks() -> None:
    """Once per process: a fork in the driver while a live advisor runs (lightwork's
    threads exist by then) goes to its run record (``note_advice_event``). The hook runs
    only at a fork, in the forking thread, before it forks: a few attribute reads."""
    global _fork_watched
    if _fork_watched or not hasattr(os, "register_at_fork"):
        return
    _fork_watched = True
    os.register_at_fork(before=_driver_forking)


def _driver_forking() -> None:
    from lightwork.api import core

    backend = core._backend
    node = backend.run_record() if backend is not None else None
    if node is None or node.advisor is None or node.closed:
        return
    site = forking_callsite()
    if site is not None:
        node.note_advice_event(("fork", None, site))


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_idle_core_s() -> float | None:
    """The machine's idle (and I/O-wait) core-seconds since boot, or None off Linux."""
    try:
        with open("/proc/stat", "rb") as stat:
            fields = stat.readline().split()
        return (int(fields[4]) + int(fields[5])) / _CLOCK_TICKS  # "cpu user nice system idle iowait"
    except (OSError, IndexError, ValueError):
        return None


def worker_waited_s(pid: int) -> float | None:
    """Seconds a worker's main thread (where its tasks run) has waited for a core
    (``/proc/<pid>/schedstat``), or None (gone, or not Linux)."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def report(findings: list[Finding]) -> str:
    """A short human-readable report of ``findings``."""
    if not findings:
        return "lightwork advisor: no findings: nothing looks wrong so far."
    lines = [f"lightwork advisor: {len(findings)} finding(s)"]
    for number, finding in enumerate(findings, 1):
        lines.append(f"{number}. [{finding.kind}] {finding.title}")
        lines.append(f"   at {finding.where()}")
        if finding.cost_s > 0:
            lines.append(f"   {finding.cost()}")
        lines.append(f"   fix: {finding.suggestion}")
    return "\n".join(lines)


def current_findings(node: Any, tasks: list[TaskRecord] | None = None,
                     spans: list[DriverSpan] | None = None) -> list[Finding]:
    """The findings of ``node``'s advisor after one more look, or of a one-off analysis,
    the costliest first (``Finding.cost_s``).

    With ``advisor=False`` the whole log is analysed now (``tasks`` and ``spans``: a
    copy of it the caller already took, to avoid a second one).
    """
    advisor = node.advisor
    if advisor is not None:
        advisor.step()
        with advisor._lock:
            return ranked(advisor.findings)
    if tasks is None or spans is None:
        with node.lock:
            tasks, spans = node.log.ended_records(), list(node.log.spans)
    advisor = Advisor(node, watch=False)
    advisor.feed(tasks, spans)
    if node.processes_elsewhere:
        advisor.name_stuck_elsewhere(node)
    return ranked(advisor.findings)


def analysis_input(node: Any, tasks: list[TaskRecord],
                   spans: list[DriverSpan]) -> dict[str, Any]:
    """What :func:`analyse` needs to re-run the rules later, as plain JSON-able data."""
    advisor = node.advisor
    machine: list[list[float]] = []
    if advisor is not None:
        with advisor._lock:  # its thread appends meanwhile
            machine = [list(sample) for sample in advisor._machine]
    return {
        "cpus": node.cpu_total(),
        "cores": os.cpu_count() or 1,
        "store_budget": node.store_budget(),
        "started_at": node.log.started_at,
        "init_callsite": list(advisor.init_callsite) if advisor is not None
        and advisor.init_callsite else None,
        "tasks": [plain(record) for record in tasks],
        "spans": [plain(span) for span in spans],
        # The machine's idle cores over time: wait-for-slowest tells load from work by it.
        "machine": machine,
    }


def analyse(data: dict[str, Any]) -> list[Finding]:
    """Re-run the rules on :func:`analysis_input` data (e.g. from a timeline file)."""
    callsite = data.get("init_callsite")
    advisor = Advisor(cpus=float(data["cpus"]), cores=int(data.get("cores") or 1),
                      started_at=data.get("started_at"),
                      init_callsite=tuple(callsite) if callsite else None)
    advisor.store_budget = int(data.get("store_budget") or 0)
    for at, idle_core_s in data.get("machine") or ():
        advisor.add_machine_sample(float(at), float(idle_core_s))
    advisor.feed([restore(TaskRecord, row) for row in data.get("tasks", [])],
                 [restore(DriverSpan, row) for row in data.get("spans", [])])
    return ranked(advisor.findings)


def advise(print_report: bool = True) -> list[Finding]:
    """The advisor's findings so far, as data, the costliest first (each one's
    ``cost_s``: the seconds it has cost so far); also prints a short report.

    Works with ``init(advisor=False)`` too: the whole event log is then analysed now.
    """
    from lightwork.api import core as _api

    node = _api.run_record("the advisor")
    if node is not None:
        node.sync()  # a cluster run: pull the workers' reports first
    if node is None:
        raise RuntimeError(
            "no lightwork runtime is running in this process; call lightwork.advise() "
            "before lightwork.shutdown() (the advisor reads the live event log)"
        )
    findings = current_findings(node)
    if node.advisor is not None:
        node.advisor.deliver_warnings()
    if print_report:
        print(report(findings))
    return findings


# The engines build a run's advisor, and the views read its findings, through the kernel.
_tools.register_advisor(sys.modules[__name__])
