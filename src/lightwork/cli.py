"""The ``lightwork`` command line.

``lightwork demo`` reproduces the loop experiments of Ray's profiling guide (ex1: ``get``
inside the loop, ex2: ``get`` after the loop, ex3: serial driver work between
submissions) on a 4-CPU runtime and prints the timings beside the ideal ones.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


def _loop_experiments(out: TextIO, sleep_s: float = 0.5, serial_s: float = 0.3) -> dict[str, float]:
    import lightwork as ray

    @ray.remote
    def func() -> None:
        time.sleep(sleep_s)

    def other_func() -> None:
        time.sleep(serial_s)

    def ex1() -> None:  # get inside the loop: each task waits for the previous one
        results = []
        for _ in range(5):
            results.append(ray.get(func.remote()))

    def ex2() -> None:  # submit everything, then get once
        results = []
        for _ in range(5):
            results.append(func.remote())
        ray.get(results)

    def ex3() -> None:  # serial driver work between submissions (Amdahl's law)
        results = []
        for _ in range(5):
            other_func()
            results.append(func.remote())
        ray.get(results)

    ideal = {"ex1": 5 * sleep_s, "ex2": 2 * sleep_s, "ex3": 5 * serial_s + sleep_s}
    lesson = {
        "ex1": "get() inside the loop runs the tasks one after another",
        "ex2": "submit all, then get once: 4 run at a time on 4 CPUs",
        "ex3": "the driver's own serial work bounds the speed-up",
    }
    timings = {}
    experiments: dict[str, Callable[[], None]] = {"ex1": ex1, "ex2": ex2, "ex3": ex3}
    print(f"{'experiment':<11}{'took':>9}{'ideal':>9}   lesson", file=out)
    for name, experiment in experiments.items():
        start = time.perf_counter()
        experiment()
        timings[name] = time.perf_counter() - start
        print(
            f"{name:<11}{timings[name]:>8.3f}s{ideal[name]:>8.3f}s   {lesson[name]}",
            file=out,
        )
    return timings


def demo(out: TextIO = sys.stdout) -> int:
    import lightwork

    print("lightwork demo: the loop experiments of Ray's profiling guide (4 CPUs)\n", file=out)
    start = time.perf_counter()
    lightwork.init(num_cpus=4)
    print(f"init took {time.perf_counter() - start:.3f} s\n", file=out)
    try:
        _loop_experiments(out)
    finally:
        start = time.perf_counter()
        lightwork.shutdown()
    print(f"\nshutdown took {time.perf_counter() - start:.3f} s", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lightwork", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the profiling guide's loop experiments")
    commands.add_parser("version", help="print the version")
    args: Any = parser.parse_args(argv)
    if args.command == "demo":
        return demo()
    if args.command == "version":
        import lightwork

        print(lightwork.__version__)
        return 0
    return 2
