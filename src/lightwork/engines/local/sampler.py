"""Sampling the Python stacks of running tasks, in every worker and in the driver.

    driver (control thread / profile_tasks)            each worker
    ──────────────────────────────────────              ──────────────────────────────
    start: write <session>/sampling "on token hz",      SIGUSR2 handler (main thread):
           SIGUSR2 every ready worker ─────────────────► read the switch file, start or
                                                        stop the sampler thread
    stop:  switch "off token", SIGUSR2 again ──────────► sampler thread ~100 Hz:
           wait for every sample-w<id>.json              sys._current_frames(), keep the
           to say "final" (or its worker to die) ◄───── task threads' stacks, count them;
           merge them with the driver's own counts      rewrite sample-w<id>.json each
                                                        second, and once more at stop

What it owns: the switch file and the per-worker sample files in the session
directory, and one :class:`Sampler` per process while profiling is on. The switch also
names a mode: ``sample`` (this module's sampler) or ``cprofile``, and extras ``memory``,
``memray`` and ``lines``: those wrap each task call instead (``call_profiler.py``,
``memray_capture.py``), through the
same signal, files and merge. Off, nothing of
it runs: no thread, no check on the task loop; a worker only has a signal handler
(installed once in ``main``, like the stack-dump one) and its ``.ready`` marker.

With ``native``, the switch is never turned on: py-spy samples the workers from the
driver instead (``native_sampler.py``), and the driver's own sampler runs as always.

Why a signal and not a frame on the worker's socket: the socket is read by the task
loop between tasks, so a frame would reach a worker running a ten-minute task only
after it. The handler runs on the main thread between two bytecodes, even inside a
long task; it only reads a small file and starts or flags the thread. It starts the
thread with ``_thread.start_new_thread``: ``threading.Thread.start`` takes the
``threading`` module's locks, which the interrupted code may hold. Workers forked while
profiling is on read the switch file when they install the handler, so they join.
The switch is a state, not an event: two signals that merge into one (start and stop
before the handler ran) still leave the worker as the file says, and a worker that
finds "off" for a profile it never sampled writes an empty final file, so the driver
waits only for workers that are truly late (at most ``stop``'s timeout). A signal that
lands while the handler runs makes it read the switch once more, not run nested; and a
running sampler reads the switch itself once a second, so none outlives its profile. A
worker still starting has no handler yet (SIGUSR2's default action kills): the driver
signals only workers whose ``.ready`` marker exists, written after the handler is.

Fairness: the sampler is a Python thread, so it reads stacks only once it holds the
GIL. A task thread running Python code lets go of it after the switch interval (5 ms
by default), or at once when it blocks, and a task's end is such a point (the worker
reads its socket). Sampling on a fixed 10 ms beat with a 5 ms wait would land on the
gap between short tasks for up to half its rounds, and lock in phase with tasks of
10 ms, seeing none of them. So a worker's sampler shortens the switch interval while
it runs (restored at its end: only the sampler ever waits for the GIL in a worker, so
nothing else pays) and spreads its rounds at random within 0.5-1.5 intervals; the
driver keeps its interval, since lightwork's own threads share its GIL.

Labelling: a sample belongs to the call running in its thread. The sampler finds it in
the stack itself, with nothing written on the task loop: the innermost frame of
``Worker._execute`` (sync tasks, and calls on a threaded actor's pool) or of
``AsyncRunner._cancellable`` (a coroutine on an async actor's loop) holds the task's
frame, whose name is the task table's name (``f``, ``Counter.incr``); a pool thread of
an async actor waiting in ``AsyncRunner.run`` for its coroutine is skipped, since the
loop thread's sample is the call's. Only the frames
above it (the user's code and what it calls, less a profile's own ``Steps`` driving an
async call: ``call_profiler.py``) are kept; a thread with no such frame runs no task
and is skipped. Reading ``f_locals`` of that one frame snapshots its locals
into the frame's dict: it may keep the call's arguments alive until ``_execute``
returns (microseconds after its own ``del``), never longer.

A stack is counted, not stored per sample: ``{(label, frames): count}`` with frames as
``"qualname (file:first line)"`` strings, memoised per code object, so the counts' size
follows the number of distinct stacks, not the profile's length. For the timeline, each
round also notes its time and the stacks it counted (a reference to the counted key,
``(monotonic time, key)``), up to ``TIMED_MAX`` of them a process (five minutes of one
task thread at 100 Hz); these go only in the final file, so the once-a-second rewrite
stays the size of the counts. In the driver, the main thread and other user threads
are sampled whole, labelled ``(driver)``; lightwork's own threads are not.
"""

