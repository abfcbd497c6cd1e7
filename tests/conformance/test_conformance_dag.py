"""Lazy graphs (``lightwork.dag``, Ray's DAG API) on every backend.

``bind`` records calls and ``execute`` submits them as ordinary tasks and actor calls,
so a graph must behave the same on the embedded runtime and on a Dask cluster: its
input (``InputNode`` and its parts), actors made and called in the graph, calls on live
handles, several outputs, a shared node run once per ``execute``, nodes nested in
containers, options, and the errors for a graph used the wrong way.
"""

# ruff: noqa: F811 - the tests take the imported ``backend`` fixture by its name

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
from tests.conformance.test_conformance import _apply_gaps, backend  # noqa: F401

import lightwork
from lightwork.dag import InputNode, MultiOutputNode

LIMIT = 20  # seconds: a get that takes longer is a hang


from tests.conformance.test_conformance import add, fresh  # noqa: E402 - shared tasks


@lightwork.remote
def pair(a, b):
    return a, b


@lightwork.remote
def kinds(box):
    return [type(item).__name__ for item in box], lightwork.get(box[0])


@lightwork.remote
class Log:
    def __init__(self, first):
        self.entries = [first]
        self.token = uuid.uuid4().hex

    def append(self, item):
        self.entries.append(item)
        return list(self.entries)

    def who(self):
        return self.token

    @lightwork.method(num_returns=2)
    def split(self, value):
        return value, -value


def get(refs):
    return lightwork.get(refs, timeout=LIMIT)


def test_a_chain_runs_with_one_input_value(backend):
    with InputNode() as inp:
        graph = add.bind(add.bind(inp, 1), 10)
    assert get(graph.execute(5)) == 16
    assert get(graph.execute(0)) == 11  # a graph runs again with another input


def test_positional_and_keyword_inputs_are_its_parts(backend):
    with InputNode() as inp:
        graph = MultiOutputNode([add.bind(inp[0], inp[1]), add.bind(inp.k, inp["k"])])
    first, second = graph.execute(2, 3, k=7)
    assert get([first, second]) == [5, 14]


def test_one_input_object_is_read_by_key_and_attribute(backend):
    with InputNode() as inp:
        by_key = add.bind(inp["a"], inp["b"])
    assert get(by_key.execute({"a": 1, "b": 2})) == 3
    with InputNode() as inp:
        by_attribute = add.bind(inp.x, 1)
    assert get(by_attribute.execute(SimpleNamespace(x=41))) == 42


def test_without_a_with_block_an_input_node_works_too(backend):
    inp = InputNode()
    assert get(add.bind(inp, 2).execute(40)) == 42


def test_an_actor_made_in_the_graph_runs_its_calls_in_bind_order(backend):
    with InputNode() as inp:
        log = Log.bind("start")
        log.append.bind("a")
        graph = log.append.bind(inp)
    assert get(graph.execute("b")) == ["start", "a", "b"]
    # every execute makes its own actor: the list starts over
    assert get(graph.execute("c")) == ["start", "a", "c"]


def test_executing_a_class_node_gives_a_handle(backend):
    handle = Log.bind("x").execute()
    assert get(handle.append.remote("y")) == ["x", "y"]


def test_a_live_handles_method_binds(backend):
    log = Log.remote("live")
    with InputNode() as inp:
        graph = log.append.bind(add.bind(inp, 1))
    assert get(graph.execute(1)) == ["live", 2]
    assert get(graph.execute(2)) == ["live", 2, 3]  # the same actor each time


def test_multi_output_node_returns_a_ref_per_node(backend):
    graph = MultiOutputNode([add.bind(1), add.bind(2, 3)])
    refs = graph.execute()
    assert isinstance(refs, list) and all(isinstance(r, lightwork.ObjectRef) for r in refs)
    assert get(refs) == [1, 5]


def test_a_shared_node_runs_once_per_execute(backend):
    shared = fresh.bind()
    graph = pair.bind(shared, shared)
    a, b = get(graph.execute())
    assert a == b  # one task fed both arguments
    c, _ = get(graph.execute())
    assert c != a  # a new execute runs it again


def test_an_actor_shared_by_two_calls_is_made_once(backend):
    log = Log.bind("one")
    graph = MultiOutputNode([log.who.bind(), log.who.bind()])
    first, second = get(graph.execute())
    assert first == second


def test_a_node_inside_a_list_arrives_as_a_ref(backend):
    graph = kinds.bind([add.bind(4, 5)])
    assert get(graph.execute()) == (["ObjectRef"], 9)


def test_options_apply_to_the_bound_call(backend):
    graph = pair.options(num_returns=2).bind(1, 2)
    refs = graph.execute()
    assert isinstance(refs, list) and get(refs) == [1, 2]
    log = Log.options(max_concurrency=2).bind("o")
    assert get(log.split.bind(3).execute()) == [3, -3]
    assert get(log.append.options(name="renamed").bind(1).execute()) == ["o", 1]


def test_misuse_fails_at_once_with_what_to_do(backend):
    with pytest.raises(TypeError, match="no InputNode, so execute\\(\\) takes no arguments"):
        add.bind(1, 2).execute(3)
    with InputNode() as inp:
        needs_input = add.bind(inp, 1)
    with pytest.raises(TypeError, match="needs its input"):
        needs_input.execute()
    with pytest.raises(TypeError, match="missing a required argument"):
        pair.bind(1)
    with pytest.raises(ValueError, match="actor's constructor"):
        Log.bind(InputNode())
    with pytest.raises(AttributeError, match="execute"):
        add.bind(1).remote()
    with pytest.raises(ValueError, match="2 different InputNodes"):
        pair.bind(InputNode(), InputNode()).execute(1)
    with pytest.raises(TypeError, match="graph nodes"):
        MultiOutputNode([add.bind(1), 2])
    with pytest.raises(AttributeError, match="no method 'nope'"):
        Log.bind("x").nope.bind()
