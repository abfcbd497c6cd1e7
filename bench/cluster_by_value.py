"""One task given a large numpy array by value, on one machine: lightwork on distributed
against plain distributed's two ways, in one process.

Usage (from the repository root)::

    python bench/cluster_by_value.py [--mb 160] [--repeat 3]

A ``LocalCluster`` of 2 single-thread worker processes serves all three:

* ``plain``: ``client.submit(f, array)``: the array travels in the graph, through the
  scheduler;
* ``plain scattered``: ``client.submit(f, client.scatter(array, direct=True))``: the
  array goes to a worker first, then the task runs there (distributed's best path);
* ``lightwork``: ``get(f.remote(array))``.

Each figure is the best of ``--repeat`` rounds, the ways interleaved within a round: the
wall time and the driver's CPU time of the call (which the machine's load moves less).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable


def nbytes(array: Any) -> int:
    return array.nbytes


def timed(call: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=160)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import dask
    import distributed
    import numpy as np

    import lightwork

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        lightwork.init(address=client)
        remote_nbytes = lightwork.remote(nbytes)
        array = np.ones((args.mb << 20) // 8)  # 160: np.ones(20 << 20), as bench/cluster.py
        ways = {
            "plain": lambda: client.submit(nbytes, array, pure=False).result(),
            "plain scattered": lambda: client.submit(
                nbytes, client.scatter(array, direct=True), pure=False).result(),
            "lightwork": lambda: lightwork.get(remote_nbytes.remote(array)),
        }
        runs: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
        for _ in range(args.repeat):
            for way, call in ways.items():
                runs[way].append(timed(call))
        lightwork.shutdown()
    import os
    import platform

    print(f"{args.mb} MB by value, one machine; {platform.processor() or platform.machine()}, "
          f"load {os.getloadavg()[0]:.1f}")
    best = {way: {"wall_s": min(w for w, _ in rows), "driver_cpu_s": min(c for _, c in rows)}
            for way, rows in runs.items()}
    for way, figures in best.items():
        print(f"{way:18} wall {figures['wall_s']:7.3f} s   driver CPU {figures['driver_cpu_s']:6.3f} s")
    print("lightwork / plain scattered, wall: "
          f"{best['lightwork']['wall_s'] / best['plain scattered']['wall_s']:.2f}x")
    print(json.dumps(best))


if __name__ == "__main__":
    main()
