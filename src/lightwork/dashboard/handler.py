"""The dashboard's HTTP routes, each behind the checks of ``server.py``'s docstring.

=====================================  ==================================================
GET  /                                 the page (``static/index.html``)
GET  /static/NAME                      its script and style sheet (shipped in the package)
GET  /api/overview                     resources, workers, tasks by state over time, ...
GET  /api/stream?window=S              the task stream of the last S seconds
GET  /api/tasks?state=&name=&worker=   one page of the tasks table, filtered and sorted
     &sort=&order=asc|desc&page=&page_size=   on the server (at most 200 rows)
GET  /api/functions                    per function: counts by state, p50/p95, queued
GET  /api/actors                       every actor: state, restarts, calls, death cause
GET  /api/objects                      ``memory_summary()`` (live program only)
GET  /api/stacks?target=all|driver|ID  ``lightwork.stack()`` text (live program only)
GET  /api/logs?task=ID                 what one task printed, as the driver kept it
                                       (``lightwork logs --task``; live program only)
GET  /api/profile?seconds=S            S seconds of stack samples of every task, as call
                                      trees per task function (live program only)
GET  /api/trace                        the Chrome/Perfetto trace JSON, as a download
GET  /api/events?view=V&...            Server-Sent Events: the overview plus view V
                                       (its parameters as above), about once a second
POST /api/actions/cancel {task_id}     with ``--allow-actions`` only
POST /api/actions/kill {actor_id}      with ``--allow-actions`` only
=====================================  ==================================================

Errors are JSON ``{"error": message}`` with a status that says whose fault it was: 400
for a bad parameter, 401/403 for the checks, 404, 405, 410 when a view needs the
running program and it ended, 502 when the driver answered with an error.
"""

from __future__ import annotations

import http.server
import json
import os
import time
from typing import Any

from lightwork.kernel import control
from lightwork.dashboard.server import (
    MAX_BODY_BYTES,
    SECURITY_HEADERS,
    STATIC_DIR,
    STATIC_TYPES,
    DashboardServer,
    SessionEnded,
    parse_query,
    same_token,
)

