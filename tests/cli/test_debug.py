"""``lightwork debug`` in a real terminal (pexpect) against a running program whose
tasks and actor methods stop in the debugger: ``breakpoint()``, post-mortem, two pauses
at once, a worker killed while attached."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile

import pytest

from tests import helpers

pexpect = pytest.importorskip("pexpect", reason="the test extra: pip install 'lightwork[test]'")
pytestmark = pytest.mark.lightwork_only

PROMPT = r"\(Pdb\) "
PAUSED = r"run `lightwork debug` to attach"

DRIVER = """
import os, sys
import lightwork
from lightwork import exceptions

lightwork.init(num_cpus=2, post_mortem=True)

@lightwork.remote
def add_one(x):
    y = x + 1
    breakpoint()
    y = y * 2
    return y

@lightwork.remote
class Counter:
    def __init__(self):
        self.n = 5

    def add(self, k):
        self.n += k
        breakpoint()
        return self.n

@lightwork.remote(max_retries=0)
def divide(x):
    secret = x * 3
    return secret / 0

@lightwork.remote
def stop(i):
    breakpoint()
    return i * 10

@lightwork.remote(max_retries=0)
def doomed():
    breakpoint()
    return 1

print("RESULT1", lightwork.get(add_one.remote(20)), flush=True)
print("RESULT2", lightwork.get(Counter.remote().add.remote(2)), flush=True)
try:
    lightwork.get(divide.remote(4))
except ZeroDivisionError as exc:
    print("CAUGHT", type(exc.cause if hasattr(exc, "cause") else exc).__name__, flush=True)
print("RESULT4", lightwork.get([stop.remote(1), stop.remote(2)]), flush=True)
try:
    lightwork.get(doomed.remote())
except exceptions.WorkerCrashedError:
    print("CRASHED", flush=True)
lightwork.shutdown()
print("DONE", flush=True)
"""


@pytest.fixture
def session():
    home = tempfile.mkdtemp(prefix="lw")  # short: a Unix socket path has ~104 bytes
    env = helpers.script_env()
    env["TMPDIR"] = home
    env.pop("PYTHONBREAKPOINT", None)
    script = helpers.write_script(home, "driver.py", DRIVER)
    driver = pexpect.spawn(sys.executable, [script], env=env, encoding="utf-8",
                           timeout=helpers.HANG_LIMIT_S * 2, cwd=home)
    yield driver, env, script
    driver.close(force=True)
    shutil.rmtree(home, ignore_errors=True)


def debug(env, *args):
    client = pexpect.spawn(sys.executable, ["-m", "lightwork", "debug", *args], env=env,
                           encoding="utf-8", timeout=helpers.HANG_LIMIT_S * 2)
    return client


def attach(env):
    client = debug(env)
    client.expect(PROMPT)
    return client


def command(client, line):
    client.sendline(line)
    client.expect(PROMPT)
    return client.before


def test_debugging_a_program_from_another_terminal(session):
    driver, env, script = session
    stopped_at = open(script).read().splitlines().index("    y = y * 2") + 1
    # A task: the driver names it; p shows the argument, n steps, c gives the result.
    driver.expect(PAUSED)
    assert "add_one (task" in driver.before and f"driver.py:{stopped_at}" in driver.before
    client = attach(env)
    assert "paused in add_one" in client.before and "-> y = y * 2" in client.before
    assert "20" in command(client, "p x")
    assert "-> return y" in command(client, "n")
    assert "(21, 42)" in command(client, "p x + 1, y")
    client.sendline("c")
    client.expect("the call continues")
    client.expect(pexpect.EOF)
    driver.expect(r"RESULT1 42")

    # An actor method: its state is there; Ctrl-D detaches and it stays paused.
    driver.expect(PAUSED)
    client = attach(env)
    assert "(7, 2)" in command(client, "p self.n, k")
    client.sendeof()
    client.expect("stays paused")
    client.expect(pexpect.EOF)
    listing = debug(env, "--list")
    listing.expect(pexpect.EOF)
    assert "Counter.add" in listing.before and "breakpoint" in listing.before
    client = attach(env)
    assert "-> return self.n" in client.before
    client.sendline("c")
    client.expect(pexpect.EOF)
    driver.expect(r"RESULT2 7")

    # Post-mortem: the frame that raised, its locals; then the caller gets the error.
    driver.expect(PAUSED)
    assert "stopped after it raised ZeroDivisionError" in driver.before
    client = attach(env)
    assert "-> return secret / 0" in client.before
    assert "(12, 4)" in command(client, "p secret, x")
    assert "Oldest frame" in command(client, "u")
    client.sendline("c")
    client.expect(pexpect.EOF)
    driver.expect("CAUGHT ZeroDivisionError")

    # Two pauses at once: listed, attached to one after the other.
    driver.expect(PAUSED)
    driver.expect(PAUSED)
    client = debug(env)
    client.expect(r"attach to which")
    table = client.before
    assert table.count("stop") >= 2, table
    client.sendline("1")
    client.expect(PROMPT)
    first = command(client, "p i")
    client.sendline("c")
    client.expect(pexpect.EOF)
    client = attach(env)  # the one left: attached at once
    second = command(client, "p i")
    client.sendline("c")
    client.expect(pexpect.EOF)
    assert {first.split()[-1], second.split()[-1]} == {"1", "2"}
    driver.expect(r"RESULT4 \[10, 20\]")

    # The worker killed while attached: the client says so, the caller gets the crash.
    driver.expect(PAUSED)
    pid = int(driver.before.rsplit("worker pid ", 1)[1].split(":")[0])
    client = attach(env)
    os.kill(pid, signal.SIGKILL)
    client.expect("was killed or crashed while paused")
    client.expect(pexpect.EOF)
    driver.expect("CRASHED")
    driver.expect("DONE")


def test_nothing_paused(session):
    driver, env, _script = session
    driver.expect(PAUSED)  # a session runs (paused); its calls are all there is to attach
    listing = debug(env, "--list", "--session", "no-such-session")
    listing.expect(pexpect.EOF)
    listing.close()
    assert listing.exitstatus == 1 and "no running lightwork session named" in listing.before
    waited = debug(env, "123456")
    waited.expect("no paused call is task 123456")
    waited.sendline("q")
    waited.expect(pexpect.EOF)
