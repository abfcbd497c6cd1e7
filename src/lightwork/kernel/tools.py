"""Where the tools floor plugs into the layers below it.

Two tools are used from below: the advisor (``lightwork.diagnostics.advisor``), which
engines build for a run and whose findings the views read, and the live dashboard
(``lightwork.dashboard``), which ``init(dashboard=True)`` starts. The layers below must
not import upward, so each registers itself here when it loads (the driver's
``import lightwork`` loads both), and the layers below ask for it. A tool that was never
loaded (in a worker process, or a program that imported only the kernel) is simply not
there: a run then has no advisor, and ``init(dashboard=True)`` says why it has none.
"""

from __future__ import annotations

from typing import Any

_advisor: Any = None


def register_advisor(module: Any) -> None:
    """The advisor module offers ``Advisor``, ``current_findings`` and
    ``analysis_input`` to the engines and the views."""
    global _advisor
    _advisor = module


def advisor() -> Any:
    """The registered advisor module (RuntimeError if none loaded)."""
    if _advisor is None:
        raise RuntimeError("lightwork's advisor is not loaded: import lightwork first")
    return _advisor


def advisor_loaded() -> bool:
    return _advisor is not None


_dashboard_starter: Any = None


def register_dashboard(start: Any) -> None:
    """``start(control_socket_path, port)`` starts a dashboard process for a session and
    returns its handle (``url``, ``stop()``, ``final_sync()``)."""
    global _dashboard_starter
    _dashboard_starter = start


def dashboard_starter() -> Any:
    """The registered dashboard starter, or None."""
    return _dashboard_starter
