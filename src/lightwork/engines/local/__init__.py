"""The embedded engine: the driver's Node, its worker processes and fork server.

Imports only the kernel. The API reaches it through
:class:`~lightwork.engines.local.backend.LocalBackend`, which
:func:`lightwork.engines.open_backend` builds.
"""
