"""Where a batch's CPU goes on simulated hosts: lightwork, plain distributed and Ray.

Usage (from the repository root, as root)::

    python bench/cluster_cpu.py [--tasks 1000] [--repeat 3] [--delay-ms 1] [--no-ray]

The hosts and the programs are ``bench/cluster.py --hosts 3``'s: the scheduler (Ray's
head, with no CPUs) and the driver on host A, a worker (a Ray node) of 2 CPUs on each
of B and C, joined by the delaying wire. Around each batch of no-op tasks the driver
reads the CPU time of every process on the machine, and reports it per task by role:

* ``driver``: the program itself;
* ``scheduler``: the ``dask scheduler`` (for Ray: ``gcs``, its control store, and
  ``raylet``, the per-node schedulers, every node's together);
* ``workers``: the processes that run the tasks (the Dask workers and their nannies;
  Ray's ``ray::`` workers);
* ``wire``: the process that carries every packet between the hosts (``tests/wire.py``),
  so its time counts the packets each runtime sends;
* ``other``: everything else (Ray's monitors and agents, the shell, the kernel's own
  threads are not in it: ``machine`` is the whole machine's busy time from
  ``/proc/stat``).

All of them share the machine's cores, so a batch cannot take less wall time per task
than the machine's busy CPU per task divided by the cores: the ``floor`` column. When a
runtime's wall time per task sits at its floor, the CPU its parts spend per task is what
sets its speed here, not the links' delay; which role spends the most says which part.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402  (bench/cluster.py: its hosts, setups and helpers)

CPU_CHILD = """
import json, os, statistics, sys, time
import psutil
def noop():
    return None
def nbytes(array):
    return array.nbytes
{helpers}{setup}
ME = os.getpid()
def role(process):
    try:
        chain = [process, *process.parents()]
        lines = [" ".join(p.cmdline()) for p in chain]
    except psutil.Error:
        return "other"
    if process.pid == ME:
        return "driver"
    first = lines[0]
    if first.startswith("ray::") or "default_worker.py" in first:
        return "workers"
    for line in lines:
        if "wire.py" in line:
            return "wire"
        if "dask scheduler" in line or "dask-scheduler" in line:
            return "scheduler"
        if "dask worker" in line or "dask-worker" in line:
            return "workers"
        if "gcs_server" in line or "raylet" in line:
            return "scheduler"
    return "other"
def snapshot():
    seen = {{}}
    for process in psutil.process_iter():
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        seen[process.pid] = (process, times.user + times.system)
    machine = psutil.cpu_times()
    busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
    return seen, busy
def spent(before, after, tasks):
    (old, busy0), (new, busy1) = before, after
    row = {{"driver": 0.0, "scheduler": 0.0, "workers": 0.0, "wire": 0.0, "other": 0.0}}
    for pid, (process, cpu) in new.items():
        start = old[pid][1] if pid in old else 0.0
        row[role(process)] += (cpu - start) / tasks * 1e6
    row["machine"] = (busy1 - busy0) / tasks * 1e6
    row["floor"] = row["machine"] / psutil.cpu_count()
    return row
out = {{}}
for _ in range({repeat}):  # the ways in turn, each round
    for name, (many, one, big, enter) in ways.items():
        if many is None:
            continue
        if enter is not None:
            enter()
        many(200)
        before = snapshot()
        start = time.perf_counter()
        many({tasks})
        wall = (time.perf_counter() - start) / {tasks} * 1e6
        row = spent(before, snapshot(), {tasks})
        row["wall"] = wall
        if name not in out or wall < out[name]["wall"]:
            out[name] = row
print(json.dumps(out))
"""

COLUMNS = ("wall", "floor", "machine", "driver", "scheduler", "workers", "wire", "other")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=1.0)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args(argv)
    results = cluster.measure_on_hosts(args.hosts, args.delay_ms, args.tasks, 1,
                                       args.repeat, not args.no_ray, program=CPU_CHILD)
    if not results:
        return 0
    print(f"{args.hosts} simulated hosts, links of {args.delay_ms:g} ms, {args.tasks} no-op "
          f"tasks a batch, best of {args.repeat} by wall time; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    print("µs per task (CPU time of each role, the machine's busy time, and that over the "
          "cores: the floor)")
    print(f"{'runtime':30}" + "".join(f"{c:>10}" for c in COLUMNS))
    for name, row in results.items():
        print(f"{name:30}" + "".join(f"{row[c]:10.0f}" for c in COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
