"""Benchmark harness: run every figure for every peer, print one comparison table.

Usage (from the repository root)::

    python bench/run.py [--only lightwork,ray] [--quick] [--figures sync_roundtrip_us,...]

Design
------
The harness (the parent) never imports a runtime. For each peer it starts a fresh
subprocess of this same file with ``--child PEER``; the child starts that one
runtime with 4 worker slots, runs the selected workloads from ``workloads.py``
through the peer's adapter from ``peers.py``, and writes its numbers to a JSON file
after every figure. So:

* one peer's runtime (its daemons, shared memory, sockets) never disturbs another's;
* a peer that crashes or hangs costs only its own column: the parent kills the
  child's whole process tree after ``--timeout`` seconds and keeps whatever figures
  the child had already written. The child arms ``faulthandler`` to dump its stacks
  into its log shortly before that deadline, so a hang is diagnosable (on SIGALRM, not
  with faulthandler's watchdog thread: a runtime starts in a single-threaded program, as
  in a user's script, and lightwork's ``init`` forks its fork server only then);
* the child, being fresh, can time ``init_to_first_result_s`` (from just before
  ``start()`` to the first ``get`` returning; the import is timed apart as
  ``import_s``) and, at the end, ``shutdown_s``.

While a child runs the parent records its descendants; any still alive a moment
after the child exits were left behind by the peer's shutdown. They are reported
(``leftover_processes`` in results.json) and then killed.

Each child's stdout/stderr goes to ``bench/logs/PEER.log``. The parent prints the
table on stdout and writes every number, with machine information and the peers'
versions, to ``bench/results.json`` or ``--json PATH`` (through a ``.json.tmp``, so a partial
file never replaces a good one).

A third table, "lightwork vs the pipe floor", divides lightwork's hot-path figures by
what two bare Python processes need to exchange a small pickled message over a
socketpair (``floor.py``), measured just before and just after lightwork's child in
the same run (the lower of the two kept): issue 13's targets are ratios to it.

Every figure is "lower is better". The table shows lightwork's value divided by
Ray's and by the best other runtime's (the serial baseline is not a runtime and is
never "best"), and checks lightwork against its targets.

A second, small table, "lightwork diagnostics cost", compares lightwork with itself:
a figure with one of its diagnostics on and off (``COST_ROWS``). The ProgressBar,
Profiler and ResourceProfiler variants run in lightwork's child, after the other
figures; the ``init`` variants (event log off, advisor off) need sessions of their
own, so a second lightwork child (``--own-init``, log ``lightwork-cost.log``) starts
and stops them itself.
"""

from __future__ import annotations

import argparse
import datetime as dt
import faulthandler
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_PATH = BENCH_DIR / "results.json"
LOG_DIR = BENCH_DIR / "logs"

# Importable for the harness too, but the parent uses only names, never runtimes.
sys.path.insert(0, str(BENCH_DIR))

from floor import FLOOR_RATIOS  # noqa: E402
from floor import measure as measure_floor  # noqa: E402
from peers import BASELINES, PEER_ENV, PEERS, NotSupported, make_peer  # noqa: E402
from workloads import (  # noqa: E402
    BASELINE_WORKLOADS,
    EXTRA_ROWS,
    LIGHTWORK_INIT_WORKLOADS,
    LIGHTWORK_WORKLOADS,
    WORKLOADS,
    OverBudget,
    change_row,
    Settings,
    noop,
)

#: Table rows in order, with lightwork's target (None: reported, no target).
TARGETS: dict[str, float | None] = {
    "sync_roundtrip_us": 100,
    "async_per_task_us": 15,
    "sleep_20k_s": 1.2,
    "by_value_160mb_s": 0.4,
    "put_once_160mb_s": 0.02,
    "put_160mb_s": None,
    "get_160mb_ms": 1,
    "init_to_first_result_s": 0.3,
    "shutdown_s": 0.2,
    "idle_worker_rss_mb": 30,
    "actor_start_first_call_ms": 30,
    "actor_sync_call_us": 100,
    "actor_async_per_call_us": 15,
    "idle_actor_rss_mb": 30,
    "actors_200_start_s": None,
}
#: Rows every peer with a runtime produces, whatever ``--figures`` says.
LIFECYCLE_ROWS = ("init_to_first_result_s", "shutdown_s")


