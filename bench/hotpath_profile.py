"""Where lightwork's hot path spends its time: event-log phases and CPU per driver thread.

Usage (from the repository root)::

    python bench/hotpath_profile.py [--sync-calls 2000] [--tasks 10000] [--rounds 3]

For a loop of synchronous ``get(f.remote())`` calls and for batches of ``--tasks``
no-op tasks (then the same two loops as calls of one actor's no-op method, wall and CPU
only) it prints

* the event log's phases (``lightwork.diagnostics.task_records()``), medians:
  submit → dispatch → worker starts → arguments loaded → run → stored → the driver has
  seen the result, and (sync only) seen → the next submit;
* the CPU time each thread of the driver used per call (``/proc/self/task/*/schedstat``,
  so Linux only), which a loaded machine distorts far less than the wall clock: the
  main thread, the I/O thread ``lightwork-node``, the advisor and the others, their
  total, and the workers' (every thread of every worker process, summed);
* for the batch of tasks, the time Python's cyclic collector took per task, by
  generation (young, middle, full; ``gc.callbacks``): 2.5-2.9 µs of a batch's 17-20 µs
  per task in session 12 (``HOTPATH.md``);
* the pipe floor (``floor.py``) measured in the same run, for scale.

Every figure is printed per round, then as a median, so the noise is visible; ``--json
PATH`` also writes them for ``hotpath_ab.py``, which compares two checkouts with this
script, interleaved. Issue 13 (the hot path) was profiled with these;
``HOTPATH.md`` has the findings.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "src"))

from floor import measure as measure_floor
from workloads import Idle, noop

PHASES = (
    ("submitted", "dispatched"),
    ("dispatched", "started"),
    ("started", "args_loaded"),
    ("args_loaded", "finished"),
    ("finished", "stored"),
    ("stored", "seen"),
)


def thread_cpu_s() -> dict[int, float]:
    """Native thread id -> CPU seconds of every thread of this process.

    ``schedstat``'s nanoseconds on the CPU where the kernel has them; else ``stat``'s
    user + system time, in clock ticks (10 ms: with 2,000 calls, 5 µs per call).
    """
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            try:
                out[int(tid)] = (
                    int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e9
                )
                continue
            except (OSError, IndexError, ValueError):
                pass
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat.rpartition(")")[2].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def workers_cpu_s() -> float:
    """CPU seconds of every thread of the session's worker processes, summed."""
    from lightwork.api.core import driver_node

    node = driver_node()
    total = 0.0
    for conn in list(node.workers.values()) if node is not None else ():
        try:
            tids = os.listdir(f"/proc/{conn.pid}/task")
        except OSError:
            continue  # not started yet, or gone
        for tid in tids:
            try:
                text = Path(f"/proc/{conn.pid}/task/{tid}/schedstat").read_text()
            except OSError:
                continue
            total += int(text.split()[0]) / 1e9
    return total


def cpu_per_call_us(
    before: dict[int, float], after: dict[int, float], calls: int
) -> dict[str, float]:
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid, seconds in after.items():
        name = names.get(tid, f"thread {tid}")
        out[name] = out.get(name, 0.0) + (seconds - before.get(tid, 0.0)) / calls * 1e6
    out["driver total"] = sum(out.values())
    return out


def phases_us(records: list[Any]) -> dict[str, float]:
    out = {
        f"{a} → {b}": statistics.median((getattr(r, b) - getattr(r, a)) * 1e6 for r in records)
        for a, b in PHASES
    }
    return out


