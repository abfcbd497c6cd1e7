"""lightwork as a Dask scheduler.

::

    import dask, lightwork.dask
    x.compute(scheduler=lightwork.dask.get)
    dask.compute(x, y, scheduler=lightwork.dask.get)
    with lightwork.dask.enable():          # dask.config.set(scheduler=lightwork.dask.get)
        x.compute()

``get(dsk, keys, **kwargs)`` follows Dask's ``get`` contract (it passes
``dask.utils_test.GetFunctionTestMixin``): ``dsk`` is a graph (legacy tuples, the
``dask._task_spec`` nodes, a ``HighLevelGraph``) or anything with ``__dask_graph__()``;
``keys`` is a key or nested lists of keys, and the result has the same shape with lists
turned into tuples. Each task runs on a lightwork worker; intermediate values stay in
the object store and are freed once no remaining task needs them. Callbacks
(``lightwork.diagnostics`` and ``dask.diagnostics``) fire as with Dask's schedulers; see
``_scheduler.py`` for the policy and ``lightwork.diagnostics.callbacks`` for the hooks.

Dask is optional: ``pip install 'lightwork[dask]'``. Importing this package does not
import dask; the first ``get`` does.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

__all__ = ["enable", "get"]


def get(dsk: Any, keys: Any, *, callbacks: Any = None, num_workers: int | None = None,
        cache: Any = None, **kwargs: Any) -> Any:
    """Compute ``keys`` of the Dask graph ``dsk`` on lightwork's workers.

    ``callbacks``: Dask callback tuples or Callback objects used *instead of* the active
    ones (as in Dask). ``num_workers`` bounds the tasks in flight (default: the
    runtime's CPUs). ``cache``: values of keys already known. Other keyword arguments
    that ``compute()`` passes to schedulers are accepted and ignored.
    """
    from lightwork.api import core as _api
    from lightwork.dask._graph import check_keys, flatten_keys, nest, normalize_graph
    from lightwork.dask._scheduler import DaskRun, run_nested
    from lightwork.diagnostics.callbacks import Hooks, active_callbacks

    graph = normalize_graph(dsk)
    wanted: list[Hashable] = flatten_keys(keys) if isinstance(keys, list) else [keys]
    check_keys(graph, wanted)
    if num_workers is not None and (isinstance(num_workers, bool)
                                    or not isinstance(num_workers, int) or num_workers < 1):
        raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
    _api._core()  # start a runtime if none is running, as lightwork.get does
    # The driver's node, or a cluster run's event log, which tells of ended tasks alike.
    node = _api._core().run_record()
    if node is None:
        if callbacks is not None or active_callbacks():  # never silently without them
            _api.run_record("Dask callbacks of lightwork.dask.get", live=True)
        values = run_nested(graph, wanted)
    else:
        if callbacks is None:
            chosen = active_callbacks()
        else:
            explicit = [callbacks] if isinstance(callbacks, tuple) or not isinstance(
                callbacks, (list, set, frozenset)) else list(callbacks)
            chosen = active_callbacks(explicit)
        if num_workers is None:
            num_workers = max(1, int(node.resources()[0].get("CPU", 1)))
        values = DaskRun(node, graph, wanted, Hooks(chosen), num_workers, cache).run()
    return nest(keys, values)


def enable(**config: Any) -> Any:
    """Make lightwork Dask's default scheduler.

    As a context manager (``with lightwork.dask.enable(): ...``) it lasts for the block;
    called alone it lasts until changed. Extra keyword arguments are more
    ``dask.config`` settings. This is ``dask.config.set(scheduler=lightwork.dask.get)``.
    """
    from lightwork.dask._graph import import_task_spec

    import_task_spec()  # a clear message when dask is missing
    import dask

    return dask.config.set(scheduler=get, **config)
