"""What the live dashboard costs, and how fast it answers (``make bench`` runs it).

Usage (from the repository root)::

    python bench/dashboard.py [--tasks 10000] [--rounds 3] [--records 1000000]

Figures, written to ``bench/dashboard_results.json`` and printed:

* ``throughput``: the driver's cost of a page open, over ``--rounds`` rounds of 10,000
  empty tasks (submit all, get all) on a 2-CPU runtime, each run once with no dashboard
  process at all and once with one attached and a page open (an event stream read by a
  separate client process, as a browser would), in orders that put each mode in each
  place of a round and after each other mode (six rounds), so the machine's drift
  falls on all three. Three figures, from the most to the least disturbed by the load: the
  throughputs (medians); the driver process's CPU time per task (all its threads,
  ``process_time``; the cost is the median of the per-round differences); and the CPU
  time of the driver's threads that answer the dashboard (``feed_thread_cpu_us_per_task``:
  the syncs, their JSON, sending the records), as a share of the driver's CPU per task
  and of its wall time per task; of that, ``feed_pack_us_per_record_in_run`` (the
  records' packing, per record) and ``feed_syncs_per_batch`` (each with its fixed part).
  A third run per round has the dashboard child of ``init(dashboard=True)`` attached with
  no page open: its syncs and records packed must be 0 (``no_page_...``).
  ``feed_us_per_record_apart``: a sync of 10,000 records and its JSON, timed alone (best
  of 5).
* with ``--history`` tasks recorded (100,000; the budget grows to keep them all): the
  dashboard process's RSS, and the p95 latency over HTTP of the overview, tasks pages
  (default order; sorted by run time; filtered by state and sorted, page 50), the
  per-function summary and the stream.
* with ``--records`` synthetic records (1,000,000, run times scattered) in a mirror: the
  time of a tasks page (default order, filtered, sorted, filtered and sorted: first and
  again), the summary, the stream; its memory; the CPU of applying the syncs (merging
  them into the kept sort orders and the per-function figures included).
* ``contention``: at ``--records`` records, 20,000-record syncs applied back to back by a
  thread (every fifth trims a tenth, as at the budget) while another asks for table
  pages, the functions view and the overview: each request's time (median, p95, max)
  and the longest hold of the mirror's lock by either thread (and by the trims alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))  # the synthetic sync of the tests (tests.dashboard)

CLIENT = r"""
import sys, urllib.request
url, cookie = sys.argv[1], sys.argv[2]
request = urllib.request.Request(url, headers={"Cookie": cookie})
with urllib.request.urlopen(request) as stream:
    for line in stream:
        pass
