"""The fork server imports the driver's libraries before it forks workers (preload.py).

Which modules are chosen is tested on made-up module tables; the importing in a fresh
interpreter (a library that starts a thread stops it); the whole in real driver
processes, whose tasks and actors look at their own ``sys.modules`` before touching
anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import types

import pytest

from lightwork.engines.local import preload
from tests.helpers import run_script, script_env, write_script

pytestmark = pytest.mark.lightwork_only

SITE = sysconfig.get_paths()["purelib"]


def fake_module(name: str, file: str | None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = types.SimpleNamespace(name=name)  # type: ignore[assignment]
    if file is not None:
        module.__file__ = file
    return module


def test_only_installed_libraries_outside_never_and_the_job_dirs_are_chosen(tmp_path):
    job_dir = tmp_path / "job"
    modules = {
        "alib": fake_module("alib", os.path.join(SITE, "alib", "__init__.py")),
        "alib.core": fake_module("alib.core", os.path.join(SITE, "alib", "core.py")),
        "__main__": fake_module("__main__", os.path.join(SITE, "main.py")),
        "mine": fake_module("mine", str(tmp_path / "mine.py")),  # the program's own
        "torch": fake_module("torch", os.path.join(SITE, "torch", "__init__.py")),
        "torch.cuda": fake_module("torch.cuda", os.path.join(SITE, "torch", "cuda.py")),
        "nsp": fake_module("nsp", None),  # a namespace package: no file
        "known": fake_module("known", os.path.join(SITE, "known.py")),
        "job_mod": fake_module("job_mod", str(job_dir / "job_mod.py")),
        "not_a_module": object(),
    }
    chosen = preload.modules_to_preload(modules, known={"known"}, excluded_dirs=[str(job_dir)])
    assert chosen == ["alib", "alib.core"]  # in import order


def test_a_working_dir_inside_site_packages_is_still_left_out(tmp_path):
    inside = os.path.join(SITE, "some_job_dir")
    modules = {"job_mod": fake_module("job_mod", os.path.join(inside, "job_mod.py"))}
    assert preload.modules_to_preload(modules, excluded_dirs=[inside]) == []


def _import_in_fresh_python(tmp_path, names):
    code = textwrap.dedent("""
        import json, sys
        from lightwork.engines.local import preload
        report = preload.import_modules(json.loads(sys.argv[1]), {"LW_PRELOAD_PROBE": "1"})
        report["loaded"] = sorted(n for n in json.loads(sys.argv[1]) if n in sys.modules)
        print(json.dumps(report))
    """)
    env = script_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(names)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_skips_failures_silences_output_and_stops_at_a_thread(tmp_path):
    (tmp_path / "lw_quiet.py").write_text(
        "import os, warnings\nprint('noise')\nwarnings.warn('careful')\n"
        "ENV = os.environ.get('LW_PRELOAD_PROBE')\n")
    (tmp_path / "lw_broken.py").write_text("raise SystemExit('no')\n")
    (tmp_path / "lw_threaded.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n")
    (tmp_path / "lw_after.py").write_text("")
    report = _import_in_fresh_python(
        tmp_path, ["lw_quiet", "lw_broken", "lw_threaded", "lw_after"])
    assert report["failed"] == ["lw_broken"]
    assert report["threaded"] == "lw_threaded"  # it stopped there: lw_after was not imported
    assert report["loaded"] == ["lw_quiet", "lw_threaded"]
    assert report["imported"] == 2


DRIVER = """
import os, sys
import iniconfig                      # an installed library the workers never need
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lw_own_module                  # the program's own module
import lightwork as ray

ray.init(num_cpus=1)

@ray.remote
def loaded():
    return {name: name in sys.modules for name in ("iniconfig", "lw_own_module", "pygments")}

print("TASK", ray.get(loaded.remote(), timeout=60))
import pygments                       # imported after init, before the actor's creation

@ray.remote
class Probe:
    def loaded(self):
        return {name: name in sys.modules for name in ("iniconfig", "pygments")}

print("ACTOR", ray.get(Probe.remote().loaded.remote(), timeout=60))
from lightwork.api import core
print("REPORTS", len(core.driver_node().forkserver.preloaded))
"""


@pytest.mark.parametrize("start_method", ["exec", "fork"])
def test_workers_start_with_the_drivers_libraries_and_not_its_own_modules(tmp_path,
                                                                          start_method):
    pytest.importorskip("iniconfig")
    pytest.importorskip("pygments")
    (tmp_path / "lw_own_module.py").write_text("VALUE = 1\n")
    script = write_script(str(tmp_path), "driver.py", DRIVER)
    proc = run_script(script, timeout=90,
                      env={"LIGHTWORK_FORKSERVER": start_method, "LIGHTWORK_PRELOAD": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines()
                 if line.split(" ", 1)[0] in ("TASK", "ACTOR", "REPORTS"))
    task = eval(lines["TASK"])
    assert task["iniconfig"] and not task["pygments"]  # pygments came after the workers
    if start_method == "exec":  # (a forked server is a copy of the driver: it has all)
        assert not task["lw_own_module"]
    assert eval(lines["ACTOR"]) == {"iniconfig": True, "pygments": True}
    # A forked server has the driver's modules of init: only what came later is sent.
    assert int(lines["REPORTS"]) == 2 if start_method == "exec" else int(lines["REPORTS"]) >= 1


def test_the_switch_turns_it_off(tmp_path):
    pytest.importorskip("iniconfig")
    pytest.importorskip("pygments")
    (tmp_path / "lw_own_module.py").write_text("VALUE = 1\n")
    script = write_script(str(tmp_path), "driver.py", DRIVER)
    proc = run_script(script, timeout=90,
                      env={"LIGHTWORK_FORKSERVER": "exec", "LIGHTWORK_PRELOAD": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'iniconfig': False" in proc.stdout and "REPORTS 0" in proc.stdout


def test_an_import_that_never_ends_is_cut_at_the_budget(tmp_path):
    (tmp_path / "lw_forever.py").write_text("import time\nwhile True:\n    time.sleep(0.01)\n")
    (tmp_path / "lw_next.py").write_text("")
    code = textwrap.dedent("""
        import json, sys
        from lightwork.engines.local import preload
        report = preload.import_modules(["lw_forever", "lw_next"], {}, budget_s=0.5)
        report["loaded"] = "lw_next" in sys.modules
        print(json.dumps(report))
    """)
    env = script_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["failed"] == ["lw_forever"] and report["loaded"] is False