from __future__ import annotations

import _thread
import glob
import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any

from lightwork.engines.local.actor_runners import AsyncRunner
from lightwork.engines.local.call_profiler import Steps
from lightwork.engines.local.task_memory import MemoryProbe
from lightwork.engines.local.worker import Worker

SIGNAL = signal.SIGUSR2
SWITCH_NAME = "sampling"
DEFAULT_HZ = 100.0
FLUSH_EVERY_S = 1.0
DRIVER_LABEL = "(driver)"
# A worker's GIL hand-off to its sampler while profiling (see the module docstring).
SAMPLING_SWITCH_S = 0.0002
TIMED_MAX = 30_000  # timed samples kept a process, for the timeline (module docstring)
# What a profile does in the workers: sample stacks, or cProfile every call
# (call_profiler.py).
SAMPLE = "sample"
CPROFILE = "cprofile"
MODES = (SAMPLE, CPROFILE)


def _switch_path(session_dir: str) -> str:
    return os.path.join(session_dir, SWITCH_NAME)


def _ready_path(session_dir: str, worker_id: int) -> str:
    return os.path.join(session_dir, f"sample-w{worker_id}.ready")


def _sample_path(session_dir: str, worker_id: int) -> str:
    return os.path.join(session_dir, f"sample-w{worker_id}.json")


def _read_switch(session_dir: str) -> tuple[bool, str, float, str, set[str]] | None:
    """``(on, token, hz, mode, extras)`` from the switch file: ``on <token> <hz> [<mode>
    [extras...]]`` or ``off <token>``; the mode is one of ``MODES``, the extras
    ``memory`` (tracemalloc per call), ``memray`` (a memray capture of the worker:
    ``memray_capture.py``) and ``lines`` (line timings of the functions in
    ``sampling-lines.json``: ``call_profiler.py``)."""
    try:
        with open(_switch_path(session_dir)) as f:
            state, token, *rest = f.read().split()
        return (state == "on", token, float(rest[0]) if rest else 0.0,
                rest[1] if len(rest) > 1 else SAMPLE, set(rest[2:]))
    except (OSError, ValueError, IndexError):
        return None


def _lines_path(session_dir: str) -> str:
    return os.path.join(session_dir, SWITCH_NAME + "-lines.json")


def _read_lines(session_dir: str, token: str) -> list[Any]:
    try:
        with open(_lines_path(session_dir)) as f:
            data = json.load(f)
        return list(data["functions"]) if data.get("token") == token else []
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _write_switch(session_dir: str, text: str) -> None:
    temporary = _switch_path(session_dir) + ".tmp"
    with open(temporary, "w") as f:
        f.write(text)
    os.replace(temporary, _switch_path(session_dir))  # a worker never reads half of it


