"""pytest plugin of the harness: the fixtures Ray's core tests take, and a results log.

Fixtures. Ray's test files take their runtimes from Ray's ``conftest.py``, which is not
in Ray's wheel. These are our own fixtures of the same names and the same contract, on
the public API only, so they work on Ray and on lightwork alike: ``ray.init`` with
Ray's test defaults (1 CPU, a 150 MiB object store, the test namespace) updated by the
test's indirect parameters, ``ray.shutdown`` after. Ray's cluster fixtures (several
nodes, its GCS) are not given: a test that takes one errors at setup on both runtimes,
and is not public.

Results log. ``RAYTESTS_LOG`` names a file this plugin appends one JSON object a line
to, flushed at once so the runner can watch a run it may have to kill: ``collected``
(every test id, with what makes a test not public), ``start`` before each test, and
``report`` for each phase's outcome.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
from contextlib import contextmanager
from typing import Any
from collections.abc import Iterator

import pytest
import sitecustomize

sitecustomize.put_first()

import ray  # noqa: E402  (after the finders are in place)

DEFAULT_INIT = {
    "num_cpus": 1,
    "object_store_memory": 150 * 1024 * 1024,
    "namespace": "default_test_namespace",
}

# Fixtures (by name) that need Ray's internals or several nodes.
PRIVATE_FIXTURE = re.compile(r"cluster|pubsub|redis|call_ray_start|http_proxy|gcs|"
                             r"external|monitor|autoscal|set_bad_runtime_env_cache")
# What a test's own source mentions that is Ray's internals (its GCS, its private
# modules, its multi-node test cluster, its core worker, which some tests mock).
# Matched as whole names or attributes, so a test's own names that merely contain one
# (``test_private_actor``, ``my_raylet``) do not count. A private attribute of anything
# but ``self``, ``os`` and ``sys`` (``pool._idle_actors``, ``ref._on_completed``) is
# Ray's internals too; the test's own classes keep theirs on ``self``.
PRIVATE_SOURCE = re.compile(r"(?<!self)(?<!\bos)(?<!\bsys)\._(?!_)\w+|\bgcs\b|GCS|"
                            r"\bglobal_worker\b|\bcluster_utils\b|\bCluster\(|\binternal_kv\b|"
                            r"\b_system_config\b|\bgenerate_system_config_map\b|"
                            r"\bcore_worker\b")
# Ray's private modules, for names a test file imports from them at its top.
PRIVATE_MODULE = re.compile(r"^ray\._(private|raylet|common)")


@contextmanager
def _ray_start(**params: Any) -> Iterator[Any]:
    kwargs = dict(DEFAULT_INIT)
    kwargs.update(params)
    info = ray.init(**kwargs)
    try:
        yield info
    finally:
        ray.shutdown()


def _param(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dict(getattr(request, "param", {}) or {})


@pytest.fixture
def ray_start_regular(request: pytest.FixtureRequest) -> Iterator[Any]:
    with _ray_start(**_param(request)) as info:
        yield info


@pytest.fixture(scope="module")
def ray_start_regular_shared(request: pytest.FixtureRequest) -> Iterator[Any]:
    with _ray_start(**_param(request)) as info:
        yield info


@pytest.fixture(scope="module", params=[{"local_mode": False}])
def ray_start_shared_local_modes(request: pytest.FixtureRequest) -> Iterator[Any]:
    params = _param(request)
    params.pop("local_mode", None)  # local mode is gone from Ray; the normal mode stays
    with _ray_start(**params) as info:
        yield info


@pytest.fixture(scope="module")
def ray_start_regular_shared_2_cpus(request: pytest.FixtureRequest) -> Iterator[Any]:
    with _ray_start(**{"num_cpus": 2, **_param(request)}) as info:
        yield info


@pytest.fixture
def ray_start_1_cpu(request: pytest.FixtureRequest) -> Iterator[Any]:
    with _ray_start(**{"num_cpus": 1, **_param(request)}) as info:
        yield info


@pytest.fixture
def ray_start_2_cpus(request: pytest.FixtureRequest) -> Iterator[Any]:
    with _ray_start(**{"num_cpus": 2, **_param(request)}) as info:
        yield info


@pytest.fixture
def ray_start_4_cpus(request: pytest.FixtureRequest) -> Iterator[Any]:
    with _ray_start(**{"num_cpus": 4, **_param(request)}) as info:
        yield info


@pytest.fixture
def ray_start_10_cpus(request: pytest.FixtureRequest) -> Iterator[Any]:
    with _ray_start(**{"num_cpus": 10, **_param(request)}) as info:
        yield info


@pytest.fixture
def ray_start_object_store_memory(request: pytest.FixtureRequest) -> Iterator[Any]:
    store = getattr(request, "param", 150 * 1024 * 1024)
    with _ray_start(object_store_memory=store) as info:
        yield info


@pytest.fixture
def propagate_logs() -> Iterator[None]:
    """Ray's loggers hand their records on to the root logger (so ``caplog`` sees them)."""
    import logging

    logger = logging.getLogger("ray")
    before = logger.propagate
    logger.propagate = True
    yield None
    logger.propagate = before


