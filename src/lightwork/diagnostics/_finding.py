"""What the advisor reports: a :class:`Finding` (what was seen, where, the fix, its
cost so far), and how findings are ranked and their figures written."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Finding:
    kind: str
    title: str
    evidence: dict[str, Any]
    suggestion: str
    callsite: tuple[str, int, str] | None = None
    seen_at: float = field(default_factory=time.monotonic)
    # Seconds the mistake has cost the program so far, as measured (0.0: not a time:
    # memory held, a setting); ``advise()`` ranks findings by it. A finding whose
    # evidence keeps growing (a loop still running) updates it.
    cost_s: float = 0.0

    def cost(self) -> str:
        """The cost so far in words ("" when it is not a time)."""
        if self.cost_s <= 0:
            return ""
        return f"cost so far: {_duration(self.cost_s)}"

    def where(self) -> str:
        if self.callsite is None:
            return "(no call site)"
        filename, line, function = self.callsite
        return f"{filename}:{line} in {function}"

    def message(self) -> str:
        return f"[{self.kind}] {self.title} at {self.where()}. Fix: {self.suggestion}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "title": self.title, "evidence": self.evidence,
            "suggestion": self.suggestion,
            "callsite": list(self.callsite) if self.callsite else None,
            "seen_at": self.seen_at, "cost_s": self.cost_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """The inverse of :meth:`as_dict` (for findings that travelled as JSON)."""
        callsite = data.get("callsite")
        return cls(
            str(data["kind"]), str(data["title"]), dict(data.get("evidence") or {}),
            str(data.get("suggestion", "")),
            (str(callsite[0]), int(callsite[1]), str(callsite[2])) if callsite else None,
            float(data.get("seen_at") or 0.0), float(data.get("cost_s") or 0.0),
        )



def ranked(findings: list[Finding]) -> list[Finding]:
    """``findings``, the costliest first (those with no time cost keep their order, last)."""
    return sorted(findings, key=lambda finding: -finding.cost_s)


def _duration(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    return f"{seconds * 1e3:.0f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