# ---------------------------------------------------------------------------- sampler
class Sampler:
    """One process's sampling thread and its counts (``{(label, frames): n}``)."""

    def __init__(self, token: str, hz: float, worker_id: int, path: str | None,
                 driver: bool = False, calls: Any = None) -> None:
        self.token = token
        self.calls = calls  # a CallProfiler tracing memory per call beside it, or None
        self.interval = 1.0 / hz
        self.hz = hz
        self.worker_id = worker_id
        self.path = path  # where a worker writes its counts; None in the driver
        self.driver = driver
        self.counts: dict[tuple[str, tuple[str, ...]], int] = {}
        self.timed: list[tuple[float, tuple[str, tuple[str, ...]]]] = []  # (time, key)
        self.samples = 0  # sampling rounds taken
        self.cpu = 0.0  # the sampling thread's own CPU time so far, seconds
        self.started = time.time()
        self.ended = 0.0
        self.stopping = False
        self.done = _thread.allocate_lock()
        self.done.acquire()  # released by the thread when its final counts are written
        self._names: dict[Any, str] = {}  # code object -> frame string
        self._thread_id = 0
        # Made here, before a memory profile starts tracing: not a traced call's.
        self._jitter = random.Random(os.getpid()).random

    def start(self) -> None:
        _thread.start_new_thread(self._run, ())

    def stop(self) -> None:
        self.stopping = True

    def _run(self) -> None:
        self._thread_id = _thread.get_ident()
        interval = self.interval
        jitter = self._jitter
        due = time.monotonic()
        flushed = due
        switch_before = sys.getswitchinterval()
        cpu_started = time.thread_time()
        if not self.driver:
            sys.setswitchinterval(min(switch_before, SAMPLING_SWITCH_S))
        try:
            while not self.stopping:
                due += interval * (0.5 + jitter())  # the mean stays 1/hz
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    due = time.monotonic()  # fell behind (a loaded host): do not burst
                self.sample_once()
                if self.path is not None and due - flushed >= FLUSH_EVERY_S:
                    flushed = due
                    if self._untraced():
                        self.cpu = time.thread_time() - cpu_started
                        self.write(final=False)
                    if not self._still_on():
                        break
        finally:
            self.ended = time.time()
            self.cpu = time.thread_time() - cpu_started
            if not self.driver:
                sys.setswitchinterval(switch_before)
            if self.calls is not None:  # (its figures go in this sampler's final file)
                self.calls.stop(write=False)
            if self.path is not None:
                self.write(final=True)
            self.done.release()

    def _untraced(self) -> bool:
        """Whether a rewrite of the counts now is no traced call's: with tracemalloc on
        (``memory=True``), a rewrite during a call would show among the lines where
        the call kept memory (the JSON encoder's), so it waits for a moment with no
        call in progress; a worker whose calls never pause writes at the end only."""
        calls = self.calls
        return calls is None or calls.memory is None or not calls.in_call

    def _still_on(self) -> bool:
        """Whether the switch still names this profile: a sampler whose stop signal was
        lost (its worker was stopped, say) ends within a second of the profile."""
        switch = _read_switch(os.path.dirname(self.path or ""))
        return switch is not None and switch[0] and switch[1] == self.token

    def sample_once(self) -> None:
        self.samples += 1
        me = self._thread_id
        names = threading._active if self.driver else None  # type: ignore[attr-defined]
        counts = self.counts
        timed = self.timed if len(self.timed) < TIMED_MAX else None
        now = time.monotonic()
        for ident, top in sys._current_frames().items():
            if ident == me:
                continue
            if names is not None:
                thread = names.get(ident)
                if thread is not None and thread.name.startswith("lightwork"):
                    continue
                label: str | None = DRIVER_LABEL
                stack = self._whole_stack(top)
            else:
                label, stack = self._task_stack(top)
                if label is None:
                    continue
            key = (label or "", stack)
            counts[key] = counts.get(key, 0) + 1
            if timed is not None:
                timed.append((now, key))
        del top

    def _name(self, code: Any) -> str:
        name = self._names.get(code)
        if name is None:
            filename = code.co_filename
            short = os.path.basename(filename) if not filename.startswith("<") else filename
            qualname = getattr(code, "co_qualname", code.co_name)
            # ';' separates frames in the collapsed format: never inside a name.
            name = f"{qualname} ({short}:{code.co_firstlineno})".replace(";", ",")
            self._names[code] = name
        return name

    def _whole_stack(self, frame: Any) -> tuple[str, ...]:
        frames = []
        while frame is not None:
            frames.append(self._name(frame.f_code))
            frame = frame.f_back
        frames.reverse()
        return tuple(frames)

    def _task_stack(self, frame: Any) -> tuple[str | None, tuple[str, ...]]:
        codes: list[Any] = []
        while frame is not None:
            code = frame.f_code
            if code is _HANDED_TO_LOOP:
                return None, ()  # the loop thread's sample of the coroutine counts it
            if code is _EXECUTE_CODE or code is _COROUTINE_CODE:
                try:
                    call = frame.f_locals.get("frame")
                    label = str(call[2]) if call is not None else None
                except Exception:  # noqa: BLE001 - a frame being torn down: skip the sample
                    label = None
                if label is None or (codes and codes[-1] in _RUNTIME_CODES):
                    return None, ()
                codes.reverse()
                return label, tuple(self._name(c) for c in codes)
            if code is not _STEPS_CODE:
                codes.append(code)
            frame = frame.f_back
        return None, ()

    def result(self, timed: bool = True) -> dict[str, Any]:
        """The counts; ``timed``: with each sample's ``[time, index in counts]``."""
        index = {key: i for i, key in enumerate(self.counts)} if timed else {}
        return {"worker_id": self.worker_id, "pid": os.getpid(), "token": self.token,
                "hz": self.hz, "samples": self.samples, "started": self.started,
                "ended": self.ended or time.time(), "final": bool(self.ended),
                "cpu": round(self.cpu, 6),
                "counts": [[label, list(stack), n] for (label, stack), n in self.counts.items()],
                "timed": [[round(t, 6), index[key]] for t, key in self.timed] if timed else [],
                "memory": self.calls.memory_result() if self.calls is not None else {},
                "lines": self.calls.lines_result() if self.calls is not None else {},
                "memray": self.calls.memray_result() if self.calls is not None else {}}

    def write(self, final: bool) -> None:
        assert self.path is not None
        data = self.result(timed=final)
        data["final"] = final
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w") as f:
                json.dump(data, f)
            os.replace(temporary, self.path)  # the driver never reads half a file
        except OSError:
            pass


