"""A sampling profile of the code inside tasks, from every worker, merged by task.

    with lightwork.profile_tasks() as prof:       # or: lightwork profile --seconds 10
        lightwork.get([work.remote(i) for i in range(100)])
    print(prof.top(10))
    prof.flamegraph("profile.html")               # also .speedscope(), .collapsed()

Why ``profile_tasks`` and not ``profile``: ``lightwork.profile("name")`` is Ray's user
span (a named interval on the timeline), and Ray programs run unchanged on lightwork, so
that name keeps its one meaning. What this profiles is the tasks' code (the driver's
too), and the name says so; it sits beside ``profile`` and ``timeline`` at the top of
the package because it is used the same way, around any part of a program.

What it owns: turning the engine's raw counts into a :class:`TaskProfile` and its
outputs. The sampling itself is the engine's (``engines/local/sampler.py``: a thread per
process at ``hz`` while the block runs, each stack labelled with the task or actor
method it belongs to and its worker), reached through the control operations
``sample_start``/``sample_stop`` (in process) or ``sample`` (the CLI, over the control
socket), so both paths merge the same data. No state outlives the block: a profile is
a value.

A stack is ``(label, worker_id, frames, count)``, frames outermost first, each
``"qualname (file:first line)"``: functions, not lines, so a function's samples add up
in one box. The outputs:

* ``collapsed()``: Brendan Gregg's collapsed stacks, one ``frame;frame;frame count``
  line per distinct stack, the task's label as the outermost frame (``flamegraph.pl``,
  inferno and speedscope read it);
* ``speedscope()``: speedscope's file format, one sampled profile for all tasks and one
  per task function, weights in seconds (samples / hz);
* ``flamegraph()``: one self-contained HTML file (its script inline, no network), a
  tree for all and one per task function; click a box to zoom, hover for its share;
* ``top(n)``: per task function, its ``n`` hottest functions by self time, with total
  time (the function anywhere on the stack, counted once per sample);
* ``timeline()``: the session's timeline (``timeline.py``) with the samples in time, as
  a flame chart under each process's tasks, from each sample's time (``timed``: kept
  by the engine's samplers for a profile's first minutes; not by py-spy, nor on a
  cluster, whose samples come merged).
"""

from __future__ import annotations

import contextlib
import html
import json
import pstats
from collections import Counter
from collections.abc import Iterator
from typing import Any

__all__ = ["TaskProfile", "profile_tasks"]

ALL = "all tasks"
DRIVER = "(driver)"  # the driver's samples' label (engines/local/sampler.py)


