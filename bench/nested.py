"""Nested calls: tasks that block in ``get`` on tasks they submit, on lightwork and Ray.

Usage (from the repository root)::

    python bench/nested.py [--callers 1000] [--fib 15] [--peers lightwork ray]

Two programs, each in a fresh process per runtime:

* ``chain``: ``--callers`` tasks ``f`` on one CPU, each ``get``-ing a ``g`` that
  ``get``-s an ``h`` (Ray's ``test_fair_queueing``). A caller that blocks lends its CPU;
  whether the next caller or the task it waits for gets it decides how many workers
  the run needs.
* ``fib``: ``fib(n)`` on two CPUs, each call ``get``-ing ``fib(n - 1)`` and ``fib(n - 2)``.

Reported for each: seconds from submission to the last result, and how many distinct
worker processes ran a task (each task returns the pids under it). Figures go to stdout
and to ``bench/nested_results.json``, with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent("""
    import json, os, sys, time
    runtime, program, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if runtime == "lightwork":
        import lightwork as ray
    else:
        import ray
    ray.init(num_cpus=1 if program == "chain" else 2, include_dashboard=False)

    @ray.remote
    def h():
        return {os.getpid()}

    @ray.remote
    def g():
        return ray.get(h.remote()) | {os.getpid()}

    @ray.remote
    def f():
        return ray.get(g.remote()) | {os.getpid()}

    @ray.remote
    def fib(n):
        if n < 2:
            return n, {os.getpid()}
        (a, pa), (b, pb) = ray.get([fib.remote(n - 1), fib.remote(n - 2)])
        return a + b, pa | pb | {os.getpid()}

    ray.get(h.remote())  # a warm worker for both
    start = time.perf_counter()
    if program == "chain":
        pids = set().union(*ray.get([f.remote() for _ in range(size)], timeout=600))
    else:
        value, pids = ray.get(fib.remote(size), timeout=600)
    elapsed = time.perf_counter() - start
    ray.shutdown()
    print(json.dumps({"seconds": elapsed, "workers": len(pids)}))
""")


def run(runtime: str, program: str, size: int) -> dict[str, float] | str:
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(repo / "src"), "RAY_DEDUP_LOGS": "0"}
    try:
        done = subprocess.run([sys.executable, "-c", PROGRAM, runtime, program, str(size)],
                              capture_output=True, text=True, timeout=900, env=env, check=False)
    except subprocess.TimeoutExpired:
        return "over 900 s"
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=1000)
    parser.add_argument("--fib", type=int, default=15)
    parser.add_argument("--peers", nargs="+", default=["lightwork", "ray"])
    parser.add_argument("--json", default=str(Path(__file__).with_name("nested_results.json")))
    args = parser.parse_args()
    results: dict[str, dict[str, object]] = {}
    for program, size in (("chain", args.callers), ("fib", args.fib)):
        for runtime in args.peers:
            outcome = run(runtime, program, size)
            results.setdefault(program, {})[runtime] = outcome
            shown = (f"{outcome['seconds']:.2f} s, {outcome['workers']} workers"
                     if isinstance(outcome, dict) else outcome)
            print(f"{program} ({size}) on {runtime}: {shown}", flush=True)
    report = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                          "load": os.getloadavg()[0]},
              "callers": args.callers, "fib": args.fib, "results": results}
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
