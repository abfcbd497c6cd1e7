"""Stuck calls: a task or actor call running far longer than it should, doing nothing.

The advisor's look hands :class:`StuckWatch` the calls running now (``running``: the
record, its worker's id and pid, whether the worker is itself blocked in a nested
get/wait). A call is a *candidate* once it has run longer than its threshold:

* with a history (at least ``HISTORY_MIN_RUNS`` ended runs of the same function or
  method), ``STUCK_RATIO`` times the longest of them, and at least the smaller of
  ``STUCK_MIN_S`` and the user's threshold;
* without one, the user's threshold: ``LIGHTWORK_STUCK_AFTER_S`` (seconds; default
  ``STUCK_AFTER_S``), read when the advisor is made.

A candidate is *stuck* when its worker used (next to) no CPU over at least
``IDLE_WINDOW_S`` between looks (``/proc/<pid>/stat``: waiting on a socket, a lock, a
sleep), or when the driver's main thread is blocked in ``get``/``wait`` meanwhile
(a call far past its own history that the driver waits for is stuck for the program,
even spinning; with no history, only an idle worker counts: long work is not stuck). A call whose
worker is itself blocked in a nested ``get``/``wait`` is not a candidate: it waits for
another call, which is the one to name (it is watched too).

The finding names where the call is, from the same faulthandler dump ``lightwork
stack`` shows (one worker signalled, off the hot path, once per stuck call): the
innermost frame, and the user's own innermost frame when the innermost is the
standard library's. Its cost is how long the call has run, kept current at each look.

Off Linux there is no ``/proc``: only the driver-blocked half applies.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import time
from typing import Any

from lightwork.kernel.control import STACK_SIGNAL, stack_file_path
from lightwork.kernel.events import TaskRecord
from lightwork.kernel.introspect import LIGHTWORK_DIR

STUCK_AFTER_S = 300.0  # no history: a call running this long is a candidate
STUCK_MIN_S = 10.0  # with a history: never sooner than this (or the user's threshold)
STUCK_RATIO = 20.0  # ... nor sooner than this many times its longest earlier run
HISTORY_MIN_RUNS = 3
IDLE_WINDOW_S = 1.0  # the worker's CPU is compared over at least this long
IDLE_CPU_SHARE = 0.02  # at most this share of a core over that window: no CPU used
STACK_TIMEOUT_S = 2.0

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PACKAGE_DIR = LIGHTWORK_DIR.rstrip(os.sep)  # (kernel.introspect's)
_STDLIB_DIR = os.path.dirname(os.path.abspath(threading.__file__))


def stuck_after_from_env() -> float:
    """``LIGHTWORK_STUCK_AFTER_S``, or ``STUCK_AFTER_S`` when unset or not a number > 0."""
    try:
        value = float(os.environ.get("LIGHTWORK_STUCK_AFTER_S", ""))
    except ValueError:
        return STUCK_AFTER_S
    return value if value > 0 else STUCK_AFTER_S


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` so far, or None (gone, not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def driver_blocked_in_get() -> str | None:
    """Where the driver's main thread waits in ``get``/``wait`` ("file:line"), or None."""
    main = threading.main_thread().ident
    frame: Any = sys._current_frames().get(main) if main is not None else None
    user: Any = None
    inside = False
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(_PACKAGE_DIR + os.sep):
            if code.co_name in ("get", "wait") and os.sep + "api" + os.sep in code.co_filename:
                inside = True
        elif inside and user is None:
            user = frame
        frame = frame.f_back
    if not inside:
        return None
    return f"{user.f_code.co_filename}:{user.f_lineno}" if user is not None else "?"


def worker_stack(session_dir: str, worker_id: int, pid: int,
                 timeout: float = STACK_TIMEOUT_S) -> list[dict[str, Any]]:
    """The threads of one worker's faulthandler dump (as ``lightwork stack`` reads them),
    or [] when it gave none within ``timeout``."""
    from lightwork.diagnostics.stack import parse_faulthandler

    path = stack_file_path(session_dir, worker_id)
    try:
        offset = os.path.getsize(path)
        os.kill(pid, STACK_SIGNAL)
    except OSError:
        return []
    deadline = time.monotonic() + timeout
    last, stable = offset, 0
    while time.monotonic() < deadline:
        time.sleep(0.01)
        try:
            size = os.path.getsize(path)
        except OSError:
            return []
        if size > offset and size == last:
            stable += 1
            if stable >= 3:
                break
        else:
            last, stable = size, 0
    try:
        with open(path, "rb") as dump:
            dump.seek(offset)
            text = dump.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return []
    return parse_faulthandler(text)


def _own(filename: str) -> bool:
    """A frame of the user's code (not lightwork's, nor the standard library's)."""
    return not (filename.startswith(_PACKAGE_DIR + os.sep) or filename == "<string>"
                or filename.startswith(_STDLIB_DIR + os.sep))


def where_waiting(threads: list[dict[str, Any]], function: str) -> dict[str, Any] | None:
    """Where a worker's thread running ``function`` is now: the innermost frame and the
    user's innermost one (from ``worker_stack``), or None without such a thread."""
    short = function.rsplit(".", 1)[-1]
    best: list[Any] | None = None
    for thread in threads:
        frames = thread.get("frames") or []
        if any(frame[2] == short for frame in frames):
            best = frames
            break
        if best is None and any(_own(frame[0]) for frame in frames):
            best = frames
    if not best:
        return None
    innermost = best[-1]
    user = next((frame for frame in reversed(best) if _own(frame[0])), None)
    return {"innermost": list(innermost), "user": list(user) if user else None}


