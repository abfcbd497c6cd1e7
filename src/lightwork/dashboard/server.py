"""The dashboard's web server: a process of its own, on loopback, behind a token.

    browser ──HTTP/SSE (127.0.0.1:PORT, token)──► dashboard process ──control socket──► driver
                                                  ┌─────────────────────────────┐
                                                  │ HTTP threads: read Mirror   │
                                                  │ sync thread: dashboard_sync │
                                                  │   about 1/s while a page is │
                                                  │   open, never when none is  │
                                                  └─────────────────────────────┘

Syncing: the sync thread asks the driver for what is new about once a second while the
server is *active*: a page (an event stream) is open, or a request came within
``IDLE_AFTER_S``. Otherwise it asks nothing at all, so the driver packs no record while
nobody looks (for ``lightwork dashboard`` and the child of ``init(dashboard=True)``
alike). The first request after such a pause takes a summary sync (no records) before
it is answered, so it shows the driver's cumulative counts (the totals, and the
history's and throughput's next point, right however long the pause was) and the live
picture, and wakes the sync thread, whose syncs bring the records still in the driver's
ring (those that left it meanwhile are counted and say so in a banner).

Standard library only (``http.server.ThreadingHTTPServer``): it imports in tens of
milliseconds and keeps the process near 20 MB, and the page needs nothing more than
JSON endpoints and Server-Sent Events (one long GET per open page, one update a second
at most).

Security, on by default:

* the socket is bound to 127.0.0.1 only;
* a 128-bit random token (``secrets.token_urlsafe(16)``) is made per server and printed
  in the URL (``/?token=...``). The first visit trades it for an ``HttpOnly;
  SameSite=Strict`` cookie (named after the port: cookies ignore ports) and is
  redirected to a URL without it. Every request, the page and its scripts included,
  needs the cookie or the token: none gets 401, a wrong one 403 (compared in constant
  time);
* the ``Host`` header must name 127.0.0.1, localhost or [::1] with this port, else 403:
  a DNS-rebinding page (``evil.example`` resolving to 127.0.0.1) is refused even before
  the token is looked at;
* no CORS header is ever sent, so no other origin can read a response; every response
  carries a strict Content-Security-Policy (scripts and styles from this server only),
  ``nosniff``, ``no-referrer`` and ``no-store``;
* nothing received is unpickled: the driver's answers are JSON and arrays of numbers;
* actions that change the program (cancel a task, kill an actor) answer 403 unless the
  server was started with ``allow_actions``. Then they are POST only, with a JSON body,
  an ``Origin`` of this server and the token. Only GET and POST exist (others: 405).

Another local user cannot attach: the control socket accepts only its owner's uid, and
the token is printed only to the terminal of who started the dashboard (never put on a
command line, where ``ps`` would show it).

The page keeps working after the program ends: the mirror keeps the last state and
every view says the session ended. That state is the final one: a dashboard started
from a terminal holds a connection on which the program says it is closing, and takes
a last sync on it (``_watch_end``; the program waits for it, briefly, see ``feed``); the
child of ``init(dashboard=True)`` gets its last sync from the program's ``shutdown()`` (a summary-only one, no records, if no page is
open then: counts and the last live picture). The stacks, objects and trace need the live driver
and say so. How long the server stays then depends on who started it:

* ``lightwork dashboard`` from a terminal is the user's own process: it serves the final
  state until Ctrl-C (or, with ``--linger S``, until no page was open for ``S`` seconds);
* the child of ``init(dashboard=True)`` (``follow_program``) must leave nothing behind:
  once the program is gone (its stdin pipe reached EOF, or its parent pid changed after
  a SIGKILL) it exits within ``NO_PAGE_EXIT_S`` when no page is open, and after
  ``PAGE_GRACE_S`` at most while one is; the page says when it will stop.
"""

from __future__ import annotations

import hmac
import http.server
import json
import os
import secrets
import sys
import threading
import time
import urllib.parse
from typing import Any

from lightwork.kernel import control
from lightwork.dashboard.mirror import Mirror
from lightwork.dashboard.wire import DEFAULT_MAX_RECORDS

