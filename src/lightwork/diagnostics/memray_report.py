"""A memray flame graph of a task profile's merged allocations, by memray's reporter.

The engine reads each worker's capture and labels its allocations by task function
(``engines/local/memray_capture.py``); what reaches a :class:`TaskProfile` is the sum
over the workers of ``(label, frames, bytes, blocks)``. memray's flame graph reporter
takes allocation records: here each merged stack becomes one record whose outermost
frame is its task function (so the merged graph splits by task at its root) and whose
"thread" is that task function too (so memray's thread selector shows one task
function's allocations). The page is memray's own, written with its assets inline.
"""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightwork.diagnostics.task_profiler import TaskProfile

ROOT_FILE = "lightwork task"


class _Record:
    """What memray's reporter reads of an allocation record."""

    __slots__ = ("tid", "thread_name", "size", "n_allocations", "_stack")

    def __init__(self, tid: int, label: str, stack: list[tuple[str, str, int]],
                 size: int, count: int) -> None:
        self.tid = tid
        self.thread_name = label
        self.size = size
        self.n_allocations = count
        self._stack = stack

    def stack_trace(self, max_stacks: int | None = None) -> list[tuple[str, str, int]]:
        return self._stack if max_stacks is None else self._stack[:max_stacks]

    def hybrid_stack_trace(self, max_stacks: int | None = None) -> list[tuple[str, str, int]]:
        return self.stack_trace(max_stacks)


def write(profile: TaskProfile, path: str, leaks: bool = False) -> str:
    """Write the flame graph to ``path``; its absolute path."""
    from lightwork.engines.local.memray_capture import require

    require()
    from memray._metadata import Metadata
    from memray._memray import FileFormat
    from memray.reporters.flamegraph import FlameGraphReporter

    stacks = profile.memray_stacks(leaks)
    tids: dict[str, int] = {}
    records = []
    for label, frames, size, count in stacks:
        tid = tids.setdefault(label, len(tids) + 1)
        records.append(_Record(tid, label, [tuple(f) for f in frames]
                               + [(label, ROOT_FILE, 0)], size, count))
    workers = profile.memray.get("workers", [])
    ended = datetime.datetime.now(datetime.timezone.utc)
    metadata = Metadata(
        start_time=ended - datetime.timedelta(seconds=profile.duration), end_time=ended,
        total_allocations=sum(w.get("allocations", 0) for w in workers),
        total_frames=0, peak_memory=sum(size for _l, _f, size, _c in stacks),
        command_line=f"lightwork task profile: {len(workers)} workers, "
                     + ("still allocated at the end" if leaks else "at each worker's peak"),
        pid=os.getpid(), main_thread_id=0, python_allocator="pymalloc",
        has_native_traces=False, trace_python_allocators=False,
        file_format=FileFormat.ALL_ALLOCATIONS)
    reporter = FlameGraphReporter.from_snapshot(
        records, memory_records=[], native_traces=False)  # type: ignore[arg-type]
    with open(path, "w") as f:
        reporter.render(f, metadata, show_memory_leaks=leaks,
                        merge_threads=False, inverted=False, no_web=True)
    return os.path.abspath(path)