class TaskProfile:
    """The merged samples of one profile (filled when its ``with`` block ends)."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.hz = 100.0
        self.duration = 0.0
        self.stacks: list[tuple[str, int, tuple[str, ...], int]] = []
        #: each sample in time: (monotonic time, worker_id, pid, label, frames)
        self.timed: list[tuple[float, int, int, str, tuple[str, ...]]] = []
        self.processes: list[dict[str, Any]] = []  # worker_id (0: driver), pid, samples
        self.missing: list[int] = []  # workers that sent no final counts (they died)
        self.mode = "sample"
        self.native = False  # native=True: the workers' stacks are py-spy's, C frames too
        self._stats_rows: list[list[Any]] = []  # cprofile mode: the merged pstats rows
        #: memory=True: per task function, its calls, the most memory one call traced
        #: above its start (``peak``), what its calls left allocated (``kept``), and
        #: the lines where that was allocated (``sites``: file, line, bytes, blocks),
        #: from up to 20 of its calls on each worker (``site_calls`` in all), fewer
        #: where comparing snapshots would cost more than a quarter of its time.
        self.allocations: dict[str, dict[str, Any]] = {}
        #: lines=[...]: line_profiler's timings, added up over the workers:
        #: ``{"unit": seconds, "timings": [[file, first line, name, [[line, hits, time]]]]}``
        self.line_timings: dict[str, Any] = {}
        #: memory="memray": the workers' allocations labelled by task function, at each
        #: worker's high-water mark (``peak``) and still allocated at the end (``leaks``):
        #: ``[label, frames (innermost first: function, file, line), bytes, blocks]``;
        #: ``workers``: each worker's peak and its error, if its capture failed.
        self.memray: dict[str, Any] = {}
        if data is not None:
            self._fill(data)

    def _fill(self, data: dict[str, Any]) -> None:
        self.hz = float(data["hz"])
        self.duration = max(0.0, float(data.get("ended") or 0) - float(data.get("started") or 0))
        self.missing = list(data.get("missing", []))
        self.mode = str(data.get("mode", "sample"))
        self.native = bool(data.get("native", False))
        self._stats_rows = list(data.get("stats", []))
        self.allocations = dict(data.get("allocations") or {})
        self.line_timings = dict(data.get("lines") or {})
        self.memray = dict(data.get("memray") or {})
        for process in data["processes"]:
            worker_id = int(process["worker_id"])
            self.processes.append({"worker_id": worker_id, "pid": process["pid"],
                                   "rounds": process["samples"],
                                   "samples": sum(n for _l, _s, n in process["counts"]),
                                   "sampler_cpu": float(process.get("cpu") or 0.0)})
            counts = process["counts"]
            for label, frames, count in counts:
                self.stacks.append((label, worker_id, tuple(frames), int(count)))
            for t, index in process.get("timed") or ():
                label, frames, _count = counts[index]
                self.timed.append((float(t), worker_id, int(process["pid"]), label,
                                   tuple(frames)))
        self.stacks.sort(key=lambda s: (s[0], s[2], s[1]))

    # -- queries ------------------------------------------------------------------------
    @property
    def total(self) -> int:
        return sum(s[3] for s in self.stacks)

    @property
    def labels(self) -> list[str]:
        """The task functions with samples, hottest first, then ``(driver)``."""
        per = Counter[str]()
        for label, _w, _f, n in self.stacks:
            per[label] += n
        ranked = [label for label, _ in per.most_common() if label != DRIVER]
        return ranked + [DRIVER] * (DRIVER in per)

    @property
    def workers(self) -> set[int]:
        """Ids of the workers with task samples (0, the driver, left out)."""
        return {w for _l, w, _f, n in self.stacks if w and n}

    def function_samples(self, label: str | None = None) -> Counter[str]:
        """Samples in which each function is on the stack (once per sample)."""
        counts = Counter[str]()
        for stack_label, _w, frames, n in self.stacks:
            if label is None or stack_label == label:
                for name in set(frames):
                    counts[name] += n
        return counts

    def self_samples(self, label: str | None = None) -> Counter[str]:
        """Samples in which each function is the innermost frame."""
        counts = Counter[str]()
        for stack_label, _w, frames, n in self.stacks:
            if (label is None or stack_label == label) and frames:
                counts[frames[-1]] += n
        return counts

    # -- outputs ------------------------------------------------------------------------
    def collapsed(self, path: str | None = None, by_worker: bool = False) -> str:
        """Collapsed stacks (``label;outer;…;inner count`` per line); written to ``path``."""
        merged = Counter[tuple[str, ...]]()
        for label, worker_id, frames, n in self.stacks:
            root = (label, f"worker {worker_id}") if by_worker else (label,)
            merged[root + frames] += n
        text = "".join(f"{';'.join(_clean(f) for f in stack)} {n}\n"
                       for stack, n in sorted(merged.items()))
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    def speedscope(self, path: str | None = None) -> dict[str, Any]:
        """speedscope's JSON file (https://www.speedscope.app/file-format-schema.json)."""
        frames: list[dict[str, Any]] = []
        index: dict[str, int] = {}

        def frame_of(name: str) -> int:
            if name not in index:
                index[name] = len(frames)
                function, where = _split(name)
                entry: dict[str, Any] = {"name": function}
                if where:
                    file, _, line = where.rpartition(":")
                    entry["file"] = file
                    if line.isdigit():
                        entry["line"] = int(line)
                frames.append(entry)
            return index[name]

        def profile(name: str, label: str | None) -> dict[str, Any]:
            samples, weights = [], []
            for stack_label, _w, stack, n in self.stacks:
                if label is None or stack_label == label:
                    samples.append([frame_of(f) for f in (stack_label, *stack)])
                    weights.append(n / self.hz)
            return {"type": "sampled", "name": name, "unit": "seconds", "startValue": 0,
                    "endValue": sum(weights), "samples": samples, "weights": weights}

        document = {
            "$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": frames},
            "profiles": [profile(ALL, None)] + [profile(label, label) for label in self.labels],
            "name": "lightwork task profile",
            "activeProfileIndex": 0,
            "exporter": "lightwork",
        }
        if path is not None:
            with open(path, "w") as f:
                json.dump(document, f)
        return document

    def trees(self) -> dict[str, dict[str, Any]]:
        """Call trees ``{name, value, children}``: one for all, one per task function."""
        def tree(name: str, label: str | None) -> dict[str, Any]:
            root: dict[str, Any] = {"name": name, "value": 0, "children": {}}
            for stack_label, _w, frames, n in self.stacks:
                if label is not None and stack_label != label:
                    continue
                node = root
                node["value"] += n
                for frame in ((stack_label, *frames) if label is None else frames):
                    child = node["children"].get(frame)
                    if child is None:
                        child = node["children"][frame] = {"name": frame, "value": 0,
                                                           "children": {}}
                    child["value"] += n
                    node = child
            return _listed(root)

        out = {ALL: tree(ALL, None)}
        for label in self.labels:
            out[label] = tree(label, label)
        return out

    def flamegraph(self, path: str | None = None) -> str:
        """A self-contained HTML flame graph (no network needed to open it)."""
        data = json.dumps({"hz": self.hz, "trees": self.trees()}).replace("</", "<\\/")
        title = html.escape(f"lightwork task profile: {self.total} samples at {self.hz:g} Hz")
        page = _PAGE.replace("__TITLE__", title).replace("__DATA__", data)
        if path is not None:
            with open(path, "w") as f:
                f.write(page)
        return page

    def top(self, n: int = 10) -> str:
        """A text table per task function: its ``n`` hottest functions, self and total."""
        lines = [f"{self.total} samples at {self.hz:g} Hz from {len(self.workers)} workers "
                 f"over {self.duration:.2f} s" + (", C frames by py-spy" if self.native else "")]
        sampled = [p["sampler_cpu"] for p in self.processes if p["sampler_cpu"]]
        if sampled and self.duration:
            lines.append(f"sampling threads: {sum(sampled):.3f} s of CPU in all, "
                         f"{100 * max(sampled) / self.duration:.2f}% of a core at most "
                         "in one process")
        if self.missing:
            lines.append(f"(no final counts from workers {self.missing}: they exited; "
                         "their last second may be missing)")
        for label in self.labels:
            selfs, totals = self.self_samples(label), self.function_samples(label)
            count = sum(s[3] for s in self.stacks if s[0] == label)
            lines.append("")
            lines.append(f"{label}: {count} samples ({count / self.hz:.2f} s)")
            lines.append(f"  {'self s':>8} {'self %':>7} {'total s':>8} {'total %':>7}  function")
            ranked = sorted(totals, key=lambda f: (-selfs.get(f, 0), -totals[f], f))[:n]
            for function in ranked:
                own, all_ = selfs.get(function, 0), totals[function]
                lines.append(f"  {own / self.hz:8.2f} {100 * own / count:6.1f}% "
                             f"{all_ / self.hz:8.2f} {100 * all_ / count:6.1f}%  {function}")
        return "\n".join(lines) + "\n"

    def timeline(self, path: str | None = None) -> list[dict[str, Any]] | None:
        """The session's timeline with this profile's samples as a flame chart in each
        process (Chrome trace events: Perfetto, chrome://tracing); written to ``path``
        if given, as ``lightwork.timeline(path)`` writes it. Ask while the session
        runs: the tasks' spans come from its event log."""
        from lightwork.diagnostics import timeline as timelines
        from lightwork.state import query

        data = query("timeline_data")
        events = timelines.build_trace(data, self.timed, self.hz)
        if path is None:
            return events
        timelines.write_trace(path, events, data)
        return None

    def memory_top(self, n: int = 5) -> str:
        """memory=True: per task function, its peak and kept memory per call and the
        ``n`` lines that allocated most of what its calls kept."""
        if not self.allocations:
            return ("no memory traced: profile with profile_tasks(memory=True) or "
                    "`lightwork profile --memory`\n")
        mb = 1 << 20
        lines = []
        ranked = sorted(self.allocations.items(), key=lambda kv: -kv[1]["peak"])
        for label, entry in ranked:
            calls = max(1, entry["calls"])
            lines.append(f"{label}: {entry['calls']} calls, peak {entry['peak'] / mb:.1f} MB "
                         f"in one call, kept {entry['kept'] / calls / mb:+.2f} MB a call")
            sites = [site for site in entry["sites"] if site[2] >= 1024][:n]
            if sites:
                lines.append(f"  kept by line, over {entry['site_calls']} of its calls:")
            for file, line, size, count in sites:
                lines.append(f"  {size / mb:10.2f} MB {count:8d} blocks  {file}:{line}")
        return "\n".join(lines) + "\n"

    def memray_stacks(self, leaks: bool = False) -> list[tuple[str, tuple[Any, ...], int, int]]:
        """memory="memray": ``(label, frames, bytes, blocks)`` per allocating stack, at
        the workers' peaks (or, ``leaks=True``, still allocated when the profile ended);
        frames innermost first, each ``(function, file, line)``."""
        if not self.memray:
            raise ValueError("no memray capture in this profile: profile with "
                             "profile_tasks(memory=\"memray\") or `lightwork profile --memray`")
        return [(label, tuple(tuple(f) for f in frames), size, count)
                for label, frames, size, count in self.memray["leaks" if leaks else "peak"]]

    def memray_flamegraph(self, path: str, leaks: bool = False) -> str:
        """memory="memray": memray's own HTML flame graph of the workers' allocations,
        merged: each stack's root is its task function, and memray's thread selector
        picks one task function. ``leaks=True``: what was still allocated at the end."""
        from lightwork.diagnostics import memray_report

        return memray_report.write(self, path, leaks)

    def print_lines(self, stream: Any = None) -> None:
        """lines=[...]: each function's time by line, as line_profiler prints it."""
        if not self.line_timings:
            raise ValueError("no line timings in this profile: profile with "
                             "profile_tasks(lines=[func, ...])")
        line_profiler = _line_profiler()
        timings = {(file, first, name): [tuple(t) for t in rows]
                   for file, first, name, rows in self.line_timings["timings"]}
        line_profiler.show_text(timings, self.line_timings["unit"], stream=stream)

    # -- cProfile mode -------------------------------------------------------------------
    @property
    def calls(self) -> int:
        """cProfile mode: the task calls profiled, over every worker."""
        return sum(p["rounds"] for p in self.processes if p["worker_id"])

    def pstats(self, stream: Any = None) -> pstats.Stats:
        """cProfile mode: every worker's stats merged, as one :class:`pstats.Stats`."""
        if self.mode != "cprofile":
            raise ValueError("this profile sampled stacks; cProfile statistics come from "
                             "profile_tasks(mode=\"cprofile\") or `lightwork profile "
                             "--mode cprofile`")
        stats: dict[tuple[str, int, str], Any] = {}
        for file, line, name, cc, nc, tt, ct, callers in self._stats_rows:
            stats[(file, line, name)] = (cc, nc, tt, ct, {
                (c[0], c[1], c[2]): tuple(c[3:]) for c in callers})
        return pstats.Stats(_Loaded(stats), stream=stream)  # type: ignore[arg-type]

    def print_stats(self, *restrictions: Any, sort: str = "cumulative",
                    stream: Any = None) -> None:
        """cProfile mode: print the merged stats as ``pstats`` does, sorted by ``sort``;
        ``restrictions`` as ``pstats.Stats.print_stats``' (a count, a fraction, a regex)."""
        self.pstats(stream).strip_dirs().sort_stats(sort).print_stats(*restrictions)

    def dump_stats(self, path: str) -> None:
        """cProfile mode: write the merged stats in pstats' file format
        (``python -m pstats FILE``, snakeviz)."""
        self.pstats().dump_stats(path)

    def __repr__(self) -> str:
        if self.mode == "cprofile":
            return (f"TaskProfile(cprofile, {self.calls} calls, {len(self._stats_rows)} "
                    f"functions, {len(self.processes) - 1} workers)")
        return (f"TaskProfile({self.total} samples, {len(self.labels)} task functions, "
                f"{len(self.workers)} workers)")


