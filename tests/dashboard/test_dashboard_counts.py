"""The dashboard's totals: the event log's cumulative ended counts, the history and
throughput built from them, and a dashboard that asks the driver nothing while no page
is open (``init(dashboard=True)``'s child included) yet shows the right totals when one
opens; and the URL ``lightwork demo --dashboard`` prints. Every test starts its own
session (``fresh_runtime``, or a program of its own).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

from tests import helpers, support
import pytest
from tests.dashboard.test_dashboard import _client_of, _open_stream, _synthetic_sync

import lightwork
from lightwork.kernel.events import EventLog, TaskRecord  # what the dashboard reads
from lightwork.dashboard import feed
from lightwork.dashboard.mirror import Mirror

pytestmark = pytest.mark.lightwork_only


@lightwork.remote
def square(x: int) -> int:
    return x * x


@lightwork.remote
def broken() -> None:
    raise KeyError("on purpose")


def test_the_event_log_counts_every_ended_task_past_its_ring():
    log = EventLog(budget=3)
    for i in range(5):
        log.finish_task(TaskRecord(i, "f", 0, 0.0, state="FAILED" if i == 2 else "FINISHED"))
    assert len(log.tasks) == 3 and log.dropped_tasks == 2
    assert dict(log.ended_counts) == {"FINISHED": 4, "FAILED": 1}
    off = EventLog(budget=0)  # the log turned off counts nothing either
    off.finish_task(TaskRecord(0, "f", 0, 0.0, state="FINISHED"))
    assert dict(off.ended_counts) == {}


def test_a_sync_carries_the_totals_and_a_summary_sync_moves_no_cursor(fresh_runtime):
    lightwork.init(num_cpus=2, event_budget=50)
    node = support.driver_node()
    lightwork.get([square.remote(i) for i in range(118)])
    for _ in range(2):
        with pytest.raises(KeyError):
            lightwork.get(broken.remote())
    records = feed.FeedTotals.records
    summary, attached = feed.sync(node, 0, 0, 0, 10)  # max_records 0: counts only
    assert summary["tasks"]["ended"] == {"FINISHED": 118, "FAILED": 2}
    assert summary["tasks"]["count"] == 0 and attached == []
    assert summary["tasks"]["cursor"] == 0 and summary["tasks"]["lost"] == 0
    assert feed.FeedTotals.records == records  # nothing packed
    from lightwork.kernel import introspect

    assert feed._progress._observe not in introspect.blocking_observers  # get unobserved
    reply, _ = feed.sync(node, 0, 0, 1000, 10)  # the ring holds the newest 50
    assert reply["tasks"]["count"] == 50 and reply["tasks"]["lost"] == 70
    assert reply["tasks"]["cursor"] == 120
    assert reply["tasks"]["ended"] == {"FINISHED": 118, "FAILED": 2}
    assert feed.FeedTotals.records == records + 50
    assert feed._progress._observe in introspect.blocking_observers  # a page looks


def _counts_sync(now: float, ended: dict[str, int], first: int = 0,
                 count: int = 0) -> tuple[dict, bytes]:
    reply, attached = _synthetic_sync(first, count, ["f"], 0.0)
    reply["now"] = now
    reply["tasks"]["ended"] = ended
    reply["tasks"]["cursor"] = sum(ended.values())
    return reply, attached


def test_history_and_throughput_are_differences_of_the_driver_totals_across_a_gap():
    mirror = Mirror()
    mirror.apply(*_counts_sync(10.0, {"FINISHED": 100}, 0, 100))
    mirror.apply(*_counts_sync(11.0, {"FINISHED": 200}, 100, 100))
    assert mirror.overview()["throughput"] == 100.0
    # No page for a minute: no sync. Then one sync brings 40 records (the rest left the
    # ring) and the driver's totals, which count every task that ended meanwhile.
    reply, attached = _counts_sync(71.0, {"FINISHED": 6_200, "FAILED": 10}, 6_170, 40)
    reply["tasks"]["lost"] = 5_970
    mirror.apply(reply, attached)
    overview = mirror.overview()
    assert overview["tasks"]["ended"] == {"FINISHED": 6_200, "FAILED": 10}
    assert overview["tasks"]["recorded"] == 240
    assert [point[2:] for point in overview["history"]] == [[100, 0], [200, 0], [6_200, 10]]
    assert overview["throughput"] == round((6_210 - 200) / 60.0, 1)  # the gap's average
    assert any("5,970 task records left" in b and "counts include them" in b
               for b in overview["banners"])
    mirror.apply(*_counts_sync(72.0, {"FINISHED": 6_300, "FAILED": 10}, 6_210, 100))
    # Over the last 10 s: from the newest point at least that old (before the gap).
    assert mirror.overview()["throughput"] == round((6_310 - 200) / 61.0, 1)


def test_a_dashboard_started_by_init_does_not_sync_while_no_page_is_open(
        fresh_runtime, monkeypatch):
    from lightwork.dashboard import server as server_module

    monkeypatch.setattr(server_module, "IDLE_WAKE_S", 0.05)
    lightwork.init(num_cpus=2)
    node = support.driver_node()
    # As the child runs it: following a program (here this one), started idle.
    server = server_module.DashboardServer(node.control.path, port=0,
                                           follow_program=1).start()
    server.program_pid = None  # (this test's process is not its parent)
    try:
        assert not server.active
        syncs = server.mirror.syncs
        turns = server.sync_turns
        lightwork.get([square.remote(i) for i in range(30)])
        helpers.wait_until(lambda: server.sync_turns >= turns + 5, timeout=20,
                           message="five idle turns of the sync loop")
        assert server.mirror.syncs == syncs  # nothing asked while nobody looks
        client = _client_of(server.url)
        # The first request after the pause is answered with the totals at once ...
        # (from its summary sync; the woken sync thread may have brought the records too)
        assert client.json("/api/overview")["tasks"]["ended"] == {"FINISHED": 30}
        stream = _open_stream(client)  # ... and a page opens: the records follow
        try:
            helpers.wait_until(lambda: client.json("/api/overview")["tasks"]["recorded"] == 30,
                               timeout=20, message="the records at the next syncs")
        finally:
            stream.close()
    finally:
        server.stop()


CHILD_PROGRAM = """
import sys, time, lightwork
from tests import support
from lightwork.kernel import introspect
from lightwork.dashboard import feed

