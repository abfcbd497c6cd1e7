"""A task cancelled while it blocks in a nested ``get``: its worker's CPU is lent and
taken back correctly afterwards, so later tasks on that worker still lend theirs.

A fresh one-CPU runtime per test: the lending only shows when one CPU is all there is.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import lightwork as ray


@ray.remote(num_cpus=0)
class _Latch:
    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def wait(self) -> None:
        await self.opened.wait()

    async def open(self) -> None:
        self.opened.set()


@ray.remote
def _get_first(refs: list) -> Any:
    return ray.get(refs[0])


@ray.remote
def _one() -> int:
    return 1


def test_a_task_cancelled_in_a_nested_get_gives_its_cpu_back_for_good(fresh_runtime):
    """On one CPU, a task blocked in a nested ``get`` lends its CPU while it waits. Cancel
    it there: the next task placed on that worker must lend the CPU again when it blocks
    in turn, or a third task can never run (the worker stayed counted as blocked, so it
    lent nothing)."""
    ray.init(num_cpus=1)
    first = _get_first.remote([_Latch.remote().wait.remote()])
    assert ray.wait([first], timeout=0.5)[0] == []
    ray.cancel(first)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(first, timeout=20)
    latch = _Latch.remote()
    second = _get_first.remote([latch.wait.remote()])  # on the same (only idle) worker
    assert ray.wait([second], timeout=0.5)[0] == []
    assert ray.get(_one.remote(), timeout=20) == 1
    ray.get(latch.open.remote(), timeout=20)
    assert ray.get(second, timeout=20) is None
