"""Time a call spent paused in the debugger is the user's: the advisor counts it
neither as work nor as waiting (records built by hand, as in ``test_advisor_rules``)."""

from __future__ import annotations

from tests.diagnostics.test_advisor_rules import (
    T0,
    _actor_calls,
    _findings,
    _get_chain,
    _one_at_a_time,
)


def _paused(records):
    """The same records, each paused in the debugger for most of its run."""
    for record in records:
        record.paused = ((record.args_loaded + 0.001, record.finished - 0.001),)
    return records


def test_gets_that_waited_for_a_paused_call_are_not_get_in_loop():
    records = _one_at_a_time()
    assert {f.kind for f in _findings(records, _get_chain(records))} == {"get-in-loop"}
    records = _paused(_one_at_a_time())
    assert _findings(records, _get_chain(records)) == []


def test_calls_paused_on_one_actor_are_not_actor_bottleneck():
    assert {f.kind for f in _findings(_actor_calls(deps_wait=False))} == {"actor-bottleneck"}
    assert _findings(_paused(_actor_calls(deps_wait=False))) == []


def test_paused_time_is_not_counted_as_busy_slots():
    from lightwork.diagnostics.advisor import Advisor

    records = _paused(_one_at_a_time(count=2, run=1.0))
    advisor = Advisor(cpus=2, cores=2)
    advisor.feed(records, [])
    busy = advisor._busy.between(T0, T0 + 3)
    assert 0.0 <= busy < 0.01  # two runs of 1 s, all but 2 ms of each paused
