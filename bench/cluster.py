"""lightwork on a Dask distributed cluster vs plain distributed vs Ray.

Usage (from the repository root)::

    python bench/cluster.py [--tasks 10000] [--sync 300] [--json bench/cluster-results.json]
    python bench/cluster.py --hosts 3 [--delay-ms 1]     # simulated hosts (root)

With ``--hosts``, the three peers run on simulated hosts (``tests/hosts.py``): the
scheduler, or Ray's head with no CPUs, and the driver on host A; a worker (a Ray node)
of 2 CPUs on each other host; links of ``--delay-ms`` each way. It reports per task of
a batch, a sync call, and one task given a 160 MB array by value (plain distributed also
with the array scattered to a worker first, its best path for a large argument).

One ``LocalCluster`` of 4 single-thread worker processes (each declaring ``CPU=1``) serves
both distributed columns, so they compare like with like:

* ``plain``: ``Client.submit(noop, pure=False)`` then ``Client.gather``;
* ``lightwork``: ``init(address=client)`` then ``noop.remote()`` and ``get``.

Ray, when importable, runs in a subprocess with ``num_cpus=4``. Figures (lower is
better): ``per_task_us`` (10,000 no-op tasks submitted then fetched at once, per task)
and ``sync_us`` (one task submitted and fetched, median). Targets: lightwork within 1.25×
of plain distributed on both, and the diagnostics' cost (lightwork with its event log on,
the default, vs ``init(event_budget=0)``, rounds interleaved) at most 5%. Each figure is the best of ``--repeat`` runs (the machine is
shared; the best run is the one least disturbed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any, Callable


def noop() -> None:
    return None


def _noop_graph(n: int) -> tuple[dict[str, Any], list[str]]:
    """``n`` no-op tasks as one Dask graph, and its keys (fresh names each time)."""
    import uuid

    prefix = f"noop-{uuid.uuid4().hex}"
    graph = {f"{prefix}-{i}": (noop,) for i in range(n)}
    return graph, list(graph)


def best_of(repeat: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeat))


def per_task(submit_all: Callable[[int], Any], tasks: int) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        submit_all(tasks)
        return (time.perf_counter() - start) / tasks * 1e6
    return run


def sync(one: Callable[[], Any], calls: int) -> Callable[[], float]:
    def run() -> float:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            one()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6
    return run


def measure_distributed(tasks: int, calls: int, repeat: int) -> dict[str, dict[str, float]]:
    import distributed

    import lightwork

    import dask

    # As the README's cluster and init(address="local-cluster") run it: each lost worker
    # counts once against a task's max_retries (else init warns). No worker is lost here,
    # so plain distributed's figures are the same either way.
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            distributed.LocalCluster(n_workers=4, threads_per_worker=1, processes=True,
                                     resources={"CPU": 1}, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        client.gather([client.submit(noop, pure=False) for _ in range(200)])  # warm up
        plain = {
            "per_task_us": best_of(repeat, per_task(
                lambda n: client.gather([client.submit(noop, pure=False) for _ in range(n)]),
                tasks)),
            "sync_us": best_of(repeat, sync(lambda: client.submit(noop, pure=False).result(),
                                            calls)),
        }
        # What one submission per batch would give (every task in one update-graph
        # message, as ``Client.get`` sends a graph) against one per task above.
        one_graph = {"per_task_us": best_of(repeat, per_task(
            lambda n: client.gather(client.get(*_noop_graph(n), sync=False)), tasks))}
        from lightwork.engines.distributed import replies

        from lightwork.engines.distributed import backend

        remote_noop = lightwork.remote(noop)
        push_max, interval = replies.PUSH_MAX, backend.CLIENT_STREAM_INTERVAL_S
        # (event budget, replies' size limit, client stream interval): the event log
        # off and on, and "before" (no replies to the driver, distributed's 10 ms
        # client stream), interleaved.
        measured: dict[tuple[int, int, float], list[dict[str, float]]] = {
            (0, push_max, interval): [], (200_000, push_max, interval): [],
            (200_000, 0, 0.01): []}
        for _ in range(repeat):
            for (budget, push, stream_interval), runs in measured.items():
                replies.PUSH_MAX, backend.CLIENT_STREAM_INTERVAL_S = push, stream_interval
                client.scheduler_comm.interval = 0.01  # (distributed's; init lowers it)
                lightwork.init(address=client, event_budget=budget)
                lightwork.get([remote_noop.remote() for _ in range(200)])
                runs.append({
                    "per_task_us": per_task(lambda n: lightwork.get(
                        [remote_noop.remote() for _ in range(n)]), tasks)(),
                    "sync_us": sync(lambda: lightwork.get(remote_noop.remote()), calls)(),
                })
                lightwork.shutdown()
        replies.PUSH_MAX, backend.CLIENT_STREAM_INTERVAL_S = push_max, interval
        lw, off, before = ({figure: min(run[figure] for run in measured[variant])
                            for figure in ("per_task_us", "sync_us")}
                           for variant in ((200_000, push_max, interval),
                                           (0, push_max, interval), (200_000, 0, 0.01)))
    return {"plain distributed": plain, "plain distributed, one graph": one_graph,
            "lightwork on distributed": lw,
            "lightwork on distributed, event log off": off,
            "lightwork, before": before}


# The timing helpers of the child programs (the same as this module's own).
CHILD_HELPERS = """
def best_of(repeat, run):
    return min(run() for _ in range(repeat))
