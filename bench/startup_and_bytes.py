"""Two figures of issue 12, outside the peer harness (lightwork alone, this checkout).

    python bench/startup_and_bytes.py first-batch [runs]   # README example, fresh process each
    python bench/startup_and_bytes.py bytes                # large bytes vs arrays as results

``first-batch``: in a fresh process, ``init(num_cpus=4)``, then the README's example twice
(8 tasks of 0.1 s): time from just before ``init`` to the first result of a one-task
probe (``init_to_first_result_s``, target 0.3 s), and the first and second batch. Medians.

``bytes``: a task returns ``b"x" * n`` or a uint8 array of n bytes, n = 256 MiB, 512 MiB,
1 GiB; seconds from submit until the object is stored (``wait``), then for ``get``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

FIRST_BATCH = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import lightwork as ray
mode = sys.argv[2]
start = time.perf_counter()
ray.init(num_cpus=4)
inited = time.perf_counter()

@ray.remote
def square(x):
    time.sleep(0.1)
    return x * x

@ray.remote
def one():
    return 1

if mode == "probe":
    ray.get(one.remote())
    print(inited - start, time.perf_counter() - start)
else:
    ray.get([square.remote(i) for i in range(8)])
    first = time.perf_counter()
    ray.get([square.remote(i) for i in range(8)])
    print(first - inited, time.perf_counter() - first)
"""


def first_batch(runs: int) -> None:
    probes, batches = [], []
    for _ in range(runs):
        for mode, into in (("probe", probes), ("batch", batches)):
            out = subprocess.run([sys.executable, "-c", FIRST_BATCH, SRC, mode],
                                 capture_output=True, text=True, check=True)
            into.append([float(x) for x in out.stdout.split()])
    median = lambda rows, i: statistics.median(row[i] for row in rows)
    print(f"init_s {median(probes, 0):.3f}  init_to_first_result_s {median(probes, 1):.3f}  "
          f"first_batch_s {median(batches, 0):.3f}  second_batch_s {median(batches, 1):.3f}  "
          f"(median of {runs}; load average {os.getloadavg()[0]:.1f})")


def large_bytes() -> None:
    import numpy as np

    sys.path.insert(0, SRC)
    import lightwork as ray

    ray.init(num_cpus=2)

    @ray.remote
    def make_bytes(n):
        return b"x" * n

    @ray.remote
    def make_array(n):
        return np.ones(n, dtype=np.uint8)

    for label, task in (("bytes", make_bytes), ("array", make_array)):
        for mib in (256, 512, 1024):
            start = time.perf_counter()
            ref = task.remote(mib << 20)
            ray.wait([ref], timeout=300)
            stored = time.perf_counter() - start
            start = time.perf_counter()
            value = ray.get(ref)
            got = time.perf_counter() - start
            del value, ref
            print(f"{label} {mib:5d} MiB: task+store {stored:6.2f} s  get {got:5.2f} s", flush=True)
    print(f"(load average {os.getloadavg()[0]:.1f})")
    ray.shutdown()


if __name__ == "__main__":
    if sys.argv[1:2] == ["bytes"]:
        large_bytes()
    else:
        first_batch(int(sys.argv[2]) if len(sys.argv) > 2 else 5)
