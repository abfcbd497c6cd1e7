"""Workers start sooner: the exec'd fork server imports only the worker's part of lightwork.

The pool's workers are asked for at ``init``. A single-threaded driver forks its fork
server (``test_forkserver_start.py``); otherwise the server is exec'd and the first batch
waits for it to import what a worker needs. The diagnostics, ``lightwork.util`` and
``lightwork.state`` are left to first use there (PEP 562), while the driver still
imports them with the package, so ``init()`` pays none of it. Figures: ``bench/``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import lightwork as ray

from tests.helpers import script_env, write_script

pytestmark = pytest.mark.lightwork_only  # lightwork's own start-up

HEAVY = ("lightwork.diagnostics.advisor", "lightwork.diagnostics.timeline",
         "lightwork.diagnostics.stack", "lightwork.state", "lightwork.util", "asyncio")


def _imported_after(tmp_path, env_extra: dict[str, str], code: str) -> list[str]:
    script = write_script(str(tmp_path), "probe.py", "import sys\nimport lightwork\n" + code)
    out = subprocess.run([sys.executable, script], env={**script_env(), **env_extra},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_workers_import_leaves_diagnostics_to_first_use(tmp_path):
    probe = f"print(*[name for name in {HEAVY!r} if name in sys.modules])\n"
    assert _imported_after(tmp_path, {"_LIGHTWORK_WORKER_IMPORT": "1"}, probe) == []
    # The driver's import is unchanged: everything is there before init().
    driver = _imported_after(tmp_path, {}, probe)
    assert set(HEAVY) - {"asyncio"} <= set(driver)


def test_lazy_names_still_resolve_in_the_workers_import(tmp_path):
    code = (
        "from lightwork import advise, timeline\n"
        "print(lightwork.util.ActorPool.__name__, callable(lightwork.state.list_tasks),\n"
        "      callable(advise), callable(timeline), 'stack' in dir(lightwork))\n"
        "try:\n"
        "    lightwork.no_such_name\n"
        "except AttributeError as error:\n"
        "    print('AttributeError')\n"
    )
    words = _imported_after(tmp_path, {"_LIGHTWORK_WORKER_IMPORT": "1"}, code)
    assert words == ["ActorPool", "True", "True", "True", "True", "AttributeError"]


@ray.remote
def what_the_worker_imported():
    return sorted(name for name in HEAVY if name in sys.modules), os.environ.get(
        "_LIGHTWORK_WORKER_IMPORT")


@ray.remote
def uses_the_lazy_parts():
    import lightwork

    return lightwork.util.ActorPool.__name__, callable(lightwork.advise)


def test_workers_come_from_the_lean_import_and_can_still_use_everything(fresh_runtime,
                                                                     monkeypatch):
    monkeypatch.setenv("LIGHTWORK_FORKSERVER", "exec")  # a forked server has the driver's
    # ... and so would this one, preloaded with the driver's libraries (preload.py): the
    # test is of lightwork's own import.
    monkeypatch.setenv("LIGHTWORK_PRELOAD", "0")
    ray.init(num_cpus=2)
    imported, flag = ray.get(what_the_worker_imported.remote(), timeout=60)
    assert imported == [] and flag is None  # the switch does not leak into tasks
    assert ray.get(uses_the_lazy_parts.remote(), timeout=60) == ("ActorPool", True)
