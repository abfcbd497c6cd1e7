"""The debugging session of a paused call: pdb on a socket (``TaskPdb`` on a
``SocketTerminal``), post-mortem, and debugpy's listener. The design is in
``debugger.py``'s docstring; this module is imported when a call first stops, never at
a worker's start, and reads what the worker's engine set from ``debugger.settings``.
"""

from __future__ import annotations

import dis
import fnmatch
import inspect
import itertools
import os
import pdb
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from lightwork.kernel.debug_wire import Listener, UnixListener
from lightwork.kernel.debugger import SKIP, local, settings
from lightwork.kernel.pauses import STATUS
from lightwork.kernel.introspect import LIGHTWORK_DIR as _LIGHTWORK_DIR

MAX_LINE = 1 << 16
#: Text pdb wrote since it last read a command, replayed to a client that attaches:
#: what the prompt refers to. Bounded.
MAX_REPLAY = 1 << 16
_sequence = itertools.count(1)
#: The terminals listening now in this process, by address (an engine abandons those
#: of a session that ended: ``SocketTerminal.abandon``).
terminals: dict[str, SocketTerminal] = {}


def debugger() -> TaskPdb:
    """This thread's debugger: the one already tracing it (a ``breakpoint()`` reached
    while stepping), else a new one."""
    active = getattr(local, "active", None)
    if active is None:
        active = local.active = TaskPdb()
    return active


def post_mortem(exc: BaseException) -> None:
    """Pause in the frame where ``exc`` was raised (its traceback's last user frame)
    until the user continues; from the thread of the call that raised it."""
    import bdb

    if isinstance(exc, (bdb.BdbQuit, KeyboardInterrupt, SystemExit)):
        return
    tb = exc.__traceback__
    while tb is not None and _is_ours(tb.tb_frame):  # start at the user's first frame
        tb = tb.tb_next
    if tb is None:
        return
    session = TaskPdb(post_mortem=f"{type(exc).__name__}: {exc}")
    session.reset()
    try:
        session.interaction(None, tb)
    finally:
        local.active = None


def _listener() -> Listener:
    """Where this call's pdb listens: the engine's (a cluster worker's TCP socket), else
    a Unix socket in the session directory."""
    if settings.listen is not None:
        return settings.listen()
    directory = settings.session_dir
    if directory is None:  # not in a worker set up by install(): nowhere to listen
        raise RuntimeError("the lightwork debugger runs only inside a task or actor")
    return UnixListener(os.path.join(directory, f"debug-{os.getpid()}-{next(_sequence)}.sock"))


def _is_ours(frame: Any) -> bool:
    name = frame.f_globals.get("__name__") or ""
    return (frame.f_code.co_filename.startswith(_LIGHTWORK_DIR)
            or any(fnmatch.fnmatch(name, pattern) for pattern in SKIP))


