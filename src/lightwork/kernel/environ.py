"""Settings read from the environment: lightwork's variable first, then Ray's name for
the same setting, so a Ray program's environment keeps working unchanged.

Each setting is read where it is used (once a process, or at ``init``); this module
owns only how a value is looked up and how a bad one is refused: an error that names
the variable and what it should hold, never a silent default.
"""

from __future__ import annotations

import os
from typing import Callable, TypeVar

T = TypeVar("T")


def setting(variables: tuple[str, ...], parse: Callable[[str], T], holds: str) -> T | None:
    """The first of ``variables`` set (and not empty), parsed; None if none is set.
    A value ``parse`` refuses raises ``ValueError``: "NAME='text' is not ``holds``"."""
    for variable in variables:
        text = os.environ.get(variable)
        if text:
            try:
                return parse(text)
            except ValueError:
                raise ValueError(f"{variable}={text!r} is not {holds}") from None
    return None


#: Ray waits this long before retrying a task that raised one of its retry_exceptions.
DEFAULT_RETRY_DELAY_MS = 1000


def retry_delay_from_env() -> float:
    """The wait before a retry for ``retry_exceptions``, in seconds:
    ``LIGHTWORK_TASK_RETRY_DELAY_MS``, else Ray's ``RAY_task_retry_delay_ms``, else 1 s."""
    variables = ("LIGHTWORK_TASK_RETRY_DELAY_MS", "RAY_task_retry_delay_ms")
    value = setting(variables, float, "a number of milliseconds")
    if value is None:
        return DEFAULT_RETRY_DELAY_MS / 1000.0
    if value < 0:
        variable = next(v for v in variables if os.environ.get(v))
        raise ValueError(f"{variable} must be >= 0 milliseconds, got {os.environ[variable]}")
    return value / 1000.0
