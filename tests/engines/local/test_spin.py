"""Spin, then block (``engines/local/spin.py``): when a waiter polls, when it backs off, and
that a runtime which spins still answers right, honours timeouts and ends its workers.

Speed is never asserted here (``bench/`` has it); these are the rules that keep a spin
from wasting a core.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time

import psutil
import pytest
from tests.helpers import run_script, wait_until, write_script

from lightwork.engines.local import spin
from lightwork.engines.local.spin import MAX_BACKOFF, Spinner

pytestmark = pytest.mark.lightwork_only  # lightwork's own waiting strategy


@pytest.fixture
def spare_cores(monkeypatch, tmp_path):
    """A fake /proc/loadavg with ``runnable`` threads; returns a setter."""
    path = tmp_path / "loadavg"

    def set_runnable(runnable: int) -> None:
        path.write_text(f"0.50 0.40 0.30 {runnable}/321 4567\n")
        monkeypatch.setattr(spin, "_spare_checked_at", float("-inf"))

    monkeypatch.setattr(spin, "LOADAVG_PATH", str(path))
    monkeypatch.setattr(spin, "_loadavg", None)
    set_runnable(1)
    yield set_runnable
    if spin._loadavg is not None:
        os.close(spin._loadavg[1])


def never() -> None:
    return None


def test_a_frame_already_there_is_taken_at_once(spare_cores, monkeypatch):
    # (Whatever the suite's load: a poll preempted for 25 µs would count as a shared core,
    # which the slow-polls test below covers.)
    monkeypatch.setattr(spin, "CONTENDED_POLL_S", 1.0)
    spinner = Spinner(budget=1.0)
    spinner.spin_next = True
    assert spinner.spin(lambda: "frame") == "frame"
    spinner.blocked(0.0)
    assert spinner.spin_next  # a short wait: spin again next time


def test_a_spin_that_runs_out_blocks_the_next_waits_twice_as_often_each_time(spare_cores):
    spinner = Spinner(budget=0.002)
    started = time.monotonic()
    assert spinner.spin(never) is None
    assert time.monotonic() - started >= 0.002
    assert not spinner.spin_next
    # One miss: the next two waits block at once, however short they were.
    for _ in range(2):
        spinner.blocked(0.0)
        assert not spinner.spin_next
    spinner.blocked(0.0)
    assert spinner.spin_next
    # A second miss in a row: four.
    assert spinner.spin(never) is None
    for _ in range(4):
        spinner.blocked(0.0)
        assert not spinner.spin_next
    spinner.blocked(0.0)
    assert spinner.spin_next
    # A spin that finds its frame quickly ends the run of misses.
    assert spinner.spin(lambda: 1) == 1
    assert spinner.spin(never) is None
    for _ in range(2):
        spinner.blocked(0.0)
        assert not spinner.spin_next


def test_backoff_is_capped(spare_cores):
    spinner = Spinner(budget=0.0001)
    for _ in range(MAX_BACKOFF + 3):
        spinner.spin(never)
    waits = 0
    while not spinner.spin_next:
        spinner.blocked(0.0)
        waits += 1
    assert waits == (1 << MAX_BACKOFF) + 1


def test_a_long_wait_turns_spinning_off_and_a_short_one_on():
    spinner = Spinner(budget=0.001)
    spinner.blocked(0.0005)
    assert spinner.spin_next
    spinner.blocked(0.5)
    assert not spinner.spin_next


def test_the_limit_cuts_the_budget(spare_cores):
    spinner = Spinner(budget=30.0)
    started = time.monotonic()
    assert spinner.spin(never, limit=0.01) is None
    assert time.monotonic() - started < 10.0  # the 30 s budget was not spent


def test_a_found_frame_after_slow_polls_counts_as_a_shared_core(spare_cores):
    def slow_poll() -> str:
        time.sleep(0.002)  # as if sched_yield had handed the core to another thread
        return "frame"

    spinner = Spinner(budget=1.0)
    assert spinner.spin(slow_poll) == "frame"
    spinner.blocked(0.0)
    assert not spinner.spin_next  # backed off, though the frame was found


def test_no_spin_while_the_machine_has_more_runnable_threads_than_cores(spare_cores):
    polls = []

    def counted() -> None:
        polls.append(1)

    spare_cores(spin._cores + 5)
    spinner = Spinner(budget=1.0)
    started = time.monotonic()
    assert spinner.spin(counted) is None
    assert polls == [] and time.monotonic() - started < 0.5
    spare_cores(spin._cores + 1)  # the cores, plus the thread that looks
    assert spinner.spin(lambda: "frame") == "frame"


def test_without_a_loadavg_file_the_spins_alone_decide(spare_cores, monkeypatch, tmp_path):
    monkeypatch.setattr(spin, "LOADAVG_PATH", str(tmp_path / "missing"))
    monkeypatch.setattr(spin, "_spare_checked_at", float("-inf"))
    assert Spinner(budget=1.0).spin(lambda: "frame") == "frame"


def test_a_zero_budget_never_spins():
    spinner = Spinner(budget=0.0)
    spinner.blocked(0.0)
    assert not spinner.spin_next


def run_python(directory, code: str, spin_us: str) -> subprocess.CompletedProcess:
    path = write_script(str(directory), "driver.py", textwrap.dedent(code))
    return run_script(path, timeout=60, env={"LIGHTWORK_SPIN_US": spin_us})


@pytest.mark.parametrize("value, says", [("fast", "is not a number"),
                                         ("-5", "must be 0 or more")])
def test_a_bad_spin_setting_is_named_when_the_runtime_starts(tmp_path, value, says):
    # Importing lightwork starts nothing, the engine included: init() reads the setting.
    done = run_python(tmp_path, "import lightwork\nlightwork.init(num_cpus=1)", value)
    assert done.returncode != 0
    assert "LIGHTWORK_SPIN_US" in done.stderr and says in done.stderr


SYNC_LOOP = """
    import os, psutil, time
    import lightwork as ray
    from lightwork.engines.local import spin

    @ray.remote
    def double(x):
        return 2 * x

    @ray.remote
    class Counter:
        def __init__(self):
            self.n = 0
        def add(self):
            self.n += 1
            return self.n

    @ray.remote
    def slow():
        time.sleep(5)

    ray.init(num_cpus=2)
    assert [ray.get(double.remote(i)) for i in range(300)] == [2 * i for i in range(300)]
    counter = Counter.remote()
    assert [ray.get(counter.add.remote()) for _ in range(300)] == list(range(1, 301))
    ref = slow.remote()
    started = time.monotonic()
    try:
        ray.get(ref, timeout=0.05)
    except ray.exceptions.GetTimeoutError:
        print("timed out after", round(time.monotonic() - started, 3))
    print("budget", spin.SPIN_S)
    print("workers", *[c.pid for c in psutil.Process().children(recursive=True)])
"""


@pytest.mark.parametrize("spin_us", ["200", "0"])
def test_sync_calls_with_and_without_spinning_answer_and_leave_nothing_behind(tmp_path,
                                                                              spin_us):
    done = run_python(tmp_path, SYNC_LOOP, spin_us)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()}
    assert lines["timed"][-1] and float(lines["timed"][-1]) < 5.0  # the get's timeout held
    expected = 0.0 if spin_us == "0" or spin._cores < 2 else 0.0002
    assert float(lines["budget"][0]) == pytest.approx(expected)
    pids = [int(pid) for pid in lines["workers"]]
    assert pids  # the fork server and the workers, which may have been spinning at exit
    wait_until(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status()
                               != psutil.STATUS_ZOMBIE for pid in pids),
               timeout=20, message="the runtime's processes to end after the driver")
