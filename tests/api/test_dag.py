"""Lazy graphs on the embedded runtime: what the conformance suite does not cover
(``tests/conformance/test_conformance_dag.py`` runs the behaviour on both backends).

A deep chain runs (the walk is not recursive), a graph is built before ``init``, the
tasks a graph submits are recorded at the user's ``execute()`` line (so the timeline and
the advisor point there), ``ray.dag`` is ``lightwork.dag``, and the messages of a
misread input and of a node pickled inside an object.
"""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys

import pytest
from tests import support
from tests.helpers import script_env

import lightwork
from lightwork.dag import InputNode

pytestmark = pytest.mark.lightwork_only


@lightwork.remote
def inc(x):
    return x + 1


@lightwork.remote
def keep(box):
    return box


def test_a_chain_deeper_than_the_recursion_limit_executes(ray_start):
    node = inc.bind(0)
    for _ in range(1200):
        node = inc.bind(node)
    assert lightwork.get(node.execute(), timeout=60) == 1201


def test_a_graph_built_before_init_executes_after_it(fresh_runtime):
    with InputNode() as inp:
        graph = inc.bind(inc.bind(inp))
    lightwork.init(num_cpus=1)
    assert lightwork.get(graph.execute(1), timeout=20) == 3


def test_the_tasks_of_a_graph_are_recorded_at_the_execute_line(ray_start):
    graph = inc.bind(inc.bind(100))
    line = inspect.currentframe().f_lineno + 1
    ref = graph.execute()
    assert lightwork.get(ref, timeout=20) == 102
    task_id = support.task_id_of(ref)
    records = [r for r in support.event_log().ended_records() if r.task_id == task_id]
    assert records and records[0].callsite[:2] == (__file__, line)


def test_ray_dag_is_lightwork_dag():
    program = ("import lightwork; lightwork.install_as_ray(); import ray.dag; "
               "from ray.dag import InputNode; "
               "print(ray.dag is lightwork.dag, InputNode is lightwork.dag.InputNode)")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, env=script_env())
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_a_missing_part_of_the_input_names_what_execute_got(ray_start):
    with InputNode() as inp:
        graph = inc.bind(inp.count)
    with pytest.raises(KeyError, match="no keyword argument of that name .*'other'"):
        graph.execute(1, other=2)
    with InputNode() as inp:
        graph = inc.bind(inp[2])
    with pytest.raises(IndexError, match="positional input 2, but execute\\(\\) was given 2"):
        graph.execute(1, 2)
    with InputNode() as inp:
        graph = inc.bind(inp["a"])
    with pytest.raises(KeyError, match="was given dict"):
        graph.execute({"b": 1})
    with pytest.raises(TypeError, match="indexed by an int"):
        InputNode()[1.5]


def test_a_node_hidden_in_an_object_is_refused_when_sent(ray_start):
    class Holder:
        def __init__(self, node):
            self.node = node

    with pytest.raises(TypeError, match="cannot be sent to a task or pickled"):
        pickle.dumps(inc.bind(1))
    with pytest.raises(Exception, match="cannot be sent to a task"):
        keep.bind(Holder(inc.bind(1))).execute()


def test_binding_twice_or_calling_remote_on_a_method_node_says_what_to_do(ray_start):
    @lightwork.remote
    class Pad:
        def put(self, x):
            return x

    pad = Pad.bind()
    with pytest.raises(AttributeError, match="use .bind\\(\\)"):
        pad.put.remote(1)
    with pytest.raises(AttributeError, match="cannot be used on a graph node"):
        pad.put.bind(1).bind(2)
