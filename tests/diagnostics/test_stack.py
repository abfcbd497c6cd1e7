"""Stack dumps: every thread of the driver and of every worker, even stuck ones."""

from __future__ import annotations

import os
import signal

import pytest

from tests import helpers, support
import lightwork
from lightwork.diagnostics import stack as stacks
from lightwork.diagnostics.stack import format_stacks, parse_faulthandler, stack

pytestmark = pytest.mark.lightwork_only


@pytest.fixture(scope="module")
def runtime(two_cpus):
    yield


def test_driver_and_workers_stuck_in_c_code(runtime, tmp_path):
    @lightwork.remote
    def stuck_in_sleep(started):
        import time

        open(started, "w").close()
        time.sleep(100)

    @lightwork.remote
    def holds_the_gil(started):
        open(started, "w").close()
        return sum(range(10**12))  # one C call that never releases the GIL

    marks = [str(tmp_path / "sleeping"), str(tmp_path / "spinning")]
    sleeper, busy = stuck_in_sleep.remote(marks[0]), holds_the_gil.remote(marks[1])
    helpers.wait_until(lambda: all(os.path.exists(m) for m in marks), timeout=20)
    try:
        text = stack(timeout=5.0)
        assert repr(text) == str(text)  # shows as text at the prompt
        assert "=== driver (pid %d) ===" % os.getpid() in text
        assert "test_driver_and_workers_stuck_in_c_code" in text  # this very frame
        assert "Thread MainThread" in text and "Thread lightwork-node" in text
        sections = text.split("=== worker ")[1:]
        [sleeping] = [s for s in sections if "running " in s.split("\n")[0] and "stuck_in_sleep" in s.split("\n")[0]]
        assert "(pid " in sleeping and "task worker" in sleeping
        assert "time.sleep(100)" in sleeping and "in stuck_in_sleep" in sleeping
        [spinning] = [s for s in sections if "holds_the_gil" in s.split("\n")[0]]
        assert "sum(range(10**12))" in spinning and "[timeout" not in spinning
        assert "outer frames of lightwork" in sleeping
        assert "forkserver.py" in stack(timeout=5.0, full=True)
    finally:
        lightwork.cancel(busy, force=True)
        lightwork.cancel(sleeper, force=True)
    from lightwork.state import query

    # Right after the kills, the driver may not have seen the deaths yet: a dead or
    # zombie process is reported as exited at once, never waited for until the timeout.
    data = query("stacks", timeout=30.0)
    assert all(w["status"] in ("ok", "exited", "starting") for w in data["workers"])


def test_actor_is_labelled_with_class_and_method(runtime):
    @lightwork.remote
    class Waiter:
        def wait_here(self, path, started):
            open(started, "w").close()
            return helpers.wait_for_file(path)

    waiter = Waiter.remote()
    gate = os.path.join(support.session_directory(), "test-gate")
    started = gate + "-started"
    call = waiter.wait_here.remote(gate, started)
    helpers.wait_until(lambda: os.path.exists(started), timeout=20)
    text = stack(timeout=5.0)
    [section] = [s for s in text.split("=== worker ")[1:] if "actor Waiter" in s.split("\n")[0] or
                 "Waiter (" in s.split("\n")[0]]
    assert "Waiter.wait_here" in section.split("\n")[0] and "in wait_here" in section
    open(gate, "w").close()
    assert lightwork.get(call) is True


def test_a_stopped_worker_times_out_alone(runtime):
    @lightwork.remote
    def noop():
        return None

    lightwork.get([noop.remote() for _ in range(4)])  # workers killed by earlier tests come back
    node = support.driver_node()
    alive = lambda: [c for c in node.workers.values() if c.pid and not c.eof_at and not c.dead]  # noqa: E731
    helpers.wait_until(lambda: len(alive()) >= 2)
    victim = alive()[0]
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        from lightwork.state import query

        data = query("stacks", timeout=2.0)  # the healthy ones answer well within it
        by_id = {w["worker_id"]: w for w in data["workers"]}
        assert by_id[victim.worker_id]["status"] == "timeout"
        assert "may be stopped" in by_id[victim.worker_id]["note"]
        others = [w for w in data["workers"] if w["worker_id"] != victim.worker_id]
        assert others and all(w["status"] == "ok" and w["text"] for w in others)
        assert "[timeout: no complete answer within 2 s" in format_stacks(data)
    finally:
        os.kill(victim.pid, signal.SIGCONT)