"""


def http_get(port: int, token: str, path: str) -> tuple[float, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        headers={"Cookie": f"lightwork_dashboard_{port}={token}"})
    start = time.perf_counter()
    with urllib.request.urlopen(request) as response:
        body = response.read()
    return time.perf_counter() - start, json.loads(body)


def start_dashboard(node: Any) -> tuple[Any, int, str]:
    """The dashboard child of this session, its port and its token."""
    from lightwork.dashboard import launch

    child = launch.start(node.control.path, port=0)
    return child, int(child.url.split(":")[2].split("/")[0]), child.url.split("token=")[1]


def open_page(port: int, token: str) -> subprocess.Popen:
    """A page's event stream, held open by a client process (``CLIENT``)."""
    return subprocess.Popen([sys.executable, "-c", CLIENT,
                             f"http://127.0.0.1:{port}/api/events?view=stream",
                             f"lightwork_dashboard_{port}={token}"])


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def throughput(n_tasks: int, rounds: int) -> dict[str, Any]:
    """The driver's cost of a dashboard with a page open, three ways (module docstring).

    Each round runs ``n_tasks`` no-op tasks twice: once with no dashboard process at all,
    once with one attached and a page open (an event stream, synced about once a
    second), and once with the dashboard attached and no page open; the orders rotate
    (``orders``) so the machine's drift falls on all alike.
    """
    import lightwork
    from lightwork.kernel import control

    # The direct cost: CPU time of the driver's threads that answer the dashboard (a
    # control connection each: the sync, its JSON encoding, sending the records).
    answered = {"cpu_s": 0.0}
    original_answer = control.ControlServer._answer

    def timed_answer(server: Any, conn: Any) -> None:
        start = time.thread_time()
        try:
            original_answer(server, conn)
        finally:
            answered["cpu_s"] += time.thread_time() - start

    control.ControlServer._answer = timed_answer  # type: ignore[method-assign]
    # ... and of that, the packing of the records (per record) and the syncs (a fixed
    # part each): where the cost of a burst goes.
    from lightwork.dashboard import feed

    original_pack, original_sync = feed.pack, feed.sync

    def timed_pack(rows: Any) -> Any:
        start = time.thread_time()
        try:
            return original_pack(rows)
        finally:
            answered["pack_s"] += time.thread_time() - start
            answered["records"] += len(rows)

    def counted_sync(*args: Any) -> Any:
        answered["syncs"] += 1
        return original_sync(*args)

    answered.update(pack_s=0.0, records=0, syncs=0)
    feed.pack, feed.sync = timed_pack, counted_sync  # type: ignore[assignment]
    from lightwork.kernel.events import DEFAULT_BUDGET

    # A budget that keeps every task (the init(event_budget=1_000_000) at 1M).
    lightwork.init(num_cpus=2, advisor=False, event_budget=max(DEFAULT_BUDGET, n_tasks))

    @lightwork.remote
    def noop(i: int) -> int:
        return i

    lightwork.get([noop.remote(i) for i in range(2 * n_tasks)])  # warm the workers
    node = getattr(lightwork.api.core._backend, "node", None)  # the local engine's Node
    runs: dict[str, dict[str, list[float]]] = {
        mode: {"rate": [], "cpu_us": [], "feed_us": [], "pack_us_per_record": [], "syncs": [],
               "records": []}
        for mode in ("without", "idle", "page")}
    costs: list[float] = []

    def batch(mode: str, synced: Any = None) -> None:
        feed_start = answered["cpu_s"]
        before = {key: answered[key] for key in ("pack_s", "records", "syncs")}
        cpu_start, start = time.process_time(), time.perf_counter()
        lightwork.get([noop.remote(i) for i in range(n_tasks)])
        elapsed = time.perf_counter() - start
        runs[mode]["rate"].append(n_tasks / elapsed)
        runs[mode]["cpu_us"].append(1e6 * (time.process_time() - cpu_start) / n_tasks)
        if synced is not None:
            synced()  # the feed's CPU counts until the batch's records are all handed over
        runs[mode]["feed_us"].append(1e6 * (answered["cpu_s"] - feed_start) / n_tasks)
        records = answered["records"] - before["records"]
        runs[mode]["records"].append(records)
        runs[mode]["syncs"].append(answered["syncs"] - before["syncs"])
        if mode == "page":
            runs[mode]["pack_us_per_record"].append(
                1e6 * (answered["pack_s"] - before["pack_s"]) / max(1, records))

    def with_page() -> None:
        child, port, token = start_dashboard(node)
        client = open_page(port, token)
        try:
            def synced() -> None:  # the dashboard holds every record of the ring
                deadline = time.monotonic() + 60
                while (http_get(port, token, "/api/overview")[1]["tasks"]["recorded"]
                       < len(node.log.tasks) and time.monotonic() < deadline):
                    time.sleep(0.05)

            synced()  # its first syncs catch up on the ring, before the batch is timed
            time.sleep(1.0)
            batch("page", synced)
            costs.append(http_get(port, token, "/api/overview")[1]["driver_cost_s"])
        finally:
            client.terminate()
            client.wait()
            child.stop()

    def idle() -> None:  # the child of init(dashboard=True), no page open
        child, _port, _token = start_dashboard(node)
        try:
            time.sleep(1.0)
            syncs = answered["syncs"]  # after the child's first sync, as it started
            batch("idle")
            time.sleep(1.0)  # a sync it would take after the batch is counted too
            runs["idle"]["syncs"][-1] = answered["syncs"] - syncs
        finally:
            child.stop()

    # Every mode in every place of a round, and after every other mode, over six rounds:
    # the machine's drift and any effect of the mode before fall on all three alike.
    orders = (("without", "idle", "page"), ("idle", "page", "without"),
              ("page", "without", "idle"), ("page", "idle", "without"),
              ("without", "page", "idle"), ("idle", "without", "page"))
    try:
        for round_ in range(rounds):
            for mode in orders[round_ % len(orders)]:
                {"page": with_page, "idle": idle,
                 "without": lambda: batch("without")}[mode]()
    finally:
        lightwork.shutdown()
        control.ControlServer._answer = original_answer  # type: ignore[method-assign]
        feed.pack, feed.sync = original_pack, original_sync  # type: ignore[assignment]
    # The driver's own work per record, measured apart (best of 5, same conditions): a
    # sync of the last n_tasks records and the JSON encoding of its reply.

    lightwork.init(num_cpus=2, advisor=False)
    lightwork.get([noop.remote(i) for i in range(n_tasks)])
    node = getattr(lightwork.api.core._backend, "node", None)  # the local engine's Node
    sync_s = encode_s = float("inf")
    for _ in range(5):  # CPU time of this thread: the machine's load disturbs it least
        start = time.thread_time()
        reply, _attached = feed.sync(node, 0, 0, n_tasks, 2000)
        sync_s = min(sync_s, time.thread_time() - start)
        start = time.thread_time()
        json.dumps(reply, default=str)
        encode_s = min(encode_s, time.thread_time() - start)
    lightwork.shutdown()
    median = statistics.median
    without, page = runs["without"], runs["page"]
    cpu_base = median(without["cpu_us"])
    # Pairs of neighbouring runs (one round each): the difference of each pair cancels
    # the drift of the machine's load; the median of those is the cost.
    cpu_pairs = [p - w for w, p in zip(without["cpu_us"], page["cpu_us"])]
    idle_pairs = [i - w for w, i in zip(without["cpu_us"], runs["idle"]["cpu_us"])]
    wall_base_us = 1e6 / median(without["rate"])
    feed_us = median(page["feed_us"])
    return {
        "tasks": n_tasks, "rounds": rounds, "load_1m_after": round(os.getloadavg()[0], 2),
        "throughput_no_dashboard_per_s": round(median(without["rate"])),
        "throughput_page_open_per_s": round(median(page["rate"])),
        "throughput_dashboard_no_page_per_s": round(median(runs["idle"]["rate"])),
        "driver_cpu_us_per_task_dashboard_no_page": round(median(runs["idle"]["cpu_us"]), 2),
        "no_page_syncs_and_records_in_all_batches": [sum(runs["idle"]["syncs"]),
                                                     sum(runs["idle"]["records"])],
        "feed_thread_cpu_us_per_task_no_page": round(median(runs["idle"]["feed_us"]), 3),
        "driver_cpu_no_page_minus_none_us_paired_median": round(median(idle_pairs), 3),
        "driver_cpu_us_per_task_no_dashboard": round(cpu_base, 2),
        "driver_cpu_us_per_task_page_open": round(median(page["cpu_us"]), 2),
        "driver_cpu_cost_us_per_task_paired_median": round(median(cpu_pairs), 3),
        "driver_cpu_cost_percent_paired": round(100 * median(cpu_pairs) / cpu_base, 2),
        "feed_thread_cpu_us_per_task": round(feed_us, 3),
        "feed_thread_cpu_us_per_task_without": round(median(without["feed_us"]), 3),
        "feed_share_of_driver_cpu_percent": round(100 * feed_us / cpu_base, 2),
        "feed_share_of_wall_per_task_percent": round(100 * feed_us / wall_base_us, 2),
        "feed_pack_us_per_record_in_run": round(median(page["pack_us_per_record"]), 3),
        "feed_syncs_per_batch": median(page["syncs"]),
        "feed_us_per_record_apart": round(1e6 * (sync_s + encode_s) / n_tasks, 3),
        "driver_sync_ms_mean": round(1000 * statistics.mean(costs), 2),
        "driver_sync_ms_max": round(1000 * max(costs), 2),
        "runs_cpu_us_no_dashboard": [round(x, 2) for x in without["cpu_us"]],
        "runs_cpu_us_page_open": [round(x, 2) for x in page["cpu_us"]],
        "runs_cpu_us_no_page": [round(x, 2) for x in runs["idle"]["cpu_us"]],
        "runs_no_dashboard": [round(x) for x in without["rate"]],
        "runs_page_open": [round(x) for x in page["rate"]],
        "runs_no_page": [round(x) for x in runs["idle"]["rate"]]}


