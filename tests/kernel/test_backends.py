"""The backend seam: which backend runs, how an address picks one, and that the local
backend adds nothing to the embedded runtime's calls."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tests.helpers import script_env
from tests import support

import lightwork
from lightwork.engines import parse_address

pytestmark = pytest.mark.lightwork_only


@lightwork.remote
def backend_inside() -> str:
    return lightwork.backend()


@lightwork.remote
def init_inside() -> str:
    try:
        lightwork.init()
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_backend_is_local_for_the_embedded_runtime(fresh_runtime):
    assert lightwork.backend() == "local"  # before init: the one a call would start
    context = lightwork.init(num_cpus=1)
    assert lightwork.backend() == "local"
    assert context["backend"] == "local" and context["address"] == "local"
    assert lightwork.get(backend_inside.remote()) == "local"


def test_local_backend_calls_the_runtime_directly(fresh_runtime):
    """The seam costs the hot path nothing: the interface's methods are the Node's own."""
    from lightwork.engines.local.node import Node

    lightwork.init(num_cpus=1)
    backend = support.running_backend()
    assert backend.submit_task.__func__ is Node.submit_task
    assert backend.get.__func__ is Node.get
    assert backend.node is support.driver_node() and support.driver_node() is support.driver_node()


def test_init_inside_a_task_is_refused(fresh_runtime):
    lightwork.init(num_cpus=1)
    assert "cannot be called inside a task" in lightwork.get(init_inside.remote())


@pytest.mark.parametrize("address", [None, "", "local", "auto"])
def test_local_addresses(address, monkeypatch):
    monkeypatch.delenv("LIGHTWORK_ADDRESS", raising=False)
    assert parse_address(address) == ("local", None)


def test_cluster_addresses(tmp_path, monkeypatch):
    monkeypatch.delenv("LIGHTWORK_ADDRESS", raising=False)
    scheduler_file = tmp_path / "scheduler.json"
    scheduler_file.write_text("{}")
    assert parse_address("tcp://10.0.0.1:8786") == ("distributed", "tcp://10.0.0.1:8786")
    assert parse_address("local-cluster") == ("distributed", "local-cluster")
    assert parse_address(str(scheduler_file)) == ("distributed", str(scheduler_file))


def test_environment_variable_names_the_address(monkeypatch):
    monkeypatch.setenv("LIGHTWORK_ADDRESS", "tcp://10.0.0.1:8786")
    assert parse_address(None) == ("distributed", "tcp://10.0.0.1:8786")
    assert lightwork.backend() == "distributed"  # before init: what init would connect to
    assert parse_address("auto") == ("distributed", "tcp://10.0.0.1:8786")
    assert parse_address("local") == ("local", None)  # as with Ray: "local" means here


def test_bad_addresses_say_what_is_accepted(monkeypatch):
    monkeypatch.delenv("LIGHTWORK_ADDRESS", raising=False)
    with pytest.raises(ValueError, match="tcp://host:port"):
        parse_address("no-such-scheduler-file.json")
    with pytest.raises(TypeError, match="distributed.Client"):
        parse_address(8786)


def test_import_lightwork_never_imports_distributed():
    code = ("import sys, lightwork, lightwork.engines, lightwork.engines.local.backend\n"
            "print('distributed' in sys.modules, 'dask' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=script_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


# ---- connecting to a real cluster -------------------------------------------------------
def test_connect_by_address_and_by_client_and_shutdown_leaves_a_users_client_open(
        fresh_runtime, shared_dask_cluster):
    distributed = pytest.importorskip("distributed")
    cluster = shared_dask_cluster
    try:
        context = lightwork.init(address=cluster.address)
        assert context["backend"] == "distributed" and context["address"] == cluster.address
        assert lightwork.get(backend_inside.remote()) == "distributed"
        with pytest.raises(RuntimeError, match="already called"):
            lightwork.init(address=cluster.address)
        lightwork.shutdown()
        assert not lightwork.is_initialized()

        with distributed.Client(cluster.address) as client:
            lightwork.init(address=client)
            assert lightwork.get(lightwork.put("by client")) == "by client"
            lightwork.shutdown()
            assert client.status == "running"  # the user's client is the user's to close
        with pytest.raises(ValueError, match="declare their own"):
            lightwork.init(address=cluster.address, num_cpus=2)
        with pytest.raises(lightwork.exceptions.UnsupportedOnBackend,
                           match="runtime_env.*distributed.*--preload"):
            lightwork.init(address=cluster.address, runtime_env={"env_vars": {"A": "1"}})
        assert not lightwork.is_initialized()
    finally:
        lightwork.shutdown()


LOCAL_CLUSTER_SCRIPT = """
import lightwork

