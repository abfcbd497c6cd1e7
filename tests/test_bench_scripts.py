"""The benchmarks still run against the runtime as it is now.

``make bench`` is not part of ``make test``, and several of its scripts reach past the
public API (the advisor's looks, the store's spilling, the dashboard's mirror): a change
of the runtime's insides can break them silently until the next measurement. These
tests run the scripts that reach inside, with their smallest settings, writing their
results outside the checkout. They check that each ran and produced its figures, never
the figures' values (speed is measured by ``make bench``, not asserted here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def test_run_py_measures_the_figures_that_reach_inside(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    _run([str(BENCH / "run.py"), "--only", "lightwork", "--quick", "--figures",
          "advisor_looks,sync_roundtrip_us", "--json", str(out)], timeout=240)
    report = json.loads(out.read_text())["peers"]["lightwork"]
    assert report["status"] == "ok", report
    figures = report["figures"]
    for name in ("sync_roundtrip_us", "advisor_batch_us", "advisor_batch_us_change_pct"):
        assert isinstance(figures.get(name), float), (name, figures, report.get("notes"))


def test_spill_py_writes_its_figures_where_asked(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"kept": 1}))
    _run([str(BENCH / "spill.py"), "--total-mb", "128", "--json", str(out)], timeout=240)
    results = json.loads(out.read_text())
    assert results["kept"] == 1  # the other figures of the file are kept
    store = results["lightwork_store"]
    assert store["spilled_mb"] > 0 and store["spill_mb_s"] > 0


def test_dashboard_py_runs_the_parts_that_reach_inside(tmp_path: Path) -> None:
    # (its fourth part, contention, works on a mirror of made-up records for a fixed 30 s)
    out = tmp_path / "dashboard.json"
    _run([str(BENCH / "dashboard.py"), "--parts", "throughput,history,synthetic",
          "--tasks", "300", "--rounds", "1", "--history", "500", "--records", "1000",
          "--dwell", "0.2", "--output", str(out)], timeout=240)
    results = json.loads(out.read_text())
    assert {"throughput", "history", "synthetic"} <= set(results), results
