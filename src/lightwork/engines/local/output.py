"""Worker output on the driver's terminal, labelled, in order, and kept per task.

Data flow::

    task thread: print() / logging / sys.stderr.write()
        -> sys.stdout, sys.stderr = CapturedStream (one per stream, in each worker)
        -> OutputCapture.lines   [(stream, task_id, name, text)], under OutputCapture.lock
        -> worker.outbox: one (OUTPUT, lines) message, sent with the next frame
    driver (node lock held): WorkerRequests._handle(OUTPUT)
        -> DriverOutput.receive: the line kept in its task's bounded log (``lightwork
           logs``), and "(name pid=N) text" queued for the writer thread
    writer thread (no lock of the node's): the driver's stdout or stderr

Worker side. :func:`install` replaces ``sys.stdout`` and ``sys.stderr`` (and retargets
``logging`` stream handlers that point at the original streams, such as one a forked
driver's ``basicConfig`` made), so every line a call writes through Python is captured
with the call it came from (``Worker.current``: the task thread's, or an async actor's
coroutine's; a write from a thread of the user's own gets the last call's label). Both
streams share one list, so the order of a worker's lines across stdout and stderr is
the order they were written. Whole lines are cut at ``\\n``; a partial line waits for
its end, for a write from another call, or for the end of its call (``end_call``: a
partial line is never glued to the next call's). Lines leave the worker
  * with the frame that carries the call's result: ``Worker.execute`` calls
    ``end_call`` when ``output_pending`` is set (one attribute test per call: a call
    that prints nothing costs nothing more), which moves them into the outbox, so the
    driver prints them before the caller's ``get`` returns;
  * or, while a long call runs, from the flush thread (started at the first write),
    ``FLUSH_AFTER_S`` after the first line the last send did not carry;
  * or at once, from the writing thread, when ``MAX_PENDING_BYTES`` wait (a call that
    prints fast is slowed to the socket's pace, never buffered without bound).
At most one message per batch, so forwarding costs less than a frame per line.

Writes of the process itself outside Python's streams (``os.write(1, ...)``, a C
library's ``printf``, a subprocess) are not captured: they reach the driver's terminal
unlabelled, as they did before. faulthandler's stacks still go to the real stderr.

Driver side. :class:`DriverOutput` is owned by the node: ``receive`` runs with the node
lock held (in whichever thread read the worker's socket), and queries read it under
its own lock. It keeps the last ``LINES_PER_TASK`` lines of the last ``TASKS_KEPT``
calls that printed, at most ``BYTES_KEPT`` characters in all. With ``echo`` False
(``init(log_to_driver=False)``) the lines are kept but not printed.

Printing. ``receive`` never writes to the terminal: a terminal that is slow, paused
(Ctrl-S, a pager) or a pipe nobody reads would stall the runtime behind the node lock.
It queues the labelled lines for one writer thread (``lightwork-output-writer``,
started at the first line), which prints them in the order they came, so each worker's
lines keep their order, and stderr is flushed behind the stdout written before it.
The caller's ``get`` and ``wait`` call :meth:`DriverOutput.settle` before they return:
it waits, up to ``SETTLE_S``, until the lines received so far are printed, so a call's
lines still show before its result (one comparison of two counters when all is
printed). A terminal that does not keep up is waited for once, then not again until it
has caught up; past ``MAX_QUEUED_CHARS`` waiting, lines are dropped from the terminal
(not from their call's log) and their count is said when it drains.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, TextIO

from lightwork.engines.local import protocol as p

if TYPE_CHECKING:
    from lightwork.engines.local.worker import Worker

FLUSH_AFTER_S = 0.02
MAX_PENDING_BYTES = 1 << 16
#: A line longer than this is cut: one print of a huge string stays bounded.
MAX_LINE = 1 << 16
STDOUT = 1
STDERR = 2
LINES_PER_TASK = 1000
TASKS_KEPT = 2000
#: Characters of kept lines, all calls together: the oldest calls go first beyond it.
BYTES_KEPT = 32 << 20
#: Characters waiting for the terminal, at most: a terminal that stopped reading costs
#: this much memory, and the lines beyond it are only kept (``lightwork logs``).
MAX_QUEUED_CHARS = 8 << 20
#: How long a ``get`` waits for the lines that came before its results to be printed.
SETTLE_S = 1.0


# ----------------------------------------------------------------------- worker side
class OutputCapture:
    """A worker's captured output not yet handed to the outbox (see the module doc)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.lock = threading.Lock()
        self.lines: list[tuple[int, int, str, str]] = []
        self.pending_bytes = 0
        # stream -> (task_id, name, text so far) of a line not yet ended
        self.partial: dict[int, tuple[int, str, str]] = {}
        self.last: tuple[int, str] = (0, worker.actor_name or "worker")
        self._wake: threading.Event | None = None

    def _caller(self) -> tuple[int, str]:
        frame = self.worker.current
        if frame is not None:
            self.last = (frame[0], frame[2])
        return self.last

    def write(self, stream: int, text: str) -> None:
        if not text:
            return
        task_id, name = self._caller()
        with self.lock:
            held = self.partial.pop(stream, None)
            if held is not None:
                if held[0] == task_id:
                    text = held[2] + text
                else:  # another call's unfinished line ends here
                    self._add(stream, held[0], held[1], held[2])
            *whole, rest = text.split("\n")
            for line in whole:
                self._add(stream, task_id, name, line)
            while len(rest) > MAX_LINE:
                self._add(stream, task_id, name, rest[:MAX_LINE])
                rest = rest[MAX_LINE:]
            if rest:
                self.partial[stream] = (task_id, name, rest)
            too_much = self.pending_bytes > MAX_PENDING_BYTES
        self.worker.output_pending = True
        if too_much and not self.worker._send_lock.locked():
            self.send_now()
        elif self.lines:
            self._wake_flusher()

    def _add(self, stream: int, task_id: int, name: str, line: str) -> None:
        """One whole line (caller holds ``lock``)."""
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE] + " …[cut]"
        self.lines.append((stream, task_id, name, line))
        self.pending_bytes += len(line)

    def take(self, end_call: bool) -> None:
        """Move whole lines (and, at a call's end, its partial lines) to the outbox."""
        with self.lock:
            if end_call:
                for stream, (task_id, name, text) in list(self.partial.items()):
                    self._add(stream, task_id, name, text)
                self.partial.clear()
            lines, self.lines = self.lines, []
            self.pending_bytes = 0
            if not self.partial:
                self.worker.output_pending = False
        if lines:
            self.worker.outbox.append((p.OUTPUT, lines))

    def end_call(self) -> None:
        self.take(True)

    def send_now(self) -> None:
        self.take(False)
        self.worker.send([])

    def _wake_flusher(self) -> None:
        if self._wake is None:
            self._wake = threading.Event()
            threading.Thread(target=self._flush_late, name="lightwork-output",
                             daemon=True).start()
        if not self._wake.is_set():
            self._wake.set()

    def _flush_late(self) -> None:
        from lightwork.engines.local.actor_runners import leave_sigint_to_the_main_thread

        assert self._wake is not None
        leave_sigint_to_the_main_thread()
        while True:
            self._wake.wait()
            time.sleep(FLUSH_AFTER_S)  # lines written meanwhile go in the same frame
            self._wake.clear()
            if self.lines:
                self.send_now()


