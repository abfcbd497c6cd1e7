"""Ray's ``ray.dag``: lazy task graphs (``f.bind(...)``, ``InputNode``, ``execute()``).

The nodes are in ``lightwork.api.dag``, whose docstring is the design."""

from lightwork.api.dag import (
    ClassMethodNode,
    ClassNode,
    DAGInputData,
    DAGNode,
    FunctionNode,
    InputAttributeNode,
    InputNode,
    MultiOutputNode,
)

__all__ = [
    "ClassMethodNode",
    "ClassNode",
    "DAGInputData",
    "DAGNode",
    "FunctionNode",
    "InputAttributeNode",
    "InputNode",
    "MultiOutputNode",
]