class CollectorTime:
    """Seconds the cyclic collector spent in each generation while in the ``with``
    block (``gc.callbacks``: collections run one at a time, under the GIL)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started

    def __enter__(self) -> CollectorTime:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._callback)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sync-calls", type=int, default=2_000)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="also write every figure's per-round "
                        "values to PATH as JSON (hotpath_ab.py reads it)")
    args = parser.parse_args()
    if args.sync_calls < 2 or args.tasks < 1 or args.rounds < 1:
        parser.error("--sync-calls must be at least 2, --tasks and --rounds at least 1")

    import lightwork
    from lightwork import diagnostics

    warnings.simplefilter("ignore")  # the advisor rightly calls these tasks too small
    lightwork.init(num_cpus=4)
    task = lightwork.remote(noop)
    lightwork.get([task.remote() for _ in range(200)])
    actor = lightwork.remote(Idle).remote()
    lightwork.get([actor.ping.remote() for _ in range(200)])
    rows: dict[str, list[float]] = {}

    def add(prefix: str, figures: dict[str, float]) -> None:
        for name, value in figures.items():
            rows.setdefault(f"{prefix} {name}", []).append(value)

    for _ in range(args.rounds):
        workers_before = workers_cpu_s()
        before, start = thread_cpu_s(), time.perf_counter()
        for _ in range(args.sync_calls):
            lightwork.get(task.remote())
        wall = time.perf_counter() - start
        after = thread_cpu_s()
        workers_after = workers_cpu_s()
        records = diagnostics.task_records(include_unfinished=False)[-args.sync_calls :]
        add("sync", {"wall per call": wall / args.sync_calls * 1e6})
        add("sync", phases_us(records))
        add(
            "sync",
            {
                "seen → next submit": statistics.median(
                    (b.submitted - a.seen) * 1e6 for a, b in itertools.pairwise(records)
                )
            },
        )
        add("sync CPU", cpu_per_call_us(before, after, args.sync_calls))
        add("sync CPU", {"workers": (workers_after - workers_before) / args.sync_calls * 1e6})

        workers_before = workers_cpu_s()
        before, start = thread_cpu_s(), time.perf_counter()
        with CollectorTime() as collector:
            refs = [task.remote() for _ in range(args.tasks)]
            submitted = time.perf_counter()
            lightwork.get(refs)
        wall = time.perf_counter() - start
        after = thread_cpu_s()
        workers_after = workers_cpu_s()
        del refs
        records = diagnostics.task_records(include_unfinished=False)[-args.tasks :]
        add(
            "tasks",
            {
                "wall per task": wall / args.tasks * 1e6,
                "submit loop per task": (submitted - start) / args.tasks * 1e6,
            },
        )
        add("tasks", phases_us(records))
        add("tasks GC", {generation: seconds / args.tasks * 1e6 for generation, seconds
                         in zip(("young", "middle", "full"), collector.seconds)})
        add("tasks CPU", cpu_per_call_us(before, after, args.tasks))
        add("tasks CPU", {"workers": (workers_after - workers_before) / args.tasks * 1e6})

        # The same two loops as calls of one actor's method (wall and CPU only).
        for prefix, calls, batch in (("actor sync", args.sync_calls, False),
                                     ("actor calls", args.tasks, True)):
            workers_before = workers_cpu_s()
            before, start = thread_cpu_s(), time.perf_counter()
            if batch:
                lightwork.get([actor.ping.remote() for _ in range(calls)])
            else:
                for _ in range(calls):
                    lightwork.get(actor.ping.remote())
            wall = time.perf_counter() - start
            after = thread_cpu_s()
            workers_after = workers_cpu_s()
            add(prefix, {"wall per call": wall / calls * 1e6})
            add(f"{prefix} CPU", cpu_per_call_us(before, after, calls))
            add(f"{prefix} CPU", {"workers": (workers_after - workers_before) / calls * 1e6})
        add("floor", measure_floor(sync_calls=500, pipelined=args.tasks, runs=1))
    lightwork.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps(rows))

    print(
        f"lightwork hot path, µs; {args.rounds} rounds (then the median); load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    width = max(len(name) for name in rows)
    for name, values in rows.items():
        if len(values) < args.rounds:  # a thread that did not exist in every round
            values = values + [0.0] * (args.rounds - len(values))
        cells = "  ".join(f"{v:8.1f}" for v in values)
        print(f"{name.ljust(width)}  {cells}  | {statistics.median(values):8.1f}")


if __name__ == "__main__":
    main()
