"""The live dashboard: its JSON endpoints, its security, and the session's end.

A module-scoped 2-CPU runtime runs a few tasks and an actor; dashboards are served from
this process (threads) and read the runtime through its control socket, as the real
dashboard process does. Requests go through ``http.client`` so each test sets exactly
the headers it means (Host, Origin, Cookie).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Any

from tests import helpers, support
import pytest

import lightwork
from lightwork.dashboard import CONTROL_OPS, feed
from lightwork.dashboard.mirror import Mirror
from lightwork.dashboard.server import DashboardServer

pytestmark = pytest.mark.lightwork_only


@lightwork.remote
def square(x: int) -> int:
    return x * x


@lightwork.remote
def broken() -> None:
    raise KeyError("on purpose")


@lightwork.remote
def parked(path: str) -> bool:
    while not os.path.exists(path):
        time.sleep(0.02)
    return True


@lightwork.remote
def chatty() -> int:
    print("said by chatty")
    print("warned by chatty", file=sys.stderr)
    return 1


@lightwork.remote
class Tally:
    def add(self, n: int) -> int:
        return n


@pytest.fixture(scope="module")
def runtime():
    if lightwork.is_initialized():
        lightwork.shutdown()
    lightwork.init(num_cpus=2, resources={"scanner": 3})  # a custom resource too
    tally = Tally.remote()
    lightwork.get([square.remote(i) for i in range(20)] + [tally.add.remote(1)])
    with pytest.raises(KeyError):
        lightwork.get(broken.remote())
    for i in range(3):  # a get in a loop: a staircase on the driver's row
        lightwork.get(square.remote(i))
    said = chatty.remote()
    lightwork.get(said)
    yield {"node": support.driver_node(), "tally": tally, "chatty": support.task_id_of(said)}
    lightwork.shutdown()


@pytest.fixture(scope="module")
def dashboard(runtime):
    server = DashboardServer(runtime["node"].control.path, port=0).start()
    yield server
    server.stop()


class Client:
    """Requests with chosen headers; ``cookie`` is sent when set."""

    def __init__(self, server: DashboardServer, cookie: str | None = None) -> None:
        self.server = server
        self.cookie = cookie

    def request(self, path: str, method: str = "GET", headers: dict[str, str] | None = None,
                body: bytes | None = None, host: str | None = None) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=20)
        sent = {"Host": host if host is not None else f"127.0.0.1:{self.server.port}"}
        if self.cookie:
            sent["Cookie"] = f"{self.server.cookie_name}={self.cookie}"
        sent.update(headers or {})
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for key, value in sent.items():
            conn.putheader(key, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        response.data = response.read()  # type: ignore[attr-defined]
        conn.close()
        return response

    def json(self, path: str) -> Any:
        response = self.request(path)
        assert response.status == 200, (path, response.status, response.data)
        return json.loads(response.data)


@pytest.fixture
def client(dashboard) -> Client:
    dashboard.sync_now()
    return Client(dashboard, cookie=dashboard.token)


# ---------------------------------------------------------------------------- security
def test_listens_on_loopback_only_with_a_128_bit_token(dashboard):
    assert dashboard.httpd.server_address[0] == "127.0.0.1"
    assert len(base64.urlsafe_b64decode(dashboard.token + "==")) == 16
    assert dashboard.url == f"http://127.0.0.1:{dashboard.port}/?token={dashboard.token}"
    other = DashboardServer(dashboard.socket_path, port=0)
    try:
        assert other.token != dashboard.token
    finally:
        other.httpd.server_close()


@pytest.mark.parametrize("path", ["/", "/static/dashboard.js", "/api/overview", "/api/trace",
                                  "/api/events?view=overview"])
def test_every_request_needs_the_token(dashboard, path):
    response = Client(dashboard).request(path)
    assert response.status == 401
    assert "token" in json.loads(response.data)["error"]
    wrong = Client(dashboard, cookie="not-the-token").request(path)
    assert wrong.status == 403


def test_the_token_in_the_url_becomes_a_strict_httponly_cookie(dashboard):
    response = Client(dashboard).request(f"/?token={dashboard.token}")
    assert response.status == 303
    assert response.getheader("Location") == "/"
    cookie = response.getheader("Set-Cookie")
    assert cookie.startswith(f"{dashboard.cookie_name}={dashboard.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert Client(dashboard).request("/?token=wrong").status == 403
    page = Client(dashboard, cookie=dashboard.token).request("/")
    assert page.status == 200 and b"lightwork dashboard" in page.data
    assert "script-src 'self'" in page.getheader("Content-Security-Policy")


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1",
                                  "127.0.0.1:1", "localhost:{other}", ""])
def test_a_foreign_host_header_is_refused_even_with_the_token(dashboard, host):
    host = host.format(port=dashboard.port, other=dashboard.port + 1)
    response = Client(dashboard, cookie=dashboard.token).request("/api/overview", host=host)
    assert response.status == 403
    assert "Host" in json.loads(response.data)["error"]


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}"])
def test_loopback_host_names_are_accepted(dashboard, host):
    response = Client(dashboard, cookie=dashboard.token).request(
        "/api/overview", host=host.format(port=dashboard.port))
    assert response.status == 200


def test_no_cors_headers_and_only_get_and_post(client):
    response = client.request("/api/overview", headers={"Origin": "http://evil.example"})
    assert response.status == 200
    assert not [h for h in response.headers if h.lower().startswith("access-control")]
    for method in ("OPTIONS", "DELETE", "PUT", "PATCH"):
        refused = client.request("/api/overview", method=method,
                                 headers={"Origin": "http://evil.example"})
        assert refused.status == 405, method
        assert not [h for h in refused.headers if h.lower().startswith("access-control")]


def test_actions_are_off_by_default(client, runtime):
    body = json.dumps({"actor_id": runtime["tally"]._ref.hex()}).encode()
    response = client.request("/api/actions/kill", "POST", body=body, headers={
        "Origin": f"http://127.0.0.1:{client.server.port}", "Content-Type": "application/json"})
    assert response.status == 403
    assert "--allow-actions" in json.loads(response.data)["error"]
    assert lightwork.get(runtime["tally"].add.remote(2)) == 2  # still alive


def test_actions_need_the_origin_and_the_token_then_cancel_and_kill(runtime, tmp_path):
    server = DashboardServer(runtime["node"].control.path, port=0, allow_actions=True).start()
    try:
        origin = f"http://127.0.0.1:{server.port}"
        gate = str(tmp_path / "gate")
        ref = parked.remote(gate)
        server.sync_now()
        task_id = next(r[0] for r in server.mirror.live["rows"] if r[1].endswith("parked"))
        # force: the task is running a loop; a polite cancel may wait for a check point.
        body = json.dumps({"task_id": task_id, "force": True}).encode()
        json_type = {"Content-Type": "application/json"}
        with_token = Client(server, cookie=server.token)
        cross = with_token.request("/api/actions/cancel", "POST", body=body,
                                   headers={"Origin": "http://evil.example", **json_type})
        assert cross.status == 403 and "cross-origin" in json.loads(cross.data)["error"]
        no_origin = with_token.request("/api/actions/cancel", "POST", body=body, headers=json_type)
        assert no_origin.status == 403
        no_token = Client(server).request("/api/actions/cancel", "POST", body=body,
                                          headers={"Origin": origin, **json_type})
        assert no_token.status == 401
        as_form = with_token.request("/api/actions/cancel", "POST", body=b"task_id=1", headers={
            "Origin": origin, "Content-Type": "application/x-www-form-urlencoded"})
        assert as_form.status == 415
        assert lightwork.wait([ref], timeout=0)[1] == [ref]  # nothing was cancelled so far
        done = with_token.request("/api/actions/cancel", "POST", body=body,
                                  headers={"Origin": origin, **json_type})
        assert done.status == 200, done.data
        with pytest.raises(lightwork.exceptions.TaskCancelledError):
            lightwork.get(ref, timeout=20)
        bad = with_token.request("/api/actions/kill", "POST", body=b'{"actor_id": "zz"}',
                                 headers={"Origin": origin, **json_type})
        assert bad.status == 400 and "hex id" in json.loads(bad.data)["error"]
        victim = Tally.remote()
        lightwork.get(victim.add.remote(1))
        kill = with_token.request("/api/actions/kill", "POST",
                                  body=json.dumps({"actor_id": victim._ref.hex()}).encode(),
                                  headers={"Origin": origin, **json_type})
        assert kill.status == 200, kill.data
        with pytest.raises(lightwork.exceptions.RayActorError):
            lightwork.get(victim.add.remote(2), timeout=20)

        def victim_row() -> Any:
            server.sync_now()
            rows = with_token.json("/api/actors")["actors"]
            return next((a for a in rows if int(a["actor_id"], 16) == int(victim._ref.hex(), 16)
                         and a["state"] == "DEAD"), None)

        dead = helpers.wait_until(victim_row, timeout=20, message="the actors view to show it dead")
        assert dead["class_name"] == "Tally" and dead["death_cause"]  # why it died
    finally:
        open(str(tmp_path / "gate"), "w").close()
        server.stop()


def test_another_local_user_cannot_attach(runtime, monkeypatch):
    import stat

    from lightwork.kernel import control

    path = runtime["node"].control.path
    # The session's socket is its owner's alone (the directory 0700, the socket 0600) ...
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # ... and a peer of another uid that reached it anyway is hung up on, unanswered: a
    # dashboard it would start gets nothing to serve.
    monkeypatch.setattr(control, "peer_uid", lambda conn: os.getuid() + 1)
    with pytest.raises((control.ControlError, ConnectionError)):  # reset, or EOF
        control.request(path, "dashboard_sync", {"task_cursor": 0, "span_cursor": 0},
                        timeout=5)
    stranger = DashboardServer(path, port=0)
    try:
        stranger.sync_now()
        assert stranger.mirror.syncs == 0 and stranger.mirror.ended_counts == {}
    finally:
        stranger.httpd.server_close()


@lightwork.remote
def measure(text: str) -> int:
    return len(text)


def test_no_view_shows_an_argument_value(client):
    secret = "lw-secret-argument-7f3a"  # sizes and call sites only, never values (Flower)
    assert lightwork.get(measure.remote(secret)) == len(secret)
    client.server.sync_now()
    bodies = [client.request(path).data for path in (
        "/api/overview", "/api/stream?window=600", "/api/tasks?page_size=200",
        "/api/tasks?name=measure", "/api/functions", "/api/actors", "/api/objects",
        "/api/stacks?target=all", "/api/trace")]
    assert b"measure" in bodies[3]  # the task is there ...
    assert not [body[:200] for body in bodies if secret.encode() in body]  # ... its value not


def test_nothing_received_is_unpickled():
    folder = pathlib.Path(feed.__file__).parent
    source = "".join((folder / name).read_text()
                     for name in ("feed.py", "mirror.py", "server.py", "handler.py"))
    assert "pickle" not in source.replace("unpickled", "").replace("never pickle", "")


# ---------------------------------------------------------------------------- endpoints
def test_overview_counts_resources_workers_and_findings(client):
    o = client.json("/api/overview")
    assert o["session"] == support.driver_node().session.name and o["ended"] is False
    assert o["tasks"]["ended"]["FINISHED"] >= 24 and o["tasks"]["ended"]["FAILED"] >= 1
    assert o["resources"]["CPU"][1] == 2.0 and o["resources"]["scanner"] == [0.0, 3.0]
    driver = o["workers"][0]
    assert driver["kind"] == "driver" and driver["pid"] == os.getpid()
    assert {"cpu_percent", "rss"} <= set(driver)
    assert o["actors"]["ALIVE"] >= 1 and o["actor_count"] == sum(o["actors"].values())
    assert o["store"]["objects"] >= 1 and "shared_memory_bytes" in o["store"]
    assert o["store"]["budget"] > 0 and o["store"]["spilled_bytes"] == 0
    assert isinstance(o["findings"], list)
    assert o["history"] and o["actions"] is False


def test_stream_has_spans_per_worker_and_the_driver_staircase(client):
    s = client.json("/api/stream?window=600")
    names = {s["names"][span[1]] for span in s["spans"]}
    assert {"square", "broken", "Tally.add"} <= {n.rsplit(".<locals>.", 1)[-1] for n in names}
    rows = {row["worker_id"] for row in s["rows"]}
    assert all(span[0] in rows for span in s["spans"])
    assert any(row["label"].startswith("Tally") for row in s["rows"])
    for worker, _, start, end, _, loaded, finished, _ in s["spans"]:
        assert start <= loaded <= finished <= end
    gets = [d for d in s["driver"] if d[0] == "get"]
    assert len(gets) >= 3 and all(d[2] >= d[1] for d in gets)
    assert s["end"] - s["start"] == pytest.approx(600, abs=0.01)


def test_tasks_table_pages_filters_and_sorts_on_the_server(client):
    t = client.json("/api/tasks?page_size=5")
    assert len(t["rows"]) == 5 and t["total"] >= 25
    ids = [r["task_id"] for r in t["rows"]]
    assert ids == sorted(ids, reverse=True)  # newest first
    second = client.json("/api/tasks?page_size=5&page=1")
    assert not {r["task_id"] for r in second["rows"]} & set(ids)
    failed = client.json("/api/tasks?state=FAILED&name=broken")
    assert [r["name"].rsplit(".", 1)[-1] for r in failed["rows"]] == ["broken"]
    assert "KeyError" in failed["rows"][0]["error"]
    squares = client.json("/api/tasks?name=square&sort=run_s&order=asc&page_size=200")
    runs = [r["run_s"] for r in squares["rows"]]
    assert len(runs) == squares["total"] >= 23 and runs == sorted(runs)
    worker = squares["rows"][0]["worker_id"]
    on_worker = client.json(f"/api/tasks?worker={worker}&page_size=200")
    assert on_worker["total"] >= 1 and {r["worker_id"] for r in on_worker["rows"]} == {worker}


@pytest.mark.parametrize("query, word", [
    ("page_size=1000", "page_size"), ("sort=password", "sort"), ("page=-1", "page"),
    ("worker=abc", "worker"), ("page=x", "page")])
def test_bad_table_parameters_are_a_400_saying_what_to_fix(client, query, word):
    response = client.request("/api/tasks?" + query)
    assert response.status == 400
    assert word in json.loads(response.data)["error"]


def test_bad_view_and_window_are_refused(client):
    assert client.request("/api/stream?window=-3").status == 400
    assert client.request("/api/nothing").status == 404
    assert client.request("/static/../server.py").status == 404
    assert client.request("/api/events?view=stacks").status == 400


def test_functions_actors_objects_stacks_and_trace(client, runtime):
    functions = {f["name"].rsplit(".", 1)[-1]: f for f in client.json("/api/functions")["functions"]}
    square_summary = functions["square"]
    assert square_summary["state_counts"]["FINISHED"] >= 23
    assert 0 <= square_summary["p50_run_s"] <= square_summary["p95_run_s"]
    assert functions["broken"]["state_counts"] == {"FAILED": 1}
    actors = client.json("/api/actors")["actors"]
    assert [a["class_name"] for a in actors if a["state"] == "ALIVE"] == ["Tally"]
    tally = next(a for a in actors if a["state"] == "ALIVE")
    assert tally["restarts"] == 0 and tally["queued"] == 0 and tally["methods_running"] == []
    assert tally["calls_done"] >= 1 and tally["death_cause"] is None
    objects = client.json("/api/objects")
    assert objects["objects"] >= 1 and "by_reference_kind" in objects
    stacks = client.json("/api/stacks?target=all")
    assert "=== driver" in stacks["text"] and "all" in stacks["targets"]
    worker_id = int(stacks["targets"][2])
    one = client.json(f"/api/stacks?target={worker_id}")
    assert one["text"].startswith(f"=== worker {worker_id}")
    assert client.request("/api/stacks?target=99999").status == 404
    trace = client.request("/api/trace")
    assert trace.status == 200 and "attachment" in trace.getheader("Content-Disposition")
    events = json.loads(trace.data)["traceEvents"]
    assert any(e.get("name", "").endswith("square") for e in events)


def test_the_task_view_shows_what_one_task_printed(client, runtime):
    [call] = client.json(f"/api/logs?task={runtime['chatty']}")["tasks"]
    assert call["name"].endswith("chatty") and call["task_id"] == runtime["chatty"]
    assert call["lines"] == [["stdout", "said by chatty"], ["stderr", "warned by chatty"]]
    assert client.json(f"/api/logs?task={runtime['chatty'] + 999999}")["tasks"] == []
    assert client.request("/api/logs").status == 400
    bad = client.request("/api/logs?task=nope")
    assert bad.status == 400 and b"not a task id" in bad.data
    script = client.request("/static/dashboard.js").data
    assert b"/api/logs?task=" in script  # the page asks for it when a task id is clicked


def test_profile_samples_the_live_program_one_profile_at_a_time(client, runtime):
    profile = client.json("/api/profile?seconds=0.3")
    assert profile["hz"] == 100 and "all tasks" in profile["trees"]
    assert profile["trees"]["all tasks"]["value"] == profile["samples"]
    assert client.request("/api/profile?seconds=60").status == 400
    lightwork.state.query("sample_start")  # another profile holds the session
    try:
        busy = client.request("/api/profile?seconds=0.3")
        assert busy.status == 409
        assert b"another task profile is running" in busy.data
    finally:
        lightwork.state.query("sample_stop")
    assert client.json("/api/profile?seconds=0.2")["hz"] == 100  # free again


def test_events_stream_pushes_the_overview_and_the_view(client):
    conn = http.client.HTTPConnection("127.0.0.1", client.server.port, timeout=10)
    conn.request("GET", "/api/events?view=tasks&page_size=3", headers={
        "Host": f"127.0.0.1:{client.server.port}",
        "Cookie": f"{client.server.cookie_name}={client.server.token}"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream"
    helpers.wait_until(lambda: client.server.clients == 1, message="the stream to count")
    lines = []
    while not (lines and lines[-1] == b"\n" and any(x.startswith(b"data:") for x in lines)):
        lines.append(response.fp.readline())
    data = json.loads(next(x for x in lines if x.startswith(b"data:"))[5:])
    assert set(data) == {"overview", "tasks"} and len(data["tasks"]["rows"]) == 3
    response.close()
    conn.close()
    helpers.wait_until(lambda: client.server.clients == 0, message="the stream to close")


def test_a_page_gets_at_most_one_update_a_second_while_the_data_churns(client):
    import itertools
    import threading

    stop = threading.Event()

    def churn() -> None:  # a sync every 50 ms: the data changes far faster than 1/s
        while not stop.is_set():
            client.server.sync_now()
            time.sleep(0.05)

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    conn = http.client.HTTPConnection("127.0.0.1", client.server.port, timeout=10)
    try:
        conn.request("GET", "/api/events?view=overview", headers={
            "Host": f"127.0.0.1:{client.server.port}",
            "Cookie": f"{client.server.cookie_name}={client.server.token}"})
        response = conn.getresponse()
        updates: list[float] = []
        began = time.monotonic()
        while time.monotonic() - began < 3.5:
            if response.fp.readline().startswith(b"event: update"):
                updates.append(time.monotonic())
        assert len(updates) >= 3  # it does push while the data changes ...
        gaps = [b - a for a, b in itertools.pairwise(updates)]
        assert min(gaps) > 0.8, gaps  # ... about once a second, not once a sync
    finally:
        stop.set()
        churner.join(10)
        conn.close()


def test_a_saved_timeline_replays_as_an_ended_session(runtime, client, tmp_path):
    from lightwork.dashboard import replay

    path = str(tmp_path / "trace.json")
    lightwork.timeline(path)
    live = client.json("/api/functions")["functions"]
    server = DashboardServer(None, port=0, mirror=replay.load(path)).start()
    try:
        replayed = Client(server, cookie=server.token)
        overview = replayed.json("/api/overview")
        assert overview["ended"] is True and "replayed from" in overview["end_reason"]
        counts = {f["name"]: f["state_counts"].get("FINISHED", 0) for f in live}
        again = {f["name"]: f["state_counts"].get("FINISHED", 0)
                 for f in replayed.json("/api/functions")["functions"]}
        assert again == counts
        assert replayed.json("/api/stream?window=3600")["spans"]
        assert replayed.request("/api/stacks?target=all").status == 410
    finally:
        server.stop()
    (tmp_path / "plain.json").write_text('{"traceEvents": []}')
    with pytest.raises(ValueError, match="carries no advisor input"):
        replay.load(str(tmp_path / "plain.json"))
    with pytest.raises(ValueError, match="cannot read"):
        replay.load(str(tmp_path / "missing.json"))


def test_open_starts_a_browser_and_linger_leaves_once_no_page_looks(runtime, tmp_path,
                                                                    monkeypatch):
    import io
    import webbrowser

    from lightwork import cli
    from lightwork.dashboard import run_command

    path = str(tmp_path / "trace.json")
    lightwork.timeline(path)
    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", opened.append)
    args = cli.build_parser().parse_args(
        ["dashboard", "--from", path, "--open", "--linger", "0", "--port", "0"])
    out = io.StringIO()
    began = time.monotonic()
    assert run_command(args, out) == 0  # an ended session, no page: it leaves at once
    assert time.monotonic() - began < 30
    url = out.getvalue().rsplit(": ", 1)[1].strip()
    assert opened == [url] and url.startswith("http://127.0.0.1:") and "token=" in url


def test_no_page_open_means_no_sync(runtime, monkeypatch):
    from lightwork.dashboard import server as server_module

    monkeypatch.setattr(server_module, "IDLE_AFTER_S", 0.3)
    monkeypatch.setattr(server_module, "SYNC_INTERVAL_S", 0.1)
    monkeypatch.setattr(server_module, "IDLE_WAKE_S", 0.1)
    server = DashboardServer(runtime["node"].control.path, port=0).start()
    try:
        client = Client(server, cookie=server.token)

        def visit_and_count() -> bool:
            # Each visit keeps the server active for IDLE_AFTER_S more; one visit alone may
            # end its active window before three syncs fit in on a loaded machine.
            client.json("/api/overview")
            return server.mirror.syncs >= 3

        helpers.wait_until(visit_and_count, timeout=30, interval=0.1,
                           message="syncs while active")
        helpers.wait_until(lambda: time.monotonic() - server.last_request
                           > server_module.IDLE_AFTER_S, timeout=30, message="idleness")
        turns = server.sync_turns
        # Two turns of the loop that began idle: any sync started while active has ended.
        helpers.wait_until(lambda: server.sync_turns >= turns + 2, timeout=30,
                           message="the sync loop to turn while idle")
        idle_count, turns = server.mirror.syncs, server.sync_turns
        helpers.wait_until(lambda: server.sync_turns >= turns + 5, timeout=30,
                           message="five more idle turns of the sync loop")
        assert server.mirror.syncs == idle_count
    finally:
        server.stop()


def test_a_child_dashboard_leaves_on_its_schedule_once_the_program_is_gone(runtime,
                                                                          monkeypatch):
    from lightwork.dashboard import server as server_module

    monkeypatch.setattr(server_module, "NO_PAGE_EXIT_S", 0.2)
    monkeypatch.setattr(server_module, "PAGE_GRACE_S", 1.0)
    server = DashboardServer(runtime["node"].control.path, port=0,
                             follow_program=os.getppid()).start()
    try:
        time.sleep(0.3)
        assert not server.time_to_leave()  # the program runs: stay, page or not
        server.page_opened()
        server.program_gone()
        assert server.mirror.ended and "stops within 1 s" in server.mirror.end_reason
        time.sleep(0.4)
        assert not server.time_to_leave()  # a page is open: within the grace period
        helpers.wait_until(server.time_to_leave, timeout=5,
                           message="the grace period to end with the page still open")
        server.page_closed()
    finally:
        server.stop()
    user_started = DashboardServer(runtime["node"].control.path, port=0).start()
    try:
        user_started.mirror.mark_ended("the program ended")
        time.sleep(0.4)
        assert not user_started.time_to_leave()  # the user's own: until Ctrl-C
    finally:
        user_started.stop()


def test_control_ops_come_from_the_registry_and_unknown_ones_are_named(runtime):
    from lightwork.kernel import control

    assert set(CONTROL_OPS) <= set(control.known_ops())
    with pytest.raises(ValueError, match="unknown operation 'nope'.*dashboard_sync"):
        control.dispatch(runtime["node"], "nope", {})
    with pytest.raises(ValueError, match="built-in"):
        control.register_ops(["status"], lambda node, op, args: None)


def test_the_driver_refuses_actions_not_sent_by_an_allow_actions_dashboard(runtime):
    from lightwork.kernel import control

    node = runtime["node"]
    actor_hex = f"{runtime['tally']._ref.id:020x}"  # a live actor: refused all the same
    for op, args in (("dashboard_cancel", {"task_id": 1}),
                     ("dashboard_kill", {"actor_id": actor_hex})):
        with pytest.raises(PermissionError, match="--allow-actions"):
            control.dispatch(node, op, args)
        with pytest.raises(control.ControlError, match="--allow-actions"):
            control.request(node.control.path, op, {**args, "allow_actions": False})
    assert isinstance(lightwork.get(runtime["tally"].add.remote(0)), int)  # still alive


# ---------------------------------------------------------------------------- the feed
def test_newest_reads_only_what_is_new_and_counts_what_was_lost():
    ring: deque[int] = deque(maxlen=5)
    for i in range(3):
        ring.append(i)
    assert feed._newest(ring, 3, 0, 100) == ([0, 1, 2], 0, 3)
    assert feed._newest(ring, 3, 3, 100) == ([], 0, 3)
    for i in range(3, 10):
        ring.append(i)  # 10 appended, the ring keeps 5..9
    assert feed._newest(ring, 10, 3, 100) == ([5, 6, 7, 8, 9], 2, 10)
    assert feed._newest(ring, 10, 6, 2) == ([6, 7], 0, 8)
    assert feed._newest(ring, 10, 50, 100) == ([5, 6, 7, 8, 9], 5, 10)  # a stale cursor
    with pytest.raises(ValueError, match="task_cursor"):
        feed.dispatch(None, "dashboard_sync", {"task_cursor": -1})  # type: ignore[arg-type]


def test_live_counts_match_the_state_api_while_tasks_run_and_queue(runtime, tmp_path):
    from collections import Counter

    from lightwork.kernel import views

    node = runtime["node"]
    gate = str(tmp_path / "gate")
    refs = [parked.remote(gate) for _ in range(5)]  # 2 CPUs: 2 run, 3 queue
    call = runtime["tally"].add.remote(7)
    try:
        helpers.wait_until(lambda: feed.sync(node, 0, 0, 1, 10)[0]["live"]["counts"].get(
            "RUNNING", 0) >= 2, message="two tasks running")
        with node.lock:
            expected = Counter(views.live_task_state(node, t) for t in node.tasks.values())
            counts = feed._live_counts(node)
        assert counts == +expected and counts["RUNNING"] >= 2
        # The live rows' times (microseconds since the session began) as the views show
        # them: seconds since the start, in the table and on the stream's running bars.
        reply, attached = feed.sync(node, 0, 0, 0, 100)
        mirror = Mirror()
        mirror.apply(reply, b"".join(attached))
        since_start = reply["now"] - reply["base"]
        live = [r for r in mirror.tasks(page_size=200)["rows"] if r.get("live")]
        assert len(live) >= 5 and all(0 < r["submitted_s"] <= since_start for r in live)
        running = mirror.stream(window_s=3600)["running"]
        assert len(running) >= 2 and all(0 < bar[2] <= since_start for bar in running)
    finally:
        open(gate, "w").close()
    assert lightwork.get(refs, timeout=20) == [True] * 5 and lightwork.get(call) == 7


def test_the_get_observer_goes_away_when_no_dashboard_asks(runtime, monkeypatch):
    from lightwork.kernel import introspect

    feed._progress.touch(runtime["node"])
    assert feed._progress._observe in introspect.blocking_observers
    # From here no dashboard asks: the module's dashboard server may still be syncing
    # for a page an earlier test opened, and its sync would attach the observer again
    # between the get and the check below (seen once in CI).
    monkeypatch.setattr(feed._progress, "touch", lambda node: None)
    monkeypatch.setattr(feed, "OBSERVER_IDLE_S", 0.0)
    lightwork.get(square.remote(3))
    assert feed._progress._observe not in introspect.blocking_observers


def test_the_get_observer_goes_away_with_the_session(fresh_runtime):
    from lightwork.kernel import introspect

    lightwork.init(num_cpus=1)
    node = support.driver_node()
    feed.sync(node, 0, 0, 10, 10)
    assert feed._progress._observe in introspect.blocking_observers
    lightwork.shutdown()
    assert feed._progress._observe not in introspect.blocking_observers


# ---------------------------------------------------------------------------- the mirror
def _synthetic_sync(first_id: int, count: int, names: list[str],
                    base: float, scattered: bool = False) -> tuple[dict[str, Any], bytes]:
    """A sync reply carrying ``count`` ended tasks, and its attached bytes, as
    ``feed.pack`` encodes them. Run times take 7 values, or with ``scattered`` about
    a million (a multiplicative hash of the task id), as a real program's do."""
    from lightwork.kernel.events import TaskRecord

    rows = []
    for i in range(first_id, first_id + count):
        t = base + i * 0.001
        spread = (i * 2654435761 % 1_000_003) * 1e-9 if scattered else (i % 7) * 1e-5
        rows.append(TaskRecord(
            i, names[i % len(names)], 0, t, worker_id=i % 4 + 1, deps_ready=t + 1e-4,
            dispatched=t + 2e-4, started=t + 3e-4, args_loaded=t + 4e-4,
            finished=t + 5e-4 + spread, stored=t + 6e-4 + spread,
            state="FAILED" if i % 10 == 0 else "FINISHED",
            error="boom" if i % 10 == 0 else None))
    facts, attached = feed.pack(rows)
    return helpers.sync_reply(facts, first_id + count, session="synthetic",
                              now=base + (first_id + count) * 0.001, base=base,
                              budget=1_000_000), b"".join(attached)


