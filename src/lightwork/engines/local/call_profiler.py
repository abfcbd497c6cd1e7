"""cProfile, line_profiler or tracemalloc around every task call of a worker, while a
profile that asks for them is on.

The switch and its signal are the sampler's (``sampler.py``): the switch file says
``on <token> <hz> cprofile`` (or ``... sample memory``, ``... cprofile lines``, ...),
and the worker's SIGUSR2 handler builds a :class:`CallProfiler` instead of a sampling
thread (in cProfile mode; it writes the worker's file) or beside it (memory or lines
with sampling: the sampler's file then carries their figures). The driver's side of
the merge is :func:`merge`, :func:`merge_lines` and :func:`merge_memory`. With
``memray``, it also holds the worker's memray capture (``memray_capture.py``) and
notes the task functions it ran, which name the capture's stacks.

Lines (``profile_tasks(lines=[f, ...])``, with line_profiler installed): the driver
writes the functions' ``(file, first line, name)`` to ``sampling-lines.json``; the
worker finds its own function objects of those codes among its objects (``gc``, and
the loaded modules' top level, whose objects the fork server froze out of ``gc``'s
sight; once at the start and again after it loads a new function, since a task's
helpers arrive with it) and gives them to one ``line_profiler.LineProfiler``, enabled per call as the
cProfile one is. ``lightwork profile --lines NAME`` names them instead, as
``qualname``, ``file.py:qualname`` or ``module:qualname``: every function of that
name is timed. Its timings travel as JSON (``[file, line, name, [[line, hits,
time], ...]]`` in its timer's unit) and are added up by line in the driver.

Memory (``profile_tasks(memory=True)``): tracemalloc traces the worker's allocations
while the profile runs (started here unless the program traces already). Per call,
the peak of traced memory above what was traced when the call began
(``tracemalloc.reset_peak``) and what the call left allocated; for up to
``SITE_CALLS`` calls of each task function, a snapshot before and after the call,
whose difference by line is what the call left behind where it was allocated: a leak's
lines. A snapshot costs about a microsecond per traced block, and grouping it by line
more (done on the raw traces: ``Snapshot.compare_to`` builds objects per block, each
traced in turn, ~60 ms for 2,000 blocks), so a function's calls are compared only
while their snapshots have cost under ``SITE_SHARE`` of its traced calls' time: a
20 µs task gets one comparison per worker, not twenty. Traced memory is the
process's, so calls side by side in a threaded actor share their peaks.

How a call is profiled: the profiler sets an instance attribute ``_execute`` on the
worker, which shadows the class's method (``Worker.execute`` calls ``self._execute``),
and removes it when the profile stops. Off, nothing of it exists: the task loop has no
check to make. Each thread that runs calls (the main thread; an actor's pool threads)
has its own ``cProfile.Profile`` (line_profiler keeps per-thread state itself),
enabled only for the length of a call and kept across
calls, so its counts add up. A profile only hooks the thread that enabled it, so one
per thread is what keeps a threaded actor's calls apart.

An async actor's calls run on its loop's thread while a pool thread waits for each, so
there the wrapper only counts the call: while the profile runs, the profiler shadows
the runner's ``_cancellable`` too, and :class:`Steps` drives each call's coroutine one
step at a time (from a resumption to the next suspending ``await``), with the loop
thread's cProfile, line_profiler and a tracemalloc reading on for that step only. So
calls interleaved on one loop each count their own steps, and none counts the time it
spent suspended.

A call already running on the main thread when the profile begins is counted from
then on: the handler, which interrupted it, enables that thread's profile at once.

States: *on* (the attribute set, calls counted); *stopping* (the attribute removed by
the SIGUSR2 handler, on the main thread: it also disables the main thread's profile
there, so a ten-minute call in progress still reports what it did so far); *written*
(a short thread waits up to ``DRAIN_S`` for calls in progress on pool threads, then
writes the stats). The stats go to ``sample-w<id>.pstats`` as ``marshal`` of pstats'
own dict, the format of ``pstats.Stats.dump_stats`` (the session directory is 0700 and
the file is this worker's own, so marshal is safe here, and it is what pstats reads);
then ``sample-w<id>.json`` says ``final``, the sampler's handshake with the driver.

What is kept: the wrapper profiles the whole of ``_execute``, so loading arguments and
storing results would show as the worker's own functions. :func:`task_part` keeps the
functions reachable from what ``_execute`` called of the user's (the task function or
method) and removes the calls into them from anywhere else, with their counts and
times, so ``ncalls`` counts the calls the tasks made, and a nested ``lightwork.get``
from a task stays in.
"""

