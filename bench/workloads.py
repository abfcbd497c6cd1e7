"""The figures: each a function of a :class:`peers.Peer` that returns numbers.

A workload gets an already started peer and a :class:`Settings` (how many
repetitions), and returns ``{row name: value}``; most return one row,
``put_once_160mb_s`` also returns the put time as ``put_160mb_s``, and
``idle_worker_rss_mb``, ``idle_actor_rss_mb`` and ``actors_200_start_s`` add rows
kept in results.json only. Lower is better for every row. A workload raises
:class:`peers.NotSupported` for a concept the peer lacks and :class:`OverBudget`
when a peer is too slow to finish within the figure's time budget; any other
exception is the peer failing and is recorded as such.

Rules every workload follows, so the figures compare like with like:

* The task functions and the actor class below live in this module, which the
  harness puts on ``PYTHONPATH`` for every peer's workers; they are imported by
  name, never shipped as code, so no peer pays for pickling a function by value.
* Each workload warms the peer up first (all worker slots have run a task and
  imported numpy), so a figure measures steady state, not worker start-up. The one
  figure about start-up, ``init_to_first_result_s``, is timed by ``run.py`` around
  ``start()`` itself.
* Timing uses ``time.perf_counter``; the data (the 160 MB array) is made before the
  clock starts.

The order of ``WORKLOADS`` is the order a peer's subprocess runs them: the idle
memory readings come first, before any 160 MB array has passed through a worker
(Ray may host an actor in a pooled worker that ran tasks), and the 200 actors come
last, since a peer may still be reaping them when the next figure would start.

Lightwork alone also measures what its diagnostics cost: the same figure with a
diagnostic on and off, for the "lightwork diagnostics cost" table. The variants run
in turn (A, B, C, A, B, C, ...; each round starting one variant later) and each keeps
its best, so a drift in the machine's load weighs on all of them alike.
``LIGHTWORK_WORKLOADS`` run in lightwork's subprocess after ``WORKLOADS``, in its
session; ``LIGHTWORK_INIT_WORKLOADS`` start and stop sessions themselves (they
compare ``init`` settings), so ``run.py`` gives them a second lightwork subprocess.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from peers import WORKER_SLOTS, NotSupported, Peer, lightwork_peer

# --- task functions (run inside the peers' workers) --------------------------------


def noop() -> None:
    return None


def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


def array_nbytes(array: Any) -> int:
    return int(array.nbytes)


def inc(x: int) -> int:
    return x + 1


def pid_after(seconds: float) -> int:
    # The short sleep keeps one worker busy so the next tasks land on the others.
    time.sleep(seconds)
    return os.getpid()


class Idle:
    """The actor of every actor figure: its methods do nothing measurable."""

    def ping(self) -> None:
        return None

    def pid(self) -> int:
        return os.getpid()


class OverBudget(Exception):
    """The peer did not finish within the figure's time budget: report a lower bound.

    ``bound`` is the budget in the row's unit; ``detail`` says how far it got.
    """

    def __init__(self, bound: float, detail: str) -> None:
        super().__init__(f"> {bound:g}; {detail}")
        self.bound = bound
        self.detail = detail


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
    #: Actors started one after another for the start-up figure (median).
    actor_starts: int = 5
    #: Idle actors whose memory is read (median).
    idle_actors: int = 3
    many_actors: int = 200
    #: Give up waiting for the many actors after this long (Ray takes minutes on 2 cores).
    many_actors_budget_s: float = 180.0
    #: Lightwork's diagnostics cost: tasks per run, rounds of interleaved variants (the
    #: Dask graph takes seconds a run, so fewer), and when to stop adding rounds.
    cost_tasks: int = 20_000
    cost_rounds: int = 20
    dask_cost_rounds: int = 6
    cost_budget_s: float = 75.0
    #: Sessions started per ``init`` variant, and async runs in each. A fresh session's
    #: speed varies ±15% from the next one's: with 5 sessions the event-log and advisor
    #: rows swung from -6% to +17% between runs of the same code; with 12, three runs
    #: gave -1.1 to +4.6% (log) and +0.4 to +2.9% (advisor), in ~35 s instead of ~15.
    cost_sessions: int = 12
    cost_async_runs: int = 3
    #: Batches of ``async_tasks`` whose advisor looks are timed (``advisor_looks``).
    advisor_batches: int = 8

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
            actor_starts=3,
            idle_actors=1,
            many_actors=20,
            many_actors_budget_s=30.0,
            cost_tasks=2_000,
            cost_rounds=1,
            dask_cost_rounds=1,
            cost_budget_s=10.0,
            cost_sessions=1,
            cost_async_runs=1,
            advisor_batches=2,
        )


SLEEP_S = 0.0001
SLEEP_FIGURE_TASKS = 20_000  # the figure is "20k tasks"; quick runs scale up to it
SYNC_BATCH = 100
MANY_ACTORS_FIGURE = 200  # the figure is "200 actors"; quick runs scale up to it
COST_FIGURE_TASKS = 20_000  # the cost figures are "20k tasks"; quick runs scale up to it
#: ResourceProfiler's sampling interval in the cost figures (Dask's default is 1 s).
RESOURCE_DT_S = 0.25
#: How long the 200-actor figure waits (untimed) for the dropped actors' processes.
ACTORS_EXIT_WAIT_S = 60.0


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


def median_sync_us(submit: Callable[[], Any], peer: Peer, settings: Settings) -> float:
    """``get([submit()])`` one at a time: median per-call microseconds of batches.

    Batches of 100 calls, up to ``sync_calls`` in all, fewer for a peer so slow that
    the batches exceed ``sync_budget_s`` (at least 3 batches are always measured).
    """
    for _ in range(SYNC_BATCH):
        peer.get([submit()])
    per_call_us: list[float] = []
    spent = 0.0
    for _ in range(max(1, settings.sync_calls // SYNC_BATCH)):
        start = time.perf_counter()
        for _ in range(SYNC_BATCH):
            peer.get([submit()])
        elapsed = time.perf_counter() - start
        per_call_us.append(elapsed / SYNC_BATCH * 1e6)
        spent += elapsed
        if spent > settings.sync_budget_s and len(per_call_us) >= 3:
            break
    return statistics.median(per_call_us)


def best_async_us(submit: Callable[[], Any], peer: Peer, settings: Settings) -> float:
    """Submit ``async_tasks`` calls, then get them all: best per-call microseconds
    over ``async_runs`` runs (fewer if they take over ``async_budget_s``)."""
    best = float("inf")
    spent = 0.0
    for _ in range(settings.async_runs):
        start = time.perf_counter()
        handles = [submit() for _ in range(settings.async_tasks)]
        peer.get(handles)
        elapsed = time.perf_counter() - start
        del handles
        best = min(best, elapsed)
        spent += elapsed
        if spent > settings.async_budget_s:
            break
    return best / settings.async_tasks * 1e6


def sync_roundtrip_us(peer: Peer, settings: Settings) -> dict[str, float]:
    """``get(f.remote())`` of a no-op, one at a time (see :func:`median_sync_us`)."""
    warm_up(peer)
    return {"sync_roundtrip_us": median_sync_us(lambda: peer.submit(noop), peer, settings)}


def async_per_task_us(peer: Peer, settings: Settings) -> dict[str, float]:
    """Submit N no-ops, then get them all: best per-task time over a few runs."""
    warm_up(peer)
    return {"async_per_task_us": best_async_us(lambda: peer.submit(noop), peer, settings)}


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


def idle_actor_rss_mb(peer: Peer, settings: Settings) -> dict[str, float]:
    """Median resident memory of idle actor processes (the pid each actor reports).

    Like :func:`idle_worker_rss_mb`: the actors have answered one call and then idled
    for 1 s; the unique memory (USS) goes to results.json alongside. The actors are
    dropped at the end.
    """
    import psutil

    if not peer.actors_have_processes:
        # Say where the actors live, so the n/a is informative rather than a shrug.
        actor = peer.start_actor(Idle)
        (pid,) = peer.get([peer.call(actor, "pid")])
        host = psutil.Process(pid).memory_info().rss / 2**20
        raise NotSupported(
            f"{peer.name} actors are objects inside a worker process, not processes of "
            f"their own (the hosting worker's RSS: {host:.0f} MB)"
        )
    warm_up(peer, numpy=False)
    actors = [peer.start_actor(Idle) for _ in range(settings.idle_actors)]
    pids = peer.get([peer.call(actor, "pid") for actor in actors])
    if os.getpid() in pids:
        raise NotSupported(f"{peer.name} ran an actor in the driver process")
    time.sleep(1.0)  # let the actors settle back to idle
    rss, uss = [], []
    for pid in pids:
        info = psutil.Process(pid).memory_full_info()
        rss.append(info.rss / 2**20)
        uss.append(info.uss / 2**20)
    del actors
    return {
        "idle_actor_rss_mb": statistics.median(rss),
        "idle_actor_uss_mb": statistics.median(uss),
    }


def actor_start_first_call_ms(peer: Peer, settings: Settings) -> dict[str, float]:
    """From ``Cls.remote()`` until the actor's first call returns: median milliseconds.

    The actors are started one after another and kept until the end, so each start
    is a new actor; one untimed start first registers the class (Ray exports it on
    first use). A peer may place an actor in an idle pooled worker (Ray does while it
    has some), which this figure rewards as it would reward the user.
    """
    warm_up(peer, numpy=False)
    actors = [peer.start_actor(Idle)]
    peer.get([peer.call(actors[0], "ping")])
    times_ms: list[float] = []
    for _ in range(settings.actor_starts):
        start = time.perf_counter()
        actor = peer.start_actor(Idle)
        peer.get([peer.call(actor, "ping")])
        times_ms.append((time.perf_counter() - start) * 1e3)
        actors.append(actor)
    del actors, actor
    return {"actor_start_first_call_ms": statistics.median(times_ms)}


def actor_sync_call_us(peer: Peer, settings: Settings) -> dict[str, float]:
    """``get(a.ping.remote())`` on one actor, one call at a time (:func:`median_sync_us`)."""
    actor = peer.start_actor(Idle)
    us = median_sync_us(lambda: peer.call(actor, "ping"), peer, settings)
    return {"actor_sync_call_us": us}


def actor_async_per_call_us(peer: Peer, settings: Settings) -> dict[str, float]:
    """10,000 calls to one actor submitted, then ``get`` them all: best per call."""
    actor = peer.start_actor(Idle)
    peer.get([peer.call(actor, "ping") for _ in range(SYNC_BATCH)])
    us = best_async_us(lambda: peer.call(actor, "ping"), peer, settings)
    return {"actor_async_per_call_us": us}


def actors_200_start_s(peer: Peer, settings: Settings) -> dict[str, float]:
    """Start 200 actors, call each once, drop them: seconds until every call answered.

    All the actors are started before any call is made, as the lessons' loops do.
    Quick runs start ``many_actors`` and scale up to 200. After the clock stops the
    handles are dropped and, for peers whose actors are processes, the figure waits
    (untimed, up to 60 s) for those processes to exit, so they do not weigh on the
    shutdown figure; results.json gets that time as ``actors_200_exit_s``.
    """
    warm_up(peer, numpy=False)
    n = settings.many_actors
    start = time.perf_counter()
    actors = [peer.start_actor(Idle) for _ in range(n)]
    calls = [peer.call(actor, "pid") for actor in actors]
    answered = peer.ready(calls, settings.many_actors_budget_s)
    elapsed = time.perf_counter() - start
    if answered < n:
        del actors, calls
        raise OverBudget(
            settings.many_actors_budget_s * MANY_ACTORS_FIGURE / n,
            f"{answered} of {n} actors answered within {settings.many_actors_budget_s:g} s",
        )
    pids = set(peer.get(calls))
    rows = {"actors_200_start_s": elapsed * MANY_ACTORS_FIGURE / n}
    del actors, calls
    if peer.actors_have_processes:
        rows["actors_200_exit_s"] = wait_for_exit(pids, ACTORS_EXIT_WAIT_S)
    return rows


def wait_for_exit(pids: set[int], limit: float) -> float:
    """Seconds until none of ``pids`` runs (zombies count as gone); ``limit`` at most."""
    import psutil

    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        alive = 0
        for pid in pids:
            try:
                alive += psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                pass
        if not alive:
            break
        time.sleep(0.05)
    return time.perf_counter() - start


# --- lightwork diagnostics cost (lightwork only) ------------------------------------


def interleaved(
    variants: dict[str, Callable[[], float]], rounds: int, budget_s: float
) -> dict[str, list[float]]:
    """Run every variant once per round, in turn; each variant's values, round by round.

    Each round starts one variant later than the one before, so no variant always
    follows the same other one (whose garbage or exiting processes it would inherit);
    the heap is collected, untimed, before each run. After a round, no further round
    starts once ``budget_s`` has gone by (the first round always runs in full).
    """
    names = list(variants)
    values: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    for n in range(rounds):
        shift = n % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            values[name].append(variants[name]())
        if time.perf_counter() - start > budget_s:
            break
    return values


def change_row(row: str) -> str:
    """The figure that holds ``row``'s change against its baseline, in percent."""
    return f"{row}_change_pct"