EVENT_INTERVAL_S = 1.0  # at most one update a second per open view
ENDED_EVENT_INTERVAL_S = 5.0
# Stacks are not pushed: each dump signals every worker, so only a click asks for one.
PUSHED_VIEWS = ("overview", "stream", "tasks", "functions", "actors", "objects")


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "lightwork-dashboard"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    @property
    def dashboard(self) -> DashboardServer:
        return self.server.dashboard  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        return  # the terminal shows the URL, not a line per request

    # ---------------------------------------------------------------- methods
    def do_GET(self) -> None:
        self._handle("GET")

    def do_HEAD(self) -> None:
        self._refuse_method()

    def do_POST(self) -> None:
        self._handle("POST")

    def _refuse_method(self) -> None:
        self._send_json(405, {"error": f"{self.command} is not allowed; the dashboard answers "
                                       "GET, and POST for actions"}, extra={"Allow": "GET, POST"})

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _refuse_method

    def _handle(self, method: str) -> None:
        dashboard = self.dashboard
        path, query = parse_query(self.path)
        try:
            self._check_host()
            cookie_set = self._check_token(query)
            dashboard.requested()
            if method == "POST":
                self._post(path)
                return
            if "token" in query and cookie_set:
                # Trade the token in the URL for the cookie, and drop it from the address bar.
                self.send_response(303)
                self._common_headers()
                self.send_header("Set-Cookie", cookie_set)
                self.send_header("Location", path or "/")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._get(path, query)
        except HttpError as exc:
            self._send_json(exc.status, {"error": str(exc)})
        except SessionEnded as exc:
            self._send_json(410, {"error": str(exc)})
        except (ValueError, TypeError) as exc:
            self._send_json(400, {"error": str(exc)})
        except control.ControlError as exc:
            self._send_json(502, {"error": f"the program's driver answered: {exc}"})
        except (BrokenPipeError, ConnectionResetError):
            return  # the browser went away

    # ---------------------------------------------------------------- checks
    def _check_host(self) -> None:
        host = self.headers.get("Host", "")
        if host not in self.dashboard.allowed_hosts:
            raise HttpError(403, f"Host {host!r} is not this dashboard's address: open it as "
                                 f"http://127.0.0.1:{self.dashboard.port}/ (DNS-rebinding guard)")

    def _check_token(self, query: dict[str, str]) -> str | None:
        """Pass, or raise 401/403; return a Set-Cookie value when the URL had the token."""
        dashboard = self.dashboard
        given = query.get("token")
        if given is not None:
            if not same_token(given, dashboard.token):
                raise HttpError(403, "wrong token: use the URL the dashboard printed")
            return (f"{dashboard.cookie_name}={dashboard.token}; HttpOnly; SameSite=Strict; "
                    "Path=/")
        cookie = self._cookie(dashboard.cookie_name)
        if cookie is None:
            raise HttpError(401, "this dashboard needs its token: open the URL it printed "
                                 "(http://127.0.0.1:PORT/?token=...)")
        if not same_token(cookie, dashboard.token):
            raise HttpError(403, "wrong token (an old cookie?): open the URL the dashboard printed")
        return None

    def _cookie(self, name: str) -> str | None:
        for header in self.headers.get_all("Cookie") or []:
            for part in header.split(";"):
                key, _, value = part.strip().partition("=")
                if key == name:
                    return value
        return None

    # ---------------------------------------------------------------- GET
    def _get(self, path: str, query: dict[str, str]) -> None:
        dashboard = self.dashboard
        if path in ("/", "/index.html"):
            self._send_static("index.html")
        elif path.startswith("/static/"):
            self._send_static(path[len("/static/"):])
        elif path == "/api/events":
            self._events(query)
        elif path == "/api/trace":
            self._trace()
        elif path.startswith("/api/"):
            self._send_json(200, view(dashboard, path[len("/api/"):], query))
        elif path == "/favicon.ico":
            self._send(204, b"", "text/plain")
        else:
            raise HttpError(404, f"no page {path!r} here; the dashboard is at /")

    def _send_static(self, name: str) -> None:
        if "/" in name or name.startswith(".") or os.path.splitext(name)[1] not in STATIC_TYPES:
            raise HttpError(404, f"no file {name!r}")
        try:
            with open(os.path.join(STATIC_DIR, name), "rb") as f:
                body = f.read()
        except FileNotFoundError:
            raise HttpError(404, f"no file {name!r}") from None
        self._send(200, body, STATIC_TYPES[os.path.splitext(name)[1]])

    def _trace(self) -> None:
        from lightwork.diagnostics.timeline import build_trace

        data = self.dashboard.ask("timeline_data", timeout=60.0)
        trace = {"traceEvents": build_trace(data), "displayTimeUnit": "ms",
                 "otherData": {"generator": "lightwork dashboard", "session": data.get("session"),
                               "started_at_unix_s": data.get("base_wall"),
                               "event_budget": data.get("budget"),
                               "dropped": data.get("dropped", {}),
                               "findings": data.get("findings", []),
                               "advisor_input": data.get("advisor_input")}}
        body = json.dumps(trace, separators=(",", ":")).encode()
        name = f"lightwork-{data.get('session', 'session')}-trace.json"
        self._send(200, body, "application/json",
                   extra={"Content-Disposition": f'attachment; filename="{name}"'})

    def _events(self, query: dict[str, str]) -> None:
        """Server-Sent Events: the overview and the chosen view, when they changed."""
        dashboard = self.dashboard
        name = query.get("view", "stream")
        if name not in PUSHED_VIEWS:
            raise HttpError(400, f"view {name!r} is not pushed; choose one of "
                                 f"{', '.join(PUSHED_VIEWS)} (stacks are fetched on demand)")
        view(dashboard, name, query)  # a bad parameter fails now, as a 400
        self.send_response(200)
        self._common_headers()
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        dashboard.page_opened()
        try:
            sent_generation = -1
            last_sent = 0.0
            while not dashboard.stopped:
                mirror = dashboard.mirror
                now = time.monotonic()
                interval = ENDED_EVENT_INTERVAL_S if mirror.ended else EVENT_INTERVAL_S
                if mirror.generation != sent_generation or now - last_sent >= interval * 5:
                    payload = {"overview": view(dashboard, "overview", query)}
                    if name != "overview":
                        try:
                            payload[name] = view(dashboard, name, query)
                        except SessionEnded as exc:
                            payload[name] = {"error": str(exc)}
                    sent_generation, last_sent = payload["overview"]["generation"], now
                    data = json.dumps(payload, separators=(",", ":"))
                    self.wfile.write(f"event: update\ndata: {data}\n\n".encode())
                else:
                    self.wfile.write(b": still here\n\n")  # finds a closed page within a second
                self.wfile.flush()
                time.sleep(interval)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        finally:
            dashboard.page_closed()

    # ---------------------------------------------------------------- POST
    def _post(self, path: str) -> None:
        dashboard = self.dashboard
        if not dashboard.allow_actions or dashboard.socket_path is None:
            raise HttpError(403, "actions are off; restart the dashboard with --allow-actions "
                                 "to cancel tasks and kill actors from the page")
        origin = self.headers.get("Origin")
        if origin not in dashboard.allowed_origins:
            raise HttpError(403, f"cross-origin request refused (Origin {origin!r}); actions "
                                 "come only from the dashboard's own page")
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            raise HttpError(415, "actions take a JSON body (Content-Type: application/json)")
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY_BYTES:
            raise HttpError(400, f"an action's body is 1 to {MAX_BODY_BYTES} bytes of JSON")
        body = json.loads(self.rfile.read(length))
        socket_path = dashboard.socket_path
        if not isinstance(body, dict):
            raise HttpError(400, "an action's body is a JSON object")
        if path == "/api/actions/cancel":
            task_id = body.get("task_id")
            if isinstance(task_id, bool) or not isinstance(task_id, int):
                raise HttpError(400, f"task_id must be an integer, got {task_id!r}")
            result = control.request(socket_path, "dashboard_cancel",
                                     {"task_id": task_id, "force": bool(body.get("force")),
                                      "allow_actions": dashboard.allow_actions})
        elif path == "/api/actions/kill":
            actor_id = body.get("actor_id")
            if not isinstance(actor_id, str):
                raise HttpError(400, f"actor_id must be the actor's hex id, got {actor_id!r}")
            result = control.request(socket_path, "dashboard_kill",
                                     {"actor_id": actor_id, "allow_actions": dashboard.allow_actions})
        else:
            raise HttpError(404, f"no action {path!r}; actions are /api/actions/cancel and "
                                 "/api/actions/kill")
        dashboard.sync_soon()
        self._send_json(200, result)

    # ---------------------------------------------------------------- responses
    def _common_headers(self) -> None:
        for key, value in SECURITY_HEADERS.items():
            self.send_header(key, value)

    def _send(self, status: int, body: bytes, content_type: str,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self._common_headers()
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: int, payload: Any, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(payload, separators=(",", ":"), default=str).encode()
        try:
            self._send(status, body, "application/json", extra)
        except (BrokenPipeError, ConnectionResetError):
            pass


def view(dashboard: DashboardServer, name: str, query: dict[str, str]) -> dict[str, Any]:
    """One view's JSON, from the mirror (or the live driver for stacks and objects)."""
    mirror = dashboard.mirror
    if name == "overview":
        return {**mirror.overview(_float(query, "history", 300.0)),
                "actions": dashboard.allow_actions}
    if name == "stream":
        return mirror.stream(_float(query, "window", 30.0))
    if name == "tasks":
        return mirror.tasks(
            state=query.get("state", ""), name=query.get("name", ""),
            worker=query.get("worker", ""), sort=query.get("sort", "submitted"),
            descending=query.get("order", "desc") != "asc", page=_int(query, "page", 0),
            page_size=_int(query, "page_size", 100))
    if name == "functions":
        return mirror.function_summary()
    if name == "actors":
        return mirror.actor_view()
    if name == "objects":
        summary = dashboard.ask("memory_summary", cache_s=2.0)
        return {**mirror.header(), **summary}
    if name == "stacks":
        return {**mirror.header(), **_stacks(dashboard, query.get("target", "all"))}
    if name == "profile":
        return {**mirror.header(), **_profile(dashboard, _float(query, "seconds", 2.0))}
    if name == "logs":
        task = query.get("task", "")
        if not task:
            raise HttpError(400, "name the task: /api/logs?task=ID (an id of the tasks view)")
        return {**mirror.header(), **dashboard.ask("logs", {"task": task}, cache_s=1.0)}
    raise HttpError(404, f"no view {name!r}; views: overview, stream, tasks, functions, actors, "
                         "objects, stacks, profile, logs")


PROFILE_MAX_S = 10.0  # one request's sampling: the page asks again while it is open


def _profile(dashboard: DashboardServer, seconds: float) -> dict[str, Any]:
    """``seconds`` of the session's stack samples (the task profiler's ``sample``), as
    call trees: one for all tasks and one per task function (the page adds them up)."""
    from lightwork.diagnostics.task_profiler import TaskProfile

    if seconds > PROFILE_MAX_S:
        raise HttpError(400, f"seconds must be at most {PROFILE_MAX_S:g}, got {seconds:g}")
    try:
        data = dashboard.ask("sample", {"seconds": seconds}, timeout=seconds + 15.0)
    except (control.ControlError, ValueError) as exc:
        if "already running" in str(exc):
            raise HttpError(409, "another task profile is running in this session (another "
                                 "page's Profile view, profile_tasks() or `lightwork "
                                 "profile`): this view samples once it ends") from None
        raise
    profile = TaskProfile(data)
    return {"hz": profile.hz, "seconds": profile.duration, "samples": profile.total,
            "workers": sorted(profile.workers), "trees": profile.trees()}


def _stacks(dashboard: DashboardServer, target: str) -> dict[str, Any]:
    from lightwork.diagnostics.stack import format_stacks

    data = dashboard.ask("stacks", {"timeout": 2.0}, timeout=15.0, cache_s=1.0)
    if target == "all":
        chosen = data
    elif target == "driver":
        chosen = {**data, "workers": []}
    else:
        try:
            worker_id = int(target)
        except ValueError:
            raise HttpError(400, f"target must be all, driver or a worker id, got {target!r}") \
                from None
        workers = [w for w in data["workers"] if w["worker_id"] == worker_id]
        if not workers:
            raise HttpError(404, f"no live worker {worker_id}; pick one from the overview")
        chosen = {**data, "workers": workers}
    text = format_stacks(chosen)
    if target not in ("all", "driver"):  # the driver's part is noise for one worker
        text = text[text.find("=== worker"):] if "=== worker" in text else text
    return {"target": target, "text": text,
            "targets": ["all", "driver"] + [str(w["worker_id"]) for w in data["workers"]]}


def _int(query: dict[str, str], key: str, default: int) -> int:
    value = query.get(key)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise HttpError(400, f"{key} must be an integer, got {value!r}") from None


def _float(query: dict[str, str], key: str, default: float) -> float:
    value = query.get(key)
    if value in (None, ""):
        return default
    try:
        number = float(value)
    except ValueError:
        raise HttpError(400, f"{key} must be a number, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise HttpError(400, f"{key} must be a positive number of seconds, got {value!r}")
    return number
