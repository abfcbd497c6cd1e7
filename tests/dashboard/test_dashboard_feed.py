"""The dashboard's feed from the driver: its wire format, the Dask graphs it reports,
the final sync at the session's end, and the lean dashboard process.

Drivers that must end during a test run in their own process (``helpers``); the rest
uses one module-scoped 2-CPU runtime.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from tests import helpers, support
import pytest

import lightwork
from lightwork.kernel import control  # the dashboard's channel to the driver: its wire
from lightwork.dashboard import feed
from lightwork.dashboard.mirror import Mirror
from lightwork.dashboard.server import DashboardServer
from lightwork.dashboard.wire import attached_size

pytestmark = pytest.mark.lightwork_only


@lightwork.remote
def square(x: int) -> int:
    return x * x


@pytest.fixture(scope="module")
def node():
    if lightwork.is_initialized():
        lightwork.shutdown()
    lightwork.init(num_cpus=2)
    lightwork.get([square.remote(i) for i in range(10)])
    yield support.driver_node()
    lightwork.shutdown()


# ---------------------------------------------------------------------------- wire
def test_a_sync_over_the_socket_carries_its_records_as_attached_bytes(node):
    with control.Channel(node.control.path) as channel:
        reply, attached = channel.ask("dashboard_sync", {"task_cursor": 0, "span_cursor": 0})
        tasks = reply["tasks"]
        assert tasks["count"] >= 10
        assert len(attached) == attached_size(tasks["count"], tasks["row_bytes"])
        mirror = Mirror()
        assert mirror.apply(reply, attached) == tasks["count"]
        # The same connection carries the next request: only what is new since.
        again, more = channel.ask("dashboard_sync", {"task_cursor": mirror.task_cursor,
                                                     "span_cursor": mirror.span_cursor})
        assert again["tasks"]["count"] == 0 and more == b""
    page = mirror.tasks(name="square", page_size=200)
    assert page["total"] == 10 and {row["state"] for row in page["rows"]} == {"FINISHED"}


def test_the_mirror_refuses_attached_bytes_that_do_not_match(node):
    reply, buffers = feed.sync(node, 0, 0, 100, 10)
    attached = b"".join(buffers)
    with pytest.raises(ValueError, match="do not match its count"):
        Mirror().apply(reply, attached[:-1])
    reply["tasks"]["names"] = []  # a code that points outside its table
    with pytest.raises(ValueError, match="outside its table"):
        Mirror().apply(reply, attached)
    for key, bad, says in (("row_bytes", 12, "multiple of 8"), ("row_bytes", "8", "multiple"),
                           ("row_bytes", 1 << 20, "up to"),
                           ("columns", {"finished": 0}, "each of"),
                           ("columns", {**reply["tasks"]["columns"], "pid": 10**6}, "a word")):
        broken = {**reply, "tasks": {**reply["tasks"], key: bad}}
        with pytest.raises(ValueError, match=says):
            Mirror().apply(broken, attached)


def test_every_column_survives_the_whole_record_packing():
    from lightwork.kernel.events import TaskRecord
    from lightwork.dashboard.wire import FLOAT_COLUMNS, INT_COLUMNS

    records = [TaskRecord(7 + i, "f", 3, 1.5 + i, attempt=2 + i, worker_id=5 + i, pid=4242 + i,
                          deps_ready=2.25 + i, dispatched=3.125 + i, started=4.0625 + i,
                          args_loaded=5.5 + i, finished=6.75 + i, stored=7.875 + i,
                          seen=99.0, arg_size=1 << 40, result_size=12345 + i,
                          actor_id=(1 << 62) + i, state="FINISHED", callsite=("x.py", 1, "f"),
                          yields=(1.0,), cpu_time=0.5, rss_peak=(300 << 20) + i,
                          rss_change=-(1 << 20) * i) for i in range(3)]
    facts, buffers = feed.pack(records)
    reply = helpers.sync_reply(facts, 3)
    mirror = Mirror()
    mirror.apply(reply, b"".join(buffers))
    for name in FLOAT_COLUMNS:
        assert list(mirror.floats[name]) == [getattr(r, name) for r in records], name
    for name in INT_COLUMNS:
        assert list(mirror.ints[name]) == [getattr(r, name) for r in records], name
    rows = {r["task_id"]: r for r in mirror.tasks(page_size=10)["rows"]}
    assert [(rows[7 + i]["rss_peak"], rows[7 + i]["rss_change"]) for i in range(3)] == [
        ((300 << 20) + i, -(1 << 20) * i) for i in range(3)]


def test_records_with_errors_and_retries_keep_them():
    from lightwork.kernel.events import TaskRecord

    rows = [TaskRecord(i, "f" if i % 2 else "g", 0, 1.0 + i, finished=2.0 + i,
                       state="FAILED" if i == 3 else "FINISHED",
                       error="boom" if i == 3 else None,
                       retries=((1.0, "worker died"),) * (i == 4))
            for i in range(6)]
    facts, buffers = feed.pack(rows)
    assert facts["names"] == ["g", "f"] and facts["states"] == ["FINISHED", "FAILED"]
    assert facts["errors"] == [[3, "boom"]] and facts["retries"] == [[4, 1]]
    reply = helpers.sync_reply(facts, 6)
    mirror = Mirror()
    mirror.apply(reply, b"".join(buffers))
    rows_out = {r["task_id"]: r for r in mirror.tasks(page_size=10)["rows"]}
    assert rows_out[3]["error"] == "boom" and rows_out[3]["state"] == "FAILED"
    assert rows_out[4]["retries"] == 1 and rows_out[5]["retries"] == 0
    assert [rows_out[i]["name"] for i in range(6)] == ["g", "f"] * 3
    assert mirror.ended_counts == {"FINISHED": 5, "FAILED": 1}


def test_the_rows_with_errors_and_retries_are_found_in_every_slice():
    from lightwork.kernel.events import TaskRecord

    count = 2 * feed.PACK_SLICE + 123  # three slices, the last one short
    rows = [TaskRecord(i, "f", 0, 1.0, state="FAILED" if i % 7 == 3 else "FINISHED",
                       error=f"boom {i}" if i % 7 == 3 else None,
                       retries=((1.0, "worker died"),) * (1 + i % 2) if i % 11 == 5 else ())
            for i in range(count)]
    facts, _ = feed.pack(rows)
    assert facts["errors"] == [[i, f"boom {i}"] for i in range(count) if i % 7 == 3]
    assert facts["retries"] == [[i, 1 + i % 2] for i in range(count) if i % 11 == 5]
    clean, _ = feed.pack(rows[0:3] + rows[4:5] + rows[6:7])  # none failed or retried
    assert clean["errors"] == [] and clean["retries"] == []


# ---------------------------------------------------------------------------- progress
@lightwork.remote
def parked_until(path: str) -> int:
    while not os.path.exists(path):
        time.sleep(0.01)
    return 1


def test_a_running_get_reports_how_many_of_its_objects_are_ready(node, tmp_path):
    release = str(tmp_path / "release")
    done = [square.remote(i) for i in range(3)]
    lightwork.get(done)
    waiting = [parked_until.remote(release) for _ in range(2)]
    feed.sync(node, 0, 0, 10, 10)  # a page is open: the get observer is on
    getter = threading.Thread(target=lightwork.get, args=(done + waiting,), daemon=True)
    getter.start()
    try:
        deadline = time.monotonic() + 10
        calls: list = []
        while not calls and time.monotonic() < deadline:
            reply, _ = feed.sync(node, 10**9, 10**9, 10, 10)
            calls = [c for c in reply["progress"] if c["objects"] == 5]
            time.sleep(0.02)
        assert calls and calls[0]["ready"] == 3 and calls[0]["kind"] == "get"
        reply, _ = feed.sync(node, 10**9, 10**9, 10, 10)  # looks at the 2 pending only
        assert [c["ready"] for c in reply["progress"] if c["objects"] == 5] == [3]
        # The run's record tells which are pending; a freed (unknown) object was ready.
        with node.lock:
            assert node.pending_objects([waiting[0].id, done[0].id, 10**15, waiting[1].id]
                                        ) == [waiting[0].id, waiting[1].id]
    finally:
        open(release, "w").close()
        getter.join(10)

    class NotARef:  # anything but an ObjectRef is read the slow way
        id = -1

    assert feed._ids_of([NotARef(), *waiting]) == [-1, waiting[0].id, waiting[1].id]
    with node.lock:
        assert node.pending_objects(feed._ids_of([NotARef(), *waiting])) == []


# ---------------------------------------------------------------------------- Dask graphs
def test_running_dask_graphs_come_with_their_progress(node, tmp_path):
    dask = pytest.importorskip("dask")
    import lightwork.dask

    release = str(tmp_path / "release")

    def link(previous: int, i: int, path: str) -> int:
        while i == 4 and not os.path.exists(path):
            time.sleep(0.02)
        return previous + 1

    total = 0
    for i in range(6):
        total = dask.delayed(link)(total, i, release)
    results: list[int] = []
    runner = threading.Thread(
        target=lambda: results.append(total.compute(scheduler=lightwork.dask.get)))
    runner.start()
    try:
        graphs = helpers.wait_until(
            lambda: [g for g in feed.sync(node, 0, 0, 1, 10)[0]["graphs"] if g["done"] == 4],
            timeout=30, message="the Dask graph to reach its gate")
        graph = graphs[0]
        assert graph["name"] == "link" and graph["total"] == 6 and graph["running"] == 1
        assert graph["keys"] == 1 and graph["since"] <= time.monotonic()
    finally:
        open(release, "w").close()
        runner.join(30)
    assert results == [6]
    assert feed.sync(node, 0, 0, 1, 10)[0]["graphs"] == []  # it ended: no bar


# ---------------------------------------------------------------------------- the end
def test_wait_end_checks_its_arguments(node):
    for bad in (0, -1, 26, "5", True, None):
        with pytest.raises(ValueError, match="timeout must be"):
            feed.dispatch(node, "dashboard_wait_end", {"timeout": bad, "watcher": "t"})
    for op in ("dashboard_wait_end", "dashboard_end_seen"):
        for bad in (None, "", 7, "x" * 65):
            with pytest.raises(ValueError, match="watcher must be"):
                feed.dispatch(node, op, {"timeout": 1, "watcher": bad})
    assert feed.dispatch(node, "dashboard_wait_end",
                         {"timeout": 0.05, "watcher": "t"}) == {"closing": False}
    assert feed.dispatch(node, "dashboard_end_seen", {"watcher": "t"}) == {}


DRIVER = """
import os, sys, time, lightwork
from tests import support

