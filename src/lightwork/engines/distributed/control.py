"""The ``lightwork`` command from another terminal, for a program on the cluster backend.

The embedded runtime serves ``lightwork status|list|summary|memory|timeline|stack``
through a control socket in its session directory (``kernel/control.py``); the
command finds the newest session of the user under ``sessions_root()`` by the socket's
presence and by the driver pid at the end of the directory's name. A driver on the
cluster backend does the same, so the command works unchanged:

* :func:`open_session` makes a session directory of the same shape
  (``<tmp>/lightwork-<uid>/session_<time>_<µs>_<pid>``, mode 0700), with none of the
  embedded runtime's shared-memory or spill directories: objects live on the cluster.
  If the driver dies without shutting down, the next ``init`` on this machine removes
  it (its pid is gone), as for a local session.
* The control server is the embedded runtime's own ``ControlServer`` (same socket,
  permissions, peer-uid check and JSON protocol), given the run's ``ClusterLog``: its
  ``dispatch`` hands every operation to ``ClusterLog.answer_query``, which answers from
  the cluster (through the engine's ``client.run``/``run_on_scheduler``, never ssh).

The server's CPU/memory sampler sees only the driver here (the log has no worker
processes of its own); workers' usage comes from their own metrics in ``list_workers``.
"""

from __future__ import annotations

import os
import shutil
import time
from types import SimpleNamespace
from typing import Any


def open_session() -> SimpleNamespace:
    """A new session directory for this driver (see the module docstring)."""
    from lightwork.kernel.session import remove_stale_sessions, sessions_root

    remove_stale_sessions()
    name = (time.strftime("session_%Y-%m-%d_%H-%M-%S_")
            + f"{time.monotonic_ns() % 1000000:06d}_{os.getpid()}")
    root = sessions_root()
    os.makedirs(root, mode=0o700, exist_ok=True)
    directory = os.path.join(root, name)
    os.mkdir(directory, 0o700)
    return SimpleNamespace(name=name, directory=directory)


def serve(log: Any) -> Any:
    """Open a session directory for ``log`` and start its control server; returns the
    server (its ``error`` says why there is no socket, if none). Never raises: a program
    without a control socket still runs."""
    from lightwork.kernel import control

    try:
        log.session = open_session()
    except OSError as exc:
        return SimpleNamespace(error=f"no session directory: {exc}", stop=lambda: None,
                               path=None)
    return control.start(log)


def close(log: Any, server: Any) -> None:
    """Stop the server and remove the session directory."""
    if server is not None:
        server.stop()
    directory = getattr(log.session, "directory", None)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
