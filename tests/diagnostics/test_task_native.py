"""profile_tasks(native=True): py-spy samples the workers, C frames included, by task.

A task that spends its time in zlib's C code must show zlib's frames under its own
function, and so must an async actor's method; py-spy missing, or not allowed to
ptrace, must say what to do and leave no profile running; from another terminal,
``lightwork profile --native`` gives the same.
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import subprocess
import sys
import zlib

import pytest

from tests import helpers, support
import lightwork
from lightwork.diagnostics.task_profiler import profile_tasks
from lightwork.engines.local import native_sampler

pytestmark = pytest.mark.lightwork_only

DATA = os.urandom(1 << 17)


def py_spy_works() -> str:
    """Why py-spy cannot sample here ("" if it can)."""
    try:
        exe = native_sampler.py_spy()
    except FileNotFoundError as exc:
        return str(exc)
    done = subprocess.run([exe, "dump", "--pid", str(os.getpid())], capture_output=True,
                          text=True, timeout=30)
    return "" if done.returncode == 0 else done.stderr


needs_py_spy = pytest.mark.skipif(bool(py_spy_works()), reason="py-spy cannot ptrace here")


@lightwork.remote
def squeezes(times: int) -> int:
    for _ in range(times):
        zlib.compress(DATA, 9)
    return os.getpid()


@lightwork.remote
class Packer:
    async def packs(self, times: int) -> int:
        for _ in range(times):
            zlib.compress(DATA, 9)
        return 1

    async def pid(self) -> int:
        return os.getpid()


def native_under(prof, label: str) -> int:
    """Samples of ``label`` with a frame in zlib's C code."""
    return sum(n for stack_label, _w, frames, n in prof.stacks if stack_label == label
               and any("zlibmodule.c" in f or "libz" in f for f in frames))


@needs_py_spy
def test_c_frames_show_under_their_task(two_cpus):
    packer = Packer.remote()
    lightwork.get([squeezes.remote(1) for _ in range(4)] + [packer.packs.remote(1)])
    before = sample_files()
    with profile_tasks(native=True) as prof:
        lightwork.get([squeezes.remote(10) for _ in range(6)]
                      + [packer.packs.remote(10) for _ in range(2)])
    assert prof.native and "C frames by py-spy" in prof.top()
    assert native_under(prof, "squeezes") > 0, prof.top()
    assert native_under(prof, "Packer.packs") > 0, prof.top()
    assert len(prof.workers) >= 2, prof.processes
    # The task's own Python frame is its root; none of the runtime's frames is above it.
    roots = {frames[0] for label, _w, frames, _n in prof.stacks if label == "squeezes"}
    assert roots == {"squeezes (test_task_native.py)"}, roots
    # The workers' own samplers stayed off (py-spy's samples are not counted twice):
    # none wrote its file.
    assert sample_files() == before


@needs_py_spy
def test_a_worker_started_during_the_profile_is_sampled(two_cpus):
    lightwork.get(squeezes.remote(1))
    node = support.driver_node()
    with profile_tasks(native=True) as prof:
        late = Packer.remote()  # a worker of its own, forked after the profile began
        pid = lightwork.get(late.pid.remote())
        recorder = node.sampling.native
        helpers.wait_until(lambda: pid in recorder.workers.values(), timeout=20,
                           message=f"a py-spy attached to the new worker {pid}")
        lightwork.get([late.packs.remote(20) for _ in range(2)])
    assert pid in {p["pid"] for p in prof.processes if p["samples"]}, prof.processes
    assert native_under(prof, "Packer.packs") > 0, prof.top()
    assert not recorder._watcher.is_alive()  # stopped with the profile


def sample_files() -> dict[str, int]:
    pattern = os.path.join(support.session_directory(), "sample-w*.json")
    return {path: os.stat(path).st_mtime_ns for path in glob.glob(pattern)}


def test_py_spy_missing_or_not_permitted_says_what_to_do(two_cpus, monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="on their own"):
        with profile_tasks(native=True, mode="cprofile"):
            pass
    lightwork.get(squeezes.remote(1))  # a worker to sample
    monkeypatch.setattr(native_sampler.shutil, "which", lambda *a, **k: None)
    with pytest.raises(FileNotFoundError, match="pip install py-spy"):
        with profile_tasks(native=True):
            pass
    monkeypatch.undo()
    fake = tmp_path / "py-spy"  # as py-spy answers where ptrace is not allowed
    fake.write_text("#!/bin/sh\necho 'Error: Permission Denied (os error 13)' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("py-spy") == str(fake)
    with pytest.raises(PermissionError, match="ptrace_scope"):
        with profile_tasks(native=True):
            pass
    monkeypatch.undo()
    with profile_tasks() as prof:  # none of those left a profile running
        lightwork.get(squeezes.remote(2))
    assert not prof.native


DRIVER = """
import os, sys
import lightwork
from tests import support
from tests.diagnostics.test_task_native import squeezes

lightwork.init(num_cpus=2)
print("SOCKET", os.path.join(support.session_directory(), "control.sock"), flush=True)
gate = sys.argv[1]
while not os.path.exists(gate):
    lightwork.get([squeezes.remote(3) for _ in range(4)])
lightwork.shutdown()
print("DONE", flush=True)
"""


@needs_py_spy
def test_cli_samples_c_frames_of_a_running_program(tmp_path):
    info = helpers.start_session_driver(DRIVER)
    try:
        out = tmp_path / "native.txt"
        done = subprocess.run(
            [sys.executable, "-m", "lightwork", "profile", "--native", "--seconds", "1.5",
             "-o", str(out)], env=info["env"], capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stderr
        lines = out.read_text().splitlines()
        assert any(line.startswith("squeezes;") and "zlibmodule.c" in line for line in lines)
    finally:
        helpers.stop_session_driver(info)