from __future__ import annotations

import _thread
import json
import marshal
import os
import time
from typing import Any

from lightwork.kernel.introspect import LIGHTWORK_DIR as _LIGHTWORK_DIR

STATS_SUFFIX = ".pstats"
DRAIN_S = 1.0
SITE_CALLS = 20  # calls of one task function whose allocation sites are compared
SITE_SHARE = 0.25  # of a function's traced call time its snapshots may take (docstring)
TOP_SITES = 10  # lines kept per task function

#: pstats' key of a function: (file, first line, name).
Key = tuple[str, int, str]



class CallProfiler:
    """One worker's cProfile of its calls for the profile ``token``."""

    def __init__(self, worker: Any, token: str, worker_id: int, path: str,
                 cprofile: bool = True, memory: bool = False,
                 lines: list[Any] | None = None, memray: bool = False) -> None:
        import cProfile

        self._new_profile = cProfile.Profile
        self.cprofile = cprofile
        self.memory = MemoryTracer() if memory else None
        self.lines = LineTimer(worker, lines) if lines else None
        self.capture = None
        if memray:
            from lightwork.engines.local.memray_capture import Capture

            self.capture = Capture(path)
        self.worker = worker
        self.token = token
        self.worker_id = worker_id
        self.path = path  # the sample-w<id>.json handshake file; stats beside it
        self.started = time.time()
        self.ended = 0.0
        self.calls = 0
        self.profiles: dict[int, Any] = {}  # thread ident -> its cProfile.Profile
        self.in_call: set[int] = set()  # idents of the threads inside a profiled call
        self._main = _thread.get_ident()  # the handler builds it on the main thread
        self._lock = _thread.allocate_lock()
        self._original = type(worker)._execute.__get__(worker)
        self._stepping = cprofile or memory or bool(lines)
        self._cancellable: Any = None  # an async actor's AsyncRunner._cancellable

    def start(self) -> None:
        """On the main thread (the SIGUSR2 handler, or ``main`` when it starts)."""
        if self.memory is not None:
            self.memory.start()
        if self.capture is not None:
            self.capture.start()
        self.worker._execute = self._execute
        if self.cprofile and getattr(self.worker._local, "frame", None) is not None:
            # A call runs here now (the handler interrupted it): count it from here on.
            self.profiles[self._main] = profile = self._new_profile()
            profile.enable()

    def _execute(self, frame: tuple[Any, ...], started: float) -> Any:
        ident = _thread.get_ident()
        loop = self.worker.loop  # an async actor's: its calls run on its loop's thread
        with self._lock:
            profile = self.profiles.get(ident) if self.cprofile and loop is None else None
            if profile is None and self.cprofile and loop is None:
                profile = self.profiles[ident] = self._new_profile()
            self.in_call.add(ident)
            self.calls += 1
            if loop is not None and self._stepping and self._cancellable is None:
                self._cancellable = type(loop)._cancellable.__get__(loop)
                loop._cancellable = self._stepped  # (shadows the class's method)
        if self.capture is not None:
            self.capture.labels.add(frame[2])
        if loop is not None:  # this thread only waits: the call's steps on the loop count
            try:
                return self._original(frame, started)
            finally:
                with self._lock:
                    self.in_call.discard(ident)
        memory, lines = self.memory, self.lines
        traced = memory.before(frame[2]) if memory is not None else None
        if lines is not None:
            lines.enable(frame[1])
        if profile is not None:
            profile.enable()
        try:
            return self._original(frame, started)
        finally:
            if profile is not None:
                profile.disable()
            if lines is not None:
                lines.disable()
            if memory is not None and traced is not None:
                memory.after(frame[2], traced)
            with self._lock:
                self.in_call.discard(ident)

    # -- an async actor: a call is the steps of its coroutine on the loop thread --------
    def _stepped(self, coroutine: Any, frame: tuple[Any, ...]) -> Any:
        """``AsyncRunner._cancellable`` while profiling: the same, around :class:`Steps`."""
        assert self._cancellable is not None
        return self._cancellable(Steps(self, coroutine, frame), frame)

    def begin_call(self, frame: tuple[Any, ...]) -> list[Any]:
        """A coroutine's call state: ``[label, kept, peak, snapshot, traced at the step's
        start, seconds its steps ran, the step's start]``."""
        state: list[Any] = [frame[2], 0, 0, None, 0, 0.0, 0.0]
        if self.memory is not None:
            state[3] = self.memory.before(frame[2])[1]
        if self.lines is not None:
            self.lines.resolve(frame[1])
        return state

    def step_on(self, state: list[Any]) -> None:
        if self.memory is not None:
            state[4] = self.memory.step_on()
            state[6] = time.perf_counter()
        if self.lines is not None:
            self.lines.profiler.enable_by_count()
        if self.cprofile:
            ident = _thread.get_ident()
            profile = self.profiles.get(ident)
            if profile is None:
                with self._lock:
                    profile = self.profiles[ident] = self._new_profile()
            profile.enable()

    def step_off(self, state: list[Any]) -> None:
        if self.cprofile:
            self.profiles[_thread.get_ident()].disable()
        if self.lines is not None:
            self.lines.profiler.disable_by_count()
        if self.memory is not None:
            state[5] += time.perf_counter() - state[6]
            kept, peak = self.memory.step_off(state[4])
            state[2] = max(state[2], state[1] + peak)
            state[1] += kept

    def end_call(self, state: list[Any]) -> None:
        if self.memory is not None:
            self.memory.add_call(state[0], state[1], state[2], state[3], state[5])

    def stop(self, write: bool = True) -> None:
        """On the main thread (the SIGUSR2 handler): calls from now on run plain.
        ``write=False``: beside a sampler, whose file carries :meth:`memory_result`."""
        self.worker.__dict__.pop("_execute", None)
        if self._cancellable is not None:
            self.worker.loop.__dict__.pop("_cancellable", None)
        main = self.profiles.get(_thread.get_ident())
        if main is not None:
            main.disable()  # a call in progress here reports what it did so far
        if write:
            _thread.start_new_thread(self._write_when_drained, ())
            return
        if self.memory is not None:
            self.memory.stop()
        if self.capture is not None:
            self.capture.stop()

    def memory_result(self) -> dict[str, Any]:
        return self.memory.result() if self.memory is not None else {}

    def lines_result(self) -> dict[str, Any]:
        return self.lines.result() if self.lines is not None else {}

    def memray_result(self) -> dict[str, Any]:
        return self.capture.result() if self.capture is not None else {}

    def _write_when_drained(self) -> None:
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            with self._lock:
                if not self.in_call - {self._main}:
                    break
            time.sleep(0.005)
        self.ended = time.time()
        memory, lines = self.memory_result(), self.lines_result()
        if self.memory is not None:
            self.memory.stop()
        if self.capture is not None:
            self.capture.stop()  # its file is complete before the handshake says final
        with self._lock:
            done = [p for ident, p in self.profiles.items()
                    if ident == self._main or ident not in self.in_call]
        stats: dict[Key, Any] = {}
        for profile in done:
            profile.snapshot_stats()
            _add(stats, task_part(profile.stats))
        try:
            temporary = f"{self.path}.{os.getpid()}.tmp"
            with open(temporary, "wb") as f:
                marshal.dump(stats, f)
            os.replace(temporary, stats_path(self.path))
            with open(temporary, "w") as f:
                json.dump({"worker_id": self.worker_id, "pid": os.getpid(), "token": self.token,
                           "hz": 0, "samples": self.calls, "started": self.started,
                           "ended": self.ended, "final": True, "counts": [],
                           "mode": "cprofile", "memory": memory, "lines": lines,
                           "memray": self.memray_result()}, f)
            os.replace(temporary, self.path)
        except OSError:
            pass


