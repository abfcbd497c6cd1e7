"""Make ``import ray`` mean the runtime under test, in every process of a harness run.

Python imports ``sitecustomize`` at start-up from the first directory of the import path
that has one; the harness puts this directory first on ``PYTHONPATH``, so the pytest
process, every worker it starts and every driver script a test runs in a subprocess all
pass through here.

``RAYTESTS_TARGET`` says which runtime ``ray`` is:

* ``lightwork``: ``lightwork.install_as_ray()``, then a finder of our own placed before
  lightwork's for the modules Ray's tests import that are Ray's test infrastructure, not
  its API (``ray._private.test_utils``, ``ray.cluster_utils``, ...): the test helpers come
  from ``raytests_support`` (our own versions of them), the rest are empty stand-ins, so
  a test module that imports them at the top still loads and only the tests that use
  them fail; ``ray.util.annotations`` gives decorators that change nothing;
* ``ray`` (or unset): the installed Ray, untouched, except that its two modules of test
  helpers each give the other's names too (Ray moved them between releases), its
  internal modules give failing stand-ins for names a newer release added, so test
  files of a nearby release load, and ``ray.tests`` (not in Ray's wheel) gets the same
  empty stand-ins;
* on both, the helpers Ray keeps beside its tests (``ray.tests.client_test_utils``) are
  ours, from ``raytests_support``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

TARGET = os.environ.get("RAYTESTS_TARGET", "ray")
# Where the installed Ray's own code lives (found without importing it).
_RAY_SPEC = importlib.util.find_spec("ray") if TARGET == "ray" else None
RAY_HOME = os.path.dirname(_RAY_SPEC.origin or "") + os.sep if _RAY_SPEC else "\0"

# Ray's test helpers, by the modules tests import them from.
HELPER_MODULES = ("ray._private.test_utils", "ray._common.test_utils")
# Helpers of Ray's that live with its tests (not in its wheel): ours, on both runtimes.
TEST_HELPER_MODULES = ("ray.tests.client_test_utils",)
# Ray's internal modules whose one name tests use asks a question about the test run
# (``client_mode_should_convert()``: under Ray Client?): on lightwork, answered by ours.
ANSWERED_MODULES = ("ray._private.client_mode_hook",)
# Ray's testing-only and internal modules that tests import at the top of a file: loaded
# as empty modules whose every name is a stand-in that fails when used, so only the tests
# that use them fail.
EMPTY_MODULES = ("ray.cluster_utils", "ray.tests", "ray.tests.conftest",
                 "ray._private.ray_constants", "ray._private.utils", "ray._private.worker",
                 "ray._private.gcs_utils", "ray._private.client_mode_hook",
                 "ray.util.client.ray_client_helpers", "ray._common.utils",
                 "ray._common.constants", "ray.autoscaler._private.constants")
# Ray's API-stability decorators, which some test files and libraries apply at import:
# here each gives back what it decorates.
ANNOTATION_MODULE = "ray.util.annotations"
# Parents that must exist for the names above to import.
EMPTY_PACKAGES = ("ray._private", "ray._common", "ray.tests", "ray.util.client",
                  "ray.autoscaler", "ray.autoscaler._private")


class _Stand_in(importlib.abc.Loader):
    def __init__(self, helpers: bool) -> None:
        self.helpers = helpers

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        if self.helpers:
            return importlib.import_module("raytests_support")
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        if self.helpers:
            return
        if module.__name__ in EMPTY_PACKAGES:
            module.__path__ = []
        name = module.__name__

        def __getattr__(attribute: str) -> object:
            if attribute.startswith("__"):
                raise AttributeError(attribute)
            return _absent(f"{name}.{attribute}")

        module.__getattr__ = __getattr__  # type: ignore[method-assign]


def _absent(what: str) -> type:
    """A stand-in for a name of Ray's internals: importable, failing when used."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"{what} is Ray's internals, which lightwork does not have")

    return type(what.rsplit(".", 1)[-1], (), {"__init__": refuse, "__getattr__": refuse})


