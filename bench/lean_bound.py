"""The lean bound: what a batch of tasks costs a pure-Python runtime that keeps only the
essentials (issue 13).

Issue 13 allows a compiled extension only if a profile shows that pure Python cannot
reach its targets. ``floor.py`` is the transport alone, one message at a time; this is
the next question: a runtime that batches its frames, as lightwork does, and keeps the
per-task state lightwork keeps, written as lean as it can be. Not a runtime (no errors,
no retries, no resources, no store): a measuring instrument, run like ``floor.py``.

* ``lean_bare_per_task_us``: a driver's main thread submits 10,000 no-op tasks into a
  queue; an I/O thread sends them to 4 worker processes over socketpairs, up to 128
  tasks a frame and 64 in flight per worker, and reads their results, a frame per batch
  the worker ran; ``get`` waits for all of them. Per task, best of a few runs.
* ``lean_kept_per_task_us``: the same, plus what lightwork keeps for every task: a ref
  counted by its ``__del__``, a record with the task's times (submitted, dispatched,
  started, finished, seen) kept in a ring as an event log does, a table entry for its
  result that a ``get`` registers a countdown on, the arguments pickled at submission
  and the spec in the worker's in-flight queue; the worker times each call.

Measured 2026-11-25 (2-core machine, session 15; the floor in the same minutes,
pipelined 4.4-6.3 µs as the host's load moved): bare 3.2-4.8 µs a task, kept 4.5-6.6
µs, lightwork's ``async_per_task_us`` 14.8-20 µs. So the batch target (2x the
pipelined floor) is within pure Python's reach: what lightwork spends above the kept
figure is its own code per task. Counted with ``sys.setprofile`` (calls of Python and
C functions alike, per task): the lean driver makes 23 (15 in the submitting thread, 8
in the I/O thread) and its worker 6; lightwork's driver ~80 (38 and 44) and a worker
51, each a general path (resources, dependencies, retries, cancellation, the store,
streams) taken by every task. See ``HOTPATH.md``.

``python bench/lean_bound.py`` prints both figures and the floor.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import floor  # noqa: E402

HEADER = floor.HEADER  # the floor's frames: a length, then a pickle (floor.send)
WORKERS = 4
FRAME_TASKS = 128
IN_FLIGHT = 64
TASKS = 10_000


class _Frames:
    """Whole frames out of a socket's byte stream."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def read(self) -> list[Any] | None:
        """The frames that are complete after one read; None at the end of the stream."""
        chunk = self.sock.recv(1 << 18)
        if not chunk:
            return None
        self.buffer += chunk
        frames = []
        while len(self.buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < HEADER.size + size:
                break
            frames.append(pickle.loads(self.buffer[HEADER.size:HEADER.size + size]))
            self.buffer = self.buffer[HEADER.size + size:]
        return frames


def _worker(sock: socket.socket, timed: bool) -> None:
    """A worker process: run each frame's tasks, answer with one frame of results."""
    frames = _Frames(sock)
    functions: dict[int, Any] = {}
    while True:
        got = frames.read()
        if got is None:
            os._exit(0)
        for frame in got:
            if frame[0] == "function":
                functions[frame[1]] = pickle.loads(frame[2])
                continue
            results = []
            for task_id, key, args in frame[1]:
                started = time.monotonic() if timed else 0.0
                positional, named = pickle.loads(args)
                value = pickle.dumps(functions[key](*positional, **named))
                results.append((task_id, value, (started, time.monotonic()) if timed else None))
            floor.send(sock, results)


class _Ref:
    __slots__ = ("id",)

    def __init__(self, object_id: int) -> None:
        self.id = object_id

    def __del__(self) -> None:
        _released.append(self.id)


_released: deque[int] = deque()


class _Record:
    __slots__ = ("task_id", "name", "submitted", "dispatched", "started", "finished", "seen",
                 "worker", "state", "arg_size", "result_size", "callsite")

    def __init__(self, task_id: int, name: str, submitted: float, arg_size: int,
                 callsite: Any) -> None:
        self.task_id, self.name, self.submitted = task_id, name, submitted
        self.dispatched = self.started = self.finished = self.seen = 0.0
        self.worker, self.state, self.arg_size, self.result_size = -1, "PENDING", arg_size, 0
        self.callsite = callsite


class _Entry:
    __slots__ = ("ready", "value", "waiters")

    def __init__(self) -> None:
        self.ready, self.value, self.waiters = False, None, None


class _Spec:
    __slots__ = ("task_id", "key", "args", "result_id", "record")

    def __init__(self, task_id: int, key: int, args: bytes, result_id: int,
                 record: _Record | None) -> None:
        self.task_id, self.key, self.args = task_id, key, args
        self.result_id, self.record = result_id, record


class LeanRuntime:
    """``kept``: with the per-task bookkeeping (see the module docstring)."""

    def __init__(self, kept: bool) -> None:
        self.kept = kept
        self.socks: list[socket.socket] = []
        self.pids: list[int] = []
        for _ in range(WORKERS):
            parent, child = socket.socketpair()
            pid = os.fork()
            if pid == 0:
                parent.close()
                _worker(child, kept)
            child.close()
            self.socks.append(parent)
            self.pids.append(pid)
        self.lock = threading.Lock()
        self.queue: deque[_Spec] = deque()
        self.in_flight: list[deque[_Spec]] = [deque() for _ in range(WORKERS)]
        self.entries: dict[int, _Entry] = {}
        self.ring: deque[_Record] = deque(maxlen=100_000)
        self.next_id = 0
        self.wake_r, self.wake_w = os.pipe()
        self.closing = False
        self.thread = threading.Thread(target=self._io, daemon=True)
        self.thread.start()

    def register(self, key: int, function: Any) -> None:
        for sock in self.socks:
            floor.send(sock, ("function", key, pickle.dumps(function)))

    def submit(self, key: int, args: tuple, kwargs: dict) -> _Ref:
        task_id, result_id = self.next_id, self.next_id + 1
        self.next_id += 2
        data = pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        record = None
        if self.kept:
            caller = sys._getframe(1)
            record = _Record(task_id, "noop", time.monotonic(), len(data),
                             (caller.f_code.co_filename, caller.f_lineno))
        with self.lock:
            self.entries[result_id] = _Entry()
            self.queue.append(_Spec(task_id, key, data, result_id, record))
            first = len(self.queue) == 1
        if first:  # the I/O thread may sleep in its poll: wake it
            os.write(self.wake_w, b"x")
        return _Ref(result_id)

    def get(self, refs: list[_Ref]) -> list[Any]:
        done = threading.Event()
        left = [0]

        def hit() -> None:
            left[0] -= 1
            if left[0] == 0:
                done.set()

        with self.lock:
            entries = [self.entries[ref.id] for ref in refs]
            for entry in entries:
                if not entry.ready:
                    left[0] += 1
                    entry.waiters = [hit] if entry.waiters is None else [*entry.waiters, hit]
            pending = left[0]
        if pending:
            done.wait()
        return [pickle.loads(entry.value) for entry in entries]

    def _io(self) -> None:
        poller = select.epoll()
        readers = {sock.fileno(): (index, _Frames(sock)) for index, sock in enumerate(self.socks)}
        for fd in readers:
            poller.register(fd, select.EPOLLIN)
        poller.register(self.wake_r, select.EPOLLIN)
        while not self.closing:
            with self.lock:
                self._dispatch()
            for fd, _ in poller.poll(0.01):
                if fd == self.wake_r:
                    os.read(self.wake_r, 4096)
                    continue
                index, frames = readers[fd]
                got = frames.read()
                if got is None:
                    return
                with self.lock:
                    for results in got:
                        self._apply(index, results)

    def _dispatch(self) -> None:
        for index, sock in enumerate(self.socks):
            in_flight = self.in_flight[index]
            if len(in_flight) >= IN_FLIGHT or not self.queue:
                continue
            now = time.monotonic()
            batch = []
            while self.queue and len(batch) < FRAME_TASKS:
                spec = self.queue.popleft()
                if spec.record is not None:
                    spec.record.dispatched, spec.record.worker = now, index
                in_flight.append(spec)
                batch.append((spec.task_id, spec.key, spec.args))
            floor.send(sock, ("tasks", batch))

    def _apply(self, index: int, results: list[Any]) -> None:
        now = time.monotonic()
        in_flight = self.in_flight[index]
        for _task_id, value, times in results:
            spec = in_flight.popleft()
            record = spec.record
            if record is not None:
                record.started, record.finished = times
                record.seen, record.state, record.result_size = now, "FINISHED", len(value)
                self.ring.append(record)
            entry = self.entries[spec.result_id]
            entry.value, entry.ready = value, True
            if entry.waiters:
                for waiter in entry.waiters:
                    waiter()
                entry.waiters = None
        while _released:
            self.entries.pop(_released.popleft(), None)

    def close(self) -> None:
        self.closing = True
        for sock in self.socks:
            sock.close()
        for pid in self.pids:
            os.waitpid(pid, 0)


def _noop() -> None:
    return None


def per_task_us(kept: bool, tasks: int = TASKS, runs: int = 5) -> float:
    runtime = LeanRuntime(kept)
    try:
        runtime.register(1, _noop)
        runtime.get([runtime.submit(1, (), {}) for _ in range(2_000)])  # warm up
        best = float("inf")
        for _ in range(runs):
            start = time.perf_counter()
            runtime.get([runtime.submit(1, (), {}) for _ in range(tasks)])
            best = min(best, time.perf_counter() - start)
        return best / tasks * 1e6
    finally:
        runtime.close()


def measure() -> dict[str, float]:
    return {"lean_bare_per_task_us": per_task_us(kept=False),
            "lean_kept_per_task_us": per_task_us(kept=True)}


if __name__ == "__main__":
    figures = {**floor.measure(), **measure()}
    for name, value in figures.items():
        print(f"{name}: {value:.2f}")
