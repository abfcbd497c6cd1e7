"""The fork server imports the driver's libraries before it forks workers (preload.py).

Which modules are chosen is tested on made-up module tables and real pickles; the
importing in a fresh interpreter (a library that starts a thread stops it, the driver's
next message stops a background one); the whole in real driver processes, whose tasks
and actors ask whether their libraries were imported by their parent, the fork server.
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lw_own_module                  # the program's own module
import lw_lib_task                    # "installed" libraries (see below): one the task uses
import lightwork as ray
from lightwork.engines.local import preload

# This directory stands for site-packages: its modules count as installed libraries.
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")
preload._site_dirs = lambda: (here,)
ray.init(num_cpus=1)
import lw_lib_unused                  # one the tasks never use (after init: no background)

@ray.remote
def loaded(thing):                    # its argument's pickle names lw_lib_task
    return {"preloaded": lw_lib_task.IMPORTED_IN != os.getpid(),
            "lw_own_module": "lw_own_module" in sys.modules,
            "lw_lib_unused": "lw_lib_unused" in sys.modules}

print("TASK", ray.get(loaded.remote(lw_lib_task.Thing()), timeout=60))
import lw_lib_actor                   # imported after init, before the actor's creation

@ray.remote
class Probe:
    def __init__(self, thing):
        pass

    def loaded(self):
        return {"preloaded": lw_lib_actor.IMPORTED_IN != os.getpid()}

print("ACTOR", ray.get(Probe.remote(lw_lib_actor.Thing()).loaded.remote(), timeout=60))
from lightwork.api import core
import time
forkserver = core.driver_node().forkserver
wanted = 2 if forkserver.start_method == "exec" else 1  # (the I/O thread reads them)
if os.environ.get("LIGHTWORK_PRELOAD") == "0":
    wanted = 0
deadline = time.monotonic() + 10
while len(forkserver.preloaded) < wanted and time.monotonic() < deadline:
    time.sleep(0.01)
print("REPORTS", len(forkserver.preloaded))
"""

LIBRARY = "import os\nIMPORTED_IN = os.getpid()\n\nclass Thing:\n    pass\n"


@pytest.mark.parametrize("start_method", ["exec", "fork"])
def test_workers_start_with_the_libraries_their_work_names(tmp_path, start_method):
    """The fork server imports a library the first call's pickles name before it forks
    the worker, which finds it imported by its parent; not one they do not name, and
    the program's own modules never."""
    (tmp_path / "lw_own_module.py").write_text("VALUE = 1\n")
    (tmp_path / "lw_lib_task.py").write_text(LIBRARY)
    (tmp_path / "lw_lib_actor.py").write_text(LIBRARY)
    (tmp_path / "lw_lib_unused.py").write_text(LIBRARY)
    script = write_script(str(tmp_path), "driver.py", DRIVER)
    # (on the path of every process, as an installed library is)
    path = os.pathsep.join([str(tmp_path), script_env()["PYTHONPATH"]])
    proc = run_script(script, timeout=90, env={
        "LIGHTWORK_FORKSERVER": start_method, "LIGHTWORK_PRELOAD": "1", "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines()
                 if line.split(" ", 1)[0] in ("TASK", "ACTOR", "REPORTS"))
    task = eval(lines["TASK"])
    assert task["preloaded"] and not task["lw_lib_unused"]
    if start_method == "exec":  # (a forked server is a copy of the driver: it has all)
        assert not task["lw_own_module"]
    assert eval(lines["ACTOR"]) == {"preloaded": True}  # named by its argument's pickle
    # A forked server has the driver's modules of init: only what came later is sent.
    assert int(lines["REPORTS"]) >= (2 if start_method == "exec" else 1)


def test_the_packages_a_calls_pickles_name_are_found():
    import cloudpickle

    from lightwork.kernel import serialization

    modules = {name: sys.modules[name] for name in ("json", "json.decoder", "textwrap")}

    def uses_a_library(text):
        return json.decoder.JSONDecoder().decode(text)

    function = cloudpickle.dumps(uses_a_library)
    args = serialization.serialize((types.SimpleNamespace(a=1),), None)
    named = preload.packages_named([function, preload.pickle_head(args)], modules)
    assert named == {"json"}  # textwrap is imported but named by neither
    assert preload.packages_named([b"\x8c\x09json.dec"], modules) == set()  # cut short
    chosen = preload.modules_to_preload(
        {"alib": fake_module("alib", os.path.join(SITE, "alib", "__init__.py")),
         "alib.core": fake_module("alib.core", os.path.join(SITE, "alib", "core.py")),
         "blib": fake_module("blib", os.path.join(SITE, "blib.py"))}, packages={"alib"})
    assert chosen == ["alib", "alib.core"]


def test_a_background_preload_gives_way_to_the_drivers_next_message(tmp_path):
    (tmp_path / "lw_first.py").write_text("")
    (tmp_path / "lw_second.py").write_text("")
    code = textwrap.dedent("""
        import json, socket, sys
        from lightwork.engines.local import preload
        ours, theirs = socket.socketpair()
        quiet = preload.import_modules(["lw_first"], {}, stop_when_readable=theirs.fileno())
        ours.send(b"x")  # the driver wants a worker
        asked = preload.import_modules(["lw_second"], {}, stop_when_readable=theirs.fileno())
        print(json.dumps([quiet, asked, "lw_second" in sys.modules]))
    """)
    env = script_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    quiet, asked, second_loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert quiet["imported"] == 1 and quiet["interrupted"] == ""
    assert asked["imported"] == 0 and asked["interrupted"] == "lw_second"
    assert not second_loaded


def test_the_switch_turns_it_off(tmp_path):
    (tmp_path / "lw_own_module.py").write_text("VALUE = 1\n")
    (tmp_path / "lw_lib_task.py").write_text(LIBRARY)
    (tmp_path / "lw_lib_actor.py").write_text(LIBRARY)
    (tmp_path / "lw_lib_unused.py").write_text(LIBRARY)
    script = write_script(str(tmp_path), "driver.py", DRIVER)
    proc = run_script(script, timeout=90,
                      env={"LIGHTWORK_FORKSERVER": "exec", "LIGHTWORK_PRELOAD": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'preloaded': False" in proc.stdout and "REPORTS 0" in proc.stdout


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