def with_history(n_tasks: int, dwell_s: float = 3.0) -> dict[str, Any]:
    import psutil

    import lightwork

    from lightwork.kernel.events import DEFAULT_BUDGET

    # A budget that keeps every task (the init(event_budget=1_000_000) at 1M).
    lightwork.init(num_cpus=2, advisor=False, event_budget=max(DEFAULT_BUDGET, n_tasks))

    @lightwork.remote
    def noop(i: int) -> int:
        return i

    node = getattr(lightwork.api.core._backend, "node", None)  # the local engine's Node
    child, port, token = start_dashboard(node)
    rss_at_start = psutil.Process(child.process.pid).memory_info().rss
    try:
        for first in range(0, n_tasks, 20_000):
            lightwork.get([noop.remote(i) for i in range(first, min(n_tasks, first + 20_000))])
        time.sleep(0.5)
        first_paint, _ = http_get(port, token, "/api/overview")  # syncs up first
        # The records come over in syncs of at most 20,000 while the page is open; time
        # the requests once the mirror has them all (and say how long that took).
        caught_up = time.perf_counter()
        while (http_get(port, token, "/api/overview")[1]["tasks"]["recorded"] < n_tasks
               and time.perf_counter() - caught_up < 120):
            time.sleep(0.25)
        caught_up = time.perf_counter() - caught_up
        time.sleep(1.0)
        paths = {"overview": "/api/overview", "tasks": "/api/tasks?page_size=100",
                 "tasks_sorted": "/api/tasks?page_size=100&sort=run_s",
                 "tasks_filtered_sorted":
                     "/api/tasks?page_size=100&state=FINISHED&sort=queued_s&page=50",
                 "functions": "/api/functions", "stream": "/api/stream?window=30"}
        timings: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(40):
            for name, path in paths.items():
                timings[name].append(http_get(port, token, path)[0])
        recorded = http_get(port, token, "/api/overview")[1]["tasks"]["recorded"]
        page = browser_figures(child.url, dwell_s)
        rss = psutil.Process(child.process.pid).memory_info().rss
    finally:
        child.stop()
        lightwork.shutdown()
    return {"tasks_recorded": recorded, "dashboard_rss_mb_at_start": round(rss_at_start / 1e6, 1),
            "dashboard_rss_mb": round(rss / 1e6, 1), **page,
            "first_overview_ms": round(1000 * first_paint, 1),
            "all_records_in_the_mirror_s": round(caught_up, 1),
            **{f"{name}_p95_ms": round(1000 * p95(values), 2) for name, values in timings.items()}}


