"""``Profiler``, ``ResourceProfiler``, ``CacheProfiler``: Dask's profilers on lightwork.

Results are lists of Dask's namedtuples (same names, same fields, same order):
``TaskData(key, task, start_time, end_time, worker_id)``, ``ResourceData(time, mem,
cpu)``, ``CacheData(key, task, metric, cache_time, free_time)``. Every time is
``time.monotonic()`` seconds: the clock of the runtime's event log, which on Linux is
the clock of Dask's ``default_timer`` too, so ``start_time``/``end_time`` and the
results line up in the plots.

What differs from Dask, on purpose:

* ``Profiler`` takes a task's start and end from the worker that ran it (the task's
  ``TaskRecord``, via ``current_task_record()``), and its lightwork worker id; only
  under a foreign scheduler (Dask's own) does it fall back to pretask/posttask times.
* ``ResourceProfiler`` samples, in a thread of the driver, the driver and all its
  descendants (the fork server's workers and actors are among them), summing RSS (MB)
  and CPU (%); it looks for new processes (a scan of ``/proc``) at most once a second
  and reads two small files per known process per sample. Each process's CPU counter is
  primed when first seen, so no sample reports a spurious 0% for it; a last sample is
  taken when collection stops, so short runs have one. It has no per-task hook.
  On the cluster backend each worker reads its own CPU and RSS, all in one
  ``client.run`` per sample (``_ClusterSampler``); ``results`` sums the driver and the
  workers, and ``per_worker`` keeps each process's samples by address.
* ``start_time``/``end_time`` are set also when a profiler is used through
  ``register()`` (the first ``start`` and the last ``finish``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from lightwork.diagnostics.callbacks import Callback, current_task_record

__all__ = ["CacheData", "CacheProfiler", "Profiler", "ResourceData", "ResourceProfiler",
           "TaskData"]

TaskData = namedtuple("TaskData", ("key", "task", "start_time", "end_time", "worker_id"))
ResourceData = namedtuple("ResourceData", ("time", "mem", "cpu"))
CacheData = namedtuple("CacheData", ("key", "task", "metric", "cache_time", "free_time"))

_now = time.monotonic
#: Python's switch interval while a ResourceProfiler starts its thread or takes its last
#: sample in the caller's thread (see ``_prompt_gil``).
PROMPT_SWITCH_S = 0.0001
_prompt_lock = threading.Lock()
_prompts = 0  # _prompt_gil blocks running now
_switch_before = 0.005  # the process's interval, kept by the first of them


@contextlib.contextmanager
def _prompt_gil() -> Iterator[None]:
    """Let a thread that gave up the GIL (to start a thread, to read a /proc file) have
    it back within ``PROMPT_SWITCH_S`` rather than the default 5 ms, for a moment.

    Right after a batch the runtime's own threads (the advisor, the I/O thread) hold the
    GIL for their whole switch interval each time a reader lets go of it: entering a
    ResourceProfiler then took 15-30 ms (starting its thread) and leaving it 20-26 ms
    (its thread's end, the last sample's ~14 reads), 2 ms and under 4 ms when the
    runtime idled: 9% of a 20,000-task batch. The interval is the process's, so it is
    restored at once after."""
    import sys

    global _prompts, _switch_before
    with _prompt_lock:  # the first one in keeps the process's interval, the last restores it
        if _prompts == 0:
            _switch_before = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_before, PROMPT_SWITCH_S))
        _prompts += 1
    try:
        yield
    finally:
        with _prompt_lock:
            _prompts -= 1
            if _prompts == 0:
                sys.setswitchinterval(_switch_before)


class _Timed(Callback):
    """start_time/end_time bookkeeping shared by the profilers."""

    start_time: float | None
    end_time: float | None

    def __enter__(self) -> Any:
        self.clear()
        self._entered = True
        self.start_time = _now()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._entered = False
        self.end_time = _now()
        super().__exit__(*exc)

    def _mark_start(self) -> None:
        if self.start_time is None:
            self.start_time = _now()

    def _mark_finish(self) -> None:
        if not getattr(self, "_entered", False):
            self.end_time = _now()

    def clear(self) -> None:
        self.start_time = None
        self.end_time = None

    def visualize(self, **kwargs: Any) -> Any:
        """A bokeh plot of the results; see :func:`lightwork.diagnostics.visualize`."""
        from lightwork.diagnostics.visualize import visualize

        return visualize(self, **kwargs)


class Profiler(_Timed):
    """Per task: key, task, start and end time on its worker, worker id.

    Under lightwork's schedulers the run hands over its ended tasks in batches, which
    are kept as they are and turned into ``TaskData`` when ``results`` is first read:
    the profiled program pays one append per batch, the reader about 2 µs per task.
    """

    _posttask_needs_result = False
    _run_needs = "tasks"  # reads its batches' items, never dsk or state

    def __init__(self) -> None:
        self._results: list[TaskData] = []
        self._unread: list[tuple[Iterable[tuple[Any, Any, Any, Any]], float]] = []
        self._started: dict[Any, float] = {}
        self.clear()

    @property
    def results(self) -> list[TaskData]:
        if self._unread:
            unread, self._unread = self._unread, []
            append = self._results.append
            make = tuple.__new__  # TaskData(...) would run namedtuple's Python __new__
            for items, handed_over in unread:
                for key, task, worker_id, record in items:
                    if record is not None and record.finished:
                        append(make(TaskData, (key, task, record.started, record.finished,
                                               record.worker_id)))
                    else:  # ran on the driver (an alias): no worker times
                        append(make(TaskData, (key, task, handed_over, handed_over,
                                               worker_id)))
        return self._results

    @results.setter
    def results(self, value: list[TaskData]) -> None:
        self._unread = []
        self._results = value

    def _start(self, dsk: Any) -> None:
        self._mark_start()

    def _pretask(self, key: Any, dsk: Any, state: Any) -> None:
        self._started[key] = _now()

    def _posttask(self, key: Any, value: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        record = current_task_record()
        started = self._started.pop(key, None)
        if record is not None and record.finished:
            data = TaskData(key, dsk[key], record.started, record.finished, record.worker_id)
        else:
            end = _now()
            data = TaskData(key, dsk[key], end if started is None else started, end, worker_id)
        self.results.append(data)

    def _posttask_batch(self, items: Iterable[tuple[Any, Any, Any, Any]], dsk: Any,
                        state: Any) -> None:
        self._unread.append((items, _now()))

    def _finish(self, dsk: Any, state: Any, failed: bool) -> None:
        self._mark_finish()

    def _plot(self, **kwargs: Any) -> Any:
        from lightwork.diagnostics.visualize import plot_tasks

        return plot_tasks(self.results, self.start_time, self.end_time, **kwargs)

    def clear(self) -> None:
        """Forget old results (needed between runs when registered globally)."""
        self.results = []
        self._started = {}
        super().clear()


class CacheProfiler(_Timed):
    """Per task: how long its value stayed in the scheduler's cache, and its size."""

    def __init__(self, metric: Callable[[Any], Any] | None = None,
                 metric_name: str | None = None) -> None:
        self._metric = metric if metric is not None else _count
        self._posttask_needs_result = metric is not None
        if metric_name:
            self._metric_name = metric_name
        elif metric is not None:
            self._metric_name = getattr(metric, "__name__", type(metric).__name__)
        else:
            self._metric_name = "count"
        self.results: list[CacheData] = []
        self._cache: dict[Any, tuple[Any, float]] = {}
        self.clear()

    def _start(self, dsk: Any) -> None:
        self._mark_start()

    def _posttask(self, key: Any, value: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        now = _now()
        self._cache[key] = (self._metric(value), now)
        cache = self._cache
        for gone in [k for k in state["released"] if k in cache] if len(
                state["released"]) < len(cache) else [k for k in cache if k in state["released"]]:
            metric, since = cache.pop(gone)
            self.results.append(CacheData(gone, dsk[gone], metric, since, now))

    def _finish(self, dsk: Any, state: Any, failed: bool) -> None:
        now = _now()
        for key, (metric, since) in self._cache.items():
            self.results.append(CacheData(key, dsk[key], metric, since, now))
        self._cache.clear()
        self._mark_finish()

    def _plot(self, **kwargs: Any) -> Any:
        from lightwork.diagnostics.visualize import plot_cache

        return plot_cache(self.results, self.start_time, self.end_time,
                          self._metric_name, **kwargs)

    def clear(self) -> None:
        self.results = []
        self._cache = {}
        super().clear()


def _count(value: Any) -> int:
    return 1


class ResourceProfiler(_Timed):
    """Every ``dt`` seconds: memory (MB) and CPU (%) of the driver and all workers."""

    _run_needs = "nothing"  # a plain get under it builds no graph: no per-task cost

    def __init__(self, dt: float = 1) -> None:
        if not dt > 0:
            raise ValueError(f"ResourceProfiler(dt=...) must be > 0 seconds, got {dt!r}")
        self._dt = dt
        self._entered = False
        self._sampler: _Sampler | _ClusterSampler | None = None
        self.results: list[ResourceData] = []
        self.clear()

    def __enter__(self) -> Any:
        result = super().__enter__()
        self._start_collect()
        return result

    def __exit__(self, *exc: Any) -> None:
        self._stop_collect()
        super().__exit__(*exc)

    def _start(self, dsk: Any) -> None:
        self._mark_start()
        self._start_collect()

    def _finish(self, dsk: Any, state: Any, failed: bool) -> None:
        if not self._entered:
            self._stop_collect()
        self._mark_finish()

    def _start_collect(self) -> None:
        if self._sampler is None:
            from lightwork.api import core as _api

            # (the session's record: a cluster's samples its workers with the log off too)
            record = _api.run_record("ResourceProfiler", session=True)
            with _prompt_gil():  # (both prime their counters: reads that let go of the GIL)
                if record is not None and record.processes_elsewhere:
                    self._sampler = _ClusterSampler(self._dt, record)
                else:
                    family = None if record is None else record.runtime_pids()
                    self._sampler = _Sampler(self._dt, family)
                self._sampler.start()

    def _stop_collect(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            self.results.extend(sampler.stop())
            for where, samples in getattr(sampler, "per_process", {}).items():
                self.per_worker.setdefault(where, []).extend(samples)

    def close(self) -> None:
        """Stop sampling (results so far are kept)."""
        self._stop_collect()

    def __del__(self) -> None:
        sampler = getattr(self, "_sampler", None)
        if sampler is not None:
            sampler.halt.set()

    def clear(self) -> None:
        self.results = []
        #: On the cluster backend: the samples of each process, by where it runs
        #: ("driver" or the worker's address); ``results`` holds their sums.
        self.per_worker: dict[str, list[ResourceData]] = {}
        super().clear()

    def _plot(self, **kwargs: Any) -> Any:
        from lightwork.diagnostics.visualize import plot_resources

        return plot_resources(self.results, self.start_time, self.end_time, **kwargs)


class _Sampler(threading.Thread):
    """Samples the driver's process family every ``dt`` seconds.

    Finding the family means reading every process's ``/proc`` entry, so it is done at
    most every ``RESCAN_S`` seconds; in between, the processes already found are sampled
    (two reads each). A process found in a scan is sampled from the next sample on: its
    CPU counter is primed when found, so its first share is a real one.
    """

    RESCAN_S = 1.0

    def __init__(self, dt: float, family: list[int] | None = None) -> None:
        super().__init__(name="lightwork-resource-profiler", daemon=True)
        import psutil

        self.psutil = psutil
        self.dt = dt
        self.halt = threading.Event()
        self.samples: list[ResourceData] = []
        self.pid = os.getpid()
        self.processes: dict[int, Any] = {}  # pid -> psutil.Process, CPU counter primed
        self.scanned = 0.0
        # Prime every CPU counter, so the first sample is a real one: here, in the
        # caller, before the thread starts, and only for the processes the runtime
        # knows (``family``; the thread's first rescan, RESCAN_S later, finds their
        # children). Done by the thread, a scan of every process in /proc, its ~80 reads
        # each giving up the GIL to a program submitting tasks by then, costs a short run
        # several percent (measured: see bench/HOTPATH.md, "The diagnostics' costs").
        if family is None:
            self._rescan()
        else:
            self._adopt([self.pid, *family])

    def _rescan(self) -> set[int]:
        """Find this process and all its descendants (the fork server, every worker and
        actor process, and their children); return the pids found for the first time."""
        psutil = self.psutil
        self.scanned = _now()
        try:
            me = self.processes.get(self.pid) or psutil.Process(self.pid)
            family = [me, *me.children(recursive=True)]  # one scan of /proc
        except psutil.Error:
            return set()
        known, self.processes = self.processes, {}
        for found in family:
            process = known.get(found.pid)
            if process is None:
                process = found
                try:
                    process.cpu_percent(None)
                except psutil.Error:
                    continue
            self.processes[found.pid] = process
        return self.processes.keys() - known.keys()

    def _adopt(self, pids: list[int]) -> None:
        """Sample these processes (this one and the runtime's), their counters primed;
        the full scan comes ``RESCAN_S`` from now."""
        self.scanned = _now()
        for pid in pids:
            try:
                process = self.psutil.Process(pid)
                process.cpu_percent(None)
            except self.psutil.Error:
                continue
            self.processes[pid] = process

    def _sample(self) -> None:
        # A process primed just now has no CPU share yet: its memory counts, its CPU not.
        fresh = self._rescan() if _now() - self.scanned >= self.RESCAN_S else set()
        psutil = self.psutil
        mem = cpu = 0.0
        for pid, process in list(self.processes.items()):
            try:
                with process.oneshot():  # one read of /proc/PID/stat for both
                    if process.status() == psutil.STATUS_ZOMBIE:
                        continue
                    percent = 0.0 if pid in fresh else process.cpu_percent(None)
                rss = process.memory_info().rss
            except psutil.Error:
                self.processes.pop(pid, None)  # gone since the last scan
                continue
            mem += rss
            cpu += percent
        self.samples.append(ResourceData(_now(), mem / 1e6, cpu))

    def run(self) -> None:
        while not self.halt.wait(self.dt):
            self._sample()

    def stop(self) -> list[ResourceData]:
        with _prompt_gil():
            self.halt.set()
            self.join()
            self._sample()
        return self.samples


class _ClusterSampler(threading.Thread):
    """Samples the driver and every cluster worker every ``dt`` seconds.

    Each worker reads its own CPU and RSS (psutil in the worker process), all of them
    in one round trip through the engine (the run record's ``remote_process_usage``);
    the driver reads its own. A worker that joins later is primed by its first
    sample (0 %), as a new local process is. ``per_process`` keeps each one's samples.
    """

    def __init__(self, dt: float, record: Any) -> None:
        super().__init__(name="lightwork-resource-profiler", daemon=True)
        import psutil

        self.dt = dt
        self.record = record
        self.halt = threading.Event()
        self.samples: list[ResourceData] = []
        self.per_process: dict[str, list[ResourceData]] = {}
        self.me = psutil.Process()
        self.me.cpu_percent(None)
        self._ask()  # primes every worker's CPU counter: the first sample is a real one

    def _ask(self) -> dict[str, Any]:
        return self.record.remote_process_usage()

    def _sample(self) -> None:
        replies = self._ask()
        now = _now()
        with self.me.oneshot():
            readings = {"driver": (self.me.cpu_percent(None), self.me.memory_info().rss)}
        for address, (_pid, cpu, rss) in sorted(replies.items()):
            readings[str(address)] = (cpu, rss)
        for where, (cpu, rss) in readings.items():
            self.per_process.setdefault(where, []).append(ResourceData(now, rss / 1e6, cpu))
        self.samples.append(ResourceData(now, sum(r for _, r in readings.values()) / 1e6,
                                         sum(c for c, _ in readings.values())))

    def run(self) -> None:
        while not self.halt.wait(self.dt):
            self._sample()

    def stop(self) -> list[ResourceData]:
        self.halt.set()
        self.join()
        self._sample()
        return self.samples
