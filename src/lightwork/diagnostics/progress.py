"""``ProgressBar``: Dask's text progress bar, for Dask graphs and plain lightwork tasks.

The text is Dask's, character for character: ``\\r[####    ] | 42% Completed | 1.23 s``
redrawn every ``dt`` seconds by a daemon thread once ``minimum`` seconds have passed,
then a final bar and a newline when the run finishes (the line is always finished, so
the next log line starts clean). Progress is ``finished / (ready + waiting + running +
finished)`` read from Dask's state under Dask's schedulers (``start_state``); lightwork's
runs hand the bar a ``progress()`` that counts for it (``_start_progress``). It has no
per-task hook, so it adds nothing to each task.

In Jupyter (an IPython kernel with ``ipywidgets``) and with no ``out`` given, the bar is
a widget instead of text. ``clock`` (keyword only) is injectable for tests; it must be
the clock the run's times use (``time.monotonic``, which on Linux is also Dask's
``default_timer``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from lightwork.diagnostics.callbacks import Callback, state_progress

__all__ = ["ProgressBar", "format_time"]


def format_time(seconds: float) -> str:
    """Seconds as Dask's ``format_time`` writes them: '123.45 us', '1.23 ms', '4.56 s',
    '20m 34s', '3hr 25m', '14d 6hr'."""
    n = seconds
    if n > 2 * 86400:
        days = int(n / 86400)
        return f"{days}d {int((n - days * 86400) / 3600)}hr"
    if n > 2 * 3600:
        hours = int(n / 3600)
        return f"{hours}hr {int((n - hours * 3600) / 60)}m"
    if n > 600:
        minutes = int(n / 60)
        return f"{minutes}m {int(n - minutes * 60)}s"
    if n >= 1:
        return f"{n:.2f} s"
    if n >= 1e-3:
        return f"{n * 1e3:.2f} ms"
    return f"{n * 1e6:.2f} us"


def _no_progress() -> tuple[int, int]:
    return 0, 0


class ProgressBar(Callback):
    """A progress bar on ``out`` (default ``sys.stdout``) while a computation runs."""

    _run_needs = "tasks"  # reads progress counts, never dsk or state

    def __init__(self, minimum: float = 0, width: int = 40, dt: float = 0.1,
                 out: IO[str] | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._minimum = minimum
        self._width = width
        self._dt = dt
        self._use_widget = out is None and _in_notebook()
        self._file = sys.stdout if out is None else out
        self._clock = clock
        self._progress: Callable[[], tuple[int, int]] = _no_progress
        self._start_time = 0.0
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self._widget: Any = None
        self.last_duration = 0.0

    def _start(self, dsk: Any) -> None:
        self._progress = _no_progress
        self._start_time = self._clock()
        self._stop = threading.Event()
        self._timer = threading.Thread(target=self._tick, name="lightwork-progress", daemon=True)
        self._timer.start()

    def _start_state(self, dsk: Any, state: dict[str, Any]) -> None:
        """Under Dask's own schedulers: progress read from Dask's state."""
        self._progress = lambda: state_progress(state)

    def _start_progress(self, progress: Callable[[], tuple[int, int]]) -> None:
        """Under lightwork's: the run counts for us."""
        self._progress = progress

    def _finish(self, dsk: Any, state: dict[str, Any], errored: bool) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
            self._timer = None
        elapsed = self._clock() - self._start_time
        self.last_duration = elapsed
        done, total = self._progress()
        self._progress = _no_progress  # let go of the run (it holds this bar: a cycle)
        if elapsed < self._minimum:
            return
        if not errored:
            self._draw(done / total if total else 1.0, elapsed)
        elif done < total:
            self._draw(done / total, elapsed)
        if self._widget is None:
            with contextlib.suppress(ValueError):  # the stream was closed under us
                self._file.write("\n")
                self._file.flush()
        self._widget = None

    def _tick(self) -> None:
        while not self._stop.is_set():
            elapsed = self._clock() - self._start_time
            if elapsed > self._minimum:
                done, total = self._progress()
                if not total:
                    self._draw(0, elapsed)
                elif done < total:
                    self._draw(done / total, elapsed)
            self._stop.wait(self._dt)

    def _draw(self, fraction: float, elapsed: float) -> None:
        if self._use_widget:
            self._draw_widget(fraction, elapsed)
            return
        bar = "#" * int(self._width * fraction)
        line = f"\r[{bar:<{self._width}}] | {int(100 * fraction)}% Completed | {format_time(elapsed)}"
        with contextlib.suppress(ValueError):
            self._file.write(line)
            self._file.flush()

    def _draw_widget(self, fraction: float, elapsed: float) -> None:
        if self._widget is None:
            import ipywidgets
            from IPython.display import display

            bar = ipywidgets.FloatProgress(min=0, max=1)
            label = ipywidgets.HTML()
            self._widget = (bar, label)
            display(ipywidgets.HBox([bar, label]))
        bar, label = self._widget
        bar.value = fraction
        label.value = f"{int(100 * fraction)}% Completed | {format_time(elapsed)}"


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
        if ip is None or type(ip).__name__ != "ZMQInteractiveShell":
            return False
        import ipywidgets  # noqa: F401
    except Exception:  # noqa: BLE001 - anything off: plain text
        return False
    return True