LONG_TASKS = """() => { window.__long = [];
  new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__long.push(e.duration); })
    .observe({type: "longtask", buffered: true}); }"""


def browser_figures(url: str, dwell_s: float = 3.0) -> dict[str, Any]:
    """In headless Chromium (when there): time to the first data on the page, the longest
    main-thread task while it shows the stream, tasks and overview for ``dwell_s`` each, DOM
    rows."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {"browser": "playwright is not installed"}
    if chromium is None:
        return {"browser": "chromium is not installed"}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.add_init_script(LONG_TASKS.join(["(", ")()"]))
        start = time.perf_counter()
        page.goto(url)
        page.wait_for_function("() => document.querySelector('.count-FINISHED') !== null")
        first_data = time.perf_counter() - start
        for view in ("stream", "tasks", "overview"):
            page.click(f"#tabs button[data-view={view}]")
            time.sleep(dwell_s)
        page.click("#tabs button[data-view=tasks]")
        page.wait_for_function("() => document.querySelectorAll('#tasks tr').length > 1")
        rows = page.evaluate("() => document.querySelectorAll('#tasks tr').length - 1")
        long_tasks = page.evaluate("() => window.__long")
        browser.close()
    return {"first_data_paint_ms": round(1000 * first_data),
            "longest_main_thread_task_ms": round(max(long_tasks, default=0.0)),
            "long_tasks_over_200ms": sum(1 for d in long_tasks if d > 200),
            "table_rows_in_dom": rows}


def synthetic(records: int) -> dict[str, Any]:
    import psutil
    from tests.dashboard.test_dashboard import _synthetic_sync

    from lightwork.dashboard.mirror import Mirror

    before = psutil.Process().memory_info().rss
    mirror = Mirror()
    names = [f"pipeline.stage_{i}" for i in range(20)]
    # Before the sync thread merged the orders itself, it called refresh_orders after.
    refresh = getattr(mirror, "refresh_orders", lambda: None)
    apply_s = 0.0
    for first in range(0, records, 100_000):
        reply, attached = _synthetic_sync(first, min(100_000, records - first), names, 1000.0,
                                          scattered=True)
        reply["budget"] = records
        start = time.thread_time()
        mirror.apply(reply, attached)
        refresh()
        apply_s += time.thread_time() - start
    memory = psutil.Process().memory_info().rss - before
    # One more sync of 7,000 records (a second's worth at full speed) into a million.
    reply, attached = _synthetic_sync(records, 7_000, names, 1000.0, scattered=True)
    reply["budget"] = records + 7_000
    start = time.thread_time()
    mirror.apply(reply, attached)
    refresh()
    next_sync_s = time.thread_time() - start

    def timed(call: Any) -> float:
        start = time.perf_counter()
        call()
        return round(1000 * (time.perf_counter() - start), 1)

    return {
        "records": records, "mirror_mb": round(memory / 1e6, 1),
        "apply_cpu_s": round(apply_s, 2),
        "apply_cpu_ms_next_7000": round(1000 * next_sync_s, 1),
        "tasks_page_newest_ms": timed(lambda: mirror.tasks(page=3)),
        "tasks_page_filtered_first_ms": timed(lambda: mirror.tasks(name="stage_7",
                                                                   state="FINISHED")),
        "tasks_page_filtered_again_ms": timed(lambda: mirror.tasks(name="stage_7",
                                                                   state="FINISHED", page=2)),
        "tasks_page_by_worker_first_ms": timed(lambda: mirror.tasks(worker="3", state="FAILED")),
        "tasks_page_by_state_first_ms": timed(lambda: mirror.tasks(state="FINISHED",
                                                                   sort="result_size")),
        "tasks_sorted_by_run_first_ms": timed(lambda: mirror.tasks(sort="run_s")),
        "tasks_sorted_by_run_again_ms": timed(lambda: mirror.tasks(sort="run_s", page=5)),
        "tasks_sorted_by_queued_first_ms": timed(lambda: mirror.tasks(sort="queued_s")),
        "tasks_sorted_by_name_deep_ms": timed(lambda: mirror.tasks(sort="name", page=4000)),
        "tasks_filtered_sorted_first_ms": timed(lambda: mirror.tasks(
            name="stage_3", sort="run_s", descending=False)),
        "tasks_filtered_sorted_middle_ms": timed(lambda: mirror.tasks(
            name="stage_3", sort="run_s", page=240)),

        "functions_first_ms": timed(mirror.function_summary),
        "functions_again_ms": timed(mirror.function_summary),
        "stream_ms": timed(lambda: mirror.stream(30.0)),
        "overview_ms": timed(mirror.overview),
    }


def _malloc_as_served() -> None:
    """glibc's malloc set as in the dashboard process (``SERVE_MALLOC_ENV``: big blocks
    mapped on their own, so a column grows by remapping, never by a copy), for the parts
    that run a mirror in this process. Without it, freeing a big block raises glibc's
    dynamic threshold and the next columns grow by copying, under the mirror's lock."""
    import ctypes
    import ctypes.util

    from lightwork.dashboard import SERVE_MALLOC_ENV

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, int(SERVE_MALLOC_ENV["MALLOC_MMAP_THRESHOLD_"]))  # M_MMAP_THRESHOLD
        libc.mallopt(-1, int(SERVE_MALLOC_ENV["MALLOC_TRIM_THRESHOLD_"]))  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass  # not glibc: the figures are the allocator's own


