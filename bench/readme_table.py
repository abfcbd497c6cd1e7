"""Write the README's performance table from one run's ``bench/results.json``.

Usage (from the repository root)::

    python bench/readme_table.py            # rewrite the table in README.md
    python bench/readme_table.py --check    # exit 1 if README.md's table is not the file's
    python bench/readme_table.py --print    # print the table only

The table sits between ``<!-- perf-table:begin -->`` and ``<!-- perf-table:end -->`` in
README.md and is never edited by hand: every number in it comes from the same results
file, whose caption names the machine, the date and the load it ran under. ``make bench``
runs this script at its end; ``tests/docs/test_perf_table.py`` checks that the committed
README and the committed results file agree, so the two cannot drift apart.

The script reads only the results file (no runtime is imported), so it runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_PATH = BENCH_DIR / "results.json"
README_PATH = REPO_DIR / "README.md"
BEGIN = "<!-- perf-table:begin -->"
END = "<!-- perf-table:end -->"

#: The README's rows, in order: figure name in results.json, and what a reader is told.
ROWS: dict[str, str] = {
    "sync_roundtrip_us": "`get(f.remote())` one at a time, µs",
    "async_per_task_us": "10,000 no-op tasks, then one `get`, µs per task",
    "sleep_20k_s": "20,000 tasks of `sleep(0.1 ms)`, s",
    "by_value_160mb_s": "a 160 MB array passed by value to 10 tasks, s",
    "put_once_160mb_s": "`put` once, then 10 tasks taking the ref, s",
    "get_160mb_ms": "`get` of a stored 160 MB array, ms",
    "init_to_first_result_s": "`init` to the first result, s",
    "idle_worker_rss_mb": "resident memory of an idle worker, MB",
    "actor_start_first_call_ms": "start an actor until its first call returns, ms",
    "actor_sync_call_us": "actor call one at a time, µs",
    "actor_async_per_call_us": "10,000 actor calls, then one `get`, µs per call",
}


def fmt(value: float) -> str:
    """Three significant figures, thousands separated: what a reader can compare."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    digits = 2 - int(f"{magnitude:e}".split("e")[1])
    return f"{value:.{digits}f}"


def ratio(value: float) -> str:
    """Two significant figures: 0.029×, 0.96×, 1.7×."""
    if value >= 10:
        return f"{value:.0f}×"
    return f"{value:#.2g}×"


def load(values: list[float] | None) -> str:
    return " / ".join(f"{v:g}" for v in values) if values else "not recorded"


def kernel_of(machine: dict[str, Any]) -> str | None:
    """The kernel release; older results files have it only inside ``platform``."""
    if machine.get("kernel"):
        return str(machine["kernel"])
    found = re.match(r"Linux-(.+?)-(x86_64|aarch64|arm64)", str(machine.get("platform", "")))
    return found.group(1) if found else None


def caption(results: dict[str, Any]) -> str:
    machine = results.get("machine") or {}
    peers = results.get("peers", {})
    versions = {}
    for peer in ("ray",):
        versions.update(peers.get(peer, {}).get("versions", {}))
    cpu = machine.get("cpu_model") or "CPU model not recorded"
    kernel = kernel_of(machine)
    parts = [
        f"{cpu}, {machine.get('cpu_count', '?')} CPUs, {machine.get('memory_gb', '?')} GB",
        f"Linux {kernel}" if kernel else "kernel not recorded",
        f"Python {machine['python']}" if machine.get("python") else "Python not recorded",
    ]
    if versions.get("ray"):
        parts.append(f"Ray {versions['ray']}")
    mode = "" if results.get("mode") == "full" else f" ({results.get('mode')} mode: not a measurement)"
    return (
        f"One `make bench` run{mode}, {results.get('date', 'date not recorded')}, on "
        f"{'; '.join(parts)}; load average (1, 5, 15 min) "
        f"{load(machine.get('load_average_before'))} before the run and "
        f"{load(machine.get('load_average_after'))} after. 4 worker slots each; "
        "lower is better; a ratio below 1× means lightwork took less."
    )


def render(results: dict[str, Any]) -> str:
    """The table and its caption, as the README holds them between the markers."""
    peers = results.get("peers", {})
    own = peers.get("lightwork", {}).get("figures", {})
    ray = peers.get("ray", {}).get("figures", {})
    floors = (results.get("floor") or {}).get("ratios") or {}
    samples = (results.get("floor") or {}).get("samples") or {}
    lines = [
        "| figure | lightwork | Ray | lightwork / Ray | lightwork / floor |",
        "|---|---:|---:|---:|---:|",
    ]
    for row, label in ROWS.items():
        if row not in own:
            continue
        mine = own[row]
        theirs = ray.get(row)
        floor = floors.get(row)
        lines.append(
            f"| {label} | {fmt(mine)} | {fmt(theirs) if theirs else 'n/a'} | "
            f"{ratio(mine / theirs) if theirs else 'n/a'} | "
            f"{ratio(floor['ratio']) if floor else ''} |"
        )
    floor_note = ""
    if samples.get("floor_roundtrip_us") and samples.get("floor_pipelined_us"):
        floor_note = (
            " The floor is two bare Python processes passing a small pickled message over "
            f"a socket pair, measured in the same run: {fmt(min(samples['floor_roundtrip_us']))} µs "
            f"a round trip, {fmt(min(samples['floor_pipelined_us']))} µs a message pipelined."
        )
    return "\n".join([*lines, "", caption(results) + floor_note])


def replace_table(readme: str, table: str) -> str:
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    return readme[: start + len(BEGIN)] + "\n" + table + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS_PATH)
    parser.add_argument("--readme", type=Path, default=README_PATH)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="fail if the README differs")
    group.add_argument("--print", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    table = render(json.loads(args.results.read_text()))
    if args.print:
        print(table)
        return 0
    readme = args.readme.read_text()
    wanted = replace_table(readme, table)
    if args.check:
        if wanted != readme:
            print(
                f"{args.readme}'s performance table differs from {args.results}: run "
                "`python bench/readme_table.py` to regenerate it",
                file=sys.stderr,
            )
            return 1
        return 0
    if wanted != readme:
        args.readme.write_text(wanted)
        print(f"{args.readme.name}: performance table rewritten from {args.results.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
