"""What runs on a worker for one Dask task: the node, given its dependencies' values.

Dependencies arrive as top-level arguments so the runtime resolves their ObjectRefs to
values (zero-copy for arrays in shared memory) before the call; ``keys`` names them.

A task whose function must be pickled by value (defined in ``__main__``, a lambda, a
local function) would carry that function's code in every task of the graph. Such a
task is shipped without it (:func:`without_function`) to :func:`run_task` bound to the
function: the runtime sends a remote function's code to each worker once, so the code
travels once per worker, and each task carries only its arguments.
"""

from __future__ import annotations

import copy
from typing import Any


def run_graph_node(node: Any, keys: tuple[Any, ...], *values: Any) -> Any:
    return node(dict(zip(keys, values)))


def run_task(func: Any, node: Any, keys: tuple[Any, ...], *values: Any) -> Any:
    """Run a Task shipped by :func:`without_function`, with its function put back."""
    node.func = func
    return node(dict(zip(keys, values)))


def without_function(task: Any) -> Any:
    """A copy of a Dask ``Task`` whose function is a stand-in (the graph's own is kept)."""
    shipped = copy.copy(task)
    shipped.func = _shipped_apart
    return shipped


def _shipped_apart(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("this Dask task was shipped without its function; run it with "
                       "lightwork.dask._execute.run_task")