# The frames that hold a running call's task frame (see the module docstring).
_EXECUTE_CODE = Worker._execute.__code__
_COROUTINE_CODE = AsyncRunner._cancellable.__code__
# An async actor's pool thread waits here while its coroutine runs on the loop.
_HANDED_TO_LOOP = AsyncRunner.run.__code__
# A profile's driver of an async call's steps (call_profiler.py): no part of the task.
_STEPS_CODE = Steps.__await__.__code__
# The runtime's own work inside _execute that is no part of the task: reading the
# worker's memory around the call. Its reads let go of the GIL, so a waiting sampler
# would land there far more often than its share of the time.
_RUNTIME_CODES = frozenset({MemoryProbe.before.__code__, MemoryProbe.after.__code__})


# ---------------------------------------------------------------------------- workers
_session_dir: str | None = None
_worker_id = 0
_running: Any = None  # this worker's Sampler or CallProfiler while a profile is on


def install(worker_id: int, config: dict[str, Any]) -> None:
    """In a worker's ``main``: the SIGUSR2 handler, its ready marker, and sampling at
    once if a profile is on (a worker forked meanwhile joins it)."""
    global _session_dir, _worker_id
    session_dir = config.get("session_dir")
    if not session_dir:
        return
    _session_dir, _worker_id = session_dir, worker_id
    signal.signal(SIGNAL, _on_signal)
    try:
        open(_ready_path(session_dir, worker_id), "w").close()
    except OSError:
        return
    _follow_switch(signalled=False)


_in_handler = False
_signalled_again = False


def _on_signal(signum: int, frame: Any) -> None:
    """Follow the switch; a signal that lands inside this handler (Python runs it
    nested, between two bytecodes of this one) only asks for one more pass here."""
    global _in_handler, _signalled_again
    if _in_handler:
        _signalled_again = True
        return
    _in_handler = True
    try:
        again = True
        while again:
            _signalled_again = False
            try:
                _follow_switch()
            except Exception:  # noqa: BLE001 - a diagnostics signal must never break a task
                pass
            again = _signalled_again
    finally:
        _in_handler = False