def paired_change(on: list[float], off: list[float]) -> float:
    """The median over rounds of ``on``'s value over ``off``'s in the same round, minus
    one, in percent. Pairing the runs of one round cancels the slow drifts of a shared
    machine, which move best-of values taken minutes apart by ±10%."""
    return (statistics.median(a / b for a, b in zip(on, off)) - 1) * 100


def with_changes(values: dict[str, list[float]], baseline: str, scale: float = 1.0) -> dict[
        str, float]:
    """Each variant's best value (times ``scale``) and, for each but ``baseline``, its
    change against the baseline (:func:`paired_change`)."""
    out = {row: min(v) * scale for row, v in values.items()}
    for row, v in values.items():
        if row != baseline:
            out[change_row(row)] = paired_change(v, values[baseline])
    return out


def timed(body: Callable[[], Any], make_context: Callable[[], Any]) -> Callable[[], float]:
    """A variant for :func:`interleaved`: seconds of ``with make_context(): body()``,
    entering and leaving the context included (the user pays for those too)."""

    def run() -> float:
        start = time.perf_counter()
        with make_context():
            body()
        return time.perf_counter() - start

    return run


def diagnostics_variants(suffix: str) -> dict[str, Callable[[], Any]]:
    """Row name -> context factory: none, ProgressBar, Profiler, ResourceProfiler."""
    from lightwork.diagnostics import Profiler, ProgressBar, ResourceProfiler

    return {
        f"{suffix}_s": contextlib.nullcontext,
        f"{suffix}_progressbar_s": lambda: ProgressBar(out=io.StringIO()),
        f"{suffix}_profiler_s": Profiler,
        f"{suffix}_resource_profiler_s": lambda: ResourceProfiler(dt=RESOURCE_DT_S),
    }