@pytest.fixture
def event_loop() -> Iterator[Any]:
    """The loop fixture older pytest-asyncio gave (some of Ray's async tests take it)."""
    import asyncio

    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def set_enable_auto_connect(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Whether a call before ``ray.init`` starts a runtime (the test's parameter; on by
    default). Set through ``RAY_ENABLE_AUTO_CONNECT``, which lightwork reads at each
    call; Ray reads it once at import, so its flag is set too where it has one."""
    enabled = bool(getattr(request, "param", True))
    before = os.environ.get("RAY_ENABLE_AUTO_CONNECT")
    os.environ["RAY_ENABLE_AUTO_CONNECT"] = "1" if enabled else "0"
    hook = None
    if sitecustomize.TARGET == "ray":
        try:
            from ray._private import auto_init_hook as hook  # Ray's own flag
        except ImportError:
            pass
    old_flag = getattr(hook, "enable_auto_connect", None)
    if hook is not None:
        hook.enable_auto_connect = enabled
    try:
        yield enabled
    finally:
        if hook is not None:
            hook.enable_auto_connect = old_flag
        if before is None:
            os.environ.pop("RAY_ENABLE_AUTO_CONNECT", None)
        else:
            os.environ["RAY_ENABLE_AUTO_CONNECT"] = before


@pytest.fixture
def shutdown_only() -> Iterator[None]:
    yield None
    ray.shutdown()


# -- the results log ---------------------------------------------------------------------

def _write(record: dict[str, Any]) -> None:
    path = os.environ.get("RAYTESTS_LOG")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(record) + "\n")


class _TestFile:
    """What the rule reads from a test file once: the names it imports at its top from
    Ray's private modules, or from Ray's test helpers that the harness does not give
    (``raytests_support`` lacks them: they read Ray's internals), and the source of each
    function and class defined at its top level (the file's own helpers)."""

    def __init__(self, path: str) -> None:
        try:
            text = open(path, encoding="utf-8").read()
            tree = ast.parse(text)
        except (OSError, SyntaxError):
            text, tree = "", ast.Module(body=[], type_ignores=[])
        self.private_names: set[str] = set()
        self.helpers: dict[str, str] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {alias.asname or alias.name: alias.name for alias in node.names}
                if node.module.endswith("test_utils"):
                    self.private_names.update(
                        mine for mine, theirs in names.items() if theirs not in _HARNESS_HELPERS)
                elif PRIVATE_MODULE.search(node.module):
                    self.private_names.update(names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                    not node.name.startswith("test"):
                self.helpers[node.name] = ast.get_source_segment(text, node) or ""


def _harness_helpers() -> set[str]:
    """The top-level names of ``raytests_support``: the test helpers the harness gives."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raytests_support.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names - {"__getattr__"}


_HARNESS_HELPERS = _harness_helpers()
_files: dict[str, _TestFile] = {}


def _private_uses(item: pytest.Item) -> list[str]:
    """What makes a test not public: a private fixture, or Ray's internals named in its
    own source or in the source of any of its file's helpers and fixtures it reaches (a
    helper that calls another counts that one too)."""
    uses = set(name for name in getattr(item, "fixturenames", ())
               if PRIVATE_FIXTURE.search(name))
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        source = ""
    path = str(item.path)
    if path not in _files:
        _files[path] = _TestFile(path)
    test_file = _files[path]
    # The file's own fixtures the test takes (autouse ones too) are its code as well.
    seen = set(getattr(item, "fixturenames", ())) & test_file.helpers.keys()
    sources = [("", source)] + [(name, test_file.helpers[name]) for name in sorted(seen)]
    while sources:
        via, text = sources.pop()
        found = set(PRIVATE_SOURCE.findall(text))
        words = set(re.findall(r"\w+", text))
        found |= test_file.private_names & words
        uses.update(f"{name} (in {via})" if via else name for name in found)
        for helper in sorted((words & test_file.helpers.keys()) - seen):
            seen.add(helper)
            sources.append((helper, test_file.helpers[helper]))
    return sorted(uses)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    _write({"event": "collected",
            "tests": {item.nodeid: _private_uses(item) for item in items}})


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write({"event": "collect_error", "nodeid": report.nodeid,
                "message": _short(report.longreprtext)})


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _write({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _write({"event": "report", "nodeid": report.nodeid, "when": report.when,
            "outcome": report.outcome, "duration": round(report.duration, 3),
            "message": _short(report.longreprtext) if report.failed else ""})


def _short(text: str) -> str:
    """The last lines of a failure: where the error names itself."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    picked = errors[:6] if errors else lines[-6:]
    return "\n".join(picked)[:2000]
