"""init / shutdown / auto-start / re-init, and the public names Ray programs use.

Each test gets a fresh runtime (``fresh_runtime``): nothing running before, all shut
down after. Calls that could hang on a broken runtime run in a helper thread with a
deadline so a hang is a failure with a message, not a suite-wide stall.
"""

from __future__ import annotations

import logging
import os
import threading

import pytest

import lightwork as ray
from tests.helpers import script_env, write_script

pytestmark = pytest.mark.usefixtures("fresh_runtime")

PUBLIC_NAMES = [
    "ObjectRef",
    "available_resources",
    "cancel",
    "cluster_resources",
    "exceptions",
    "get",
    "get_gpu_ids",
    "get_runtime_context",
    "init",
    "is_initialized",
    "put",
    "remote",
    "shutdown",
    "wait",
]


def run_with_deadline(fn, deadline: float = 30.0):
    """Run ``fn`` in a thread: ('ok', value) or ('error', exception); fail on a hang."""
    outcome = []

    def target():
        try:
            outcome.append(("ok", fn()))
        except BaseException as err:  # noqa: BLE001 - we report whatever happened
            outcome.append(("error", err))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(deadline)
    assert not thread.is_alive(), f"call did not return within {deadline} s (hang)"
    return outcome[0]


@ray.remote
def plus_one(x):
    return x + 1


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_public_name_exists(name):
    assert hasattr(ray, name)


def test_import_starts_no_thread_and_no_process(tmp_path):
    import subprocess
    import sys

    script = write_script(
        str(tmp_path),
        "imp.py",
        "import threading, psutil, os\n"
        "import lightwork\n"
        "print(threading.active_count(), len(psutil.Process().children()))\n",
    )
    out = subprocess.run(
        [sys.executable, script], env=script_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["1", "0"]


def test_init_shutdown_is_initialized():
    assert not ray.is_initialized()
    ray.init(num_cpus=2)
    assert ray.is_initialized()
    assert ray.get(plus_one.remote(1)) == 2
    ray.shutdown()
    assert not ray.is_initialized()


def test_second_init_raises_runtimeerror_unless_ignored():
    ray.init(num_cpus=2)
    with pytest.raises(RuntimeError):
        ray.init(num_cpus=2)
    ray.init(num_cpus=2, ignore_reinit_error=True)
    assert ray.is_initialized()
    assert ray.get(plus_one.remote(2)) == 3


def test_shutdown_is_idempotent_and_safe_without_init():
    ray.shutdown()
    ray.init(num_cpus=1)
    ray.shutdown()
    ray.shutdown()
    assert not ray.is_initialized()


def test_init_accepts_ray_keyword_arguments():
    ray.init(
        num_cpus=2,
        num_gpus=0,
        object_store_memory=200 * 1024 * 1024,
        namespace="lightwork-tests",
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        configure_logging=True,
    )
    assert ray.get(plus_one.remote(41)) == 42


def test_init_resources_appear_in_cluster_resources():
    ray.init(num_cpus=3, resources={"widget": 2, "gizmo": 3})
    resources = ray.cluster_resources()
    assert resources["CPU"] == pytest.approx(3)
    assert resources["widget"] == pytest.approx(2)
    assert resources["gizmo"] == pytest.approx(3)
    available = ray.available_resources()
    assert available["CPU"] == pytest.approx(3)


def test_default_cpu_count_comes_from_the_machine():
    ray.init()
    machine = {os.cpu_count(), len(os.sched_getaffinity(0))}
    assert int(ray.cluster_resources()["CPU"]) in machine


def test_first_api_call_without_init_starts_a_runtime():
    assert not ray.is_initialized()
    status, value = run_with_deadline(lambda: ray.get(plus_one.remote(9)))
    assert (status, value) == ("ok", 10)
    assert ray.is_initialized()


def test_put_without_init_starts_a_runtime():
    status, value = run_with_deadline(lambda: ray.get(ray.put("auto")))
    assert (status, value) == ("ok", "auto")
    assert ray.is_initialized()


@pytest.mark.lightwork_only  # Ray reads its variable once, at import
@pytest.mark.parametrize("variable", ["LIGHTWORK_ENABLE_AUTO_CONNECT", "RAY_ENABLE_AUTO_CONNECT"])
def test_auto_start_turned_off_makes_a_call_before_init_raise(monkeypatch, variable):
    """With auto-connect off, ``.remote()`` or ``put`` before ``init`` raises at once and
    starts nothing; after ``init``, the same calls work. The variable is read at the
    call, not at import."""
    monkeypatch.setenv(variable, "0")
    status, error = run_with_deadline(lambda: plus_one.remote(1))
    assert status == "error" and isinstance(error, RuntimeError)
    assert variable in str(error) and "init()" in str(error)
    status, error = run_with_deadline(lambda: ray.put(1))
    assert status == "error" and isinstance(error, RuntimeError)
    assert not ray.is_initialized()
    ray.init(num_cpus=1)
    assert ray.get(plus_one.remote(1)) == 2


@pytest.mark.lightwork_only
def test_lightworks_auto_connect_variable_wins_over_rays(monkeypatch):
    monkeypatch.setenv("RAY_ENABLE_AUTO_CONNECT", "0")
    monkeypatch.setenv("LIGHTWORK_ENABLE_AUTO_CONNECT", "1")
    status, value = run_with_deadline(lambda: ray.get(plus_one.remote(9)))
    assert (status, value) == ("ok", 10)


def test_use_after_shutdown_restarts_or_fails_clearly_but_never_hangs():
    ray.init(num_cpus=2)
    assert ray.get(plus_one.remote(0)) == 1
    ray.shutdown()
    status, value = run_with_deadline(lambda: ray.get(plus_one.remote(1)))
    if status == "ok":
        assert value == 2
    else:
        assert isinstance(value, (RuntimeError, ray.exceptions.RayError)), repr(value)
        assert str(value)


def test_get_of_a_ref_from_a_previous_session_never_hangs():
    """Spec: use after shutdown is a clear error or works, never a hang. Ray hangs here
    (the ref's owner is gone and the new session waits for it)."""
    ray.init(num_cpus=1)
    old = plus_one.remote(1)
    assert ray.get(old) == 2
    ray.shutdown()
    status, value = run_with_deadline(lambda: ray.get(old, timeout=None), deadline=20)
    if status == "error":
        assert isinstance(value, (RuntimeError, ray.exceptions.RayError)), repr(value)
        assert not isinstance(value, ray.exceptions.GetTimeoutError)


def test_init_after_shutdown_gives_a_working_runtime():
    ray.init(num_cpus=1)
    ray.shutdown()
    ray.init(num_cpus=2)
    assert ray.cluster_resources()["CPU"] == pytest.approx(2)
    assert ray.get([plus_one.remote(i) for i in range(4)]) == [1, 2, 3, 4]


def test_driver_runtime_context():
    ray.init(num_cpus=1)
    ctx = ray.get_runtime_context()
    assert ctx.get_job_id()
    assert ray.get_gpu_ids() == []


@pytest.mark.parametrize("bad", [-1, "four"])
def test_init_rejects_bad_num_cpus(bad):
    """Ray raises TypeError for a string and may accept -1; the spec asks for ValueError."""
    with pytest.raises(ValueError):
        ray.init(num_cpus=bad)
    assert not ray.is_initialized()
