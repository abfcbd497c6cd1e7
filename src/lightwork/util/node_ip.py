"""``get_node_ip_address()``: the IP address of the machine the caller runs on, as the
cluster sees it (Ray's ``ray.util.get_node_ip_address``).

* Embedded runtime (or no runtime yet): ``"127.0.0.1"``, the address ``nodes()`` reports
  for its one node; everything runs on this machine and talks over local sockets.
* Dask cluster, inside a task or an actor: the host of the Dask worker running it.
* Dask cluster, in the driver: this machine's address on the route to the scheduler
  (no packet is sent: a UDP socket is only connected, which picks the route).
"""

from __future__ import annotations

import socket

LOCAL_NODE_ADDRESS = "127.0.0.1"


def get_node_ip_address() -> str:
    """The IP address of the node this code runs on (see the module docstring)."""
    from lightwork.api import core as _api

    backend = _api._backend
    if backend is None or backend.closed or backend.name == "local":
        return LOCAL_NODE_ADDRESS
    node = str(backend.runtime_context()["node_id"])  # a Dask address, "tcp://host:port"
    host = _host_of(node)
    if not backend.in_driver:
        return host
    return _address_towards(host)


def _host_of(address: str) -> str:
    rest = address.split("://", 1)[-1]
    if rest.startswith("["):  # an IPv6 address: "[::1]:8786"
        return rest[1:].split("]", 1)[0]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


def _address_towards(host: str) -> str:
    """This machine's own address on the route to ``host``."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 1))  # UDP: no packet leaves; it picks the interface
            return str(probe.getsockname()[0])
    except OSError:  # no route (a scheduler behind a name this machine cannot resolve)
        return LOCAL_NODE_ADDRESS if host in ("localhost", LOCAL_NODE_ADDRESS) else host