def per_task(submit_all, tasks):
    def run():
        start = time.perf_counter()
        submit_all(tasks)
        return (time.perf_counter() - start) / tasks * 1e6
    return run
def sync(one, calls):
    def run():
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            one()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6
    return run
"""

RAY_CHILD = """
import json, statistics, time
import ray
def noop():
    return None
{helpers}ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
f = ray.remote(noop)
ray.get([f.remote() for _ in range(200)])
print(json.dumps({{
    "per_task_us": best_of({repeat}, per_task(lambda n: ray.get([f.remote() for _ in range(n)]), {tasks})),
    "sync_us": best_of({repeat}, sync(lambda: ray.get(f.remote()), {calls})),
}}))
ray.shutdown()
"""


def measure_ray(tasks: int, calls: int, repeat: int) -> dict[str, float] | None:
    code = RAY_CHILD.format(helpers=CHILD_HELPERS, repeat=repeat, tasks=tasks, calls=calls)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=600, check=False)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        print(f"Ray not measured: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


HOSTS_CHILD = """
import json, statistics, sys, time
import numpy as np
def noop():
    return None
def nbytes(array):
    return array.nbytes
{helpers}def by_value(one):
    array = np.ones(20 << 20)  # 160 MB
    def run():
        start = time.perf_counter()
        assert one(array) == array.nbytes
        return time.perf_counter() - start
    return run
{setup}
out = {{}}
def keep(row, figure, value):
    row[figure] = min(row.get(figure, value), value)
for _ in range({repeat}):  # the ways in turn, each round: pairs taken under one load
    for name, (many, one, big, enter) in ways.items():
        if enter is not None:
            enter()
        row = out.setdefault(name, {{}})
        if big is not None:
            keep(row, "by_value_160mb_s", by_value(big)())
        if many is not None:  # (None: a way measured for the large value alone)
            many(200)
            keep(row, "per_task_us", per_task(many, {tasks})())
            keep(row, "sync_us", sync(one, {calls})())
print(json.dumps(out))
"""

DASK_SETUP = """
import distributed, lightwork
from lightwork.engines.distributed import backend, replies
client = distributed.Client({address!r})
client.wait_for_workers({workers}, timeout=60)
remote_noop, remote_nbytes = lightwork.remote(noop), lightwork.remote(nbytes)
push_max, interval = replies.PUSH_MAX, backend.CLIENT_STREAM_INTERVAL_S
def noop_graph(n):
    import uuid
    prefix = "noop-" + uuid.uuid4().hex
    graph = {{prefix + "-" + str(i): (noop,) for i in range(n)}}
    return graph, list(graph)
