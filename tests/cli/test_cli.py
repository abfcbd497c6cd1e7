"""The command line, attached to a real running driver in another process.

The driver and every command run with their own TMPDIR, so "the newest session of this
user" is the test's driver and never another program's session on the machine.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile

import pytest

from tests import helpers
from lightwork import cli
from tests.diagnostics.test_timeline import load_trace

pytestmark = pytest.mark.lightwork_only

DRIVER = """
import os, sys, time
import lightwork
from tests import support

lightwork.init(num_cpus=2)

@lightwork.remote
def square(x):
    return x * x

@lightwork.remote
def broken():
    raise KeyError("on purpose")

@lightwork.remote
def parked(path):
    while not os.path.exists(path):
        time.sleep(0.02)
    return True

@lightwork.remote
class Tally:
    def add(self, n):
        return n

tally = Tally.remote()
lightwork.get([square.remote(i) for i in range(8)] + [tally.add.remote(1)])
try:
    lightwork.get(broken.remote())
except KeyError:
    pass
blob = lightwork.put(b"x" * 3_000_000)
gate = sys.argv[1]
waiting = parked.remote(gate)
print("SOCKET", os.path.join(support.session_directory(), "control.sock"), flush=True)
while not os.path.exists(gate):
    time.sleep(0.02)