def test_mirror_filters_and_sorts_like_a_brute_force_as_records_arrive():
    mirror = Mirror()
    names = ["a.load", "b.train", "c.save"]
    mirror.apply(*_synthetic_sync(0, 3000, names, 100.0))
    first = mirror.tasks(state="FAILED", name="train", sort="task_id", descending=False,
                         page_size=200)
    expected = [i for i in range(3000) if i % 10 == 0 and names[i % 3] == "b.train"]
    assert first["total"] == len(expected)
    assert [r["task_id"] for r in first["rows"]] == expected[:200]
    assert first["rows"][0]["error"] == "boom"
    by_worker = mirror.tasks(worker="2", sort="run_s", page=1, page_size=50)
    assert {r["worker_id"] for r in by_worker["rows"]} == {2}
    mirror.apply(*_synthetic_sync(3000, 1000, names, 100.0))  # the cached filter grows
    again = mirror.tasks(state="FAILED", name="train", sort="task_id", descending=True,
                         page_size=5)
    expected = [i for i in range(4000) if i % 10 == 0 and names[i % 3] == "b.train"]
    assert again["total"] == len(expected)
    assert [r["task_id"] for r in again["rows"]] == expected[::-1][:5]
    every = [mirror.table.ended_row(i) for i in range(4000)]
    for key in ("run_s", "queued_s"):
        page = mirror.tasks(sort=key, descending=True, page_size=200, page=3)
        wanted = sorted((r[key] for r in every), reverse=True)[600:800]
        assert [r[key] for r in page["rows"]] == wanted, key
    states = mirror.tasks(sort="state", descending=False, page_size=200)
    assert {r["state"] for r in states["rows"]} == {"FAILED"}  # F before FINISHED
    sizes = mirror.tasks(sort="name", descending=False, page_size=200)
    assert [r["name"] for r in sizes["rows"]] == ["a.load"] * 200
    summary = {f["name"]: f for f in mirror.function_summary()["functions"]}
    assert sum(f["count"] for f in summary.values()) == 4000
    assert summary["a.load"]["state_counts"]["FAILED"] == len(
        [i for i in range(4000) if i % 10 == 0 and i % 3 == 0])