class SocketTerminal:
    """pdb's stdin and stdout: a listener (``debug_wire``) one client at a time attaches
    to."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self) -> None:
        self.path = ""
        self.listener: Listener | None = None
        self.abandoned = False
        self.conn: socket.socket | None = None
        self._buffer = b""
        self._replay: list[str] = []
        self._replay_size = 0
        self.attached_before = False
        #: What a client that attaches after another one left is greeted with (set by
        #: TaskPdb: where the call stands); the first client gets what pdb wrote so far.
        self.greeting: Callable[[], str] = lambda: "".join(self._replay)

    @property
    def is_open(self) -> bool:
        return self.listener is not None

    def open(self, listener: Listener) -> str:
        """Listen with ``listener`` (``debug_wire``: who may attach is its to decide)."""
        self.listener = listener
        self.path = listener.address
        self.abandoned = False
        terminals[self.path] = self
        return self.path

    def close(self, status: str) -> None:
        """End the session: tell the client why, stop listening."""
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.sendall(f"{STATUS}{status}\n".encode())
            except OSError:
                pass
            conn.close()
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.close()
            terminals.pop(self.path, None)
        self._buffer = b""
        self._replay, self._replay_size = [], 0
        self.attached_before = False

    def abandon(self) -> None:
        """From another thread: nobody will attach any more (the driver's session
        ended): the paused call quits (``q``) at its next read."""
        self.abandoned = True
        listener, conn = self.listener, self.conn
        if conn is not None:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if listener is not None:
            listener.close()

    # -- pdb's stdout ----------------------------------------------------------------
    def write(self, text: str) -> int:
        self._replay.append(text)
        self._replay_size += len(text)
        while self._replay_size > MAX_REPLAY and len(self._replay) > 1:
            self._replay_size -= len(self._replay.pop(0))
        conn = self.conn
        if conn is not None:
            try:
                conn.sendall(text.encode("utf-8", "replace"))
            except OSError:  # the client went away: the next read waits for another
                self._drop()
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False

    # -- pdb's stdin -----------------------------------------------------------------
    def readline(self) -> str:
        """The next command line; waits (for a client, then for its line) as long as it
        takes: a client that leaves is replaced by the next one."""
        while True:
            if self.abandoned:
                return "q\n"
            if self.conn is None:
                try:
                    self._accept()
                except OSError:
                    if self.abandoned:
                        return "q\n"
                    raise
            line = self._read_line()
            if line is not None:
                self._replay, self._replay_size = [], 0
                return line
            self._drop()

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            conn = self.listener.accept()
            if conn is None:  # refused (another user, a wrong token) before a byte of ours
                continue
            self.conn = conn
            greeting = self.greeting() if self.attached_before else "".join(self._replay)
            self.attached_before = True
            try:
                conn.sendall(greeting.encode("utf-8", "replace"))
            except OSError:
                self._drop()
                continue
            return

    def _read_line(self) -> str | None:
        assert self.conn is not None
        while b"\n" not in self._buffer:
            try:
                chunk = self.conn.recv(4096)
            except OSError:
                return None
            if not chunk:
                return None
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE and b"\n" not in self._buffer:
                self._buffer = b""  # a line longer than any command: dropped
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", "replace") + "\n"

    def _drop(self) -> None:
        conn, self.conn = self.conn, None
        self._buffer = b""
        if conn is not None:
            conn.close()


class TaskPdb(pdb.Pdb):
    """pdb on a :class:`SocketTerminal`, announcing its pauses, kept to the user's frames."""

    def __init__(self, post_mortem: str | None = None) -> None:
        self.terminal = SocketTerminal()
        terminal: Any = self.terminal  # (pdb's stubs ask for an IO; it reads and writes)
        super().__init__(stdin=terminal, stdout=terminal, skip=list(SKIP), nosigint=True,
                         readrc=False)
        self.prompt = "(Pdb) "
        self.call_frame: Any = None  # the call's outermost user frame
        self.post_mortem_error = post_mortem
        self._announced: dict[str, Any] | None = None
        self._banner = ""
        self.terminal.greeting = self._greeting

    # -- entering ----------------------------------------------------------------------
    def set_trace(self, frame: Any = None) -> None:
        if frame is None:
            frame = sys._getframe(1)
        if self.call_frame is None:
            outer = frame
            while outer.f_back is not None and not _is_ours(outer.f_back):
                outer = outer.f_back
            self.call_frame = outer
        super().set_trace(frame)

    def interaction(self, frame: Any, traceback: Any) -> None:
        if not self.terminal.is_open:
            self._pause(frame if frame is not None else _last_frame(traceback))
        try:
            super().interaction(frame, traceback)
        except BaseException:  # a cancel, or the worker's own end: nobody may attach now
            self._resume("ended")
            local.active = None
            raise
        if self.post_mortem_error is not None:
            self._resume("continued")

    def _cmdloop(self) -> None:
        # pdb's swallows KeyboardInterrupt at the prompt; here it is a cancel of the call.
        self.allow_kbdint = True
        try:
            self.cmdloop()
        finally:
            self.allow_kbdint = False

    def _pause(self, frame: Any) -> None:
        path = self.terminal.open(_listener())
        task_id, name = settings.describe() if settings.describe is not None else (0, "?")
        code = frame.f_code
        kind = "post-mortem" if self.post_mortem_error is not None else "breakpoint"
        info = {"socket": path, "task_id": task_id, "name": name, "function": code.co_name,
                "file": code.co_filename, "line": frame.f_lineno, "pid": os.getpid(),
                "worker_id": settings.worker_id, "kind": kind, "error": self.post_mortem_error,
                "since": time.monotonic(), "since_wall": time.time()}
        how = ("paused" if self.post_mortem_error is None
               else f"stopped after it raised {self.post_mortem_error}")
        banner = (f"lightwork: attached to {name} (task {task_id}, pid {os.getpid()}), {how} "
                  f"in {code.co_name} at {code.co_filename}:{frame.f_lineno}\n"
                  "  c: resume (post-mortem: let the error go on)   Ctrl-D: detach, the call "
                  "stays paused   q: end the call with BdbQuit\n")
        self._banner = banner
        self.terminal.write(banner)
        self._announced = info
        if settings.announce is not None:
            settings.announce("paused", info)

    def _greeting(self) -> str:
        """For a client attaching after another left: the banner, where the call stands."""
        where = ""
        if getattr(self, "stack", None) and 0 <= self.curindex < len(self.stack):
            where = "> " + self.format_stack_entry(self.stack[self.curindex], "\n-> ") + "\n"
        return self._banner + where + self.prompt

    def _resume(self, status: str) -> None:
        if not self.terminal.is_open:
            return
        path = self.terminal.path
        self.terminal.close(status)
        info, self._announced = self._announced, None
        if settings.announce is not None and info is not None:
            settings.announce("resumed", {"socket": path, "task_id": info["task_id"],
                                  "until": time.monotonic()})

    # -- leaving -----------------------------------------------------------------------
    def do_continue(self, arg: str) -> Any:
        result = super().do_continue(arg)
        self._resume("continued")
        if not self.breaks:
            local.active = None
        return result

    do_c = do_cont = do_continue

    def do_quit(self, arg: str) -> Any:
        result = super().do_quit(arg)
        self._resume("quit")
        local.active = None
        return result

    do_q = do_exit = do_quit

    def dispatch_return(self, frame: Any, arg: Any) -> Any:
        result = super().dispatch_return(frame, arg)
        if frame is self.call_frame and _returns(frame):
            self._leave_call()
            return None
        return result

    def _leave_call(self) -> None:
        """The call's outermost frame returned: stop tracing, end the session."""
        self.clear_all_breaks()
        self.set_continue()
        sys.settrace(None)
        self._resume("returned")
        self.call_frame = None
        local.active = None

    # -- the user's frames only --------------------------------------------------------
    def get_stack(self, f: Any, t: Any) -> tuple[list[tuple[Any, int]], int]:
        stack, index = super().get_stack(f, t)
        current = stack[index] if stack else None
        kept = [entry for entry in stack if entry is current or not _is_ours(entry[0])]
        if self.call_frame is not None:
            frames = [entry[0] for entry in kept]
            if self.call_frame in frames:
                kept = kept[frames.index(self.call_frame):]
        return kept, (kept.index(current) if current in kept else max(0, len(kept) - 1))


