"""The live dashboard: watch a running program in a browser.

    lightwork dashboard [--session NAME] [--port N] [--open] [--allow-actions]
    lightwork dashboard --from FILE        # replay a saved timeline (a post-mortem)
    lightwork.init(dashboard=True)          # or include_dashboard=True, Ray's argument

Pieces (each module's docstring has its design):

* ``feed`` — in the watched program (``register_control_ops`` hooks it into the control
  socket at ``init``): answers the incremental ``dashboard_sync`` (new task records as binary columns, live picture), about once a
  second while a page is open and never when none is;
* ``mirror`` — in the dashboard process: the session's copy, and every view's query
  (task stream, tasks table paged and sorted on the server, per-function summary);
* ``server`` and ``handler`` — the HTTP server (standard library), its security (loopback,
  token, Host check, no CORS, opt-in actions) and its routes, with Server-Sent Events;
* ``launch`` — the child process ``init(dashboard=True)`` starts;
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

__all__ = ["add_command", "register_control_ops", "run_command"]

#: The control socket's operations this package answers in the watched program.
CONTROL_OPS = ("dashboard_sync", "dashboard_cancel", "dashboard_kill")


def register_control_ops() -> None:
    """Register the dashboard's operations with the control socket (``init`` calls this;
    ``_runtime`` never imports this package). The feed is imported on the first request."""
    from lightwork._runtime import control

    control.register_ops(CONTROL_OPS, _answer_control_op)


def _answer_control_op(node: Any, op: str, args: dict[str, Any]) -> Any:
    from lightwork.dashboard import feed

    return feed.dispatch(node, op, args)


def add_command(commands: Any, attach: argparse.ArgumentParser) -> None:
    """The ``lightwork dashboard`` verb, for ``cli.build_parser``."""
    from lightwork.dashboard.server import DEFAULT_PORT

    parser = commands.add_parser("dashboard", parents=[attach],
                                 help="serve a live dashboard of the session in a browser")
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
    from lightwork._runtime import control
    from lightwork.dashboard import launch, server

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
    pinged = control.request(path, "ping", timeout=args.timeout)  # fail now, with the CLI's message
    if isinstance(pinged, dict) and pinged.get("backend") == "distributed":
        raise control.ControlError(
            f"session {pinged.get('session')} runs on the distributed backend, where "
            "lightwork's live dashboard is not supported: open the Dask dashboard, and use "
            "`lightwork status`, `list`, `summary`, `timeline` and `stack` for lightwork's views")
    if args.child:
        # Started by init(dashboard=True): the program's stdin line "sync" asks for a
        # last sync before its session closes, and the end of its stdin means the
        # program is gone (see launch.py); it then leaves on the child's schedule.
        return server.serve(path, args.port, args.allow_actions, args.open, None,
                            idle_sync_s=launch.IDLE_SYNC_S, out=out, announce=False,
                            on_start=_follow_parent, follow_program=os.getppid())
    return server.serve(path, args.port, args.allow_actions, args.open, args.linger, out=out)


def _follow_parent(dashboard: Any) -> None:
    def follow() -> None:
        for line in sys.stdin:
            if line.strip() == "sync":
                dashboard.sync_now()
                print("synced", flush=True)
        dashboard.program_gone()  # EOF: the program closed the pipe, or it died

    threading.Thread(target=follow, daemon=True, name="lightwork-dashboard-parent").start()