def test_mirror_keeps_the_budget_and_says_so():
    mirror = Mirror()
    reply, attached = _synthetic_sync(0, 1200, ["f"], 50.0)
    reply["budget"] = 1000
    mirror.apply(reply, attached)
    assert len(mirror.state_of) == 1000 and mirror.trimmed == 200
    assert any("newest 1,000" in banner for banner in mirror.header()["banners"])
    page = mirror.tasks(sort="task_id", descending=False, page_size=1)
    assert page["rows"][0]["task_id"] == 200 and page["total"] == 1000
    assert mirror.function_summary()["functions"][0]["count"] == 1000
    lost, attached = _synthetic_sync(1200, 10, ["f"], 50.0)
    lost["tasks"]["lost"] = 7
    mirror.apply(lost, attached)
    assert any("7 task records left" in banner for banner in mirror.header()["banners"])


def test_the_live_rows_and_actors_caps_say_so():
    mirror = Mirror()
    reply, attached = _synthetic_sync(0, 10, ["f"], 50.0)
    reply["live"] = {"counts": {"PENDING_NODE_ASSIGNMENT": 5_000},
                     "rows": [[7, "f", "PENDING_NODE_ASSIGNMENT", -1, 0, 10, 0, 0]] * 1_000,
                     "total": 5_000}
    reply["actors"], reply["actor_count"] = [{"state": "ALIVE"}] * 2_000, 2_500
    mirror.apply(reply, attached)
    banners = mirror.header()["banners"]
    assert any("5,000 tasks are queued or running" in b and "first 1,000" in b for b in banners)
    assert any("2,500 actors" in b and "first 2,000" in b for b in banners)
    reply, attached = _synthetic_sync(10, 0, ["f"], 50.0)  # within the caps: no banner
    mirror.apply(reply, attached)
    assert mirror.header()["banners"] == []


