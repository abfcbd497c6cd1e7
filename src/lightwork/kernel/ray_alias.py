"""Run a program written for Ray without editing it: ``import ray`` gives lightwork.

Two routes, both through :func:`install_as_ray`:

* ``python -m lightwork run script.py [args]`` (or ``run -m package.module``) installs
  the alias and runs the script as ``__main__``, as ``python script.py`` would;
* a program (or a test's conftest) calls ``lightwork.install_as_ray()`` before its first
  ``import ray``.

The alias is a meta-path finder placed first on ``sys.meta_path`` (and every lightwork
module already imported is entered in ``sys.modules`` under its Ray name): ``ray`` is
``lightwork``, and ``ray.X.Y`` is ``lightwork.X.Y`` (``ray.util.queue``,
``ray.exceptions``, ``ray.util.state``, ...). Ray's private modules (``ray._private``,
``ray._common``, ...) are refused, except ``ray._raylet``, which is lightwork's
``_raylet``: the few public names programs import from there, nothing else. The loader
puts the *lightwork* module itself in ``sys.modules`` under the Ray name, so
``ray.get is lightwork.get``, classes keep their lightwork ``__module__`` (pickles name
lightwork, which every worker has) and ``isinstance`` works across both names. A Ray
module that lightwork does not provide (``ray.data``, ``ray.train``, ...) fails at
import with a ``ModuleNotFoundError`` that says only Ray's core API is here, instead of
importing a real Ray by accident.

Workers: a function pickled by value that names the module ``ray`` travels as a
reference to ``lightwork`` (the module's real name), so it needs nothing. A function
imported by name from the user's module runs that module's ``import ray`` in the worker,
so the node tells every worker it starts to install the alias too (``as_ray`` in the
worker's config, read by ``worker.main``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types
from collections.abc import Sequence

_RAY = "ray"
_TARGET = "lightwork"


# Ray's private modules that programs import public names from: each is a lightwork
# module of the same name that holds those names alone (see lightwork/_raylet.py).
_PRIVATE_ALLOWED = ("_raylet",)


def _lightwork_name(fullname: str) -> str | None:
    """The lightwork module that stands for Ray's module ``fullname``, or None."""
    if fullname == _RAY:
        return _TARGET
    if fullname.startswith(_RAY + "."):
        rest = fullname[len(_RAY) + 1:]
        if rest in _PRIVATE_ALLOWED:
            return f"{_TARGET}.{rest}"
        if rest.startswith("_") or "._" in rest:
            return None  # Ray's private modules are not part of its API
        return f"{_TARGET}.{rest}"
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a throwaway module: exec_module replaces it in sys.modules

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system returns whatever sys.modules holds under the name once the
        # loader is done, so the Ray name ends up bound to the lightwork module itself.
        sys.modules[module.__name__] = importlib.import_module(self.target)
        _alias_imported_modules()


class RayAliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``ray`` and ``ray.*`` as the lightwork modules of the same path."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _RAY and not fullname.startswith(_RAY + "."):
            return None
        name = _lightwork_name(fullname)
        if name is None or importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: lightwork stands in for Ray's core API "
                "(ray, ray.util, ray.util.queue, ray.util.multiprocessing, "
                "ray.util.state, ray.util.placement_group, ray.util.scheduling_strategies, "
                "ray.util.joblib, ray.exceptions, ray.actor, ray.dag, ray.runtime_context, "
                "ray.job_config, ray.cloudpickle, ray.types, ray.experimental.state.api, and the "
                "public names of ray._raylet) and has no Ray library or internal module of "
                "this name; run this program on Ray itself, or remove the import",
                name=fullname)
        is_package = hasattr(importlib.import_module(name), "__path__")
        return importlib.util.spec_from_loader(fullname, _AliasLoader(name), is_package=is_package)


def installed() -> bool:
    """Whether ``import ray`` gives lightwork in this process."""
    return any(isinstance(finder, RayAliasFinder) for finder in sys.meta_path)


def install_as_ray() -> None:
    """Make ``import ray`` (and ``ray.util``, ``ray.exceptions``, ...) import lightwork.

    Opt-in, for running a Ray program unchanged; call it before the program's first
    ``import ray``. Workers started afterwards install it too. Calling it twice is fine.
    """
    if installed():
        return
    already = sys.modules.get(_RAY)
    if already is not None and getattr(already, "__name__", None) != _TARGET:
        raise RuntimeError(
            f"the real Ray ({getattr(already, '__file__', 'ray')}) is already imported in "
            "this process, so `import ray` cannot become lightwork any more; call "
            "lightwork.install_as_ray() before anything imports ray, or use "
            "`python -m lightwork run script.py`")
    sys.meta_path.insert(0, RayAliasFinder())
    _alias_imported_modules()


def _alias_imported_modules() -> None:
    """Enter every imported lightwork module in ``sys.modules`` under its Ray name.

    An import of a name already there binds nothing on its parent package. That matters
    for ``import ray.util.placement_group``: ``lightwork.util.placement_group`` is the
    function (as in Ray), and a fresh import would overwrite it with the module.
    """
    for name, module in list(sys.modules.items()):
        if name == _TARGET or name.startswith(_TARGET + "."):
            ray_name = _RAY + name[len(_TARGET):]
            if _lightwork_name(ray_name) == name:  # not a private module
                sys.modules.setdefault(ray_name, module)


def uninstall_as_ray() -> None:
    """Undo :func:`install_as_ray` (for tests): ``ray`` names whatever it did before."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, RayAliasFinder)]
    for name in [n for n in sys.modules if n == _RAY or n.startswith(_RAY + ".")]:
        if getattr(sys.modules[name], "__name__", "").startswith(_TARGET):
            del sys.modules[name]


def run(target: str, args: Sequence[str], as_module: bool = False) -> None:
    """Run ``target`` (a script path, or a module name) as ``__main__`` with ``import ray``
    giving lightwork; ``sys.argv`` is ``[target, *args]`` as the program expects."""
    install_as_ray()
    if as_module:
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    if not os.path.exists(target):
        raise FileNotFoundError(f"lightwork run: no such script: {target}")
    sys.argv = [target, *args]
    # Like `python script.py`: the script's directory comes first on the import path.
    sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    runpy.run_path(target, run_name="__main__")
