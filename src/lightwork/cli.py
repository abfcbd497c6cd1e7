"""The ``lightwork`` command line (also ``python -m lightwork``).

``lightwork demo [--output-dir DIR] [--dashboard]`` reproduces the loop experiments of Ray's profiling
guide (ex1: ``get`` inside the loop, ex2: ``get`` after the loop, ex3: serial driver work
between submissions) on a 4-CPU runtime, prints the timings beside the ideal ones and
what the advisor found in each, and writes their timeline (findings included). It ends
with the Dask diagnostics guide's example: a QR decomposition of a random dask array run
on lightwork under ``Profiler``, ``ResourceProfiler`` and ``CacheProfiler``, plotted to an
HTML file (skipped, saying what to install, without dask or bokeh).

``lightwork run script.py [args]`` (or ``run -m module``) runs a program written for Ray
unchanged: ``import ray`` gives lightwork (see ``lightwork.kernel.ray_alias``).

``lightwork advise FILE`` re-runs the advisor on a saved timeline file (the trace's
``otherData`` carries the event log as the advisor reads it); no session is needed.

The other commands attach to a running program on this machine, through the control
socket of its session (the newest of this user's sessions, or ``--session NAME``, or
``--address SOCKET``; see ``lightwork.kernel.control``):

    lightwork status                       resources, workers, actors, queues, objects
    lightwork list tasks|actors|workers|objects [--filter k=v] [--limit N] [--format json]
    lightwork summary tasks                per function: states, run times, queued time
    lightwork memory                       objects by owner, reference kind and size
    lightwork timeline [--output FILE]     Chrome trace JSON for ui.perfetto.dev
    lightwork stack [--native]             every thread of the driver and each worker
    lightwork profile [--seconds N] [-o FILE]  sample every task's stack; top functions,
                                           or a flame graph (.html), speedscope (.json),
                                           collapsed stacks (other names); --mode
                                           cprofile: cProfile of every call (pstats);
                                           --lines FUNC...: line timings; --memray FILE:
                                           a memory flame graph; --native: C frames
    lightwork advise [--format json]       the advisor's findings: mistakes and their fixes
    lightwork debug [CALL] [--list] [--wait S]  the calls paused in the debugger
                                           (breakpoint() in a task); attach to one
    lightwork dashboard [--port N] [--open] [--allow-actions]
                                           a live dashboard in the browser (lightwork.dashboard)

Exit status: 0 on success, 1 when no session answers (none running, it ended, or its
driver did not reply in time), 2 for a usage error such as an unknown filter key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from lightwork.kernel import control


def _loop_experiments(out: TextIO, sleep_s: float = 0.5, serial_s: float = 0.3) -> dict[str, float]:
    import lightwork as ray

    @ray.remote
    def func() -> None:
        time.sleep(sleep_s)

    def other_func() -> None:
        # The driver's own work: it computes (Ray's guide sleeps to stand for work, but
        # the advisor rightly reads a sleeping driver as not working).
        deadline = time.thread_time() + serial_s
        while time.thread_time() < deadline:
            pass

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


DEMO_TIMELINE = "lightwork-demo-timeline.json"
DEMO_PROFILE = "lightwork-demo-dask-profile.html"
EXPERIMENT_FUNCTIONS = ("ex1", "ex2", "ex3")
_DASK_MISSING = ("the Dask example needs dask[array] and bokeh: install them with "
                 "pip install 'lightwork[test]' (or pip install 'lightwork[dask,viz]' numpy)")


def demo(out: TextIO = sys.stdout, timeline_path: str | None = DEMO_TIMELINE,
         output_dir: str | None = None, dashboard: bool = False) -> int:
    """The demo; its files go to ``output_dir`` (else beside ``timeline_path``)."""
    import warnings

    import lightwork
    from lightwork.diagnostics.advisor import AdviceWarning, advise
    from lightwork.diagnostics.timeline import timeline

    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        timeline_path = os.path.join(output_dir, os.path.basename(timeline_path or DEMO_TIMELINE))
        profile_path = os.path.join(output_dir, DEMO_PROFILE)
    else:
        profile_path = os.path.join(os.path.dirname(timeline_path or ""), DEMO_PROFILE)
    print("lightwork demo: the loop experiments of Ray's profiling guide (4 CPUs)\n", file=out)
    start = time.perf_counter()
    with warnings.catch_warnings():
        # The demo prints the findings itself; as warnings they would say it twice.
        warnings.simplefilter("ignore", AdviceWarning)
        lightwork.init(num_cpus=4, dashboard=dashboard)  # the URL goes to stderr
        print(f"init took {time.perf_counter() - start:.3f} s\n", file=out)
        try:
            _loop_experiments(out)
            print_demo_findings(advise(print_report=False), out)
            if timeline_path:
                timeline(timeline_path)
                print(f"\ntimeline of the experiments, with the findings on the driver's "
                      f"events row: {os.path.abspath(timeline_path)}\n"
                      "  open it at https://ui.perfetto.dev (Open trace file) or in "
                      "chrome://tracing; re-run the advisor on it with "
                      f"lightwork advise {timeline_path}", file=out)
            _dask_example(out, profile_path)
        finally:
            start = time.perf_counter()
            lightwork.shutdown()
    print(f"\nshutdown took {time.perf_counter() - start:.3f} s", file=out)
    return 0


def print_demo_findings(findings: list[Any], out: TextIO) -> None:
    """The advisor's findings, by experiment (the function of their call site)."""
    import linecache

    print("\nwhat the advisor found (lightwork.advise(); a running program also gets each "
          "as an AdviceWarning):", file=out)
    by_label: dict[str, list[Any]] = {name: [] for name in EXPERIMENT_FUNCTIONS}
    for finding in findings:
        function = finding.callsite[2] if finding.callsite else ""
        label = function if function in by_label else "init" if function == "demo" else "other"
        by_label.setdefault(label, []).append(finding)
    for label, found in by_label.items():
        if not found:
            print(f"{label:<6}no findings", file=out)
        for finding in found:
            print(f"{label:<6}[{finding.kind}] {finding.title}", file=out)
            if finding.callsite:
                filename, line, _ = finding.callsite
                code = linecache.getline(filename, line).strip()
                print(f"{'':<6}at {finding.where()}" + (f": {code}" if code else ""), file=out)
            print(f"{'':<6}fix: {finding.suggestion}", file=out)


