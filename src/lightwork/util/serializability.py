"""``inspect_serializability``: which part of a value cannot be pickled, and where it sits.

Ray's troubleshooting helper, with Ray's result: ``(serializable, failures)`` where
``failures`` is a set of :class:`FailureTuple` (``obj``, ``path`` — the names leading to
it, ending with its own, also ``name`` — and ``parent``), one per innermost culprit. It tries cloudpickle on the value (as a task's function, arguments and
results are pickled); on failure it looks one level in and tries each member — a
function's globals and closure variables, an object's attributes, a class's attributes,
a container's items, a bound method's object — down to ``depth`` levels, printing each
step. A member that fails but has no failing member of its own is the culprit.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from lightwork.kernel import pickler

__all__ = ["FailureTuple", "inspect_serializability"]

_RULE = "=" * 80


class FailureTuple:
    """One value that cannot be pickled: the value, its name, the names leading to it
    from the inspected value (``path``), and what holds it (``parent``)."""

    __slots__ = ("obj", "parent", "path")

    def __init__(self, obj: Any, path: tuple[str, ...], parent: Any) -> None:
        self.obj = obj
        self.path = path
        self.parent = parent

    @property
    def name(self) -> str:
        return self.path[-1] if self.path else "unknown"

    def __repr__(self) -> str:
        return (f"FailTuple({self.name} [path={' -> '.join(self.path)}, obj={self.obj!r}, "
                f"parent={self.parent!r}])")

    # Unpicklable values (locks, sockets) are often unhashable by value: compare by identity.
    def __hash__(self) -> int:
        return hash((id(self.obj), self.path, id(self.parent)))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, FailureTuple) and self.obj is other.obj
                and self.path == other.path and self.parent is other.parent)


def inspect_serializability(base_obj: Any, name: str | None = None, depth: int = 3,
                            print_file: TextIO | None = None) -> tuple[bool, set[FailureTuple]]:
    """Print what in ``base_obj`` cannot be pickled; return ``(ok, failures)``.

    ``depth`` bounds how many levels of members are searched; ``print_file`` is where
    the report goes (default ``sys.stdout``).
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be an int >= 1 (levels of members searched), got {depth!r}")
    out = print_file if print_file is not None else sys.stdout
    label = name if name is not None else _label(base_obj)
    print(_RULE, file=out)
    print(f"Checking serializability of {label}", file=out)
    print(_RULE, file=out)
    failures: set[FailureTuple] = set()
    ok = _inspect(base_obj, (label,), None, depth, failures, out, indent="")
    if ok:
        print("Serialization succeeded.", file=out)
        return True, failures
    print(_RULE, file=out)
    print("Not serializable:", file=out)
    for failure in sorted(failures, key=lambda f: f.path):
        holder = "" if failure.parent is None else f", held by {_label(failure.parent)}"
        print(f"    {' -> '.join(failure.path)}: a {type(failure.obj).__name__}{holder}",
              file=out)
    print("Values sent to or from tasks and actors are pickled with cloudpickle. Create "
          "such objects inside the task or actor that uses them (or hold them in an "
          "actor), instead of capturing or passing them.", file=out)
    print(_RULE, file=out)
    return False, failures


def _inspect(value: Any, path: tuple[str, ...], parent: Any, depth: int,
             failures: set[FailureTuple], out: TextIO, indent: str) -> bool:
    name = path[-1]
    try:
        pickler.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is what we report
        print(f"{indent}!!! FAIL serialization of {name}: {type(exc).__name__}: {exc}", file=out)
        before = len(failures)
        if depth > 1:
            members = list(_members(value))
            if members:
                print(f"{indent}{name} has {len(members)} {_member_kind(value)}; "
                      "checking each...", file=out)
            for member_name, member in members:
                _inspect(member, (*path, member_name), value, depth - 1, failures, out,
                         indent + "    ")
        if len(failures) == before:  # no failing member: this value is the culprit
            failures.add(FailureTuple(value, path, parent))
        return False
    if indent:
        print(f"{indent}{name}: ok", file=out)
    return True


def _members(value: Any) -> Iterator[tuple[str, Any]]:
    """Named parts of ``value`` that pickling it would pickle too."""
    if inspect.ismethod(value):
        yield "__self__", value.__self__
        yield "__func__", value.__func__
    elif inspect.isfunction(value):
        try:
            closure = inspect.getclosurevars(value)
        except (TypeError, ValueError):
            return
        for group in (closure.nonlocals, closure.globals):
            for key, member in group.items():
                if not inspect.ismodule(member):  # modules travel by name
                    yield key, member
    elif isinstance(value, dict):
        for key, member in value.items():
            yield f"[{key!r}]", member
    elif isinstance(value, (list, tuple, set, frozenset)):
        for index, member in enumerate(value):
            yield f"[{index}]", member
    elif isinstance(value, type):
        for key, member in vars(value).items():
            if not (key.startswith("__") and key.endswith("__")):
                yield key, member
    else:
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            yield from attributes.items()
        for slot in getattr(type(value), "__slots__", ()):
            if isinstance(slot, str) and hasattr(value, slot):
                yield slot, getattr(value, slot)


def _member_kind(value: Any) -> str:
    if inspect.isfunction(value):
        return "global or closure variable(s)"
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        return "item(s)"
    return "attribute(s)"


def _label(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
