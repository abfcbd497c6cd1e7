"""The control socket: how diagnostics reach a running session from another terminal.

    lightwork status|list|…|stack                     the driver process
    ┌────────────────────────┐ <session>/control.sock ┌────────────────────────────┐
    │ request(op, args) ──── one JSON line ─────────► │ thread "lightwork-control": │
    │        ◄────────────── one JSON line ────────── │ accepts, a short-lived     │
    └────────────────────────┘ (Unix socket, 0600)    │ thread per connection;     │
                                                      │ samples CPU/memory         │
                                                      └────────────────────────────┘

Layers above the kernel add operations without being imported from here
(:func:`register_ops`, as DESIGN requires): ``lightwork.init`` registers the live
dashboard's ``dashboard_*`` operations (``lightwork/dashboard/__init__.py``), whose
handler imports ``lightwork.dashboard.feed`` on the first request.

Protocol: a request is one line of JSON ``{"op": name, "args": {...}}``; the reply is
one line ``{"ok": true, "result": ...}`` or ``{"ok": false, "type": "ValueError",
"error": message}``. A handler may return :class:`Attached` to send raw bytes after the
line (``"attached": N`` in it): the dashboard's packed task records, which would cost
the driver three times more as base64 inside the JSON. A connection carries any number
of requests in turn (:class:`Channel`). Never pickle: nothing received is ever turned
into code or objects.
Operations are in :func:`dispatch`; the Python API (``lightwork.state`` and friends)
calls the same function in-process, so both paths return the same rows.

Trust model: the socket lives in the session directory (0700) and is itself 0600, and
the server also checks the peer's uid (``SO_PEERCRED``), so only the session's own user
reaches it, and every client of that user is trusted alike (such a process could as
well signal or trace the driver). Most operations are views; two change the program:
``dashboard_cancel`` (cancel a task) and ``dashboard_kill`` (kill an actor). They are
refused unless the request says it comes from a dashboard started with
``--allow-actions`` (``allow_actions: true``, checked in ``feed``), so a dashboard
without that flag cannot relay them even if its own HTTP checks (token, Origin, POST)
had a hole. That flag is a guard against mistakes, not a barrier between clients: a
same-user process can set it.

On the cluster backend the same server runs beside the run's event log
(``engines/distributed/control.py``), which answers every operation itself
(``answer_query``): :func:`dispatch` hands requests to it.

The server is a side-car of the :class:`~lightwork.engines.local.node.Node` (``node.control``)
and owns the diagnostic state the event log does not: CPU/memory samples of the
session's processes (psutil, every ``SAMPLE_INTERVAL_S``, bounded), the pids and roles
of workers that have exited (records of pooled workers carry no pid), and the driver's
custom ``profile`` spans (a ring bounded by the event budget). It starts no work on the
hot path; a sample costs about 50 µs per process.

Workers: :func:`install_worker_hooks` runs in each worker's ``main``. It registers
faulthandler on ``STACK_SIGNAL`` writing into ``<session dir>/stack-w<id>.txt``, so
:func:`collect_stacks` can dump every thread of a worker that is stuck in C code or
holds the GIL (the dump runs in the signal handler, in C), with no ptrace and no
external tool. The file appears only once the handler is registered, so a worker that
is still starting is never signalled (the signal's default action would kill it). It
also remembers the session directory, where ``profile`` spans of tasks are appended
as JSON lines (``profile-w<id>.jsonl``, rotated at the event budget).
"""

from __future__ import annotations

import faulthandler
import glob
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: An engine's run record (``Backend.run_record``): these views read its tables by name.
Run = Any

SOCKET_NAME = "control.sock"
STACK_SIGNAL = signal.SIGUSR1
SAMPLE_INTERVAL_S = 0.5
MAX_SAMPLES = 20_000  # 2.7 hours at 2 Hz; older samples are dropped and counted
MAX_REQUEST_BYTES = 1 << 20
CONNECTION_TIMEOUT_S = 30.0
MAX_SOCKET_PATH = 104  # sun_path is 108 bytes on Linux, 104 on macOS
DEFAULT_STACK_TIMEOUT_S = 2.0


class Attached:
    """A handler's result with raw bytes to send after its JSON line (never parsed as
    code: the receiver reads them as arrays of numbers)."""

    __slots__ = ("buffers", "result")

    def __init__(self, result: Any, buffers: list[Any]) -> None:
        self.result = result
        self.buffers = buffers  # bytes-like objects, sent in order without joining