def tasks_diagnostics_cost(peer: Peer, settings: Settings) -> dict[str, float]:
    """20,000 no-op tasks submitted, then got, inside ``with ProgressBar(...)``,
    ``Profiler()``, ``ResourceProfiler(dt=0.25)`` or nothing: best seconds of each
    (``tasks_20k_s``, ``tasks_20k_progressbar_s``, ...); quick runs scale up to 20k."""
    warm_up(peer)
    n = settings.cost_tasks

    def body() -> None:
        peer.get([peer.submit(noop) for _ in range(n)])

    variants = {row: timed(body, make) for row, make in diagnostics_variants("tasks_20k").items()}
    values = interleaved(variants, settings.cost_rounds, settings.cost_budget_s)
    return with_changes(values, "tasks_20k_s", COST_FIGURE_TASKS / n)


def dask_diagnostics_cost(peer: Peer, settings: Settings) -> dict[str, float]:
    """A Dask graph of 20,000 independent ``inc`` tasks and their sum, run by
    ``lightwork.dask.get`` under each diagnostic as in :func:`tasks_diagnostics_cost`
    (``dask_20k_s``, ``dask_20k_progressbar_s``, ...). The graph is a plain dict, so
    no Dask optimisation pass is timed."""
    try:
        import dask  # noqa: F401
    except ImportError as exc:
        raise NotSupported(f"dask is not installed ({exc}); pip install 'dask'") from exc
    import lightwork.dask

    def sum_graph(n: int) -> dict[Any, Any]:
        graph: dict[Any, Any] = {("inc", i): (inc, i) for i in range(n)}
        graph["total"] = (sum, [("inc", i) for i in range(n)])
        return graph

    warm_up(peer)
    # The first graph run pays for importing the Dask adapter in the workers; not a cost.
    lightwork.dask.get(sum_graph(4 * WORKER_SLOTS), "total")
    n = settings.cost_tasks
    graph = sum_graph(n)
    expected = n * (n + 1) // 2

    def body() -> None:
        total = lightwork.dask.get(graph, "total")
        assert total == expected, total

    variants = {row: timed(body, make) for row, make in diagnostics_variants("dask_20k").items()}
    values = interleaved(variants, settings.dask_cost_rounds, settings.cost_budget_s)
    return with_changes(values, "dask_20k_s", COST_FIGURE_TASKS / n)


