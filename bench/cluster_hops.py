"""Where a sync call's time goes on a Dask cluster, hop by hop: plain distributed and
lightwork on distributed, in one run.

Usage (from the repository root)::

    python bench/cluster_hops.py [--calls 300]                 # one machine, LocalCluster
    python bench/cluster_hops.py --hosts 3 [--delay-ms 1]      # simulated hosts (root)

Each call is ``get(f.remote())`` (or ``client.submit(f).result()``) of a no-op, one at a
time. A scheduler plugin and a worker plugin note the time of every transition of every
key; the client notes when the scheduler's "key-in-memory" report reached it; all the
processes share this machine's clock (simulated hosts too), so the differences are the
hops:

=================  ===============================================================
client→scheduler   submit, to the scheduler's first transition of the key
scheduler          released → processing at the scheduler (placing it on a worker)
scheduler→worker   processing at the scheduler, to "executing" on the worker
run                "executing" to "memory" on the worker
worker→scheduler   "memory" on the worker, to "memory" at the scheduler
scheduler→client   "memory" at the scheduler, to the client reading the report
fetch              the report read, to the value in the caller's hands
worker→driver      "memory" on the worker, to the value in the caller's hands, when
                   the worker's reply brought it (lightwork: ``replies.py``) before
                   the scheduler's report; those calls skip the three hops above it
=================  ===============================================================

Medians over ``--calls`` calls (after a warm-up). With ``--hosts 3`` the scheduler and
the driver run on host A and one worker on each of B and C (``tests/hosts.py``), joined
by a bridge, or by the delaying wire with ``--delay-ms``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

HOPS = ("client→scheduler", "scheduler", "scheduler→worker", "run", "worker→scheduler",
        "scheduler→client", "fetch", "worker→driver")


def noop() -> None:
    return None


class Transitions:
    """Installed on the scheduler and on each worker: ``{key: {state: first time}}``."""

    name = "lightwork-bench-transitions"

    def __init__(self) -> None:
        self.times: dict[str, dict[str, float]] = {}

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        self.times.setdefault(str(key), {}).setdefault(finish, time.time())


def _plugins() -> tuple[Any, Any]:
    from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

    class OnScheduler(Transitions, SchedulerPlugin):
        async def start(self, scheduler: Any) -> None:
            scheduler._bench_transitions = self

    class OnWorker(Transitions, WorkerPlugin):
        def setup(self, worker: Any) -> None:
            worker._bench_transitions = self

    return OnScheduler(), OnWorker()


def _read_scheduler(dask_scheduler: Any) -> dict:
    plugin = dask_scheduler._bench_transitions
    times, plugin.times = plugin.times, {}
    return times


def _read_worker(dask_worker: Any) -> dict:
    plugin = dask_worker._bench_transitions
    times, plugin.times = plugin.times, {}
    return times


def _watch_reports(client: Any) -> dict[str, float]:
    """When each "key-in-memory" report reached the client (wrapping its handler)."""
    seen: dict[str, float] = {}
    handler = client._stream_handlers["key-in-memory"]

    def noted(key: Any = None, **kwargs: Any) -> Any:
        seen.setdefault(str(key), time.time())
        return handler(key=key, **kwargs)

    client._stream_handlers["key-in-memory"] = noted
    return seen


def measure(client: Any, calls: int) -> dict[str, dict[str, float]]:
    import lightwork

    on_scheduler, on_worker = _plugins()
    client.register_plugin(on_scheduler)
    client.register_plugin(on_worker)
    reports = _watch_reports(client)
    remote_noop = lightwork.remote(noop)
    ways = {
        "plain distributed": lambda: client.submit(noop, pure=False).result(),
        "lightwork on distributed": lambda: lightwork.get(remote_noop.remote()),
    }
    lightwork.init(address=client)
    out = {}
    try:
        for way, call in ways.items():
            for _ in range(30):
                call()  # warm up: imports, the function's first shipping
            client.run_on_scheduler(_read_scheduler)
            client.run(_read_worker)
            reports.clear()
            windows = []
            for _ in range(calls):
                start = time.time()
                call()
                windows.append((start, time.time()))
            out[way] = hops(windows, client.run_on_scheduler(_read_scheduler),
                            client.run(_read_worker), dict(reports))
    finally:
        lightwork.shutdown()
    return out


def hops(windows: list[tuple[float, float]], scheduler: dict, workers: dict,
         reports: dict[str, float]) -> dict[str, float]:
    """Median of each hop over the calls, in µs (each call matched to the key whose
    first transition at the scheduler falls in its window)."""
    on_workers: dict[str, dict[str, float]] = {}
    for times in workers.values():
        on_workers.update(times)
    by_start = sorted((min(times.values()), key) for key, times in scheduler.items())
    samples: dict[str, list[float]] = {hop: [] for hop in (*HOPS, "total")}
    index = 0
    for start, end in windows:
        while index < len(by_start) and by_start[index][0] < start:
            index += 1
        if index >= len(by_start) or by_start[index][0] > end:
            continue
        key = by_start[index][1]
        s, w, report = scheduler[key], on_workers.get(key, {}), reports.get(key)
        if not ("processing" in s and "memory" in s and "executing" in w and "memory" in w
                and report):
            continue
        points = [start, min(s.values()), s["processing"], w["executing"], w["memory"],
                  s["memory"], report, end]
        path = HOPS[:7]
        if report > end:  # the value came by the worker's reply, before the report
            points, path = points[:5] + [end], HOPS[:4] + ("worker→driver",)
        for hop, (a, b) in zip(path, zip(points, points[1:])):
            samples[hop].append((b - a) * 1e6)
        samples["total"].append((end - start) * 1e6)
    return {hop: statistics.median(values) if values else float("nan")
            for hop, values in samples.items()} | {"calls": len(samples["total"])}


def on_one_machine(calls: int) -> dict:
    import dask
    import distributed

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     resources={"CPU": 1}, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        return measure(client, calls)


def on_hosts(count: int, delay_ms: float, calls: int) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests import hosts as simulated

    why = simulated.skip_reason()
    if why:
        print(f"cluster hops across simulated hosts not measured: {why}")
        raise SystemExit(0)
    names = tuple("abcdefgh"[:count])
    built = simulated.SimulatedHosts(names, delay_ms=delay_ms).start()
    env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="0")
    try:
        address = built.start_dask(threads=1, env=env)
        child = built.run("a", [sys.executable, os.path.abspath(__file__), "--address",
                                address, "--workers", str(count - 1), "--calls", str(calls)],
                          env=env, timeout=600)
        if child.returncode != 0:
            raise SystemExit(child.stdout + child.stderr)
        return json.loads(child.stdout.strip().splitlines()[-1])
    finally:
        built.stop()


def at_address(address: str, workers: int, calls: int) -> dict:
    import distributed

    with distributed.Client(address) as client:
        client.wait_for_workers(workers, timeout=60)
        return measure(client, calls)


def table(results: dict) -> str:
    ways = list(results)
    lines = [f"{'hop (median µs)':<20}" + "".join(f"{way:>27}" for way in ways)]
    for hop in (*HOPS, "total"):
        lines.append(f"{hop:<20}" + "".join(f"{results[way][hop]:>27.0f}" for way in ways))
    lines.append(f"{'calls matched':<20}" + "".join(f"{results[way]['calls']:>27}" for way in ways))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--hosts", type=int, default=0, help="simulated hosts (root; 3: A+2)")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--address", help=argparse.SUPPRESS)  # the child on host A
    parser.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the figures there")
    args = parser.parse_args()
    if args.address:
        print(json.dumps(at_address(args.address, args.workers, args.calls)))
        return
    if args.hosts:
        results = on_hosts(args.hosts, args.delay_ms, args.calls)
        where = f"{args.hosts} simulated hosts, links of {args.delay_ms:g} ms"
    else:
        results = on_one_machine(args.calls)
        where = "one machine, LocalCluster of 2 worker processes"
    import platform

    print(f"{where}; {platform.processor() or platform.machine()}, "
          f"load {os.getloadavg()[0]:.1f}")
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"where": where, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
