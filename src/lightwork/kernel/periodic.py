"""A daemon thread that does one round of work every few seconds until stopped.

Used by the runtime's watchers that look at the world on a clock rather than on events:
the memory monitor (``memory_monitor.py``) and the advisor
(``lightwork.diagnostics.advisor``, a tool above the kernel, which subclasses nothing
but uses this thread). The thread owns nothing: each round calls its owner's ``work``, which takes
whatever lock it needs. It sleeps on an ``Event`` so ``stop`` ends it at once rather than
after the rest of an interval; ``stop`` joins it for a bounded time (it may be called
from the thread itself, from a round that ends the runtime).

A round that raises does not kill the thread silently: ``on_error`` gets the exception
and says whether to go on (True) or end the thread (False).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

STOP_JOIN_S = 2.0  # a round in progress may take this long to finish at stop


class PeriodicThread:
    """Call ``work()`` every ``interval_s`` seconds in a daemon thread named ``name``."""

    def __init__(self, name: str, interval_s: float, work: Callable[[], object],
                 on_error: Callable[[Exception], bool]) -> None:
        self.name = name
        self.interval_s = interval_s
        self._work = work
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=STOP_JOIN_S)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._work()
            except Exception as error:  # noqa: BLE001 - the owner decides (on_error)
                if not self._on_error(error):
                    return
