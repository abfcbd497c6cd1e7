"""``breakpoint()`` in a task pauses the call on the embedded runtime: the pause is
listed, shown in the state API and the timeline, and a client on its Unix socket drives
pdb. Here the client is a bare socket (``lightwork debug`` itself, in a real terminal,
is ``tests/cli/test_debug.py``'s)."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from tests import helpers, support

pytestmark = pytest.mark.lightwork_only

PROMPT = "(Pdb) "


class Client:
    """A debugger client that speaks the socket's text, as ``lightwork debug`` does."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(helpers.HANG_LIMIT_S)
        self.sock.connect(path)
        self.text = ""

    def until(self, wanted: str) -> str:
        """Read until ``wanted`` arrives (or the connection ends); what came, up to it."""
        while wanted not in self.text:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.text += chunk.decode()
        seen, _, self.text = self.text.partition(wanted)
        return seen + (wanted if _ else "")

    def ask(self, command: str) -> str:
        self.sock.sendall(command.encode() + b"\n")
        return self.until(PROMPT)

    def close(self) -> None:
        self.sock.close()


def said(capfd, text: str) -> str:
    """The driver's stderr until ``text`` is in it: the driver's lines are printed by its
    writer thread, a moment after the pause is listed."""
    seen = []
    helpers.wait_until(lambda: seen.append(capfd.readouterr().err) or text in "".join(seen),
                       timeout=helpers.HANG_LIMIT_S, message=f"{text!r} on stderr")
    return "".join(seen)


def paused(count: int = 1) -> list[dict]:
    return helpers.wait_until(lambda: len(support.paused_calls()) >= count and
                              support.paused_calls(), timeout=helpers.HANG_LIMIT_S,
                              message=f"{count} paused call(s)")


@pytest.fixture(scope="module")
def runtime():
    import lightwork

    if lightwork.is_initialized():
        lightwork.shutdown()
    lightwork.init(num_cpus=2)
    yield lightwork
    lightwork.shutdown()


@pytest.fixture(autouse=True)
def no_pause_left():
    """A test that fails with a call still paused would hand it to the next test's
    ``paused()``: such a runtime is replaced, so each test starts with none paused."""
    import lightwork

    yield
    if lightwork.is_initialized() and support.paused_calls():
        lightwork.shutdown()
        lightwork.init(num_cpus=2)


def test_a_paused_task_is_listed_driven_and_resumed(runtime, capfd):
    from lightwork import state
    from lightwork.diagnostics.timeline import build_trace
    from lightwork.kernel import control, views

    @runtime.remote
    def add_one(x):
        y = x + 1
        breakpoint()
        y = y * 2
        return y

    ref = add_one.remote(20)
    [row] = paused()
    assert row["name"].endswith("add_one") and (row["function"], row["kind"]) == (
        "add_one", "breakpoint")
    assert row["file"] == __file__ and row["pid"] in support.worker_pids()
    assert "add_one" in said(capfd, "add_one")  # the driver's one line
    # The state API and the control socket see it; a get with a timeout still times out.
    [task] = state.list_tasks(filters=[("name", "=", "add_one")])
    assert task["state"] == "RUNNING" and task["is_debugger_paused"] is True
    listed = control.request(support.control_path(), "debug_paused")["paused"]
    assert [r["task_id"] for r in listed] == [task["task_id"]]
    with pytest.raises(runtime.exceptions.GetTimeoutError):
        runtime.get(ref, timeout=0.2)
    assert os.stat(row["socket"]).st_mode & 0o777 == 0o600
    live_trace = build_trace(views.timeline_data(support.driver_node()))
    assert any(e.get("name") == "paused in the debugger" for e in live_trace)

    client = Client(row["socket"])
    greeting = client.until(PROMPT)
    assert "paused in add_one" in greeting and "-> y = y * 2" in greeting
    assert "20" in client.ask("p x")
    assert "21" in client.ask("p y")
    assert "-> return y" in client.ask("n")
    where = client.ask("w")
    assert "add_one()" in where and "lightwork" not in where  # only the user's frames
    assert "Oldest frame" in client.ask("u")
    client.sock.sendall(b"c\n")
    assert "\x00continued" in client.until("\x00continued")
    client.close()
    assert runtime.get(ref, timeout=helpers.HANG_LIMIT_S) == 42
    assert support.paused_calls() == []
    assert not os.path.exists(row["socket"])
    [task] = state.list_tasks(filters=[("name", "=", "add_one")])
    assert task["is_debugger_paused"] is False
    record = next(r for r in support.event_log().tasks if r.name.endswith("add_one"))
    [(began, ended)] = record.paused
    assert record.args_loaded <= began < ended <= record.finished
    trace = build_trace(views.timeline_data(support.driver_node()))
    [mark] = [e for e in trace if e.get("name") == "paused in the debugger"]
    assert mark["args"]["paused_ms"] >= 200  # at least the get that timed out meanwhile