class CostRow(NamedTuple):
    """One row of the diagnostics cost table: a lightwork figure with and without."""

    diagnostic: str
    figure: str
    on: str  # figure name with the diagnostic on
    off: str  # ... and off
    #: The most the figure may grow with the diagnostic on, in percent.
    target_pct: float


_TASKS, _DASK = "20k tasks, s", "20k-task Dask graph, s"
_RP = "ResourceProfiler(dt=0.25)"
#: The "lightwork diagnostics cost" table. ResourceProfiler's target is "no per-task
#: cost": a sampling thread costs time per second, not per task, so it is held to the
#: noise allowance of the event log.
COST_ROWS: dict[str, CostRow] = {
    "event_log": CostRow(
        "event log (advisor=False vs event_budget=0)",
        "async_per_task_us",
        "async_per_task_us_advisor_off",
        "async_per_task_us_event_log_off",
        5,
    ),
    "advisor": CostRow(
        "advisor (default vs advisor=False)",
        "async_per_task_us",
        "async_per_task_us_default",
        "async_per_task_us_advisor_off",
        2,
    ),
    "advisor_looks": CostRow(
        "advisor, its own work (its looks' and tally's CPU)",
        "async_per_task_us",
        "advisor_batch_us",
        "advisor_batch_us_less_looks",
        2,
    ),
    "tasks_progressbar": CostRow(
        "ProgressBar", _TASKS, "tasks_20k_progressbar_s", "tasks_20k_s", 10
    ),
    "tasks_profiler": CostRow("Profiler", _TASKS, "tasks_20k_profiler_s", "tasks_20k_s", 10),
    "tasks_resource_profiler": CostRow(
        _RP, _TASKS, "tasks_20k_resource_profiler_s", "tasks_20k_s", 5
    ),
    "dask_progressbar": CostRow("ProgressBar", _DASK, "dask_20k_progressbar_s", "dask_20k_s", 10),
    "dask_profiler": CostRow("Profiler", _DASK, "dask_20k_profiler_s", "dask_20k_s", 10),
    "dask_resource_profiler": CostRow(_RP, _DASK, "dask_20k_resource_profiler_s", "dask_20k_s", 5),
}
#: Every workload that feeds the cost table (lightwork only).
COST_WORKLOADS = (*LIGHTWORK_WORKLOADS, *LIGHTWORK_INIT_WORKLOADS)

# Ray needs about two minutes for the 200 actors alone on a 2-core machine.
DEFAULT_TIMEOUT_S = 420.0
QUICK_TIMEOUT_S = 120.0


# --- child: one peer in its own process ------------------------------------------------


class ChildReport:
    """What a child knows so far; rewritten to disk after every step."""

    def __init__(self, peer: str, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "peer": peer,
            "status": "running",
            "versions": {},
            "figures": {},
            "notes": {},
            "details": {},
        }

    def figure(self, row: str, value: float) -> None:
        self.data["figures"][row] = value
        self.save()

    def note(self, rows: Sequence[str], text: str) -> None:
        for row in rows:
            self.data["notes"][row] = text
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


def _dump_stacks_after(seconds: float) -> None:
    """Dump every thread's stack into the log after ``seconds``, by SIGALRM (no thread)."""
    faulthandler.register(signal.SIGALRM, all_threads=True, chain=False)
    signal.alarm(max(1, int(seconds)))


def run_child(
    peer_name: str, workloads: list[str], quick: bool, result_path: Path, timeout_s: float
) -> int:
    """Body of ``run.py --child PEER``: measure one peer, write ``result_path``."""
    if timeout_s > 20:
        _dump_stacks_after(timeout_s - 10)
    report = ChildReport(peer_name, result_path)
    settings = Settings.quick() if quick else Settings()
    peer = make_peer(peer_name)

    try:
        start = time.perf_counter()
        peer.load()
        report.data["details"]["import_s"] = time.perf_counter() - start
        report.data["versions"] = peer.versions()

        start = time.perf_counter()
        peer.start()
        peer.get([peer.submit(noop)])
        if peer.has_runtime:
            report.figure("init_to_first_result_s", time.perf_counter() - start)
    except Exception as exc:
        traceback.print_exc()
        report.data["status"] = "error"
        report.data["error"] = f"start-up failed: {type(exc).__name__}: {exc}"
        report.save()
        return 1

    for name in workloads:
        rows = (name, *EXTRA_ROWS.get(name, ()))
        print(f"--- {peer_name}: {name}", flush=True)
        try:
            workload = WORKLOADS.get(name) or LIGHTWORK_WORKLOADS[name]
            for row, value in workload(peer, settings).items():
                report.figure(row, value)
        except NotSupported as exc:
            report.note(rows, f"n/a: {exc}")
        except OverBudget as exc:
            report.note(rows, f"over budget: {exc}")
        except Exception as exc:
            traceback.print_exc()
            report.note(rows, f"error: {type(exc).__name__}: {exc}")

    try:
        start = time.perf_counter()
        peer.shutdown()
        if peer.has_runtime:
            report.figure("shutdown_s", time.perf_counter() - start)
    except Exception as exc:
        traceback.print_exc()
        report.note(["shutdown_s"], f"error: {type(exc).__name__}: {exc}")
    report.data["status"] = "ok"
    report.save()
    signal.alarm(0)
    return 0