def session(push, stream_interval):
    def enter():
        if lightwork.is_initialized():
            lightwork.shutdown()
        replies.PUSH_MAX, backend.CLIENT_STREAM_INTERVAL_S = push, stream_interval
        client.scheduler_comm.interval = 0.01  # (distributed's; init lowers it)
        lightwork.init(address=client)
    return enter
lightwork_way = (
    lambda n: lightwork.get([remote_noop.remote() for _ in range(n)]),
    lambda: lightwork.get(remote_noop.remote()),
    lambda array: lightwork.get(remote_nbytes.remote(array)))
ways = {{
    "plain distributed": (
        lambda n: client.gather([client.submit(noop, pure=False) for _ in range(n)]),
        lambda: client.submit(noop, pure=False).result(),
        lambda array: client.submit(nbytes, array, pure=False).result(), None),
    "plain distributed, one graph": (
        lambda n: client.gather(client.get(*noop_graph(n), sync=False)),
        lambda: client.gather(client.get(*noop_graph(1), sync=False)), None, None),
    "plain distributed, scattered": (None, None, lambda array: client.submit(
        nbytes, client.scatter(array, direct=True), pure=False).result(), None),
    "lightwork on distributed": (*lightwork_way, session(push_max, interval)),
    # before: no replies to the driver, distributed's 10 ms client stream
    "lightwork, before": (*lightwork_way, session(0, 0.01)),
}}
"""

RAY_SETUP = """
import ray
ray.init(address="auto", logging_level="ERROR")
deadline = time.time() + 120
while len([n for n in ray.nodes() if n["Alive"]]) < {nodes}:
    if time.time() > deadline:
        sys.exit(f"only {{len([n for n in ray.nodes() if n['Alive']])}} of {nodes} Ray nodes joined")
    time.sleep(0.2)
f, g = ray.remote(noop), ray.remote(nbytes)
ways = {{"ray": (lambda n: ray.get([f.remote() for _ in range(n)]),
                 lambda: ray.get(f.remote()),
                 lambda array: ray.get(g.remote(array)), None)}}
