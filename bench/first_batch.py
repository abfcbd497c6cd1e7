"""The first batch of a program that imports a library, against its second batch.

    python bench/first_batch.py [pairs] [--only WORKLOAD] [--src DIR]

Each run is a fresh driver process (this checkout's ``src``, or ``--src DIR``): it
imports the library, calls ``init(num_cpus=2)``, makes its data, then times two batches
of 8 tasks that use the library (``pandas``: a group-by of a 20,000-row frame;
``sklearn``: fitting a logistic regression on 400 rows; ``pandas-after-sklearn``: the
pandas batch in a driver that also imported scikit-learn; ``pandas-after-setup``: the
pandas batch 2 s after ``init``), and the whole from just before
``init`` to the first batch's end. The first batch's workers are fresh; the second's have
run a task. The runs alternate the fork server's preload on and off
(``LIGHTWORK_PRELOAD=0``), so each pair is measured under the same load; the medians and
the per-pair differences are printed, with the machine and its load.

Needs pandas and scikit-learn (the ``bench`` extra).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

# Each driver: its imports, init, its remote function and data, then the two batches.
DRIVER = r"""
import sys, time, json
sys.path.insert(0, sys.argv[1])
import numpy as np
{imports}
import lightwork as ray

began = time.perf_counter()
ray.init(num_cpus=2)

{work}
times = []
for batch in range(2):
    start = time.perf_counter()
    ray.get([{call} for _ in range(8)])
    times.append(time.perf_counter() - start)
    if batch == 0:
        first_result = time.perf_counter() - began  # init, the data, the first batch
print(json.dumps(times + [first_result]))
"""

PANDAS_WORK = """
@ray.remote
def summarize(frame):
    return float(frame.groupby("key")["value"].mean().sum())

{setup}frame = pd.DataFrame({{"key": np.arange(20_000) % 13, "value": np.arange(20_000.0)}})
"""
SKLEARN_WORK = """
@ray.remote
def fit(x, y):
    return float(LogisticRegression(max_iter=200).fit(x, y).score(x, y))

rng = np.random.default_rng(0)
x = rng.normal(size=(400, 8))
y = (x[:, 0] + rng.normal(size=400) > 0).astype(int)
"""
SKLEARN_IMPORT = "from sklearn.linear_model import LogisticRegression"


def _pandas(imports: str = "", setup: str = "") -> str:
    return DRIVER.format(imports="import pandas as pd\n" + imports,
                         work=PANDAS_WORK.format(setup=setup),
                         call="summarize.remote(frame)")


DRIVERS = {
    "pandas": _pandas(),
    "sklearn": DRIVER.format(imports=SKLEARN_IMPORT, work=SKLEARN_WORK,
                             call="fit.remote(x, y)"),
    # A driver that imported more than its tasks use: the pandas batch, after
    # scikit-learn (and with it scipy) was imported for something else.
    "pandas-after-sklearn": _pandas(imports=SKLEARN_IMPORT),
    # A driver that spends 2 s on its own (loading its data) between init and the
    # first batch: what the fork server can do meanwhile is free.
    "pandas-after-setup": _pandas(
        setup="time.sleep(2.0)  # the driver's own start: reading files, say\n"),
}


def run(workload: str, preload: bool, src: str = SRC) -> list[float]:
    env = dict(os.environ, LIGHTWORK_PRELOAD="1" if preload else "0")
    proc = subprocess.run([sys.executable, "-c", DRIVERS[workload], src], env=env,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"{workload} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{model or 'unknown CPU'}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"


def main() -> None:
    args = sys.argv[1:]
    only = None
    if "--only" in args:
        only = args[args.index("--only") + 1]
        del args[args.index("--only"):args.index("--only") + 2]
    src = SRC
    if "--src" in args:  # another checkout's src, e.g. to compare with main
        src = os.path.abspath(args[args.index("--src") + 1])
        del args[args.index("--src"):args.index("--src") + 2]
    pairs = int(args[0]) if args else 5
    print(f"# {machine()}; {src}")
    for workload in DRIVERS:
        if only and workload != only:
            continue
        results: dict[bool, list[list[float]]] = {True: [], False: []}
        for index in range(pairs):
            order = (False, True) if index % 2 == 0 else (True, False)
            for preload in order:
                results[preload].append(run(workload, preload, src))
        for preload in (False, True):
            first = statistics.median(r[0] for r in results[preload])
            second = statistics.median(r[1] for r in results[preload])
            whole = statistics.median(r[2] for r in results[preload])
            print(f"{workload:8s} preload={'on ' if preload else 'off'}  first batch "
                  f"{first:6.3f} s   second batch {second:6.3f} s   init to the first "
                  f"batch's end {whole:6.3f} s   ({pairs} runs, medians)")
        saved = [off[0] - on[0] for off, on in zip(results[False], results[True])]
        print(f"{workload:8s} first batch, off - on, per pair: "
              + " ".join(f"{d:+.3f}" for d in saved)
              + f"   median {statistics.median(saved):+.3f} s")
    print(f"# after: load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