class _Loaded:
    """What ``pstats.Stats`` loads a dict from (its ``create_stats``/``stats`` protocol)."""

    def __init__(self, stats: dict[tuple[str, int, str], Any]) -> None:
        self.stats = stats

    def create_stats(self) -> None:
        pass


@contextlib.contextmanager
def profile_tasks(hz: float = 100.0, mode: str = "sample", memory: bool | str = False,
                  lines: list[Any] | None = None, native: bool = False
                  ) -> Iterator[TaskProfile]:
    """Profile the code of every running task while the block runs.

    ``mode="sample"`` samples the stacks of the tasks (and the driver) ``hz`` times a
    second; ``mode="cprofile"`` runs cProfile around every task and actor call in the
    workers (``prof.print_stats()``, ``prof.dump_stats(path)``). ``memory=True`` adds
    tracemalloc around every call: each task function's peak and the lines that
    allocated what its calls kept (``prof.memory_top()``); ``memory="memray"`` captures
    every worker's allocations with memray instead (the ``profile`` extra), for
    ``prof.memray_flamegraph(path)``. ``native=True`` samples the workers with py-spy
    instead, C frames included (py-spy installed, and allowed to ptrace them; on its
    own, in sampling mode). ``lines=[func, ...]`` times
    those functions line by line wherever tasks call them (line_profiler, the
    ``profile`` extra: ``prof.print_lines()``). The yielded :class:`TaskProfile` is
    empty inside the block and filled when it ends.
    """
    if memory not in (True, False, "memray"):
        raise ValueError(f"memory must be True (tracemalloc per call), \"memray\" (memray "
                         f"captures, a memory flame graph) or False; got {memory!r}")
    if memory == "memray" and mode == "cprofile":
        raise ValueError("memray and cProfile both need Python's profile hook, one at a "
                         "time: profile memory with memray in sampling mode, or use "
                         "memory=True (tracemalloc) with mode=\"cprofile\"")
    if mode not in ("sample", "cprofile"):
        raise ValueError(f"unknown profile mode {mode!r}; choose \"sample\" (stack "
                         "samples, a flame graph) or \"cprofile\" (every call counted)")
    from lightwork.api import core as _api
    from lightwork.kernel import control

    node = _api.run_record("profile_tasks()")  # (the cluster's: Dask's sampler, sampling only)
    if node is None:
        raise RuntimeError("no lightwork runtime is running in this process; call "
                           "lightwork.init() first (from another terminal, `lightwork "
                           "profile` attaches to a running program)")
    targets = line_targets(lines) if lines else []
    control.dispatch(node, "sample_start", {"hz": hz, "mode": mode, "memory": memory,
                                            "lines": targets, "native": bool(native)})
    profile = TaskProfile()
    try:
        yield profile
    finally:
        profile._fill(control.dispatch(node, "sample_stop", {}))