"""


def measure_on_hosts(count: int, delay_ms: float, tasks: int, calls: int, repeat: int,
                     with_ray: bool, program: str = HOSTS_CHILD) -> dict[str, dict[str, Any]]:
    """The same programs on simulated hosts (``tests/hosts.py``): the scheduler (or Ray's
    head, with no CPUs) and the driver on host A, a worker of 2 CPUs on each other.

    ``program`` is the driver's code, run once for distributed and once for Ray: a
    template with ``{setup}`` (which defines ``ways``, each ``(many, one, big, enter)``),
    ``{helpers}``, ``{repeat}``, ``{tasks}`` and ``{calls}``; its last line of output is
    its figures as JSON."""
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests import hosts as simulated

    why = simulated.skip_reason()
    if why:
        print(f"cluster figures across simulated hosts not measured: {why}")
        return {}
    names = tuple("abcdefgh"[:count])
    bin_dir = os.path.dirname(sys.executable)
    import secrets

    # Ray's token authentication is on by default for a new cluster; the token it would
    # make lives on the head's host alone (its own /tmp), so the nodes and the driver on
    # other hosts are given one token in their environment instead. The hosts' child
    # processes run elsewhere than here: a relative PYTHONPATH is made absolute.
    env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="0",
               RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN=secrets.token_hex(32))
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    results: dict[str, dict[str, Any]] = {}

    def child(built: Any, setup: str) -> None:
        code = program.format(helpers=CHILD_HELPERS, setup=setup, repeat=repeat,
                                  tasks=tasks, calls=calls)
        done = built.run("a", [sys.executable, "-c", code], env=env, timeout=1800)
        if done.returncode != 0:
            print(f"not measured: {done.stderr.strip().splitlines()[-3:]}", file=sys.stderr)
            return
        results.update(json.loads(done.stdout.strip().splitlines()[-1]))

    built = simulated.SimulatedHosts(names, delay_ms=delay_ms).start()
    try:
        address = built.start_dask(threads=2, env=env)
        child(built, DASK_SETUP.format(address=address, workers=count - 1))
    finally:
        built.stop()
    if not with_ray:
        return results
    built = simulated.SimulatedHosts(names, delay_ms=delay_ms).start()
    try:
        head = built.address("a")
        ray_bin = f"{bin_dir}/ray"
        started = built.run("a", [ray_bin, "start", "--head", "--node-ip-address", head,
                                  "--port", "6379", "--num-cpus", "0",
                                  "--include-dashboard", "false"], env=env, timeout=180)
        if started.returncode != 0:
            print(f"Ray not measured: {started.stderr.strip()[-300:]}", file=sys.stderr)
            return results
        try:
            for name in names[1:]:
                joined = built.run(name, [ray_bin, "start", "--address", f"{head}:6379",
                                          "--node-ip-address", built.address(name),
                                          "--num-cpus", "2"], env=env, timeout=180)
                if joined.returncode != 0:
                    print(f"Ray not measured: node {name}: {joined.stderr.strip()[-300:]}",
                          file=sys.stderr)
                    return results
            child(built, RAY_SETUP.format(nodes=count))
        finally:  # (ray start leaves daemons: stopped even when the run failed)
            for name in names:
                built.run(name, [ray_bin, "stop", "--force"], env=env, timeout=120)
    finally:
        built.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--sync", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--json", default="")
    parser.add_argument("--hosts", type=int, default=0,
                        help="run on this many simulated hosts instead (root; see tests/hosts.py)")
    parser.add_argument("--delay-ms", type=float, default=1.0,
                        help="with --hosts: each link's one-way delay")
    args = parser.parse_args(argv)
    if args.hosts:
        return hosts_main(args)
    results = measure_distributed(args.tasks, args.sync, args.repeat)
    if not args.no_ray:
        ray_figures = measure_ray(args.tasks, args.sync, args.repeat)
        if ray_figures is not None:
            results["ray (embedded, 4 CPUs)"] = ray_figures
    plain = results["plain distributed"]
    lw = results["lightwork on distributed"]
    print(f"{'runtime':28} {'per task (us)':>14} {'sync (us)':>10}")
    for name, figures in results.items():
        print(f"{name:28} {figures['per_task_us']:14.1f} {figures.get('sync_us', float('nan')):10.1f}")
    for figure in ("per_task_us", "sync_us"):
        ratio = lw[figure] / plain[figure]
        verdict = "meets" if ratio <= 1.25 else "MISSES"
        print(f"lightwork / plain distributed, {figure}: {ratio:.2f}x ({verdict} the 1.25x target)")
    off = results["lightwork on distributed, event log off"]
    for figure in ("per_task_us", "sync_us"):
        cost = lw[figure] / off[figure] - 1
        verdict = "meets" if cost <= 0.05 else "MISSES"
        print(f"diagnostics cost (event log on vs off), {figure}: {cost:+.1%} ({verdict} the "
              "5% target)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def hosts_main(args: argparse.Namespace) -> int:
    import os
    import platform

    results = measure_on_hosts(args.hosts, args.delay_ms, min(args.tasks, 2000),
                               min(args.sync, 100), args.repeat, not args.no_ray)
    if not results:
        return 0
    print(f"{args.hosts} simulated hosts, links of {args.delay_ms:g} ms; "
          f"{platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.1f}")
    figures = ("per_task_us", "sync_us", "by_value_160mb_s")
    print(f"{'runtime':28}" + "".join(f"{f:>18}" for f in figures))
    for name, row in results.items():
        print(f"{name:28}" + "".join(
            f"{row.get(f, float('nan')):18.{2 if f.endswith('_s') else 0}f}" for f in figures))
    lw, ray = results.get("lightwork on distributed"), results.get("ray")
    if lw and ray:
        print("lightwork / ray: " + ", ".join(f"{f} {lw[f] / ray[f]:.2f}x" for f in figures))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hosts": args.hosts, "delay_ms": args.delay_ms, "results": results},
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
