"""cProfile mode of the task profiler: every call in every worker counted, merged.

A task calls ``inner`` a known number of times; the merged stats must count exactly
those calls (none lost with a worker, none counted twice), name the task functions as
the roots, and keep lightwork's own functions (loading arguments, storing results)
out. The file written must be pstats' own format.
"""

from __future__ import annotations

import os
import pstats
import subprocess
import sys
import time

import pytest

from tests import helpers
import lightwork
from lightwork.diagnostics.task_profiler import profile_tasks

pytestmark = pytest.mark.lightwork_only

LIGHTWORK_DIR = os.path.dirname(os.path.abspath(lightwork.__file__))


def inner(x: int) -> int:
    return x + 1


@lightwork.remote
def calls_inner(k: int) -> int:
    total = 0
    for i in range(k):
        total += inner(i)
    return os.getpid()


@lightwork.remote
class Caller:
    def call(self, k: int) -> int:
        for i in range(k):
            inner(i)
        return os.getpid()


@lightwork.remote(max_concurrency=3)
class ThreadedCaller:
    def call(self, k: int) -> int:
        for i in range(k):
            inner(i)
        time.sleep(0.002)
        return os.getpid()


def by_name(stats: pstats.Stats) -> dict[str, tuple]:
    """``{name: (cc, nc, tt, ct, callers)}``, functions of one name added up."""
    out: dict[str, tuple] = {}
    for (_file, _line, name), (cc, nc, tt, ct, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if name in out:
            o = out[name]
            out[name] = (o[0] + cc, o[1] + nc, o[2] + tt, o[3] + ct, {**o[4], **callers})
        else:
            out[name] = (cc, nc, tt, ct, callers)
    return out


def test_merged_call_counts_equal_the_calls_made(two_cpus, tmp_path):
    lightwork.get([calls_inner.remote(1) for _ in range(4)])  # both workers started
    caller, threaded = Caller.remote(), ThreadedCaller.remote()
    lightwork.get([caller.call.remote(1), threaded.call.remote(1)])
    with profile_tasks(mode="cprofile") as prof:
        pids = set(lightwork.get([calls_inner.remote(7) for _ in range(30)]))
        pids |= set(lightwork.get([caller.call.remote(3) for _ in range(5)]))
        pids |= set(lightwork.get([threaded.call.remote(2) for _ in range(12)]))
    assert len(pids) >= 3 and not prof.missing
    stats = by_name(prof.pstats())
    # (cc, nc, tt, ct, callers): nc counts every call
    assert stats["inner"][1] == 30 * 7 + 5 * 3 + 12 * 2, stats["inner"]
    assert stats["calls_inner"][1] == 30
    assert stats["call"][1] == 5 + 12  # both actors' methods share a name
    assert prof.calls == 30 + 5 + 12
    # The task functions are the roots: nothing of the worker's loop calls them.
    assert stats["calls_inner"][4] == {}
    files = {file for (file, _l, _n) in prof.pstats().stats}  # type: ignore[attr-defined]
    assert not [f for f in files if f.startswith(LIGHTWORK_DIR)], files
    # A plain run of the same tasks after the block is not counted anywhere.
    lightwork.get([calls_inner.remote(7) for _ in range(10)])
    assert by_name(prof.pstats())["inner"][1] == 30 * 7 + 5 * 3 + 12 * 2

    path = tmp_path / "tasks.pstats"
    prof.dump_stats(str(path))
    loaded = by_name(pstats.Stats(str(path)))
    assert loaded["inner"][1] == stats["inner"][1]
    # `python -m pstats` reads it (its browser, fed two commands)
    browsed = subprocess.run([sys.executable, "-m", "pstats", str(path)], input="stats 5\nquit\n",
                             capture_output=True, text=True, timeout=60)
    assert "inner" in browsed.stdout and "function calls" in browsed.stdout, browsed


def test_print_stats_prints_as_pstats_does(two_cpus, capsys):
    with profile_tasks(mode="cprofile") as prof:
        lightwork.get([calls_inner.remote(4) for _ in range(5)])
    prof.print_stats(5)
    printed = capsys.readouterr().out
    assert "function calls" in printed and "Ordered by: cumulative time" in printed
    assert "(inner)" in printed and "(calls_inner)" in printed
    assert "cprofile, 5 calls" in repr(prof)


def test_a_call_in_progress_reports_what_it_did_so_far(two_cpus):
    @lightwork.remote
    def long_loop(seconds: float) -> int:
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            inner(n)
            n += 1
        return n

    lightwork.get(long_loop.remote(0.0))
    ref = long_loop.remote(3.0)
    time.sleep(0.5)
    with profile_tasks(mode="cprofile") as prof:
        time.sleep(0.5)
    done = lightwork.get(ref)
    stats = by_name(prof.pstats())
    # Profiling began and ended inside the call; the end did not wait for it.
    assert 0 < stats["inner"][1] < done, (stats.get("inner"), done)


def test_bad_uses_say_what_to_do(two_cpus):
    with pytest.raises(ValueError, match="unknown profile mode 'lines'"):
        with profile_tasks(mode="lines"):
            pass
    with pytest.raises(ValueError, match="unknown profile mode"):
        lightwork.state.query("sample_start", mode="bogus")
    with profile_tasks() as sampled:
        lightwork.get(calls_inner.remote(1))
    with pytest.raises(ValueError, match='mode="cprofile"'):
        sampled.print_stats()


def test_a_worker_dying_mid_profile_leaves_the_others(two_cpus):
    @lightwork.remote(max_retries=0)
    def die() -> None:
        os._exit(3)

    lightwork.get([calls_inner.remote(1) for _ in range(4)])
    with profile_tasks(mode="cprofile") as prof:
        lightwork.get([calls_inner.remote(2) for _ in range(6)])
        with pytest.raises(lightwork.exceptions.WorkerCrashedError):
            lightwork.get(die.remote())
    # The dead worker's calls may be lost with it, but no other's.
    assert 0 < by_name(prof.pstats())["inner"][1] <= 12


DRIVER = """
import os, sys, time
import lightwork
from tests import support
from tests.diagnostics.test_task_cprofile import calls_inner

lightwork.init(num_cpus=2)
print("SOCKET", os.path.join(support.session_directory(), "control.sock"), flush=True)
gate = sys.argv[1]
while not os.path.exists(gate):
    lightwork.get([calls_inner.remote(3) for _ in range(4)])
lightwork.shutdown()
print("DONE", flush=True)
"""


def test_cli_writes_pstats_of_a_running_program(tmp_path):
    info = helpers.start_session_driver(DRIVER)
    try:
        out = tmp_path / "tasks.pstats"
        done = subprocess.run(
            [sys.executable, "-m", "lightwork", "profile", "--mode", "cprofile",
             "--seconds", "1", "-o", str(out)],
            env=info["env"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "python -m pstats" in done.stdout
        stats = by_name(pstats.Stats(str(out)))
        # Every call of calls_inner makes three of inner, whichever worker ran it; on each
        # of the two workers a call may run as the profile begins (its inner calls from
        # then on count, itself not) or ends (it counts, with what it did so far).
        calls = stats["calls_inner"][1]
        assert calls > 0 and 3 * calls - 6 <= stats["inner"][1] <= 3 * calls + 6, stats
        printed = subprocess.run(
            [sys.executable, "-m", "lightwork", "profile", "--mode", "cprofile",
             "--seconds", "0.5", "--top", "5"],
            env=info["env"], capture_output=True, text=True, timeout=60)
        assert printed.returncode == 0, printed.stderr
        assert "(calls_inner)" in printed.stdout and "function calls" in printed.stdout
        traced = subprocess.run(
            [sys.executable, "-m", "lightwork", "profile", "--memory", "--seconds", "0.5"],
            env=info["env"], capture_output=True, text=True, timeout=60)
        assert traced.returncode == 0, traced.stderr
        assert "calls_inner: " in traced.stdout and "MB in one call" in traced.stdout
    finally:
        helpers.stop_session_driver(info)