def _line_profiler() -> Any:
    try:
        import line_profiler
    except ImportError:
        raise ImportError("line timings need line_profiler: pip install "
                          "'lightwork[profile]' (or pip install line_profiler)") from None
    return line_profiler


def line_targets(functions: Any) -> list[list[Any]]:
    """``[file, first line, name]`` of each function (a plain function, a method, or a
    remote function): how the workers find their own copies of them."""
    _line_profiler()  # a clear error now, not from every worker
    if callable(functions) or not isinstance(functions, (list, tuple)):
        raise TypeError("lines must be a list of functions, as in lines=[parse, load]")
    targets = []
    for function in functions:
        inner = getattr(function, "_function", function)  # a remote function's own
        inner = getattr(inner, "__func__", inner)  # a bound or class method's
        code = getattr(inner, "__code__", None)
        if code is None:
            raise TypeError(f"cannot time {function!r} by line: give Python functions, "
                            "remote functions or an actor class's methods, as in "
                            "lines=[parse, MyActor.method]")
        targets.append([code.co_filename, code.co_firstlineno, code.co_name])
    return targets


def _split(frame: str) -> tuple[str, str]:
    """``"f (file.py:3)"`` -> ``("f", "file.py:3")``."""
    if frame.endswith(")") and " (" in frame:
        function, _, where = frame[:-1].rpartition(" (")
        return function, where
    return frame, ""


