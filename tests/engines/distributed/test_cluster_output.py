"""What tasks and actor methods print on the workers of a real Dask cluster reaches the
driver's terminal (a pexpect terminal, where stdout and stderr meet in the order they
are written), labelled with the call and the worker's pid, in order per worker;
``log_to_driver=False`` keeps it off; ``lightwork logs`` shows one call's lines; the
driver's ``PYTHONBREAKPOINT=0`` turns its workers' breakpoints off; and a driver killed
with SIGKILL leaves none of its session's plugins on the scheduler."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from tests import helpers

pexpect = pytest.importorskip("pexpect", reason="the test extra: pip install 'lightwork[test]'")
pytestmark = pytest.mark.lightwork_only

LABEL = re.compile(r"^\((?P<name>[\w.]+) pid=(?P<pid>\d+)\) (?P<text>.*)$")

DRIVER = """
import logging, os, sys
import lightwork as ray

os.environ["PYTHONBREAKPOINT"] = "0"  # the driver's off switch, for the cluster's workers
ray.init(address=sys.argv[1], log_to_driver=False, post_mortem=True)

@ray.remote
def quiet():
    print("not on the terminal")
    breakpoint()
    return 1

@ray.remote(max_retries=0)
def fails():
    raise KeyError("no pause")

print("QUIET", ray.get(quiet.remote(), timeout=30), flush=True)
try:
    ray.get(fails.remote(), timeout=30)
except KeyError:
    print("RAISED", flush=True)
ray.shutdown()
del os.environ["PYTHONBREAKPOINT"]
ray.init(address=sys.argv[1])

@ray.remote(num_cpus=1)
def speak(i):
    print("hello from task", i)
    logging.warning("warn from task %d", i)
    print("to stderr", i, file=sys.stderr)
    print("partial", i, end="")
    return i

@ray.remote
class Greeter:
    def hi(self):
        print("actor says hi")
        return "hi"

from tests import support
refs = [speak.remote(0), speak.remote(1)]
print("RESULTS", ray.get(refs), flush=True)
print("TASK", support.task_id_of(refs[1]), flush=True)
greeter = Greeter.remote()
print("ACTOR", ray.get(greeter.hi.remote()), flush=True)

@ray.remote(num_cpus=1)
def stuck():
    breakpoint()  # paused when its driver is killed: its worker must get its thread back
    return 0

held = stuck.remote()
import time
deadline = time.monotonic() + 60
while not any(row["is_debugger_paused"] for row in ray.state.list_tasks()):
    assert time.monotonic() < deadline, ray.state.list_tasks()
    time.sleep(0.05)