def test_stream_caps_rectangles_and_says_so():
    mirror = Mirror()
    mirror.apply(*_synthetic_sync(0, 5000, ["f"], 10.0))
    s = mirror.stream(window_s=60, max_spans=100)
    assert len(s["spans"]) == 100 and s["capped"] is True
    assert [span[4] for span in s["spans"]] == list(range(4999, 4899, -1))  # the newest


# ---------------------------------------------------------------------------- lifetime
DRIVER = """
import sys, lightwork
from tests import support
lightwork.init(num_cpus=2)

@lightwork.remote
def work(i):
    return i

lightwork.get([work.remote(i) for i in range(30)])
print("SOCKET", support.control_path(), flush=True)
import os, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
lightwork.get([work.remote(i) for i in range(5)])
print("DONE", flush=True)
"""


def test_the_page_keeps_the_final_state_after_the_program_ends():
    info = helpers.start_session_driver(DRIVER)
    server = DashboardServer(info["socket"], port=0).start()
    try:
        client = Client(server, cookie=server.token)
        assert client.json("/api/overview")["tasks"]["ended"]["FINISHED"] == 30
        helpers.stop_session_driver(info)
        assert server.sync_now() is False
        overview = client.json("/api/overview")
        assert overview["ended"] is True and "read as it closed" in overview["end_reason"]
        assert client.json("/api/tasks")["total"] == 35  # the last 5 came as it closed
        gone = client.request("/api/stacks?target=all")
        assert gone.status == 410 and "ended" in json.loads(gone.data)["error"]
    finally:
        server.stop()