_YIELD = dis.opmap["YIELD_VALUE"]
_SUSPENDS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _returns(frame: Any) -> bool:
    """Whether a 'return' event of ``frame`` ends it: a coroutine's (an async actor's
    method) also fires at each ``await`` that suspends it, at a YIELD_VALUE."""
    if not frame.f_code.co_flags & _SUSPENDS:
        return True
    code = frame.f_code.co_code
    return not (0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == _YIELD)


def _last_frame(tb: Any) -> Any:
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame


# ---------------------------------------------------------------------------- debugpy
_debugpy_address: tuple[str, int] | None = None
#: debugpy's address -> how to stop waiting for its editor (an engine's session ended:
#: the call then runs on without one).
waiting: dict[str, Callable[[], None]] = {}


def debugpy_breakpoint(frame: Any) -> None:
    """``breakpoint()`` with ``debugger="debugpy"``: listen (once per worker) on
    127.0.0.1, announce host:port, wait for the editor, then stop here."""
    global _debugpy_address
    # (Its check that the stdlib is not frozen warns on every start: user code is not.)
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    try:
        import debugpy
    except ImportError:
        raise RuntimeError("init(debugger='debugpy') needs debugpy in the workers' "
                           "environment: pip install 'lightwork[debug]'") from None
    if _debugpy_address is None:
        host, port = debugpy.listen((settings.debugpy_host, 0))
        _debugpy_address = (host, port)
    host, port = _debugpy_address
    task_id, name = settings.describe() if settings.describe is not None else (0, "?")
    code = frame.f_code
    info = {"socket": f"tcp://{host}:{port}", "task_id": task_id, "name": name,
            "function": code.co_name, "file": code.co_filename, "line": frame.f_lineno,
            "pid": os.getpid(), "worker_id": settings.worker_id, "kind": "debugpy", "error": None,
            "since": time.monotonic(), "since_wall": time.time(), "address": f"{host}:{port}"}
    if settings.announce is not None:
        settings.announce("paused", info)
    try:
        waiting[info["socket"]] = lambda: debugpy.wait_for_client.cancel()
        debugpy.wait_for_client()
    finally:
        waiting.pop(info["socket"], None)
        if settings.announce is not None:
            settings.announce("resumed", {"socket": info["socket"], "task_id": task_id,
                                  "until": time.monotonic()})
    debugpy.breakpoint()
