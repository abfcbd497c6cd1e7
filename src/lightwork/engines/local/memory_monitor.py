"""The memory monitor: kill a task's worker before the machine runs out of memory.

A daemon thread ("lightwork-memory", a ``periodic.PeriodicThread``) reads the machine's
memory every ``refresh_s`` (250 ms by default) and compares the share in use with the
threshold.
"In use" is ``MemTotal - MemAvailable`` from ``/proc/meminfo``: the kernel's estimate of
what cannot be reclaimed, so the page cache does not count. When the program runs in a
memory-limited cgroup (a container, a systemd slice, a batch job), the limit is what
counts: ``make_reader`` finds the cgroups of this process and their ancestors once
(``/proc/self/cgroup``; v2 ``memory.max``/``memory.current``, v1
``memory.limit_in_bytes``/``memory.usage_in_bytes``), subtracts their reclaimable page
cache (``inactive_file`` in ``memory.stat``) and uses whichever of the machine and the
limited cgroups has the highest share in use; the message names which. The file is read with one
plain ``read`` of procfs, which never waits on a disk; the thread takes the node's lock
only to pick and mark a victim, and the node's lock is never held across disk I/O.

Above the threshold, one worker is killed (SIGKILL) and no other until that death has
been handled, so the memory it held is returned before the next reading counts:

1. the worker running the newest retriable task (``max_retries`` not used up), which
   is retried after a backoff (``OOM_BACKOFF_S`` doubling per memory kill of that task,
   at most ``OOM_BACKOFF_MAX_S``): each retry counts against ``max_retries``;
2. only when no retriable task is running: the newest non-retriable task's worker,
   whose task fails with ``OutOfMemoryError``, or else the newest actor, which dies
   (or restarts, per ``max_restarts``) with that message as its death cause.

A retriable task whose retries are used up also fails with ``OutOfMemoryError``. Its
message names the memory in use, the threshold, the task and this policy.

Configuration (``configure``): ``init(_memory_usage_threshold=0.95,
_memory_monitor_refresh_ms=250)``, else the environment variables
``LIGHTWORK_MEMORY_USAGE_THRESHOLD`` / ``LIGHTWORK_MEMORY_MONITOR_REFRESH_MS``, else
Ray's ``RAY_memory_usage_threshold`` / ``RAY_memory_monitor_refresh_ms``. A refresh of 0
turns the monitor off. Tests replace ``reader`` to inject readings.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from lightwork.kernel.environ import setting
from lightwork.kernel import exceptions
from lightwork.kernel.periodic import PeriodicThread
from lightwork.engines.local.scheduler import WAITING

if TYPE_CHECKING:
    from lightwork.engines.local.node import Node, NodeState, WorkerConn
    from lightwork.engines.local.scheduler import TaskSpec

DEFAULT_THRESHOLD = 0.95
DEFAULT_REFRESH_MS = 250
OOM_BACKOFF_S = 0.1
OOM_BACKOFF_MAX_S = 5.0
OOM_REASON = "killed by the memory monitor"

#: A reading: (bytes in use, bytes allowed), optionally a third item naming whose memory.
MemoryReader = Callable[[], tuple[Any, ...]]


def read_meminfo(path: str = "/proc/meminfo") -> tuple[int, int]:
    """(bytes in use, total bytes) of this machine; page cache and buffers not in use."""
    fd = os.open(path, os.O_RDONLY)
    try:
        text = os.read(fd, 1 << 16).decode("ascii", "replace")
    finally:
        os.close(fd)
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            fields[name] = int(parts[0]) * 1024
    total = fields["MemTotal"]
    available = fields.get("MemAvailable")
    if available is None:  # kernels before 3.14
        available = fields.get("MemFree", 0) + fields.get("Buffers", 0) + fields.get("Cached", 0)
    return total - available, total


CGROUP_ROOT = "/sys/fs/cgroup"
#: A v1 limit at or above this means "no limit" (the kernel reports ~2**63 rounded down).
_UNLIMITED = 1 << 60


@dataclass(frozen=True, slots=True)
class CgroupFiles:
    """The memory files of one cgroup: its limit, its usage and its stat (v1 or v2)."""

    name: str  # the cgroup's path, for messages
    limit: str
    usage: str
    stat: str
    inactive_key: str  # the memory.stat line of reclaimable file pages


def find_cgroups(root: str = CGROUP_ROOT,
                 self_cgroup: str = "/proc/self/cgroup") -> list[CgroupFiles]:
    """The memory cgroups this process is in, its own and every ancestor that has files
    (a limit may be set on any of them): cgroup v2 (``0::/path``) and v1 (``memory``)."""
    try:
        with open(self_cgroup, encoding="ascii", errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        return []
    found: list[CgroupFiles] = []
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            base, files = root, ("memory.max", "memory.current", "memory.stat", "inactive_file")
            if not os.path.exists(os.path.join(root, "cgroup.controllers")):
                base = os.path.join(root, "unified")  # the hybrid layout
        elif "memory" in controllers.split(","):
            base = os.path.join(root, "memory")
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat",
                     "total_inactive_file")
        else:
            continue
        found.extend(_levels(base, path, files))
    return found


def _levels(base: str, path: str, files: tuple[str, str, str, str]) -> list[CgroupFiles]:
    levels: list[CgroupFiles] = []
    parts = [part for part in path.split("/") if part]
    # Inside a container the cgroup namespace's root is mounted at ``base`` itself, so
    # a path that does not exist there is looked for at every shorter suffix too.
    for depth in range(len(parts), -1, -1):
        directory = os.path.join(base, *parts[:depth])
        limit = os.path.join(directory, files[0])
        if os.path.exists(limit) and not any(level.limit == limit for level in levels):
            levels.append(CgroupFiles("/" + "/".join(parts[:depth]), limit,
                                      os.path.join(directory, files[1]),
                                      os.path.join(directory, files[2]), files[3]))
    return levels


def read_cgroup(cgroup: CgroupFiles) -> tuple[int, int] | None:
    """(bytes in use, limit) of one cgroup, or None when it has no limit. In use is
    the usage minus its inactive file pages (page cache the kernel would reclaim)."""
    limit_text = _read_small(cgroup.limit).strip()
    if not limit_text or limit_text == "max":
        return None
    limit = int(limit_text)
    if limit <= 0 or limit >= _UNLIMITED:
        return None
    usage = int(_read_small(cgroup.usage).strip() or 0)
    inactive = 0
    for line in _read_small(cgroup.stat).splitlines():
        name, _, value = line.partition(" ")
        if name == cgroup.inactive_key:
            inactive = int(value)
            break
    return max(0, usage - inactive), limit


def _read_small(path: str) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 16).decode("ascii", "replace")
    finally:
        os.close(fd)


class MemoryReading(NamedTuple):
    used: int
    total: int
    scope: str  # whose memory: "the machine's", or "cgroup /x's (limit)"


def make_reader(meminfo: str = "/proc/meminfo", root: str = CGROUP_ROOT,
                self_cgroup: str = "/proc/self/cgroup") -> Callable[[], MemoryReading]:
    """A reader of the tighter of the machine's memory and the limits of the cgroups
    this process runs in (the one with the highest share in use)."""
    cgroups = find_cgroups(root, self_cgroup)

    def read() -> MemoryReading:
        used, total = read_meminfo(meminfo)
        best = MemoryReading(used, total, "the machine's")
        for cgroup in cgroups:
            try:
                reading = read_cgroup(cgroup)
            except (OSError, ValueError):
                continue  # gone (a moved process) or unreadable: the machine's still counts
            if reading is not None and reading[0] * best.total > best.used * reading[1]:
                best = MemoryReading(reading[0], reading[1], f"cgroup {cgroup.name}'s")
        return best

    return read


def configure(threshold: Any, refresh_ms: Any) -> tuple[float, float]:
    """The threshold (a fraction) and the refresh period (seconds; 0 = off), validated."""
    if threshold is None:
        threshold = _from_env("LIGHTWORK_MEMORY_USAGE_THRESHOLD", "RAY_memory_usage_threshold",
                              DEFAULT_THRESHOLD)
    if refresh_ms is None:
        refresh_ms = _from_env("LIGHTWORK_MEMORY_MONITOR_REFRESH_MS",
                               "RAY_memory_monitor_refresh_ms", DEFAULT_REFRESH_MS)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not (
            0.0 < threshold <= 1.0):
        raise ValueError(
            f"the memory usage threshold must be a fraction in (0, 1] of the machine's memory "
            f"(0.95 = kill a task when 95% is in use), got {threshold!r}")
    if isinstance(refresh_ms, bool) or not isinstance(refresh_ms, (int, float)) or refresh_ms < 0:
        raise ValueError(
            f"the memory monitor's refresh must be a number of milliseconds >= 0 (0 turns "
            f"the monitor off), got {refresh_ms!r}")
    return float(threshold), refresh_ms / 1000.0


def _from_env(name: str, ray_name: str, default: float) -> float:
    value = setting((name, ray_name), float, "a number")
    return default if value is None else value


class MemoryMonitor:
    """See the module docstring. ``check`` is one round; the thread calls it in a loop."""

    def __init__(self, node: Node, threshold: float, refresh_s: float,
                 reader: MemoryReader | None = None) -> None:
        self.node = node
        self.threshold = threshold
        self.refresh_s = refresh_s
        self.reader = reader if reader is not None else make_reader()
        self.kills = 0
        self._victim: WorkerConn | None = None  # killed, its death not yet handled
        self._thread = PeriodicThread("lightwork-memory", refresh_s, self.check,
                                      self._report_error)

    def start(self) -> None:
        if self.refresh_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def _report_error(self, error: Exception) -> bool:
        from lightwork.kernel.introspect import report_unraisable

        report_unraisable(error, "Exception ignored in lightwork's memory monitor", self)
        return True  # a bad reading must not end the monitor

    def check(self) -> WorkerConn | None:
        """Read the memory once; kill a worker if it is over the threshold. Return it."""
        reading = self.reader()
        used, total = reading[0], reading[1]
        if total <= 0 or used / total < self.threshold:
            return None
        scope = reading[2] if len(reading) > 2 else "the machine's"
        node = self.node
        with node.lock:
            if node.closed:
                return None
            victim = self._victim
            if victim is not None and not victim.dead:
                return None  # the last kill has not been handled yet: its memory may be
            conn, task = self._choose()
            if conn is None:
                return None
            conn.oom_kill = self._message(used, total, task, conn, scope)
            if conn.actor is not None and not conn.actor.death_cause:
                conn.actor.death_cause = conn.oom_kill
            self._victim = conn
            self.kills += 1
            try:
                os.kill(conn.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return conn

    def _choose(self) -> tuple[WorkerConn | None, TaskSpec | None]:
        """The worker to kill, and the task it runs (None for an actor), by the policy."""
        retriable: list[tuple[float, WorkerConn, TaskSpec]] = []
        others: list[tuple[float, WorkerConn, TaskSpec]] = []
        actors: list[tuple[float, WorkerConn]] = []
        for conn in self.node.workers.values():
            if conn.dead or conn.eof_at or not conn.pid:
                continue
            if conn.actor is not None:
                actors.append((conn.actor.started_at, conn))
                continue
            inflight = conn.slot.inflight
            if not inflight:
                continue
            task = inflight[0]
            started = task.record.dispatched
            if task.max_retries < 0 or task.attempt < task.max_retries:
                retriable.append((started, conn, task))
            else:
                others.append((started, conn, task))
        for group in (retriable, others):
            if group:
                _, conn, task = max(group, key=lambda item: item[0])
                return conn, task
        if actors:
            return max(actors, key=lambda item: item[0])[1], None
        return None, None

    def _message(self, used: int, total: int, task: TaskSpec | None, conn: WorkerConn,
                 scope: str = "the machine's") -> str:
        what = (f"task {task.name} (task id {task.task_id})" if task is not None
                else f"actor {conn.actor.class_name} (id {conn.actor.actor_id:020x})")
        resident, peak = worker_memory(conn.pid)
        held = (f", holding {resident / 2**30:.2f} GiB resident (its peak "
                f"{max(peak, resident) / 2**30:.2f} GiB)" if resident else "")
        return (
            f"{what} was {OOM_REASON} (worker pid {conn.pid}{held}): {scope} memory in use "
            f"was {used / 2**30:.2f} GiB of {total / 2**30:.2f} GiB ({used / total:.1%}), over "
            f"the threshold of {self.threshold:.1%}. Policy: the worker of the newest "
            "retriable task is killed first and its task retried with backoff; a task that "
            "cannot be retried, or an actor, is killed only when no retriable task runs. "
            "Use less memory per task, run fewer at once (a larger num_cpus per task), or "
            "raise the threshold (init(_memory_usage_threshold=...), or the environment "
            "variable LIGHTWORK_MEMORY_USAGE_THRESHOLD); `lightwork summary tasks` shows "
            "each function's peak memory per call, and lightwork.profile_tasks(memory=True) "
            "the lines that allocate it")


def worker_memory(pid: int) -> tuple[int, int]:
    """``(resident, peak)`` bytes of a worker (``VmRSS``, ``VmHWM``: its peak since its
    running call began when that call's memory is measured, ``task_memory.py``, else
    since it started); ``(0, 0)`` if unknown."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read()
        values = []
        for name in (b"VmRSS:", b"VmHWM:"):
            start = text.index(name) + len(name)
            values.append(int(text[start:text.index(b"kB", start)]) * 1024)
        return values[0], values[1]
    except (OSError, ValueError):
        return 0, 0


def handle_oom_death(node: NodeState, task: TaskSpec, conn: WorkerConn) -> None:
    """``task``'s worker was killed by the monitor: retry it after a backoff, or fail it."""
    message = conn.oom_kill
    if task.max_retries < 0 or task.attempt < task.max_retries:
        task.attempt += 1
        kills = sum(1 for _, why in task.record.retries if OOM_REASON in why)
        delay = min(OOM_BACKOFF_S * 2 ** max(0, kills - 1), OOM_BACKOFF_MAX_S)
        task.state = WAITING  # so cancel() during the backoff fails it at once

        def retry() -> None:
            if task.task_id in node.tasks and not task.cancelled:
                node._requeue(task)

        node.io.add_timer(delay, retry)
        return
    node._fail_task(task, exceptions.OutOfMemoryError(
        f"{message}. The task was tried {task.attempt + 1} time(s) "
        f"(max_retries={task.max_retries})."))