class _TimedLock:
    """A lock that records how long each thread held it (the mirror's, in ``contention``)."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self.holds: dict[str, list[float]] = {}
        self._since = 0.0

    def __enter__(self) -> None:
        self._lock.acquire()
        self._since = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        import threading

        held = time.perf_counter() - self._since
        self.holds.setdefault(threading.current_thread().name, []).append(held)
        self._lock.release()


def contention(records: int, sync_records: int = 20_000, seconds: float = 30.0) -> dict[str, Any]:
    """Table and summary requests while 20,000-record syncs arrive back to back into a
    mirror of ``records`` records (its budget: every fifth sync trims a tenth), as the
    dashboard's HTTP threads and its sync thread share it: each request's wall time
    (median, p95, max) and the longest hold of the mirror's lock by each thread."""
    import threading

    from tests.dashboard.test_dashboard import _synthetic_sync

    from lightwork.dashboard.mirror import Mirror

    _malloc_as_served()
    mirror = Mirror()
    names = [f"pipeline.stage_{i}" for i in range(20)]
    refresh = getattr(mirror, "refresh_orders", None)  # the code before the sync merged
    for first in range(0, records, 100_000):
        reply, attached = _synthetic_sync(first, min(100_000, records - first), names, 1000.0,
                                          scattered=True)
        reply["budget"] = records
        mirror.apply(reply, attached)
        if refresh is not None:
            refresh()
    syncs = []
    for k in range(6):
        reply, attached = _synthetic_sync(records + k * sync_records, sync_records, names,
                                          1000.0, scattered=True)
        reply["budget"] = records
        syncs.append((reply, attached))
    mirror.lock = _TimedLock()  # type: ignore[assignment]
    stop = threading.Event()
    applied = [0]
    trim = mirror._trim

    def timed_trim(n: int) -> None:  # its holds of the lock under a name of their own
        threading.current_thread().name = "trim"
        try:
            trim(n)
        finally:
            threading.current_thread().name = "sync"

    mirror._trim = timed_trim  # type: ignore[method-assign]

    def sync_loop() -> None:
        while not stop.is_set():
            mirror.apply(*syncs[applied[0] % len(syncs)])
            if refresh is not None:
                refresh()
            applied[0] += 1

    requests = {
        "newest": lambda: mirror.tasks(page=3),
        "by_run": lambda: mirror.tasks(sort="run_s", page=5),
        "filtered": lambda: mirror.tasks(name="stage_7", state="FINISHED", page=2),
        "filtered_sorted": lambda: mirror.tasks(state="FINISHED", sort="result_size"),
        "functions": mirror.function_summary,
        "overview": mirror.overview,
    }
    latencies: dict[str, list[float]] = {name: [] for name in requests}
    syncer = threading.Thread(target=sync_loop, name="sync")
    threading.current_thread().name = "requests"
    syncer.start()
    began = time.monotonic()
    try:
        while time.monotonic() - began < seconds:
            for name, request in requests.items():
                start = time.perf_counter()
                json.dumps(request())
                latencies[name].append(time.perf_counter() - start)
                time.sleep(0.02)
    finally:
        stop.set()
        syncer.join()
    every = sorted(x for values in latencies.values() for x in values)
    holds = mirror.lock.holds  # type: ignore[attr-defined]

    def ms(x: float) -> float:
        return round(1000 * x, 1)

    return {
        "records": records, "sync_records": sync_records, "seconds": seconds,
        "syncs_applied": applied[0], "requests": len(every),
        "load_1m": round(os.getloadavg()[0], 2),
        "request_ms_median": ms(statistics.median(every)), "request_ms_p95": ms(p95(every)),
        "request_ms_max": ms(every[-1]),
        **{f"{name}_ms_p95": ms(p95(values)) for name, values in latencies.items()},
        "lock_hold_ms_max_sync_thread": ms(max(holds.get("sync", [0.0]))),
        "lock_hold_ms_max_trim": ms(max(holds.get("trim", [0.0]))),
        "lock_hold_ms_median_trim": ms(statistics.median(holds.get("trim", [0.0]))),
        "lock_hold_ms_max_requests": ms(max(holds.get("requests", [0.0]))),
    }