def _minus_one(v):
    w = v - 1
    return w


def test_list_step_into_up_and_down(runtime):
    """``l`` shows the source; ``s`` steps into the user's function; ``u``/``d`` move
    between its frame and the caller's."""
    @runtime.remote
    def outer(x):
        breakpoint()
        z = _minus_one(x)
        return z

    ref = outer.remote(8)
    [row] = paused()
    client = Client(row["socket"])
    client.until(PROMPT)
    listing = client.ask("l")
    assert "z = _minus_one(x)" in listing and "breakpoint()" in listing
    assert "def _minus_one(v)" in client.ask("s")  # (--Call--: into the user's function)
    assert "-> w = v - 1" in client.ask("n")
    assert "-> z = _minus_one(x)" in client.ask("u")
    assert "-> w = v - 1" in client.ask("d")
    assert "8" in client.ask("p v")
    client.sock.sendall(b"c\n")
    assert "\x00continued" in client.until("\x00continued")
    client.close()
    assert runtime.get(ref, timeout=helpers.HANG_LIMIT_S) == 7


def test_detaching_leaves_the_call_paused_and_steps_end_with_the_call(runtime):
    @runtime.remote
    def last_line(x):
        breakpoint()
        return x * 3

    ref = last_line.remote(5)
    [row] = paused()
    first = Client(row["socket"])
    first.until(PROMPT)
    first.close()  # detach: end of file, as Ctrl-D in `lightwork debug`
    time.sleep(0.2)
    assert [r["task_id"] for r in support.paused_calls()] == [row["task_id"]]
    second = Client(row["socket"])
    assert "-> return x * 3" in second.until(PROMPT)  # where the call stands, again
    assert "--Return--" in second.ask("n")
    second.sock.sendall(b"n\n")  # past the call's last frame: the session ends, no
    assert "\x00returned" in second.until("\x00returned")  # step into the worker's loop
    second.close()
    assert runtime.get(ref, timeout=helpers.HANG_LIMIT_S) == 15


def test_an_actor_method_shows_the_actor_state(runtime):
    @runtime.remote
    class Counter:
        def __init__(self):
            self.n = 5

        def add(self, k):
            self.n += k
            import pdb

            pdb.set_trace()
            return self.n

    counter = Counter.remote()
    ref = counter.add.remote(2)
    [row] = paused()
    assert row["name"].endswith("Counter.add")
    client = Client(row["socket"])
    client.until(PROMPT)
    assert "(7, 2)" in client.ask("p self.n, k")
    client.sock.sendall(b"!self.n = 100\n")
    client.until(PROMPT)
    client.sock.sendall(b"c\n")
    client.until("\x00continued")
    client.close()
    assert runtime.get(ref, timeout=helpers.HANG_LIMIT_S) == 100


def test_stepping_over_an_await_in_an_async_actor(runtime):
    @runtime.remote
    class Waiter:
        async def wait(self, x):
            import asyncio

            y = x + 1
            breakpoint()
            await asyncio.sleep(0.05)  # suspends the coroutine: the session goes on
            y += 1
            return y

    ref = Waiter.remote().wait.remote(1)
    [row] = paused()
    client = Client(row["socket"])
    assert "-> await asyncio.sleep(0.05)" in client.until(PROMPT)
    assert "-> y += 1" in client.ask("n")
    assert "-> return y" in client.ask("n")
    assert "3" in client.ask("p y")
    client.sock.sendall(b"n\n")
    client.until("\x00returned")
    client.close()
    assert runtime.get(ref, timeout=helpers.HANG_LIMIT_S) == 3


