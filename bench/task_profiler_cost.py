"""What profiling every task costs (``lightwork.profile_tasks``), paired.

Usage (from the repository root)::

    python bench/task_profiler_cost.py [--rounds 6] [--hz 100] [--mode sample|cprofile]
        [--memory tracemalloc|memray] [--native] [--async-calls]
    python bench/task_profiler_cost.py --rss [--rounds 8]

Two workloads, each run with the profiler off and on in turn (off on, then on off in
the next round, so a drift in the machine's load weighs on both alike), in one runtime:

* ``guide loops``: the profiling guide's loops (``lightwork demo``'s ex1, ex2, ex3) with
  0.1 s tasks; the figure is their wall time. The tasks sleep, as in the guide.
* ``cpu tasks``: 40 CPU-bound tasks of a fixed amount of pure-Python work on 2 workers;
  the figures are the workers' process CPU time per task (the sampler thread's CPU is
  in it: ``time.process_time`` counts every thread) and the batch's wall time;
* ``call tasks``: 40 tasks that each call a small function 50,000 times (what cProfile
  pays for: a hook per call and return); the workers' CPU time per task;
* ``no-op tasks``: 2,000 tasks that do nothing, in one batch; the wall time per task
  (what a profile adds to each call's path: cProfile mode's wrapper).

* ``async calls`` (with ``--async-calls``): 40 calls of the CPU-bound work on an async
  actor, each awaiting once midway; the actor worker's CPU time per call (what stepping
  a coroutine adds in cProfile, line and memory profiles).

With sampling, the samplers' own CPU time is printed too, as a share of one core
(the busiest worker's): what the sampling threads cost, apart from what taking the
GIL from a task costs it.

``--mode`` picks the profile: stack samples at ``--hz`` (the default) or cProfile;
``--memory`` adds tracemalloc or memray to it, and ``--native`` samples with py-spy.

``--rss`` measures what no profile asks for: every task record's resident memory
(``task_memory.py``), the workers' ``/proc`` probe on and off in turn (a task on each
worker sets it aside and puts it back), on 10,000 no-op tasks in one batch (the probe
reads only a function's first run on a worker there: the figure is what the gate
costs) and on 1,000 tasks of 1 ms of work each (every call is read: the reads' cost);
the wall time per task of each.

Printed per figure: the medians off and on, and the median of the per-round ratios
on/off. A shared 2-core host is noisy: the CPU figure is the one to read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import lightwork as ray  # noqa: E402

WORK = 300_000  # iterations: ~30 ms of pure Python on this host


@ray.remote
def crunch() -> float:
    started = time.process_time()
    total = 0
    for i in range(WORK):
        total += i * i
    return time.process_time() - started


def small(i: int) -> int:
    return i + 1


@ray.remote
def call_many() -> float:
    started = time.process_time()
    for i in range(50_000):
        small(i)
    return time.process_time() - started


@ray.remote
def noop() -> None:
    pass


@ray.remote
def nap(seconds: float) -> None:
    time.sleep(seconds)


def serial(seconds: float) -> None:
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


def guide_loops() -> float:
    started = time.perf_counter()
    for _ in range(5):
        ray.get(nap.remote(0.1))
    ray.get([nap.remote(0.1) for _ in range(5)])
    refs = []
    for _ in range(5):
        serial(0.03)
        refs.append(nap.remote(0.1))
    ray.get(refs)
    return time.perf_counter() - started


def cpu_tasks() -> tuple[float, float]:
    started = time.perf_counter()
    cpu = ray.get([crunch.remote() for _ in range(40)])
    return statistics.median(cpu), time.perf_counter() - started


def call_tasks() -> float:
    return statistics.median(ray.get([call_many.remote() for _ in range(40)]))


def noop_tasks() -> float:
    started = time.perf_counter()
    ray.get([noop.remote() for _ in range(2_000)])
    return (time.perf_counter() - started) / 2_000


@ray.remote
class Crunchy:
    async def crunch(self) -> float:
        import asyncio

        started = time.process_time()
        total = 0
        for i in range(WORK // 2):
            total += i * i
        await asyncio.sleep(0)
        for i in range(WORK // 2):
            total += i * i
        return time.process_time() - started

    def cpu(self) -> float:
        return time.process_time()


_actor: list[Crunchy] = []


def async_calls() -> float:
    if not _actor:
        _actor.append(Crunchy.remote())
    actor = _actor[0]
    before = ray.get(actor.cpu.remote())
    ray.get([actor.crunch.remote() for _ in range(40)])
    return (ray.get(actor.cpu.remote()) - before) / 40


def workloads(with_async: bool = False) -> dict[str, float]:
    loops = guide_loops()
    cpu, wall = cpu_tasks()
    figures = {"guide loops wall s": loops, "cpu tasks CPU/task ms": 1000 * cpu,
               "cpu tasks wall s": wall, "call tasks CPU/task ms": 1000 * call_tasks(),
               "no-op tasks wall/task us": 1e6 * noop_tasks()}
    if with_async:
        figures["async calls CPU/call ms"] = 1000 * async_calls()
    return figures


def measure(profiled: bool, hz: float, mode: str = "sample", memory: str = "",
            native: bool = False, with_async: bool = False) -> dict[str, float]:
    if not profiled:
        return workloads(with_async)
    kept: bool | str = {"": False, "tracemalloc": True, "memray": "memray"}[memory]
    with ray.profile_tasks(hz=hz, mode=mode, memory=kept, native=native) as prof:
        figures = workloads(with_async)
    assert (prof.calls if mode == "cprofile" else prof.total) > 0
    workers = [p["sampler_cpu"] for p in prof.processes if p["worker_id"]]
    if workers and prof.duration:  # the samplers' own CPU, a share of one core each
        figures["sampler CPU % of a core"] = 100 * max(workers) / prof.duration
    return figures


def spin(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


@ray.remote
def millisecond() -> None:
    spin(0.001)


@ray.remote
def set_probe(on: bool) -> int:
    """Put this worker's memory probe aside (``on`` False) or back; holds its slot a
    moment, so two calls at once run on the two workers."""
    from lightwork.engines.local import worker as worker_module

    worker = worker_module._current_worker
    if not hasattr(worker, "_bench_probe"):
        worker._bench_probe = worker._memory
    worker._memory = worker._bench_probe if on else None
    spin(0.2)
    return os.getpid()


def switch_probes(on: bool) -> None:
    for _ in range(10):
        if len(set(ray.get([set_probe.remote(on) for _ in range(2)]))) == 2:
            return
    raise RuntimeError("could not reach both workers to switch their memory probes")


def measure_rss(on: bool) -> dict[str, float]:
    switch_probes(on)
    started = time.perf_counter()
    ray.get([noop.remote() for _ in range(10_000)])
    noops = (time.perf_counter() - started) / 10_000
    started = time.perf_counter()
    ray.get([millisecond.remote() for _ in range(1_000)])
    return {"no-op tasks wall/task us": 1e6 * noops,
            "1 ms tasks wall/task us": 1e6 * (time.perf_counter() - started) / 1_000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--hz", type=float, default=100.0)
    parser.add_argument("--mode", choices=("sample", "cprofile"), default="sample")
    parser.add_argument("--memory", choices=("tracemalloc", "memray"), default="")
    parser.add_argument("--native", action="store_true")
    parser.add_argument("--async-calls", action="store_true")
    parser.add_argument("--rss", action="store_true")
    args = parser.parse_args()
    ray.init(num_cpus=2)
    if args.rss:
        measure_rss(True)  # warm-up: workers, functions
        paired: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for index in range(args.rounds):
            for on in ((False, True) if index % 2 == 0 else (True, False)):
                paired[on].append(measure_rss(on))
        switch_probes(True)
        ray.shutdown()
        report(paired, f"{args.rounds} rounds, memory probe off and on")
        return
    measure(False, args.hz, with_async=args.async_calls)  # warm-up: workers, functions
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for index in range(args.rounds):
        for profiled in ((False, True) if index % 2 == 0 else (True, False)):
            runs[profiled].append(measure(profiled, args.hz, args.mode, args.memory,
                                          args.native, args.async_calls))
    ray.shutdown()
    what = f"{args.hz:g} Hz" if args.mode == "sample" else "cProfile"
    what += f", {args.memory}" * bool(args.memory) + ", native" * args.native
    report(runs, f"{args.rounds} rounds, {what}")


def report(runs: dict[bool, list[dict[str, float]]], what: str) -> None:
    print(f"{'figure':<26}{'off':>10}{'on':>10}{'on/off':>9}   ({what})")
    for figure in runs[True][0]:
        if figure not in runs[False][0]:  # a figure of the profile itself
            print(f"{figure:<26}{'':>10}{statistics.median(r[figure] for r in runs[True]):>10.4f}")
            continue
        off = [r[figure] for r in runs[False]]
        on = [r[figure] for r in runs[True]]
        ratio = statistics.median(b / a for a, b in zip(off, on))
        print(f"{figure:<26}{statistics.median(off):>10.4f}{statistics.median(on):>10.4f}"
              f"{ratio:>9.3f}")


if __name__ == "__main__":
    main()
