"""Fixtures for lightwork's behaviour suite (tasks, objects, errors, cleanup).

Conformance switch
------------------
``LIGHTWORK_TEST_AGAINST_RAY=1 python -m pytest tests/`` runs this suite against real
Ray (``pip install ray``): ``lightwork`` and ``lightwork.exceptions`` are aliased to
``ray`` and ``ray.exceptions`` before any test module imports them. This checks that
the tests describe Ray's behaviour, not just ours. Tests of lightwork-only contracts
(its shared-memory directory, its error-message wording) are marked ``lightwork_only``
and skipped under the switch; a few tests assert behaviour the spec asks
for and Ray lacks — those fail against Ray on purpose and say so in their docstring.

Runtimes
--------
Starting a runtime is the expensive part of this suite, so most tests share one
module-scoped runtime (``ray_start``: 4 CPUs). Tests about init/shutdown or crash
cleanup take ``fresh_runtime`` (nothing running before, shut down after) and call
``init`` themselves. Every module ends with the runtime shut down, so a test that
leaves it running cannot leak into the next module.
"""

from __future__ import annotations

import faulthandler
import os
import sys

import pytest

AGAINST_RAY = os.environ.get("LIGHTWORK_TEST_AGAINST_RAY") == "1"

if AGAINST_RAY:
    import ray
    import ray.cloudpickle as _cloudpickle
    import ray.exceptions

    sys.modules["lightwork"] = ray
    sys.modules["lightwork.exceptions"] = ray.exceptions
    import importlib

    for _name in ("util", "util.queue", "util.multiprocessing", "util.state",
                  "util.scheduling_strategies", "util.placement_group"):
        sys.modules[f"lightwork.{_name}"] = importlib.import_module(f"ray.{_name}")
else:
    import cloudpickle as _cloudpickle

from tests import helpers, support  # noqa: E402  (tests/ is a package: see tests/__init__.py)

# A hang prints every thread's stack (pytest-timeout also dumps at its deadline).
faulthandler.enable()

# The memory monitor kills tasks when the *machine's* memory passes 95%: on a machine
# other test runs fill, it killed the tasks of tests about other things. Off by default
# here (drivers run in subprocesses inherit it); test_memory_monitor.py turns it on with
# init's arguments, which override this.
os.environ.setdefault("LIGHTWORK_MEMORY_MONITOR_REFRESH_MS", "0")

# The fork server preloads the driver's libraries (preload.py): this process has imported
# numpy, pandas, dask and distributed, so every fresh runtime of the suite would import
# them in its fork server first (0.7 s an init against 0.3 s). Off here (subprocess
# drivers inherit it); test_preload.py turns it on where it is the subject.
os.environ.setdefault("LIGHTWORK_PRELOAD", "0")
# Retries for retry_exceptions wait 1 s by default, as Ray's do; the suite tests which
# errors are retried, not the pacing (test_retry_delay.py tests that), so it retries at once.
os.environ.setdefault("LIGHTWORK_TASK_RETRY_DELAY_MS", "0")

# Functions defined in test modules are shipped to workers by value, so no test depends
# on workers being able to import tests/ (that contract has its own test with a module
# written to tmp_path, in test_worker_env.py).
_cloudpickle.register_pickle_by_value(helpers)
_cloudpickle.register_pickle_by_value(support)


# What a test file about lightwork's internals mentions (see pytest_ignore_collect).
INTERNALS = ("lightwork._", "lightwork.diagnostics", "lightwork.kernel", "lightwork.engines",
             "lightwork.api", "support.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "lightwork_only: a lightwork contract Ray does not have; skipped against Ray"
    )
    config.addinivalue_line(
        "markers", "lw_gap(backend, reason): a known gap of one backend in the conformance "
        "suite (an xfail(strict=True) there)"
    )


def pytest_ignore_collect(collection_path, config):
    """Under the Ray switch, skip test files about lightwork's internals (they import
    private modules Ray does not have, or reach them through ``support``)."""
    if AGAINST_RAY and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        source = collection_path.read_text(errors="replace")
        if any(internal in source for internal in INTERNALS):
            return True
    return None


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tests on the shared Dask cluster run last (in their order), so its processes
    # start once, live through no other test, and stop at the session's end.
    items[:] = sorted(items, key=lambda item: "shared_dask_cluster" in item.fixturenames)
    registered = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__ not in registered:
            registered.add(module.__name__)
            _cloudpickle.register_pickle_by_value(module)
        if AGAINST_RAY and item.get_closest_marker("lightwork_only"):
            item.add_marker(pytest.mark.skip(reason="lightwork-only contract"))


def _shutdown_if_running() -> None:
    import lightwork

    if lightwork.is_initialized():
        lightwork.shutdown()


@pytest.fixture(scope="module", autouse=True)
def _no_runtime_leaks_between_modules():
    yield
    _shutdown_if_running()


def _module_runtime(num_cpus):
    import lightwork

    _shutdown_if_running()
    lightwork.init(num_cpus=num_cpus)
    yield lightwork
    lightwork.shutdown()


@pytest.fixture(scope="module")
def ray_start():
    """One 4-CPU runtime shared by the tests of a module."""
    yield from _module_runtime(4)


@pytest.fixture(scope="module")
def two_cpus():
    """One 2-CPU runtime shared by the tests of a module."""
    yield from _module_runtime(2)


@pytest.fixture
def fresh_runtime():
    """No runtime before the test; whatever the test started is shut down after it."""
    import lightwork

    _shutdown_if_running()
    yield lightwork
    _shutdown_if_running()


@pytest.fixture(scope="session")
def shared_dask_cluster(tmp_path_factory):
    """One real two-worker Dask cluster (``dask_cluster.DaskCluster``) for the session's
    cluster tests; the modules connect to it and call ``wait_for_workers`` first. Nothing
    may be left behind when it stops."""
    pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")
    from tests.dask_cluster import DaskCluster

    cluster = DaskCluster(str(tmp_path_factory.mktemp("dask"))).start()
    try:
        yield cluster
    finally:
        left = cluster.stop()
        assert not left, f"processes left behind by the cluster: {left}"


@pytest.fixture(scope="module")
def cluster(shared_dask_cluster):
    """A lightwork session on the shared cluster for one test module, started with both
    workers up (a module that needs something else defines its own ``cluster``)."""
    import lightwork

    if lightwork.is_initialized():
        lightwork.shutdown()
    lightwork.init(address=shared_dask_cluster.scheduler_file)
    try:
        shared_dask_cluster.wait_for_workers(support.cluster_client())
        yield shared_dask_cluster
    finally:
        lightwork.shutdown()


@pytest.fixture
def wait_until():
    return helpers.wait_until


@pytest.fixture
def against_ray() -> bool:
    return AGAINST_RAY