class Steps:
    """An async actor's call while profiling: its coroutine driven one step at a time,
    each step (from a resumption to the next ``await`` that suspends it) between the
    profiler's ``step_on`` and ``step_off`` on the loop thread, so what other
    coroutines run between its steps is not counted as its own."""

    __slots__ = ("owner", "coroutine", "frame")

    def __init__(self, owner: CallProfiler, coroutine: Any, frame: tuple[Any, ...]) -> None:
        self.owner = owner
        self.coroutine = coroutine
        self.frame = frame

    def close(self) -> None:  # (``_cancellable`` closes a call cancelled before it ran)
        self.coroutine.close()

    def __await__(self) -> Any:
        owner = self.owner
        inner = self.coroutine.__await__()
        state = owner.begin_call(self.frame)
        value: Any = None
        error: BaseException | None = None
        try:
            while True:
                owner.step_on(state)
                try:
                    yielded = inner.send(value) if error is None else inner.throw(error)
                except StopIteration as stop:
                    return stop.value
                finally:
                    owner.step_off(state)
                try:
                    value, error = (yield yielded), None
                except BaseException as exc:  # noqa: BLE001 - the coroutine's to handle
                    value, error = None, exc
        finally:
            owner.end_call(state)


class LineTimer:
    """line_profiler on this worker's functions of the given codes (module docstring)."""

    def __init__(self, worker: Any, targets: list[Any]) -> None:
        from line_profiler import LineProfiler

        self.worker = worker
        self.profiler = LineProfiler()
        self.targets = {tuple(t) for t in targets if not isinstance(t, str)}
        self.names = [_name_target(t) for t in targets if isinstance(t, str)]
        self.found: set[Any] = set()
        self._known = -1  # how many functions the worker had at the last search

    def _resolve(self) -> None:
        import gc
        import types

        known = len(getattr(self.worker, "functions", ()))
        if known == self._known or (not self.names and self.found >= self.targets):
            return
        self._known = known
        functions = [obj for obj in gc.get_objects() if type(obj) is types.FunctionType]
        for obj in functions + _module_functions():
            code = obj.__code__
            key = (code.co_filename, code.co_firstlineno, code.co_name)
            named = self.names and any(_names(obj, *name) for name in self.names)
            if (named or key in self.targets) and id(obj) not in self._added:
                self._added.add(id(obj))
                self.found.add(key)
                self.profiler.add_function(obj)

    _added: set[int]

    def resolve(self, key: Any) -> None:
        """Find the targets among this worker's functions, the task's ``key`` loaded."""
        if not hasattr(self, "_added"):
            self._added = set()
        try:
            if type(key) is bytes:  # load the task's function now: its helpers come with it
                self.worker.function(key)
            self._resolve()
        except Exception:  # noqa: BLE001 - the call itself reports a function that fails
            pass

    def enable(self, key: Any) -> None:
        self.resolve(key)
        self.profiler.enable_by_count()

    def disable(self) -> None:
        self.profiler.disable_by_count()

    def result(self) -> dict[str, Any]:
        stats = self.profiler.get_stats()
        return {"unit": stats.unit,
                "timings": [[file, line, name, [list(t) for t in timings]]
                            for (file, line, name), timings in stats.timings.items()]}


