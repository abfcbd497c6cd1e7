"""The fork server forked from the driver at ``init`` (``forkserver.py``), and its fallback.

Each test runs its driver in a fresh subprocess: under pytest the driver always has
threads (pytest-timeout's timer), so ``init`` here would always take the exec path.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import helpers
from tests.helpers import script_env, write_script

pytestmark = pytest.mark.lightwork_only  # lightwork's own process model

FORKED_DRIVER = r"""
import os, select, signal, sys
import lightwork as ray
from tests import support

read_end, write_end = os.pipe()  # the driver keeps this writer open across init()
signal.signal(signal.SIGHUP, lambda *_: print("driver handler ran in", os.getpid()))
sys.stdout.write("text-buffered-before-init\n")  # stdout is a pipe: block-buffered
ray.init(num_cpus=2)
print("start_method", support.forkserver().start_method)

@ray.remote
def probe(writer):
    target = os.readlink(f"/proc/self/fd/{writer}") if os.path.exists(f"/proc/self/fd/{writer}") else "closed"
    print("task-printed", flush=True)
    return (signal.getsignal(signal.SIGHUP) == signal.SIG_DFL, os.getsid(0), target)

default_handler, worker_session, writer_target = ray.get(probe.remote(write_end), timeout=30)
print("worker_signal_default", default_handler)
print("own_session", worker_session != os.getsid(0))
print("writer_in_worker", writer_target)
os.close(write_end)  # the only writer left: the reader must see EOF now
readable, _, _ = select.select([read_end], [], [], 10)
print("pipe_eof", bool(readable) and os.read(read_end, 1) == b"")

from lightwork.diagnostics.stack import format_stacks
from lightwork.state import query

data = query("stacks", request_timeout=40, timeout=30)  # one dump, shown both ways
workers = format_stacks(data).split("=== worker ")[1:]
print("workers_in_stack", len(workers))
print("driver_frames_in_workers", sum(__file__ in section for section in workers))
ray.shutdown()
"""


def _run(tmp_path, name: str, body: str, **env: str) -> dict[str, str]:
    script = write_script(str(tmp_path), name, body)
    environment = {**script_env(), **env}
    environment.pop("PYTHONUNBUFFERED", None)
    out = subprocess.run([sys.executable, script], env=environment, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    facts = dict(line.split(" ", 1) for line in lines if " " in line)
    facts["_stdout"] = out.stdout
    return facts


def test_a_single_threaded_driver_forks_its_fork_server_and_lets_go_of_its_state(tmp_path):
    facts = _run(tmp_path, "forked_driver.py", FORKED_DRIVER)
    assert facts["start_method"] == "fork"
    # Text the driver had buffered is printed once, not again by each worker.
    assert facts["_stdout"].count("text-buffered-before-init") == 1
    assert "task-printed" in facts["_stdout"]
    # The driver's signal handler does not run in workers; Ctrl-C reaches the driver only.
    assert facts["worker_signal_default"] == "True"
    assert "driver handler ran" not in facts["_stdout"]
    assert facts["own_session"] == "True"
    # The driver's descriptors are let go of: its pipe's writer is /dev/null in a worker,
    # so closing it in the driver gives the reader EOF.
    assert facts["writer_in_worker"] in ("/dev/null", "closed")
    assert facts["pipe_eof"] == "True"
    # Workers' stacks fold the driver's frames the fork copied below the fork server's.
    assert int(facts["workers_in_stack"]) >= 2
    assert facts["driver_frames_in_workers"] == "0"


def test_stacks_fold_the_driver_frames_a_forked_worker_carries_but_not_its_task():
    from lightwork.engines.local import forkserver
    from lightwork.engines.local import worker
    from lightwork.diagnostics.stack import format_stacks

    app = "/home/someone/app.py"
    frames = [
        [app, 9, "<module>"],  # the driver's ray.init(), copied by the fork
        [forkserver.__file__, 120, "main_in_forked_driver"],
        [forkserver.__file__, 170, "_spawn"],
        [worker.__file__, 790, "main"],
        [app, 5, "crunch"],  # the task the worker runs now (defined in the same script)
    ]
    data = {"driver": {"pid": 1, "threads": []},
            "workers": [{"worker_id": 1, "pid": 2, "label": "task worker", "doing": "running crunch",
                         "threads": [{"id": 1, "name": "", "frames": frames, "notes": []}]}]}
    folded = format_stacks(data)
    assert "in <module>" not in folded and "in crunch" in folded
    assert "[4 outer frames" in folded
    full = format_stacks(data, full=True)
    assert "in <module>" in full and "in crunch" in full


FALLBACKS = r"""
import os, threading, time
import lightwork as ray
from tests import support
from lightwork.engines.local import fork_client as session

@ray.remote
def add(a, b):
    return a + b

def run(label):
    ray.init(num_cpus=1)
    method = support.forkserver().start_method
    print(label, method, ray.get(add.remote(1, 2), timeout=30))
    ray.shutdown()

limit = session.FORK_RSS_LIMIT
session.FORK_RSS_LIMIT = 1 << 20  # any driver is bigger than 1 MiB
run("big_driver")
session.FORK_RSS_LIMIT = limit
os.environ["LIGHTWORK_FORKSERVER"] = "exec"
run("asked_for_exec")
del os.environ["LIGHTWORK_FORKSERVER"]
release = threading.Event()
thread = threading.Thread(target=release.wait)
thread.start()
run("thread_alive")
release.set()
thread.join()
# join() returns before the OS thread is gone from /proc/self/task (a moment, longer on
# a loaded machine): the decision reads the OS's count, so wait for it.
deadline = time.monotonic() + 10
while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < deadline:
    time.sleep(0.01)
run("threads_gone")  # a second init after shutdown: lightwork's threads are gone too
"""


def test_a_driver_with_threads_or_much_memory_gets_the_execd_fork_server(tmp_path):
    facts = _run(tmp_path, "fallbacks.py", FALLBACKS)
    assert facts["big_driver"] == "exec 3"
    assert facts["asked_for_exec"] == "exec 3"
    assert facts["thread_alive"] == "exec 3"
    assert facts["threads_gone"] == "fork 3"


KILLED_DRIVER = r"""
import os, sys, time
import lightwork as ray
from tests import support
ray.init(num_cpus=2)

@ray.remote
def pid():
    return os.getpid()

pids = set(ray.get([pid.remote() for _ in range(4)], timeout=30))
node = support.driver_node()
print(node.forkserver.start_method, node.forkserver.process.pid, *pids, flush=True)
print(node.session.shm_dir, node.session.directory, flush=True)
time.sleep(60)
"""


def test_a_forked_fork_server_cleans_up_when_the_driver_is_killed(tmp_path):
    script = write_script(str(tmp_path), "killed.py", KILLED_DRIVER)
    driver = subprocess.Popen([sys.executable, script], env=script_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        method, *pids = driver.stdout.readline().split()
        paths = driver.stdout.readline().split()
        assert method == "fork" and all(os.path.exists(path) for path in paths)
    finally:
        driver.kill()
        driver.wait(10)
    processes = [int(pid) for pid in pids]
    assert helpers.wait_until(lambda: not helpers.still_running(processes), timeout=20)
    assert helpers.wait_until(lambda: not any(os.path.exists(path) for path in paths),
                              timeout=20)