def _dask_example(out: TextIO, profile_path: str) -> None:
    """The Dask diagnostics guide's example, computed on lightwork."""
    print("\nthe Dask diagnostics guide's example on lightwork: QR of a random dask array "
          "with Profiler, ResourceProfiler and CacheProfiler", file=out)
    try:
        import bokeh  # noqa: F401  (visualize needs it; check before computing)
        import dask.array as da
        import numpy as np
    except ImportError as exc:
        print(f"skipped: {exc.name} is not installed; {_DASK_MISSING}", file=out)
        return
    import lightwork.dask
    from lightwork.diagnostics import CacheProfiler, Profiler, ResourceProfiler, visualize

    a = da.random.random((10000, 1000), chunks=(1000, 1000))
    q, r = da.linalg.qr(a)
    a2 = q.dot(r)
    start = time.perf_counter()
    with lightwork.dask.enable():
        with Profiler() as prof, ResourceProfiler(dt=0.25) as rprof, CacheProfiler() as cprof:
            result = a2.compute()
        took = time.perf_counter() - start
        same = bool(np.allclose(result, a.compute()))
    print(f"computed q.dot(r) for a {a.shape[0]}x{a.shape[1]} array in {a.npartitions} chunks: "
          f"{len(prof.results)} tasks in {took:.2f} s; q.dot(r) equals a: {same}", file=out)
    print(f"  Profiler: {len(prof.results)} TaskData, ResourceProfiler: {len(rprof.results)} "
          f"ResourceData, CacheProfiler: {len(cprof.results)} CacheData", file=out)
    # BokehJS inside the file: the plot opens offline too (Dask's default loads it from a CDN).
    visualize([prof, rprof, cprof], filename=profile_path, show=False, mode="inline")
    print(f"profile plot (tasks by worker, CPU and memory, cache): "
          f"{os.path.abspath(profile_path)}\n  open it in a web browser (works offline)",
          file=out)