def describe(where: dict[str, Any] | None) -> str:
    """"waiting in `data = sock.recv(4096)` in fetch() at etl.py:42", from ``where_waiting``."""
    if where is None:
        return "(its stack could not be read)"
    inner = where["innermost"]
    user = where["user"]
    if user is not None and user == inner:
        source = linecache.getline(user[0], int(user[1])).strip()
        doing = f"`{source}` " if source else ""
        return f"waiting in {doing}in {user[2]}() at {_short(user[0])}:{user[1]}"
    text = f"waiting in {inner[2]}() at {_short(inner[0])}:{inner[1]}"
    if user is not None:
        text += f", called from {user[2]}() at {_short(user[0])}:{user[1]}"
    return text


def _short(path: str) -> str:
    return os.path.basename(path)


class StuckWatch:
    """Per running call: when it became a candidate, and its worker's CPU then."""

    def __init__(self) -> None:
        self.stuck_after_s = stuck_after_from_env()
        self._samples: dict[int, tuple[float, float]] = {}  # task id -> (time, cpu s)

    def threshold(self, runs: int, longest: float) -> tuple[float, float | None]:
        """(seconds after which a call is a candidate, its longest earlier run or None),
        from its function's ``runs`` ended runs, the ``longest`` of them."""
        if runs < HISTORY_MIN_RUNS:
            return self.stuck_after_s, None
        return max(min(self.stuck_after_s, STUCK_MIN_S), STUCK_RATIO * longest), longest

    def stuck(self, now: float, running: list[tuple[TaskRecord, int, int, bool]],
              driver_waits: Any, history: Any) -> list[
                  tuple[TaskRecord, int, int, float, str, float | None]]:
        """The calls of ``running`` found stuck at this look: (record, worker id, pid,
        seconds running, why, longest earlier run). ``driver_waits()`` says where the
        driver blocks, ``history(name)`` (runs, longest run) a function's ended runs;
        both are asked only for a call that has run long enough to need them, so the
        records cost this nothing as they end."""
        found = []
        live: set[int] = set()
        blocked: Any = False  # not asked yet
        soonest = min(self.stuck_after_s, STUCK_MIN_S)  # no threshold is lower
        for record, worker_id, pid, nested in running:
            live.add(record.task_id)
            since = record.started or record.dispatched or record.submitted
            ran = now - since
            if nested or ran < soonest:
                continue
            limit, longest = self.threshold(*history(record.name))
            if ran < limit:
                continue
            cpu = process_cpu_s(pid) if pid else None
            sample = self._samples.get(record.task_id)
            if sample is None or cpu is None or cpu < sample[1]:
                if cpu is not None:
                    self._samples[record.task_id] = (now, cpu)
            elif now - sample[0] >= IDLE_WINDOW_S:
                if cpu - sample[1] <= IDLE_CPU_SHARE * (now - sample[0]):
                    found.append((record, worker_id, pid, ran,
                                  f"its worker used no CPU for the last {now - sample[0]:.1f} s",
                                  longest))
                    continue
                self._samples[record.task_id] = (now, cpu)  # it works: look again later
            if longest is None:
                continue  # a long run with no history may be long work: CPU says idle
            if blocked is False:
                blocked = driver_waits()
            if blocked is not None:
                found.append((record, worker_id, pid, ran,
                              f"the driver is blocked in get/wait at {blocked}", longest))
        for task_id in [t for t in self._samples if t not in live]:
            del self._samples[task_id]
        return found


def stuck_elsewhere(watch: StuckWatch, node: Any, history: Any, driver_waits: Any) -> list[
        tuple[TaskRecord, float, str, float | None, dict[str, Any] | None]]:
    """The cluster's half of :meth:`StuckWatch.stuck`: the tasks running on workers
    elsewhere (``node.executing_calls()``, each with its stack and its thread's CPU) that
    are candidates by the same thresholds, then stuck by the same evidence, their
    thread's CPU compared over ``IDLE_WINDOW_S`` (a second look after that long: asked
    only when a candidate runs), or the driver blocked on them. (record, seconds running,
    why, longest earlier run, where it waits)."""
    calls = node.executing_calls()
    soonest = min(watch.stuck_after_s, STUCK_MIN_S)
    candidates = {}
    for call in calls or ():
        if call.running_s < soonest:
            continue
        limit, longest = watch.threshold(*history(call.record.name))
        if call.running_s >= limit:
            candidates[call.record.task_id] = (call, longest)
    if not candidates:
        return []
    time.sleep(IDLE_WINDOW_S)
    again = {call.record.task_id: call for call in node.executing_calls() or ()}
    found = []
    blocked: Any = False  # not asked yet
    for task_id, (call, longest) in candidates.items():
        later = again.get(task_id)
        if later is None:
            continue  # it ended meanwhile
        window = later.running_s - call.running_s
        if (call.cpu_s is not None and later.cpu_s is not None and window > 0
                and later.cpu_s - call.cpu_s <= IDLE_CPU_SHARE * window):
            why = f"its thread on worker {later.address} used no CPU for the last {window:.1f} s"
        elif longest is not None:
            if blocked is False:
                blocked = driver_waits()
            if blocked is None:
                continue
            why = f"the driver is blocked in get/wait at {blocked}"
        else:
            continue  # a long run with no history may be long work
        where = where_waiting([{"frames": later.frames}], later.record.name)
        found.append((later.record, later.running_s, why, longest, where))
    return found