def run_own_init_child(
    workloads: list[str], quick: bool, result_path: Path, timeout_s: float
) -> int:
    """Body of ``run.py --child lightwork --own-init``: workloads that start and stop
    lightwork themselves, so this child has no session of its own to time."""
    if timeout_s > 20:
        _dump_stacks_after(timeout_s - 10)
    report = ChildReport("lightwork", result_path)
    settings = Settings.quick() if quick else Settings()
    peer = make_peer("lightwork")
    peer.load()  # only for its version: each workload starts its own sessions
    report.data["versions"] = peer.versions()
    for name in workloads:
        rows = (name, *EXTRA_ROWS.get(name, ()))
        print(f"--- lightwork: {name}", flush=True)
        try:
            for row, value in LIGHTWORK_INIT_WORKLOADS[name](settings).items():
                report.figure(row, value)
        except Exception as exc:
            traceback.print_exc()
            report.note(rows, f"error: {type(exc).__name__}: {exc}")
    report.data["status"] = "ok"
    report.save()
    signal.alarm(0)
    return 0


# --- parent: one subprocess per peer ----------------------------------------------------


def child_env(peer: str) -> dict[str, str]:
    env = dict(os.environ)
    # bench/ so every peer's workers import the task functions by name; src/ so the
    # checkout under test is what gets measured even without an editable install.
    paths = [str(BENCH_DIR), str(REPO_DIR / "src")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(PEER_ENV.get(peer, {}))
    return env


def descendants(pid: int) -> dict[int, float]:
    """pid -> create_time of every live descendant of ``pid``."""
    import psutil

    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    found = {}
    for proc in procs:
        try:
            found[proc.pid] = proc.create_time()
        except psutil.Error:
            pass
    return found


def kill_survivors(seen: dict[int, float]) -> list[str]:
    """Kill the recorded processes still alive (same pid *and* start time)."""
    import psutil

    killed = []
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() != created:
                continue  # pid reused by an unrelated process
            killed.append(" ".join(proc.cmdline())[:100] or proc.name())
            proc.kill()
        except psutil.Error:
            pass
    return killed


def wait_or_kill(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bool, dict[int, float]]:
    """Wait for ``proc`` until ``deadline`` (perf_counter), then kill its process group.

    Returns (timed out, every descendant seen meanwhile); the descendants are recorded
    while they still hang under the child, since once it exits they are orphans.
    """
    seen: dict[int, float] = {}
    while True:
        seen.update(descendants(proc.pid))
        try:
            proc.wait(timeout=0.5)
            return False, seen
        except subprocess.TimeoutExpired:
            if time.perf_counter() > deadline:
                seen.update(descendants(proc.pid))
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return True, seen


def run_peer(
    peer: str, workloads: list[str], quick: bool, timeout_s: float, own_init: bool = False
) -> dict[str, Any]:
    """Run one peer's child process; return its report plus how the process ended.

    ``own_init``: the workloads start and stop the runtime themselves (lightwork's
    ``LIGHTWORK_INIT_WORKLOADS``); the child's log is then ``PEER-cost.log``.
    """
    LOG_DIR.mkdir(exist_ok=True)
    label = f"{peer}-cost" if own_init else peer
    log_path = LOG_DIR / f"{label}.log"
    with tempfile.TemporaryDirectory(prefix=f"bench-{label}-") as workdir:
        result_path = Path(workdir) / "result.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            peer,
            "--result-file",
            str(result_path),
            "--timeout",
            str(timeout_s),
            "--figures",
            ",".join(workloads) or "none",
        ]
        if quick:
            cmd.append("--quick")
        if own_init:
            cmd.append("--own-init")
        started = time.perf_counter()
        with open(log_path, "w") as log:
            # Own session, so a timeout can kill the peer's whole process group.
            proc = subprocess.Popen(
                cmd,
                cwd=workdir,
                env=child_env(peer),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            timed_out, seen = wait_or_kill(proc, started + timeout_s)
        elapsed = time.perf_counter() - started
        if not timed_out:
            time.sleep(2.0)  # give a clean shutdown time to reap its daemons
        leftovers = kill_survivors(seen)

        try:
            report: dict[str, Any] = json.loads(result_path.read_text())
        except (OSError, ValueError):
            report = {"peer": peer, "versions": {}, "figures": {}, "notes": {}, "details": {}}
    if timed_out:
        report["status"] = "timeout"
        report["error"] = f"killed after {timeout_s:.0f} s (stacks in {log_path})"
    elif proc.returncode != 0 and report.get("status") != "error":
        report["status"] = "crashed"
        report["error"] = f"exit code {proc.returncode}; see {log_path}"
    elif report.get("status") == "running":  # exit 0 yet unfinished: should not happen
        report["status"] = "crashed"
        report["error"] = f"child stopped early; see {log_path}"
    report["elapsed_s"] = elapsed
    report["log"] = str(log_path.relative_to(REPO_DIR))
    if not timed_out:
        report["leftover_processes"] = leftovers
    return report


# --- table ---------------------------------------------------------------------------


def fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def cell(report: dict[str, Any], row: str) -> str:
    if row in report["figures"]:
        return fmt(report["figures"][row])
    note = report["notes"].get(row, "")
    if note.startswith("n/a"):
        return "n/a"
    if note.startswith("error"):
        return "error"
    if note.startswith("over budget: "):  # "over budget: > 180; how far it got"
        return note.removeprefix("over budget: ").split(";")[0]
    status = report.get("status", "")
    return status if status in ("timeout", "crashed", "error") else "—"


def ratios(reports: dict[str, dict[str, Any]], row: str) -> dict[str, Any]:
    """lightwork / ray and lightwork / best other runtime, where both have numbers."""

    def value(peer: str) -> float | None:
        return reports.get(peer, {}).get("figures", {}).get(row)

    out: dict[str, Any] = {}
    lw = value("lightwork")
    others = {p: v for p in PEERS if p != "lightwork" and (v := value(p)) is not None}
    ray = others.get("ray")
    if lw is not None and ray:
        out["lightwork/ray"] = lw / ray
    if lw is not None and others:
        best = min(others, key=lambda p: others[p])
        if others[best]:
            out["lightwork/best"] = lw / others[best]
            out["best_peer"] = best
    return out


def render_table(reports: dict[str, dict[str, Any]], rows: list[str]) -> str:
    peers = list(reports)
    header = ["figure", *peers, "lw/ray", "lw/best", "target", ""]
    lines = [header]
    for row in rows:
        r = ratios(reports, row)
        target = TARGETS[row]
        lw = reports.get("lightwork", {}).get("figures", {}).get(row)
        if target is None or "lightwork" not in reports:
            verdict = ""
        else:
            verdict = "✓" if lw is not None and lw <= target else "✗"
        lines.append(
            [
                row,
                *(
                    cell(reports[p], row) if p in PEERS or row in reports[p]["figures"] else ""
                    for p in peers
                ),
                f"{r['lightwork/ray']:.2f}" if "lightwork/ray" in r else "",
                f"{r['lightwork/best']:.2f} {r['best_peer']}" if "lightwork/best" in r else "",
                f"≤ {target:g}" if target is not None else "",
                verdict,
            ]
        )
    return align(lines)


def align(lines: list[list[str]], left: int = 1) -> str:
    """The first ``left`` columns left-aligned, the rest right-aligned; a rule under
    the header (the first line)."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = []
    for n, line in enumerate(lines):
        cells = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("-" * len(out[0]))
    return "\n".join(out)


def cost_results(figures: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Each ``COST_ROWS`` row whose two figures were measured: both, and the change."""
    out: dict[str, dict[str, Any]] = {}
    for row, cost in COST_ROWS.items():
        on, off = figures.get(cost.on), figures.get(cost.off)
        if on is None or not off:
            continue
        # The paired change (median over rounds) when measured; else the best values'.
        change_pct = figures.get(change_row(cost.on), (on / off - 1) * 100)
        out[row] = {
            "on": on,
            "off": off,
            "change_pct": change_pct,
            "target_pct": cost.target_pct,
            "ok": change_pct <= cost.target_pct,
        }
    return out


#: Cost figure -> the workload that measures it.
COST_FIGURE_WORKLOAD = {row: w for w in COST_WORKLOADS for row in EXTRA_ROWS[w]}


def cost_figures(main: dict[str, Any], own_init: dict[str, Any] | None) -> dict[str, float]:
    """The cost figures of lightwork's child and of its ``--own-init`` child, together."""
    return {**main.get("figures", {}), **(own_init or {}).get("figures", {})}


def render_cost_table(
    main: dict[str, Any], own_init: dict[str, Any] | None, costs: list[str]
) -> str:
    """The diagnostics cost table: a row for each cost whose workload ran (``costs``).

    ``main`` is the report of lightwork's child, ``own_init`` that of the second
    child; a cell shows the figure, or why it is missing, from the child that owns it.
    """
    results = cost_results(cost_figures(main, own_init))
    empty: dict[str, Any] = {"figures": {}, "notes": {}, "status": "not run"}

    def source(figure: str) -> dict[str, Any]:
        if COST_FIGURE_WORKLOAD[figure] in LIGHTWORK_INIT_WORKLOADS:
            return own_init or empty
        return main

    lines = [["diagnostic", "figure", "on", "off", "change", "target", ""]]
    for row, cost in COST_ROWS.items():
        if COST_FIGURE_WORKLOAD[cost.on] not in costs:
            continue
        result = results.get(row)
        lines.append(
            [
                cost.diagnostic,
                cost.figure,
                cell(source(cost.on), cost.on),
                cell(source(cost.off), cost.off),
                f"{result['change_pct']:+.1f}%" if result else "",
                f"≤ {cost.target_pct:g}%",
                ("✓" if result["ok"] else "✗") if result else "✗",
            ]
        )
    return align(lines, left=2)


def floor_results(
    lightwork: dict[str, Any] | None, floor: dict[str, list[float]]
) -> dict[str, dict[str, Any]]:
    """Each ``FLOOR_RATIOS`` figure lightwork measured: its value, the floor's, the ratio."""
    out: dict[str, dict[str, Any]] = {}
    for row, (floor_row, target) in FLOOR_RATIOS.items():
        value = (lightwork or {}).get("figures", {}).get(row)
        if value is None or not floor.get(floor_row):
            continue
        base = min(floor[floor_row])
        out[row] = {
            "value": value,
            "floor": floor_row,
            "floor_value": base,
            "ratio": value / base,
            "target_ratio": target,
            "ok": value / base <= target,
        }
    return out


def render_floor_table(results: dict[str, dict[str, Any]]) -> str:
    lines = [["figure", "lightwork", "floor", "", "ratio", "target", ""]]
    for row, r in results.items():
        lines.append(
            [
                row,
                fmt(r["value"]),
                fmt(r["floor_value"]),
                r["floor"],
                f"{r['ratio']:.1f}×",
                f"≤ {r['target_ratio']:g}×",
                "✓" if r["ok"] else "✗",
            ]
        )
    return align(lines)


def machine_info() -> dict[str, Any]:
    import psutil

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
    }
    info.update(host_timing_facts())
    try:  # read-only: which commit was measured, if there is one
        info["git_commit"] = (
            subprocess.run(
                ["git", "-C", str(REPO_DIR), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def host_timing_facts() -> dict[str, Any]:
    """What sets a host's wake-up latency, recorded beside the figures.

    The synchronous figures follow how fast a blocked process wakes up, which differs
    between hosts of the same CPU model by 3x: these fields are what tells two such
    hosts apart when their results are compared (None where the host does not say).
    """
    facts: dict[str, Any] = {"cpu_model": None, "cpu_mhz": None, "hypervisor": False}
    cpuinfo = _read_text("/proc/cpuinfo") or ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and facts["cpu_model"] is None:
            facts["cpu_model"] = value
        elif key == "cpu MHz" and facts["cpu_mhz"] is None:
            facts["cpu_mhz"] = float(value)
        elif key == "flags" and "hypervisor" in value.split():
            facts["hypervisor"] = True
    facts["clocksource"] = _read_text(
        "/sys/devices/system/clocksource/clocksource0/current_clocksource"
    )
    facts["cpufreq_governor"] = _read_text(
        "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
    )
    slack = _read_text("/proc/self/timerslack_ns")
    facts["timer_slack_ns"] = int(slack) if slack and slack.isdigit() else None
    facts["lightwork_spin_us"] = os.environ.get("LIGHTWORK_SPIN_US")
    return facts


def describe_machine(machine: dict[str, Any]) -> str:
    """One line naming the machine and its load, as the README's table caption does."""
    def load(key: str) -> str:
        values = machine.get(key)
        return " / ".join(f"{v:g}" for v in values) if values else "not recorded"

    return (
        f"{machine.get('cpu_model') or 'CPU not recorded'}, {machine.get('cpu_count')} CPUs, "
        f"Linux {machine.get('kernel') or 'kernel not recorded'}, Python "
        f"{machine.get('python')}, clocksource {machine.get('clocksource') or '?'}, "
        f"load average (1/5/15 min) {load('load_average_before')} before, "
        f"{load('load_average_after')} after"
    )


# --- command line --------------------------------------------------------------------


def select_workloads(figures: str | None) -> tuple[list[str], list[str], list[str]]:
    """(workloads to run, table rows to show, cost workloads) for a ``--figures`` value."""
    if not figures:
        return list(WORKLOADS), list(TARGETS), list(COST_WORKLOADS)
    wanted = {name.strip() for name in figures.split(",") if name.strip()}
    row_to_workload = {row: w for w, extras in EXTRA_ROWS.items() for row in extras}
    unknown = wanted - set(TARGETS) - set(COST_WORKLOADS)
    if unknown:
        raise SystemExit(
            f"unknown figure(s) {', '.join(sorted(unknown))}; choose from "
            f"{', '.join((*TARGETS, *COST_WORKLOADS))}"
        )
    chosen = {row_to_workload.get(name, name) for name in wanted} & set(WORKLOADS)
    workloads = [w for w in WORKLOADS if w in chosen]
    rows = [
        row
        for row in TARGETS
        if row in wanted
        or row in LIFECYCLE_ROWS
        or row_to_workload.get(row) in chosen
        or row in chosen
    ]
    return workloads, rows, [w for w in COST_WORKLOADS if w in wanted]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Compare lightwork with Ray, Dask and concurrent.futures on the same machine."
    )
    parser.add_argument(
        "--only", help=f"comma-separated peers (default: {','.join(PEERS + BASELINES)})"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="far fewer repetitions: a smoke test, not a measurement",
    )
    parser.add_argument(
        "--figures",
        help=f"comma-separated figures (default: all): {', '.join(TARGETS)}; "
        f"lightwork's diagnostics cost: {', '.join(COST_WORKLOADS)}",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds per peer before it is killed (default "
        f"{DEFAULT_TIMEOUT_S:.0f}, {QUICK_TIMEOUT_S:.0f} with --quick)",
    )
    parser.add_argument(
        "--json", type=Path, default=RESULTS_PATH, metavar="PATH",
        help="where to write the results (default: bench/results.json, which the README's "
        "table is made from: write a partial run elsewhere)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    parser.add_argument("--own-init", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    timeout_s = args.timeout or (QUICK_TIMEOUT_S if args.quick else DEFAULT_TIMEOUT_S)

    if args.child:
        workloads = [] if args.figures == "none" else args.figures.split(",")
        if args.own_init:
            return run_own_init_child(workloads, args.quick, Path(args.result_file), timeout_s)
        return run_child(args.child, workloads, args.quick, Path(args.result_file), timeout_s)

    workloads, rows, costs = select_workloads(args.figures)
    peers = list(PEERS + BASELINES)
    if args.only:
        peers = [p.strip() for p in args.only.split(",") if p.strip()]
        unknown = set(peers) - set(PEERS + BASELINES)
        if unknown:
            raise SystemExit(
                f"unknown peer(s) {', '.join(sorted(unknown))}; "
                f"choose from {', '.join(PEERS + BASELINES)}"
            )

    load_before = [round(x, 2) for x in os.getloadavg()]
    reports: dict[str, dict[str, Any]] = {}
    # The second lightwork child, for the diagnostics cost of init settings.
    own_init_report: dict[str, Any] | None = None
    own_init_costs = [w for w in costs if w in LIGHTWORK_INIT_WORKLOADS]
    # The pipe floor, measured around lightwork's child when a figure needs it.
    wants_floor = "lightwork" in peers and any(row in FLOOR_RATIOS for row in rows)
    floor: dict[str, list[float]] = {}

    def floor_sample() -> None:
        quick = {"sync_calls": 300, "pipelined": 2_000, "runs": 1}
        try:
            for name, value in measure_floor(**(quick if args.quick else {})).items():
                floor.setdefault(name, []).append(value)
        except Exception:
            traceback.print_exc()

    for peer in peers:
        peer_workloads = workloads
        if peer == "lightwork":
            peer_workloads = workloads + [w for w in costs if w in LIGHTWORK_WORKLOADS]
        if peer in BASELINES:
            peer_workloads = [w for w in workloads if w in BASELINE_WORKLOADS]
            if not peer_workloads:
                continue
        print(
            f"[bench] {peer}: running {len(peer_workloads)} workload(s)...",
            file=sys.stderr,
            flush=True,
        )
        if peer == "lightwork" and wants_floor:
            floor_sample()
        report = run_peer(peer, peer_workloads, args.quick, timeout_s)
        if peer == "lightwork" and wants_floor:
            floor_sample()
        reports[peer] = report
        print(
            f"[bench] {peer}: {report.get('status')} in {report['elapsed_s']:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        if peer == "lightwork" and own_init_costs:
            print(
                "[bench] lightwork: diagnostics cost with other init settings...",
                file=sys.stderr,
                flush=True,
            )
            own_init_report = run_peer(peer, own_init_costs, args.quick, timeout_s, own_init=True)
            print(
                f"[bench] lightwork-cost: {own_init_report.get('status')} in "
                f"{own_init_report['elapsed_s']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    children = dict(reports)
    if own_init_report is not None:
        children["lightwork-cost"] = own_init_report

    print()
    mode = "QUICK (smoke test, not a measurement)" if args.quick else "full"
    machine = machine_info()
    machine["load_average_before"] = load_before
    machine["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(
        f"lightwork bench — {mode}; {machine['cpu_count']} CPUs, Python "
        f"{machine['python']}; 4 worker slots per peer; lower is better"
    )
    print()
    print(render_table(reports, rows))
    problems = [(p, r) for p, r in children.items() if r.get("status") != "ok" or r["notes"]]
    if problems:
        print()
    for peer, report in problems:
        if report.get("error"):
            print(f"  {peer}: {report['status']}: {report['error']}")
        by_note: dict[str, list[str]] = {}
        for row, note in report["notes"].items():
            by_note.setdefault(note, []).append(row)
        for note, note_rows in by_note.items():
            print(f"  {peer} {', '.join(note_rows)}: {note}")
    for peer, report in children.items():
        if report.get("leftover_processes"):
            print(
                f"  {peer}: left {len(report['leftover_processes'])} process(es) "
                f"running after shutdown (killed)"
            )

    show_costs = "lightwork" in reports and bool(costs)
    if show_costs:
        print()
        print(
            "lightwork diagnostics cost — one figure with each diagnostic on and off; "
            "best of interleaved runs; change = median over rounds of on / off - 1"
        )
        print()
        print(render_cost_table(reports["lightwork"], own_init_report, costs))

    floor_rows = floor_results(reports.get("lightwork"), floor)
    if floor_rows:
        print()
        print(
            "lightwork vs the pipe floor — two bare Python processes exchanging a small "
            "pickled message over a socketpair (bench/floor.py), lower of before/after"
        )
        print()
        print(render_floor_table(floor_rows))

    results = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "machine": machine,
        "settings": {
            "peers": peers,
            "workloads": workloads,
            "cost_workloads": costs if show_costs else [],
            "timeout_s": timeout_s,
            "worker_slots": 4,
        },
        "targets": {row: TARGETS[row] for row in rows},
        "peers": reports,
        "ratios": {row: ratios(reports, row) for row in rows},
        "floor": {"samples": floor, "ratios": floor_rows},
    }
    if show_costs:
        # The on/off figures themselves are in the reports (peers.lightwork and, for the
        # init settings, lightwork_cost.own_init_child).
        results["lightwork_cost"] = {
            "targets_pct": {row: cost.target_pct for row, cost in COST_ROWS.items()},
            "rows": cost_results(cost_figures(reports["lightwork"], own_init_report)),
            "own_init_child": own_init_report,
        }
    path = args.json.resolve()
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)
    print(f"\nmachine: {describe_machine(machine)}")
    print(f"results: {path}; logs: {LOG_DIR.relative_to(REPO_DIR)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