#: ``init`` keywords (on top of ``num_cpus=4``) of the event-log cost variants.
INIT_VARIANTS: dict[str, dict[str, Any]] = {
    "async_per_task_us_default": {},
    # event_budget=0 turns the event log off, and with it the advisor.
    "async_per_task_us_event_log_off": {"event_budget": 0},
    "async_per_task_us_advisor_off": {"advisor": False},
}
#: Each cost as (with it, without it): the event log alone is the advisor-less
#: session against the log-less one (which has no advisor either), the advisor the
#: default session against the advisor-less one. Together: default against log-less.
INIT_COSTS: tuple[tuple[str, str], ...] = (
    ("async_per_task_us_advisor_off", "async_per_task_us_event_log_off"),
    ("async_per_task_us_default", "async_per_task_us_advisor_off"),
)


def async_in_new_session(init_kwargs: dict[str, Any], settings: Settings) -> Callable[[], float]:
    """A variant for :func:`interleaved`: start lightwork with ``init_kwargs``,
    warm up, return the best ``async_per_task_us`` of a few runs, shut down."""

    def run() -> float:
        peer = lightwork_peer(**init_kwargs)
        peer.load()
        peer.start()
        try:
            warm_up(peer)
            return best_async_us(lambda: peer.submit(noop), peer, settings)
        finally:
            peer.shutdown()

    return run


