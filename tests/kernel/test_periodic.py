"""The runtime's periodic thread (used by the memory monitor and the advisor): rounds
until stopped, and a round that raises is handed to the owner, who says go on or end."""

from __future__ import annotations

import threading

import pytest
from tests.helpers import wait_until

from lightwork.kernel.periodic import PeriodicThread


def test_rounds_run_until_stop_and_stop_ends_the_thread():
    rounds: list[int] = []
    thread = PeriodicThread("test-periodic", 0.01, lambda: rounds.append(1),
                            on_error=lambda error: True)
    thread.start()
    wait_until(lambda: len(rounds) >= 3, timeout=10, message="three rounds")
    thread.stop()
    assert not thread._thread.is_alive()
    done = len(rounds)
    thread.stop()  # twice is harmless
    assert len(rounds) == done


@pytest.mark.parametrize("keep_going", [True, False])
def test_a_failing_round_goes_to_on_error_which_decides(keep_going):
    errors: list[Exception] = []

    def fail() -> None:
        raise ValueError("bad reading")

    def on_error(error: Exception) -> bool:
        errors.append(error)
        return keep_going

    thread = PeriodicThread("test-periodic", 0.01, fail, on_error)
    thread.start()
    if keep_going:
        wait_until(lambda: len(errors) >= 2, timeout=10, message="a second round")
    else:
        wait_until(lambda: not thread._thread.is_alive(), timeout=10,
                   message="the thread to end after its first failure")
        assert len(errors) == 1
    thread.stop()
    assert errors and all(isinstance(error, ValueError) for error in errors)


def test_stop_from_a_round_itself_does_not_deadlock():
    stopped = threading.Event()
    thread: PeriodicThread

    def round_that_stops() -> None:
        thread.stop()  # e.g. a round that ends the runtime
        stopped.set()

    thread = PeriodicThread("test-periodic", 0.01, round_that_stops, lambda error: False)
    thread.start()
    assert stopped.wait(10)
    wait_until(lambda: not thread._thread.is_alive(), timeout=10, message="the thread to end")
