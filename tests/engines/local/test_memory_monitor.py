"""The memory monitor: which worker it kills, what the task then does, what it says.

Most tests inject readings (``monitor.reader``) and run one round (``monitor.check()``)
themselves, with the monitor's own thread off, so the choice of victim is exact. One test
leaks real memory in a task against a threshold just above the machine's current use.
"""

from __future__ import annotations

import os
import re
import time

import pytest

import lightwork as ray
import lightwork.exceptions as exc
from tests.helpers import attempts, count_attempt, wait_for_file, wait_until
from tests import support
from lightwork.engines.local import memory_monitor
from lightwork.engines.local.memory_monitor import configure, read_meminfo

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
    yield support.memory_monitor()
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


MIB = 2**20


def _machine(tmp_path, used_share: float, total: int = 8 * GIB) -> str:
    path = tmp_path / "meminfo"
    kb = total // 1024
    path.write_text(f"MemTotal: {kb} kB\nMemFree: 0 kB\n"
                    f"MemAvailable: {int(kb * (1 - used_share))} kB\n")
    return str(path)


def _cgroup_files(directory, limit: str, usage: int, inactive: int, version: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    names = (("memory.max", "memory.current", "inactive_file") if version == 2 else
             ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
    (directory / names[0]).write_text(limit + "\n")
    (directory / names[1]).write_text(f"{usage}\n")
    (directory / "memory.stat").write_text(
        f"anon 1\nactive_file 2\n{names[2]} {inactive}\nunevictable 0\n")


def _reader(tmp_path, self_cgroup: str, used_share: float = 0.5):
    (tmp_path / "self_cgroup").write_text(self_cgroup)
    return memory_monitor.make_reader(_machine(tmp_path, used_share), str(tmp_path / "fs"),
                                      str(tmp_path / "self_cgroup"))


def test_cgroup_v2_limit_counts_without_its_page_cache(tmp_path):
    (tmp_path / "fs").mkdir()
    (tmp_path / "fs" / "cgroup.controllers").write_text("cpu memory\n")
    _cgroup_files(tmp_path / "fs" / "job" / "step", str(GIB), 900 * MIB, 100 * MIB, 2)
    reading = _reader(tmp_path, "0::/job/step\n")()
    assert tuple(reading) == (800 * MIB, GIB, "cgroup /job/step's")


def test_cgroup_without_a_limit_leaves_the_machine_reading(tmp_path):
    (tmp_path / "fs").mkdir()
    (tmp_path / "fs" / "cgroup.controllers").write_text("memory\n")
    _cgroup_files(tmp_path / "fs" / "job", "max", 900 * MIB, 0, 2)
    reading = _reader(tmp_path, "0::/job\n", used_share=0.25)()
    assert tuple(reading) == (2 * GIB, 8 * GIB, "the machine's")


def test_the_tighter_of_machine_and_cgroup_counts(tmp_path):
    (tmp_path / "fs").mkdir()
    (tmp_path / "fs" / "cgroup.controllers").write_text("memory\n")
    _cgroup_files(tmp_path / "fs" / "job", str(4 * GIB), GIB, 0, 2)  # 25% of its limit
    assert _reader(tmp_path, "0::/job\n", used_share=0.9)().scope == "the machine's"
    assert _reader(tmp_path, "0::/job\n", used_share=0.1)().scope == "cgroup /job's"


def test_an_ancestor_cgroup_limit_counts(tmp_path):
    (tmp_path / "fs").mkdir()
    (tmp_path / "fs" / "cgroup.controllers").write_text("memory\n")
    _cgroup_files(tmp_path / "fs" / "slice", str(GIB), 960 * MIB, 0, 2)
    _cgroup_files(tmp_path / "fs" / "slice" / "job", "max", 500 * MIB, 0, 2)
    reading = _reader(tmp_path, "0::/slice/job\n")()
    assert tuple(reading) == (960 * MIB, GIB, "cgroup /slice's")


def test_cgroup_v1_memory_controller_is_read(tmp_path):
    _cgroup_files(tmp_path / "fs" / "memory" / "docker" / "abc", str(2 * GIB), 1900 * MIB,
                  100 * MIB, 1)
    _cgroup_files(tmp_path / "fs" / "memory", str(2**63 - 4096), 5 * GIB, 0, 1)  # unlimited
    reading = _reader(tmp_path, "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")()
    assert tuple(reading) == (1800 * MIB, 2 * GIB, "cgroup /docker/abc's")


def test_a_container_sees_its_cgroup_at_the_mount_root(tmp_path):
    """Inside a cgroup namespace /proc/self/cgroup may name a path that is not under the
    mount; the limit is then the mount root's own."""
    (tmp_path / "fs").mkdir()
    (tmp_path / "fs" / "cgroup.controllers").write_text("memory\n")
    _cgroup_files(tmp_path / "fs", str(GIB), 990 * MIB, 0, 2)
    reading = _reader(tmp_path, "0::/kubepods/pod1/ctr\n")()
    assert tuple(reading) == (990 * MIB, GIB, "cgroup /'s")


def test_no_cgroup_files_leaves_the_machine_reading(tmp_path):
    reading = _reader(tmp_path, "0::/nowhere\n", used_share=0.5)()
    assert tuple(reading) == (4 * GIB, 8 * GIB, "the machine's")
    assert memory_monitor.make_reader(_machine(tmp_path, 0.5), str(tmp_path),
                                      str(tmp_path / "missing"))().scope == "the machine's"


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
    assert "task hold (task id " in message
    # the worker's memory when it was killed, read from /proc
    assert re.search(r"holding \d+\.\d\d GiB resident \(its peak \d+\.\d\d GiB\)", message)
    assert "`lightwork summary tasks`" in message and "profile_tasks(memory=True)" in message
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
    with pytest.raises(exc.ActorDiedError, match="memory monitor") as info:
        ray.get(actor.ping.remote(), timeout=10)
    # Both an ActorDiedError and Ray's OutOfMemoryError, naming what the monitor saw.
    assert isinstance(info.value, exc.OutOfMemoryError)
    assert isinstance(info.value, exc.ActorOutOfMemoryError)
    message = str(info.value)
    assert "<locals>.Big (id " in message
    assert "7.76 GiB of 8.00 GiB (97.0%)" in message and "threshold of 95.0%" in message
    assert "newest retriable task" in message  # the policy


def test_an_actor_restarted_after_a_memory_kill_fails_its_lost_call_as_out_of_memory(
        monitor, tmp_path):
    @ray.remote(max_restarts=1)
    class Sleeper:
        def wait(self, gate: str) -> str:
            open(gate + ".started", "w").close()
            while not os.path.exists(gate):
                time.sleep(0.005)
            return "done"

        def ping(self) -> str:
            return "pong"

    actor = Sleeper.remote()
    gate = str(tmp_path / "gate")
    call = actor.wait.remote(gate)
    wait_for_file(gate + ".started", 10)
    kill_once(monitor)
    with pytest.raises(exc.OutOfMemoryError, match="lost the call") as info:
        ray.get(call, timeout=10)
    assert isinstance(info.value, exc.ActorDiedError)
    monitor.reader = lambda: UNDER
    assert ray.get(actor.ping.remote(), timeout=20) == "pong"  # restarted, plain again


def test_one_kill_at_a_time(monitor, tmp_path):
    first, first_dir = start(tmp_path, "first", max_retries=1)
    second, second_dir = start(tmp_path, "second", max_retries=1)
    node = support.driver_node()
    with node.lock:  # the death cannot be handled while we hold the lock
        victim = monitor.check()
        assert victim is not None
        assert monitor.check() is None
    wait_until(lambda: victim.dead, timeout=5, message="the victim's death to be handled")
    monitor.reader = lambda: UNDER
    open(tmp_path / "gate", "w").close()
    assert ray.get([first, second], timeout=10) == ["first", "second"]
    assert sorted([len(attempts(first_dir)), len(attempts(second_dir))]) == [1, 2]


def test_a_kill_over_a_cgroup_limit_names_the_cgroup(monitor, tmp_path):
    monitor.reader = lambda: (int(0.97 * GIB), GIB, "cgroup /job's")
    ref, _ = start(tmp_path, "capped", max_retries=0)
    kill_once(monitor)
    with pytest.raises(exc.OutOfMemoryError, match=r"cgroup /job's memory in use was 0\.97 GiB"):
        ray.get(ref, timeout=10)


# ---- real memory ------------------------------------------------------------------------


def test_task_leaking_memory_is_stopped_with_out_of_memory_error(fresh_runtime, tmp_path):
    """A real leak on a shared machine: the threshold sits 150 MB above what is in use
    now, and the task leaks in 50 MB steps up to 1.5 GB, so other programs freeing up
    to about 1.3 GB meanwhile (a test run of another process ending) cannot hide it.
    The monitor stops it after the first few steps. Should it not act, the task
    returns and the test fails."""
    used, total = read_meminfo()
    threshold = (used + 150 * 2**20) / total
    ray.init(num_cpus=1, _memory_usage_threshold=threshold, _memory_monitor_refresh_ms=50)
    marker = str(tmp_path / "leaking")

    @ray.remote(max_retries=0)
    def leak() -> str:
        chunks = []
        open(marker, "w").close()
        for _ in range(30):  # 1.5 GB at most, 50 MB at a time, each page touched
            chunks.append(b"\x01" * (50 * 2**20))
            time.sleep(0.02)
        time.sleep(5)  # many monitor rounds (50 ms) to see the leak before giving up
        return "survived"

    ref = leak.remote()
    assert wait_for_file(marker)
    with pytest.raises(exc.OutOfMemoryError, match="task .*leak.*threshold"):
        ray.get(ref, timeout=30)
    assert ray.get(ray.remote(lambda: "still working").remote(), timeout=20) == "still working"
