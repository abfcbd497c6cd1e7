"""The worker's CPU per task alone, fed by a fake driver (issue 13's worker figures).

Usage (from the repository root)::

    python bench/hotpath_worker.py [--tasks 20000] [--rounds 5] [--base /tmp/base-checkout]

A forked child runs ``worker.Worker.run`` on one end of a socketpair; this process plays
the driver on the other end: it sends a no-op function, then ``--tasks`` TASK frames
either one at a time, each after the previous result (``sync``), or in frames of 100
(``batch``), and reads the results. The child reports the CPU time of its whole process
(every thread) per task, which is all the worker's cost: no runtime, no other worker, no
advisor. With ``--base`` each round also runs the other checkout's worker (A, then this
one, B; the order alternates), as ``hotpath_ab.py`` does for the whole hot path; pass
``--child`` is internal. Printed: per mode, the medians over rounds of µs of CPU per task
and the median of the paired ratios B/A.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
BATCH = 100


def _noop() -> None:
    return None


def child(mode: str, tasks: int) -> None:
    """Run a worker against a fake driver; print its CPU µs per task as JSON."""
    import cloudpickle

    from lightwork.engines.local import protocol as p
    from lightwork.kernel import serialization
    from lightwork.engines.local import worker

    driver_end, worker_end = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        driver_end.close()
        config = {"job_id": 1, "shm_dir": "/dev/shm", "node_id": "bench", "total": {"CPU": 1.0}}
        runner = worker.Worker(worker_end, 1, config)
        cpu_before = time.process_time()
        runner.run()
        cpu = time.process_time() - cpu_before
        runner.conn.send([("cpu", cpu)])
        os._exit(0)
    worker_end.close()
    decoder = p.FrameDecoder()
    buffer = bytearray(1 << 18)
    view = memoryview(buffer)
    pending: list = []

    def receive(count: int) -> list:
        got = []
        while len(got) < count:
            if not pending:
                size = driver_end.recv_into(buffer)
                assert size, "the worker closed its socket"
                pending.extend(decoder.feed(view[:size]))
            got.append(pending.pop(0))
        return got

    key = b"noop-key"
    args = serialization.serialize(((), {}), None)
    ids = iter(range(10, 10 * (tasks + 10), 2))

    def frame() -> tuple:
        task_id = next(ids)
        return (p.TASK, (task_id, key, "noop", args, (), (task_id + 1,), (("CPU", 1.0),), ()))

    driver_end.sendall(p.encode_many([(p.FUNCTION, key, cloudpickle.dumps(_noop))]))
    start = time.perf_counter()
    if mode == "sync":
        for _ in range(tasks):
            driver_end.sendall(p.encode_many([frame()]))
            receive(1)
    else:
        for _ in range(tasks // BATCH):
            driver_end.sendall(p.encode_many([frame() for _ in range(BATCH)]))
            receive(BATCH)
    wall = time.perf_counter() - start
    driver_end.sendall(p.encode_many([(p.EXIT,)]))
    [(_, cpu)] = receive(1)
    os.waitpid(pid, 0)
    print(json.dumps({"cpu_us": cpu / tasks * 1e6, "wall_us": wall / tasks * 1e6}))


def run_side(checkout: Path, mode: str, tasks: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--tasks", str(tasks)],
        check=True, env=env, capture_output=True, text=True, timeout=300,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--base", type=Path, help="another checkout to compare with (A)")
    parser.add_argument("--child", choices=("sync", "batch"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.tasks)
        return
    sides = {"B": BENCH_DIR.parent}
    if args.base is not None:
        sides = {"A": args.base.resolve(), "B": BENCH_DIR.parent}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_index in range(args.rounds):
        order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
        for mode in ("sync", "batch"):
            for side in order:
                results.setdefault((side, mode), []).append(
                    run_side(sides[side], mode, args.tasks))
    print(f"{args.rounds} rounds of {args.tasks} tasks; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for side, checkout in sides.items():
        print(f"{side} = {checkout}")
    for mode in ("sync", "batch"):
        for figure in ("cpu_us", "wall_us"):
            row = f"{mode} {figure}:"
            for side in sides:
                row += f"  {side} {statistics.median(r[figure] for r in results[(side, mode)]):6.2f}"
            if "A" in sides:
                paired = [b[figure] / a[figure] for a, b in
                          zip(results[("A", mode)], results[("B", mode)])]
                row += f"  paired B/A {statistics.median(paired):.2f}"
            print(row)


if __name__ == "__main__":
    main()
