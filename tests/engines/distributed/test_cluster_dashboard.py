"""The live dashboard on a cluster session, against a real cluster (``dask scheduler`` and
two single-thread ``dask worker`` processes; ``shared_dask_cluster``).

The driver is this process, connected with ``init(address=...)``; the dashboard reads
it through the control socket its event log serves (``engines/distributed/control.py``),
as for a local session, and the JSON endpoints are asked over HTTP with the token.
One test loads the page in headless Chromium, as ``test_dashboard_browser.py`` does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from tests import helpers, support
import pytest
from tests.dashboard import test_dashboard_browser
from tests.dashboard.test_dashboard import Client, _client_of

import lightwork
from lightwork.dashboard import feed
from lightwork.dashboard.server import DashboardServer

pytestmark = pytest.mark.lightwork_only
browser_page = test_dashboard_browser.browser_page  # headless Chromium (the fixture)
pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")


@lightwork.remote
def square(x):
    time.sleep(0.01)
    return x * x


@lightwork.remote
def broken():
    raise KeyError("on purpose")


@lightwork.remote
def parked(path):
    while not os.path.exists(path):
        time.sleep(0.02)
    return b"p" * 1000


@lightwork.remote
class Tally:
    def add(self, n):
        return n


@pytest.fixture(scope="module")
def session(shared_dask_cluster):
    """A driver on the cluster that ran tasks on both workers, a failure, an actor's
    calls and a get inside a loop; and a dashboard of it served from this process."""
    if lightwork.is_initialized():
        lightwork.shutdown()
    lightwork.init(address=shared_dask_cluster.scheduler_file)
    backend = support.backend()
    shared_dask_cluster.wait_for_workers(backend.client)
    tally = Tally.remote()
    lightwork.get([square.remote(i) for i in range(20)] + [tally.add.remote(1)])
    with pytest.raises(KeyError):
        lightwork.get(broken.remote())
    for i in range(12):  # a get in a loop: a staircase on the driver's row, and advice
        lightwork.get(square.remote(i))
    server = DashboardServer(backend.recorder.control.path, port=0).start()
    try:
        yield {"cluster": shared_dask_cluster, "backend": backend, "tally": tally,
               "server": server}
    finally:
        server.stop()
        lightwork.shutdown()


@pytest.fixture
def client(session) -> Client:
    session["server"].sync_now()
    return Client(session["server"], cookie=session["server"].token)


def test_overview_shows_the_cluster_workers_resources_and_actors(client, session):
    o = client.json("/api/overview")
    assert o["session"] == session["backend"].recorder.session.name and o["ended"] is False
    assert o["tasks"]["ended"]["FINISHED"] >= 33 and o["tasks"]["ended"]["FAILED"] == 1
    assert o["resources"]["CPU"][1] == 2.0  # two workers declaring CPU=1
    driver, *rows = o["workers"]
    assert driver["kind"] == "driver" and driver["pid"] == os.getpid()
    workers = [row for row in rows if row["kind"] == "task"]
    assert len(workers) == 2
    assert {w["pid"] for w in workers} == set(session["cluster"].worker_pids())
    assert all(w["address"].startswith("tcp://127.0.0.1:") and w["worker_id"] > 0
               for w in workers)
    # The actor has a row of its own (its task-stream row), in its worker's process.
    [actor] = [row for row in rows if row["kind"] == "actor"]
    assert actor["actor_class"].endswith("Tally") and actor["state"] == "ALIVE"
    assert (actor["pid"], actor["address"]) in {(w["pid"], w["address"]) for w in workers}
    assert actor["worker_id"] not in {w["worker_id"] for w in workers}
    assert o["actors"] == {"ALIVE": 1} and o["actor_count"] == 1
    assert o["store"]["objects"] >= 1 and o["store"]["cluster_bytes"] >= 0
    [finding] = [f for f in o["findings"] if f["kind"] == "get-in-loop"]
    assert finding["callsite"][0].endswith("test_cluster_dashboard.py")


def test_stream_has_a_row_per_cluster_worker_and_actor_and_the_driver_staircase(client):
    s = client.json("/api/stream?window=600")
    names = {s["names"][span[1]].rsplit(".<locals>.", 1)[-1] for span in s["spans"]}
    assert {"square", "broken", "Tally.add"} <= names
    labels = {row["worker_id"]: row["label"] for row in s["rows"]}
    assert all(span[0] in labels for span in s["spans"])
    worker_rows = {span[0] for span in s["spans"]
                   if s["names"][span[1]].endswith("square")}
    assert len(worker_rows) == 2  # both workers ran squares, each on its own row
    assert all(labels[row].startswith("127.0.0.1:") for row in worker_rows)
    actor_rows = {span[0] for span in s["spans"] if s["names"][span[1]].endswith("Tally.add")}
    assert [labels[row] for row in actor_rows] == ["Tally (actor)"]
    for _worker, _name, start, end, _id, loaded, finished, _state in s["spans"]:
        assert start <= loaded <= finished <= end
    gets = [d for d in s["driver"] if d[0] == "get"]
    assert len(gets) >= 12


def test_tasks_table_filters_by_state_name_and_worker(client):
    failed = client.json("/api/tasks?state=FAILED&name=broken")
    assert [r["name"].rsplit(".", 1)[-1] for r in failed["rows"]] == ["broken"]
    assert "KeyError" in failed["rows"][0]["error"]
    squares = client.json("/api/tasks?name=square&page_size=200")
    assert squares["total"] >= 23
    worker = squares["rows"][0]["worker_id"]
    on_worker = client.json(f"/api/tasks?worker={worker}&page_size=200")
    assert on_worker["total"] >= 1 and {r["worker_id"] for r in on_worker["rows"]} == {worker}


def test_the_page_in_a_real_browser_shows_the_cluster_sessions_tasks(browser_page, session,
                                                                      tmp_path):
    """Headless Chromium (the system's, as in ``test_dashboard_browser.py``) loads the page
    of the cluster session, reaching nothing but the dashboard."""
    page, server = browser_page, session["server"]
    errors, foreign = test_dashboard_browser.watch(page, f"http://127.0.0.1:{server.port}/")
    page.goto(server.url)
    page.wait_for_function("() => document.getElementById('liveness').textContent === 'live'")
    page.wait_for_function("() => Number(document.querySelector('.count-FINISHED')"
                           ".textContent.replace(/,/g, '')) >= 24", timeout=15_000)
    rows = page.locator("#workers").inner_text().splitlines()[1:]
    kinds = sorted(row.split("\t")[2] for row in rows)
    assert kinds == ["actor", "driver", "task", "task"]  # the cluster's two workers
    assert sum("(tcp://127.0.0.1:" in row for row in rows) == 3  # and the actor's
    assert "stored on the cluster's workers" in page.locator("#store").inner_text()
    card = page.locator(".finding", has_text="get-in-loop").first.inner_text()
    assert "test_cluster_dashboard.py" in card and "Fix:" in card
    page.screenshot(path=str(tmp_path / "cluster-overview.png"), full_page=True)

    page.click("#tabs button[data-view=stream]")
    page.wait_for_function("() => state.streamBoxes && state.streamBoxes.filter("
                           "b => b.y0 > 30).length > 3", timeout=15_000)
    labels = page.evaluate("state.stream.rows.map(r => r.label)")
    assert sum(label.startswith("127.0.0.1:") for label in labels) == 2
    assert "Tally (actor)" in labels
    page.screenshot(path=str(tmp_path / "cluster-stream.png"), full_page=True)

    page.click("#tabs button[data-view=tasks]")
    page.wait_for_function("() => [...document.querySelectorAll('#tasks td')]"
                           ".some(td => td.textContent.endsWith('square'))", timeout=15_000)
    page.click("#tabs button[data-view=stacks]")
    page.click("#stack-targets button[data-target=all]")
    page.wait_for_function("() => document.getElementById('stack-text').textContent"
                           ".includes('=== worker')", timeout=15_000)
    assert errors == []
    assert foreign == []


def test_actors_objects_stacks_and_trace(client, session):
    actors = client.json("/api/actors")["actors"]
    assert [(a["class_name"].rsplit(".", 1)[-1], a["state"]) for a in actors] == [
        ("Tally", "ALIVE")]
    assert actors[0]["address"].startswith("tcp://") and actors[0]["calls_done"] >= 1
    objects = client.json("/api/objects")
    assert objects["objects"] >= 1 and len(objects["cluster_workers"]) == 2
    stacks = client.json("/api/stacks?target=all")
    assert "=== driver" in stacks["text"]
    workers = {w["worker_id"] for w in client.json("/api/overview")["workers"]
               if w["kind"] == "task"}
    assert {int(t) for t in stacks["targets"][2:]} == workers  # the ids the rows show
    one = client.json(f"/api/stacks?target={min(workers)}")
    assert one["text"].startswith(f"=== worker {min(workers)}")
    assert "dask" in one["text"]  # the worker process's own threads
    trace = client.request("/api/trace")
    assert trace.status == 200
    assert b"square" in trace.data


def test_live_tasks_running_on_a_worker_and_a_get_waiting_for_them(client, session, tmp_path):
    gate = str(tmp_path / "gate")
    refs = [parked.remote(gate) for _ in range(3)]  # two run, one waits for a worker
    got: list = []
    getter = threading.Thread(target=lambda: got.append(lightwork.get(refs)))
    getter.start()
    server = session["server"]
    try:
        def seen():
            server.sync_now()
            o = client.json("/api/overview")
            running = o["tasks"]["live"].get("RUNNING", 0)
            return o if running == 2 and o["progress"] else None

        o = helpers.wait_until(seen, timeout=20, message="two parked tasks running")
        assert o["resources"]["CPU"][0] == 2.0  # both workers' threads are taken
        call = o["progress"][0]
        assert call["kind"] == "get" and call["objects"] == 3 and call["ready"] == 0
        table = client.json("/api/tasks?state=RUNNING")
        workers = {w["worker_id"] for w in o["workers"] if w["kind"] == "task"}
        assert {r["worker_id"] for r in table["rows"]} == workers
        stream = client.json("/api/stream?window=60")
        assert len(stream["running"]) == 2
    finally:
        open(gate, "w").close()
        getter.join(timeout=30)
    assert len(got) == 1 and got[0] == [b"p" * 1000] * 3
    server.sync_now()
    names = client.json("/api/tasks?name=parked&state=FINISHED")
    assert names["total"] == 3


def test_actions_cancel_a_pending_task_and_kill_an_actor(session, tmp_path):
    log = session["backend"].recorder
    gate = str(tmp_path / "gate")
    busy = [parked.remote(gate) for _ in range(2)]
    waiting = parked.remote(gate)
    task_id = session["backend"].task_id_of(waiting.id)
    with pytest.raises(PermissionError):
        feed.dispatch(log, "dashboard_cancel", {"task_id": task_id})
    assert feed.dispatch(log, "dashboard_cancel", {"task_id": task_id,
                                                   "allow_actions": True}) == {
        "cancelled": task_id}
    with pytest.raises(lightwork.exceptions.TaskCancelledError):
        lightwork.get(waiting, timeout=20)
    open(gate, "w").close()
    lightwork.get(busy, timeout=30)
    victim = Tally.remote()
    assert lightwork.get(victim.add.remote(2)) == 2
    hex_id = victim._actor_id
    with pytest.raises(ValueError, match="no actor"):
        feed.dispatch(log, "dashboard_kill", {"actor_id": "0" * 20, "allow_actions": True})
    feed.dispatch(log, "dashboard_kill", {"actor_id": hex_id, "allow_actions": True})
    with pytest.raises(lightwork.exceptions.ActorDiedError):
        lightwork.get(victim.add.remote(3), timeout=20)


def test_findings_stop_costing_once_no_dashboard_asks(session, client, monkeypatch):
    """The log keeps fresh records for the dashboard's advisor only while syncs come; a
    sync after a pause starts again from the whole log, with the same findings."""
    from lightwork.engines.distributed import dashboard as cluster_dashboard

    log = session["backend"].recorder
    facts = log.dashboard
    before = [f["kind"] for f in facts.findings()]
    assert "get-in-loop" in before and log.log.watching
    facts.idle()  # a sync just came: nothing changes
    assert log.log.watching
    monkeypatch.setattr(cluster_dashboard, "IDLE_S", 0.0)
    facts.idle()  # (the log's pull thread calls this)
    assert not log.log.watching and log.log.fresh_spans is None
    monkeypatch.setattr(cluster_dashboard, "IDLE_S", 30.0)  # (the pull thread calls it too)
    lightwork.get(square.remote(1))
    assert [f["kind"] for f in facts.findings()] == before
    assert log.log.watching and log.log.take_fresh() == ([], [], [])


def test_init_with_dashboard_serves_the_session_and_its_final_state(shared_dask_cluster,
                                                                     session):
    lightwork.shutdown()  # this test runs its own session (the module's is done with)
    context = lightwork.init(address=shared_dask_cluster.scheduler_file, dashboard=True)
    try:
        url = context["dashboard_url"]
        assert url and url.startswith("http://127.0.0.1:") and "token=" in url
        child = support.dashboard_child()
        lightwork.get([square.remote(i) for i in range(5)])
        page = _client_of(url)
        helpers.wait_until(
            lambda: page.json("/api/overview")["tasks"]["ended"].get("FINISHED", 0) >= 5,
            timeout=20, message="the child dashboard to see the tasks")
        lightwork.get(square.remote(99))  # just before the end: seen by the final sync
    finally:
        lightwork.shutdown()
    final = page.json("/api/overview")
    assert final["ended"] is True and final["tasks"]["ended"]["FINISHED"] == 6
    child.process.wait(timeout=30)  # it leaves on its own once the page is gone


def test_the_command_attaches_to_a_cluster_session(shared_dask_cluster, tmp_path):
    """``lightwork dashboard`` from another terminal attaches to a driver on the cluster
    (another process here) and serves its tasks."""
    body = f"""
import sys, lightwork
from tests import support
lightwork.init(address={shared_dask_cluster.scheduler_file!r})

@lightwork.remote
def cube(x):
    return x ** 3

lightwork.get([cube.remote(i) for i in range(7)])
print("SOCKET", support.recorder().control.path, flush=True)
import os, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("DONE", flush=True)
"""
    info = helpers.start_session_driver(body)
    command = [sys.executable, "-m", "lightwork", "dashboard", "--port", "0"]
    process = subprocess.Popen(command, env=info["env"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("lightwork dashboard of session session_"), (
            line, process.stderr.read() if process.poll() is not None else "")
        page = _client_of(line.split(": ", 1)[1].strip())

        def all_seen():
            o = page.json("/api/overview")
            return o if o["tasks"]["ended"].get("FINISHED") == 7 else None

        o = helpers.wait_until(all_seen, timeout=20, message="the cube tasks")
        assert [w["kind"] for w in o["workers"]] == ["driver", "task", "task"]
    finally:
        process.terminate()
        process.communicate(timeout=10)
        helpers.stop_session_driver(info)


def test_no_event_log_means_no_dashboard_and_says_why(shared_dask_cluster, capsys):
    if lightwork.is_initialized():
        lightwork.shutdown()
    context = lightwork.init(address=shared_dask_cluster.scheduler_file, dashboard=True,
                             event_budget=0)
    try:
        assert context["dashboard_url"] is None and support.dashboard_child() is None
        assert "no dashboard" in capsys.readouterr().err
        assert lightwork.get(square.remote(3)) == 9  # the program runs on without it
    finally:
        lightwork.shutdown()
