"""Dask graphs in, one normal form out: ``{key: GraphNode}`` plus the keys asked for.

Accepted inputs: a mapping in Dask's legacy form (tasks as tuples, nested tasks, lists,
aliases, literals), a mapping of ``dask._task_spec`` nodes (``Task``, ``DataNode``,
``Alias``), a ``HighLevelGraph``, or any object with ``__dask_graph__()`` (collections
and expressions). ``convert_legacy_graph`` turns all of them into ``GraphNode`` objects,
whose ``dependencies`` name the keys they read and which run as ``node(values)``.

``keys`` is one key or a (nested) list of keys; :func:`nest` rebuilds that shape from
the values, lists becoming tuples, exactly as Dask's own schedulers return them.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

DASK_MISSING = (
    "lightwork.dask needs dask: install it with pip install 'lightwork[dask]' "
    "(or pip install 'dask>=2024.11')"
)


def import_task_spec() -> Any:
    """``dask._task_spec``, or an ImportError saying which extra to install."""
    try:
        from dask import _task_spec
    except ImportError as exc:
        raise ImportError(DASK_MISSING) from exc
    if not hasattr(_task_spec, "convert_legacy_graph"):
        import dask

        raise ImportError(
            f"dask {dask.__version__} is too old for lightwork.dask (it needs the task spec "
            "of dask 2024.11 or later): pip install -U 'lightwork[dask]'")
    return _task_spec


def normalize_graph(dsk: Any) -> dict[Hashable, Any]:
    """``dsk`` as ``{key: GraphNode}``; TypeError for things that are not graphs."""
    spec = import_task_spec()
    if not isinstance(dsk, Mapping):
        to_graph = getattr(dsk, "__dask_graph__", None)
        if to_graph is None:
            raise TypeError(
                f"lightwork.dask.get expects a Dask graph (a mapping of keys to tasks) or a "
                f"Dask collection, got {type(dsk).__name__}: {dsk!r:.80}")
        dsk = to_graph()
        if not isinstance(dsk, Mapping):
            raise TypeError(
                f"__dask_graph__() returned {type(dsk).__name__}, not a mapping of keys to tasks")
    return spec.convert_legacy_graph(dsk)


def flatten_keys(keys: Any) -> list[Hashable]:
    """Every key in ``keys`` (a key, or nested lists of keys), depth first."""
    out: list[Hashable] = []
    stack = [keys]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def nest(keys: Any, values: Mapping[Hashable, Any]) -> Any:
    """``keys`` with every key replaced by its value; lists become tuples."""
    if isinstance(keys, list):
        return tuple(nest(k, values) for k in keys)
    return values[keys]


def check_keys(graph: Mapping[Hashable, Any], wanted: list[Hashable]) -> None:
    missing = [key for key in wanted if not _has(graph, key)]
    if missing:
        sample = ", ".join(repr(k) for k in missing[:3])
        raise KeyError(
            f"key(s) {sample}{' ...' if len(missing) > 3 else ''} not in the graph "
            f"({len(graph)} key(s)); ask for keys the graph defines")


def _has(graph: Mapping[Hashable, Any], key: Any) -> bool:
    try:
        return key in graph
    except TypeError:  # an unhashable "key", e.g. a dict
        return False


def needed_subgraph(graph: Mapping[Hashable, Any], wanted: list[Hashable]) -> dict[Hashable, Any]:
    """The nodes ``wanted`` depends on (themselves included); ValueError if one is missing."""
    needed: dict[Hashable, Any] = {}
    stack = list(wanted)
    while stack:
        key = stack.pop()
        if key in needed:
            continue
        node = graph.get(key)
        if node is None:
            raise ValueError(
                f"missing dependency {key!r}: a task needs it but the graph does not define it")
        needed[key] = node
        stack.extend(dep for dep in node.dependencies if dep not in needed)
    return needed
