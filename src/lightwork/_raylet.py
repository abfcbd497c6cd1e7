"""What ``ray._raylet`` is under lightwork: the few public names programs import from it.

Ray's ``_raylet`` is its compiled core (the core worker, GCS clients, id classes). Older
programs and test files import a handful of public classes from there rather than from
``ray`` or ``ray.exceptions``; those, and only those, are listed here (:data:`__all__`), as
lightwork's own objects. Every other ``ray._raylet`` name is Ray's internals: it raises an
``AttributeError`` saying so (``from ray._raylet import X`` turns it into an
``ImportError``), and every other ``ray._*`` module is refused by the alias
(``kernel/ray_alias.py``), which maps ``ray._raylet`` to this module alone.
"""

from __future__ import annotations

from lightwork.api import DynamicObjectRefGenerator, ObjectRef, ObjectRefGenerator
from lightwork.exceptions import ObjectRefStreamEndOfStreamError

ObjectID = ObjectRef  # Ray's old name for ObjectRef
StreamingObjectRefGenerator = ObjectRefGenerator  # Ray 2.7's name for it

__all__ = ["DynamicObjectRefGenerator", "ObjectID", "ObjectRef", "ObjectRefGenerator",
           "ObjectRefStreamEndOfStreamError", "StreamingObjectRefGenerator"]


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"ray._raylet.{name} is part of Ray's compiled core, which lightwork does not have; "
        f"of ray._raylet, lightwork provides only {', '.join(__all__)} (import them from "
        "ray or ray.exceptions). Remove the use, or run this program on Ray itself")
