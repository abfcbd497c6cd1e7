"""``lightwork logs`` against a real running driver: what one task, or every call of a
function, printed, as the driver kept it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import helpers

pytestmark = pytest.mark.lightwork_only

DRIVER = """
import os, sys, time
import lightwork
from tests import support

lightwork.init(num_cpus=2, log_to_driver=False)

@lightwork.remote
def chatty(i):
    print("chatty says", i)
    print("chatty warns", i, file=sys.stderr)
    return i

@lightwork.remote
def quiet():
    return 0

lightwork.get([chatty.remote(i) for i in range(3)] + [quiet.remote()])
print("SOCKET", os.path.join(support.session_directory(), "control.sock"), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
lightwork.shutdown()
print("DONE", flush=True)
"""


@pytest.fixture(scope="module")
def session():
    info = helpers.start_session_driver(DRIVER)
    yield info
    helpers.stop_session_driver(info)


def run(session, *args):
    return subprocess.run([sys.executable, "-m", "lightwork", *args], env=session["env"],
                          capture_output=True, text=True, timeout=60)


def test_logs_of_one_task_and_of_a_function(session):
    tasks = json.loads(run(session, "list", "tasks", "--filter", "name=chatty",
                           "--format", "json").stdout)
    assert len(tasks) == 3
    one = tasks[0]["task_id"]  # as the table shows it
    done = run(session, "logs", "--task", str(one), "--format", "json")
    assert done.returncode == 0, done.stderr
    [kept] = json.loads(done.stdout)
    i = kept["lines"][0][1].split()[-1]
    assert kept["task_id"] == one and kept["name"] == "chatty"
    assert kept["lines"] == [["stdout", f"chatty says {i}"], ["stderr", f"chatty warns {i}"]]
    table = run(session, "logs", "--function", "chatty").stdout
    assert sorted(line for line in table.splitlines() if line.startswith("chatty says")) == [
        "chatty says 0", "chatty says 1", "chatty says 2"]
    assert table.count("[stderr] chatty warns") == 3 and table.count("== chatty task") == 3
    nothing = run(session, "logs", "--function", "quiet")
    assert nothing.returncode == 0 and "no output kept for function quiet" in nothing.stdout


def test_logs_needs_a_selector_and_a_task_id(session):
    assert run(session, "logs").returncode == 2
    bad = run(session, "logs", "--task", "not-hex")
    assert bad.returncode == 2 and "not a task id" in bad.stderr
