"""The chaos suite: workers die while work runs, and nothing is lost or left behind.

Each case runs in a session of its own (``session`` fixture) and, when it ends, the
fixture checks within 5 s that the runtime's bookkeeping holds
(``lightwork.engines.local.invariants``): no task left, the object table empty, every CPU
available again; then, after ``shutdown``, that no process of the session, no
``/dev/shm`` segment and no spill file (nothing under the session directory) is left.

``make test`` runs each case scaled down to a few seconds; the full sizes
carry the ``chaos`` marker and run with ``make chaos`` (about a minute or two each on
2 cores). Full runs print their figures (wall time against a clean run, kills,
attempts) on stderr: ``make chaos`` shows them.

Promptness ("the error comes within 1 s of the death"): ``make test`` runs on shared,
noisy machines, so there it only bounds a hang (``HANG_LIMIT_S``) and prints the figure;
the ``prompt`` variants, under the ``chaos`` marker (a quiet machine is assumed), hold
the issue's 1 s.

Attempts are counted by the tasks themselves, one byte appended to a file per attempt
(``O_APPEND`` writes of one byte are atomic), so "attempts <= tasks + kills" counts what
really ran, not what the runtime believes.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import itertools
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import lightwork as ray
import lightwork.exceptions as exc
from tests.helpers import HANG_LIMIT_S, still_running, wait_until
from tests import support
from lightwork.engines.local import invariants

pytestmark = pytest.mark.lightwork_only

RESULT_BYTES = 64 * 1024

PROMPT_S = 1.0  # a death's error comes within 1 s (checked by ``make chaos``)
# ``make test`` bounds a hang only; ``make chaos`` also holds the figure.
PROMPTNESS = [pytest.param(HANG_LIMIT_S, id="no-hang"),
              pytest.param(PROMPT_S, id="prompt", marks=pytest.mark.chaos)]


# ---- the session and its post-conditions ----------------------------------------------


@pytest.fixture
def session(fresh_runtime) -> Iterator[Callable[..., object]]:
    """Start a session with ``session(num_cpus=...)``; check it is clean after the case."""
    started = []

    def start(**options: object) -> object:
        ray.init(**{"num_cpus": 2, **options})
        node = support.driver_node()
        started.append(node)
        return node

    yield start
    for node in started:
        if not node.closed:
            check_clean_and_shut_down(node)


def check_clean_and_shut_down(node: object) -> None:
    """The post-conditions of every case (see the module docstring)."""
    gc.collect()
    problems: list[str] = []

    def quiet() -> bool:
        nonlocal problems
        ray.get([])  # lets the driver's released refs reach the table
        problems = invariants.quiet_violations(node)
        return not problems

    try:
        wait_until(quiet, timeout=5, interval=0.05, message="a quiet session")
    except AssertionError:
        raise AssertionError("the session is not clean: " + "; ".join(problems)) from None
    pids = [conn.pid for conn in node.workers.values() if conn.pid]
    pids.append(node.forkserver.process.pid)
    directories = [node.session.shm_dir, node.session.directory]
    ray.shutdown()
    wait_until(lambda: not still_running(pids), timeout=5,
               message=f"the session's processes {pids} to end")
    wait_until(lambda: not any(os.path.exists(d) for d in directories), timeout=5,
               message=f"the session's directories {directories} to go")


def busy_worker_pids(node: object, actors: bool = False) -> list[int]:
    with node.lock:
        return [conn.pid for conn in node.workers.values()
                if conn.pid and not conn.dead and not conn.eof_at
                and ((conn.actor is not None) if actors else
                     (conn.actor is None and conn.slot.inflight))]


class Killer:
    """A thread that SIGKILLs one random busy worker (or actor) every ``period`` s."""

    def __init__(self, node: object, period: float, actors: bool = False, seed: int = 0):
        self.node, self.period, self.actors = node, period, actors
        self.random = random.Random(seed)
        self.kills = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-killer", daemon=True)

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            pids = busy_worker_pids(self.node, self.actors)
            if pids:
                try:
                    os.kill(self.random.choice(pids), signal.SIGKILL)
                    self.kills += 1
                except ProcessLookupError:
                    pass


def attempts_in(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def report(text: str) -> None:
    print(f"\nchaos: {text}", file=sys.stderr)


# ---- 1. many small tasks, a worker killed every 200 ms --------------------------------


def payload(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (RESULT_BYTES // 32)


@ray.remote(max_retries=-1)
def crunch(i: int, attempts_file: str) -> tuple[int, bytes]:
    with open(attempts_file, "ab") as f:
        f.write(b".")
    cpu_until = time.process_time() + 0.002 + (i % 4) * 0.001  # 2-5 ms of CPU
    digest = b""
    while time.process_time() < cpu_until:
        digest = hashlib.sha256(digest).digest()
    return i, payload(i)


def run_crunch(count: int, attempts_file: str) -> float:
    started = time.perf_counter()
    refs = [crunch.remote(i, attempts_file) for i in range(count)]
    for start in range(0, count, 1000):
        for i, (index, data) in enumerate(ray.get(refs[start:start + 1000], timeout=600)):
            assert index == start + i
            assert data == payload(index), f"result {index} is corrupt"
    return time.perf_counter() - started


def kill_storm(session, tmp_path, count: int) -> None:
    node = session()
    clean_file, chaos_file = str(tmp_path / "clean"), str(tmp_path / "chaos")
    clean_s = run_crunch(count, clean_file)
    assert attempts_in(clean_file) == count
    with Killer(node, 0.2) as killer:
        chaos_s = run_crunch(count, chaos_file)
    attempts = attempts_in(chaos_file)
    report(f"{count} tasks, {killer.kills} workers killed: {attempts} attempts, "
           f"{chaos_s:.1f} s against {clean_s:.1f} s clean ({chaos_s / clean_s:.2f}x)")
    assert killer.kills > 0
    assert count <= attempts <= count + killer.kills


def test_kill_storm(session, tmp_path):
    kill_storm(session, tmp_path, 300)


@pytest.mark.chaos
def test_kill_storm_full(session, tmp_path):
    kill_storm(session, tmp_path, 10_000)


# ---- 2. exact retries --------------------------------------------------------------------


@ray.remote(max_retries=3)
def dies_three_times(attempts_file: str) -> str:
    with open(attempts_file, "ab") as f:
        f.write(b".")
    if attempts_in(attempts_file) <= 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return "made it"


def test_three_kills_of_a_max_retries_3_task_make_exactly_4_attempts(session, tmp_path):
    session()
    attempts_file = str(tmp_path / "attempts")
    assert ray.get(dies_three_times.remote(attempts_file), timeout=30) == "made it"
    assert attempts_in(attempts_file) == 4
    with pytest.raises(exc.WorkerCrashedError, match=r"SIGKILL.*tried 3 time\(s\) \(max_retries=2\)"):
        ray.get(dies_three_times.options(max_retries=2).remote(str(tmp_path / "again")),
                timeout=30)


def test_retry_exceptions_retries_only_the_named_exceptions(session, tmp_path):
    session()

    @ray.remote(max_retries=3, retry_exceptions=[ValueError])
    def fails(attempts_file: str, kind: str) -> None:
        with open(attempts_file, "ab") as f:
            f.write(b".")
        raise {"value": ValueError, "key": KeyError}[kind](kind)

    value_file, key_file = str(tmp_path / "value"), str(tmp_path / "key")
    with pytest.raises(ValueError):
        ray.get(fails.remote(value_file, "value"), timeout=30)
    with pytest.raises(KeyError):
        ray.get(fails.remote(key_file, "key"), timeout=30)
    assert attempts_in(value_file) == 4
    assert attempts_in(key_file) == 1


# ---- 3. the death matrix -------------------------------------------------------------------


def _sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _segfault() -> None:
    ctypes.string_at(0)


def _exit_1() -> None:
    os._exit(1)


def _sys_exit_0() -> None:
    sys.exit(0)


DEATHS = {
    "sigkill": (_sigkill, exc.WorkerCrashedError, r"signal 9 \(SIGKILL\)"),
    "segfault": (_segfault, exc.WorkerCrashedError, r"signal 11 \(SIGSEGV\)"),
    "os_exit_1": (_exit_1, exc.WorkerCrashedError, "exited with code 1"),
    # sys.exit is the task's own choice: its error, not a crash, and never retried.
    "sys_exit_0": (_sys_exit_0, exc.TaskError, "SystemExit"),
}


@pytest.mark.parametrize("limit_s", PROMPTNESS)
@pytest.mark.parametrize("death", sorted(DEATHS))
def test_death_matrix(session, tmp_path, death, limit_s):
    """Each death gives its error, within ``limit_s`` of the death (see the module
    docstring: a hang bound in ``make test``, the issue's 1 s under ``make chaos``)."""
    session()
    how, error, pattern = DEATHS[death]
    stamp = str(tmp_path / "dying")

    @ray.remote(max_retries=0)
    def die() -> None:
        with open(stamp + ".tmp", "w") as f:
            f.write(repr(time.monotonic()))  # CLOCK_MONOTONIC: the same in every process
        os.replace(stamp + ".tmp", stamp)
        how()

    with pytest.raises(error, match=pattern) as info:
        ray.get(die.remote(), timeout=HANG_LIMIT_S)  # no error at all: GetTimeoutError
    with open(stamp) as f:
        took = time.monotonic() - float(f.read())
    report(f"death by {death}: the error came {took:.2f} s after it")
    assert took < limit_s, f"the error came {took:.2f} s after the death"
    assert not isinstance(info.value, SystemExit)  # it must not end the driver
    assert ray.get(ray.remote(lambda: "alive").remote(), timeout=20) == "alive"


@pytest.mark.parametrize("limit_s", PROMPTNESS)
def test_sigterm_ignoring_task_is_still_stopped(session, tmp_path, limit_s):
    """A forced cancel stops a task that ignores SIGTERM; its error comes within
    ``limit_s`` (a hang bound in ``make test``, the issue's 1 s under ``make chaos``)."""
    node = session()
    started = str(tmp_path / "started")

    @ray.remote(max_retries=0)
    def stubborn() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(started, "w").close()
        while True:
            time.sleep(0.01)

    ref = stubborn.remote()
    wait_until(lambda: os.path.exists(started), timeout=20, message="the task to start")
    [pid] = busy_worker_pids(node)
    os.kill(pid, signal.SIGTERM)  # ignored
    time.sleep(0.2)
    assert still_running([pid]) == [pid]
    cancelled = time.monotonic()
    ray.cancel(ref, force=True)
    with pytest.raises(exc.TaskCancelledError):
        ray.get(ref, timeout=HANG_LIMIT_S)  # never stopped: GetTimeoutError
    took = time.monotonic() - cancelled
    report(f"a SIGTERM-ignoring task: the error came {took:.2f} s after cancel")
    assert took < limit_s, f"the error came {took:.2f} s after cancel"


# ---- 4. parents waiting for children while workers die -------------------------------------


@ray.remote(max_retries=-1)
def child(i: int) -> int:
    time.sleep(0.002)
    return i * i


@ray.remote(max_retries=-1)
def parent(i: int) -> int:
    return ray.get(child.remote(i)) + 1


def parents_and_children(session, count: int) -> None:
    node = session()
    started = time.perf_counter()
    with Killer(node, 0.3) as killer:
        refs = [parent.remote(i) for i in range(count)]
        assert ray.get(refs, timeout=600) == [i * i + 1 for i in range(count)]
    report(f"{count} parents with a child each, {killer.kills} workers killed: "
           f"{time.perf_counter() - started:.1f} s")


def test_parents_and_children_under_kills(session):
    parents_and_children(session, 60)


@pytest.mark.chaos
def test_parents_and_children_under_kills_full(session):
    parents_and_children(session, 500)


# ---- 5. actors restarted while they receive sequence numbers -------------------------------


@ray.remote(max_restarts=-1, max_task_retries=-1)
class Receiver:
    def __init__(self, log_path: str) -> None:
        self.log_path = log_path

    def receive(self, seq: int) -> int:
        with open(self.log_path, "a") as f:
            f.write(f"{seq}\n")
        time.sleep(0.0005)
        return seq


def check_arrivals(log_path: str, count: int) -> int:
    """All of 0..count-1 arrived in order; return how often delivery started over."""
    with open(log_path) as f:
        seqs = [int(line) for line in f.read().split()]
    first_seen: list[int] = []
    seen = set()
    for seq in seqs:
        if seq not in seen:
            seen.add(seq)
            first_seen.append(seq)
    assert first_seen == list(range(count)), "a number is missing or arrived out of order"
    restarts = 0
    for before, after in itertools.pairwise(seqs):
        assert after == before + 1 or after <= before, f"{after} arrived right after {before}"
        restarts += after <= before  # calls in flight at a kill are delivered again
    return restarts


def actors_under_kills(session, tmp_path, per_actor: int) -> None:
    node = session(num_cpus=4)
    logs = [str(tmp_path / f"actor{i}") for i in range(4)]
    actors = [Receiver.remote(log) for log in logs]
    started = time.perf_counter()
    with Killer(node, 0.5, actors=True) as killer:
        refs = [[actor.receive.remote(seq) for seq in range(per_actor)] for actor in actors]
        for actor_refs in refs:
            assert ray.get(actor_refs, timeout=600) == list(range(per_actor))
    redeliveries = sum(check_arrivals(log, per_actor) for log in logs)
    report(f"4 actors x {per_actor} calls, {killer.kills} actor processes killed, "
           f"{redeliveries} re-deliveries: {time.perf_counter() - started:.1f} s")
    for actor in actors:
        ray.kill(actor)


def test_actors_under_kills(session, tmp_path):
    actors_under_kills(session, tmp_path, 300)


@pytest.mark.chaos
def test_actors_under_kills_full(session, tmp_path):
    actors_under_kills(session, tmp_path, 2000)


# ---- 6. a million queued tasks ------------------------------------------------------------


@ray.remote
def noop() -> None:
    return None


def deep_queue(session, count: int) -> None:
    session()
    refs = [noop.remote() for _ in range(count)]
    for start in range(0, count, 100_000):
        chunk = refs[start:start + 100_000]
        ready, _ = ray.wait(chunk, num_returns=len(chunk), timeout=600)
        assert len(ready) == len(chunk)
    assert ray.get(refs[-10:]) == [None] * 10


def test_20k_queued_tasks_run_to_completion(session):
    # Scaled down for `make test` (100k took 7-10 s of the suite); the full sizes run in
    # `make chaos`.
    deep_queue(session, 20_000)


@pytest.mark.chaos
def test_100k_queued_tasks_run_to_completion(session):
    deep_queue(session, 100_000)


@pytest.mark.chaos
def test_a_million_queued_tasks_run_to_completion(session):
    deep_queue(session, 1_000_000)