class ControlError(RuntimeError):
    """A diagnostics request could not be answered."""


class NoSessionError(ControlError):
    """No running session to attach to."""


class NotAnsweringError(ControlError):
    """The session's driver accepted the connection but did not reply in time."""


# ---------------------------------------------------------------------------- server
class ControlServer:
    """The driver's diagnostics side-car: socket server, sampler, profile ring."""

    def __init__(self, node: Run) -> None:
        self.node = node
        self.path = os.path.join(node.session.directory, SOCKET_NAME)
        self.error: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # guards the rings and maps below
        self._profile: deque[list[Any]] = deque(maxlen=node.log.budget)
        self._dropped_profile = 0
        self._samples: deque[tuple[float, list[tuple[int, float, int]]]] = deque(maxlen=MAX_SAMPLES)
        self._dropped_samples = 0
        self._known: dict[int, dict[str, Any]] = {}
        self._procs: dict[int, Any] = {}
        self._cpu_seen: dict[int, tuple[float, float]] = {}
        self._last_sample_at = 0.0
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        # Run at stop: what diagnostics attached for the session's life undo themselves
        # (the dashboard's get/wait observer).
        self.stop_hooks: list[Any] = []

    def start(self) -> ControlServer:
        if len(self.path) > MAX_SOCKET_PATH:
            self.error = (f"the control socket path {self.path!r} is too long for a Unix "
                          "socket; set TMPDIR to a shorter directory to use `lightwork` commands")
            return self
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            os.chmod(self.path, 0o600)  # the directory is 0700 already: no window for others
            listener.listen(16)
        except OSError as exc:
            listener.close()
            self.error = f"could not open the control socket {self.path}: {exc}"
            return self
        listener.settimeout(SAMPLE_INTERVAL_S)
        self._listener = listener
        self._thread = threading.Thread(target=self._serve, name="lightwork-control", daemon=True)
        self._thread.start()
        return self

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        # No new connection from here on (a client gets "refused" at once instead of
        # waiting for an answer that never comes); the hooks may still answer on the
        # connections already open (the dashboard's final sync).
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept() on Linux
            except OSError:
                pass
            listener.close()
        for hook in self.stop_hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - a diagnostics hook must not block shutdown
                pass
        self.stop_hooks.clear()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _serve(self) -> None:
        while not self._stop.is_set():
            listener = self._listener
            if listener is None:
                return
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                conn = None
            except OSError:
                return
            if conn is not None:
                if peer_uid(conn) not in (None, os.getuid()):
                    conn.close()
                else:
                    threading.Thread(target=self._answer, args=(conn,), daemon=True,
                                     name="lightwork-control-conn").start()
            if time.monotonic() - self._last_sample_at >= SAMPLE_INTERVAL_S:
                try:
                    self.sample_now()
                except Exception:  # noqa: BLE001 - sampling is best effort, never fatal
                    pass

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(CONNECTION_TIMEOUT_S)
        reader = conn.makefile("rb")
        try:
            while True:
                line = reader.readline(MAX_REQUEST_BYTES + 1)
                if not line:
                    return
                for buffer in self._reply_to(line):
                    conn.sendall(buffer)
        except OSError:
            return
        finally:
            reader.close()
            conn.close()

    def _reply_to(self, line: bytes) -> list[Any]:
        """The reply's buffers: its JSON line, then any attached bytes."""
        attached: list[Any] = []
        try:
            if len(line) > MAX_REQUEST_BYTES:
                raise ValueError(f"request larger than {MAX_REQUEST_BYTES} bytes")
            request = json.loads(line)
            if not isinstance(request, dict) or not isinstance(request.get("op"), str):
                raise ValueError('a request is a JSON object {"op": name, "args": {...}}')
            args = request.get("args") or {}
            if not isinstance(args, dict):
                raise ValueError("request args must be a JSON object")
            result = dispatch(self.node, request["op"], args)
            if isinstance(result, Attached):
                result, attached = result.result, result.buffers
            reply: dict[str, Any] = {"ok": True, "result": result}
            if attached:
                reply["attached"] = sum(memoryview(b).nbytes for b in attached)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error reply
            # The client re-raises these two as themselves (usage errors), others as
            # ControlError; UnicodeDecodeError and JSONDecodeError are ValueErrors.
            kind = ("ValueError" if isinstance(exc, ValueError)
                    else "TypeError" if isinstance(exc, TypeError) else "ControlError")
            if isinstance(exc, (UnicodeDecodeError, json.JSONDecodeError)):
                exc = ValueError(f"the request is not one line of UTF-8 JSON ({exc})")
            reply = {"ok": False, "type": kind, "error": str(exc) or kind}
            attached = []
        return [json.dumps(reply, default=str).encode() + b"\n", *attached]

    # -- side-car state -----------------------------------------------------------------
    def add_profile(self, event: list[Any]) -> None:
        with self._lock:
            if len(self._profile) == self._profile.maxlen:
                self._dropped_profile += 1
            self._profile.append(event)

    def profile_events(self) -> tuple[list[list[Any]], int]:
        """The driver's spans and every worker's (from their files); and how many dropped."""
        with self._lock:
            events = list(self._profile)
            dropped = self._dropped_profile
        more, more_dropped = read_profile_files(self.node.session.directory)
        return events + more, dropped + more_dropped

    def samples(self) -> tuple[list[tuple[float, list[tuple[int, float, int]]]], int]:
        with self._lock:
            return list(self._samples), self._dropped_samples

    def last_sample(self) -> tuple[float, list[tuple[int, float, int]]] | None:
        with self._lock:
            return self._samples[-1] if self._samples else None

    def known_workers(self) -> dict[int, dict[str, Any]]:
        with self._lock:
            return dict(self._known)

    def sample_now(self) -> None:
        """Record CPU % and RSS of the driver, the fork server and every worker."""
        now = time.monotonic()
        if now - self._last_sample_at < 0.05:
            return  # a CPU percentage needs some time between two readings
        self._last_sample_at = now
        node = self.node
        with node.lock:
            pids = [os.getpid(), *(node.runtime_pids() or ())]
            known = {worker_id: info for worker_id, info in node.worker_infos().items()
                     if info["pid"]}
        with self._lock:
            self._known.update(known)
        try:
            import psutil
        except ImportError:
            return
        readings = []
        for pid in pids:
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                with proc.oneshot():
                    times = proc.cpu_times()
                    rss = proc.memory_info().rss
            except (psutil.Error, OSError):
                self._procs.pop(pid, None)
                continue
            cpu = times.user + times.system
            previous = self._cpu_seen.get(pid)
            self._cpu_seen[pid] = (now, cpu)
            if previous is not None and now > previous[0]:
                percent = 100.0 * (cpu - previous[1]) / (now - previous[0])
                readings.append((pid, round(percent, 1), rss))
        for pid in set(self._procs) - set(pids):
            self._procs.pop(pid, None)
            self._cpu_seen.pop(pid, None)
        if readings:
            with self._lock:
                if len(self._samples) == self._samples.maxlen:
                    self._dropped_samples += 1
                self._samples.append((now, readings))