@lightwork.remote
def pid():
    import os
    return os.getpid()

if __name__ == "__main__":
    lightwork.init(address="local-cluster", num_cpus=2)
    pids = lightwork.get([pid.remote() for _ in range(20)])
    print(lightwork.backend(), lightwork.cluster_resources()["CPU"], len(set(pids)) >= 1)
    lightwork.shutdown()
"""


def test_local_cluster_starts_and_shutdown_leaves_nothing_behind(tmp_path):
    pytest.importorskip("distributed")
    import psutil
    from tests.helpers import run_script, write_script

    script = write_script(str(tmp_path), "local_cluster.py", LOCAL_CLUSTER_SCRIPT)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = run_script(script, timeout=55)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["distributed", "2.0", "True"]
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left


LOCAL_CLUSTER_EXIT_SCRIPT = """
import time

import lightwork


@lightwork.remote
def slow():
    time.sleep(1.0)
    return 1


if __name__ == "__main__":
    lightwork.init(address="local-cluster", num_cpus=2)
    assert lightwork.get(slow.remote(), timeout=30) == 1
    refs = [slow.remote() for _ in range(3)]
    lightwork.wait(refs, timeout=0.1)
    print("exiting, work in flight", flush=True)
"""


def test_a_local_cluster_program_exiting_with_work_in_flight_says_nothing(tmp_path):
    """No shutdown(), tasks still running: the exit closes the session and the cluster
    without a word. It printed "cannot schedule new futures after interpreter shutdown"
    tracebacks and errors (atexit ran after Python had closed distributed's thread
    pools), then the cluster's reports of each cancelled task."""
    pytest.importorskip("distributed")
    from tests.helpers import run_script, write_script

    script = write_script(str(tmp_path), "exits.py", LOCAL_CLUSTER_EXIT_SCRIPT)
    out = run_script(script, timeout=55)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "exiting, work in flight" in out.stdout
    for word in ("Traceback", "ERROR", "WARNING", "cannot schedule"):
        assert word not in out.stderr, out.stderr[-3000:]


THREAD_OUTLIVES_MAIN_SCRIPT = """
import sys
import threading
import time

import lightwork


@lightwork.remote
def slow(x):
    time.sleep(0.5)
    return x


def work():
    time.sleep(1.0)  # the main thread has ended by now
    value = lightwork.get(slow.remote(7), timeout=30)
    print("thread got", value, "from", lightwork.backend(), flush=True)


if __name__ == "__main__":
    lightwork.init(address=sys.argv[1])
    assert lightwork.get(slow.remote(1), timeout=30) == 1
    threading.Thread(target=work).start()
"""


def test_a_thread_outliving_the_main_thread_keeps_its_cluster_session(
        tmp_path, shared_dask_cluster):
    """The exit closes a cluster session before Python stops its thread pools, but not
    while a thread of the program's own still runs: it may use the session. (On a
    ``local-cluster`` it cannot: the scheduler runs in the program's process, on those
    pools.)"""
    from tests.helpers import script_env, write_script

    script = write_script(str(tmp_path), "thread.py", THREAD_OUTLIVES_MAIN_SCRIPT)
    out = subprocess.run([sys.executable, script, shared_dask_cluster.scheduler_file],
                         env=script_env(), capture_output=True, text=True, timeout=55)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "thread got 7 from distributed" in out.stdout, out.stdout + out.stderr[-3000:]


def test_a_backend_missing_an_operation_cannot_be_made():
    from lightwork.kernel.backend import Backend
    from lightwork.engines.local.backend import LocalBackend

    class Partial(Backend):
        def shutdown(self) -> None:
            pass

    with pytest.raises(TypeError, match="abstract"):
        Partial()
    assert not LocalBackend.__abstractmethods__  # the local backend implements them all