def memory_run(minutes: float, sample_s: float = 10.0) -> dict[str, Any]:
    """The dashboard process's RSS while a program runs tasks for ``minutes`` with a page
    open (its event stream, and a tasks page and the overview fetched every sample)."""
    import psutil

    import lightwork

    # The default budget: a long run's memory with the log's ring full, as users run it.
    lightwork.init(num_cpus=2, advisor=False)

    @lightwork.remote
    def noop(i: int) -> int:
        return i

    node = getattr(lightwork.api.core._backend, "node", None)  # the local engine's Node
    child, port, token = start_dashboard(node)
    client = open_page(port, token)
    dashboard = psutil.Process(child.process.pid)
    curve: list[list[float]] = []  # [seconds, RSS MB, tasks run]
    tasks = 0
    began = time.monotonic()
    next_sample = began
    try:
        while (now := time.monotonic()) < began + 60 * minutes:
            lightwork.get([noop.remote(i) for i in range(2000)])
            tasks += 2000
            if now >= next_sample:
                http_get(port, token, "/api/tasks?page_size=100&sort=run_s")
                http_get(port, token, "/api/overview")
                curve.append([round(now - began), round(dashboard.memory_info().rss / 1e6, 1),
                              tasks])
                next_sample += sample_s
        curve.append([round(time.monotonic() - began),
                      round(dashboard.memory_info().rss / 1e6, 1), tasks])
        peak_mb = _peak_rss_mb(child.process.pid)  # a trim's copies, between samples
    finally:
        client.terminate()
        client.wait()
        child.stop()
        lightwork.shutdown()
    after_first_minute = [rss for seconds, rss, _ in curve if seconds >= 60] or [curve[-1][1]]
    half = [rss for seconds, rss, _ in curve if seconds >= 30 * minutes] or [curve[-1][1]]
    return {"minutes": minutes, "tasks": tasks,
            "tasks_per_s": round(tasks / max(1e-9, curve[-1][0])),
            "rss_mb_first": curve[0][1], "rss_mb_at_1_min": after_first_minute[0],
            "rss_mb_min_after_1_min": min(after_first_minute),
            "rss_mb_max_after_1_min": max(after_first_minute),
            "rss_mb_second_half_first_last": [half[0], half[-1]],
            "rss_mb_end": curve[-1][1], "rss_mb_peak": peak_mb, "curve": curve}