class CapturedStream(io.TextIOBase):
    """What ``sys.stdout``/``sys.stderr`` are in a worker: text goes to the capture."""

    def __init__(self, capture: OutputCapture, stream: int, original: Any) -> None:
        self._capture = capture
        self._stream = stream
        self._original = original
        self._buffer = _CapturedBytes(self)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "backslashreplace"

    @property
    def buffer(self) -> _CapturedBytes:
        return self._buffer

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:  # for code that writes to the descriptor itself
        return int(self._original.fileno())

    def write(self, text: str) -> int:
        if type(text) is not str:
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._capture.write(self._stream, text)
        return len(text)

    def flush(self) -> None:
        return None


class _CapturedBytes(io.RawIOBase):
    """``sys.stdout.buffer`` of a worker: bytes decoded as UTF-8, bad bytes escaped."""

    def __init__(self, text: CapturedStream) -> None:
        self._text = text

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        data = bytes(data)
        self._text.write(data.decode("utf-8", "backslashreplace"))
        return len(data)


def install(worker: Worker) -> OutputCapture:
    """Capture this worker's Python-level stdout and stderr (see the module doc)."""
    capture = OutputCapture(worker)
    originals = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    out = CapturedStream(capture, STDOUT, sys.__stdout__ or sys.stdout)
    err = CapturedStream(capture, STDERR, sys.__stderr__ or sys.stderr)
    sys.stdout, sys.stderr = out, err
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler and handler.stream in originals:
                is_out = handler.stream in (originals[0], originals[2])
                handler.setStream(out if is_out else err)
    worker.output = capture
    return capture


