"""The workers' replies to the driver on and off, paired round by round.

Usage (from the repository root)::

    python bench/cluster_replies.py [--rounds 10] [--calls 30] [--tasks 300]
    python bench/cluster_replies.py --hosts 3 [--delay-ms 1]   # simulated hosts (root)

On one cluster (a ``LocalCluster`` of 2 single-thread worker processes, or with
``--hosts`` a scheduler and the driver on host A and a worker of 2 threads on each
other host), each round runs plain distributed (``Client.submit``), lightwork with the
workers' replies (``engines/distributed/replies.py``) and lightwork without them
(``replies.PUSH_MAX = 0``, a fresh ``init`` on the same client), in an order that turns
each round. Each round measures the median sync call (``get(f.remote())``) of
``--calls`` and the per task time of a batch of ``--tasks`` no-op tasks. Reported: the
median over rounds of each figure, and the median of the per-round ratios, which a
shared machine's load moves far less than the figures themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Callable

from cluster import per_task, sync  # (this directory: a script's first path)


def noop() -> None:
    return None


def measure(client: Any, rounds: int, calls: int, tasks: int) -> dict[str, Any]:
    import lightwork
    from lightwork.engines.distributed import replies

    push_max = replies.PUSH_MAX
    remote_noop = lightwork.remote(noop)

    def session(limit: int) -> Callable[[], None]:
        def enter() -> None:
            if lightwork.is_initialized():
                lightwork.shutdown()
            replies.PUSH_MAX = limit
            lightwork.init(address=client)
            lightwork.get([remote_noop.remote() for _ in range(20)])  # warm
        return enter

    lightwork_way = (lambda: lightwork.get(remote_noop.remote()),
                     lambda n: lightwork.get([remote_noop.remote() for _ in range(n)]))
    ways = {
        "plain distributed": (None, lambda: client.submit(noop, pure=False).result(),
                              lambda n: client.gather([client.submit(noop, pure=False)
                                                       for _ in range(n)])),
        "lightwork, replies": (session(push_max), *lightwork_way),
        "lightwork, no replies": (session(0), *lightwork_way),
    }
    names = list(ways)
    figures: dict[str, dict[str, list[float]]] = {
        name: {"sync_us": [], "per_task_us": []} for name in names}
    try:
        for round_ in range(rounds):
            turn = round_ % len(names)
            for name in names[turn:] + names[:turn]:
                enter, one, many = ways[name]
                if enter is not None:
                    enter()
                figures[name]["sync_us"].append(sync(one, calls)())
                figures[name]["per_task_us"].append(per_task(many, tasks)())
    finally:
        if lightwork.is_initialized():
            lightwork.shutdown()
        replies.PUSH_MAX = push_max
    out: dict[str, Any] = {name: {figure: statistics.median(values)
                                  for figure, values in row.items()}
                           for name, row in figures.items()}
    on, off, plain = (figures[n] for n in names[1:] + names[:1])
    out["ratios"] = {
        f"replies / no replies, {figure}": statistics.median(
            a / b for a, b in zip(on[figure], off[figure])) for figure in on}
    out["ratios"].update({
        f"replies / plain, {figure}": statistics.median(
            a / b for a, b in zip(on[figure], plain[figure])) for figure in on})
    return out


def on_one_machine(rounds: int, calls: int, tasks: int) -> dict[str, Any]:
    import dask
    import distributed

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     resources={"CPU": 1}, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        return measure(client, rounds, calls, tasks)


def on_hosts(count: int, delay_ms: float, args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests import hosts as simulated

    why = simulated.skip_reason()
    if why:
        raise SystemExit(f"not measured across simulated hosts: {why}")
    names = tuple("abcdefgh"[:count])
    built = simulated.SimulatedHosts(names, delay_ms=delay_ms).start()
    env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="0")
    try:
        address = built.start_dask(threads=2, env=env)
        child = built.run("a", [sys.executable, os.path.abspath(__file__), "--address",
                                address, "--workers", str(count - 1), "--rounds",
                                str(args.rounds), "--calls", str(args.calls), "--tasks",
                                str(args.tasks)], env=env, timeout=1800)
        if child.returncode != 0:
            raise SystemExit(child.stdout + child.stderr)
        return json.loads(child.stdout.strip().splitlines()[-1])
    finally:
        built.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--hosts", type=int, default=0, help="simulated hosts (root; 3: A+2)")
    parser.add_argument("--delay-ms", type=float, default=1.0)
    parser.add_argument("--address", help=argparse.SUPPRESS)  # the child on host A
    parser.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.address:
        import distributed

        with distributed.Client(args.address) as client:
            client.wait_for_workers(args.workers, timeout=60)
            print(json.dumps(measure(client, args.rounds, args.calls, args.tasks)))
        return
    load = os.getloadavg()[0]
    if args.hosts:
        results = on_hosts(args.hosts, args.delay_ms, args)
        where = f"{args.hosts} simulated hosts, links of {args.delay_ms:g} ms"
    else:
        results = on_one_machine(args.rounds, args.calls, args.tasks)
        where = "one machine, LocalCluster of 2 worker processes"
    import platform

    print(f"{where}; {platform.processor() or platform.machine()}, load "
          f"{load:.1f} -> {os.getloadavg()[0]:.1f}; {args.rounds} rounds")
    ratios = results.pop("ratios")
    print(f"{'way (median µs)':<24}{'sync call':>12}{'per task':>12}")
    for name, row in results.items():
        print(f"{name:<24}{row['sync_us']:>12.0f}{row['per_task_us']:>12.0f}")
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x (median of the rounds' ratios)")


if __name__ == "__main__":
    main()
