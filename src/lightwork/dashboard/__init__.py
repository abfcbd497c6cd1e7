"""The live dashboard: watch a running program in a browser.

    lightwork dashboard [--session NAME] [--port N] [--open] [--allow-actions]
    lightwork dashboard --from FILE        # replay a saved timeline (a post-mortem)
    lightwork.init(dashboard=True)          # or include_dashboard=True, Ray's argument

Pieces (each module's docstring has its design):

* ``feed`` — in the watched program (``register`` hooks it into the control
  socket at ``init``): answers the incremental ``dashboard_sync`` (new task records as binary columns, live picture), about once a
  second while a page is open and never when none is;
* ``mirror`` — in the dashboard process: the session's copy (the sync thread applies
  each sync, doing the heavy part off the lock), and the overview and stream views;
* ``table`` — the tasks view, paged, filtered and sorted on the server, over the kept
  sort orders of ``orders``; ``functions`` — per-function counts and percentiles, kept
  as records arrive;
* ``server`` and ``handler`` — the HTTP server (standard library), its security (loopback,
  token, Host check, no CORS, opt-in actions) and its routes, with Server-Sent Events;
* ``launch`` — the child process ``init(dashboard=True)`` starts;
* ``_serve`` — the script the dashboard process runs (the child, and ``lightwork
  dashboard``, which replaces its own process with it): it imports the server without
  the runtime (a bare ``lightwork`` package), so the process starts near 20 MB;
* ``wire`` — the layout of the records a sync carries (both sides);
* ``replay`` — ``--from FILE``: a mirror loaded from a saved timeline's event log;
* ``static/`` — the page: plain JavaScript and a canvas, no library, no CDN.

The dashboard needs nothing beyond lightwork's own dependencies (the ``dashboard`` extra
is empty). Importing this package starts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Any, TextIO

__all__ = ["add_command", "register", "run_command", "serve_main"]

#: The control socket's operations this package answers in the watched program.
CONTROL_OPS = ("dashboard_sync", "dashboard_wait_end", "dashboard_end_seen", "dashboard_cancel",
               "dashboard_kill")


def register() -> None:
    """Plug the dashboard into the layers below (``import lightwork`` calls this in the
    driver; they never import this package): its operations on the control socket, and
    the starter ``init(dashboard=True)`` uses. The feed and the launcher are imported on
    first use."""
    from lightwork.kernel import control, tools

    control.register_ops(CONTROL_OPS, _answer_control_op)
    tools.register_dashboard(_start)


def _start(socket_path: str, port: int) -> Any:
    from lightwork.dashboard import launch

    return launch.start(socket_path, port)


def _answer_control_op(node: Any, op: str, args: dict[str, Any]) -> Any:
    from lightwork.dashboard import feed

    return feed.dispatch(node, op, args)


def add_command(commands: Any, attach: argparse.ArgumentParser) -> None:
    """The ``lightwork dashboard`` verb, for ``cli.build_parser``."""
    parser = commands.add_parser("dashboard", parents=[attach],
                                 help="serve a live dashboard of the session in a browser")
    _add_options(parser)


def _add_options(parser: argparse.ArgumentParser) -> None:
    from lightwork.dashboard.server import DEFAULT_PORT

    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port on 127.0.0.1 (default {DEFAULT_PORT}, or the next free "
                        "one; 0 picks any free port)")
    parser.add_argument("--open", action="store_true", help="open it in a browser")
    parser.add_argument("--allow-actions", action="store_true",
                        help="let the page cancel tasks and kill actors (off by default)")
    parser.add_argument("--linger", type=float, default=None, metavar="SECONDS",
                        help="after the program ends, exit once no page was open for this "
                        "long (default: serve the final state until Ctrl-C)")
    parser.add_argument("--from", dest="from_file", metavar="FILE",
                        help="replay a saved timeline file (lightwork timeline -o FILE) "
                        "instead of attaching to a running program")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def run_command(args: Any, out: TextIO) -> int:
    """``lightwork dashboard``: attach, print the URL, serve until Ctrl-C."""
    from lightwork.kernel import control
    from lightwork.dashboard import server

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be between 0 and 65535, got {args.port}")
    if args.linger is not None and args.linger < 0:
        raise ValueError(f"--linger must be >= 0 seconds, got {args.linger}")
    if args.from_file:
        from lightwork.dashboard import replay

        if args.allow_actions:
            raise ValueError("--allow-actions needs a running program; a replay (--from) "
                             "has nothing to act on")
        return server.serve(None, args.port, False, args.open, args.linger, out=out,
                            mirror=replay.load(args.from_file))
    path = control.resolve_socket(args.session, args.address)
    control.request(path, "ping", timeout=args.timeout)  # fail now, with the CLI's message
    if out is sys.stdout and not getattr(sys.modules["lightwork"], "BARE_PACKAGE", False):
        _become_lean(args, path)  # returns only if it could not
    if args.child:
        # Started by init(dashboard=True): the program's stdin line "sync" asks for a
        # last sync before its session closes, and the end of its stdin means the
        # program is gone (see launch.py); it then leaves on the child's schedule.
        return server.serve(path, args.port, args.allow_actions, args.open, None,
                            out=out, announce=False, on_start=_follow_parent,
                            follow_program=os.getppid())
    return server.serve(path, args.port, args.allow_actions, args.open, args.linger, out=out)


SERVE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_serve.py")
#: glibc's malloc tuned for a small threaded server (unless the user set these): one
#: arena for all threads (a ``ThreadingHTTPServer`` thread would get its own), and big
#: blocks (columns, sort orders) mapped and unmapped on their own instead of staying in
#: the heap after a free (the dynamic threshold would move them there). Measured with
#: 100,000 records and every view asked once: 24 MB of the process's growth, not 33 MB.
SERVE_MALLOC_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072",
                    "MALLOC_TRIM_THRESHOLD_": "131072"}


def serve_command(socket_path: str, port: int, *options: str) -> list[str]:
    """The command line of a dashboard process for the session at ``socket_path``."""
    return [sys.executable, SERVE_SCRIPT, "--address", socket_path, "--port", str(port),
            *options]


def serve_env() -> dict[str, str]:
    """The environment of a dashboard process."""
    env = dict(os.environ)
    env.pop("PYTHONSTARTUP", None)
    for key, value in SERVE_MALLOC_ENV.items():
        env.setdefault(key, value)
    return env


def _become_lean(args: Any, path: str) -> None:
    """``lightwork dashboard`` from a terminal: replace this process (which imported the
    runtime to parse the command line) with the lean dashboard process (``_serve``)."""
    options = ["--timeout", str(args.timeout)]
    options += ["--open"] if args.open else []
    options += ["--allow-actions"] if args.allow_actions else []
    options += ["--linger", str(args.linger)] if args.linger is not None else []
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, serve_command(path, args.port, *options), serve_env())
    except OSError:
        pass  # serve from this process instead


def serve_main(argv: list[str]) -> int:
    """``_serve.py``: the dashboard process's command line, and the CLI's error policy."""
    from lightwork.kernel import control

    parser = argparse.ArgumentParser(prog="lightwork dashboard")
    parser.add_argument("--session")
    parser.add_argument("--address")
    parser.add_argument("--timeout", type=float, default=10.0)
    _add_options(parser)
    args = parser.parse_args(argv)
    try:
        return run_command(args, sys.stdout)
    except control.ControlError as exc:
        print(f"lightwork: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError) as exc:
        print(f"lightwork: error: {exc}", file=sys.stderr)
        return 2


def _follow_parent(dashboard: Any) -> None:
    def follow() -> None:
        for line in sys.stdin:
            if line.strip() == "sync":
                # The program's last state; its records only if someone looks (no page
                # open: the counts and live picture, the driver packs no record).
                dashboard.sync_now(records=dashboard.active)
                print("synced", flush=True)
        dashboard.program_gone()  # EOF: the program closed the pipe, or it died

    threading.Thread(target=follow, daemon=True, name="lightwork-dashboard-parent").start()