# ---------------------------------------------------------------------------- formatting
TABLE_COLUMNS = {
    "tasks": ("task_id", "name", "state", "is_debugger_paused", "type", "worker_id", "pid",
              "attempt", "queued_s", "run_s", "rss_peak", "rss_change", "error"),
    "actors": ("actor_id", "class_name", "name", "state", "pid", "running", "queued",
               "calls_done", "restarts", "death_cause"),
    "workers": ("worker_id", "pid", "kind", "state", "actor_class", "running", "queued",
                "cpu_percent", "rss"),
    "objects": ("object_id", "owner", "state", "size", "location", "reference_kind",
                "task_name", "holders"),
    # Queued time per task (mean, p95), not summed: a sum over tasks that queue side by
    # side is task-seconds, far above the run's wall time (it is in the JSON output).
    "summary": ("name", "type", "count", "state_counts", "mean_run_s", "p50_run_s",
                "p95_run_s", "mean_queued_s", "p95_queued_s", "max_rss_peak", "mean_rss_change"),
    "owners": ("owner", "count", "bytes"),
    "kinds": ("kind", "count", "bytes"),
}
_BYTES = {"size", "rss", "bytes", "arg_size", "result_size", "rss_peak", "rss_change",
          "max_rss_peak", "mean_rss_change"}


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def human_duration(seconds: float) -> str:
    """A duration with its unit, so that microseconds do not read as 0.000."""
    size = abs(seconds)
    if size == 0:
        return "0 s"
    if size >= 1:
        return f"{seconds:.3f} s"
    if size >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} µs"


#: Columns whose header is not their field's name.
_HEADERS = {"is_debugger_paused": "PAUSED"}


def _header(column: str) -> str:
    """Durations carry their unit in each cell: the header drops the ``_s``."""
    return _HEADERS.get(column) or column.removesuffix("_s").upper()


