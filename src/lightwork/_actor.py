"""``@remote`` on a class: actors.

Actors (stateful worker processes with Ray's actor API) are the next piece of the runtime
to land. Until then, decorating a class says so at the decoration site, so a program
that needs actors fails at once with a message instead of half-way through a run.
"""

from __future__ import annotations

from typing import Any


def make_actor_class(cls: type, options: dict[str, Any]) -> Any:
    raise TypeError(
        f"@remote on class {cls.__qualname__}: actors are not available in this lightwork "
        "release yet (tasks, objects and the diagnostics are). Run the class's methods "
        "inside remote functions for now, or use Ray for actor code."
    )
