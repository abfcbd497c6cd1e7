"""The package's floors import only downward, and no two packages import each other.

Floors, top to bottom: the public face (``lightwork``, ``lightwork.exceptions``,
``lightwork.actor``, Ray's other top-level modules ``cloudpickle``, ``job_config``,
``ray_constants``, ``runtime_context``, ``_raylet``, ``dag``, ``types``, and the ``lightwork``
command:
``__main__``, ``cli``), the tools (``state``, ``diagnostics``, ``dashboard``, ``dask``,
``util``, ``experimental``), the API (``api``), the engines (``engines`` and its
``local`` and ``distributed``), the kernel (``kernel``, ``_collector``). Every import is
read from the source, lazy ones and type-only ones too.
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
FLOORS = ("kernel", "engines", "api", "tools", "face")
FACE = {"lightwork", "lightwork.__main__", "lightwork.cli", "lightwork.exceptions",
        "lightwork.actor", "lightwork.cloudpickle", "lightwork.job_config",
        "lightwork.ray_constants", "lightwork.runtime_context", "lightwork._raylet",
        "lightwork.dag", "lightwork.types"}
TOOL_PACKAGES = ("state", "diagnostics", "dashboard", "dask", "util", "experimental")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """The unit the no-circle rule is about: a subpackage, or a top-level module."""
    parts = module.split(".")
    if module in FACE:
        return "lightwork"
    if parts[1] == "engines" and len(parts) > 2:
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def floor_of(module: str) -> str:
    if module in FACE:
        return "face"
    top = module.split(".")[1]
    if top in ("kernel", "_collector"):
        return "kernel"
    if top in ("engines", "api"):
        return top
    assert top in TOOL_PACKAGES, f"{module} is on no floor: add it to one in this test"
    return "tools"


def imports_of(path: pathlib.Path, module: str) -> list[tuple[str, int]]:
    """Every lightwork module ``path`` imports, with its line (``from a import b`` names
    ``a.b`` when ``b`` is a module, else ``a``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append((candidate if candidate in MODULES else base, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == "lightwork"]


FILES = {module_name(p): p for p in SRC.joinpath("lightwork").rglob("*.py")}
MODULES = set(FILES) | {"lightwork._collector"}
EDGES = {module: imports_of(path, module) for module, path in FILES.items()}


def test_every_module_is_on_a_floor():
    for module in FILES:
        assert floor_of(module) in FLOORS


def test_no_module_imports_a_floor_above_its_own():
    upward = []
    for module, imported in EDGES.items():
        for target, line in imported:
            if FLOORS.index(floor_of(target)) > FLOORS.index(floor_of(module)):
                upward.append(f"{FILES[module].relative_to(SRC)}:{line} imports {target}")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_engines_do_not_import_each_other_nor_their_door():
    crossing = []
    for module, imported in EDGES.items():
        if not module.startswith("lightwork.engines."):
            continue
        own = package_of(module)
        for target, line in imported:
            if target.startswith("lightwork.engines") and package_of(target) != own:
                crossing.append(f"{FILES[module].relative_to(SRC)}:{line} imports {target}")
    assert not crossing, "an engine reaches outside itself:\n" + "\n".join(crossing)


def test_the_api_reaches_engines_only_through_their_door():
    side_doors = []
    for module, imported in EDGES.items():
        if floor_of(module) != "api":
            continue
        for target, line in imported:
            if target.startswith("lightwork.engines.") :
                side_doors.append(f"{FILES[module].relative_to(SRC)}:{line} imports {target}")
    assert not side_doors, "the API passes the backend door:\n" + "\n".join(side_doors)


def test_no_two_packages_import_each_other():
    graph: dict[str, set[str]] = defaultdict(set)
    for module, imported in EDGES.items():
        for target, _line in imported:
            if package_of(target) != package_of(module):
                graph[package_of(module)].add(package_of(target))
    # Any cycle between packages (not only pairs): depth-first search for a back edge.
    cycles = []
    state: dict[str, int] = {}

    def visit(package: str, path: list[str]) -> None:
        state[package] = 1
        for target in sorted(graph[package]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[package] = 2

    for package in sorted(graph):
        if package not in state:
            visit(package, [package])
    assert not cycles, "packages import each other:\n" + "\n".join(cycles)


@pytest.mark.parametrize("source, expected", [
    ("from lightwork.api import core\n", "lightwork.api.core"),
    ("def f():\n    from lightwork.kernel.events import TaskRecord\n", "lightwork.kernel.events"),
    ("from . import views\n", "lightwork.kernel.views"),
])
def test_the_reader_finds_lazy_and_relative_imports(tmp_path, source, expected):
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert (expected, 1) in imports_of(path, "lightwork.kernel.probe") or \
        expected in [name for name, _ in imports_of(path, "lightwork.kernel.probe")]
