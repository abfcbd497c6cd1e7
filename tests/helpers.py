"""Small helpers shared by the behaviour suite.

The functions that run *inside tasks* (``wait_for_file``, ``arrive_and_wait``,
``count_attempt``) only touch the file system, so tests can coordinate tasks with the
driver structurally (barriers, gates, attempt counters) instead of timing them.
conftest.py registers this module for pickling by value, so workers never need to
import it.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from typing import Any, Callable, Iterable

SHM_GLOB = "/dev/shm/lightwork-*"

# How long a call that should return "at once" may take in ``make test`` before the test
# calls it a hang. Generous on purpose: tests never assert speed (the machines are shared
# and noisy); the issues' tight figures ("within 1 s") are checked under the ``chaos``
# marker (``make chaos``, a quiet machine) or printed by ``bench/``.
HANG_LIMIT_S = 15.0

# The directory holding the ``tests`` package (the repository's top): on a driver
# script's sys.path, the script can ``from tests import support``.
SUITE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prepended to every driver script run in a subprocess, so the conformance switch
# (LIGHTWORK_TEST_AGAINST_RAY=1, see conftest.py) applies there too, and the script can
# import ``tests.support``. It goes on the script's sys.path, not in PYTHONPATH: workers
# inherit the environment, and they must not depend on importing tests/. One line, so the
# scripts' line numbers stay what they were.
ALIAS_PRELUDE = f"""\
import os as _os, sys as _sys; _sys.path.append({SUITE_ROOT!r})
if _os.environ.get("LIGHTWORK_TEST_AGAINST_RAY") == "1":
    import ray as _ray, ray.exceptions as _rex
    _sys.modules["lightwork"] = _ray
    _sys.modules["lightwork.exceptions"] = _rex
