"""What a worker process sees: thread-count variables and the driver's sys.path.

Each test starts its own runtime, because both contracts depend on the driver's state
at ``init`` time.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

import lightwork as ray

pytestmark = pytest.mark.usefixtures("fresh_runtime")

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@ray.remote
def worker_env():
    return {name: os.environ.get(name) for name in THREAD_VARS}


def test_thread_variables_set_to_cpu_share(monkeypatch):
    """Spec: all three are set. Ray sets only OMP_NUM_THREADS, so this fails against Ray."""
    for name in THREAD_VARS:
        monkeypatch.delenv(name, raising=False)
    ray.init(num_cpus=2)
    env = ray.get(worker_env.remote())
    for name in THREAD_VARS:
        assert env[name] is not None, f"{name} not set in the worker"
        assert int(env[name]) == 1, env
    assert "OMP_NUM_THREADS" not in os.environ  # the driver's own environment is untouched


def test_user_thread_variables_are_kept(monkeypatch):
    for name in THREAD_VARS:
        monkeypatch.setenv(name, "3")
    ray.init(num_cpus=2)
    assert ray.get(worker_env.remote()) == {name: "3" for name in THREAD_VARS}


def test_workers_see_driver_sys_path(tmp_path, monkeypatch):
    """Spec: workers see the driver's sys.path. Ray workers only see the working
    directory, so this fails against Ray."""
    name = f"lw_user_module_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            def shout(s):
                return s.upper() + "!"
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ray.init(num_cpus=2)

    @ray.remote
    def use_module(s):
        import importlib

        return importlib.import_module(name).shout(s)

    assert ray.get(use_module.remote("hi"), timeout=20) == "HI!"
    # A function defined in that module is shipped by reference and imported there too.
    module = __import__(name)
    assert ray.get(ray.remote(module.shout).remote("ref"), timeout=20) == "REF!"
    sys.modules.pop(name, None)
