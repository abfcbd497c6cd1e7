"""The memory monitor: which worker it kills, what the task then does, what it says.

Most tests inject readings (``monitor.reader``) and run one round (``monitor.check()``)
themselves, with the monitor's own thread off, so the choice of victim is exact. One test
leaks real memory in a task against a threshold just above the machine's current use.
"""

from __future__ import annotations

import os
import time

import pytest

import lightwork as ray
import lightwork.exceptions as exc
from helpers import attempts, count_attempt, wait_for_file, wait_until
from lightwork import _api
from lightwork._runtime import memory_monitor
from lightwork._runtime.memory_monitor import configure, read_meminfo

pytestmark = pytest.mark.lightwork_only

GIB = 2**30
OVER = (int(0.97 * 8 * GIB), 8 * GIB)  # 97% of 8 GiB in use
UNDER = (int(0.50 * 8 * GIB), 8 * GIB)


@pytest.fixture(scope="module")
def runtime():
    """Two CPUs, the monitor's thread off: tests run its rounds themselves."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, _memory_monitor_refresh_ms=0)
    yield _api._node.memory_monitor
    ray.shutdown()


@pytest.fixture
def monitor(runtime):
    runtime.reader = lambda: OVER
    runtime.threshold = 0.95
    yield runtime
    runtime.reader = lambda: UNDER


@ray.remote
def hold(directory: str, name: str, gate: str) -> str:
    count_attempt(directory)
    open(os.path.join(directory, f"running-{name}-{os.getpid()}"), "w").close()
    while not os.path.exists(gate):
        time.sleep(0.005)
    return name


def start(tmp_path, name: str, **options):
    directory = tmp_path / name
    directory.mkdir()
    gate = str(tmp_path / "gate")
    ref = hold.options(**options).remote(str(directory), name, gate)
    wait_until(lambda: any(p.name.startswith("running-") for p in directory.iterdir()),
               timeout=10, message=f"task {name} to start")
    return ref, str(directory)


def kill_once(monitor):
    victim = monitor.check()
    assert victim is not None, "the monitor killed nobody"
    wait_until(lambda: victim.dead, timeout=5, message="the victim's death to be handled")
    return victim


# ---- reading memory --------------------------------------------------------------------


def test_meminfo_counts_memory_in_use_without_the_page_cache(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       1000 kB\nMemFree:         100 kB\n"
                    "MemAvailable:    700 kB\nBuffers:          50 kB\nCached:  500 kB\n")
    assert read_meminfo(str(path)) == (300 * 1024, 1000 * 1024)
    path.write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 500 kB\n")
    assert read_meminfo(str(path)) == (350 * 1024, 1000 * 1024)  # an old kernel
    used, total = read_meminfo()
    assert 0 < used < total


def test_configuration_defaults_environment_and_validation(monkeypatch):
    for name in ("LIGHTWORK_MEMORY_USAGE_THRESHOLD", "RAY_memory_usage_threshold",
                 "LIGHTWORK_MEMORY_MONITOR_REFRESH_MS", "RAY_memory_monitor_refresh_ms"):
        monkeypatch.delenv(name, raising=False)
    assert configure(None, None) == (0.95, 0.25)
    monkeypatch.setenv("RAY_memory_usage_threshold", "0.8")
    assert configure(None, None)[0] == 0.8
    monkeypatch.setenv("LIGHTWORK_MEMORY_USAGE_THRESHOLD", "0.7")
    monkeypatch.setenv("LIGHTWORK_MEMORY_MONITOR_REFRESH_MS", "0")
    assert configure(None, None) == (0.7, 0.0)
    assert configure(0.5, 100) == (0.5, 0.1)
    for bad in (0, 1.5, -0.1, "0.9", True):
        with pytest.raises(ValueError, match="fraction in"):
            configure(bad, None)
    with pytest.raises(ValueError, match="milliseconds"):
        configure(0.9, -1)
    monkeypatch.setenv("LIGHTWORK_MEMORY_USAGE_THRESHOLD", "lots")
    with pytest.raises(ValueError, match="not a number"):
        configure(None, None)


def test_init_rejects_a_bad_threshold(fresh_runtime):
    with pytest.raises(ValueError, match="memory usage threshold"):
        ray.init(num_cpus=1, _memory_usage_threshold=2)
    assert not ray.is_initialized()


# ---- the policy, with injected readings ---------------------------------------------------


def test_below_the_threshold_nothing_is_killed(monitor, tmp_path):
    monitor.reader = lambda: UNDER
    ref, _ = start(tmp_path, "calm")
    assert monitor.check() is None
    open(tmp_path / "gate", "w").close()
    assert ray.get(ref, timeout=10) == "calm"


@pytest.mark.parametrize("older_retries, newer_retries, victim", [
    (3, 3, "newer"),  # both retriable: the newest goes
    (2, 0, "older"),  # a retriable task goes before a newer non-retriable one
], ids=["newest-retriable", "retriable-before-newer-non-retriable"])
def test_victim_is_the_newest_retriable_task_and_it_is_retried(
        monitor, tmp_path, older_retries, newer_retries, victim):
    older, older_dir = start(tmp_path, "older", max_retries=older_retries)
    newer, newer_dir = start(tmp_path, "newer", max_retries=newer_retries)
    killed_dir, spared_dir = (newer_dir, older_dir) if victim == "newer" else (older_dir, newer_dir)
    kill_once(monitor)
    monitor.reader = lambda: UNDER
    wait_until(lambda: len(attempts(killed_dir)) == 2, timeout=10, message="the retry")
    open(tmp_path / "gate", "w").close()
    assert ray.get([older, newer], timeout=10) == ["older", "newer"]
    assert len(attempts(spared_dir)) == 1


def test_non_retriable_task_is_killed_as_a_last_resort_with_out_of_memory_error(
        monitor, tmp_path):
    ref, _ = start(tmp_path, "fragile", max_retries=0)
    kill_once(monitor)
    with pytest.raises(exc.OutOfMemoryError) as info:
        ray.get(ref, timeout=10)  # never failed: GetTimeoutError
    message = str(info.value)
    assert "task hold" in message
    assert "7.76 GiB of 8.00 GiB (97.0%)" in message
    assert "threshold of 95.0%" in message
    assert "newest retriable task" in message  # the policy
    assert "max_retries=0" in message


def test_retries_used_up_by_memory_kills_end_in_out_of_memory_error(monitor, tmp_path):
    ref, directory = start(tmp_path, "greedy", max_retries=1)
    kill_once(monitor)
    wait_until(lambda: len(attempts(directory)) == 2, timeout=10, message="the retry")
    wait_until(lambda: len(os.listdir(directory)) == 4, timeout=10, message="it to run again")
    kill_once(monitor)
    with pytest.raises(exc.OutOfMemoryError, match=r"tried 2 time\(s\) \(max_retries=1\)"):
        ray.get(ref, timeout=10)


def test_retry_waits_for_a_backoff(monitor, tmp_path, monkeypatch):
    monkeypatch.setattr(memory_monitor, "OOM_BACKOFF_S", 0.5)
    ref, directory = start(tmp_path, "patient", max_retries=2)
    kill_once(monitor)
    killed = time.monotonic()
    wait_until(lambda: len(attempts(directory)) == 2, timeout=10, message="the retry")
    assert time.monotonic() - killed >= 0.45  # a lower bound: never earlier than the backoff
    open(tmp_path / "gate", "w").close()
    assert ray.get(ref, timeout=10) == "patient"


def test_cancel_during_the_backoff_fails_the_task_at_once(monitor, tmp_path, monkeypatch):
    monkeypatch.setattr(memory_monitor, "OOM_BACKOFF_S", 30.0)
    ref, _ = start(tmp_path, "cancelled", max_retries=2)
    kill_once(monitor)
    ray.cancel(ref)
    with pytest.raises(exc.TaskCancelledError):
        ray.get(ref, timeout=5)


def test_actor_is_killed_only_when_no_task_runs(monitor, tmp_path):
    @ray.remote
    class Big:
        def ping(self) -> str:
            return "pong"

    actor = Big.remote()
    assert ray.get(actor.ping.remote(), timeout=10) == "pong"
    ref, _ = start(tmp_path, "task", max_retries=0)
    kill_once(monitor)  # the task, not the actor
    with pytest.raises(exc.OutOfMemoryError):
        ray.get(ref, timeout=10)
    assert ray.get(actor.ping.remote(), timeout=10) == "pong"
    kill_once(monitor)  # now the actor
    with pytest.raises(exc.ActorDiedError, match="memory monitor"):
        ray.get(actor.ping.remote(), timeout=10)


def test_one_kill_at_a_time(monitor, tmp_path):
    first, first_dir = start(tmp_path, "first", max_retries=1)
    second, second_dir = start(tmp_path, "second", max_retries=1)
    node = _api._node
    with node.lock:  # the death cannot be handled while we hold the lock
        victim = monitor.check()
        assert victim is not None
        assert monitor.check() is None
    wait_until(lambda: victim.dead, timeout=5, message="the victim's death to be handled")
    monitor.reader = lambda: UNDER
    open(tmp_path / "gate", "w").close()
    assert ray.get([first, second], timeout=10) == ["first", "second"]
    assert sorted([len(attempts(first_dir)), len(attempts(second_dir))]) == [1, 2]


# ---- real memory ------------------------------------------------------------------------


def test_task_leaking_memory_is_stopped_with_out_of_memory_error(fresh_runtime, tmp_path):
    """A real leak on a shared machine, so kept small: the threshold sits 150 MB above
    what is in use now and the task leaks at most 400 MB, then holds it for a while.
    Should the monitor not act, the task returns and the test fails."""
    used, total = read_meminfo()
    # Other programs on the machine are unlikely to free 250 MB (cap minus margin) in
    # the second this takes.
    threshold = (used + 150 * 2**20) / total
    ray.init(num_cpus=1, _memory_usage_threshold=threshold, _memory_monitor_refresh_ms=50)
    marker = str(tmp_path / "leaking")

    @ray.remote(max_retries=0)
    def leak() -> str:
        chunks = []
        open(marker, "w").close()
        for _ in range(8):  # 400 MB at most, 50 MB at a time, each page touched
            chunks.append(b"\x01" * (50 * 2**20))
            time.sleep(0.02)
        time.sleep(5)  # many monitor rounds (50 ms) to see the leak before giving up
        return "survived"

    ref = leak.remote()
    assert wait_for_file(marker)
    with pytest.raises(exc.OutOfMemoryError, match="task .*leak.*threshold"):
        ray.get(ref, timeout=30)
    assert ray.get(ray.remote(lambda: "still working").remote(), timeout=20) == "still working"