def start(node: Run) -> ControlServer:
    """Start the node's control server; never raises (diagnostics must not break init)."""
    server = ControlServer(node)
    try:
        return server.start()
    except Exception as exc:  # noqa: BLE001 - an init without a control socket still works
        server.error = f"the control server did not start: {exc}"
        return server


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (None: unknown)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, option, 12))
    except OSError:
        return None
    return uid


# ---------------------------------------------------------------------------- operations
OPS = ("ping", "status", "list", "summarize_tasks", "memory_summary", "timeline_data", "stacks",
       "advise", "logs", "sample_start", "sample_stop", "sample", "debug_paused")
OpHandler = Callable[[Run, str, dict[str, Any]], Any]
#: Operations registered by the layers above (name -> handler); see :func:`register_ops`.
_extra_ops: dict[str, OpHandler] = {}


def register_ops(names: Iterable[str], handler: OpHandler) -> None:
    """Let a layer above the kernel answer the operations ``names`` (idempotent).

    ``handler(node, op, args)`` runs in the control server's connection thread, like the
    built-in operations; it should import what it needs lazily, so registering costs
    nothing until a request comes.
    """
    for name in names:
        if name in OPS:
            raise ValueError(f"{name!r} is a built-in control operation; pick another name")
        _extra_ops[name] = handler


def known_ops() -> tuple[str, ...]:
    return OPS + tuple(_extra_ops)


def extra_op(op: str) -> OpHandler | None:
    """The handler a layer above registered for ``op``, or None."""
    return _extra_ops.get(op)


