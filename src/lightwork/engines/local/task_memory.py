"""A worker's resident memory across one call: its peak during the call and its change.

Read from ``/proc``, with no tracing: the call runs as it would. The worker reads it
for the calls it reads the CPU clock for (``worker.py``: a function whose last run here
took ``CPU_CLOCK_MIN_S`` or more, or its first run here), so a no-op task pays nothing;
a task record's ``rss_peak`` stays 0 ("not measured") for the others.

How the peak of one call is had, not the process's lifetime peak: writing ``5`` to
``/proc/<pid>/clear_refs`` (Linux 4.0 on) sets the process's high-water mark of
resident memory to what is resident now; after the call, the mark is the call's peak.
The mark is read through ``getrusage`` (a syscall, ~1.5 µs) rather than ``VmHWM`` in
``/proc/<pid>/status`` (a file the kernel formats whole, ~15 µs), with one catch:
``ru_maxrss`` is the larger of the mark and a value the kernel keeps for the process's
threads that have exited (set as each exits, never reset). So the probe reads
``ru_maxrss`` right after the reset too: if it is above what is resident, an exited
thread's old value hides the mark, and this call's peak is read from ``status``
instead. What is resident is ``statm``'s second field (pages), read with ``pread`` on
a descriptor kept open (~2 µs).

Where ``clear_refs`` cannot be written (an older kernel, a sandbox), the peak is the
larger of the readings before and after the call: a floor, said so in the docs. Off
Linux there is no ``/proc``: :func:`open_probe` returns None and nothing is measured.

The memory is the whole process's: calls running side by side in one threaded actor
share it, and each reports the process's peak.
"""

from __future__ import annotations

import os
import resource
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class MemoryProbe:
    """One worker's ``/proc`` readers (open for the process's life)."""

    def __init__(self, pid: int) -> None:
        self._statm = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
        self._status_path = f"/proc/{pid}/status"
        try:
            self._clear = os.open(f"/proc/{pid}/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            self._clear = -1
        self._getrusage = resource.getrusage
        self._exact = False

    def resident(self) -> int:
        """Bytes resident now."""
        return int(os.pread(self._statm, 128, 0).split()[1]) * _PAGE

    def before(self) -> int:
        """Just before a call: reset the peak; what is resident (bytes)."""
        if self._clear < 0:
            return self.resident()
        os.write(self._clear, b"5")
        marked = self._getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        resident = self.resident()
        self._exact = marked <= resident  # else an exited thread's value hides the mark
        return resident

    def after(self, before: int) -> tuple[int, int]:
        """Just after the call: ``(peak, change)`` in bytes."""
        resident = self.resident()
        if self._clear < 0:
            peak = max(before, resident)
        elif self._exact:
            peak = self._getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        else:
            peak = _status_peak(self._status_path)
        return max(peak, before, resident), resident - before


def _status_peak(path: str) -> int:
    try:
        with open(path, "rb") as f:
            text = f.read()
        start = text.index(b"VmHWM:") + 6
        return int(text[start:text.index(b"kB", start)]) * 1024
    except (OSError, ValueError):
        return 0


def open_probe() -> Any:
    """This process's probe, or None where ``/proc`` cannot be read."""
    try:
        return MemoryProbe(os.getpid())
    except (OSError, ValueError):
        return None