DEFAULT_PORT = 8265  # Ray's dashboard port, so muscle memory works
PORT_TRIES = 20
SYNC_INTERVAL_S = 1.0
IDLE_AFTER_S = 10.0  # no page and no request for this long: stop syncing
IDLE_WAKE_S = 60.0  # the idle sync thread's turn when nothing wakes it (it asks nothing)
FIRST_LOOK_TIMEOUT_S = 2.0  # the summary sync of a request after a pause waits this long
END_WAIT_S = 20.0  # one dashboard_wait_end request (then asked again, same connection)
NO_PAGE_EXIT_S = 2.0  # a child whose program is gone, with no page open: exits this soon
PAGE_GRACE_S = 60.0  # ... with a page open: serves the final state this long at most
DRIVER_SHARE = 0.01  # space syncs so they take at most this share of the driver's time
MAX_BODY_BYTES = 10_000
STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class DashboardServer:
    """One dashboard: a mirror of one session, its sync thread and its HTTP server."""

    def __init__(self, socket_path: str | None, port: int = DEFAULT_PORT,
                 allow_actions: bool = False, linger_s: float | None = None,
                 mirror: Mirror | None = None,
                 follow_program: int | None = None) -> None:
        self.socket_path = socket_path
        # The pid of the program that started this dashboard (``init(dashboard=True)``),
        # whose end it follows; None for a dashboard the user started.
        self.program_pid = follow_program
        self.program_gone_at: float | None = None
        self.allow_actions = allow_actions
        self.linger_s = linger_s
        self.token = secrets.token_urlsafe(16)  # 128 random bits
        self.mirror = mirror or Mirror()  # given: a replay (``--from FILE``), no socket
        self.clients = 0  # open event streams (changed under _clients_lock)
        self._clients_lock = threading.Lock()
        # Set through ``requested``. A dashboard the user started counts as just asked
        # (a page is about to open); the child of init(dashboard=True) starts idle.
        self.last_request = time.monotonic() if follow_program is None else float("-inf")
        self.last_client = time.monotonic()
        self._stop = threading.Event()
        self._sync_lock = threading.Lock()
        self._wake = threading.Event()
        self._cache: dict[str, tuple[float, Any]] = {}
        self._last_sync_at = 0.0
        self.sync_turns = 0  # turns of the sync loop (tests wait on it instead of sleeping)
        self._horizon_s = float("inf")
        self.httpd = _bind(port)
        self.port = self.httpd.server_address[1]
        self.httpd.dashboard = self  # type: ignore[attr-defined]
        self.allowed_hosts = {f"{h}:{self.port}" for h in ("127.0.0.1", "localhost", "[::1]")}
        self.allowed_origins = {f"http://{host}" for host in self.allowed_hosts}
        self.cookie_name = f"lightwork_dashboard_{self.port}"
        self._sync_thread = threading.Thread(target=self._sync_loop, daemon=True,
                                             name="lightwork-dashboard-sync")
        # A dashboard started from a terminal waits for the program's end on a connection
        # of its own, for a final sync (the child of init gets its own from the program).
        self._end_thread = threading.Thread(target=self._watch_end, daemon=True,
                                            name="lightwork-dashboard-end")
        self._end_channel: control.Channel | None = None
        self.watcher = secrets.token_hex(8)  # this dashboard's name for the program
        self._serve_thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/?token={self.token}"

    # ---------------------------------------------------------------- lifetime
    def start(self) -> DashboardServer:
        """Sync once (so the first page has data: the child of ``init(dashboard=True)``,
        which no page looks at yet, takes a summary), then serve in background threads."""
        self.sync_now(records=self.program_pid is None)
        self._sync_thread.start()
        if self.socket_path is not None and self.program_pid is None:
            self._end_channel = self._register_for_the_end()
            if self._end_channel is not None:
                self._end_thread.start()
        self._serve_thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                              name="lightwork-dashboard-http")
        self._serve_thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._end_channel is not None and not self.mirror.ended:
            try:  # the program need not wait for this dashboard's final sync any more
                control.request(self.socket_path or "", "dashboard_end_seen",
                                {"watcher": self.watcher}, timeout=2.0)
            except (control.ControlError, OSError, ValueError):
                pass
        self.httpd.shutdown()
        self.httpd.server_close()

    def wait(self) -> None:
        """Block until stopped, or until it is time to leave (:meth:`time_to_leave`)."""
        while not self._stop.wait(0.5):
            if self.time_to_leave():
                break

    def time_to_leave(self) -> bool:
        """Whether the server should exit now (see the module docstring)."""
        now = time.monotonic()
        if self.program_pid is not None:
            if self.program_gone_at is None and os.getppid() != self.program_pid:
                self.program_gone()  # killed: the child was handed to another parent
            if self.program_gone_at is None:
                return False
            if now - self.program_gone_at > PAGE_GRACE_S:
                return True
            last_look = max(self.last_client, self.last_request, self.program_gone_at)
            return self.clients == 0 and now - last_look > NO_PAGE_EXIT_S
        return (self.linger_s is not None and self.mirror.ended and self.clients == 0
                and now - max(self.last_client, self.last_request) > self.linger_s)

    def program_gone(self) -> None:
        """The program that started this dashboard ended or died: keep its final state,
        say when this server stops, and let :meth:`wait` return on that schedule."""
        if self.program_gone_at is not None:
            return
        self.program_gone_at = time.monotonic()
        self.mirror.mark_ended(
            f"the program ended; this dashboard was started with it and stops within "
            f"{PAGE_GRACE_S:g} s (download the trace now to keep it; `lightwork dashboard "
            f"--from FILE` replays it)", replace=True)
        self._wake.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def active(self) -> bool:
        """Whether someone looks: a page is open, or a request came lately (then the sync
        thread syncs about once a second; otherwise it asks the driver nothing)."""
        return self.clients > 0 or time.monotonic() - self.last_request < IDLE_AFTER_S

    def requested(self) -> None:
        """A request came (the handler, once its token checked). The first after a pause
        takes a summary sync before it is answered (the totals and the live picture, no
        record: milliseconds), so its answer is current, and wakes the sync thread for
        the records."""
        was_active = self.active
        self.last_request = time.monotonic()
        if not was_active:
            self.sync_now(records=False, timeout=FIRST_LOOK_TIMEOUT_S)
            self._wake.set()

    def page_opened(self) -> None:
        with self._clients_lock:
            self.clients += 1
        self._wake.set()  # a page opened: sync now rather than at the idle pace

    def sync_soon(self) -> None:
        self._wake.set()

    def page_closed(self) -> None:
        with self._clients_lock:
            self.clients -= 1
        self.last_client = time.monotonic()

    # ---------------------------------------------------------------- syncing
    def sync_now(self, records: bool = True, timeout: float = 10.0) -> bool:
        """Bring the mirror up to date; False when the session has ended. Without
        ``records``, only the counts and the live picture (the driver packs no record)."""
        if self.mirror.ended or self.socket_path is None:
            return False
        with self._sync_lock:
            try:
                total = 0
                with control.Channel(self.socket_path) as channel:
                    while True:
                        reply, attached = channel.ask("dashboard_sync", {
                            "task_cursor": self.mirror.task_cursor,
                            "span_cursor": self.mirror.span_cursor,
                            "max_records": DEFAULT_MAX_RECORDS if records else 0,
                        }, timeout=timeout)
                        count = self.mirror.apply(reply, attached)
                        total += count
                        if count < DEFAULT_MAX_RECORDS or self._stop.is_set():
                            self._note_rate(total)
                            return True
            except control.NotAnsweringError:
                return True  # busy driver: try again later
            except (control.ControlError, OSError, ValueError) as exc:
                if os.path.exists(self.socket_path) and not isinstance(exc, control.NoSessionError):
                    return True
                self.mirror.mark_ended("the program ended (its session closed)")
                return False

    def _register_for_the_end(self) -> control.Channel | None:
        """Open the connection the program will say it is closing on, and register this
        dashboard there before ``start`` returns (so a program that ends at once still
        waits for its final sync). None if the program cannot (it ended, or predates it)."""
        try:
            channel = control.Channel(self.socket_path or "", END_WAIT_S + 10)
        except (control.ControlError, OSError):
            return None
        try:
            answer, _ = channel.ask("dashboard_wait_end",
                                    {"timeout": 0.001, "watcher": self.watcher})
        except (control.ControlError, OSError, ValueError):
            channel.close()
            return None
        if answer.get("closing"):
            self._final_sync(channel)
            channel.close()
            return None
        return channel

    def _watch_end(self) -> None:
        """Wait on the registered connection for the program to say it is closing; then
        take the final sync on it (``feed``'s "the session's end")."""
        channel = self._end_channel
        while channel is not None and not (self._stop.is_set() or self.mirror.ended):
            try:
                answer, _ = channel.ask("dashboard_wait_end",
                                        {"timeout": END_WAIT_S, "watcher": self.watcher},
                                        timeout=END_WAIT_S + 10)
                if answer.get("closing"):
                    self._final_sync(channel)
                    break
            except control.NotAnsweringError:
                # A driver busy for long: ask again on a new connection (the old one may
                # still carry an answer).
                channel.close()
                try:
                    channel = control.Channel(self.socket_path or "", END_WAIT_S + 10)
                except (control.ControlError, OSError):
                    channel = None
            except (control.ControlError, OSError, ValueError):
                break  # the session is gone: the sync loop says so
        if channel is not None:
            channel.close()

    def _final_sync(self, channel: control.Channel) -> None:
        with self._sync_lock:
            try:
                while True:
                    reply, attached = channel.ask("dashboard_sync", {
                        "task_cursor": self.mirror.task_cursor,
                        "span_cursor": self.mirror.span_cursor,
                    }, timeout=10.0)
                    count = self.mirror.apply(reply, attached)
                    if count < DEFAULT_MAX_RECORDS:
                        break
                channel.ask("dashboard_end_seen", {"watcher": self.watcher}, timeout=5.0)
            except (control.ControlError, OSError, ValueError):
                return  # no final state after all: the sync loop marks the end
        self.mirror.mark_ended(
            "the program exited and its last records were read as it closed", replace=True)

    def _note_rate(self, records: int) -> None:
        """How soon the driver's ring would overflow at the rate records just arrived."""
        now = time.monotonic()
        if self._last_sync_at and records:
            rate = records / max(1e-3, now - self._last_sync_at)
            self._horizon_s = 0.5 * self.mirror.budget / rate
        self._last_sync_at = now

    def _sync_loop(self) -> None:
        while not self._stop.is_set():
            if self.active:
                # Spaced so a sync's fixed part takes at most DRIVER_SHARE of the driver's
                # time (its records cost the same however far apart), but never so far
                # apart that the driver's ring overflows before the next one.
                fixed = self.mirror.driver_fixed_cost_s
                interval = max(SYNC_INTERVAL_S, min(fixed / DRIVER_SHARE, self._horizon_s))
                self._wake.wait(interval)
            else:
                self._wake.wait(IDLE_WAKE_S)  # nobody looks: a request or a page wakes it
            self._wake.clear()
            if not (self._stop.is_set() or self.mirror.ended) and self.active:
                self.sync_now()
            self.sync_turns += 1

    # ---------------------------------------------------------------- driver queries
    def ask(self, op: str, args: dict[str, Any] | None = None, timeout: float = 10.0,
            cache_s: float = 0.0) -> Any:
        """A one-off control request (stacks, objects, trace); cached ``cache_s`` seconds."""
        key = json.dumps([op, args], sort_keys=True)
        cached = self._cache.get(key)
        if cached is not None and time.monotonic() - cached[0] < cache_s:
            return cached[1]
        if self.mirror.ended or self.socket_path is None:
            if cached is not None:
                return cached[1]
            raise SessionEnded("the program ended: this view needs the running program")
        try:
            result = control.request(self.socket_path, op, args or {}, timeout=timeout)
        except control.NoSessionError:
            self.mirror.mark_ended("the program ended (its session closed)")
            if cached is not None:
                return cached[1]
            raise SessionEnded("the program ended: this view needs the running program") from None
        if cache_s > 0:  # never keep what is not reused (a trace can be large)
            self._cache[key] = (time.monotonic(), result)
        return result


