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

from lightwork.kernel.control import peer_uid
from lightwork.kernel.debugger import SKIP, local, settings
from lightwork.kernel.pauses import STATUS

MAX_LINE = 1 << 16
#: Text pdb wrote since it last read a command, replayed to a client that attaches:
#: what the prompt refers to. Bounded.
MAX_REPLAY = 1 << 16
_LIGHTWORK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_sequence = itertools.count(1)


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


def _is_ours(frame: Any) -> bool:
    name = frame.f_globals.get("__name__") or ""
    return (frame.f_code.co_filename.startswith(_LIGHTWORK_DIR)
            or any(fnmatch.fnmatch(name, pattern) for pattern in SKIP))


class SocketTerminal:
    """pdb's stdin and stdout: a Unix socket that one client at a time attaches to."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self) -> None:
        self.path = ""
        self.listener: socket.socket | None = None
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

    def open(self, directory: str) -> str:
        """Listen on a fresh socket in ``directory`` (0700): only this user reaches it."""
        self.path = os.path.join(directory, f"debug-{os.getpid()}-{next(_sequence)}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        os.chmod(self.path, 0o600)
        listener.listen(4)
        self.listener = listener
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
            try:
                os.unlink(self.path)
            except OSError:
                pass
        self._buffer = b""
        self._replay, self._replay_size = [], 0
        self.attached_before = False

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
            if self.conn is None:
                self._accept()
            line = self._read_line()
            if line is not None:
                self._replay, self._replay_size = [], 0
                return line
            self._drop()

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            conn, _ = self.listener.accept()
            if peer_uid(conn) not in (None, os.getuid()):
                conn.close()  # another user: refused before a byte is read or sent
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
        directory = settings.session_dir
        if directory is None:  # not in a worker set up by install(): nowhere to listen
            raise RuntimeError("the lightwork debugger runs only inside a task or actor")
        path = self.terminal.open(directory)
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
        host, port = debugpy.listen(("127.0.0.1", 0))
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
        debugpy.wait_for_client()
    finally:
        if settings.announce is not None:
            settings.announce("resumed", {"socket": info["socket"], "task_id": task_id,
                                  "until": time.monotonic()})
    debugpy.breakpoint()