def dispatch(node: Any, op: str, args: dict[str, Any]) -> Any:
    """Answer one diagnostics request (in the driver): an operation a layer above
    registered, else the run's own ``answer_query`` (each engine's run record has one)."""
    handler = _extra_ops.get(op)
    if handler is not None:
        return handler(node, op, args)
    return node.answer_query(op, args)


# ---------------------------------------------------------------------------- stacks
_stack_lock = threading.Lock()  # one dump at a time: dumps share each worker's file


def stack_file_path(session_dir: str, worker_id: int) -> str:
    return os.path.join(session_dir, f"stack-w{worker_id}.txt")


def driver_threads() -> list[dict[str, Any]]:
    """Every thread of this process: id, name and frames (oldest first)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    threads = []
    for ident, frame in sys._current_frames().items():
        frames = []
        current: Any = frame
        while current is not None:
            code = current.f_code
            frames.append([code.co_filename, current.f_lineno, code.co_name])
            current = current.f_back
        frames.reverse()
        threads.append({"id": ident, "name": names.get(ident, "(unnamed)"), "frames": frames})
    return threads


# ---------------------------------------------------------------------------- workers
_worker_session_dir: str | None = None
_worker_id = 0
_worker_budget = 200_000
_keep: list[Any] = []  # files faulthandler writes to must stay open
_profile_writer: ProfileWriter | None = None


def install_worker_hooks(worker_id: int, config: dict[str, Any]) -> None:
    """In a worker's ``main``: the stack-dump handler, and where profile spans go."""
    global _worker_session_dir, _worker_id, _worker_budget, _profile_writer
    session_dir = config.get("session_dir")
    if not session_dir:
        return
    _worker_session_dir, _worker_id = session_dir, worker_id
    _worker_budget = int(config.get("event_budget") or _worker_budget)
    _profile_writer = None
    final = stack_file_path(session_dir, worker_id)
    temporary = final + ".starting"
    stream = os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "w")
    _keep.append(stream)
    faulthandler.register(STACK_SIGNAL, file=stream, all_threads=True, chain=False)
    os.rename(temporary, final)  # from now on the driver may signal this process


def worker_socket_path() -> str | None:
    """Inside a worker: the control socket of its session (for the state API)."""
    if _worker_session_dir is None:
        return None
    return os.path.join(_worker_session_dir, SOCKET_NAME)


class ProfileWriter:
    """Appends a worker's profile spans to its file; rotates at the event budget."""

    def __init__(self, session_dir: str, worker_id: int, budget: int) -> None:
        self.path = os.path.join(session_dir, f"profile-w{worker_id}.jsonl")
        self.budget = budget
        self.count = 0
        self.dropped = 0
        self._lock = threading.Lock()

    def write(self, event: list[Any]) -> None:
        line = json.dumps(event, default=str) + "\n"
        with self._lock:
            if self.count >= self.budget:
                # Keep the newest ``budget`` to ``2 * budget`` spans: the old file goes.
                self.dropped += _count_lines(self.path + ".old")
                os.replace(self.path, self.path + ".old")
                self.count = 0
                line = json.dumps({"dropped": self.dropped}) + "\n" + line
            with open(self.path, "a") as f:
                f.write(line)
            self.count += 1


def worker_profile_writer() -> ProfileWriter | None:
    global _profile_writer
    if _profile_writer is None and _worker_session_dir is not None:
        _profile_writer = ProfileWriter(_worker_session_dir, _worker_id, _worker_budget)
    return _profile_writer


def _count_lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if not line.startswith(b'{"dropped"'))
    except OSError:
        return 0


def read_profile_files(session_dir: str) -> tuple[list[list[Any]], int]:
    events: list[list[Any]] = []
    dropped = 0
    for path in sorted(glob.glob(os.path.join(session_dir, "profile-w*.jsonl*"))):
        try:
            with open(path) as f:
                for line in f:
                    try:
                        item = json.loads(line)
                    except ValueError:
                        continue  # a line being written right now
                    if isinstance(item, dict):
                        if not path.endswith(".old"):
                            dropped = max(dropped, int(item.get("dropped", 0)))
                    elif isinstance(item, list):
                        events.append(item)
        except OSError:
            continue
    return events, dropped


# ---------------------------------------------------------------------------- client
@dataclass
class SessionInfo:
    name: str
    directory: str
    socket: str
    driver_pid: int | None
    started: float


