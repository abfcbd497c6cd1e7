"""Ray's module paths under ``lightwork.util``: state, ActorPool, inspect_serializability,
scheduling strategies, and the actor's ``__ray_ready__``."""

from __future__ import annotations

import io
import threading

import pytest

import lightwork
import lightwork.util
import lightwork.util.state
from lightwork.util import ActorPool, inspect_serializability
from lightwork.util.scheduling_strategies import NodeAffinitySchedulingStrategy

_lock = threading.Lock()


def _uses_lock():
    with _lock:
        return 1


def _fine(x):
    return x + 1


class _HoldsLock:
    def __init__(self):
        self.name = "holder"
        self.lock = threading.Lock()


def test_util_paths_are_rays():
    assert lightwork.util.ActorPool is ActorPool
    for name in ("list_tasks", "list_actors", "list_objects", "list_workers",
                 "summarize_tasks"):
        assert callable(getattr(lightwork.util.state, name))


def test_inspect_serializability_passes_a_picklable_function():
    out = io.StringIO()
    ok, failures = inspect_serializability(_fine, name="fine", print_file=out)
    assert ok is True and failures == set()
    assert "fine" in out.getvalue()


def test_inspect_serializability_names_the_global_that_cannot_be_pickled():
    out = io.StringIO()
    ok, failures = inspect_serializability(_uses_lock, name="uses_lock", print_file=out)
    assert ok is False
    (failure,) = failures
    assert failure.path[-1] == "_lock" and failure.obj is _lock and failure.parent is _uses_lock
    text = out.getvalue()
    assert "uses_lock" in text and "_lock" in text and "FAIL" in text


def test_inspect_serializability_names_the_attribute_that_cannot_be_pickled():
    holder = _HoldsLock()
    ok, failures = inspect_serializability(holder, name="holder", print_file=io.StringIO())
    assert ok is False
    (failure,) = failures
    assert failure.path[-1] == "lock" and failure.parent is holder


@pytest.mark.lightwork_only
def test_inspect_serializability_looks_inside_containers():
    """lightwork-only: Ray looks at a container's attributes, not at its items."""
    holder = _HoldsLock()
    ok, failures = inspect_serializability({"k": [holder]}, name="d", depth=4,
                                           print_file=io.StringIO())
    assert ok is False
    (failure,) = failures
    assert failure.path == ("d", "['k']", "[0]", "lock") and failure.name == "lock"
    assert failure.parent is holder


@pytest.mark.lightwork_only
def test_inspect_serializability_depth_one_blames_the_value_itself():
    """lightwork-only: depth counts the levels looked at, the value included."""
    holder = _HoldsLock()
    ok, failures = inspect_serializability(holder, name="h", depth=1, print_file=io.StringIO())
    assert ok is False
    assert {(f.path, f.obj is holder) for f in failures} == {(("h",), True)}


@pytest.mark.lightwork_only
def test_inspect_serializability_refuses_a_bad_depth():
    with pytest.raises(ValueError, match="depth"):
        inspect_serializability(_fine, depth=0)


def test_actor_ray_ready_returns_true_once_constructed(ray_start):
    @lightwork.remote
    class Slow:
        def __init__(self):
            self.up = True

        def up_(self):
            return self.up

    actor = Slow.remote()
    assert lightwork.get(actor.__ray_ready__.remote(), timeout=30) is True


def test_node_affinity_to_this_node_runs_here(ray_start):
    @lightwork.remote
    def where():
        return lightwork.get_runtime_context().get_node_id()

    node_id = lightwork.get_runtime_context().get_node_id()
    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    assert lightwork.get(where.options(scheduling_strategy=strategy).remote()) == node_id
    for name in ("DEFAULT", "SPREAD"):
        assert lightwork.get(where.options(scheduling_strategy=name).remote()) == node_id