# ----------------------------------------------------------------------- driver side
class TaskOutput:
    """The kept lines of one call: who ran it, and its last ``LINES_PER_TASK`` lines."""

    __slots__ = ("task_id", "name", "worker_id", "pid", "lines", "dropped")

    def __init__(self, task_id: int, name: str, worker_id: int, pid: int) -> None:
        self.task_id = task_id
        self.name = name
        self.worker_id = worker_id
        self.pid = pid
        self.lines: deque[tuple[int, str]] = deque(maxlen=LINES_PER_TASK)
        self.dropped = 0


class DriverOutput:
    """The driver's end: keep each line with its call, and hand it, labelled, to the
    writer thread that prints it (see "Printing" in the module docstring)."""

    def __init__(self, echo: bool = True, stdout: TextIO | None = None,
                 stderr: TextIO | None = None) -> None:
        self.echo = echo
        self._stdout = stdout
        self._stderr = stderr
        self.lock = threading.Lock()
        self.tasks: OrderedDict[tuple[int, int], TaskOutput] = OrderedDict()
        self.size = 0  # characters kept, all calls together
        # The writer's queue: (stream, text) in the order received, under ``_ready``.
        self._ready = threading.Condition(threading.Lock())
        self._queue: deque[tuple[int, str]] = deque()
        self._queued_size = 0
        self._not_printed = 0  # lines dropped from a full queue, said once it drains
        #: Lines handed to the writer, and lines it has written: ``settle`` compares them.
        self.queued = 0
        self.written = 0
        self._stalled = False  # a settle timed out: the terminal is stuck, wait no more
        self._writer: threading.Thread | None = None
        self._closing = False

    def receive(self, worker_id: int, pid: int, lines: list[tuple[int, int, str, str]]) -> None:
        kept = self.tasks
        echoed: list[tuple[int, str]] = []
        with self.lock:
            entry: TaskOutput | None = None
            for stream, task_id, name, text in lines:
                if entry is None or entry.task_id != task_id:
                    key = (worker_id, task_id)
                    entry = kept.get(key)
                    if entry is None:
                        entry = kept[key] = TaskOutput(task_id, name, worker_id, pid)
                        if len(kept) > TASKS_KEPT:
                            _key, oldest = kept.popitem(last=False)
                            self.size -= sum(len(t) for _s, t in oldest.lines)
                    else:
                        kept.move_to_end(key)
                if len(entry.lines) == LINES_PER_TASK:
                    entry.dropped += 1
                    self.size -= len(entry.lines[0][1])
                entry.lines.append((stream, text))
                self.size += len(text)
                while self.size > BYTES_KEPT and len(kept) > 1:
                    _key, oldest = kept.popitem(last=False)
                    self.size -= sum(len(t) for _s, t in oldest.lines)
                if self.echo:
                    echoed.append((stream, f"({name} pid={pid}) {text}\n"))
        if echoed:
            self._hand_over(echoed)

    def say(self, stream: int, text: str) -> None:
        """A line of the driver's own (a call paused in the debugger), printed in turn
        with the workers' lines, even with ``echo`` off."""
        self._hand_over([(stream, text.rstrip("\n") + "\n")], always=True)

    def _hand_over(self, echoed: list[tuple[int, str]], always: bool = False) -> None:
        """Queue lines for the writer thread (started at the first): never waits for the
        terminal. Beyond ``MAX_QUEUED_CHARS`` not yet printed, lines are dropped (they
        stay in their call's log) and counted."""
        with self._ready:
            room = MAX_QUEUED_CHARS - self._queued_size
            for line in echoed:
                if len(line[1]) > room and not always:
                    self._not_printed += 1
                    continue
                room -= len(line[1])
                self._queue.append(line)
                self._queued_size += len(line[1])
                self.queued += 1
            self._ready.notify_all()
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                                name="lightwork-output-writer")
                self._writer.start()

    def _write_loop(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if not self._queue:
                    return
                batch = list(self._queue)
                self._queue.clear()
                self._queued_size = 0
                not_printed, self._not_printed = self._not_printed, 0
            if not_printed:
                batch.append((STDERR, f"lightwork: {not_printed} lines of worker output were "
                                      "not printed: the terminal did not keep up (`lightwork "
                                      "logs` keeps each call's last lines)\n"))
            self._print(batch)
            with self._ready:
                self.written += len(batch) - (1 if not_printed else 0)
                if self.written >= self.queued:
                    self._stalled = False
                self._ready.notify_all()

    def settle(self, timeout: float = SETTLE_S) -> None:
        """Wait (``timeout`` at most) until the lines received so far are printed, so a
        call's lines show before its caller's ``get`` returns. A terminal that does not
        take them in time is not waited for again until it has caught up."""
        with self._ready:
            target = self.queued
            if self.written >= target or self._stalled:
                return
            if not self._ready.wait_for(lambda: self.written >= target, timeout):
                self._stalled = True

    def close(self, timeout: float = SETTLE_S) -> None:
        """The session ends: print what is queued (``timeout`` at most), then stop."""
        with self._ready:
            self._closing = True
            self._ready.notify_all()
        writer = self._writer
        if writer is not None:
            writer.join(timeout)

    def _print(self, echoed: list[tuple[int, str]]) -> None:
        out = self._stdout or sys.stdout
        err = self._stderr or sys.stderr
        used = set()
        for stream, text in echoed:
            target = err if stream == STDERR else out
            if stream == STDERR and STDOUT in used:
                out.flush()  # what came before this stderr line shows before it
                used.discard(STDOUT)
            try:
                target.write(text)
            except UnicodeEncodeError:
                enc = getattr(target, "encoding", None) or "utf-8"
                target.write(text.encode(enc, "backslashreplace").decode(enc))
            except (OSError, ValueError):  # the driver's stream is closed: keep the line
                continue
            used.add(stream)
        for stream in used:
            try:
                (err if stream == STDERR else out).flush()
            except (OSError, ValueError):
                pass

    def query(self, task: int | None = None, function: str | None = None,
              worker: int | None = None) -> list[dict[str, Any]]:
        """The kept output of the calls that match, oldest first."""
        with self.lock:
            entries = [e for e in self.tasks.values()
                       if (task is None or e.task_id == task)
                       and (function is None or e.name == function
                            or e.name.rsplit(".", 1)[-1] == function)
                       and (worker is None or e.worker_id == worker)]
            return [{"task_id": e.task_id, "name": e.name, "worker_id": e.worker_id,
                     "pid": e.pid, "dropped": e.dropped,
                     "lines": [["stderr" if s == STDERR else "stdout", t] for s, t in e.lines]}
                    for e in entries]