def event_log_cost(settings: Settings) -> dict[str, float]:
    """``async_per_task_us`` with ``init`` at its defaults, with the event log off
    (``event_budget=0``) and with only the advisor off (``advisor=False``): best over
    ``cost_sessions`` fresh sessions of each, started in turn; and the change of each
    ``INIT_COSTS`` pair, under the name of its first figure."""
    per_session = replace(settings, async_runs=settings.cost_async_runs)
    variants = {
        row: async_in_new_session(kwargs, per_session) for row, kwargs in INIT_VARIANTS.items()
    }
    values = interleaved(variants, settings.cost_sessions, settings.cost_budget_s)
    out = {row: min(v) for row, v in values.items()}
    for on, off in INIT_COSTS:
        out[change_row(on)] = paired_change(values[on], values[off])
    return out


def advisor_looks(peer: Peer, settings: Settings) -> dict[str, float]:
    """The advisor's own work, timed directly: batches of ``async_tasks`` no-op tasks
    in the default session (advisor on), with the CPU time its looks take on its
    thread (``Advisor._look``, on the thread's CPU clock), less what a look does on the
    program's behalf: registering the submissions that were queued while every worker
    was busy, which whoever takes the runtime's lock first does (``node_lock.py``).
    After each batch it waits for the next look, which takes the batch's last records.
    The advisor's other work is its tally (``RunTally``), which the event log calls for
    each record as it ends: too short to time call by call, it is timed on the batch's
    records afterwards, each chunk of 500 tallied once to bring it back into the cache
    (as it is when the log calls it) and then timed (:func:`_tally_cpu_s`).

    Rows: ``advisor_batch_us``, the best time per task, and
    ``advisor_batch_us_less_looks``, that batch's time less its looks' and tally's CPU
    per task; the cost table shows the median over ``advisor_batches`` batches of each
    one's advisor CPU against its time less that CPU. ``event_log_cost``'s paired sessions
    (default against ``advisor=False``) measure all the advisor changes, indirect
    effects too, but a fresh session's speed varies ±15% from the next one's; this
    measures its own work only, from one session."""
    import threading

    import lightwork
    from lightwork.diagnostics import advisor as advisor_module

    node = getattr(lightwork.api.core._backend, "node", None)  # the local engine's Node
    if node is None or node.advisor is None:
        raise NotSupported("no live advisor in this session")
    warm_up(peer)
    looks = {"cpu_s": 0.0, "count": 0}
    in_look = threading.local()
    original_look, original_register = advisor_module.Advisor._look, node.lock.register

    def timed_look(advisor: Any, looked_at: Any) -> None:
        start = time.thread_time()
        in_look.registered_s = 0.0
        try:
            original_look(advisor, looked_at)
        finally:
            looks["cpu_s"] += time.thread_time() - start - in_look.registered_s
            looks["count"] += 1

    def timed_register() -> None:
        start = time.thread_time()
        try:
            original_register()
        finally:
            if hasattr(in_look, "registered_s"):
                in_look.registered_s += time.thread_time() - start

    advisor_module.Advisor._look = timed_look  # type: ignore[method-assign]
    node.lock.register = timed_register
    n = settings.async_tasks
    batches: list[tuple[float, float]] = []  # (seconds, of which the looks' CPU)
    try:
        for _ in range(settings.advisor_batches):
            looks["cpu_s"] = 0.0
            start = time.perf_counter()
            peer.get([peer.submit(noop) for _ in range(n)])
            elapsed = time.perf_counter() - start
            count = looks["count"]
            deadline = time.monotonic() + 10 * node.advisor.interval
            while looks["count"] == count and time.monotonic() < deadline:
                time.sleep(0.01)
            with node.lock:
                records = node.log.ended_records()[-n:]
            batches.append((elapsed, looks["cpu_s"] + _tally_cpu_s(records)))
    finally:
        advisor_module.Advisor._look = original_look  # type: ignore[method-assign]
        node.lock.register = original_register
    elapsed, looks_s = min(batches)
    return {
        "advisor_batch_us": elapsed / n * 1e6,
        "advisor_batch_us_less_looks": (elapsed - looks_s) / n * 1e6,
        change_row("advisor_batch_us"): statistics.median(
            looks / (seconds - looks) for seconds, looks in batches) * 100,
    }


