"""The engines' one door: :func:`open_backend` makes the backend an address names.

The API calls only this package's functions; each engine implements the
:class:`~lightwork.kernel.backend.Backend` interface and is imported here, lazily (so
``distributed`` loads only for a cluster). ``init(address=...)`` picks one through
:func:`parse_address`:

* ``"local"``, or ``None`` and ``"auto"`` when ``LIGHTWORK_ADDRESS`` is not set: the
  embedded runtime;
* ``"tcp://host:port"`` (any ``scheme://`` distributed speaks, e.g. ``tls://``), the path
  of a scheduler file, or a ``distributed.Client``: an existing Dask cluster;
* ``"local-cluster"``: a ``distributed.LocalCluster`` of worker processes on this
  machine, started by ``init`` and closed by ``shutdown``, for trying the cluster path.

``LIGHTWORK_ADDRESS`` in the environment is used when ``init`` gets no address, as
``RAY_ADDRESS`` is by Ray. ``distributed`` is imported only when a cluster address is
given (install ``lightwork[cluster]``).
"""

from __future__ import annotations

import os
from typing import Any

from lightwork.kernel.backend import Backend, SessionOptions

__all__ = ["Backend", "SessionOptions", "open_backend", "parse_address"]

LOCAL_ADDRESSES = (None, "", "local", "auto")


def parse_address(address: Any) -> tuple[str, Any]:
    """(backend name, target): ``("local", None)`` or ``("distributed", target)``.

    ``target`` is a ``distributed.Client``, ``"local-cluster"``, a scheduler address or a
    scheduler file's path. Raises ValueError naming the accepted forms.
    """
    if address in (None, "auto"):  # as Ray reads RAY_ADDRESS; "local" means local
        address = os.environ.get("LIGHTWORK_ADDRESS") or None
    if address in LOCAL_ADDRESSES:
        return "local", None
    if type(address).__name__ == "Client" and type(address).__module__.startswith("distributed"):
        return "distributed", address
    if not isinstance(address, str):
        raise TypeError(
            f"address must be a string or a distributed.Client, got "
            f"{type(address).__name__}: {address!r:.80}")
    if address == "local-cluster" or "://" in address or os.path.isfile(address):
        return "distributed", address
    raise ValueError(
        f"address={address!r} is not one lightwork knows: use None for the embedded "
        "runtime, 'tcp://host:port' for a Dask scheduler, the path of an existing scheduler "
        "file, a distributed.Client, or 'local-cluster' to start one on this machine")


def open_backend(name: str, target: Any, options: SessionOptions) -> Backend:
    """Start (or connect) the backend ``parse_address`` named, for a new session."""
    if name == "distributed":
        from lightwork.engines.distributed.backend import DistributedBackend

        return DistributedBackend.open(target, options)
    from lightwork.engines.local.backend import LocalBackend

    return LocalBackend.open(options)