def _follow_switch(signalled: bool = True) -> None:
    """Start or stop this worker's sampler as the switch file says."""
    global _running
    if _session_dir is None:
        return
    switch = _read_switch(_session_dir)
    running = _running
    on, token, hz, mode, extras = switch if switch is not None else (
        False, "", 0.0, SAMPLE, set())
    memory = "memory" in extras
    memray = "memray" in extras
    lines = _read_lines(_session_dir, token) if on and "lines" in extras else None
    if running is not None and not (on and token == running.token):
        running.stop()  # its thread writes the final counts
        _running = None
    elif running is None and token and not on and signalled:
        # Both signals came before the handler ran (they merge), or this worker started
        # after the profile: say "nothing sampled here", so the driver need not wait.
        path = _sample_path(_session_dir, _worker_id)
        if _read_samples(_session_dir, _worker_id, token) is None:
            empty = Sampler(token, 1.0, _worker_id, path)
            empty.ended = empty.started
            empty.write(final=True)
    if on and (running is None or token != running.token):
        path = _sample_path(_session_dir, _worker_id)
        calls = None
        if mode == CPROFILE or memory or lines or memray:
            from lightwork.engines.local import worker as worker_module
            from lightwork.engines.local.call_profiler import CallProfiler

            if worker_module._current_worker is None:
                return  # still starting: main() follows the switch once it is built
            calls = CallProfiler(worker_module._current_worker, token, _worker_id, path,
                                 cprofile=mode == CPROFILE, memory=memory, lines=lines,
                                 memray=memray)
        if mode == CPROFILE:
            _running = calls
        else:
            _running = Sampler(token, hz, _worker_id, path, calls=calls)
            if calls is not None:
                calls.start()
        _running.start()


# ---------------------------------------------------------------------------- driver
class SamplingSession:
    """The driver's side of one profile: the switch, its own sampler, the merge."""

    def __init__(self, node: Any, hz: float, mode: str = SAMPLE, memory: bool = False,
                 lines: list[Any] | None = None, memray: bool = False,
                 native: bool = False) -> None:
        if not 1 <= hz <= 1000:
            raise ValueError(f"the sampling rate must be within 1-1000 Hz, got {hz:g}")
        if mode not in MODES:
            raise ValueError(f"unknown profile mode {mode!r}; choose one of {', '.join(MODES)}")
        self.node = node
        self.hz = hz
        self.mode = mode
        self.memory = memory
        self.memray = memray
        self.wants_native = native
        self.native: Any = None  # a NativeRecorder (native_sampler.py) instead of samplers
        self.lines = [t if isinstance(t, str) else list(t) for t in lines or ()]
        self.session_dir = node.session.directory
        self.token = f"{os.getpid()}-{time.monotonic_ns()}"
        self.driver = Sampler(self.token, hz, 0, None, driver=True)

    def start(self) -> None:
        if self.wants_native:  # py-spy samples the workers; their samplers stay off
            from lightwork.engines.local.native_sampler import NativeRecorder

            self.native = NativeRecorder(self.session_dir, self.hz, _live_workers(self.node),
                                         live=lambda: _live_workers(self.node))
            self.native.start()
            self.driver.start()
            return
        for path in glob.glob(os.path.join(self.session_dir, "sample-w*.json")) + \
                glob.glob(os.path.join(self.session_dir, "sample-w*.pstats")) + \
                glob.glob(os.path.join(self.session_dir, "sample-w*.memray")):
            try:
                os.unlink(path)  # a previous profile's: never merged into this one
            except OSError:
                pass
        if self.lines:
            with open(_lines_path(self.session_dir), "w") as f:
                json.dump({"token": self.token, "functions": self.lines}, f)
        _write_switch(self.session_dir, f"on {self.token} {self.hz:g} {self.mode}"
                      + " memory" * self.memory + " lines" * bool(self.lines)
                      + " memray" * self.memray)
        if self.mode == SAMPLE:  # (cProfile mode profiles task calls: none run here)
            self.driver.start()
        _signal_workers(self.node, self.session_dir)

    def stop(self, timeout: float = 2.0) -> dict[str, Any]:
        """End the profile everywhere; the merged samples (``Profile``'s input)."""
        if self.native is not None:
            return self._stop_native()
        _write_switch(self.session_dir, f"off {self.token}")
        self.driver.stop()
        signalled = _signal_workers(self.node, self.session_dir)
        if self.mode == SAMPLE:
            self.driver.done.acquire(timeout=1.0)
        else:
            self.driver.ended = time.time()
        deadline = time.monotonic() + timeout
        results: dict[int, dict[str, Any]] = {}
        while True:
            for worker_id in _sampled_workers(self.session_dir):
                data = _read_samples(self.session_dir, worker_id, self.token)
                if data is not None:
                    results[worker_id] = data
            waiting = [w for w, pid in signalled.items()
                       if not (w in results and results[w]["final"]) and _alive(pid)]
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        workers = [self.driver.result()] + [results[w] for w in sorted(results)]
        out = {"hz": self.hz, "mode": self.mode, "memory": self.memory,
               "started": self.driver.started,
               "ended": self.driver.ended, "processes": workers,
               "missing": sorted(set(signalled) - {w for w in results if results[w]["final"]})}
        if self.mode == CPROFILE or self.memory:
            from lightwork.engines.local import call_profiler

            if self.mode == CPROFILE:
                out["stats"] = call_profiler.merge(
                    [_sample_path(self.session_dir, w) for w in sorted(results)])
            if self.memory:
                out["allocations"] = call_profiler.merge_memory(
                    [results[w].get("memory") or {} for w in sorted(results)])
        if self.memray:
            from lightwork.engines.local import memray_capture

            out["memray"] = memray_capture.merge(
                [(w, results[w].get("memray") or {}) for w in sorted(results)])
        if self.lines:
            from lightwork.engines.local import call_profiler

            out["lines"] = call_profiler.merge_lines(
                [results[w].get("lines") or {} for w in sorted(results)])
        return out


    def _stop_native(self) -> dict[str, Any]:
        from lightwork.kernel import views

        self.driver.stop()
        self.driver.done.acquire(timeout=1.0)
        labels: dict[int, set[str]] = {}
        for row in views.task_rows(self.node):  # which task functions ran on which worker
            if row["worker_id"] in self.native.workers:
                labels.setdefault(row["worker_id"], set()).add(row["name"])
        workers = self.native.stop(labels)
        return {"hz": self.hz, "mode": self.mode, "memory": False, "native": True,
                "started": self.driver.started, "ended": self.driver.ended,
                "processes": [self.driver.result()] + workers,
                "missing": [w["worker_id"] for w in workers if w["error"]]}


