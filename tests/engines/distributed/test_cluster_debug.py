"""The in-task debugger on a real Dask cluster (``dask scheduler`` and ``dask worker``
processes): a driver in its own process pauses at ``breakpoint()`` in a task and an
actor method and post-mortem in a task that raised; ``lightwork debug`` (pexpect, a
terminal of its own) lists and attaches over the worker's TCP listener, which binds to
the worker's cluster address and refuses a client without the session's token."""

from __future__ import annotations

import glob
import io
import json
import os
import shutil
import socket
import sys
import tempfile

import psutil
import pytest

from lightwork.diagnostics import debugging
from tests import helpers

pexpect = pytest.importorskip("pexpect", reason="the test extra: pip install 'lightwork[test]'")
pytestmark = pytest.mark.lightwork_only

PROMPT = r"\(Pdb\) "
PAUSED = r"run `lightwork debug` to attach"

DRIVER = """
import sys
import lightwork

lightwork.init(address=sys.argv[1], post_mortem=True)

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

print("RESULT1", lightwork.get(add_one.remote(20)), flush=True)
from lightwork.diagnostics import task_records
print("WINDOWS", [len(r.paused) for r in task_records() if r.name.endswith("add_one")],
      flush=True)
print("RESULT2", lightwork.get(Counter.remote().add.remote(2)), flush=True)
try:
    lightwork.get(divide.remote(4))
except ZeroDivisionError:
    print("CAUGHT ZeroDivisionError", flush=True)
lightwork.shutdown()
print("DONE", flush=True)
"""


@pytest.fixture
def session(shared_dask_cluster):
    home = tempfile.mkdtemp(prefix="lw")
    env = helpers.script_env()
    env["TMPDIR"] = home  # the driver's session directory, where `lightwork debug` looks
    env.pop("PYTHONBREAKPOINT", None)
    script = helpers.write_script(home, "driver.py", DRIVER)
    driver = pexpect.spawn(sys.executable, [script, shared_dask_cluster.scheduler_file],
                           env=env, encoding="utf-8", timeout=helpers.HANG_LIMIT_S * 3,
                           cwd=home)
    yield driver, env, home
    driver.close(force=True)
    shutil.rmtree(home, ignore_errors=True)


def run(env, *args):
    child = pexpect.spawn(sys.executable, ["-m", "lightwork", *args], env=env,
                          encoding="utf-8", timeout=helpers.HANG_LIMIT_S * 3)
    return child


def attach(env):
    client = run(env, "debug")
    client.expect(PROMPT)
    return client


def command(client, line):
    client.sendline(line)
    client.expect(PROMPT)
    return client.before


def finished(child):
    child.expect(pexpect.EOF)
    child.close()
    return child.before


def ask(home, op, **args):
    """The driver's answer to ``op``, asked on its control socket as the CLI does."""
    from lightwork.kernel import control

    [path] = glob.glob(os.path.join(home, f"lightwork-{os.getuid()}", "*", "control.sock"))
    return control.request(path, op, args or None, timeout=10.0)


def paused_rows(home):
    return ask(home, "debug_paused")["paused"]


def answer_to(address, hello):
    """What a client saying ``hello`` first gets from the paused call's listener."""
    host, port = address[len("tcp://"):].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(hello)
        sock.sendall(b"p x\n")  # a command typed ahead: never run for this client
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
    return received


