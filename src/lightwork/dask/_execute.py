"""What runs on a worker for one Dask task: the node, given its dependencies' values.

Dependencies arrive as top-level arguments so the runtime resolves their ObjectRefs to
values (zero-copy for arrays in shared memory) before the call; ``keys`` names them.
"""

from __future__ import annotations

from typing import Any


def run_graph_node(node: Any, keys: tuple[Any, ...], *values: Any) -> Any:
    return node(dict(zip(keys, values)))