def test_native_without_py_spy_says_how_to_install(runtime, monkeypatch):
    monkeypatch.setattr(stacks.shutil, "which", lambda name: None)
    text = stack(native=True, timeout=5.0)
    assert "pip install py-spy" in text and "=== driver" in text


def test_bad_timeout_is_rejected(runtime):
    with pytest.raises(ValueError, match="timeout"):
        stack(timeout=0)


def test_no_runtime(fresh_runtime):
    with pytest.raises(RuntimeError, match="init"):
        stack()


def test_parse_faulthandler_output():
    text = (
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/x/b.py", line 2 in inner\n'
        '  File "/x/a.py", line 9 in outer\n'
        "\n"
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        "  <no Python frame>\n"
    )
    first, second = parse_faulthandler(text)
    assert first["frames"] == [["/x/a.py", 9, "outer"], ["/x/b.py", 2, "inner"]]  # oldest first
    assert second["frames"] == [] and second["notes"] == ["<no Python frame>"]
    data = {"driver": {"pid": 1, "threads": []}, "workers": [
        {"worker_id": 4, "pid": 44, "label": "task worker", "doing": "idle", "status": "ok",
         "note": None, "text": text}]}
    out = format_stacks(data)
    assert "=== worker 4 (pid 44) · task worker · idle ===" in out
    assert 'File "/x/a.py", line 9, in outer' in out and "<no Python frame>" in out



def test_engine_and_runtime_frames_fold_around_the_users_code():
    # A Dask worker thread runs a task under distributed's, dask's and lightwork's layers;
    # the driver's main thread waits in a get through the same layers. Folded, each shows
    # the user's frames, the call into lightwork and the innermost frame; full, all.
    from lightwork.diagnostics.stack import _STDLIB_DIR, format_stacks

    site = "/venv/lib/python3.11/site-packages"
    stdlib = lambda name: os.path.join(_STDLIB_DIR, name)  # noqa: E731
    package = os.path.dirname(lightwork.__file__)
    app = "/home/someone/app.py"
    task_thread = [
        [stdlib("threading.py"), 1002, "_bootstrap"],
        [stdlib("concurrent/futures/thread.py"), 81, "_worker"],
        [f"{site}/distributed/threadpoolexecutor.py", 58, "_worker"],
        [f"{site}/distributed/worker.py", 2821, "_run_task_simple"],
        [f"{site}/dask/_task_spec.py", 768, "__call__"],
        [f"{package}/engines/distributed/worker.py", 169, "run_task"],
        [app, 14, "slow"],
    ]
    main_thread = [
        [app, 39, "<module>"],
        [f"{package}/api/core.py", 558, "get"],
        [f"{package}/engines/distributed/fetch.py", 61, "get"],
        [f"{site}/distributed/client.py", 5560, "wait"],
        [f"{site}/distributed/utils.py", 452, "sync"],
        [stdlib("threading.py"), 331, "wait"],
    ]
    data = {"driver": {"pid": 1, "threads": [
                {"id": 1, "name": "MainThread", "frames": main_thread, "notes": []}]},
            "workers": [{"worker_id": 1, "pid": 2, "label": "tcp://10.0.0.2:1",
                         "doing": "dask worker",
                         "threads": [{"id": 2, "name": "", "frames": task_thread,
                                      "notes": []}]}]}
    folded = format_stacks(data)
    driver, worker = folded.split("=== worker")
    assert "[6 outer frames of lightwork, Dask and thread start-up" in worker
    assert "in slow" in worker and "_run_task_simple" not in worker
    assert "in <module>" in driver and "api/core.py\", line 558, in get" in driver
    assert "[3 inner frames of lightwork and Dask;" in driver
    assert "client.py" not in driver and "threading.py\", line 331, in wait" in driver
    full = format_stacks(data, full=True)
    assert "_run_task_simple" in full and "client.py" in full and "frames of" not in full