def test_two_paused_calls_are_attached_one_after_the_other(runtime):
    @runtime.remote
    def stop(i):
        breakpoint()
        return i

    refs = [stop.remote(1), stop.remote(2)]
    rows = paused(2)
    assert len({row["socket"] for row in rows}) == 2 and len({r["pid"] for r in rows}) == 2
    values = []
    for row in rows:
        client = Client(row["socket"])
        client.until(PROMPT)
        values.append(client.ask("p i").split("\n")[0])
        client.sock.sendall(b"c\n")
        client.until("\x00continued")
        client.close()
    assert sorted(values) == ["1", "2"]
    assert runtime.get(refs, timeout=helpers.HANG_LIMIT_S) == [1, 2]


def test_quit_ends_the_call_with_an_error(runtime):
    @runtime.remote(max_retries=0)
    def quitter():
        breakpoint()
        return "never"

    ref = quitter.remote()
    [row] = paused()
    client = Client(row["socket"])
    client.until(PROMPT)
    client.sock.sendall(b"q\n")
    client.until("\x00quit")
    client.close()
    with pytest.raises(Exception) as raised:
        runtime.get(ref, timeout=helpers.HANG_LIMIT_S)
    assert "BdbQuit" in repr(raised.value) + str(raised.value)


def test_cancelling_a_paused_task_ends_its_session(runtime):
    @runtime.remote(max_retries=0)
    def cancelled():
        breakpoint()
        return "never"

    ref = cancelled.remote()
    [row] = paused()
    client = Client(row["socket"])
    client.until(PROMPT)
    runtime.cancel(ref)
    assert "\x00ended" in client.until("\x00ended")
    client.close()
    with pytest.raises(runtime.exceptions.TaskCancelledError):
        runtime.get(ref, timeout=helpers.HANG_LIMIT_S)
    helpers.wait_until(lambda: support.paused_calls() == [], message="the pause forgotten")


def test_a_worker_killed_while_paused_ends_the_session_and_fails_the_call(runtime):
    @runtime.remote(max_retries=0)
    def doomed():
        breakpoint()
        return 1

    ref = doomed.remote()
    [row] = paused()
    client = Client(row["socket"])
    client.until(PROMPT)
    os.kill(row["pid"], signal.SIGKILL)
    assert "\x00" not in client.until("\x00")  # closed without a status line
    client.close()
    with pytest.raises(runtime.exceptions.WorkerCrashedError):
        runtime.get(ref, timeout=helpers.HANG_LIMIT_S)
    helpers.wait_until(lambda: support.paused_calls() == [], message="the pause forgotten")
    assert not os.path.exists(row["socket"])


def _connect_as_nobody(path: str, opened: bool) -> str:
    """In a child that became ``nobody``: try the debugger's socket; what happened."""
    import pwd

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no Python-level cleanup, only the answer
        try:
            os.close(read)
            nobody = pwd.getpwnam("nobody")
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            try:
                sock.connect(path)
                data = sock.recv(100)
                answer = "closed" if not data else "read:" + data.decode(errors="replace")
            except PermissionError:
                answer = "denied"
            except OSError as exc:
                answer = f"error:{exc}"
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        return f.read()


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")
def test_another_user_cannot_attach(runtime):
    @runtime.remote
    def private():
        secret = "s3cr3t"  # noqa: F841 - what another user must not read
        breakpoint()
        return "ok"

    ref = private.remote()
    [row] = paused()
    path = row["socket"]
    # The session directory (0700) keeps another user away from the socket...
    assert _connect_as_nobody(path, opened=False) == "denied"
    # ...and were the files opened to everyone, the peer's uid check still refuses it.
    directories = [os.path.dirname(path), os.path.dirname(os.path.dirname(path))]
    modes = {d: os.stat(d).st_mode & 0o777 for d in directories + [path]}
    try:
        for directory in directories:
            os.chmod(directory, 0o755)
        os.chmod(path, 0o666)
        assert _connect_as_nobody(path, opened=True) == "closed"
    finally:
        for where, mode in modes.items():
            os.chmod(where, mode)
    client = Client(path)  # the session's own user still attaches
    client.until(PROMPT)
    client.sock.sendall(b"c\n")
    client.until("\x00continued")
    client.close()
    assert runtime.get(ref, timeout=helpers.HANG_LIMIT_S) == "ok"


