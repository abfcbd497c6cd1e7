"""The limit on one streaming generator's items, set by the environment that starts the
runtime (``RAY_max_num_generator_returns``, as Ray programs set it)."""

from __future__ import annotations

import pytest

import lightwork


@lightwork.remote
def yields(count):
    for i in range(count):
        yield i


def test_a_stream_past_the_limit_ends_with_an_error_naming_it(fresh_runtime, monkeypatch):
    monkeypatch.setenv("RAY_max_num_generator_returns", "2")
    lightwork.init(num_cpus=1)
    stream = yields.remote(3)
    assert [lightwork.get(next(stream)) for _ in range(2)] == [0, 1]
    with pytest.raises(ValueError, match="more than 2 items.*RAY_max_num_generator_returns"):
        lightwork.get(next(stream))
    with pytest.raises(StopIteration):
        next(stream)
    # At the limit is allowed.
    assert [lightwork.get(ref) for ref in yields.remote(2)] == [0, 1]


def test_a_limit_that_is_no_number_is_refused_naming_the_variable(monkeypatch):
    from lightwork.kernel import generators

    monkeypatch.setattr(generators, "_max_stream_items", None)
    monkeypatch.setenv("RAY_max_num_generator_returns", "lots")
    with pytest.raises(ValueError, match="RAY_max_num_generator_returns='lots'"):
        generators.max_stream_items()
    monkeypatch.setattr(generators, "_max_stream_items", None)
    monkeypatch.delenv("RAY_max_num_generator_returns")
    assert generators.max_stream_items() == generators.DEFAULT_MAX_STREAM_ITEMS
