"""Spill and restore throughput of lightwork's object store (``make bench`` runs it).

A session with a 256 MB budget takes 1 GB of 16 MB arrays: most of them go to disk.
Figures (MB/s, higher is better):

* ``spill_mb_s``: bytes the spill thread moved to disk / time it spent copying;
* ``put_past_budget_mb_s``: ``put`` throughput while the store is over its budget (the
  writer waits for the spiller to make room);
* ``restore_mb_s``: ``get`` of every spilled array, reading all its bytes (the spill
  files are mapped; the page cache may still hold them, as it would in real use);
* ``restore_cold_mb_s``: the same after dropping the page cache (root only, else n/a).

The figures go to ``bench/results.json`` (or ``--json PATH``) under ``lightwork_store``. Ray has no
comparable knob in this harness (its spilling needs a cluster config), so no ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

RESULTS_PATH = Path(__file__).resolve().parent / "results.json"
MB = 1 << 20
BUDGET = 256 * MB
ARRAY = 16 * MB
TOTAL = 1024 * MB


def _drop_page_cache() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as file:
            file.write("1\n")
        return True
    except OSError:
        return False


def measure(total: int = TOTAL) -> dict[str, float | None]:
    """The figures for ``total`` bytes of arrays, through a store of a quarter of that."""
    import lightwork

    lightwork.init(num_cpus=2, object_store_memory=min(BUDGET, total // 4), advisor=False)
    node = getattr(lightwork.api.core._backend, "node", None)  # the local engine's Node
    store, spiller = node.store, node.spiller
    arrays = [np.full(ARRAY, i % 251, dtype=np.uint8) for i in range(total // ARRAY)]
    start = time.perf_counter()
    refs = [lightwork.put(array) for array in arrays]
    put_s = time.perf_counter() - start
    spilled = store.spilled_bytes
    figures: dict[str, float | None] = {
        "spill_mb_s": spilled / MB / spiller.spill_seconds if spiller.spill_seconds else None,
        "put_past_budget_mb_s": total / MB / put_s,
    }
    spilled_refs = [ref for ref in refs if node.objects.get(ref.id).stored.path in store.spilled]

    def restore() -> float:
        begin = time.perf_counter()
        for ref in spilled_refs:
            value = lightwork.get(ref)
            assert int(value.sum(dtype=np.uint64)) >= 0  # reads every byte
            del value
        return len(spilled_refs) * ARRAY / MB / (time.perf_counter() - begin)

    figures["restore_mb_s"] = restore()
    figures["restore_cold_mb_s"] = restore() if _drop_page_cache() else None
    figures["spilled_mb"] = spilled / MB
    lightwork.shutdown()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=RESULTS_PATH, metavar="PATH",
                        help="the results file to add the figures to "
                        "(default: bench/results.json)")
    parser.add_argument("--total-mb", type=int, default=TOTAL // MB,
                        help="megabytes of arrays, through a store of a quarter of that "
                        "(default: 1024; smaller for a smoke test, not a measurement)")
    args = parser.parse_args(argv)
    if args.total_mb < 4 * ARRAY // MB:
        parser.error(f"--total-mb must be at least {4 * ARRAY // MB}")
    figures = measure(args.total_mb * MB)
    total = args.total_mb * MB
    print(f"\nlightwork store — {min(BUDGET, total // 4) // MB} MB budget, {total // MB} MB of "
          "16 MB arrays (MB/s, higher is better)")
    for name, value in figures.items():
        print(f"  {name:<22}{'n/a (needs root)' if value is None else f'{value:,.0f}'}")
    try:
        results = json.loads(args.json.read_text())
    except (OSError, ValueError):
        results = {}
    results["lightwork_store"] = figures
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