def test_post_mortem_pauses_where_it_raised_then_the_error_travels(fresh_runtime):
    lightwork = fresh_runtime
    lightwork.init(num_cpus=1, post_mortem=True)

    @lightwork.remote(max_retries=0)
    def divide(x):
        secret = x * 3
        return secret / 0

    ref = divide.remote(4)
    [row] = paused()
    assert row["kind"] == "post-mortem" and row["error"] == "ZeroDivisionError: division by zero"
    client = Client(row["socket"])
    greeting = client.until(PROMPT)
    assert "-> return secret / 0" in greeting
    assert "(12, 4)" in client.ask("p secret, x")
    client.sock.sendall(b"c\n")
    client.until("\x00continued")
    client.close()
    with pytest.raises(ZeroDivisionError):
        lightwork.get(ref, timeout=helpers.HANG_LIMIT_S)


def test_pythonbreakpoint_0_turns_every_stop_off(fresh_runtime, monkeypatch):
    lightwork = fresh_runtime
    monkeypatch.setenv("PYTHONBREAKPOINT", "0")
    monkeypatch.setenv("LIGHTWORK_POST_MORTEM", "1")
    lightwork.init(num_cpus=1)

    @lightwork.remote(max_retries=0)
    def stops(fail):
        breakpoint()
        import pdb

        pdb.set_trace()
        if fail:
            raise ValueError("plain error")
        return "ran through"

    assert lightwork.get(stops.remote(False), timeout=helpers.HANG_LIMIT_S) == "ran through"
    with pytest.raises(ValueError, match="plain error"):  # no post-mortem pause either
        lightwork.get(stops.remote(True), timeout=helpers.HANG_LIMIT_S)
    assert support.paused_calls() == []


def test_debugger_options_are_checked(fresh_runtime, monkeypatch):
    lightwork = fresh_runtime
    with pytest.raises(TypeError, match="post_mortem must be True or False"):
        lightwork.init(num_cpus=1, post_mortem="yes")
    with pytest.raises(ValueError, match="debugger must be 'pdb'"):
        lightwork.init(num_cpus=1, debugger="gdb")
    monkeypatch.setenv("LIGHTWORK_POST_MORTEM", "1")
    lightwork.init(num_cpus=1)
    assert support.driver_node().post_mortem is True


def _dap_messages(sock: socket.socket):
    """Debug Adapter Protocol messages read from ``sock``: a header, then JSON."""
    import json
    import re

    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        size = int(re.search(rb"Content-Length: (\d+)", head).group(1))
        while len(data) < size:
            chunk = sock.recv(65536)
            if not chunk:
                return
            data += chunk
        body, data = data[:size], data[size:]
        yield json.loads(body)


def test_debugpy_listens_for_an_editor(fresh_runtime, capfd):
    import json

    pytest.importorskip("debugpy", reason="the debug extra: pip install 'lightwork[debug]'")
    lightwork = fresh_runtime
    lightwork.init(num_cpus=1, debugger="debugpy")

    @lightwork.remote
    def waits(x):
        breakpoint()
        return x

    ref = waits.remote(3)
    [row] = paused()
    assert row["kind"] == "debugpy"
    host, port = row["address"].rsplit(":", 1)
    assert host == "127.0.0.1"
    assert f"attach your editor to {row['address']}" in said(capfd, "attach your editor")
    with pytest.raises(lightwork.exceptions.GetTimeoutError):  # it waits for the editor
        lightwork.get(ref, timeout=0.2)
    with socket.create_connection((host, int(port)), timeout=helpers.HANG_LIMIT_S) as sock:
        body = json.dumps({"seq": 1, "type": "request", "command": "initialize",
                           "arguments": {"adapterID": "lightwork-test"}}).encode()
        sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        reply = next(m for m in _dap_messages(sock) if m.get("type") == "response")
    assert (reply["command"], reply["success"], reply["request_seq"]) == ("initialize", True, 1)
    assert "supportsConfigurationDoneRequest" in reply["body"]
