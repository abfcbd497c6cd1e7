"""A/B comparison of the hot path between two checkouts, interleaved in one sitting.

Usage (from the repository root)::

    python bench/hotpath_ab.py --base /tmp/base-checkout [--rounds 6] [--only "sync CPU"]

``--base`` is another checkout of lightwork (its ``bench/`` and ``src/``), for example
``git worktree add /tmp/base main`` or a plain copy of the tree before a change. Each
round runs ``hotpath_profile.py`` once in a fresh process for each side (A = the base,
B = this checkout), in the order A B, then B A in the next round, so a drift in the
machine's load weighs on both sides alike. A shared 2-core host is noisy, so the
figures that matter are the CPU times per thread (``sync CPU …``, ``tasks CPU …``),
which load distorts far less than the wall clock.

Printed per figure: the median of A and of B over the rounds, B/A of the medians, and
the median of the per-round ratios B/A (each pair ran back to back).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


def run_once(checkout: Path, args: argparse.Namespace, out: Path) -> dict[str, list[float]]:
    command = [
        sys.executable, str(checkout / "bench" / "hotpath_profile.py"), "--rounds", "1",
        "--sync-calls", str(args.sync_calls), "--tasks", str(args.tasks), "--json", str(out),
    ]
    # hotpath_profile.py puts its checkout's src/ first on sys.path; PYTHONPATH makes
    # sure the workers (forked from the driver) import the same tree.
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, timeout=600)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="the checkout to compare with")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sync-calls", type=int, default=2_000)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--only", default="", help="print only figures starting with this")
    args = parser.parse_args()
    sides = {"A": args.base.resolve(), "B": BENCH_DIR.parent}
    if not (sides["A"] / "bench" / "hotpath_profile.py").exists():
        parser.error(f"{args.base} has no bench/hotpath_profile.py: give a lightwork checkout")
    results: dict[str, list[dict[str, list[float]]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = ("A", "B") if round_index % 2 == 0 else ("B", "A")
            for side in order:
                results[side].append(run_once(sides[side], args, Path(tmp) / f"{side}.json"))
            print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)
    print(f"A = {sides['A']}\nB = {sides['B']}\n{args.rounds} rounds; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    names = [name for name in results["B"][0] if name.startswith(args.only)]
    width = max(len(name) for name in names)
    print(f"{'figure'.ljust(width)}  {'A':>8}  {'B':>8}  {'B/A':>6}  {'paired':>6}")
    for name in names:
        a = [run.get(name, [0.0])[0] for run in results["A"]]
        b = [run.get(name, [0.0])[0] for run in results["B"]]
        median_a, median_b = statistics.median(a), statistics.median(b)
        paired = [y / x for x, y in zip(a, b) if x > 0]
        ratio = f"{median_b / median_a:6.2f}" if median_a > 0 else "     -"
        pair = f"{statistics.median(paired):6.2f}" if paired else "     -"
        print(f"{name.ljust(width)}  {median_a:8.1f}  {median_b:8.1f}  {ratio}  {pair}")


if __name__ == "__main__":
    main()
