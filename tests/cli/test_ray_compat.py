"""Ray programs run unchanged: ``python -m lightwork run`` and ``install_as_ray()``.

Each test writes a real program that does ``import ray`` and runs it in a subprocess, as
a user would; its helper module also does ``import ray``, and is imported by name in the
workers, so the alias is checked there too. (lightwork-only: this is the shim itself.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from tests.helpers import script_env

import lightwork
from lightwork.kernel import ray_alias  # install_as_ray's own module: the subject

pytestmark = pytest.mark.lightwork_only

HELPER_MODULE = """\
import ray

@ray.remote
def triple(x):
    return 3 * x

def through_ray(x):
    # Runs in a worker that imported this module by name: `ray` must be lightwork there.
    return ray.get(triple.remote(x)), ray.__name__
"""

PROGRAM = """\
import sys
import ray
import ray.util
import ray.util.state
from ray.util import ActorPool, inspect_serializability
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from ray.exceptions import RayTaskError, GetTimeoutError, ObjectStoreFullError
from ray import exceptions as rex
from ray.util.queue import Queue, Empty
import ray.util.multiprocessing
from helper_mod import triple, through_ray

ray.init(num_cpus=2)

@ray.remote
def plus_one(x):
    return ray.get(triple.remote(x)) + 1

@ray.remote
class Doubler:
    def go(self, x):
        return 2 * x

def triple_plain(x):
    return 3 * x

@ray.remote
def boom():
    raise KeyError("k")

pool = ActorPool([Doubler.remote(), Doubler.remote()])
print("pool", sorted(pool.map(lambda a, v: a.go.remote(v), [1, 2, 3])))
print("nested", ray.get(plus_one.remote(2)))
print("by-name", ray.get(ray.remote(through_ray).remote(5)))
try:
    ray.get(boom.remote())
except RayTaskError as exc:
    print("caught", isinstance(exc, KeyError), rex.RayTaskError is RayTaskError)
print("ready", ray.get(Doubler.remote().__ray_ready__.remote()))
queue = Queue()
queue.put_nowait_batch([1, 2])
print("queue", queue.get(), queue.get_nowait(), issubclass(Empty, __import__("queue").Empty))
with ray.util.multiprocessing.Pool(2) as pool:
    print("pool-map", pool.map(triple_plain, range(4)))
print("argv", sys.argv[1:])
print("same", ray.get is __import__("lightwork").get, ray.__name__)
sys.exit(7)
"""


def _run(args: list[str], cwd: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], check=False, cwd=cwd, env=script_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_run_command_runs_a_ray_program_unchanged(tmp_path):
    (tmp_path / "helper_mod.py").write_text(HELPER_MODULE)
    (tmp_path / "prog.py").write_text(PROGRAM)
    done = _run(["-m", "lightwork", "run", "prog.py", "--flag", "x"], str(tmp_path))
    assert done.returncode == 7, done.stderr  # the program's own exit status
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["pool"] == "[2, 4, 6]"
    assert lines["nested"] == "7"
    assert lines["by-name"] == "(15, 'lightwork')"
    assert lines["caught"] == "True True"
    assert lines["ready"] == "True"
    assert lines["queue"] == "1 2 True"
    assert lines["pool-map"] == "[0, 3, 6, 9]"
    assert lines["argv"] == "['--flag', 'x']"
    assert lines["same"] == "True lightwork"


def test_run_dash_m_runs_a_module(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text(textwrap.dedent("""\
        import sys
        import ray
        from ray.util.queue import Queue
        print(__name__, ray.get(ray.put(sys.argv[1:])), Queue.__module__)
    """))
    done = _run(["-m", "lightwork", "run", "-m", "pkg.main", "a", "b"], str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "__main__ ['a', 'b'] lightwork.util.queue"


def test_run_reports_a_missing_script_and_a_failing_program(tmp_path):
    missing = _run(["-m", "lightwork", "run", "nowhere.py"], str(tmp_path))
    assert missing.returncode == 2
    assert "no such script: nowhere.py" in missing.stderr
    (tmp_path / "bad.py").write_text("import ray\nraise ValueError('from the program')\n")
    failing = _run(["-m", "lightwork", "run", "bad.py"], str(tmp_path))
    assert failing.returncode == 1
    assert "ValueError: from the program" in failing.stderr
    assert 'bad.py", line 2' in failing.stderr  # the user's traceback, with its file


def test_install_as_ray_in_process_and_unknown_ray_libraries(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent("""\
        import lightwork
        lightwork.install_as_ray()
        lightwork.install_as_ray()  # twice is fine
        import ray, ray.util.multiprocessing, ray.actor
        import ray.util.placement_group
        from ray.util.placement_group import placement_group, PlacementGroup
        print(ray is lightwork, ray.actor.exit_actor is lightwork.actor.exit_actor,
              ray.util.placement_group is placement_group is lightwork.util.placement_group)
        try:
            import ray.data
        except ModuleNotFoundError as exc:
            print("missing", exc.name, "core API" in str(exc))
        try:
            import ray._private.worker
        except ModuleNotFoundError as exc:
            print("private", exc.name)
    """))
    done = _run(["prog.py"], str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True True True", "missing ray.data True",
                                        "private ray._private"]


def test_install_refuses_when_the_real_ray_is_already_imported(monkeypatch):
    fake_ray = type(sys)("ray")
    fake_ray.__file__ = "/site-packages/ray/__init__.py"
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    with pytest.raises(RuntimeError, match="real Ray .* is already imported"):
        lightwork.install_as_ray()
    assert not ray_alias.installed()


def test_alias_resolves_submodules_to_the_lightwork_modules():
    lightwork.install_as_ray()
    try:
        import ray  # the alias
        import ray.exceptions
        import ray.util.state

        assert sys.modules["ray"] is lightwork
        assert ray.exceptions is lightwork.exceptions
        assert ray.util.state.list_tasks is lightwork.state.list_tasks
        assert os.path.basename(lightwork.__spec__.origin) == "__init__.py"
        assert lightwork.__spec__.name == "lightwork"  # the real module is untouched
    finally:
        ray_alias.uninstall_as_ray()
    assert "ray" not in sys.modules and not ray_alias.installed()