def test_the_command_attaches_prints_its_url_and_says_what_went_wrong(tmp_path):
    info = helpers.start_session_driver(DRIVER)
    command = [sys.executable, "-m", "lightwork", "dashboard", "--port", "0"]
    process = subprocess.Popen(command, env=info["env"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("lightwork dashboard of session session_"), line
        url = line.split(": ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and "token=" in url
        port, token = int(url.split(":")[2].split("/")[0]), url.split("token=")[1]
        fake = DashboardServer.__new__(DashboardServer)
        fake.port, fake.cookie_name, fake.token = port, f"lightwork_dashboard_{port}", token
        assert Client(fake, cookie=token).json("/api/overview")["tasks"]["ended"]["FINISHED"] == 30
    finally:
        process.terminate()
        process.communicate(timeout=10)
        helpers.stop_session_driver(info)
    env = helpers.script_env()
    env["TMPDIR"] = tempfile.mkdtemp(prefix="lw")  # no session there
    for args, code, words in ((["--port", "0"], 1, "no running lightwork session"),
                              (["--session", "nightly"], 1, "session named 'nightly'"),
                              (["--port", "70000"], 2, "--port"),
                              (["--from", str(tmp_path / "none.json")], 2, "cannot read")):
        done = subprocess.run(command[:4] + args, env=env, capture_output=True, text=True,
                              timeout=30, check=False)
        assert done.returncode == code, (args, done.stderr)
        assert words in done.stderr




def _client_of(url: str) -> Client:
    port = int(url.split(":")[2].split("/")[0])
    token = url.split("token=")[1]
    fake = DashboardServer.__new__(DashboardServer)  # just the fields the Client needs
    fake.port, fake.cookie_name, fake.token = port, f"lightwork_dashboard_{port}", token
    return Client(fake, cookie=token)


def _open_stream(client: Client) -> http.client.HTTPConnection:
    """An open page: the event stream, read up to its first update."""
    server = client.server
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
    conn.request("GET", "/api/events", headers={
        "Host": f"127.0.0.1:{server.port}", "Cookie": f"{server.cookie_name}={server.token}"})
    response = conn.getresponse()
    assert response.status == 200
    while not response.fp.readline().startswith(b"data:"):
        pass
    return conn


INIT_DASHBOARD_DRIVER = """
import os, sys, time, lightwork
from tests import support
ctx = lightwork.init(num_cpus=2, include_dashboard=True)

@lightwork.remote
def work(i):
    return i

lightwork.get([work.remote(i) for i in range(40)])
print("URL", ctx["dashboard_url"], flush=True)
print("PID", support.dashboard_child().process.pid, flush=True)
if sys.argv[1] == "wait":
    sys.stdin.readline()  # the test opened its page
    lightwork.shutdown()
else:
    time.sleep(120)  # the test kills this program
"""


def _start_init_dashboard(tmp_path: pathlib.Path, mode: str) -> tuple[Any, str, int]:
    script = helpers.write_script(str(tmp_path), "prog.py", INIT_DASHBOARD_DRIVER)
    env = helpers.script_env()
    env["TMPDIR"] = tempfile.mkdtemp(prefix="lw")  # short: a Unix socket path has ~104 bytes
    process = subprocess.Popen([sys.executable, script, mode], env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    url = process.stdout.readline().split("URL ", 1)[1].strip()
    pid = int(process.stdout.readline().split("PID ", 1)[1])
    return process, url, pid


def test_init_dashboard_prints_the_url_once_and_keeps_an_open_page_for_a_grace_period(
        tmp_path):
    process, url, pid = _start_init_dashboard(tmp_path, "wait")
    try:
        client = _client_of(url)
        stream = _open_stream(client)  # a page is open when the program ends
        process.stdin.write("go\n")
        process.stdin.flush()
        _out, err = process.communicate(timeout=40)
        assert process.returncode == 0, err
        assert err.count("dashboard at http://127.0.0.1:") == 1
        assert url in err and "ignoring Ray-only" not in err
        overview = helpers.wait_until(
            lambda: (o := client.json("/api/overview"))["ended"] and o,
            timeout=20, message="the dashboard to see the program end")
        assert overview["tasks"]["ended"]["FINISHED"] == 40  # the final sync at shutdown
        assert "stops within 60 s" in overview["end_reason"]  # the page says how long
        time.sleep(3.0)  # longer than NO_PAGE_EXIT_S: the open page keeps it
        assert helpers.process_running(pid)
        stream.close()  # the page closes: the dashboard leaves soon after
        helpers.wait_until(lambda: not helpers.process_running(pid), timeout=10,
                           message="the dashboard to exit once its page closed")
    finally:
        if helpers.process_running(pid):
            os.kill(pid, 9)


def test_a_sigkilled_program_leaves_no_dashboard_behind(tmp_path):
    process, url, pid = _start_init_dashboard(tmp_path, "kill")
    try:
        assert _client_of(url).json("/api/overview")["ended"] is False
        process.kill()  # no page open
        process.communicate(timeout=30)
        helpers.wait_until(lambda: not helpers.process_running(pid), timeout=5.0,
                           message="the dashboard to exit after its program was killed")
    finally:
        if helpers.process_running(pid):
            os.kill(pid, 9)


def test_init_rejects_a_non_boolean_dashboard(fresh_runtime):
    with pytest.raises(TypeError, match="dashboard must be True or False"):
        lightwork.init(num_cpus=1, dashboard="yes")



@pytest.mark.parametrize("content", ['{"traceEvents": []}', "not json", None,
                                     '{"otherData": {"advisor_input": {"tasks": 3}}}'])
def test_replay_and_advise_read_a_timeline_file_the_same_way(tmp_path, content):
    import io

    from lightwork import cli
    from lightwork.dashboard import replay

    path = tmp_path / "trace.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError) as replayed:
        replay.load(str(path))
    with pytest.raises(ValueError) as advised:
        cli.advise_file(str(path), False, io.StringIO())
    assert str(replayed.value) == str(advised.value)
    assert str(path) in str(replayed.value)