lightwork.get(waiting)
lightwork.shutdown()
print("DONE", flush=True)
"""


@pytest.fixture(scope="module")
def session():
    info = helpers.start_session_driver(DRIVER)
    yield info
    helpers.stop_session_driver(info)


def run(session, *args, env=None):
    return subprocess.run([sys.executable, "-m", "lightwork", *args], env=env or session["env"],
                          capture_output=True, text=True, timeout=60)


def test_status(session):
    done = run(session, "status")
    assert done.returncode == 0, done.stderr
    assert f"driver pid {session['pid']}" in done.stdout
    assert "running 1" in done.stdout and "failed 1" in done.stdout
    assert "shared memory" in done.stdout
    as_json = json.loads(run(session, "status", "--format", "json").stdout)
    assert as_json["resources"]["total"]["CPU"] == 2 and as_json["actors"] == {"ALIVE": 1}


def test_list_tasks_with_filters_and_formats(session):
    done = run(session, "list", "tasks", "--format", "json", "--limit", "500")
    rows = json.loads(done.stdout)
    assert {r["state"] for r in rows} == {"FINISHED", "FAILED", "RUNNING"}
    running = json.loads(run(session, "list", "tasks", "--filter", "state=RUNNING",
                             "--format", "json").stdout)
    assert [r["name"] for r in running] == ["parked"]
    table = run(session, "list", "tasks", "--filter", "name=square", "--limit", "3").stdout
    assert table.splitlines()[0].split()[:3] == ["TASK_ID", "NAME", "STATE"]
    assert "(showing 3 of 8; use --limit)" in table
    mixed = json.loads(run(session, "list", "tasks", "--filter", "state!=FINISHED",
                           "--format", "json").stdout)
    assert {r["state"] for r in mixed} == {"FAILED", "RUNNING"}


def test_bad_filter_is_a_usage_error(session):
    done = run(session, "list", "tasks", "--filter", "colour=red")
    assert done.returncode == 2
    assert "unknown filter key 'colour'" in done.stderr and "valid keys" in done.stderr
    assert run(session, "list", "tasks", "--filter", "nonsense").returncode == 2
    assert run(session, "list", "tasks", "--limit", "0").returncode == 2


def test_list_actors_workers_objects(session):
    actors = json.loads(run(session, "list", "actors", "--format", "json").stdout)
    assert [(a["class_name"], a["state"]) for a in actors] == [("Tally", "ALIVE")]
    workers = json.loads(run(session, "list", "workers", "--format", "json").stdout)
    assert workers[0]["kind"] == "driver" and workers[0]["pid"] == session["pid"]
    assert {"actor", "task"} <= {w["kind"] for w in workers}
    objects = run(session, "list", "objects").stdout
    assert "shared memory" in objects and "2.9 MB" in objects


def test_summary_and_memory(session):
    summary = run(session, "summary", "tasks")
    assert summary.returncode == 0
    assert "square" in summary.stdout and "FINISHED=8" in summary.stdout
    header = summary.stdout.splitlines()[0].split()
    assert "MEAN_QUEUED" in header and "P95_QUEUED" in header
    assert "TOTAL_QUEUED_S" not in header  # summed over tasks it read as wall time
    [square] = [line for line in summary.stdout.splitlines() if line.startswith("square")]
    assert " 0.000" not in square  # squares run for microseconds: shown with their unit
    assert "µs" in square or "ms" in square
    rows = json.loads(run(session, "summary", "tasks", "--format", "json").stdout)
    [row] = [f for f in rows["functions"] if f["name"] == "square"]
    assert 0 <= row["mean_queued_s"] <= row["p95_queued_s"] or row["count"] == 1
    memory = run(session, "memory")
    assert "by reference kind:" in memory.stdout and "LOCAL_REFERENCE" in memory.stdout
    as_json = json.loads(run(session, "memory", "--format", "json").stdout)
    assert as_json["shared_memory_bytes"] >= 3_000_000


def test_timeline_file_is_a_valid_trace(session, tmp_path):
    path = str(tmp_path / "trace.json")
    done = run(session, "timeline", "--output", path)
    assert done.returncode == 0 and "ui.perfetto.dev" in done.stdout
    events = load_trace(path)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert any(n.startswith("actor Tally") for n in names)
    assert any(e["ph"] == "X" and e["name"] == "parked" for e in events)  # still running
    assert any(e["ph"] == "i" and e["name"] == "failed: broken" for e in events)


def test_stack_labels_every_process(session):
    done = run(session, "stack")
    assert done.returncode == 0, done.stderr
    assert f"=== driver (pid {session['pid']}) ===" in done.stdout
    assert "Thread MainThread" in done.stdout and "time.sleep(0.02)" in done.stdout
    assert "running parked" in done.stdout and "in parked" in done.stdout
    assert "actor Tally" in done.stdout
    native = run(session, "stack", "--native")
    assert native.returncode == 0
    if shutil.which("py-spy") is None:
        assert "pip install py-spy" in native.stdout


def test_choosing_sessions(session):
    name = os.path.basename(os.path.dirname(session["socket"]))
    assert run(session, "status", "--session", name).returncode == 0
    assert run(session, "status", "--address", session["socket"]).returncode == 0
    missing = run(session, "status", "--session", "no-such-session")
    assert missing.returncode == 1 and name in missing.stderr


def test_socket_is_private_and_speaks_only_json(session):
    directory = os.path.dirname(session["socket"])
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(session["socket"]).st_mode) == 0o600
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(session["socket"])
        sock.sendall(b"\x80\x04garbage that is no JSON\n")
        reply = json.loads(sock.makefile().readline())
    assert reply["ok"] is False and reply["type"] == "ValueError"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(session["socket"])
        sock.sendall(b'{"op": "format_disk"}\n')
        reply = json.loads(sock.makefile().readline())
    assert reply["ok"] is False and "unknown operation" in reply["error"]


def test_no_session_running(session, tmp_path):
    env = dict(session["env"], TMPDIR=str(tmp_path))
    for command in (["status"], ["list", "tasks"], ["stack"], ["timeline"]):
        done = run(session, *command, env=env)
        assert done.returncode == 1
        assert "no running lightwork session" in done.stderr and "lightwork.init()" in done.stderr


def test_a_driver_that_does_not_answer(session):
    home = tempfile.mkdtemp(prefix="lw")
    path = os.path.join(home, "mute.sock")
    mute = socket.socket(socket.AF_UNIX)
    mute.bind(path)
    mute.listen(1)  # accepts connections (backlog) but never replies
    try:
        done = run(session, "status", "--address", path, "--timeout", "0.5")
        assert done.returncode == 1 and "did not answer" in done.stderr
        gone = run(session, "status", "--address", os.path.join(home, "gone.sock"))
        assert gone.returncode == 1 and "may have ended" in gone.stderr
    finally:
        mute.close()
        shutil.rmtree(home, ignore_errors=True)


def test_version_and_demo_still_work(monkeypatch, tmp_path, fresh_runtime):
    assert run({"env": helpers.script_env()}, "version").stdout.strip()
    original = cli._loop_experiments
    monkeypatch.setattr(cli, "_loop_experiments",
                        # Tasks long enough that each get finds its task still running even
                        # when the driver is descheduled a while (a get that finds its
                        # results ready blocks for nothing and records no span).
                        lambda out: original(out, sleep_s=0.1, serial_s=0.005))
    out = io.StringIO()
    path = str(tmp_path / "demo.json")
    assert cli.demo(out, timeline_path=path) == 0
    assert "ex1" in out.getvalue() and path in out.getvalue()
    events = load_trace(path)
    gets = [e for e in events if e["ph"] == "X" and e["name"] == "get"]
    assert len(gets) >= 5 + 2  # ex1's staircase of five, then ex2's and ex3's single get


@pytest.mark.parametrize("durations", [
    (0, "0 s"), (4.2e-05, "42.0 µs"), (0.0009999, "999.9 µs"), (0.0123, "12.3 ms"),
    (1.5, "1.500 s"),
])
def test_durations_show_their_unit(durations):
    seconds, text = durations
    assert cli.human_duration(seconds) == text


def test_a_reader_that_stops_early_gets_no_traceback(session):
    """``lightwork list tasks | head``: a real pipe whose reader is gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first write
    try:
        done = subprocess.run([sys.executable, "-m", "lightwork", "list", "tasks"],
                              env=session["env"], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(write_end)
    assert done.returncode == 1
    assert done.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored"
    piped = subprocess.run(f"{sys.executable} -m lightwork list tasks | head -n 1", shell=True,
                           env=session["env"], capture_output=True, text=True, timeout=60)
    assert piped.stdout.split()[:2] == ["TASK_ID", "NAME"] and piped.stderr == ""