def _cell(column: str, value: Any, width: int = 48) -> str:
    if value is None:
        return "-"
    if column == "is_debugger_paused":  # paused in the debugger now: `lightwork debug`
        return "yes" if value else "-"
    if column in _BYTES:
        return human_bytes(value)
    if column.endswith("_s") and isinstance(value, (int, float)):
        return human_duration(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        value = " ".join(f"{k}={v}" for k, v in value.items())
    elif isinstance(value, list):
        value = ",".join(str(v) for v in value)
    text = str(value).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def print_table(rows: list[dict[str, Any]], columns: tuple[str, ...], out: TextIO) -> None:
    cells = [[_cell(c, row.get(c)) for c in columns] for row in rows]
    widths = [max([len(_header(c))] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    print("  ".join(_header(c).ljust(w) for c, w in zip(columns, widths)).rstrip(), file=out)
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip(), file=out)


def print_status(s: dict[str, Any], out: TextIO) -> None:
    res = s["resources"]
    def amount(name: str, value: float) -> str:  # Ray's `memory` resource is in bytes
        return human_bytes(value) if name == "memory" else f"{value:g}"

    used = ", ".join(f"{k} {amount(k, res['used'][k])}/{amount(k, v)}"
                     for k, v in res["total"].items())
    counts = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"  # noqa: E731
    t, o, log = s["tasks"], s["objects"], s["event_log"]
    lines = [
        ("session", f"{s['session']} (driver pid {s['driver_pid']}, up {s['uptime_s']:.1f} s)"),
        ("resources", f"{used} in use"),
        ("workers", f"{s['worker_count']} ({counts(s['workers'])})"),
        ("actors", counts(s["actors"])),
        ("tasks", f"running {t['running']}, queued {t['queued']}, waiting for arguments "
                  f"{t['waiting_for_args']}; ended: finished {t['finished']}, "
                  f"failed {t['failed']}"),
        ("objects", f"{o['count']} ({human_bytes(o['bytes'])}; "
                    f"{human_bytes(o['shared_memory_bytes'])} in shared memory)"),
        ("store", describe_store(s.get("store"))),
        ("event log", f"{log['task_records']} task records (budget {log['budget']}); dropped "
                      f"{log['dropped_tasks']} records, {log['dropped_spans']} spans"),
    ]
    if s.get("backend") == "distributed":  # a driver on a Dask cluster
        where = s.get("address") or "?"
        if s.get("dask_dashboard"):
            where += f" (Dask dashboard {s['dask_dashboard']})"
        lines.insert(1, ("cluster", where))
    deadlocks = s.get("actor_deadlocks") or []
    if deadlocks:  # gets inside actors that could never return (raised ActorDeadlockError)
        last = deadlocks[-1]
        summary = (f"{len(deadlocks)} get(s) in actors could never return and raised "
                   f"ActorDeadlockError; last: {last['method']} waiting for "
                   f"{' -> '.join(last['waits_for'])} at {last['callsite']}")
        lines.insert(4, ("deadlocks", summary))
    for key, value in lines:
        print(f"{key:<11}{value}", file=out)


def describe_store(store: dict[str, Any] | None) -> str:
    """One line on the object store: used/budget, pooled, spilled."""
    if not store:
        return "n/a"
    text = (f"{human_bytes(store['used_bytes'])} / {human_bytes(store['budget_bytes'])} budget "
            f"in use, {human_bytes(store['pooled_bytes'])} kept for reuse; spilled "
            f"{store['spilled_objects']} objects ({human_bytes(store['spilled_bytes'])}) to "
            f"{store['spill_dir']}, {store['spilled_total']} spills so far")
    if store.get("spill_error"):
        text += f"; spilling stopped: {store['spill_error']}"
    return text


def print_memory(m: dict[str, Any], out: TextIO) -> None:
    print(f"{m['objects']} objects, {human_bytes(m['total_bytes'])} "
          f"({human_bytes(m['shared_memory_bytes'])} in shared memory); "
          f"{m['freed_objects']} freed so far", file=out)
    print(f"store: {describe_store(m.get('store'))}\n", file=out)
    print("by owner:", file=out)
    print_table(m["by_owner"], TABLE_COLUMNS["owners"], out)
    print("\nby reference kind:", file=out)
    print_table(m["by_reference_kind"], TABLE_COLUMNS["kinds"], out)
    print("\nlargest objects:", file=out)
    print_table(m["largest"], TABLE_COLUMNS["objects"], out)


# ---------------------------------------------------------------------------- commands
def _attach(args: Any, out: TextIO) -> int:
    from lightwork.diagnostics import stack as stacks
    from lightwork.diagnostics.timeline import build_trace, write_trace

    path = control.resolve_socket(args.session, args.address)
    timeout = args.timeout
    as_json = getattr(args, "format", "table") == "json"

    def ask(op: str, **op_args: Any) -> Any:
        return control.request(path, op, op_args, timeout=timeout)

    if args.command == "status":
        result = ask("status")
        print(json.dumps(result, indent=1), file=out) if as_json else print_status(result, out)
    elif args.command == "list":
        result = ask("list", kind=args.kind, filters=args.filter or [], limit=args.limit)
        if as_json:
            print(json.dumps(result["rows"], indent=1), file=out)
        else:
            print_table(result["rows"], TABLE_COLUMNS[args.kind], out)
            if result["total"] > len(result["rows"]):
                shown = len(result["rows"])
                print(f"(showing {shown} of {result['total']}; use --limit)", file=out)
    elif args.command == "summary":
        result = ask("summarize_tasks")
        if as_json:
            print(json.dumps(result, indent=1), file=out)
        else:
            print_table(result["functions"], TABLE_COLUMNS["summary"], out)
            print(f"({result['total_tasks']} tasks; {result['dropped_records']} older records "
                  "dropped by the event budget)", file=out)
    elif args.command == "memory":
        result = ask("memory_summary")
        print(json.dumps(result, indent=1), file=out) if as_json else print_memory(result, out)
    elif args.command == "timeline":
        timeout = max(timeout, 60.0)
        data = ask("timeline_data")
        events = build_trace(data)
        output = args.output or f"lightwork-timeline-{data['session']}.json"
        write_trace(output, events, data)
        print(f"wrote {len(events)} trace events to {os.path.abspath(output)}\n"
              "  open it at https://ui.perfetto.dev (Open trace file) or in chrome://tracing",
              file=out)
    elif args.command == "advise":
        from lightwork.diagnostics.advisor import Finding, report

        result = ask("advise")
        if as_json:
            print(json.dumps(result["findings"], indent=1), file=out)
        else:
            source = ("its advisor" if result["live"] else
                      "a one-off analysis of its event log (it runs with advisor=False)")
            print(f"session {result['session']}, from {source}:", file=out)
            print(report([Finding.from_dict(f) for f in result["findings"]]), file=out)
    elif args.command == "logs":
        result = ask("logs", task=args.task, function=args.function, worker=args.worker)
        if as_json:
            print(json.dumps(result["tasks"], indent=1), file=out)
        else:
            print(format_logs(result, args), file=out, end="")
    elif args.command == "stack":
        timeout = args.process_timeout + 10.0
        data = ask("stacks", timeout=args.process_timeout)
        print(stacks.format_stacks(data, full=args.full), file=out, end="")
        if args.native:
            print("\n" + stacks.native_stacks(data, timeout=max(5.0, args.process_timeout)),
                  file=out, end="")
    elif args.command == "profile":
        timeout = max(timeout, args.seconds + 15.0)  # the driver answers when sampling ends
        write_profile(ask, args, out)
    return 0


def debug_command(args: Any, out: TextIO) -> int:
    """``lightwork debug``: the paused calls of the named session, or of every running
    session of this user when none is named (a paused call may be in any of them)."""
    from lightwork.diagnostics import debugging

    if not 0 <= args.wait <= 86400:
        raise ValueError(f"--wait must be within [0, 86400] seconds, got {args.wait:g}")
    if args.session or args.address:
        paths = [control.resolve_socket(args.session, args.address)]
    else:
        paths = [info.socket for info in control.find_sessions()]
        if not paths:
            control.resolve_socket()  # raises NoSessionError, saying where it looked

    def collect() -> list[dict[str, Any]]:
        rows = []
        for path in paths:
            try:
                rows += control.request(path, "debug_paused", timeout=args.timeout)["paused"]
            except (control.ControlError, ValueError):
                if len(paths) == 1:  # a named session that cannot answer: say so
                    raise
        return rows

    return debugging.run(collect, args.call, args.list, args.wait, out)


def format_logs(result: dict[str, Any], args: Any) -> str:
    """``lightwork logs``' table form: a heading per call, then its lines as printed."""
    tasks = result["tasks"]
    if not tasks:
        what = (f"task {args.task}" if args.task else f"function {args.function}"
                if args.function else f"worker {args.worker}")
        return (f"no output kept for {what} in session {result['session']} (only calls "
                "that printed are kept, the most recent first to go)\n")
    parts = []
    for task in tasks:
        dropped = f", {task['dropped']} earlier lines not kept" if task["dropped"] else ""
        parts.append(f"== {task['name']} task {task['task_id']} worker {task['worker_id']} "
                     f"pid {task['pid']}{dropped}\n")
        parts.extend(f"{text}\n" if stream == "stdout" else f"[stderr] {text}\n"
                     for stream, text in task["lines"])
    return "".join(parts)


def write_profile(ask: Any, args: Any, out: TextIO) -> None:
    """``lightwork profile``: sample the session's tasks for ``--seconds``; write or print."""
    from lightwork.diagnostics.task_profiler import TaskProfile

    if not 0 < args.seconds <= 3600:
        raise ValueError(f"--seconds must be within (0, 3600], got {args.seconds:g}")
    if args.memray and (args.memory or args.mode == "cprofile"):
        raise ValueError("--memray traces memory in sampling mode on its own: leave out "
                         "--memory and --mode cprofile")
    profile = TaskProfile(ask("sample", seconds=args.seconds, hz=args.rate, mode=args.mode,
                              memory="memray" if args.memray else args.memory,
                              lines=args.lines or [], native=args.native))
    if args.timeline:
        from lightwork.diagnostics.timeline import build_trace, write_trace

        data = ask("timeline_data")
        events = build_trace(data, profile.timed, profile.hz)
        write_trace(args.timeline, events, data)
        print(f"wrote the timeline with {len(profile.timed)} timed samples to "
              f"{os.path.abspath(args.timeline)}: open it at https://ui.perfetto.dev",
              file=out)
    if args.memory:
        print(profile.memory_top(args.top), file=out)
    if args.memray:
        failed = [w for w in profile.memray.get("workers", []) if w["error"]]
        for worker in failed:
            print(f"worker {worker['worker_id']}: no memray capture: {worker['error']}",
                  file=out)
        path = profile.memray_flamegraph(args.memray)
        print(f"wrote a memory flame graph of {len(profile.memray['workers']) - len(failed)} "
              f"workers' allocations by task function to {path} (memray's; open it in a "
              "browser)", file=out)
    if args.lines:
        if profile.line_timings.get("timings"):
            profile.print_lines(stream=out)
        else:
            print(f"no call of {', '.join(args.lines)} ran in a task while it sampled "
                  "(name a function as qualname, file.py:qualname or module:qualname)",
                  file=out)
        if args.output is None:
            return
    if profile.mode == "cprofile":
        if args.output is None:
            profile.print_stats(args.top, stream=out)
            return
        profile.dump_stats(args.output)
        print(f"wrote cProfile statistics of {profile.calls} task calls to "
              f"{os.path.abspath(args.output)}: read them with `python -m pstats "
              f"{args.output}` or snakeviz", file=out)
        return
    if args.output is None:
        print(profile.top(args.top), file=out, end="")
        return
    if args.output.endswith(".html"):
        profile.flamegraph(args.output)
        what = "a flame graph (open it in a browser)"
    elif args.output.endswith(".json"):
        profile.speedscope(args.output)
        what = "a speedscope profile (open it at https://www.speedscope.app)"
    else:
        profile.collapsed(args.output)
        what = "collapsed stacks (flamegraph.pl, inferno, speedscope read them)"
    print(f"wrote {profile.total} samples from {len(profile.workers)} workers to "
          f"{os.path.abspath(args.output)}: {what}", file=out)


def advise_file(path: str, as_json: bool, out: TextIO) -> int:
    """``lightwork advise FILE``: re-run the advisor on a saved timeline file."""
    from lightwork.diagnostics.advisor import analyse, report
    from lightwork.diagnostics.timeline import read_saved

    _other, data = read_saved(path)
    findings = analyse(data)
    if as_json:
        print(json.dumps([finding.as_dict() for finding in findings], indent=1), file=out)
    else:
        print(f"{path}: {len(data.get('tasks', []))} task records and "
              f"{len(data.get('spans', []))} blocked spans re-analysed "
              f"({data.get('cpus', 0):g} CPU slots, {data.get('cores')} cores):", file=out)
        print(report(findings), file=out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightwork", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser(
        "demo", help="the profiling guide's loop experiments, the advisor, a Dask profile")
    demo_parser.add_argument("--dashboard", action="store_true",
                             help="serve the live dashboard of the demo's session (URL printed)")
    demo_parser.add_argument("--output-dir", help="where to write the demo's timeline and "
                             "profile plot (default: the current directory)")
    commands.add_parser("version", help="print the version")
    run_parser = commands.add_parser(
        "run", help="run a Ray program on lightwork, unchanged (`import ray` gives lightwork)")
    run_parser.add_argument("-m", dest="as_module", action="store_true",
                            help="TARGET is a module name, as with `python -m`")
    run_parser.add_argument("target", metavar="TARGET", help="the script (or module) to run")
    run_parser.add_argument("args", nargs=argparse.REMAINDER, help="the program's arguments")
    attach = argparse.ArgumentParser(add_help=False)
    attach.add_argument("--session", help="attach to this session (name, or its end) "
                        "instead of the newest one")
    attach.add_argument("--address", help="path of a session's control socket")
    attach.add_argument("--timeout", type=float, default=10.0,
                        help="seconds to wait for the driver to answer (default 10)")
    formats = argparse.ArgumentParser(add_help=False)
    formats.add_argument("--format", choices=("table", "json"), default="table")
    commands.add_parser("status", parents=[attach, formats], help="what the session is doing")
    listing = commands.add_parser("list", parents=[attach, formats], help="list tasks, actors, …")
    listing.add_argument("kind", choices=("tasks", "actors", "workers", "objects"))
    listing.add_argument("--filter", action="append", metavar="KEY=VALUE",
                         help="keep rows where KEY=VALUE (or KEY!=VALUE); repeatable; "
                         "wildcards work: name=*work")
    listing.add_argument("--limit", type=int, default=100, help="at most this many rows (100)")
    summary = commands.add_parser("summary", parents=[attach, formats], help="summaries")
    summary.add_argument("what", choices=("tasks",))
    commands.add_parser("memory", parents=[attach, formats], help="object store use")
    trace = commands.add_parser("timeline", parents=[attach], help="write a Chrome trace")
    trace.add_argument("--output", "-o", help="file to write (default "
                       "lightwork-timeline-<session>.json in the current directory)")
    advice = commands.add_parser("advise", parents=[attach, formats],
                                 help="the advisor's findings (a session, or a timeline FILE)")
    advice.add_argument("file", nargs="?", metavar="FILE",
                        help="a timeline file to re-analyse instead of a running session")
    dump = commands.add_parser("stack", parents=[attach], help="stacks of every process")
    dump.add_argument("--native", action="store_true", help="also native frames via py-spy")
    dump.add_argument("--full", action="store_true", help="do not fold lightwork's own frames")
    dump.add_argument("--process-timeout", type=float, default=control.DEFAULT_STACK_TIMEOUT_S,
                      help="seconds to wait for each process's dump (default 2)")
    shown = commands.add_parser("logs", parents=[attach, formats],
                                help="what one task, function or worker printed")
    which = shown.add_mutually_exclusive_group(required=True)
    which.add_argument("--task", metavar="ID", help="a task id (as `lightwork list tasks` shows)")
    which.add_argument("--function", metavar="NAME", help="every call of this function or method")
    which.add_argument("--worker", metavar="N", type=int, help="every call on this worker")
    sampling = commands.add_parser("profile", parents=[attach],
                                   help="sample the stacks of every running task")
    sampling.add_argument("--seconds", type=float, default=5.0,
                          help="how long to sample (default 5)")
    sampling.add_argument("--rate", type=float, default=100.0,
                          help="samples per second in each process (default 100)")
    sampling.add_argument("--mode", choices=("sample", "cprofile"), default="sample",
                          help="sample: stack samples (default); cprofile: cProfile around "
                          "every task call, merged")
    sampling.add_argument("--memory", action="store_true",
                          help="also trace memory per task call (tracemalloc): peaks and "
                          "the lines that allocate what calls keep")
    sampling.add_argument("--memray", metavar="FILE",
                          help="also capture every worker's allocations with memray and "
                          "write its flame graph (HTML) by task function to FILE")
    sampling.add_argument("--lines", nargs="+", metavar="FUNC",
                          help="also time these functions line by line where tasks call "
                          "them (line_profiler): qualname, file.py:qualname or "
                          "module:qualname")
    sampling.add_argument("--native", action="store_true",
                          help="also sample C frames, with py-spy (it must be installed "
                          "and allowed to ptrace the workers)")
    sampling.add_argument("--output", "-o", help="write FILE instead of printing the top "
                          "functions: .html a flame graph, .json speedscope, else collapsed "
                          "stacks; in cprofile mode, pstats' file")
    sampling.add_argument("--timeline", metavar="FILE",
                          help="also write the session's timeline with the samples on it "
                          "(Chrome trace JSON, for ui.perfetto.dev)")
    sampling.add_argument("--top", type=int, default=10,
                          help="functions per task function in the printed table (10)")
    debug = commands.add_parser("debug", parents=[attach],
                                help="the calls paused in the debugger; attach to one")
    debug.add_argument("call", nargs="?", metavar="CALL",
                       help="the paused call to attach to: its # in the list, or its task "
                       "id (default: the only one, else a choice)")
    debug.add_argument("--list", action="store_true", help="list the paused calls and leave")
    debug.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                       help="wait up to SECONDS for a call to pause (default: do not wait)")
    from lightwork.dashboard import add_command

    add_command(commands, attach)
    return parser


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args: Any = build_parser().parse_args(argv)
    if args.command == "run":  # the program's own output is its business
        return _run_program(args)
    try:
        status = _command(args, out)
        out.flush()  # inside the try: a reader gone at the final flush is the same case
        return status
    except BrokenPipeError:
        # The reader stopped early (``lightwork list tasks | head``): the output it
        # wanted was written, so no traceback. Point stdout at /dev/null so the
        # interpreter's own flush at exit does not fail again.
        if out is sys.stdout:
            _stdout_to_devnull()
        return 1


def _stdout_to_devnull() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind stdout (a test's stream)
        pass


def _run_program(args: Any) -> int:
    from lightwork.kernel import ray_alias

    try:
        ray_alias.run(args.target, args.args, as_module=args.as_module)
    except FileNotFoundError as exc:
        print(f"lightwork: {exc}", file=sys.stderr)
        return 2
    return 0


def _command(args: Any, out: TextIO) -> int:
    if args.command == "demo":
        return demo(out, output_dir=args.output_dir, dashboard=args.dashboard)
    if args.command == "version":
        import lightwork

        print(lightwork.__version__, file=out)
        return 0
    try:
        if args.command == "dashboard":
            from lightwork.dashboard import run_command

            return run_command(args, out)
        if args.command == "advise" and args.file:
            return advise_file(args.file, args.format == "json", out)
        if args.command == "debug":
            return debug_command(args, out)
        return _attach(args, out)
    except control.ControlError as exc:
        print(f"lightwork: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError) as exc:
        print(f"lightwork: error: {exc}", file=sys.stderr)
        return 2