def test_debugging_a_cluster_task_from_another_terminal(session):
    """Breakpoints in a task and an actor method, post-mortem, a refused token."""
    driver, env, home = session
    # A task on a worker: the driver names it; it is listed with its worker's host.
    driver.expect(PAUSED)
    assert "add_one (task" in driver.before and "paused at a breakpoint" in driver.before
    listing = finished(run(env, "debug", "--list"))
    assert "add_one" in listing and "breakpoint" in listing and "@127.0.0.1" in listing
    tasks = finished(run(env, "list", "tasks"))
    header, *lines = [line for line in tasks.splitlines() if line.strip()]
    assert "PAUSED" in header
    assert any("add_one" in line and " yes " in line for line in lines), tasks
    rows = ask(home, "list", kind="tasks")["rows"]  # what `list tasks --format json` shows
    assert [row["is_debugger_paused"] for row in rows if row["name"].endswith("add_one")] \
        == [True]

    # The listener: on the worker's own cluster address (127.0.0.1 here), not on every
    # interface, and deaf to a client without the session's token.
    [row] = paused_rows(home)
    address = row["socket"]
    assert address.startswith("tcp://127.0.0.1:") and len(row["token"]) == 32
    port = int(address.rsplit(":", 1)[1])
    listening = [c.laddr for c in psutil.Process(row["pid"]).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert [laddr.ip for laddr in listening] == ["127.0.0.1"]
    for hello in (b"HELLO " + b"0" * 32 + b"\n", b"p x\n", b"HELLO\n"):
        assert answer_to(address, hello) == b"\x00refused\n"
    out = io.StringIO()  # the client says so when the worker refuses its token
    read, write = os.pipe()
    with os.fdopen(read) as stdin, os.fdopen(write, "w"):
        assert debugging.attach({**row, "token": "f" * 32}, stdin, out) == 1
    assert "refused the connection" in out.getvalue()
    assert "(Pdb)" not in out.getvalue() and "paused in" not in out.getvalue()
    client = attach(env)  # still paused, and the right token gets in
    assert "paused in add_one" in client.before and "-> y = y * 2" in client.before
    assert "20" in command(client, "p x")
    assert "-> return y" in command(client, "n")
    assert "(21, 42)" in command(client, "p x + 1, y")
    client.sendline("c")
    client.expect("the call continues")
    finished(client)
    driver.expect(r"RESULT1 42")
    driver.expect(r"WINDOWS \[1\]")  # the pause is in its record (the timeline, the advisor)

    # An actor method: its state is there; Ctrl-D detaches and it stays paused.
    driver.expect(PAUSED)
    client = attach(env)
    assert "(7, 2)" in command(client, "p self.n, k")
    client.sendeof()
    client.expect("stays paused")
    finished(client)
    assert [row["name"] for row in paused_rows(home)] == ["Counter.add"]
    client = attach(env)
    assert "-> return self.n" in client.before
    client.sendline("c")
    finished(client)
    driver.expect(r"RESULT2 7")

    # Post-mortem: the frame that raised, its locals; then the caller gets the error.
    driver.expect(PAUSED)
    assert "stopped after it raised ZeroDivisionError" in driver.before
    client = attach(env)
    assert "-> return secret / 0" in client.before
    assert "(12, 4)" in command(client, "p secret, x")
    client.sendline("c")
    finished(client)
    driver.expect("CAUGHT ZeroDivisionError")
    driver.expect("DONE")


ABANDONED = """
import sys, time
import lightwork
from lightwork import state

lightwork.init(address=sys.argv[1])

@lightwork.remote(num_cpus=1)
def stops(i):
    breakpoint()
    return i

refs = [stops.remote(i) for i in range(2)]  # one on each single-thread worker
deadline = time.monotonic() + 60
while sum(row["is_debugger_paused"] for row in state.list_tasks()) < 2:
    assert time.monotonic() < deadline, state.list_tasks()
    time.sleep(0.1)
print("BOTH PAUSED", flush=True)
lightwork.shutdown()  # nobody can attach any more: the paused calls must let go
lightwork.init(address=sys.argv[1])

@lightwork.remote(num_cpus=1)
def plain(i):
    return i * 2

print("AFTER", lightwork.get([plain.remote(i) for i in range(4)], timeout=60), flush=True)
lightwork.shutdown()
"""


def test_calls_paused_when_their_driver_ends_free_their_workers(shared_dask_cluster):
    """The session's end makes its paused calls quit: the workers' threads are free for
    the next session (a single-thread worker would otherwise run nothing more)."""
    home = tempfile.mkdtemp(prefix="lw")
    try:
        env = helpers.script_env()
        env["TMPDIR"] = home
        env.pop("PYTHONBREAKPOINT", None)
        script = helpers.write_script(home, "abandoned.py", ABANDONED)
        driver = pexpect.spawn(sys.executable, [script, shared_dask_cluster.scheduler_file],
                               env=env, encoding="utf-8", timeout=helpers.HANG_LIMIT_S * 6,
                               cwd=home)
        driver.expect("BOTH PAUSED")
        assert driver.before.count(PAUSED.replace("\\", "")) == 2
        driver.expect(r"AFTER \[0, 2, 4, 6\]")
        finished(driver)
        assert driver.exitstatus == 0, driver.before
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _dap_reply(sock, command):
    """Send one Debug Adapter Protocol request; its response (debugpy's wire)."""
    body = json.dumps({"seq": 1, "type": "request", "command": command,
                       "arguments": {"adapterID": "lightwork-test"}}).encode()
    sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, data = data.partition(b"\r\n\r\n")
        length = int(head.split(b":")[1])
        while len(data) < length:
            data += sock.recv(65536)
        message, data = json.loads(data[:length]), data[length:]
        if message.get("type") == "response":
            return message


def test_debugpy_on_a_cluster_worker_waits_on_its_machines_loopback(tmp_path, fresh_runtime,
                                                                   capfd, wait_until):
    """``debugger="debugpy"`` on the cluster: the worker's debugpy listens on 127.0.0.1 of
    its own machine (it takes no token), the driver's line names that machine and the
    tunnel to it; the session's end stops the wait. A cluster of its own: debugpy stays
    in the worker process once loaded."""
    pytest.importorskip("debugpy", reason="the debug extra: pip install 'lightwork[debug]'")
    from tests.dask_cluster import DaskCluster

    own = DaskCluster(str(tmp_path), workers=1).start()
    try:
        lightwork = fresh_runtime
        lightwork.init(address=own.scheduler_file, debugger="debugpy")

        @lightwork.remote
        def waits(x):
            breakpoint()
            return x

        ref = waits.remote(3)
        said = []
        wait_until(lambda: said.append(capfd.readouterr().err) or "attach your editor" in
                   "".join(said), timeout=helpers.HANG_LIMIT_S * 2)
        line = next(line for line in "".join(said).splitlines() if "attach your editor" in line)
        address = line.split("attach your editor to ", 1)[1].split()[0]
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1" and f"ssh -L {port}:127.0.0.1:{port} 127.0.0.1" in line
        assert [row["is_debugger_paused"] for row in lightwork.state.list_tasks()
                if row["name"].endswith("waits")] == [True]
        with pytest.raises(lightwork.exceptions.GetTimeoutError):  # it waits for the editor
            lightwork.get(ref, timeout=0.5)
        with socket.create_connection((host, int(port)), timeout=helpers.HANG_LIMIT_S) as sock:
            reply = _dap_reply(sock, "initialize")
        assert (reply["command"], reply["success"]) == ("initialize", True)
        lightwork.shutdown()  # nobody will attach now: the call runs on, its worker is free
        lightwork.init(address=own.scheduler_file)

        @lightwork.remote
        def plain(x):
            return x + 1

        assert lightwork.get(plain.remote(1), timeout=helpers.HANG_LIMIT_S * 2) == 2
    finally:
        if lightwork.is_initialized():
            lightwork.shutdown()
        left = own.stop()
        assert not left, left


KILLED = """
import sys
import lightwork
from lightwork import exceptions

lightwork.init(address=sys.argv[1])

@lightwork.remote(max_retries=0)
def doomed():
    breakpoint()
    return 1

try:
    lightwork.get(doomed.remote())
except exceptions.WorkerCrashedError:
    print("CRASHED", flush=True)
except Exception as exc:
    print("OTHER", type(exc).__name__, exc, flush=True)
lightwork.shutdown()
"""


def test_a_worker_killed_while_attached_is_said_and_its_caller_hears_of_it(tmp_path):
    """The client says the worker is gone (no pid to look at on another machine); the
    caller gets ``WorkerCrashedError``. A cluster of its own: its worker is killed."""
    import signal

    from tests.dask_cluster import DaskCluster

    own = DaskCluster(str(tmp_path / "cluster"), workers=1)
    os.makedirs(own.directory)
    own.start()
    home = tempfile.mkdtemp(prefix="lw")
    try:
        env = helpers.script_env()
        env["TMPDIR"] = home
        env.pop("PYTHONBREAKPOINT", None)
        script = helpers.write_script(home, "killed.py", KILLED)
        driver = pexpect.spawn(sys.executable, [script, own.scheduler_file], env=env,
                               encoding="utf-8", timeout=helpers.HANG_LIMIT_S * 3, cwd=home)
        driver.expect(PAUSED)
        pid = int(driver.before.rsplit("worker pid ", 1)[1].split(":")[0])
        client = attach(env)
        os.kill(pid, signal.SIGKILL)
        client.expect("closed without a word: the worker was killed or crashed")
        finished(client)
        driver.expect("CRASHED")
        finished(driver)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        left = own.stop()
        assert not left, left