@lightwork.remote
def work(i):
    return i

lightwork.get([work.remote(i) for i in range(30)])
print("SOCKET", support.control_path(), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
lightwork.get([work.remote(i) for i in range(7)])  # the last records, just before the end
print("DONE", flush=True)
"""


def test_a_dashboard_from_a_terminal_gets_the_final_state_at_the_end():
    info = helpers.start_session_driver(DRIVER)
    server = DashboardServer(info["socket"], port=0).start()
    try:
        assert server.mirror.ended_counts == {"FINISHED": 30}
        helpers.stop_session_driver(info)  # at once: start() registered the dashboard  # 7 more tasks, then the program exits
        helpers.wait_until(lambda: server.mirror.ended, timeout=20,
                           message="the dashboard to see the program end")
        helpers.wait_until(lambda: "read as it closed" in server.mirror.end_reason,
                           timeout=10, message="the final sync's end reason")
        assert server.mirror.ended_counts == {"FINISHED": 37}
    finally:
        server.stop()


SILENT_DASHBOARD_DRIVER = """
import os, sys, time, lightwork
from tests import support
from lightwork.dashboard import feed
lightwork.init(num_cpus=1)
print("SOCKET", support.control_path(), flush=True)
while not (os.path.exists(sys.argv[1])
           and any(watch._watchers for watch in list(feed._end_watches.values()))):
    time.sleep(0.02)  # the gate is open and a dashboard is registered for the end
started = time.monotonic()
lightwork.shutdown()
print("SHUTDOWN_S", time.monotonic() - started, flush=True)
print("DONE", flush=True)
"""


def test_a_dashboard_that_never_takes_its_final_sync_delays_the_end_boundedly():
    info = helpers.start_session_driver(SILENT_DASHBOARD_DRIVER)
    answers: list[dict] = []
    channel = control.Channel(info["socket"], timeout=30)
    waiter = threading.Thread(target=lambda: answers.append(
        channel.ask("dashboard_wait_end", {"timeout": 20, "watcher": "silent"},
                    timeout=30)[0]))
    waiter.start()
    try:
        open(info["gate"], "w").close()
        out, err = info["process"].communicate(timeout=30)
        waiter.join(10)
        assert answers == [{"closing": True}]  # told, and then silent
        shutdown_s = float(out.split("SHUTDOWN_S ")[1].split()[0])
        # It waited for the final sync, but only FINAL_SYNC_WAIT_S (the request itself
        # would have held the connection for 20 s).
        assert feed.FINAL_SYNC_WAIT_S * 0.9 <= shutdown_s < 15, err
    finally:
        channel.close()


# ---------------------------------------------------------------------------- the process
def test_the_dashboard_process_imports_no_runtime():
    """The dashboard process (``_serve.py``) imports the server without lightwork's
    runtime, cloudpickle or numpy: its memory is the server's and the mirror's."""
    from lightwork.dashboard import SERVE_SCRIPT

    probe = (
        "import runpy, sys\n"
        f"runpy.run_path({SERVE_SCRIPT!r}, run_name='probe')['_bare_package']()\n"
        "import lightwork.dashboard.server, lightwork.dashboard.handler\n"
        "print(' '.join(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", probe], env=helpers.script_env(),
                          capture_output=True, text=True, timeout=30, check=True)
    modules = set(done.stdout.split())
    assert "lightwork.dashboard.server" in modules
    heavy = {"lightwork.api.core", "lightwork.engines.local.node", "lightwork.engines.local.scheduler",
             "lightwork.dashboard.feed", "cloudpickle", "numpy", "psutil"} & modules
    assert not heavy, heavy
