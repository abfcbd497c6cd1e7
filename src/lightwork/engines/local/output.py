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

Driver side: :class:`~lightwork.kernel.driver_output.DriverOutput` (its module says how
lines are kept and printed), owned by the node here: ``receive`` runs with the node
lock held, in whichever thread read the worker's socket.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from lightwork.engines.local import protocol as p
from lightwork.kernel.driver_output import (  # noqa: F401 - the driver's end, re-exported
    BYTES_KEPT,
    LINES_PER_TASK,
    MAX_QUEUED_CHARS,
    SETTLE_S,
    STDERR,
    STDOUT,
    TASKS_KEPT,
    DriverOutput,
    TaskOutput,
)

if TYPE_CHECKING:
    from lightwork.engines.local.worker import Worker

FLUSH_AFTER_S = 0.02
MAX_PENDING_BYTES = 1 << 16
#: A line longer than this is cut: one print of a huge string stays bounded.
MAX_LINE = 1 << 16


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