"""


class FakeClock:
    """A clock for progress displays: 0.0 when first read (the start), then ``later``."""

    def __init__(self, later: float) -> None:
        self.calls = 0
        self.later = later

    def __call__(self) -> float:
        self.calls += 1
        return 0.0 if self.calls == 1 else self.later


def returns_within(call: Callable[[], Any], timeout: float, blocked: str) -> Any:
    """``call()`` run in another thread; fails the test, saying ``blocked``, if it has not
    returned within ``timeout`` seconds (a daemon thread: a hung call ends with the run)."""
    import threading

    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert result, blocked
    return result[0]


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 5.0,
    interval: float = 0.02,
    message: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)


# ---- used inside tasks -------------------------------------------------------------


def call_bounded(call: Callable[[], Any], limit: float = HANG_LIMIT_S,
                 what: str = "the call") -> Any:
    """Return what ``call()`` returns, or raise what it raises; fail the test if it has
    not finished after ``limit`` s.

    The call runs in a daemon thread, so a call that blocks (the bug: waiting instead of
    failing) fails the test after ``limit`` s instead of eating the per-test timeout.
    """
    import threading

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - handed back to the caller as is
            outcome["error"] = error

    thread = threading.Thread(target=run, name="call-bounded", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        raise AssertionError(f"{what} did not return within {limit} s: it blocks")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def wait_for_file(path: str, limit: float = 20.0) -> bool:
    """Block until ``path`` exists (a gate the driver opens); give up after ``limit`` s.

    Sleeping in short steps keeps the task interruptible (cancel) and bounded (a test
    that forgets to open the gate still ends).
    """
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def arrive_and_wait(directory: str, name: str, parties: int, limit: float = 20.0) -> bool:
    """A file-system barrier: True iff ``parties`` tasks were inside it at the same time."""
    open(os.path.join(directory, f"arrived-{name}"), "w").close()
    deadline = time.monotonic() + limit
    while len(glob.glob(os.path.join(directory, "arrived-*"))) < parties:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def count_attempt(directory: str) -> int:
    """Record one attempt of a task (with its pid) and return how many came before."""
    before = len(glob.glob(os.path.join(directory, "attempt-*")))
    name = f"attempt-{time.time_ns()}-{os.getpid()}"
    # Written under another name, then renamed: a reader never sees an empty file.
    with open(os.path.join(directory, f".{name}"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(directory, f".{name}"), os.path.join(directory, name))
    return before


def attempts(directory: str) -> list[int]:
    """Pids of the recorded attempts, oldest first."""
    paths = sorted(glob.glob(os.path.join(directory, "attempt-*")))
    return [int(open(p).read()) for p in paths]


# ---- used in the driver ------------------------------------------------------------


def shm_dirs() -> set[str]:
    """Session directories in /dev/shm that could be this test's.

    A session's name ends with its driver's pid. Directories of drivers that are alive
    but not this process or one of its children belong to other programs on the machine
    (another test run, say) and are left out; dead drivers' directories are kept, since a
    test may have killed its own driver.
    """
    from tests import support

    ours = {os.getpid(), *descendants()}
    found = set()
    for path in glob.glob(SHM_GLOB):
        pid = support.session_driver_pid(path)
        if pid is None:
            found.add(path)
            continue
        if pid in ours or not support.pid_alive(pid):
            found.add(path)
    return found


def process_running(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (ended, waiting for a reaper that may not be us)
    counts as gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def descendants(pid: int | None = None) -> list[int]:
    import psutil

    try:
        proc = psutil.Process(pid if pid is not None else os.getpid())
        return [p.pid for p in proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def still_running(pids: Iterable[int]) -> list[int]:
    """The pids that are still alive. A zombie counts as gone: it holds no memory, only
    a process-table entry until its parent (possibly init) reaps it."""
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def script_env() -> dict[str, str]:
    """Environment for a driver subprocess that imports the same lightwork as we do."""
    import lightwork

    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(lightwork.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [pkg_parent, env.get("PYTHONPATH", "")] if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def write_script(directory: str, name: str, body: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(ALIAS_PRELUDE + body)
    return path


def run_script(path: str, timeout: float = 40.0,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a driver script (``write_script``); ``env``: variables to set for it."""
    return subprocess.run(
        [sys.executable, path],
        env={**script_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_session_driver(body: str) -> dict[str, Any]:
    """Run a driver script that prints ``SOCKET <path>`` and waits for a gate file.

    Returns what tests need to talk to it (``env`` with its own short TMPDIR, ``home``,
    ``script``, ``socket``, ``pid``, ``gate``, ``process``); end it with
    :func:`stop_session_driver`.
    """
    import tempfile

    home = tempfile.mkdtemp(prefix="lw")  # short: a Unix socket path has ~104 bytes
    env = script_env()
    env["TMPDIR"] = home
    script = write_script(home, "driver.py", body)
    gate = os.path.join(home, "gate")
    driver = subprocess.Popen([sys.executable, script, gate], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    line = driver.stdout.readline()
    assert line.startswith("SOCKET"), line + driver.stderr.read()
    return {"env": env, "home": home, "script": script, "socket": line.split()[1],
            "pid": driver.pid, "gate": gate, "process": driver}


def stop_session_driver(info: dict[str, Any]) -> None:
    """Open the driver's gate, check it ended cleanly, and remove its directory."""
    import shutil

    open(info["gate"], "w").close()
    out, err = info["process"].communicate(timeout=30)
    assert "DONE" in out, err
    shutil.rmtree(info["home"], ignore_errors=True)


class OtherProgramsLoad:
    """How much of the machine's cores other programs used while the block ran.

    ``skip_unless_cores_are_idle`` looks before the run; a parallel test run can start
    during it and take the cores from the tasks, so their CPU time no longer says what
    they would do alone. This measures the machine's busy CPU time over the block less
    that of this process and its workers: ``share`` is the rest, per core.
    """

    def __enter__(self) -> OtherProgramsLoad:
        self.share = 0.0
        self._start = (time.monotonic(), _machine_busy_s(), _our_cpu_s())
        return self

    def __exit__(self, *exc_info) -> None:
        started, machine, ours = self._start
        wall = time.monotonic() - started
        others = (_machine_busy_s() - machine) - (_our_cpu_s() - ours)
        self.share = max(0.0, others) / (wall * (os.cpu_count() or 1))

    def skip_if_busy(self, limit: float = 0.25) -> None:
        import pytest

        if self.share > limit:
            pytest.skip(f"other programs used {self.share:.0%} of the cores while the "
                        "program ran, so the times and CPU time measured are not its own")


def _machine_busy_s() -> float:
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _our_cpu_s() -> float:
    import psutil

    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def sync_reply(facts: dict, cursor: int, *, session: str = "s", now: float = 9.0,
               base: float = 0.0, budget: int = 100) -> dict:
    """A dashboard sync reply (``feed.sync``'s shape) carrying the task records packed into
    ``facts`` by ``feed.pack``, up to ``cursor``, and nothing else live: for mirror tests."""
    return {
        "session": session, "now": now, "base": base, "base_wall": 0.0, "budget": budget,
        "cost_s": 0.0,
        "tasks": {"cursor": cursor, "lost": 0, **facts},
        "spans": {"cursor": 0, "lost": 0, "rows": []},
        "live": {"counts": {}, "rows": [], "total": 0}, "resources": {}, "workers": [],
        "known_workers": {}, "actors": [], "actor_count": 0, "store": {}, "findings": [],
        "progress": [],
    }
