"""The advisor's rules for the rest of Ray's catalogue of anti-patterns, and stuck calls.

:class:`CatalogueRules` is a part of :class:`~lightwork.diagnostics._advice_rules.AdviceRules`
(which subclasses it and owns every attribute it reads; the annotations below only name
them): the rules whose evidence is not the task records' statistics but one event each
(a remote definition pickled, a runtime report from serving a worker, a stuck call,
a global rebound), plus the first-batch rule. Each is reported once per (kind, key)
through ``_report``, like every finding.

The thresholds are module constants; they are deliberately conservative.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from lightwork.kernel.events import DriverSpan, TaskRecord
from lightwork.diagnostics._finding import Finding, _duration, _size

STARTUP_MIN_S = 0.3  # workers' start-up and first loads in one batch, at the least
STARTUP_SHARE = 0.5  # ... and at least this share of the time its get was blocked
LARGE_ARG_BYTES = 1 << 20  # (kernel.calls.LARGE_ARGUMENT_BYTES) arguments this big load slowly
REDEFINE_MIN = 5  # picklings of one definition site (each a new @remote object)
LARGE_CLOSURE_BYTES = 1 << 20  # a function's or class's pickle this big carries data


class CatalogueRules:
    """The catalogue's rules (see the module docstring); a mixin of ``AdviceRules``."""

    if TYPE_CHECKING:
        cpus: float
        findings: list[Finding]
        _now: float
        _records: dict[int, TaskRecord]
        _recent: Any
        _reported: set[tuple[str, Any]]
        _by_identity: dict[tuple[str, Any], Finding]
        _definitions: dict[Any, list[float]]
        _workers_seen: set[int]
        _loads_seen: set[tuple[int, str]]
        _first_loads: dict[int, float]
        _startups: Any
        _global_changes: dict[str, tuple[float, str, Any]]

        def _report(self, finding: Finding, key: Any = None) -> None: ...
        def _worker_waited_between(self, worker_id: int, begin: float,
                                   end: float) -> float | None: ...

    def _name_unneeded_get(self, record: TaskRecord, nbytes: int) -> None:
        name = record.name
        earlier = self._by_identity.get(("unneeded-get", record.callsite))
        if earlier is not None:
            earlier.evidence["times"] += 1
            earlier.cost_s += record.copy_s
            return
        self._report(Finding(
            "unneeded-get",
            f"a {_size(nbytes)} value that get() returned was passed by value to "
            f"{name}: get read it out of the object store and .remote() copied it back in",
            {"bytes": nbytes, "function": name, "times": 1},
            f"pass the ObjectRef itself, {name}.remote(ref), instead of "
            f"{name}.remote(lightwork.get(ref)): the task receives the value, and the "
            "driver copies nothing",
            record.callsite, cost_s=record.copy_s,
        ))

    def note_global_changes(self, changes: list[tuple[str, Any, str, float]]) -> None:
        """Globals the driver rebound after a function that reads them was shipped."""
        for function, site, name, at in changes:
            self._global_changes.setdefault(function, (at, name, site))

    def _check_global_change(self, record: TaskRecord) -> None:
        """A call submitted after the driver rebound a global its function read when
        it was shipped: the call runs with the value the function was shipped with."""
        name = record.name
        change = self._global_changes.get(name)
        if change is None and "." in name:  # an actor's method: its class was shipped
            name = name.rsplit(".", 1)[0]
            change = self._global_changes.get(name)
        if change is None or record.submitted < change[0]:
            return
        at, variable, site = change
        self._report(Finding(
            "global-changed",
            f"the driver rebound the global `{variable}` after {name} was shipped to the "
            f"workers; {record.name} calls since still see the value it had then (each "
            "process has its own globals)",
            {"global": variable, "function": name,
             "defined_at": list(site) if site else None},
            f"pass `{variable}` as an argument to each call, or keep state that changes in "
            "an actor and call its methods",
            record.callsite,
        ), key=(name, variable))

    def _name_global_write(self, record: TaskRecord, function: str, filename: str,
                           changed: list[tuple[str, int]]) -> None:
        """A call that rebound a module global from a value it held (the worker's
        ``kernel.global_writes`` watch): the change stays in its worker process."""
        names = ", ".join(f"`{name}`" for name, _ in changed)
        first, line = changed[0]
        if record.actor_id:
            owner = record.name.rsplit(".", 1)[0]
            fix = (f"keep the state in the actor itself: self.{first}, set in "
                   f"{owner}.__init__ and changed by its methods; other tasks read it by "
                   "calling a method of the actor")
        else:
            fix = (f"keep `{first}` in an actor (a @remote class holding it as "
                   "self.<name>, changed and read through its methods), or return the new "
                   f"value from {record.name} and combine the results in the driver")
        self._report(Finding(
            "global-write",
            f"{record.name} rebound the module global {names} ({_short(filename)}:{line}) "
            "in its worker process: only that process's copy changed; the driver, the "
            "other workers and the actors each keep their own",
            {"function": record.name, "globals": [name for name, _ in changed],
             "written_at": [filename, line, function], "worker_id": record.worker_id},
            fix, record.callsite,
        ), key=(record.name, first))

    def _note_first_runs(self, record: TaskRecord) -> None:
        """Keep what a worker's first task, and a function's first run on a worker,
        spent starting and loading (a set lookup for every other record)."""
        key = (record.worker_id, record.name)
        if key in self._loads_seen:
            return
        self._loads_seen.add(key)
        startup = 0.0
        if record.worker_id not in self._workers_seen:
            self._workers_seen.add(record.worker_id)
            if record.dispatched:  # sent as the worker started: it waited for start-up
                startup = max(0.0, record.started - record.dispatched)
                self._startups.append((record.dispatched, record.started))
        self._first_loads[record.task_id] = startup
        if len(self._first_loads) > 4096:
            for old in list(self._first_loads)[:2048]:
                del self._first_loads[old]

    def _all_slots_starting(self, begin: float, end: float) -> float:
        """Seconds of ``begin``..``end`` during which at least as many workers were
        starting (a worker's first task sent, not yet taken up) as there are slots:
        no task could run then, whatever the driver did."""
        edges = sorted(edge for dispatched, started in self._startups
                       if started > begin and dispatched < end
                       for edge in ((max(dispatched, begin), 1), (min(started, end), -1)))
        slots = max(1, int(self.cpus))
        total, active, since = 0.0, 0, begin
        for at, step in edges:
            if active >= slots:
                total += at - since
            active += step
            since = at
        return total

    def _check_startup(self, span: DriverSpan) -> None:
        """A get of a batch that waited mostly for workers starting, and for each
        worker loading the function on its first run (unpickling it imports the
        modules it uses): a first batch slower than serial. An import inside the
        function's body is not counted: it cannot be told from the function's work."""
        blocked = span.end - span.start
        first = self._records.get(span.first_task_id)
        if blocked < STARTUP_MIN_S or first is None or first.callsite is None:
            return
        if ("startup-dominated", first.callsite) in self._reported:
            return
        batch = [r for r in self._recent
                 if r.callsite == first.callsite and r.owner == first.owner and r.started
                 and not r.actor_id and first.submitted <= r.submitted
                 and span.start <= r.finished <= span.end]
        firsts = [r for r in batch if r.task_id in self._first_loads]
        if not firsts or len(batch) <= len(firsts):
            return  # no run but first ones (a warm-up, one call a worker): nothing to say
        by_worker: dict[int, float] = defaultdict(float)
        for record in firsts:
            # Loading before the call: the function (its imports), then the arguments
            # (big ones: mostly their copying, which is not start-up). Less the time the
            # worker waited for a core meanwhile (where sampled): a loaded machine
            # stretches loading without the program asking for more of it. The
            # process's own start (``_first_loads``) is milliseconds from the fork
            # server, and more only on a loaded machine: not counted.
            if record.arg_size >= LARGE_ARG_BYTES:
                continue
            load = max(0.0, record.args_loaded - record.started)
            waited = self._worker_waited_between(record.worker_id, record.started,
                                                 record.args_loaded)
            by_worker[record.worker_id] += max(0.0, load - (waited or 0.0))
        if not by_worker:
            return
        startup = max(by_worker.values())  # the workers load side by side
        # Against the time the get waited once the workers ran (a process slow to
        # start on a loaded machine is not the program's imports).
        active = span.end - max(span.start, min(r.started for r in batch))
        if startup < STARTUP_MIN_S or startup < STARTUP_SHARE * active:
            return
        tasks = len(firsts)
        self._report(Finding(
            "startup-dominated",
            f"get() of {span.object_count} {first.name} results waited {blocked:.2f} s, of "
            f"which {startup:.2f} s went to {len(by_worker)} worker(s) loading "
            f"{first.name} (importing the modules it uses) before its first run: later "
            "batches skip that, so this one looks slower than it is",
            {"blocked_s": round(blocked, 4), "startup_s": round(startup, 4),
             "workers": len(by_worker), "first_runs": tasks, "function": first.name},
            "nothing to fix in the code: it is paid once per worker. Time a second batch, or "
            "warm the workers first (one small call each); keep one runtime for the whole "
            "program rather than init() and shutdown() per batch",
            span.callsite, cost_s=startup,
        ), key=first.callsite)

    def _add_definition(self, span: DriverSpan) -> None:
        """A remote function or actor class pickled at its first call (``define``)."""
        site = span.callsite
        name = site[2] if site else "a remote function"
        tally = self._definitions.setdefault(site, [0, 0.0])
        tally[0] += 1
        tally[1] += span.end - span.start
        if tally[0] >= REDEFINE_MIN:
            title = (f"{name} was defined with @remote {tally[0]} times from the same line: "
                     f"each definition is a new remote function, pickled again at its first call "
                     f"({tally[1]:.2f} s so far)")
            earlier = self._by_identity.get(("redefined-remote", site))
            if earlier is not None:
                earlier.title, earlier.cost_s = title, tally[1]
                earlier.evidence.update(definitions=tally[0], pickling_s=round(tally[1], 4))
            else:
                self._report(Finding(
                    "redefined-remote", title,
                    {"definitions": tally[0], "pickling_s": round(tally[1], 4),
                     "name": name},
                    f"define {name} once, at module level (outside the loop or the function "
                    "called again and again), and call it many times",
                    site, cost_s=tally[1],
                ))
        if span.nbytes >= LARGE_CLOSURE_BYTES:
            carried = f": most of it is {span.note}" if span.note else ""
            self._report(Finding(
                "large-closure",
                f"{name} pickles to {_size(span.nbytes)}, because of what it captures "
                f"from its scope{carried}",
                {"bytes": span.nbytes, "name": name, "captured": span.note},
                "put the big value in the object store once (ref = lightwork.put(value)) "
                "and pass ref as an argument, or load or build it inside the task",
                site, cost_s=span.end - span.start,
            ))

    def _history_of(self, name: str) -> tuple[int, float]:
        """(ended runs, the longest) of function ``name`` among the recent records: asked
        only for a call that has run long (``_stuck``), so nothing is kept per record."""
        runs, longest = 0, 0.0
        for record in self._recent:
            if record.name == name and record.started and record.finished:
                runs += 1
                longest = max(longest, record.finished - record.started)
        return runs, longest

    def _name_stuck(self, record: TaskRecord, ran: float, why: str, longest: float | None,
                    where_text: str, where: dict[str, Any] | None) -> None:
        """A call found stuck (``_stuck.StuckWatch``): named with where it waits."""
        what = "call" if record.actor_id else "task"
        history = (f"its longest earlier run took {longest:.2f} s" if longest is not None
                   else "no earlier run to compare with")
        self._report(Finding(
            "stuck-task",
            f"{record.name} {what} {where_text} for {_duration(ran)} ({history}; {why})",
            {"task_id": record.task_id, "function": record.name, "running_s": round(ran, 2),
             "longest_earlier_s": longest, "why": why, "stack": where,
             "waiting": where_text},
            "see what it waits for (`lightwork stack`): a lock, socket, queue or ref that "
            "never comes; give the wait a timeout, or end it with "
            "lightwork.cancel(ref, force=True); the threshold without history is "
            "LIGHTWORK_STUCK_AFTER_S",
            record.callsite, cost_s=ran,
        ), key=record.task_id)

    def _name_runtime_event(self, event: tuple[Any, ...]) -> None:
        """What the runtime saw while serving a worker's request (the local engine's
        ``advice_events``): a task returning refs to its own puts, a task getting refs
        that came inside a container argument, a blocking call on an event loop."""
        kind = event[0]
        if kind == "fork":
            name, site = event[1], event[2]
            if name is None:
                what = "the driver forked a process after lightwork started its threads"
                why = ("the child gets a copy of the driver without those threads: a "
                       "lock one of them held stays held, and lightwork calls there hang")
            else:
                what = f"a {name} call forked a process inside its worker"
                why = ("the child gets a copy of the worker, with its connection to the "
                       "driver and its threads' locks: it can hang, or garble the worker's "
                       "messages")
            self._report(Finding(
                "fork-in-task", f"{what} (os.fork, or a fork-start multiprocessing pool): {why}",
                {"function": name, "callsite": list(site)},
                "run the parallel work as lightwork tasks (f.remote(item) for each item), or "
                "start processes with spawn: multiprocessing.get_context('spawn').Pool()",
                tuple(site),
            ), key=(name, tuple(site)))
        elif kind == "global-write":
            record, function, filename, changed = event[1:5]
            if record is None:
                return  # the call's task had ended already (it cannot: ADVICE goes first)
            self._name_global_write(record, function, filename, changed)
        elif kind == "out-of-band":
            how, hex_id, site, function = event[1:5]
            inside = f" inside {function}" if function else ""
            if how == "pickle":
                title = (f"ObjectRef {hex_id} was pickled outside lightwork{inside} "
                         "(pickle or cloudpickle): lightwork cannot see which bytes hold it, "
                         "so its object is now kept until shutdown, whether or not the "
                         "bytes are ever loaded")
            else:
                title = (f"ObjectRef {hex_id} was rebuilt from its id{inside} "
                         "(ObjectRef.from_hex, from_binary or ObjectRef(bytes)): a string "
                         "or bytes does not keep an object alive, so the rebuilt ref works "
                         "only while another ref to it still lives")
            self._report(Finding(
                "ref-out-of-band", title,
                {"how": how, "ref": hex_id, "function": function},
                "pass the ref itself: as an argument (f.remote(ref), or inside a list or "
                "dict), as a task's result, or through an actor's method; lightwork then "
                "knows who holds it and frees it when nobody does",
                tuple(site),
            ), key=(how, tuple(site)))
        elif kind == "returned-put":
            count, record = event[1], event[2]
            name = record.name
            self._report(Finding(
                "returned-put-ref",
                f"{name} returned {count} ObjectRef(s) to value(s) it stored itself with "
                "put(): each value took a trip through the object store, and belongs to "
                f"the worker that ran {name}, not to the caller",
                {"refs": count, "function": name},
                f"return the value itself from {name} (return value, not "
                "lightwork.put(value)); for several values, num_returns=n or a list",
                record.callsite,
            ), key=name)
        elif kind == "nested-arg-get":
            call, record, count, callsite = event[1], event[2], event[3], event[4]
            if call != "get":
                return  # a wait on refs in a list (process them as they come) is fine
            name = record.name
            self._report(Finding(
                "get-of-nested-args",
                f"a {name} task called get() on {count} ref(s) it was passed inside a "
                "list, tuple or dict, and blocked its worker while they were computed",
                {"refs": count, "function": name,
                 "get_callsite": list(callsite) if callsite else None},
                f"pass the refs as direct arguments, {name}.remote(*refs): the task then "
                "starts once they are ready and receives their values, holding no worker "
                "while it waits",
                record.callsite,
            ), key=record.callsite)
        elif kind == "loop-blocked":
            call, class_name, method, callsite, others = event[1:6]
            where = method if method and "." in method else (
                f"{class_name}.{method}" if method else class_name)
            self._report(Finding(
                "blocking-in-async-actor",
                f"a blocking {call}() in async method {where} held the actor's event loop: "
                f"its {others} other call(s) could not run until it returned",
                {"call": call, "method": where, "calls_held": others},
                f"await the refs instead: value = await ref (or await asyncio.wait(refs) "
                f"for several) in {where}",
                tuple(callsite) if callsite else None,
            ), key=(where, call))

    def _grow_stuck(self, calls: list[tuple[TaskRecord, int, int, bool]]) -> None:
        """Keep each stuck call's time current while it still runs (its cost so far)."""
        if not any(identity[0] == "stuck-task" for identity in self._by_identity):
            return
        now = self._now
        for record, *_ in calls:
            finding = self._by_identity.get(("stuck-task", record.task_id))
            if finding is not None:
                ran = now - (record.started or record.dispatched or record.submitted)
                old = _duration(finding.evidence["running_s"])
                finding.cost_s = ran
                finding.evidence["running_s"] = round(ran, 2)
                finding.title = finding.title.replace(f"for {old} (", f"for {_duration(ran)} (", 1)


def _short(filename: str) -> str:
    return os.path.basename(filename) or filename
