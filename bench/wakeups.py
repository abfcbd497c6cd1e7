"""What a blocked thread costs to wake on this host, and how many wake-ups a call pays.

A synchronous ``get(f.remote())`` is bound by wake-ups, not by work: the driver sends a
frame, the worker wakes, runs, replies, and the driver wakes. The pipe floor
(``floor.py``) pays one wake-up on each side. Where a wake-up is cheap (a few µs), a
few extra ones disappear in the noise; where it is dear (a VM whose idle vCPU must be
woken by the hypervisor, a kernel that does not poll before halting), each extra one
costs as much as the floor itself. This script prints the two numbers that tell the
hosts apart:

* ``thread_wake_us``: two threads of one process passing a byte back and forth over
  two pipes, each blocking in ``read``: half a round trip is one wake-up (and a
  ``write``/``read`` pair). ``process_wake_us``: the same between two processes.
* per synchronous call on lightwork, for every thread of the driver and the worker:
  voluntary context switches (the thread blocked and was woken) and involuntary ones
  (it was preempted), read from ``/proc/<pid>/task/<tid>/status``, with the spinning
  waiter on (the default) and off (``LIGHTWORK_SPIN_US=0``).

A call that blocks k threads costs about k wake-ups; the table shows k for this build.

Run: ``python bench/wakeups.py [--calls N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROUNDS = 2_000


def _ping_pong(read_fd: int, write_fd: int, rounds: int) -> None:
    for _ in range(rounds):
        os.read(read_fd, 1)
        os.write(write_fd, b"x")


def thread_wake_us(rounds: int = ROUNDS) -> float:
    """Median of 5 runs: one wake-up of a thread blocked in ``read``, in µs."""
    runs = []
    for _ in range(5):
        a_read, a_write = os.pipe()
        b_read, b_write = os.pipe()
        echo = threading.Thread(target=_ping_pong, args=(a_read, b_write, rounds))
        echo.start()
        start = time.perf_counter()
        for _ in range(rounds):
            os.write(a_write, b"x")
            os.read(b_read, 1)
        runs.append((time.perf_counter() - start) / rounds / 2 * 1e6)
        echo.join()
        for fd in (a_read, a_write, b_read, b_write):
            os.close(fd)
    return statistics.median(runs)


def process_wake_us(rounds: int = ROUNDS) -> float:
    """As :func:`thread_wake_us`, between two processes (a forked child echoes)."""
    runs = []
    for _ in range(5):
        a_read, a_write = os.pipe()
        b_read, b_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                _ping_pong(a_read, b_write, rounds)
            finally:
                os._exit(0)
        start = time.perf_counter()
        for _ in range(rounds):
            os.write(a_write, b"x")
            os.read(b_read, 1)
        runs.append((time.perf_counter() - start) / rounds / 2 * 1e6)
        os.waitpid(pid, 0)
        for fd in (a_read, a_write, b_read, b_write):
            os.close(fd)
    return statistics.median(runs)


def _switches(pid: int) -> dict[str, tuple[int, int]]:
    """name/tid -> (voluntary, involuntary) context switches of each thread of ``pid``."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            counts = {}
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                        counts[key] = int(value)
        except OSError:
            continue
        found[f"{name}/{tid}"] = (counts["voluntary_ctxt_switches"],
                                  counts["nonvoluntary_ctxt_switches"])
    return found


CHILD = r"""
import json, os, sys, threading, time
sys.path.insert(0, sys.argv[2])
import lightwork
from wakeups import _switches

calls = int(sys.argv[1])
lightwork.init(num_cpus=1, advisor=False)

@lightwork.remote
def noop():
    return None

for _ in range(500):
    lightwork.get(noop.remote())
workers = [w["pid"] for w in lightwork.state.list_workers() if w["kind"] != "driver" and w["pid"]]
names = {t.native_id: t.name for t in threading.enumerate()}
before = {"driver": _switches(os.getpid()), **{f"worker {p}": _switches(p) for p in workers}}
start = time.perf_counter()
for _ in range(calls):
    lightwork.get(noop.remote())
per_call_us = (time.perf_counter() - start) / calls * 1e6
after = {"driver": _switches(os.getpid()), **{f"worker {p}": _switches(p) for p in workers}}
rows = []
for process, threads in after.items():
    for thread, (vol, invol) in threads.items():
        tid = int(thread.rsplit("/", 1)[1])
        was = before[process].get(thread)
        if was is None:
            continue
        name = names.get(tid, thread.rsplit("/", 1)[0]) if process == "driver" else thread.rsplit("/", 1)[0]
        rows.append([process.split()[0], name, (vol - was[0]) / calls, (invol - was[1]) / calls])
print(json.dumps({"sync_us": per_call_us, "threads": rows}))
"""


def lightwork_switches(calls: int, spin_us: str | None) -> dict[str, Any]:
    """Run a child driver doing ``calls`` synchronous calls; its switches per call."""
    env = dict(os.environ)
    bench_dir = str(Path(__file__).resolve().parent)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if spin_us is not None:
        env["LIGHTWORK_SPIN_US"] = spin_us
    done = subprocess.run([sys.executable, "-c", CHILD, str(calls), bench_dir], env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "thread_wake_us": thread_wake_us(), "process_wake_us": process_wake_us(),
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }
    print(f"wake-up of a blocked thread: {results['thread_wake_us']:.1f} µs "
          f"(another process: {results['process_wake_us']:.1f} µs); load "
          f"{' '.join(results['loadavg'])}")
    for label, spin in (("spinning waiter (default)", None), ("LIGHTWORK_SPIN_US=0", "0")):
        run = lightwork_switches(args.calls, spin)
        results[label] = run
        print(f"\n{label}: get(f.remote()) {run['sync_us']:.1f} µs a call; context "
              "switches per call:")
        print(f"  {'process':8} {'thread':22} {'voluntary':>10} {'involuntary':>12}")
        for process, thread, vol, invol in run["threads"]:
            if vol >= 0.01 or invol >= 0.01:
                print(f"  {process:8} {thread:22} {vol:10.2f} {invol:12.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
