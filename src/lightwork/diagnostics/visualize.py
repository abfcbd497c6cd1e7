"""Bokeh plots of profiler results, as Dask draws them, stacked on one time axis.

* tasks: one rectangle per task, one row per worker (rows ordered by busy time), one
  colour per *task group* — the function: Dask's ``key_split`` of the key for graph
  keys (``'random_sample-3f2a…'`` → ``random_sample``), the function name for plain
  lightwork tasks — not one colour per task; hover shows key and task;
* resources: % CPU on the left axis, memory (MB) on the right;
* cache: for each task group, the sum of the metric over its values in the cache.

bokeh is optional (``pip install 'lightwork[viz]'``) and imported only here.
"""

from __future__ import annotations

import random
import re
import warnings
from collections import defaultdict
from itertools import accumulate, cycle
from typing import Any

from lightwork.diagnostics.profilers import CacheData, ResourceData, TaskData

__all__ = ["plot_cache", "plot_resources", "plot_tasks", "visualize"]

BOKEH_MISSING = ("lightwork's profile plots need bokeh: install it with "
                 "pip install 'lightwork[viz]' (or pip install 'bokeh>=3.1')")
_HEX = re.compile(r"^[0-9a-f]{8,}$")


def _bokeh() -> Any:
    try:
        import bokeh.plotting as bp
    except ImportError as exc:
        raise ImportError(BOKEH_MISSING) from exc
    return bp


def visualize(profilers: Any, filename: str = "profile.html", show: bool = True,
              save: bool | None = None, mode: str | None = None, **kwargs: Any) -> Any:
    """Plot one profiler or a list of them (stacked, sharing the time axis).

    ``show`` opens the plot in a browser; ``save`` (default: when not in a notebook)
    writes it to ``filename``; ``mode`` goes to ``bokeh.io.output_file``; other keyword
    arguments go to ``bokeh.plotting.figure``. Returns the bokeh layout. ``file_path``,
    Dask's old name for ``filename``, still works and warns as Dask does.
    """
    bp = _bokeh()
    if "file_path" in kwargs:
        warnings.warn(
            "visualize(file_path=...) is deprecated; pass filename=... instead (as in Dask)",
            FutureWarning, stacklevel=2)
        filename = kwargs.pop("file_path")
    from bokeh.io import state as io_state

    if save is None:
        save = not io_state.curstate().notebook
    if not isinstance(profilers, list):
        profilers = [profilers]
    if not profilers:
        raise ValueError("visualize() needs at least one profiler")
    for prof in profilers:
        if not hasattr(prof, "_plot"):
            raise TypeError(f"visualize() takes Profiler, ResourceProfiler and CacheProfiler "
                            f"objects, got {type(prof).__name__}")
    figures = [prof._plot(**kwargs) for prof in profilers]
    if len(figures) == 1:
        layout = figures[0]
    else:
        for fig in figures[1:]:
            fig.x_range = figures[0].x_range
            fig.title = None
            fig.min_border_top = 20
            fig.height -= 30
        for fig in figures[:-1]:
            fig.xaxis.axis_label = None
            fig.min_border_bottom = 20
            fig.height -= 30
        for fig in figures:
            fig.min_border_left = fig.min_border_right = 75
        layout = bp.gridplot([[fig] for fig in figures])
    if show:
        bp.show(layout)
    if save:
        bp.output_file(filename, mode=mode)
        bp.save(layout)
    return layout


def _as(record_type: Any, results: Any) -> list[Any]:
    """``results`` as ``record_type`` tuples: Dask's plots take plain tuples in its
    fields' order too (its own tests pass them), so these do."""
    return [r if type(r) is record_type else record_type(*r) for r in results]


def _figure_defaults(kwargs: dict[str, Any], tools: str) -> dict[str, Any]:
    options: dict[str, Any] = {"title": "Profile Results", "tools": tools,
                               "toolbar_location": "above", "width": 800, "height": 300}
    if "plot_width" in kwargs:
        kwargs["width"] = kwargs.pop("plot_width")
    if "plot_height" in kwargs:
        kwargs["height"] = kwargs.pop("plot_height")
    kwargs.pop("label_size", None)
    options.update(kwargs)
    return options


def task_group(key: Any, task: Any = None) -> str:
    """The group a task is coloured by: its function, as its key or its call names it."""
    name = getattr(task, "name", None)
    if isinstance(name, str) and type(task).__name__ == "RemoteCall":
        return name
    try:
        from dask.utils import key_split

        return str(key_split(key))
    except ImportError:
        pass
    head = key[0] if isinstance(key, tuple) and key else key
    words = str(head).split("-")
    kept = [words[0]] + [w for w in words[1:] if w.isalpha() and not _HEX.match(w)]
    return "-".join(kept).strip("_'()\"") or "task"


def _colors(palette: str, groups: list[str]) -> list[str]:
    from bokeh import palettes

    names = sorted(set(groups))
    sized = palettes.all_palettes[palette]
    size = min((n for n in sorted(sized) if n >= len(names)), default=max(sized))
    colors = list(dict.fromkeys(sized[size]))
    if len(colors) > len(names):
        random.Random(42).shuffle(colors)  # spread groups over the palette, repeatably
    lookup = dict(zip(names, cycle(colors)))
    return [lookup[g] for g in groups]