def _live_workers(node: Any) -> dict[int, int]:
    with node.lock:
        return {conn.worker_id: conn.pid for conn in node.workers.values()
                if conn.pid and not conn.dead and not conn.eof_at}


def _signal_workers(node: Any, session_dir: str) -> dict[int, int]:
    """SIGUSR2 to every live worker whose handler is installed; {worker_id: pid}."""
    with node.lock:
        targets = [(conn.worker_id, conn.pid) for conn in node.workers.values()
                   if conn.pid and not conn.dead and not conn.eof_at]
    signalled = {}
    for worker_id, pid in targets:
        if not os.path.exists(_ready_path(session_dir, worker_id)):
            continue  # still starting: it reads the switch itself once ready
        try:
            os.kill(pid, SIGNAL)
        except ProcessLookupError:
            continue
        signalled[worker_id] = pid
    return signalled


def _sampled_workers(session_dir: str) -> list[int]:
    ids = []
    for path in glob.glob(os.path.join(session_dir, "sample-w*.json")):
        try:
            ids.append(int(os.path.basename(path)[len("sample-w"):-len(".json")]))
        except ValueError:
            continue
    return ids


def _read_samples(session_dir: str, worker_id: int, token: str) -> dict[str, Any] | None:
    try:
        with open(_sample_path(session_dir, worker_id)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("token") == token else None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        return True


def start(node: Any, hz: float = DEFAULT_HZ, mode: str = SAMPLE, memory: bool = False,
          lines: list[Any] | None = None, memray: bool = False,
          native: bool = False) -> dict[str, Any]:
    """Start a profile of the node's tasks (ValueError if one is already on)."""
    with node.lock:
        if getattr(node, "sampling", None) is not None:
            raise ValueError("a task profile is already running in this session "
                             "(profile_tasks() or `lightwork profile`); stop it first, or "
                             "wait for it to end")
        node.sampling = session = SamplingSession(node, hz, mode, memory, lines, memray,
                                                  native)
    try:
        session.start()
    except BaseException:
        node.sampling = None
        raise
    return {"token": session.token, "hz": hz}


def stop(node: Any, timeout: float = 2.0) -> dict[str, Any]:
    """Stop the running profile; its samples from every process (ValueError if none)."""
    with node.lock:
        session = getattr(node, "sampling", None)
        node.sampling = None
    if session is None:
        raise ValueError("no task profile is running in this session; start one with "
                         "lightwork.profile_tasks() or `lightwork profile --seconds N`")
    return session.stop(timeout)
