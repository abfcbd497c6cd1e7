"""``lightwork dashboard --from FILE``: the dashboard of a program that already ended.

A timeline file written by ``lightwork.timeline(FILE)``, ``lightwork timeline -o FILE``
or the dashboard's "download trace" carries the event log as the advisor reads it
(``otherData.advisor_input``: every task record and blocked span the log held). This
module turns it into one sync reply, as the driver would have sent, and applies it to a
fresh :class:`Mirror`, which is then marked ended: every view that reads the mirror
works (overview, task stream over the last seconds of the recording, tasks, functions);
those that need the live program (stacks, objects, trace) say it is not running. The
file is JSON: nothing in it is unpickled.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from lightwork.kernel.events import TaskRecord
from lightwork.dashboard import feed
from lightwork.dashboard.mirror import Mirror
from lightwork.diagnostics.timeline import read_saved

_RECORD_FIELDS = {f.name for f in fields(TaskRecord)}


def load(path: str) -> Mirror:
    """A mirror holding what the timeline file ``path`` recorded, marked ended."""
    other, data = read_saved(path)
    try:
        records = [_record(row) for row in data["tasks"] if isinstance(row, dict)]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: a task record of its event log is malformed ({exc})") from None
    base = float(data.get("started_at") or 0.0)
    spans = [[s.get("kind"), s.get("start"), s.get("end"), s.get("object_count"),
              s.get("thread_id"), feed._where(s.get("callsite"))]
             for s in data.get("spans", []) if isinstance(s, dict)]
    ends = [r.stored or r.finished for r in records] + [s[2] or 0.0 for s in spans]
    dropped = other.get("dropped") or {}
    task_facts, attached = feed.pack(records)
    reply: dict[str, Any] = {
        "session": str(other.get("session") or path), "now": max(ends, default=base),
        "base": base, "base_wall": float(other.get("started_at_unix_s") or 0.0),
        "budget": int(other.get("event_budget") or max(1, len(records))), "cost_s": 0.0,
        "tasks": {"cursor": len(records), "lost": int(dropped.get("tasks") or 0),
                  **task_facts},
        "spans": {"cursor": len(spans), "lost": 0, "rows": spans},
        "live": {"counts": {}, "rows": [], "total": 0},
        "resources": {"CPU": [0.0, float(data.get("cpus") or 0.0)]},
        "workers": [], "known_workers": {}, "actors": [], "actor_count": 0, "store": {},
        "findings": other.get("findings") or [], "progress": [],
    }
    mirror = Mirror()
    mirror.apply(reply, b"".join(attached))
    mirror.mark_ended(f"replayed from {path}; the program is not running")
    return mirror


def _record(row: dict[str, Any]) -> TaskRecord:
    known = {k: v for k, v in row.items() if k in _RECORD_FIELDS}
    for key in ("retries", "large_args", "dep_tasks", "callsite"):
        if isinstance(known.get(key), list):
            known[key] = _tuples(known[key])
    return TaskRecord(**known)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