print("CLIENT", support.cluster_client().id, support.backend().session_tag, flush=True)
sys.stdin.readline()  # killed here
"""


def test_worker_output_on_the_drivers_terminal_and_a_killed_drivers_plugins(
        shared_dask_cluster, wait_until):
    from distributed import Client

    home = tempfile.mkdtemp(prefix="lw")
    env = helpers.script_env()
    env["TMPDIR"] = home  # the driver's session directory, where `lightwork logs` looks
    script = helpers.write_script(home, "driver.py", DRIVER)
    driver = pexpect.spawn(sys.executable, [script, shared_dask_cluster.scheduler_file],
                           env=env, encoding="utf-8", timeout=helpers.HANG_LIMIT_S * 3,
                           cwd=home)
    scheduler = Client(shared_dask_cluster.address, timeout=helpers.HANG_LIMIT_S)
    try:
        driver.expect(r"RESULTS \[0, 1\]\r\n")
        before = driver.before
        assert "QUIET 1" in before and "RAISED" in before and "paused" not in before
        assert "not on the terminal" not in before
        lines = [LABEL.match(line) for line in before.splitlines()]
        labelled = [(m["name"], int(m["pid"]), m["text"]) for m in lines if m]
        for i in (0, 1):  # stdout, logging and stderr in the order written, before the
            pid = next(p for n, p, t in labelled if t == f"hello from task {i}")  # result
            texts = [t for n, p, t in labelled if p == pid and n == "speak"]
            assert texts[0] == f"hello from task {i}" and texts[-1] == f"partial {i}"
            assert texts[2] == f"to stderr {i}" and f"warn from task {i}" in texts[1]
            assert len(texts) == 4  # the partial line stands alone
        driver.expect(r"TASK (\d+)\r\n")
        task_id = int(driver.match.group(1))
        # (an actor's reply goes straight to its caller: its lines may come just after)
        driver.expect(r"CLIENT (\S+) (\d+)\r\n")
        client_id, session = driver.match.group(1), int(driver.match.group(2))
        assert "ACTOR hi" in driver.before
        if "actor says hi" not in driver.before:
            driver.expect("actor says hi")
        assert re.search(r"^\(Greeter\.hi pid=\d+\) actor says hi", driver.before
                         + driver.after, re.M), driver.before

        # One call's lines, kept by the driver, from another terminal.
        done = subprocess.run([sys.executable, "-m", "lightwork", "logs", "--function",
                               "speak"], env=env, capture_output=True, text=True,
                              timeout=helpers.HANG_LIMIT_S * 2)
        assert done.returncode == 0, done.stderr
        assert "hello from task 0" in done.stdout and "hello from task 1" in done.stdout
        assert "to stderr 1" in done.stdout and "actor says hi" not in done.stdout
        [one] = ask(home, "logs", task=task_id)["tasks"]  # `lightwork logs --task ID`
        assert one["task_id"] == task_id and one["name"].endswith("speak")
        assert [line[1] for line in one["lines"]][0::2] == ["hello from task 1", "to stderr 1"]
        assert [line[0] for line in one["lines"]] == ["stdout", "stderr", "stderr", "stdout"]
        rows = ask(home, "list", kind="workers")["rows"]  # `logs --worker N`, N as listed
        [row] = [r for r in rows if r["pid"] == one["pid"] and r["kind"] != "driver"]
        on_worker = ask(home, "logs", worker=row["worker_id"])["tasks"]
        assert task_id in [call["task_id"] for call in on_worker]
        assert {call["pid"] for call in on_worker} == {one["pid"]}

        def plugins() -> list[str]:
            return [name for name in scheduler.run_on_scheduler(
                lambda dask_scheduler: list(dask_scheduler.worker_plugins))
                if name.endswith("@" + client_id)]

        assert sorted(name.split("-")[1] for name in plugins()) == ["debug", "output"]
        assert all(session in v for v in scheduler.run(_forwarding_sessions).values())
        [paused] = ask(home, "debug_paused")["paused"]
        grace = scheduler.run_on_scheduler(_set_grace, seconds=0.5)  # (5 s: a test's time)
        try:
            os.kill(driver.pid, signal.SIGKILL)  # no shutdown: the scheduler cleans up
            wait_until(lambda: not plugins(), timeout=helpers.HANG_LIMIT_S * 2)
        finally:
            scheduler.run_on_scheduler(_set_grace, seconds=grace)
        # The paused call quit: its single-thread worker runs the next task.
        assert scheduler.submit(abs, -1, workers=[paused["worker"]], pure=False).result(
            timeout=helpers.HANG_LIMIT_S * 2) == 1
        forwarding = scheduler.run(_forwarding_sessions)  # the workers let it go too
        assert len(forwarding) == 2 and all(session not in v for v in forwarding.values())
    finally:
        driver.close(force=True)
        scheduler.close()
        shutil.rmtree(home, ignore_errors=True)


def ask(home, op, **args):
    """The driver's answer to ``op``, asked on its control socket as the CLI does."""
    import glob

    from lightwork.kernel import control

    [path] = glob.glob(os.path.join(home, f"lightwork-{os.getuid()}", "*", "control.sock"))
    return control.request(path, op, args, timeout=10.0)


def _forwarding_sessions(dask_worker=None):
    from lightwork.engines.distributed import output

    return sorted(output._forwarding)


def _set_grace(dask_scheduler=None, seconds=0.0):
    """On the scheduler: how long a disconnected client may come back; the old value."""
    from lightwork.engines.distributed.plugin import TaskErrors

    [plugin] = [p for p in dask_scheduler.plugins.values() if isinstance(p, TaskErrors)]
    old, plugin.CLIENT_GONE_GRACE_S = plugin.CLIENT_GONE_GRACE_S, seconds
    return old


class _Broker:
    def __init__(self):
        self.truncated = []

    def truncate(self, topic):
        self.truncated.append(topic)


class _Scheduler:
    """What ``TaskErrors`` reads of a scheduler when a client leaves."""

    def __init__(self, clients, plugins):
        self.clients = set(clients)
        self.worker_plugins = dict.fromkeys(plugins)
        self._broker = _Broker()

    async def unregister_worker_plugin(self, comm, name):
        if self.worker_plugins.pop(name, 0) == 0:
            raise ValueError(f"The worker plugin {name} does not exist")


def test_a_client_that_comes_back_keeps_its_sessions_and_one_gone_loses_them():
    import asyncio

    from lightwork.engines.distributed.plugin import TaskErrors

    names = ["lightwork-debug-1f@Client-a", "lightwork-output-1f@Client-a",
             "lightwork-output-2e@Client-b", "lightwork-exported-refs", "other@Client-a"]
    back = _Scheduler(["Client-a"], names)  # reconnected within the grace period
    asyncio.run(TaskErrors()._drop_sessions_of(back, "Client-a"))
    assert list(back.worker_plugins) == names and not back._broker.truncated
    gone = _Scheduler(["Client-b"], names)
    asyncio.run(TaskErrors()._drop_sessions_of(gone, "Client-a"))
    assert list(gone.worker_plugins) == names[2:]
    assert gone._broker.truncated == ["lightwork-debug-1f", "lightwork-output-1f"]