def _clean(frame: str) -> str:
    # The format's separators: ';' between frames, the last space before the count.
    return frame.replace(";", ",").replace("\n", " ")


def _listed(node: dict[str, Any]) -> dict[str, Any]:
    children = sorted(node["children"].values(), key=lambda c: -c["value"])
    return {"name": node["name"], "value": node["value"],
            "children": [_listed(child) for child in children]}


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font:12px sans-serif;margin:12px}
#graph{position:relative;width:100%}
.box{position:absolute;height:17px;line-height:17px;overflow:hidden;white-space:nowrap;
box-sizing:border-box;border:1px solid #fff;padding:0 3px;cursor:pointer;border-radius:2px}
#info{height:18px;margin:6px 0;font-family:monospace}
</style></head><body>
<h3>__TITLE__</h3>
<label>Tree: <select id="pick"></select></label> <button id="reset">Reset zoom</button>
<div id="info"></div><div id="graph"></div>
<script>
const DATA = __DATA__;
const pick = document.getElementById("pick"), graph = document.getElementById("graph");
const info = document.getElementById("info");
for (const name of Object.keys(DATA.trees)) {
  const o = document.createElement("option"); o.value = o.textContent = name; pick.appendChild(o);
}
function color(name) {
  let h = 0; for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return "hsl(" + (10 + h % 40) + ",85%," + (55 + h % 15) + "%)";
}
function depth(n) { return 1 + Math.max(0, ...n.children.map(depth)); }
function draw(root) {
  graph.innerHTML = "";
  const rows = depth(root), total = root.value;
  graph.style.height = (rows * 18) + "px";
  function place(n, x, d) {
    const w = n.value / total;
    if (w < 0.002) return;
    const b = document.createElement("div");
    b.className = "box"; b.textContent = n.name;
    b.style.left = (100 * x) + "%"; b.style.width = (100 * w) + "%";
    b.style.top = ((rows - d - 1) * 18) + "px"; b.style.background = color(n.name);
    b.onmouseover = () => { info.textContent = n.name + ": " + n.value + " samples, " +
      (n.value / DATA.hz).toFixed(2) + " s, " + (100 * w).toFixed(1) + "%"; };
    b.onclick = () => draw(n);
    graph.appendChild(b);
    let cx = x;
    for (const c of n.children) { place(c, cx, d + 1); cx += c.value / total; }
  }
  place(root, 0, 0);
}
pick.onchange = () => draw(DATA.trees[pick.value]);
document.getElementById("reset").onclick = () => draw(DATA.trees[pick.value]);
draw(DATA.trees[pick.value]);
</script></body></html>
"""