class _Annotations(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        def marker(*args: object, **kwargs: object) -> object:
            # Bare (@PublicAPI) or called (@PublicAPI(stability="beta")).
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return args[0]
            return lambda obj: obj

        for name in ("PublicAPI", "DeveloperAPI", "Deprecated", "Alpha"):
            setattr(module, name, marker)
        module.RayDeprecationWarning = type(  # type: ignore[attr-defined]
            "RayDeprecationWarning", (DeprecationWarning,), {})


class TestInfrastructureFinder(importlib.abc.MetaPathFinder):
    """Finds Ray's testing-only modules for a lightwork run (see the module docstring)."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname == ANNOTATION_MODULE:
            return importlib.util.spec_from_loader(fullname, _Annotations())
        if fullname in HELPER_MODULES or fullname in TEST_HELPER_MODULES \
                or fullname in ANSWERED_MODULES:
            return importlib.util.spec_from_loader(fullname, _Stand_in(helpers=True))
        if fullname in EMPTY_MODULES or fullname in EMPTY_PACKAGES:
            return importlib.util.spec_from_loader(
                fullname, _Stand_in(helpers=False), is_package=fullname in EMPTY_PACKAGES)
        return None


class _MovedRayHelpers(importlib.abc.MetaPathFinder):
    """On Ray: Ray's test helpers moved between ``ray._private.test_utils`` and
    ``ray._common.test_utils`` over its releases; each of the two also gives the names
    of the other it lacks, so a test file of another release still loads. Ray's
    internal modules that test files import names from (``EMPTY_MODULES``) give a
    stand-in that fails when used for a name this release lacks (a newer file's
    ``from ray._private.worker import _wait_async``), so only the tests using it fail."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname not in HELPER_MODULES and fullname not in EMPTY_MODULES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        except ImportError:
            spec = None
        finally:
            sys.meta_path.insert(0, self)
        if fullname in EMPTY_MODULES:
            if spec is None or spec.loader is None:
                return None  # not in this release: the other finders' business
            spec.loader = _Merging(spec.loader, None)
            return spec
        other = HELPER_MODULES[1 - HELPER_MODULES.index(fullname)]
        if spec is None:  # this release has only the other module
            return importlib.util.spec_from_loader(fullname, _OtherModule(other))
        assert spec.loader is not None
        spec.loader = _Merging(spec.loader, other)
        return spec


class _Merging(importlib.abc.Loader):
    """Ray's own module, whose missing names come from ``other`` (a module's name) or,
    with no other, are stand-ins that fail when used."""

    def __init__(self, loader: importlib.abc.Loader, other: str | None) -> None:
        self.loader, self.other = loader, other

    def __getattr__(self, name: str) -> object:  # get_source, get_filename, ...
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        other = self.other

        # Looked up at first use, not now: the two modules import each other.
        def __getattr__(name: str) -> object:
            if not name.startswith("__"):
                if other is None:
                    # Only for a test file's import: Ray's own code that probes its
                    # modules (getattr with a default) must still find nothing.
                    caller = sys._getframe(1).f_code.co_filename
                    if not caller.startswith(RAY_HOME):
                        return _absent(f"{module.__name__}.{name}")
                    raise AttributeError(
                        f"module {module.__name__!r} has no attribute {name!r}")
                try:
                    return vars(importlib.import_module(other))[name]
                except (ImportError, KeyError):
                    pass
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

        module.__dict__.setdefault("__getattr__", __getattr__)


class _OtherModule(importlib.abc.Loader):
    def __init__(self, name: str) -> None:
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _MissingFromTheWheel(importlib.abc.MetaPathFinder):
    """On Ray: ``ray.tests`` (its ``conftest.py`` and helpers) is not in Ray's wheel; a
    test file that imports from it at its top gets the same empty stand-ins as on a
    lightwork run, so only the tests that use them fail."""

    NAMES = ("ray.tests", "ray.tests.conftest")

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname in TEST_HELPER_MODULES:
            return importlib.util.spec_from_loader(fullname, _Stand_in(helpers=True))
        if fullname not in self.NAMES:
            return None
        sys.meta_path.remove(self)
        try:
            found = importlib.util.find_spec(fullname)
        except ImportError:
            found = None
        finally:
            sys.meta_path.insert(0, self)
        if found is not None:
            return None
        return importlib.util.spec_from_loader(
            fullname, _Stand_in(helpers=False), is_package=fullname in EMPTY_PACKAGES)


def install() -> None:
    if TARGET == "lightwork":
        import lightwork

        lightwork.install_as_ray()
        sys.meta_path.insert(0, TestInfrastructureFinder())
    else:
        sys.meta_path.insert(0, _MissingFromTheWheel())
        sys.meta_path.insert(0, _MovedRayHelpers())


def put_first() -> None:
    """Put this module's finders before any other again: pytest's assertion rewriter,
    installed after start-up, would otherwise load Ray's ``test_utils`` modules itself
    (their names look like test files to it)."""
    kinds = (TestInfrastructureFinder, _MovedRayHelpers, _MissingFromTheWheel)
    ours = [f for f in sys.meta_path if isinstance(f, kinds)]
    sys.meta_path[:] = ours + [f for f in sys.meta_path if f not in ours]


install()
