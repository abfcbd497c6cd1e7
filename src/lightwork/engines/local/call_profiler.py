"""cProfile around every task call of a worker, while a profile in ``cprofile`` mode is on.

The switch and its signal are the sampler's (``sampler.py``): the switch file says
``on <token> <hz> cprofile``, and the worker's SIGUSR2 handler builds a
:class:`CallProfiler` instead of a sampling thread. The driver's side of the merge is
:func:`merge`.

How a call is profiled: the profiler sets an instance attribute ``_execute`` on the
worker, which shadows the class's method (``Worker.execute`` calls ``self._execute``),
and removes it when the profile stops. Off, nothing of it exists: the task loop has no
check to make. Each thread that runs calls (the main thread; an actor's pool threads)
has its own ``cProfile.Profile``, enabled only for the length of a call and kept across
calls, so its counts add up. A profile only hooks the thread that enabled it, so one
per thread is what keeps a threaded actor's calls apart.

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

STATS_SUFFIX = ".pstats"
DRAIN_S = 1.0

#: pstats' key of a function: (file, first line, name).
Key = tuple[str, int, str]

_LIGHTWORK_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIGHTWORK_DIR += os.sep


class CallProfiler:
    """One worker's cProfile of its calls for the profile ``token``."""

    def __init__(self, worker: Any, token: str, worker_id: int, path: str) -> None:
        import cProfile

        self._new_profile = cProfile.Profile
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

    def start(self) -> None:
        """On the main thread (the SIGUSR2 handler, or ``main`` when it starts)."""
        self.worker._execute = self._execute
        if getattr(self.worker._local, "frame", None) is not None:
            # A call runs here now (the handler interrupted it): count it from here on.
            self.profiles[self._main] = profile = self._new_profile()
            profile.enable()

    def _execute(self, frame: tuple[Any, ...], started: float) -> Any:
        ident = _thread.get_ident()
        with self._lock:
            profile = self.profiles.get(ident)
            if profile is None:
                profile = self.profiles[ident] = self._new_profile()
            self.in_call.add(ident)
            self.calls += 1
        profile.enable()
        try:
            return self._original(frame, started)
        finally:
            profile.disable()
            with self._lock:
                self.in_call.discard(ident)

    def stop(self) -> None:
        """On the main thread (the SIGUSR2 handler): calls from now on run plain."""
        self.worker.__dict__.pop("_execute", None)
        main = self.profiles.get(_thread.get_ident())
        if main is not None:
            main.disable()  # a call in progress here reports what it did so far
        _thread.start_new_thread(self._write_when_drained, ())

    def _write_when_drained(self) -> None:
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            with self._lock:
                if not self.in_call - {self._main}:
                    break
            time.sleep(0.005)
        self.ended = time.time()
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
                           "mode": "cprofile"}, f)
            os.replace(temporary, self.path)
        except OSError:
            pass


def stats_path(sample_path: str) -> str:
    return sample_path[: -len(".json")] + STATS_SUFFIX


def _own(key: Key) -> bool:
    return key[0].startswith(_LIGHTWORK_DIR)


def task_part(stats: dict[Key, Any]) -> dict[Key, Any]:
    """The part of one profile the tasks' own code made (module docstring)."""
    from lightwork.engines.local.worker import Worker

    code = Worker._execute.__code__
    execute = (code.co_filename, code.co_firstlineno, code.co_name)
    callees: dict[Key, list[Key]] = {}
    for key, (_cc, _nc, _tt, _ct, callers) in stats.items():
        for caller in callers:
            callees.setdefault(caller, []).append(key)
    # The roots: what _execute called of the user's, and the outermost functions seen
    # in a call that was running when the profile began (no caller recorded).
    kept = {key for key, value in stats.items()
            if not _own(key) and key[0] != "~" and (not value[4] or execute in value[4])}
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
                if caller != execute:
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
