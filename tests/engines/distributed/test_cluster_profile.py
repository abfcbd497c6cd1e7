"""profile_tasks() on the distributed backend, against a real cluster (``dask scheduler``
plus two single-thread ``dask worker`` processes): Dask's own samples of every worker,
by task function, in a local profile's outputs.

Tasks spend a known split of their time in two functions (``busy_a`` 3 parts, ``busy_b``
1); the merged profile must give about that split under the task's function, with
samples from both workers, and the modes that need the embedded runtime must say so.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests import helpers
import lightwork
from lightwork import exceptions
from lightwork.diagnostics.task_profiler import profile_tasks

pytestmark = pytest.mark.lightwork_only
pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")

UNIT_S = 0.02


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def busy_a(seconds: float) -> None:
    spin(seconds)


def busy_b(seconds: float) -> None:
    spin(seconds)


@lightwork.remote
def cluster_split(unit: float) -> int:
    busy_a(3 * unit)
    busy_b(unit)
    return 1


def samples_in(prof, label: str, function: str) -> int:
    return sum(n for stack_label, _w, frames, n in prof.stacks if stack_label == label
               and any(f.startswith(function + " (") for f in frames))


def test_dask_samples_come_back_by_task_function(cluster):
    lightwork.get([cluster_split.remote(0.001) for _ in range(4)])  # (imports its module)
    time.sleep(2.5)  # Dask's samples come in one-second cycles: keep those out of the window
    with profile_tasks() as prof:
        assert lightwork.get([cluster_split.remote(UNIT_S) for _ in range(40)]) == [1] * 40
    a = samples_in(prof, "cluster_split", "busy_a")
    b = samples_in(prof, "cluster_split", "busy_b")
    assert a and b, prof.top()
    assert 2 <= a / b <= 4.5, prof.top()  # 3 parts to 1
    assert len(prof.workers) == 2, prof.processes
    # Each stack starts at the task's own function: the worker's frames are cut.
    roots = {frames[0] for label, _w, frames, _n in prof.stacks if label == "cluster_split"}
    assert roots == {"cluster_split (test_cluster_profile.py)"}, roots
    assert "cluster_split:" in prof.top() and prof.collapsed().startswith("cluster_split;")


def test_modes_that_need_the_embedded_runtime_say_so(cluster):
    for options in ({"mode": "cprofile"}, {"memory": True}, {"native": True}):
        with pytest.raises(exceptions.UnsupportedOnBackend, match="embedded runtime"):
            with profile_tasks(**options):
                pass
    with profile_tasks() as prof:  # none of those left a profile running
        lightwork.get(cluster_split.remote(0.001))
    with pytest.raises(ValueError, match="already running"):
        with profile_tasks():
            with profile_tasks():
                pass
    assert prof.processes


DRIVER = """
import os, sys, time
import lightwork as ray

context = ray.init(address={address!r})

def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

@ray.remote
def cli_spins():
    spin(0.02)
    return 1

print("SOCKET", os.path.join(context["session_dir"], "control.sock"), flush=True)
gate = sys.argv[1]
while not os.path.exists(gate):
    ray.get([cli_spins.remote() for _ in range(4)])
ray.shutdown()
print("DONE", flush=True)
"""


def test_cli_profiles_a_driver_on_the_cluster(cluster, tmp_path):
    info = helpers.start_session_driver(DRIVER.format(address=cluster.address))
    try:
        out = tmp_path / "cluster.txt"
        done = subprocess.run(
            [sys.executable, "-m", "lightwork", "profile", "--seconds", "2", "-o", str(out)],
            env=info["env"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        lines = out.read_text().splitlines()
        assert any(line.startswith("cli_spins;cli_spins (") and ";spin (" in line
                   for line in lines), lines
        refused = subprocess.run(
            [sys.executable, "-m", "lightwork", "profile", "--seconds", "1", "--mode",
             "cprofile"], env=info["env"], capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "embedded runtime" in refused.stderr
    finally:
        helpers.stop_session_driver(info)


def test_dask_s_uncounted_innermost_frame_gets_its_samples():
    """As a Dask worker samples (``profile.process(frame, True, ...)``): every frame but
    the innermost counts the sample; the stacks must still end in the innermost one."""
    import sys
    import threading

    from distributed import profile

    from lightwork.engines.distributed.profiling import stacks_of

    started = threading.Event()
    done: list[bool] = []

    def innermost():
        started.set()
        while not done:  # (no call: this frame stays the innermost)
            pass

    def caller():
        innermost()

    thread = threading.Thread(target=caller)
    thread.start()
    started.wait(10)
    tree = profile.create()
    try:
        for _ in range(20):
            profile.process(sys._current_frames()[thread.ident], True, tree)
    finally:
        done.append(True)
        thread.join()
    [(frames, count)] = stacks_of(tree)
    assert count == 20
    assert frames[-2:] == ("caller (test_cluster_profile.py)",
                           "innermost (test_cluster_profile.py)"), frames