def find_sessions() -> list[SessionInfo]:
    """Running sessions of this user on this machine, newest first."""
    from lightwork.kernel.session import driver_pid, pid_alive, sessions_root  # not in workers

    root = sessions_root()
    found = []
    try:
        entries = os.listdir(root)
    except OSError:
        return []
    for name in entries:
        directory = os.path.join(root, name)
        path = os.path.join(directory, SOCKET_NAME)
        try:
            started = os.stat(path).st_mtime
        except OSError:
            continue
        pid = driver_pid(name)
        if pid is not None and not pid_alive(pid):
            continue
        found.append(SessionInfo(name, directory, path, pid, started))
    found.sort(key=lambda s: s.started, reverse=True)
    return found


def resolve_socket(session: str | None = None, address: str | None = None) -> str:
    """The control socket to talk to: ``address``, the named session, or the newest."""
    if address:
        return address
    sessions = find_sessions()
    if session:
        for info in sessions:
            if info.name == session or info.name.endswith(session):
                return info.socket
        names = ", ".join(s.name for s in sessions) or "none"
        raise NoSessionError(f"no running lightwork session named {session!r} "
                             f"(running sessions: {names})")
    if not sessions:
        from lightwork.kernel.session import sessions_root

        raise NoSessionError(
            f"no running lightwork session of this user was found (looked in {sessions_root()}); "
            "start one with lightwork.init() in your program and run this command while it runs")
    return sessions[0].socket


def request(path: str, op: str, args: dict[str, Any] | None = None,
            timeout: float = 10.0) -> Any:
    """Send one request to a control socket and return its result (raises on errors)."""
    with Channel(path, timeout) as channel:
        return channel.ask(op, args, timeout)[0]


class Channel:
    """A connection to a session's control socket that carries requests in turn.

    :meth:`ask` returns the result and the bytes attached to it (``b""`` when none).
    """

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._buffer = b""
        try:
            self._sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self._sock.close()
            raise NoSessionError(f"no lightwork session is listening on {path} "
                                 f"({exc.strerror}); it may have ended") from None
        except OSError:
            self._sock.close()
            raise

    def __enter__(self) -> Channel:  # noqa: PYI034 - not subclassed
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def ask(self, op: str, args: dict[str, Any] | None = None,
            timeout: float = 10.0) -> tuple[Any, bytes]:
        sock = self._sock
        sock.settimeout(timeout)
        sock.sendall(json.dumps({"op": op, "args": args or {}}).encode() + b"\n")
        chunks = [self._buffer]
        end = self._buffer.find(b"\n")
        while end < 0:
            chunk = self._receive(op, timeout)
            if not chunk:
                if not any(chunks):
                    raise ControlError(f"the lightwork session at {self.path} closed the "
                                       f"connection without answering {op!r}")
                raise ControlError(f"the lightwork session at {self.path} closed the "
                                   f"connection in the middle of its answer to {op!r}")
            end = chunk.find(b"\n")
            chunks.append(chunk)
        data = b"".join(chunks)
        end = data.index(b"\n")
        reply = json.loads(data[:end])
        rest = data[end + 1:]
        size = reply.get("attached", 0) if isinstance(reply, dict) else 0
        if size:
            parts, have = [rest], len(rest)
            while have < size:
                chunk = self._receive(op, timeout)
                if not chunk:
                    raise ControlError(f"the lightwork session at {self.path} closed the "
                                       f"connection in the middle of its answer to {op!r}")
                parts.append(chunk)
                have += len(chunk)
            rest = b"".join(parts)
        attached, self._buffer = rest[:size], rest[size:]
        if reply.get("ok"):
            return reply.get("result"), attached
        message = reply.get("error", "unknown error")
        if reply.get("type") == "ValueError":
            raise ValueError(message)
        if reply.get("type") == "TypeError":
            raise TypeError(message)
        raise ControlError(message)

    def _receive(self, op: str, timeout: float) -> bytes:
        try:
            return self._sock.recv(1 << 20)
        except TimeoutError:
            raise NotAnsweringError(
                f"the lightwork session at {self.path} did not answer {op!r} within "
                f"{timeout:g} s: its driver may be holding the GIL in a long C call, or be "
                "stopped. Try again, or see where it is with `lightwork stack --native` "
                "(py-spy)") from None