def _label(value: Any, size: int) -> str:
    text = repr(value)
    return text if len(text) <= size else text[: size - 3] + "..."


def plot_tasks(results: list[Any], start_time: float | None, end_time: float | None,
               palette: str = "Viridis", label_size: int = 60, **kwargs: Any) -> Any:
    bp = _bokeh()
    from bokeh.models import HoverTool

    options = _figure_defaults(kwargs, "hover,save,reset,xwheel_zoom,xpan")
    results = _as(TaskData, results)
    if results:
        start = start_time if start_time is not None else min(r.start_time for r in results)
        end = end_time if end_time is not None else max(r.end_time for r in results)
        busy: dict[Any, float] = defaultdict(float)
        for r in results:
            busy[r.worker_id] += r.end_time - r.start_time
        row = {w: n for n, w in enumerate(sorted(busy, key=busy.__getitem__, reverse=True))}
        fig = bp.figure(y_range=[str(i) for i in range(len(row))], x_range=[0, end - start],
                        **options)
        widths = [r.end_time - r.start_time for r in results]
        groups = [task_group(r.key, r.task) for r in results]
        source = bp.ColumnDataSource(data={
            "x": [w / 2 + r.start_time - start for w, r in zip(widths, results)],
            "y": [row[r.worker_id] + 1 for r in results],
            "width": widths,
            "color": _colors(palette, groups),
            "group": groups,
            "key": [_label(r.key, label_size) for r in results],
            "function": [_label(r.task, label_size) for r in results],
        })
        fig.rect(source=source, x="x", y="y", height=1, width="width", color="color",
                 line_color="gray")
    else:
        fig = bp.figure(y_range=[str(i) for i in range(8)], x_range=[0, 10], **options)
    fig.grid.grid_line_color = None
    fig.axis.axis_line_color = None
    fig.axis.major_tick_line_color = None
    fig.yaxis.axis_label = "Worker ID"
    fig.xaxis.axis_label = "Time (s)"
    hover = fig.select(HoverTool)
    hover.tooltips = [("Key", "@key"), ("Group", "@group"), ("Task", "@function")]
    hover.point_policy = "follow_mouse"
    return fig


def plot_resources(results: list[Any], start_time: float | None, end_time: float | None,
                   palette: str = "Viridis", **kwargs: Any) -> Any:
    bp = _bokeh()
    from bokeh import palettes
    from bokeh.models import LinearAxis, Range1d

    options = _figure_defaults(kwargs, "save,reset,xwheel_zoom,xpan")
    results = _as(ResourceData, results)
    if results:
        start = start_time if start_time is not None else results[0].time
        end = end_time if end_time is not None else results[-1].time
        times = [r.time - start for r in results]
        mem = [r.mem for r in results]
        cpu = [r.cpu for r in results]
        fig = bp.figure(y_range=(0, max(max(cpu), 100)), x_range=(0, max(end - start, 1)),
                        **options)
    else:
        times, mem, cpu = [], [], []
        fig = bp.figure(y_range=(0, 100), x_range=(0, 1), **options)
    colors = palettes.all_palettes[palette][6]
    fig.line(times, cpu, color=colors[0], line_width=4, legend_label="% CPU")
    fig.yaxis.axis_label = "% CPU"
    low = min(mem) if mem else 0
    high = max(mem) if mem else 100
    fig.extra_y_ranges = {"memory": Range1d(start=low, end=max(high, low + 100))}
    fig.line(times, mem, color=colors[2], y_range_name="memory", line_width=4,
             legend_label="Memory")
    fig.add_layout(LinearAxis(y_range_name="memory", axis_label="Memory (MB)"), "right")
    fig.xaxis.axis_label = "Time (s)"
    return fig


def plot_cache(results: list[Any], start_time: float | None, end_time: float | None,
               metric_name: str, palette: str = "Viridis", label_size: int = 60,
               **kwargs: Any) -> Any:
    bp = _bokeh()
    from bokeh.models import HoverTool

    options = _figure_defaults(kwargs, "hover,save,reset,wheel_zoom,xpan")
    results = _as(CacheData, results)
    if results:
        start = start_time if start_time is not None else min(r.cache_time for r in results)
        end = end_time if end_time is not None else max(r.free_time for r in results)
        tics = sorted({r.cache_time for r in results} | {r.free_time for r in results})
        by_group: dict[str, dict[float, float]] = defaultdict(lambda: dict.fromkeys(tics, 0))
        for r in results:
            changes = by_group[task_group(r.key, r.task)]
            changes[r.cache_time] += r.metric
            changes[r.free_time] -= r.metric
        xs = [0.0] + [t - start for t in tics]
        fig = bp.figure(x_range=[0, end - start], **options)
        groups = list(by_group)
        for group, color in zip(groups, _colors(palette, groups)):
            changes = by_group[group]
            ys = [0.0] + list(accumulate(changes[t] for t in tics))
            fig.line("x", "y", line_color=color, line_width=3, source=bp.ColumnDataSource(
                {"x": xs, "y": ys, "label": [_label(group, label_size)] * len(xs)}))
    else:
        fig = bp.figure(y_range=[0, 10], x_range=[0, 10], **options)
    fig.yaxis.axis_label = f"Cache Size ({metric_name})"
    fig.xaxis.axis_label = "Time (s)"
    hover = fig.select(HoverTool)
    hover.tooltips = [("Task", "@label")]
    return fig
