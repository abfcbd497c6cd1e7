"""Types of ``lightwork._collector`` (``_collector.c``): see ``kernel/collector.py``."""

from typing import Any, final

def untrack(obj: object, /) -> None:
    """The collector no longer visits ``obj`` (no-op if it does not)."""

def track(obj: object, /) -> None:
    """The collector visits ``obj`` again (no-op if it does)."""

@final
class Maker:
    """``Maker(cls, names, defaults, required, untracked)``: calling it makes a slotted
    ``cls`` instance from its first fields' values, by position."""

    def __init__(
        self, cls: type, names: tuple[str, ...], defaults: tuple[Any, ...],
        required: int, untracked: bool,
    ) -> None: ...
    def __call__(self, *values: Any) -> Any: ...

@final
class RunSummer:
    """``RunSummer(cls, names)``: sums task records' runs inside a bucket (the
    advisor's tally)."""

    def __init__(self, cls: type, names: tuple[str, ...]) -> None: ...
    def __call__(
        self, records: list[Any], start: int, low: float, high: float, long_s: float,
        notable: list[int], /,
    ) -> tuple[float, int]: ...
