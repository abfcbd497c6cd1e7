"""Worker output on the driver's terminal on a Dask cluster: what a task or actor method
writes to stdout or stderr (and ``logging`` records) on a worker is printed on its
driver's terminal as ``(name pid=N) text``, in the order the worker wrote it, and kept
per call for ``lightwork logs`` and the dashboard (``kernel.driver_output``).

    worker process                                   driver (ClusterOutput)
    sys.stdout, sys.stderr = ForwardingStream         init: register_plugin(SessionOutput)
      a write in a call of a forwarding session         subscribe_topic(lightwork-output-<tag>)
        -> _Capture.lines (both streams, one list)
      any other write (the worker's own, a thread
        the user started): the original stream
    end of the call, the flush thread, or a full
    buffer: worker.log_event(topic, batch)  ───────►  _on_event (the client's loop):
      (one event per session per batch)                 DriverOutput.receive -> writer thread

Worker side. :class:`SessionOutput`, a worker plugin, marks its driver session as
forwarding (``_forwarding``, bounded like the debugger's sessions) and, once per
process, puts a :class:`ForwardingStream` in front of ``sys.stdout`` and ``sys.stderr``
(and of the ``logging`` stream handlers that wrote to them). A write is captured when
the running call (``debugging.CALL``: the task wrapper's and the actor host's, a
context variable, so an async actor's coroutines are told apart) belongs to a
forwarding session; everything else reaches the worker's own streams as before. Whole
lines are cut at ``\\n``; a partial line waits for its end, a write from another call
or the end of its call (:func:`end_call`, which the task wrapper and actor host call in
their ``finally`` when ``pending`` is set: one global test per call). Lines leave
  * at the end of their call, from the task's thread, before its result goes back, so
    the driver hears of them before it hears that the task finished (both ride the
    worker's one stream to the scheduler, in order); an actor call's reply goes to its
    caller directly, so its lines may follow its result by a moment;
  * from the flush thread, ``FLUSH_AFTER_S`` after a line while a long call runs;
  * at once when ``MAX_PENDING_CHARS`` wait.
One event per batch: forwarding costs far less than a message per line.

The channel is distributed's event log, through the scheduler: the scheduler keeps a
topic's last events (1,000 by default: ``distributed.admin.low-level-log-length``), so
the driver truncates its topic when its session ends, and ``plugin.TaskErrors`` drops the
session's plugins and topics when the driver's client disconnects without that (a
driver killed with SIGKILL).

Driver side. :class:`ClusterOutput` owns the session's ``DriverOutput`` (the backend's
``output``); its event handler runs on the client's event loop and only files the
lines and queues them for the writer thread, never writing to the terminal.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import time
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from lightwork.engines.distributed.debugging import CALL, client_suffix
from lightwork.kernel.driver_output import STDERR, STDOUT, DriverOutput

TOPIC = "lightwork-output-{:x}"
PLUGIN = "lightwork-output-{:x}"
FLUSH_AFTER_S = 0.02
MAX_PENDING_CHARS = 1 << 16
#: A line longer than this is cut: one print of a huge string stays bounded.
MAX_LINE = 1 << 16
MAX_SESSIONS = 16  # sessions of drivers that died without tearing theirs down

#: Set when a captured line waits: the end of a call tests only this.
pending = False
#: Task ids of the calls that wrote a captured line: their results must not overtake
#: their lines (``took_output``). Bounded: ids of calls with no reply to make are dropped.
_printed: set[int] = set()
MAX_PRINTED = 10_000
_forwarding: dict[int, None] = {}
_capture: _Capture | None = None
_install_lock = threading.Lock()


# ---------------------------------------------------------------------- worker side
class _Capture:
    """This worker process's captured lines not yet sent (see the module doc)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.lines: list[tuple[int, int, int, str, str]] = []  # session, stream, id, name, text
        self.size = 0
        # (session, stream) -> (task id, name, text so far) of a line not yet ended
        self.partial: dict[tuple[int, int], tuple[int, str, str]] = {}
        self._wake: threading.Event | None = None

    def write(self, stream: int, call: tuple[int, str, int], text: str) -> None:
        global pending
        task_id, name, session = call
        with self.lock:
            held = self.partial.pop((session, stream), None)
            if held is not None:
                if held[0] == task_id:
                    text = held[2] + text
                else:  # another call's unfinished line ends here
                    self._add(session, stream, held[0], held[1], held[2])
            *whole, rest = text.split("\n")
            for line in whole:
                self._add(session, stream, task_id, name, line)
            while len(rest) > MAX_LINE:
                self._add(session, stream, task_id, name, rest[:MAX_LINE])
                rest = rest[MAX_LINE:]
            if rest:
                self.partial[(session, stream)] = (task_id, name, rest)
            full = self.size > MAX_PENDING_CHARS
            pending = True
            if len(_printed) >= MAX_PRINTED:
                _printed.clear()
            _printed.add(task_id)
        if full:
            self.send(None)
        elif self.lines:
            self._wake_flusher()

    def _add(self, session: int, stream: int, task_id: int, name: str, line: str) -> None:
        """One whole line (caller holds ``lock``)."""
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE] + " …[cut]"
        self.lines.append((session, stream, task_id, name, line))
        self.size += len(line)

    def send(self, ended: int | None) -> None:
        """Send the whole lines, and the partial lines of the call ``ended`` (its task
        id), one event per session."""
        global pending
        with self.lock:
            if ended is not None:
                for key, (task_id, name, text) in list(self.partial.items()):
                    if task_id == ended:
                        del self.partial[key]
                        self._add(key[0], key[1], task_id, name, text)
            lines, self.lines, self.size = self.lines, [], 0
            pending = bool(self.partial)
        if not lines:
            return
        by_session: dict[int, list[list[Any]]] = {}
        for session, stream, task_id, name, text in lines:
            by_session.setdefault(session, []).append([stream, task_id, name, text])
        worker = self.worker
        for session, batch in by_session.items():
            try:
                worker.log_event(TOPIC.format(session), {
                    "worker": str(worker.address), "pid": self.pid, "lines": batch})
            except Exception:  # noqa: BLE001, S110 - the worker is closing: a print never
                pass  # fails for it (the lines are lost, as the worker's own would be)

    def _wake_flusher(self) -> None:
        if self._wake is None:
            self._wake = threading.Event()
            threading.Thread(target=self._flush_late, name="lightwork-output",
                             daemon=True).start()
        if not self._wake.is_set():
            self._wake.set()

    def _flush_late(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.wait()
            time.sleep(FLUSH_AFTER_S)  # lines written meanwhile go in the same event
            self._wake.clear()
            if self.lines:
                self.send(None)


def took_output(task_id: int) -> bool:
    """Whether the call ``task_id`` wrote a captured line (asked once, by its reply): its
    lines reach the driver through the scheduler, so its result must too, or the result
    could be shown before them."""
    if not _printed:
        return False
    try:
        _printed.remove(task_id)
    except KeyError:
        return False
    return True


def end_call(task_id: int) -> None:
    """The call ``task_id`` ends: its lines leave now (called when ``pending``)."""
    capture = _capture
    if capture is not None:
        capture.send(task_id)


class ForwardingStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of a worker process: a call's text is captured for
    its driver; any other goes to the stream it replaced."""

    def __init__(self, stream: int, original: Any) -> None:
        self._stream = stream
        self._original = original

    def _call(self) -> tuple[int, str, int] | None:
        call = CALL.get()
        if call is not None and call[2] in _forwarding and _capture is not None:
            return call
        return None

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "backslashreplace"

    @property
    def buffer(self) -> Any:
        return _ForwardingBytes(self)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self._call() is None and bool(self._original.isatty())

    def fileno(self) -> int:  # for code that writes to the descriptor itself
        return int(self._original.fileno())

    def write(self, text: str) -> int:
        if type(text) is not str:
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        call = self._call()
        if call is None:
            return int(self._original.write(text) or 0)
        assert _capture is not None
        _capture.write(self._stream, call, text)
        return len(text)

    def flush(self) -> None:
        if self._call() is None:
            self._original.flush()


class _ForwardingBytes(io.RawIOBase):
    """``sys.stdout.buffer``: bytes decoded as UTF-8 (bad bytes escaped) for a call."""

    def __init__(self, text: ForwardingStream) -> None:
        self._text = text

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        data = bytes(data)
        if self._text._call() is None:
            return int(self._text._original.buffer.write(data) or 0)
        self._text.write(data.decode("utf-8", "backslashreplace"))
        return len(data)


def _install(worker: Any) -> None:
    """Once per process: forwarding streams in front of stdout, stderr and the
    ``logging`` stream handlers that wrote to them."""
    global _capture
    with _install_lock:
        if _capture is not None:
            _capture.worker = worker
            return
        originals = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
        out = ForwardingStream(STDOUT, sys.stdout)
        err = ForwardingStream(STDERR, sys.stderr)
        _capture = _Capture(worker)
        sys.stdout, sys.stderr = out, err
        loggers = [logging.getLogger()] + [
            logger for logger in logging.Logger.manager.loggerDict.values()
            if isinstance(logger, logging.Logger)]
        for logger in loggers:
            for handler in logger.handlers:
                if type(handler) is logging.StreamHandler and handler.stream in originals:
                    is_out = handler.stream in (originals[0], originals[2])
                    handler.setStream(out if is_out else err)


class SessionOutput(WorkerPlugin):
    """A driver session's calls forward their output, on every worker of the cluster."""

    def __init__(self, session: int) -> None:
        self.session = session

    def setup(self, worker: Any) -> None:
        _install(worker)
        with _install_lock:
            _forwarding[self.session] = None
            while len(_forwarding) > MAX_SESSIONS:
                del _forwarding[next(iter(_forwarding))]

    def teardown(self, worker: Any) -> None:
        """The driver's session ended: its lines go nowhere any more."""
        with _install_lock:
            _forwarding.pop(self.session, None)


# ---------------------------------------------------------------------- driver side
class ClusterOutput:
    """The driver's side: the plugin, the topic, and the session's kept output."""

    def __init__(self, backend: Any, echo: bool) -> None:
        self.backend = backend
        self.output = DriverOutput(echo=echo)
        client = backend.client
        self.topic = TOPIC.format(backend.session_tag)
        self.plugin_name = PLUGIN.format(backend.session_tag) + client_suffix(client)
        # Subscribed first: a task that prints at once is heard of.
        client.loop.add_callback(client.subscribe_topic, self.topic, self._on_event)
        client.register_plugin(SessionOutput(backend.session_tag), name=self.plugin_name)

    def _on_event(self, event: tuple[float, Any]) -> None:
        """A worker's batch (on the client's event loop: never block)."""
        message = event[1]
        if not isinstance(message, dict):
            return
        try:
            pid = int(message["pid"])
            lines = [(int(s), int(t), str(n), str(x)) for s, t, n, x in message["lines"]]
        except (KeyError, TypeError, ValueError):
            return  # not a batch of ours
        self.output.receive(self._worker_row(str(message.get("worker")), pid), pid, lines)

    def _worker_row(self, address: str, pid: int) -> int:
        """The worker's number, as ``list workers`` shows it (``logs --worker``)."""
        log = self.backend.session_log
        if log is None:
            return 0
        with log.lock:
            return int(log._row(address, pid, 0))

    def stop(self) -> None:
        """The session ends: print what is queued; the workers forget the session."""
        client = self.backend.client
        if getattr(client, "status", None) == "running":
            try:
                client.unregister_worker_plugin(self.plugin_name)
            except Exception:  # noqa: BLE001, S110 - a worker may be gone: nothing to undo
                pass
            try:
                client.run_on_scheduler(truncate_topic, topic=self.topic)
            except Exception:  # noqa: BLE001, S110 - the scheduler is going: so is its log
                pass
            client.loop.add_callback(_unsubscribe, client, self.topic)
        self.output.close()


def _unsubscribe(client: Any, topic: str) -> None:
    try:
        client.unsubscribe_topic(topic)
    except Exception:  # noqa: BLE001, S110 - never subscribed, or the client is closing
        pass


def truncate_topic(dask_scheduler: Any = None, topic: str = "") -> None:
    """Run on the scheduler: forget the events kept for ``topic``."""
    dask_scheduler._broker.truncate(topic)
