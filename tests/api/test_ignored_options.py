"""Ray options that have no effect on one machine say so, once.

lightwork-only: Ray applies these options (or has no such warning), so the warnings and
the stricter type checks are lightwork's own.
"""

from __future__ import annotations

import warnings

import pytest

import lightwork
from lightwork.kernel import runtime_env  # its warn-once registry, reset between tests
from lightwork.exceptions import IgnoredOptionWarning

pytestmark = pytest.mark.lightwork_only


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(runtime_env, "_warned", set())


def _task():
    return 1


class _Actor:
    def ping(self):
        return "pong"


TASK_CASES = [
    ("accelerator_type", "A100"),
    ("label_selector", {"zone": "a"}), ("_metadata", {"key": "value"}),
]


@pytest.mark.parametrize(("option", "value"), TASK_CASES, ids=[c[0] for c in TASK_CASES])
def test_a_task_option_without_effect_warns_once_with_what_to_do(option, value):
    """Regression: these were accepted and silently ignored."""
    function = lightwork.remote(_task)
    with pytest.warns(IgnoredOptionWarning, match=f"{option!r}.*no effect") as caught:
        function.options(**{option: value})
    assert len(caught) == 1 and "_task" in str(caught[0].message)
    assert caught[0].filename == __file__  # points at the user's line, not lightwork's
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time: silent
        function.options(**{option: value})
        lightwork.remote(**{option: value})(_task)


@pytest.mark.parametrize("value", [None, 0, {}])
def test_rays_defaults_ask_for_nothing_and_do_not_warn(value):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lightwork.remote(_task).options(label_selector=value or None, _metadata=value or None)
        lightwork.remote(max_calls=value if value != {} else 0)(_task)


def test_actor_options_without_effect_warn():
    cls = lightwork.remote(_Actor)
    with pytest.warns(IgnoredOptionWarning, match="'concurrency_groups'.*max_concurrency"):
        cls.options(concurrency_groups={"io": 2})
    with pytest.warns(IgnoredOptionWarning, match="'concurrency_groups'"):
        runtime_env._warned.clear()
        lightwork.method(concurrency_group="io")


@pytest.mark.parametrize(("option", "value", "error"), [
    ("accelerator_type", 100, TypeError), ("label_selector", ["a"], TypeError),
    ("_metadata", "x", TypeError), ("memory", "1GB", TypeError),
])
def test_bad_values_are_refused_naming_the_option(option, value, error):
    with pytest.raises(error, match=option):
        lightwork.remote(_task).options(**{option: value})


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_bad_max_calls_are_refused_naming_the_option(value):
    with pytest.raises(ValueError, match="max_calls"):
        lightwork.remote(max_calls=value)(_task)


def test_bad_concurrency_groups_are_refused():
    with pytest.raises(TypeError, match="concurrency_groups"):
        lightwork.remote(_Actor).options(concurrency_groups={"io": 0})
    with pytest.raises(TypeError, match="concurrency_group"):
        lightwork.method(concurrency_group=3)


def test_capture_on_an_actor_is_applied_not_warned_about(fresh_runtime):
    """It used to warn (IgnoredOptionWarning); actors capture now (test_placement_groups)."""
    from lightwork.util import placement_group, remove_placement_group
    from lightwork.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    lightwork.init(num_cpus=2)
    group = placement_group([{"CPU": 1}])
    try:
        capturing = PlacementGroupSchedulingStrategy(
            group, placement_group_capture_child_tasks=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error", IgnoredOptionWarning)
            actor = lightwork.remote(_Actor).options(scheduling_strategy=capturing).remote()
        assert lightwork.get(actor.ping.remote(), timeout=20) == "pong"
    finally:
        remove_placement_group(group)


def test_detached_placement_group_warns(fresh_runtime, monkeypatch):
    import importlib

    placement_group_module = importlib.import_module("lightwork.util.placement_group")
    monkeypatch.setattr(runtime_env, "_warned", set())
    lightwork.init(num_cpus=2)
    with pytest.warns(IgnoredOptionWarning, match="detached"):
        group = placement_group_module.placement_group([{"CPU": 1}], lifetime="detached")
    assert lightwork.get(group.ready(), timeout=20) == group
    placement_group_module.remove_placement_group(group)


def test_a_task_with_ignored_options_still_runs(fresh_runtime):
    lightwork.init(num_cpus=2)
    with pytest.warns(IgnoredOptionWarning):
        function = lightwork.remote(_task).options(accelerator_type="A100")
    assert lightwork.get([function.remote() for _ in range(3)], timeout=20) == [1, 1, 1]


def test_cancel_recursive_must_be_a_bool(fresh_runtime):
    lightwork.init(num_cpus=2)
    ref = lightwork.put(1)
    with pytest.raises(TypeError, match="recursive"):
        lightwork.cancel(ref, recursive="yes")
    lightwork.cancel(ref, recursive=False)  # a bool is fine (the object is no task's)