ctx = lightwork.init(num_cpus=2, include_dashboard=True, event_budget=300)

@lightwork.remote
def work(i):
    return i

@lightwork.remote
def fail():
    raise ValueError("on purpose")

def totals():  # syncs, records packed, observers on get/wait (the dashboard's: none)
    return (f"{feed.FeedTotals.syncs} {feed.FeedTotals.records} "
            f"{len(introspect.blocking_observers)}")

print("URL", ctx["dashboard_url"], flush=True)
print("PID", support.dashboard_child().process.pid, flush=True)
print("START", totals(), flush=True)
for _ in range(8):  # no page open: the driver must pay nothing
    lightwork.get([work.remote(i) for i in range(125)])
    time.sleep(0.1)
try:
    lightwork.get(fail.remote())
except ValueError:
    pass
print("IDLE", totals(), flush=True)
if sys.argv[1] == "page":
    sys.stdin.readline()  # the test opened its page and saw the totals
    lightwork.get([work.remote(i) for i in range(200)])
    print("MORE", flush=True)
    sys.stdin.readline()
lightwork.shutdown()
print("END", totals(), flush=True)
"""


def _run_child_program(tmp_path, mode: str) -> tuple[subprocess.Popen, dict[str, str]]:
    script = helpers.write_script(str(tmp_path), "prog.py", CHILD_PROGRAM)
    env = helpers.script_env()
    env["TMPDIR"] = tempfile.mkdtemp(prefix="lw")  # short: a Unix socket path has ~104 bytes
    process = subprocess.Popen([sys.executable, script, mode], env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    lines: dict[str, str] = {}
    for _ in range(4):  # URL, PID, START, IDLE
        key, _, value = process.stdout.readline().strip().partition(" ")
        lines[key] = value
    return process, lines


def _kill_leftovers(process: subprocess.Popen, lines: dict[str, str]) -> None:
    import psutil

    if process.poll() is None:
        process.kill()
        process.communicate(timeout=30)
    if lines.get("PID"):
        try:
            psutil.Process(int(lines["PID"])).kill()
        except psutil.NoSuchProcess:
            pass


def test_init_dashboard_packs_nothing_without_a_page_then_a_page_gets_the_totals(tmp_path):
    process, lines = _run_child_program(tmp_path, "page")
    try:
        assert lines["IDLE"] == lines["START"], lines  # no sync while no page was open
        client = _client_of(lines["URL"])
        first = client.json("/api/overview")  # the first look: the totals at once
        assert first["tasks"]["ended"] == {"FINISHED": 1000, "FAILED": 1}
        stream = _open_stream(client)
        try:
            overview = helpers.wait_until(
                lambda: (o := client.json("/api/overview"))["tasks"]["recorded"] == 300 and o,
                timeout=30, message="the ring's newest records")
            assert any("701 task records left" in b for b in overview["banners"])
            newest = client.json("/api/tasks?sort=task_id&page_size=1")["rows"][0]
            assert newest["state"] == "FAILED"  # the last task the program ran
            process.stdin.write("go\n")
            process.stdin.flush()
            assert process.stdout.readline().strip() == "MORE"
            overview = helpers.wait_until(
                lambda: (o := client.json("/api/overview"))["tasks"]["ended"].get(
                    "FINISHED") == 1200 and o, timeout=30, message="the next 200 tasks")
            assert overview["history"][-1][2:] == [1200, 1]
            assert overview["throughput"] is not None and overview["throughput"] > 0
        finally:
            stream.close()
        process.stdin.write("go\n")
        process.stdin.flush()
        _out, err = process.communicate(timeout=40)
        assert process.returncode == 0, err
    finally:
        _kill_leftovers(process, lines)


def test_init_dashboard_without_a_page_takes_a_summary_final_sync(tmp_path):
    process, lines = _run_child_program(tmp_path, "nopage")
    try:
        out, err = process.communicate(timeout=40)
        assert process.returncode == 0, err
        start_syncs, start_records, observers = map(int, lines["START"].split())
        end_syncs, end_records, _ = map(int, out.split("END ", 1)[1].split())
        assert lines["IDLE"] == lines["START"]
        assert end_records == start_records == 0  # not one record packed in the program
        assert observers == 0  # nor any get observed
        assert end_syncs == start_syncs + 1  # the summary at shutdown
    finally:
        _kill_leftovers(process, lines)


def test_a_summary_sync_gives_a_late_page_the_final_totals(fresh_runtime):
    lightwork.init(num_cpus=2)
    node = support.driver_node()
    lightwork.get([square.remote(i) for i in range(12)])
    from lightwork.dashboard.server import DashboardServer

    server = DashboardServer(node.control.path, port=0, follow_program=1)
    server.program_pid = None
    try:
        assert server.sync_now(records=False)
        assert server.mirror.ended_counts == {"FINISHED": 12}
        assert server.mirror.rows == 0 and server.mirror.task_cursor == 0
        assert server.sync_now()  # then a page opens: the records, none counted lost
        assert server.mirror.rows == 12 and server.mirror.lost == 0
    finally:
        server.httpd.server_close()


def test_the_demo_prints_its_dashboard_url(fresh_runtime, monkeypatch, tmp_path, capfd):
    import io

    from lightwork import cli

    # The experiments themselves are test_cli's; here only the URL of their session.
    monkeypatch.setattr(cli, "_loop_experiments", lambda out: None)
    monkeypatch.setattr(cli, "_dask_example", lambda out, path: None)
    assert cli.demo(io.StringIO(), timeline_path=str(tmp_path / "demo.json"),
                    dashboard=True) == 0
    err = capfd.readouterr().err
    assert err.count("dashboard at http://127.0.0.1:") == 1 and "token=" in err