def _module_functions() -> list[Any]:
    """The functions and methods defined at the top of every loaded module: the fork
    server freezes what it imported (``gc.freeze``), and ``gc.get_objects`` leaves
    frozen objects out."""
    import sys
    import types

    found = []
    for module in list(sys.modules.values()):
        try:
            names = vars(module)
        except TypeError:
            continue
        for value in list(names.values()):
            if type(value) is types.FunctionType:
                found.append(value)
            elif isinstance(value, type) and value.__module__ == names.get("__name__"):
                for member in list(vars(value).values()):
                    member = getattr(member, "__func__", member)  # static, class methods
                    if type(member) is types.FunctionType:
                        found.append(member)
    return found


def _name_target(text: str) -> tuple[str, str]:
    """``"parse"``, ``"Loader.load"``, ``"tasks.py:parse"``, ``"pkg.mod:parse"`` ->
    ``(where, qualname)``; ``where`` is empty, a file's name or path, or a module."""
    where, _, qualname = text.rpartition(":")
    return where, qualname


def _names(function: Any, where: str, qualname: str) -> bool:
    """Whether ``function`` is the one named ``where:qualname`` (module docstring)."""
    if function.__qualname__ != qualname:
        return False
    if not where:
        return True
    if where.endswith(".py"):
        file = function.__code__.co_filename
        return file == where or file.endswith(os.sep + where.lstrip(os.sep))
    return bool(function.__module__ == where)


