"""A deep queue: a million no-op tasks queued at once, then run to completion.

(Not ``queue.py``: ``bench/`` is on the peers' ``PYTHONPATH``, and a ``queue`` module there
hides the standard library's from Ray's imports.)

Usage (from the repository root)::

    python bench/deep_queue.py [--tasks 1000000] [--blocks 10]

Every worker slot is first taken by a task that waits for a gate file, so the no-op tasks
all stay queued while they are submitted. Reported:

* ``submit_us_per_task`` for each block of ``tasks/blocks`` submissions, in order: flat
  means submission does not slow down as the queue grows;
* ``driver_bytes_per_queued_task``: the driver's resident memory after the submissions
  minus before, over the number of tasks (the user's list of ObjectRefs included);
  the target is at most 1 KB;
* ``drain_s``: from opening the gate until every result is ready.

Figures go to stdout and to ``bench/queue_results.json``. lightwork only: the peers'
queues are not the question here (Ray's driver needs several KB per queued task).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

TARGET_BYTES_PER_TASK = 1024


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--cpus", type=int, default=2)
    options = parser.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    import lightwork

    lightwork.init(num_cpus=options.cpus, advisor=False)

    @lightwork.remote
    def noop() -> None:
        return None

    @lightwork.remote
    def hold(path: str) -> None:
        while not os.path.exists(path):
            time.sleep(0.01)

    gate = os.path.join(tempfile.mkdtemp(prefix="lightwork-queue-"), "gate")
    holders = [hold.remote(gate) for _ in range(options.cpus)]
    lightwork.get(noop.options(num_cpus=0).remote())  # the runtime is up
    time.sleep(0.5)  # the holders have taken their slots
    gc.collect()
    before = resident_bytes()
    per_block = options.tasks // options.blocks
    refs: list = []
    submit_us = []
    started = time.perf_counter()
    for _ in range(options.blocks):
        block_start = time.perf_counter()
        refs.extend([noop.remote() for _ in range(per_block)])
        submit_us.append((time.perf_counter() - block_start) / per_block * 1e6)
    submitted = time.perf_counter() - started
    gc.collect()
    per_task = (resident_bytes() - before) / len(refs)
    open(gate, "w").close()
    drain_start = time.perf_counter()
    for start in range(0, len(refs), 100_000):
        chunk = refs[start:start + 100_000]
        ready, _ = lightwork.wait(chunk, num_returns=len(chunk), timeout=None)
        assert len(ready) == len(chunk)
    assert all(value is None for value in lightwork.get(refs[-1000:]))
    drain_s = time.perf_counter() - drain_start
    lightwork.get(holders)
    del refs
    lightwork.shutdown()

    report = {
        "tasks": options.tasks,
        "cpus": options.cpus,
        "submit_s": round(submitted, 2),
        "submit_us_per_task": [round(us, 1) for us in submit_us],
        "driver_bytes_per_queued_task": round(per_task),
        "target_bytes_per_queued_task": TARGET_BYTES_PER_TASK,
        "drain_s": round(drain_s, 2),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    verdict = "meets" if per_task <= TARGET_BYTES_PER_TASK else "MISSES"
    print(f"{options.tasks:,} queued no-op tasks on {options.cpus} CPUs")
    print(f"  submission: {submitted:.2f} s; µs per task by block of {per_block:,}: "
          + ", ".join(f"{us:.1f}" for us in submit_us))
    print(f"  driver memory per queued task: {per_task:.0f} bytes ({verdict} the "
          f"{TARGET_BYTES_PER_TASK}-byte target)")
    print(f"  drained in {drain_s:.2f} s ({drain_s / options.tasks * 1e6:.1f} µs per task)")
    out = Path(__file__).resolve().parent / "queue_results.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
