"""Which versions of distributed the backend runs on, and the private parts it relies on.

The backend uses distributed's public API (``Client``, ``Future``, ``Variable``,
``Queue``, datasets, topics, ``client.run``/``run_on_scheduler``, scheduler and worker
plugins) and, on the scheduler, its documented state (``Scheduler.workers``/``tasks``, their
``WorkerState``/``TaskState`` fields). A few things have no public equivalent that does
the same job at the same cost; each is listed in :data:`PRIVATE_PARTS` with why:

* ``Client._send_to_scheduler`` with ``client-desires-keys`` (``cluster._on_borrow``): a
  ``Future`` made from a key in another process (a borrowed ref) counts only locally;
  the message makes the scheduler keep the key for this client. The public routes
  (``Variable``, ``Queue``, datasets) cost a round trip per borrowed ref;
* ``Actor._worker_rpc`` and ``Actor._io_loop`` (``cluster_actor_calls._send``): an actor
  call as one RPC whose reply resolves a ``concurrent.futures.Future`` from a done
  callback. The public ``ActorFuture`` has no callback, so ``wait`` would poll;
* ``Actor._address`` (``cluster_actor_calls``): the worker holding an actor, to watch it
  for a restart and to tell a restarted actor's proxy from the lost one's. The public
  ``client.who_has`` is a round trip, and it is needed on the event loop.

(An actor's liveness reads the actor key's ``Future``, which this process holds anyway,
not the proxy's private one. A task failed with ``KilledWorker`` is heard through a
scheduler plugin publishing those failures on a topic, ``cluster_plugin.TaskErrors``,
with the public plugin and topic API, not the client's private ``task-erred`` stream
handler.)

:func:`check` runs at ``init`` (driver) and when a worker makes its backend: a
distributed outside :data:`SUPPORTED`, or one lacking any of those parts, fails there with
an error naming the range, instead of deep inside a call later. Versions newer than the
newest tested are allowed as long as the parts are there (the check is structural); the
range in the message is the one the test suite runs on (``make test``: the newest
release and the oldest supported, ``.venv-oldest-dask``).
"""

from __future__ import annotations

from typing import Any

#: The oldest distributed supported, and the newest the suite was run on.
OLDEST = "2024.11.1"
NEWEST_TESTED = "2026.8.0"
SUPPORTED = f"distributed {OLDEST} to {NEWEST_TESTED}"

#: (where, what it is for) of each private part, checked by :func:`check`.
PRIVATE_PARTS: tuple[tuple[str, str], ...] = (
    ("Client._send_to_scheduler", "keeping borrowed refs alive"),
    ("Actor._worker_rpc", "actor calls"),
    ("Actor._io_loop", "actor calls"),
    ("Actor._address", "watching an actor's worker for restarts"),
)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def missing_parts(distributed: Any) -> list[str]:
    """The private parts this distributed lacks (checked on its classes: nothing is
    built or connected to find out)."""
    from distributed.actor import Actor

    missing = []
    client_class = distributed.Client
    if not callable(getattr(client_class, "_send_to_scheduler", None)):
        missing.append("Client._send_to_scheduler")
    for name in ("_worker_rpc", "_io_loop"):
        if not isinstance(getattr(Actor, name, None), property):
            missing.append(f"Actor.{name}")
    # Set in Actor.__init__: read from its code, so nothing is built to find out.
    assigned = getattr(getattr(Actor.__init__, "__code__", None), "co_names", ())
    if "_address" not in assigned:
        missing.append("Actor._address")
    return missing


def check(distributed: Any) -> None:
    """Fail now, saying why, if this distributed cannot run the backend."""
    version = getattr(distributed, "__version__", "0")
    if _version_tuple(version) < _version_tuple(OLDEST):
        raise ImportError(
            f"lightwork's distributed backend needs {SUPPORTED}; this is distributed "
            f"{version}: pip install 'distributed>={OLDEST}' (or 'lightwork[cluster]')")
    missing = missing_parts(distributed)
    if missing:
        uses = dict(PRIVATE_PARTS)
        what = "; ".join(f"{name} ({uses.get(name, '')})" for name in missing)
        raise ImportError(
            f"lightwork's distributed backend supports {SUPPORTED}; distributed {version} "
            f"lacks what it relies on: {what}. Install a supported version, e.g. pip "
            f"install 'distributed=={NEWEST_TESTED}'")