def merge_lines(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Workers' :meth:`LineTimer.result` added up by line (in the first one's unit)."""
    unit = next((r["unit"] for r in results if r), 1e-6)
    merged: dict[Key, dict[int, list[float]]] = {}
    for result in results:
        if not result:
            continue
        scale = result["unit"] / unit
        for file, first, name, timings in result["timings"]:
            by_line = merged.setdefault((file, first, name), {})
            for line, hits, spent in timings:
                into = by_line.setdefault(line, [0, 0.0])
                into[0] += hits
                into[1] += spent * scale
    return {"unit": unit, "timings": [[*key, [[line, hits, spent] for line, (hits, spent)
                                              in sorted(by_line.items())]]
                                      for key, by_line in merged.items()]}


class MemoryTracer:
    """tracemalloc per call, by task function (module docstring)."""

    def __init__(self) -> None:
        import tracemalloc

        self._tm = tracemalloc
        self.started_here = False
        self.functions: dict[str, dict[str, Any]] = {}  # label -> calls, peak, kept, sites
        self._lock = _thread.allocate_lock()

    def start(self) -> None:
        if not self._tm.is_tracing():
            self._tm.start()
            self.started_here = True

    def stop(self) -> None:
        if self.started_here and self._tm.is_tracing():
            self._tm.stop()
            self.started_here = False

    def _entry(self, label: str) -> dict[str, Any]:
        entry = self.functions.get(label)
        if entry is None:
            entry = self.functions[label] = {"calls": 0, "peak": 0, "kept": 0, "sites": {},
                                             "site_calls": 0, "spent": 0.0, "cost": 0.0}
        return entry

    def _compares(self, label: str) -> bool:
        """Whether this call of ``label`` compares snapshots (module docstring)."""
        with self._lock:
            entry = self._entry(label)
            return entry["site_calls"] < SITE_CALLS and (
                entry["site_calls"] == 0 or entry["cost"] <= SITE_SHARE * entry["spent"])

    def before(self, label: str) -> tuple[int, Any, float]:
        """As a call begins: the traced size, its snapshot's lines if this call
        compares them (with what taking them cost), the clock; the peak is reset."""
        tm = self._tm
        if not tm.is_tracing():
            return 0, None, 0.0
        snapshot = None
        if self._compares(label):
            taken = time.perf_counter()
            snapshot = (_by_line(tm.take_snapshot()), time.perf_counter() - taken)
        tm.reset_peak()
        return tm.get_traced_memory()[0], snapshot, time.perf_counter()

    def after(self, label: str, traced: tuple[int, Any, float]) -> None:
        tm = self._tm
        if not tm.is_tracing():
            return
        size, peak = tm.get_traced_memory()
        began, snapshot, started = traced
        self.add_call(label, size - began, peak - began, snapshot,
                      time.perf_counter() - started)

    def step_on(self) -> int:
        """A coroutine step begins: the traced size now, the peak reset."""
        tm = self._tm
        if not tm.is_tracing():
            return 0
        tm.reset_peak()
        return int(tm.get_traced_memory()[0])

    def step_off(self, began: int) -> tuple[int, int]:
        """A coroutine step ends: what it kept and its peak above ``began``."""
        tm = self._tm
        if not tm.is_tracing():
            return 0, 0
        size, peak = tm.get_traced_memory()
        return size - began, peak - began

    def add_call(self, label: str, kept: int, peak: int, snapshot: Any,
                 spent: float) -> None:
        """One call's figures; ``snapshot``: :meth:`before`'s, if this call compares;
        ``spent``: the call's own time, seconds."""
        tm = self._tm
        lines: list[tuple[str, int, int, int]] = []
        cost = 0.0
        if snapshot is not None and tm.is_tracing():
            taken = time.perf_counter()
            began, cost = snapshot
            for (file, line), (size, count) in _by_line(tm.take_snapshot()).items():
                size0, count0 = began.get((file, line), (0, 0))
                if size > size0 and not file.startswith(_LIGHTWORK_DIR) \
                        and file != tm.__file__:
                    lines.append((file, line, size - size0, count - count0))
            cost += time.perf_counter() - taken
        with self._lock:
            entry = self._entry(label)
            entry["calls"] += 1
            entry["peak"] = max(entry["peak"], peak)
            entry["kept"] += kept
            entry["spent"] += spent
            if snapshot is not None:
                entry["site_calls"] += 1
                entry["cost"] += cost
            sites = entry["sites"]
            for file, line, grown, count in lines:
                old = sites.get((file, line), (0, 0))
                sites[(file, line)] = (old[0] + grown, old[1] + count)

    def result(self) -> dict[str, Any]:
        """``{label: {calls, peak, kept, site_calls, sites: [[file, line, bytes, count]]}}``."""
        with self._lock:
            out = {}
            for label, entry in self.functions.items():
                top = sorted(entry["sites"].items(), key=lambda kv: -kv[1][0])[:TOP_SITES]
                out[label] = {"calls": entry["calls"], "peak": entry["peak"],
                              "kept": entry["kept"],
                              "site_calls": entry["site_calls"],
                              "sites": [[f, ln, b, c] for (f, ln), (b, c) in top]}
            return out


