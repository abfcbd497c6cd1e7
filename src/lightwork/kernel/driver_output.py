"""The driver's end of worker output, for every backend: each line a task or actor
method wrote is kept with its call (bounded) and printed on the driver's terminal,
labelled ``(name pid=N)``, by one writer thread.

The engines bring the lines (the embedded runtime from its workers' frames,
``engines/local/output.py``; the cluster backend from its workers' events,
``engines/distributed/output.py``) and call :meth:`DriverOutput.receive`; the caller's
``get`` and ``wait`` call :meth:`DriverOutput.settle`; ``lightwork logs`` and the
dashboard's task view read :meth:`DriverOutput.query` (:func:`answer_logs`).

Keeping. It keeps the last ``LINES_PER_TASK`` lines of the last ``TASKS_KEPT`` calls
that printed, at most ``BYTES_KEPT`` characters in all. With ``echo`` False
(``init(log_to_driver=False)``) the lines are kept but not printed. ``receive`` may run
under an engine's lock (the node's); queries read under this object's own lock.

Printing. ``receive`` never writes to the terminal: a terminal that is slow, paused
(Ctrl-S, a pager) or a pipe nobody reads would stall the runtime behind the engine's
lock. It queues the labelled lines for one writer thread (``lightwork-output-writer``,
started at the first line), which prints them in the order they came, so each worker's
lines keep their order, and stderr is flushed behind the stdout written before it.
:meth:`DriverOutput.settle` waits, up to ``SETTLE_S``, until the lines received so far
are printed, so a call's lines still show before its result (one comparison of two
counters when all is printed). A terminal that does not keep up is waited for once,
then not again until it has caught up; past ``MAX_QUEUED_CHARS`` waiting, lines are
dropped from the terminal (not from their call's log) and their count is said when it
drains.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict, deque
from typing import Any, TextIO

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


def answer_logs(output: DriverOutput | None, session: str,
                args: dict[str, Any]) -> dict[str, Any]:
    """``lightwork logs`` (the control socket's ``logs``): what the calls named by
    ``task`` (its id, as ``list tasks`` shows it), ``function`` (a function's or
    method's name) or ``worker`` (its number) printed, as kept (``output`` None: the
    session keeps none)."""
    task = args.get("task")
    worker = args.get("worker")
    function = args.get("function")
    if task is None and worker is None and not function:
        raise ValueError("name what to show: a task id, a function name or a worker number")
    try:
        task_id = None if task is None else int(str(task), 0)
    except ValueError:
        raise ValueError(f"{task!r} is not a task id; `lightwork list tasks` shows them") from None
    try:
        worker_id = None if worker is None else int(worker)
    except (TypeError, ValueError):
        raise ValueError(f"{worker!r} is not a worker number; `lightwork list workers` "
                         "shows them") from None
    if output is None:
        return {"session": session, "echo": False, "tasks": []}
    return {"session": session, "echo": output.echo,
            "tasks": output.query(task_id, function, worker_id)}
