"""The in-task debugger: ``breakpoint()`` in a task pauses the call, and ``lightwork
debug`` attaches to it from any terminal of the same user.

    worker: the paused call's own thread                lightwork debug (a terminal)
    breakpoint() -> sys.breakpointhook = _hook
      -> TaskPdb.set_trace(frame): pdb, stdin and stdout a SocketTerminal
      -> its first stop opens <session>/debug-<pid>-<n>.sock (0600, in the 0700
         session directory) and announces PAUSED (the engine's ``announce``: the
         local engine sends a frame; the driver prints one line, marks the task
         paused and answers the control operation ``debug_paused`` with it)
      -> pdb reads its commands: readline() ◄──── command lines (text) ──── the client
         accepts a client of the same uid          ───── pdb's output (text) ───►
         (SO_PEERCRED; others are closed at once); at the client's end of file it waits
         for the next client: detaching leaves the call paused
      -> ``c`` (or the call's outermost frame returning while stepping): a status line
         to the client, the socket removed, RESUMED announced; the call runs on

States of a call's terminal: closed -> listening (no client) <-> attached -> closed.
Everything here runs in the paused call's thread: no thread is started, and a worker
that never reaches a breakpoint pays nothing but the hook's installation at start.

Steps stay in the user's code: pdb's ``skip`` carries lightwork's module patterns (and
the machinery that runs a call: asyncio, concurrent.futures, threading), the stack
``where``/``up``/``down`` walk stops at the call's outermost frame, and when that frame
returns while stepping (``n``/``s``/``r`` at the call's last line) the session ends
as a ``c`` would, instead of stepping on into the worker's loop and the next call (a
coroutine's frame also "returns" at each ``await`` that suspends it: only its end counts).
Breakpoints set with ``b`` live for the call: they are cleared when it returns.

The wire: UTF-8 text both ways. The client sends lines, which pdb reads as its
commands (pdb evaluates them: that is what a debugger is, so only the session's own user
may connect); the server sends what pdb writes, and last a status line that starts with
``STATUS`` (NUL) saying why the session ended. Nothing received is ever unpickled.

Commands: pdb's, with three differences. End of file on the client (Ctrl-D) detaches
and leaves the call paused, where pdb would quit; ``q`` ends the call with
``bdb.BdbQuit`` as its error, as pdb aborts the program it debugs; and a cancel of the
paused call (``lightwork.cancel``) interrupts the session (pdb would swallow the
KeyboardInterrupt at its prompt).

Post-mortem (:func:`post_mortem`): a call that raised pauses in the frame that raised,
before its error is sent; ``c`` lets the error travel on.

``PYTHONBREAKPOINT=0`` in the driver's environment reaches every worker and turns
``breakpoint()``, ``pdb.set_trace()`` and post-mortem off there.

``debugger="debugpy"``: ``breakpoint()`` listens with debugpy on a TCP port of
127.0.0.1 instead, announces its host:port, and waits for an editor to attach
(:func:`_debugpy_breakpoint`).

Where a stopped call listens is the listener's (``debug_wire``): the local engine's
workers use a Unix socket in the session directory, as drawn above; a cluster worker
passes ``listen`` to :func:`install`, a TCP socket on its cluster address that admits
only a client with the driver session's token, and ``options``, read at each stop,
since one worker process serves several drivers (``engines/distributed/debugging.py``).

Modules: this one installs the hooks and holds the worker's settings; it imports no
debugger, so a worker (and the fork server all workers come from) pays for pdb only
when a call first stops: the session itself (pdb on a socket, post-mortem, debugpy) is
``debug_session.py``'s, imported then. ``pdb.set_trace`` is patched when the program
imports pdb (``_PdbPatcher``, a finder consulted for that one name). The driver's side
(the calls paused now, the line it prints) is ``pauses.py``'s: the driver imports
neither of these.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

#: Modules whose frames a step never stops in (pdb's ``skip``: fnmatch patterns).
SKIP = ("lightwork", "lightwork.*", "asyncio", "asyncio.*", "concurrent.futures*",
        "threading", "cloudpickle*", "runpy")

Announce = Callable[[str, dict[str, Any]], None]
Describe = Callable[[], tuple[int, str]]
#: The debugging options of the running call's session, (kind, post_mortem), or None
#: when it has none (a cluster worker serves several drivers, each with its own).
Options = Callable[[], "tuple[str, bool] | None"]


class Settings:
    """What the worker's engine set (``install``); read by ``debug_session``."""

    session_dir: str | None = None
    announce: Announce | None = None
    describe: Describe | None = None
    #: Where a paused call listens (a ``debug_wire`` listener), when not a Unix socket
    #: in ``session_dir``: a cluster worker's TCP socket.
    listen: Callable[[], Any] | None = None
    options: Options | None = None
    kind = "pdb"
    post_mortem = False
    worker_id = 0
    #: The host debugpy listens on (the worker's own machine only: it has no token).
    debugpy_host = "127.0.0.1"