def _by_line(snapshot: Any) -> dict[tuple[str, int], tuple[int, int]]:
    """A snapshot's traced bytes and blocks by allocating line, from its raw traces
    (``(domain, size, frames, total frames)`` tuples; the public objects if a
    Python version keeps them otherwise)."""
    lines: dict[tuple[str, int], tuple[int, int]] = {}
    raw = getattr(snapshot.traces, "_traces", None)
    if not isinstance(raw, list):
        for stat in snapshot.statistics("lineno"):
            where = stat.traceback[0]
            lines[(where.filename, where.lineno)] = (stat.size, stat.count)
        return lines
    get = lines.get
    for trace in raw:
        where = trace[2][0]
        size, count = get(where, (0, 0))
        lines[where] = (size + trace[1], count + 1)
    return lines


def merge_memory(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Workers' :meth:`MemoryTracer.result` added up by task function."""
    merged: dict[str, Any] = {}
    for result in results:
        for label, entry in (result or {}).items():
            into = merged.setdefault(label, {"calls": 0, "peak": 0, "kept": 0,
                                             "site_calls": 0, "sites": {}})
            into["calls"] += entry["calls"]
            into["peak"] = max(into["peak"], entry["peak"])
            into["kept"] += entry["kept"]
            into["site_calls"] += entry["site_calls"]
            for file, line, grown, count in entry["sites"]:
                old = into["sites"].get((file, line), (0, 0))
                into["sites"][(file, line)] = (old[0] + grown, old[1] + count)
    for into in merged.values():
        top = sorted(into["sites"].items(), key=lambda kv: -kv[1][0])[:TOP_SITES]
        into["sites"] = [[f, ln, b, c] for (f, ln), (b, c) in top]
    return merged


def stats_path(sample_path: str) -> str:
    return sample_path[: -len(".json")] + STATS_SUFFIX


def _own(key: Key) -> bool:
    return key[0].startswith(_LIGHTWORK_DIR)


def task_part(stats: dict[Key, Any]) -> dict[Key, Any]:
    """The part of one profile the tasks' own code made (module docstring)."""
    from lightwork.engines.local import actor_runners
    from lightwork.engines.local.worker import Worker

    # Where the runtime calls a task's code: Worker._execute (on an async actor's loop,
    # _invoke, which Steps drives).
    entries = {(c.co_filename, c.co_firstlineno, c.co_name) for c in (
        Worker._execute.__code__, actor_runners._invoke.__code__)}
    callees: dict[Key, list[Key]] = {}
    for key, (_cc, _nc, _tt, _ct, callers) in stats.items():
        for caller in callers:
            callees.setdefault(caller, []).append(key)
    # The roots: what the entries called of the user's, and the outermost functions
    # seen in a call that was running when the profile began (no caller recorded).
    kept = {key for key, value in stats.items()
            if not _own(key) and key[0] != "~" and (not value[4] or entries & value[4].keys())}
    pending = list(kept)
    while pending:
        for callee in callees.get(pending.pop(), ()):
            if callee not in kept:
                kept.add(callee)
                pending.append(callee)
    out = {}
    for key in kept:
        cc, nc, tt, ct, callers = stats[key]
        mine = {}
        for caller, counts in callers.items():
            if caller in kept:
                mine[caller] = counts
            else:  # a call from the worker's own code: not the task's
                c_nc, c_cc, c_tt, c_ct = counts
                if caller not in entries:
                    nc, cc, tt, ct = nc - c_nc, cc - c_cc, tt - c_tt, ct - c_ct
        if nc > 0:
            out[key] = (cc, nc, max(0.0, tt), max(0.0, ct), mine)
    return out


def _add(into: dict[Key, Any], stats: dict[Key, Any]) -> None:
    """Add one pstats dict into another, as ``pstats.Stats.add`` does."""
    for key, (cc, nc, tt, ct, callers) in stats.items():
        if key not in into:
            into[key] = (cc, nc, tt, ct, dict(callers))
            continue
        o_cc, o_nc, o_tt, o_ct, o_callers = into[key]
        for caller, counts in callers.items():
            old = o_callers.get(caller)
            o_callers[caller] = counts if old is None else tuple(
                a + b for a, b in zip(old, counts))
        into[key] = (o_cc + cc, o_nc + nc, o_tt + tt, o_ct + ct, o_callers)


def read_stats(sample_path: str) -> dict[Key, Any]:
    """A worker's stats file (empty if it wrote none)."""
    try:
        with open(stats_path(sample_path), "rb") as f:
            stats = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    return stats if isinstance(stats, dict) else {}


def merge(sample_paths: list[str]) -> list[list[Any]]:
    """The workers' stats added up, as JSON-ready rows:
    ``[file, line, name, cc, nc, tt, ct, [[file, line, name, nc, cc, tt, ct], ...]]``."""
    merged: dict[Key, Any] = {}
    for path in sample_paths:
        _add(merged, read_stats(path))
    return [[*key, cc, nc, tt, ct, [[*caller, *counts] for caller, counts in callers.items()]]
            for key, (cc, nc, tt, ct, callers) in merged.items()]