def _tally_cpu_s(records: list[Any]) -> float:
    """The CPU time the advisor's tally takes for ``records`` when they are warm, as
    when the event log calls it: each chunk tallied once untimed, then timed (on a
    tally of its own: the advisor's sums are not touched)."""
    from lightwork.diagnostics._rules_load import CPU_BOUND_MIN_S
    from lightwork.diagnostics._measure import RunTally

    tally, cpu_s = RunTally(long_s=CPU_BOUND_MIN_S), 0.0
    for first in range(0, len(records), 500):
        chunk = records[first:first + 500]
        tally.ended(chunk)
        start = time.thread_time()
        tally.ended(chunk)
        cpu_s += time.thread_time() - start
    return cpu_s


Workload = Callable[[Peer, Settings], dict[str, float]]

#: Workload name -> function, in the order a peer's subprocess runs them.
WORKLOADS: dict[str, Workload] = {
    "idle_worker_rss_mb": idle_worker_rss_mb,
    "idle_actor_rss_mb": idle_actor_rss_mb,
    "sync_roundtrip_us": sync_roundtrip_us,
    "async_per_task_us": async_per_task_us,
    "sleep_20k_s": sleep_20k_s,
    "by_value_160mb_s": by_value_160mb_s,
    "put_once_160mb_s": put_once_160mb_s,
    "get_160mb_ms": get_160mb_ms,
    "actor_start_first_call_ms": actor_start_first_call_ms,
    "actor_sync_call_us": actor_sync_call_us,
    "actor_async_per_call_us": actor_async_per_call_us,
    "actors_200_start_s": actors_200_start_s,
}

#: The diagnostics the cost workloads time, as they appear in figure names.
DIAGNOSTICS = ("progressbar", "profiler", "resource_profiler")

#: Rows a workload may produce besides its own name.
EXTRA_ROWS: dict[str, tuple[str, ...]] = {
    "put_once_160mb_s": ("put_160mb_s",),
    "idle_worker_rss_mb": ("idle_worker_uss_mb", "idle_workers_measured"),
    "idle_actor_rss_mb": ("idle_actor_uss_mb",),
    "actors_200_start_s": ("actors_200_exit_s",),
    "tasks_diagnostics_cost": (
        "tasks_20k_s",
        *(f"tasks_20k_{v}_s{c}" for v in DIAGNOSTICS for c in ("", "_change_pct")),
    ),
    "dask_diagnostics_cost": (
        "dask_20k_s",
        *(f"dask_20k_{v}_s{c}" for v in DIAGNOSTICS for c in ("", "_change_pct")),
    ),
    "event_log_cost": (*INIT_VARIANTS, *(change_row(on) for on, _ in INIT_COSTS)),
    "advisor_looks": (
        "advisor_batch_us", "advisor_batch_us_less_looks", change_row("advisor_batch_us")),
}

#: Workloads the serial baseline runs (it has no runtime for the others).
BASELINE_WORKLOADS: tuple[str, ...] = ("sleep_20k_s",)

#: Lightwork-only workloads, run in lightwork's subprocess after ``WORKLOADS``.
LIGHTWORK_WORKLOADS: dict[str, Workload] = {
    "tasks_diagnostics_cost": tasks_diagnostics_cost,
    "dask_diagnostics_cost": dask_diagnostics_cost,
    "advisor_looks": advisor_looks,
}

#: Lightwork-only workloads that start and stop lightwork themselves (several ``init``
#: settings), run in a second lightwork subprocess with no session of its own.
LIGHTWORK_INIT_WORKLOADS: dict[str, Callable[[Settings], dict[str, float]]] = {
    "event_log_cost": event_log_cost,
}