def _peak_rss_mb(pid: int) -> float | None:
    """The highest RSS process ``pid`` ever had (Linux's VmHWM), in MB."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) * 1024 / 1e6, 1)
    except OSError:
        pass
    return None


PARTS = ("throughput", "history", "synthetic", "contention", "memory")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="length of the memory run (--parts memory)")
    parser.add_argument("--parts", default="throughput,history,synthetic,contention",
                        help=f"comma-separated, of: {', '.join(PARTS)} (memory: a run of "
                        "--minutes with a page open, the dashboard's RSS every 10 s)")
    parser.add_argument("--dwell", type=float, default=3.0,
                        help="seconds the browser shows each view (--parts history)")
    parser.add_argument("--output", default=str(ROOT / "dashboard_results.json"))
    args = parser.parse_args(argv)
    if args.dwell < 0:
        parser.error("--dwell is seconds, 0 or more")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join(PARTS)}")
    if args.minutes <= 0:
        parser.error(f"--minutes must be > 0, got {args.minutes}")
    runs = {"throughput": lambda: throughput(args.tasks, args.rounds),
            "history": lambda: with_history(args.history, args.dwell),
            "synthetic": lambda: synthetic(args.records),
            "contention": lambda: contention(args.records),
            "memory": lambda: memory_run(args.minutes)}
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(),
                                           "load_1m": os.getloadavg()[0]}}
    for part in parts:
        results[part] = runs[part]()
    for part, figures in results.items():
        print(f"== {part}")
        for key, value in figures.items():
            print(f"  {key:<34} {value}")
    Path(args.output).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