settings = Settings()
#: This thread's debugger while one traces it (``debug_session.TaskPdb``), else unset.
local = threading.local()


def enabled() -> bool:
    """False when ``PYTHONBREAKPOINT=0`` (read at each stop, as Python reads it)."""
    return os.environ.get("PYTHONBREAKPOINT") != "0"


def install(session_dir: str | None, worker_id: int, announce: Announce, describe: Describe,
            kind: str = "pdb", post_mortem: bool = False, *,
            listen: Callable[[], Any] | None = None, options: Options | None = None) -> None:
    """In a worker: make ``breakpoint()`` and ``pdb.set_trace()`` pause the running call.

    ``announce(event, info)`` tells the driver a call paused (``"paused"``) or runs on
    (``"resumed"``); ``describe()`` is the running call's (task id, name). An engine
    whose workers serve several sessions passes ``options`` (read at each stop instead
    of ``kind`` and ``post_mortem``) and ``listen`` (a listener for the stopped call).
    """
    settings.session_dir, settings.announce, settings.describe = session_dir, announce, describe
    settings.kind, settings.post_mortem, settings.worker_id = kind, post_mortem, worker_id
    settings.listen, settings.options = listen, options
    sys.breakpointhook = _hook
    if "pdb" in sys.modules:
        _patch_pdb(sys.modules["pdb"])
    elif not any(isinstance(finder, _PdbPatcher) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PdbPatcher())


def _options() -> tuple[str, bool] | None:
    """(kind, post_mortem) for the running call; None: its session set up no debugger.
    Kind ``"off"``: its driver had ``PYTHONBREAKPOINT=0`` (an engine whose workers
    serve several sessions cannot read that from their own environment)."""
    if settings.options is not None:
        return settings.options()
    if settings.session_dir is None:
        return None
    return settings.kind, settings.post_mortem


def post_mortem_on() -> bool:
    if not enabled():
        return False
    options = _options()
    return options is not None and options[1] and options[0] != "off"


def post_mortem(exc: BaseException) -> None:
    """Pause in the frame where ``exc`` was raised until the user continues (from the
    thread of the call that raised it)."""
    from lightwork.kernel import debug_session

    debug_session.post_mortem(exc)


def _hook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` in a worker."""
    if not enabled():
        return
    from lightwork.kernel import debug_session

    frame = sys._getframe(1)
    options = _options()
    if options is not None and options[0] == "off":
        return
    if options is not None and options[0] == "debugpy":
        debug_session.debugpy_breakpoint(frame)
        return
    debug_session.debugger().set_trace(frame)


def _set_trace(*, header: str | None = None) -> None:
    """``pdb.set_trace()`` in a worker."""
    if not enabled():
        return
    options = _options()
    if options is not None and options[0] == "off":
        return
    from lightwork.kernel import debug_session

    debugger = debug_session.debugger()
    if header is not None:
        debugger.message(header)
    debugger.set_trace(sys._getframe(1))


def _patch_pdb(module: Any) -> None:
    module.set_trace = _set_trace  # `import pdb; pdb.set_trace()`


class _PdbPatcher(importlib.abc.MetaPathFinder):
    """Finds ``pdb`` for the program (the regular finders do the finding) and patches
    its ``set_trace`` once it is loaded; consulted for every import, it answers at once
    for any other name."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "pdb":
            return None
        sys.meta_path.remove(self)  # once: and the lookup below must not come back here
        spec = importlib.util.find_spec("pdb")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            _patch_pdb(module)

        spec.loader = _Patching(loader, exec_module)
        return spec


class _Patching(importlib.abc.Loader):
    """``loader`` with its ``exec_module`` replaced."""

    def __init__(self, loader: Any, exec_module: Callable[[Any], None]) -> None:
        self._loader = loader
        self._exec = exec_module

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._exec(module)
