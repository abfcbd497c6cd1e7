"""The cluster engine: lightwork's API on a Dask distributed cluster.

Imports only the kernel (and ``distributed``, loaded only when a cluster address is
given). The API reaches it through
:class:`~lightwork.engines.distributed.backend.DistributedBackend`, which
:func:`lightwork.engines.open_backend` builds.
"""
