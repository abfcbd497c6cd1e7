"""The figures: each a function of a :class:`peers.Peer` that returns numbers.

A workload gets an already started peer and a :class:`Settings` (how many
repetitions), and returns ``{row name: value}``; most return one row,
``put_once_160mb_s`` also returns the put time as ``put_160mb_s`` and
``idle_worker_rss_mb`` adds two rows kept in results.json only. Lower is better
for every row. A workload raises :class:`peers.NotSupported` for a concept the peer
lacks; any other exception is the peer failing and is recorded as such.

Rules every workload follows, so the figures compare like with like:

* The task functions below live in this module, which the harness puts on
  ``PYTHONPATH`` for every peer's workers; they are imported by name, never shipped
  as code, so no peer pays for pickling a function by value.
* Each workload warms the peer up first (all worker slots have run a task and
  imported numpy), so a figure measures steady state, not worker start-up. The one
  figure about start-up, ``init_to_first_result_s``, is timed by ``run.py`` around
  ``start()`` itself.
* Timing uses ``time.perf_counter``; the data (the 160 MB array) is made before the
  clock starts.

The order of ``WORKLOADS`` is the order a peer's subprocess runs them: the idle
memory reading comes first, before any 160 MB array has passed through a worker.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from peers import WORKER_SLOTS, NotSupported, Peer

# --- task functions (run inside the peers' workers) --------------------------------


def noop() -> None:
    return None


def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


def array_nbytes(array: Any) -> int:
    return int(array.nbytes)


def pid_after(seconds: float) -> int:
    # The short sleep keeps one worker busy so the next tasks land on the others.
    time.sleep(seconds)
    return os.getpid()


# --- settings ------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    sync_calls: int = 2_000
    #: Stop adding sync batches once this much time went into them (slow peers).
    sync_budget_s: float = 15.0
    async_tasks: int = 10_000
    async_runs: int = 3
    #: Stop repeating the async run once this much time went into it (slow peers).
    async_budget_s: float = 20.0
    sleep_tasks: int = 20_000
    big_array_bytes: int = 160_000_000
    big_array_tasks: int = 10
    get_repeats: int = 5

    @classmethod
    def quick(cls) -> Settings:
        return cls(
            sync_calls=200,
            sync_budget_s=5.0,
            async_tasks=1_000,
            async_runs=1,
            async_budget_s=5.0,
            sleep_tasks=2_000,
            get_repeats=2,
        )


SLEEP_S = 0.0001
SLEEP_FIGURE_TASKS = 20_000  # the figure is "20k tasks"; quick runs scale up to it
SYNC_BATCH = 100


def warm_up(peer: Peer, numpy: bool = True) -> None:
    """Make every worker slot run a task and, unless told not to, import numpy."""
    peer.get([peer.submit(pid_after, 0.01) for _ in range(4 * WORKER_SLOTS)])
    if numpy:
        import numpy as np

        tiny = np.zeros(1)
        peer.get([peer.submit(array_nbytes, tiny) for _ in range(4 * WORKER_SLOTS)])


def make_big_array(settings: Settings) -> Any:
    import numpy as np

    return np.ones(settings.big_array_bytes // 8, dtype=np.float64)


# --- figures ---------------------------------------------------------------------------


def idle_worker_rss_mb(peer: Peer, settings: Settings) -> dict[str, float]:
    """Median resident memory of the processes that ran tasks, once they are idle.

    The workers are the processes our tasks report (``os.getpid()`` inside a task),
    which is exact for every peer; the driver itself is never counted. The warm-up
    runs only no-ops, so the workers have not imported numpy. RSS counts pages shared
    with a fork parent in full, so the unique memory (USS) is returned alongside
    (results.json only), with how many workers were measured.
    """
    import psutil

    warm_up(peer, numpy=False)
    pids: set[int] = set()
    for _ in range(5):  # a scheduler may keep reusing a few warm workers; ask again
        pids.update(peer.get([peer.submit(pid_after, 0.05) for _ in range(4 * WORKER_SLOTS)]))
        if len(pids - {os.getpid()}) >= WORKER_SLOTS:
            break
    pids.discard(os.getpid())
    if not pids:
        raise NotSupported(f"{peer.name} ran every task in the driver process")
    time.sleep(1.0)  # let the workers settle back to idle
    rss, uss = [], []
    for pid in sorted(pids):
        info = psutil.Process(pid).memory_full_info()
        rss.append(info.rss / 2**20)
        uss.append(info.uss / 2**20)
    return {
        "idle_worker_rss_mb": statistics.median(rss),
        "idle_worker_uss_mb": statistics.median(uss),
        "idle_workers_measured": len(pids),
    }


def sync_roundtrip_us(peer: Peer, settings: Settings) -> dict[str, float]:
    """``get(f.remote())`` of a no-op, one at a time: median per-call time of batches.

    Batches of 100 calls, up to ``sync_calls`` in all, fewer for a peer so slow that
    the batches exceed ``sync_budget_s`` (at least 3 batches are always measured).
    """
    warm_up(peer)
    for _ in range(SYNC_BATCH):
        peer.get([peer.submit(noop)])
    per_call_us: list[float] = []
    spent = 0.0
    for _ in range(max(1, settings.sync_calls // SYNC_BATCH)):
        start = time.perf_counter()
        for _ in range(SYNC_BATCH):
            peer.get([peer.submit(noop)])
        elapsed = time.perf_counter() - start
        per_call_us.append(elapsed / SYNC_BATCH * 1e6)
        spent += elapsed
        if spent > settings.sync_budget_s and len(per_call_us) >= 3:
            break
    return {"sync_roundtrip_us": statistics.median(per_call_us)}


def async_per_task_us(peer: Peer, settings: Settings) -> dict[str, float]:
    """Submit N no-ops, then get them all: best per-task time over a few runs."""
    warm_up(peer)
    best = float("inf")
    spent = 0.0
    for _ in range(settings.async_runs):
        start = time.perf_counter()
        handles = [peer.submit(noop) for _ in range(settings.async_tasks)]
        peer.get(handles)
        elapsed = time.perf_counter() - start
        del handles
        best = min(best, elapsed)
        spent += elapsed
        if spent > settings.async_budget_s:
            break
    return {"async_per_task_us": best / settings.async_tasks * 1e6}


def sleep_20k_s(peer: Peer, settings: Settings) -> dict[str, float]:
    """20,000 tasks that each sleep 0.1 ms, submitted at once: total seconds."""
    if peer.has_runtime:
        warm_up(peer)
    start = time.perf_counter()
    peer.get([peer.submit(sleep_for, SLEEP_S) for _ in range(settings.sleep_tasks)])
    elapsed = time.perf_counter() - start
    return {"sleep_20k_s": elapsed * SLEEP_FIGURE_TASKS / settings.sleep_tasks}


def by_value_160mb_s(peer: Peer, settings: Settings) -> dict[str, float]:
    """The same 160 MB array passed by value to 10 tasks: total seconds."""
    warm_up(peer)
    array = make_big_array(settings)
    start = time.perf_counter()
    handles = [peer.submit(array_nbytes, array) for _ in range(settings.big_array_tasks)]
    sizes = peer.get(handles)
    elapsed = time.perf_counter() - start
    assert sizes == [array.nbytes] * settings.big_array_tasks, sizes
    return {"by_value_160mb_s": elapsed}


def put_once_160mb_s(peer: Peer, settings: Settings) -> dict[str, float]:
    """``put`` the array once (``put_160mb_s``), then 10 tasks take the handle."""
    warm_up(peer)
    array = make_big_array(settings)
    start = time.perf_counter()
    ref = peer.put(array)
    put_done = time.perf_counter()
    handles = [peer.submit(array_nbytes, ref) for _ in range(settings.big_array_tasks)]
    sizes = peer.get(handles)
    end = time.perf_counter()
    assert sizes == [array.nbytes] * settings.big_array_tasks, sizes
    return {"put_160mb_s": put_done - start, "put_once_160mb_s": end - put_done}


def get_160mb_ms(peer: Peer, settings: Settings) -> dict[str, float]:
    """``get`` of a 160 MB array already in the store: median milliseconds."""
    array = make_big_array(settings)
    ref = peer.put(array)
    del array
    peer.get([ref])  # first get may set up a connection or a mapping; not the figure
    times_ms: list[float] = []
    for _ in range(settings.get_repeats):
        start = time.perf_counter()
        (value,) = peer.get([ref])
        times_ms.append((time.perf_counter() - start) * 1e3)
        assert value.nbytes == settings.big_array_bytes
        del value
    return {"get_160mb_ms": statistics.median(times_ms)}


Workload = Callable[[Peer, Settings], dict[str, float]]

#: Workload name -> function, in the order a peer's subprocess runs them.
WORKLOADS: dict[str, Workload] = {
    "idle_worker_rss_mb": idle_worker_rss_mb,
    "sync_roundtrip_us": sync_roundtrip_us,
    "async_per_task_us": async_per_task_us,
    "sleep_20k_s": sleep_20k_s,
    "by_value_160mb_s": by_value_160mb_s,
    "put_once_160mb_s": put_once_160mb_s,
    "get_160mb_ms": get_160mb_ms,
}

#: Rows a workload may produce besides its own name.
EXTRA_ROWS: dict[str, tuple[str, ...]] = {
    "put_once_160mb_s": ("put_160mb_s",),
    "idle_worker_rss_mb": ("idle_worker_uss_mb", "idle_workers_measured"),
}

#: Workloads the serial baseline runs (it has no runtime for the others).
BASELINE_WORKLOADS: tuple[str, ...] = ("sleep_20k_s",)
