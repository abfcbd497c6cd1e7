"""The README's performance table is what bench/readme_table.py makes of results.json.

So the figures a reader sees are one run's, with that run's machine named, and cannot
drift from the committed results file: after `make bench`, regenerate and commit both.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_readme_table_matches_results() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "readme_table.py"), "--check"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 0, done.stderr


def test_caption_names_the_machine() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import readme_table
    finally:
        sys.path.pop(0)
    unknown = readme_table.caption({"date": "2026-01-01", "mode": "full", "machine": {}})
    assert "CPU model not recorded" in unknown and "kernel not recorded" in unknown
    known = readme_table.caption({
        "mode": "full", "date": "d",
        "machine": {"cpu_model": "X CPU", "cpu_count": 2, "kernel": "6.1.0",
                    "python": "3.11.7", "load_average_before": [0.5, 0.25, 0.1],
                    "load_average_after": [1, 1, 1]},
    })
    assert "X CPU, 2 CPUs" in known and "Linux 6.1.0" in known and "Python 3.11.7" in known
    assert "0.5 / 0.25 / 0.1 before" in known