class SessionEnded(RuntimeError):
    """A view needs the live driver, and the program has ended."""


def _bind(port: int) -> http.server.ThreadingHTTPServer:
    from lightwork.dashboard.handler import Handler

    tries = PORT_TRIES if port == DEFAULT_PORT else 1
    for attempt in range(tries):
        try:
            httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port + attempt), Handler)
        except OSError:
            if attempt == tries - 1:
                raise
            continue
        httpd.daemon_threads = True
        return httpd
    raise OSError(f"no free port from {port}")  # pragma: no cover - the loop raises first


def serve(socket_path: str | None, port: int = DEFAULT_PORT, allow_actions: bool = False,
          open_browser: bool = False, linger_s: float | None = None,
          out: Any = None, announce: bool = True,
          on_start: Any = None, mirror: Mirror | None = None,
          follow_program: int | None = None) -> int:
    """Run a dashboard until Ctrl-C (or, with ``linger_s``, until the session ended and no
    page was open for that long; with ``follow_program``, on the child's schedule of the
    module docstring). Prints the URL first. Without a socket, ``mirror`` is a replay of
    a timeline file."""
    out = out or sys.stdout
    server = DashboardServer(socket_path, port, allow_actions, linger_s, mirror,
                             follow_program).start()
    if on_start is not None:
        on_start(server)
    if announce:
        print(f"lightwork dashboard of session {server.mirror.session}: {server.url}",
              file=out, flush=True)
        if server.allow_actions:
            print("actions are ON: the page can cancel tasks and kill actors", file=out,
                  flush=True)
    else:
        print(server.url, file=out, flush=True)
    if open_browser:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def parse_query(path: str) -> tuple[str, dict[str, str]]:
    parsed = urllib.parse.urlsplit(path)
    query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query, keep_blank_values=True).items()}
    return parsed.path, query


def same_token(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())
