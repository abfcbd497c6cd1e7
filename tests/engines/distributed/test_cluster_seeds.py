"""The seeds' programs on a real Dask cluster: ``import lightwork as ray`` and an address.

Four single-thread ``dask worker`` processes (``CPU=1`` each: four slots) and a
``dask scheduler``, started through the CLI. One driver program, run as a real
subprocess, runs the guides' code on them:

* shared/seeds/000 ("Profile Ray programs"): the ex1/ex2/ex3 loops, and one Sleeper
  actor against five;
* shared/seeds/002 ("Tips for first-time users"): delay ``get``, tiny tasks against
  batched ones, a large argument by value and through ``put``, pipelining with ``wait``;
* shared/seeds/003 ("Ray Crash Course - Actors"): Game of Life games as actors stepped
  with ``wait``, ``cluster_resources``, the Counter/RayCounter exercise.

The program prints what it saw as JSON; the tests check the results exactly and the
lessons through the evidence the run leaves rather than wall-clock speed: how many of a
loop's tasks ran at once on the workers (their own start/finish stamps, as the timeline
draws them), which processes ran the actors' calls, and what the advisor names. The only
timing asserted is what physics guarantees (sleeps in series add up) and an ordering
with a wide margin (four sleeps in series against four at once).
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests import helpers
import pytest
from tests.dask_cluster import DaskCluster

# Starting four workers and running the three guides takes 20-35 s on a loaded 2-core
# host, all in the first test's fixture: more room than the suite's 60 s per test.
pytestmark = [pytest.mark.lightwork_only, pytest.mark.timeout(120)]
pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")

SLEEP = 0.2

PROGRAM = """
import json, os, sys, time
import numpy as np
import lightwork as ray

SLEEP = {sleep}
ray.init(address=sys.argv[1])
seen = {{}}


def most_at_once(intervals):
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def ran_at_once(function, task=None):
    # (tasks, most of them running at once) of the tasks submitted in `function` (or
    # named `task`), from the workers' own start and finish stamps.
    records = [r for r in ray.diagnostics.task_records() if r.state == "FINISHED" and (
        r.name.endswith(task) if task else r.callsite and r.callsite[2] == function)]
    return len(records), most_at_once([(r.started, r.finished) for r in records])


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


# ---- seeds/000: the profiling loops -----------------------------------------------------
@ray.remote
def func():
    time.sleep(SLEEP)

def other_func():
    time.sleep(SLEEP / 2)

def ex1():
    list1 = []
    for i in range(4):
        list1.append(ray.get(func.remote()))
    return list1

def ex2():
    list2 = []
    for i in range(4):
        list2.append(func.remote())
    return ray.get(list2)

def ex3():
    list3 = []
    for i in range(4):
        other_func()
        list3.append(func.remote())
    return ray.get(list3)

t1, r1 = timed(ex1)
t2, r2 = timed(ex2)
t3, r3 = timed(ex3)
findings = ray.advise(print_report=False)
seen["loops"] = {{
    "results": [r1, r2, r3], "seconds": [t1, t2, t3],
    "at_once": {{name: ran_at_once(name) for name in ("ex1", "ex2", "ex3")}},
    "findings": [[f.kind, f.callsite[2] if f.callsite else None] for f in findings],
}}


# ---- seeds/002: tips for first-time users -------------------------------------------------
@ray.remote
def do_some_work(x):
    time.sleep(SLEEP)  # Replace this with work you need to do.
    return x

def tip1():
    results = [do_some_work.remote(x) for x in range(4)]
    return ray.get(results)

def tiny_work(x):
    time.sleep(0.0001)  # replace this is with work you need to do
    return x

def tip2():
    remote_tiny = ray.remote(tiny_work)
    result_ids = [remote_tiny.remote(x) for x in range(300)]
    tiny = ray.get(result_ids)

    @ray.remote
    def mega_work(start, end):
        return [tiny_work(x) for x in range(start, end)]

    result_ids = []
    [result_ids.append(mega_work.remote(x * 100, (x + 1) * 100)) for x in range(3)]
    mega = [x for chunk in ray.get(result_ids) for x in chunk]
    return tiny, mega

def tip3():
    @ray.remote
    def no_work(a):
        return a.nbytes

    a = np.zeros((1000, 500))  # 4 MB, by value in every call
    by_value = ray.get([no_work.remote(a) for x in range(4)])
    a_id = ray.put(np.zeros((1000, 500)))
    by_put = ray.get([no_work.remote(a_id) for x in range(4)])
    return by_value, by_put

def tip4():
    @ray.remote
    def work_for(x, seconds):
        time.sleep(seconds)
        return x

    result_ids = [work_for.remote(x, 0.3 * (3 - x)) for x in range(4)]
    order, total = [], 0
    while len(result_ids):
        done_id, result_ids = ray.wait(result_ids)
        order.append(ray.get(done_id[0]))
        total += order[-1]
    return order, total

seen["tips"] = {{"tip1": [tip1(), ran_at_once(None, "do_some_work")], "tip2": tip2(), "tip3": tip3(),
                 "tip4": tip4()}}


# ---- seeds/003 and the actor part of seeds/000 ---------------------------------------------
class State:
    def __init__(self, grid=None, size=10):
        self.grid = grid if grid is not None else np.random.randint(2, size=(size, size))
        self.size = len(self.grid)
        self.pid = os.getpid()

class ConwaysRules:
    def step(self, state):
        n, grid = state.size, state.grid
        neighbours = sum(np.roll(np.roll(grid != 0, di, 0), dj, 1)
                         for di in (-1, 0, 1) for dj in (-1, 0, 1) if di or dj)
        alive = (grid != 0) & ((neighbours == 2) | (neighbours == 3))
        born = (grid == 0) & (neighbours == 3)
        return State(grid=np.where(alive, grid + 1, np.where(born, 1, 0)))

class Game:
    def __init__(self, initial_state, rules):
        self.states = [initial_state]
        self.rules = rules

    def step(self, num_steps=1):
        new_states = [self.rules.step(self.states[-1]) for _ in range(num_steps)]
        self.states.extend(new_states)
        return new_states

@ray.remote
class RayGame(Game):
    def __init__(self, initial_state, rules):
        super().__init__(initial_state, rules)

    def get_states(self):
        return self.states

def run_ray_games(game_actors, steps, batch_size):
    remaining = {{a: steps // batch_size for a in game_actors}}
    pending = {{a.step.remote(batch_size): a for a in game_actors}}
    received = {{a: [] for a in game_actors}}
    while pending:
        (ready,), _ = ray.wait(list(pending), num_returns=1)
        actor = pending.pop(ready)
        received[actor].extend(ray.get(ready))
        remaining[actor] -= 1
        if remaining[actor]:
            pending[actor.step.remote(batch_size)] = actor
    return [[s.pid for s in states] for states in received.values()]

num_cpus_float = ray.cluster_resources()["CPU"]
games = [RayGame.remote(State(size=20), ConwaysRules()) for _ in range(round(num_cpus_float))]
pids = run_ray_games(games, steps=6, batch_size=2)
kept = [len(ray.get(g.get_states.remote())) for g in games]

class Counter:
    def __init__(self, pause):
        self.count = 0
        self.pause = pause

    def next(self):
        time.sleep(self.pause)
        self.count += 1
        return self.count

@ray.remote
class RayCounter(Counter):
    def __init__(self, pause):
        super().__init__(pause)

    def get_count(self):
        return self.count

def ray_counter_trial(count_to, num_counters=1, pause=0.01):
    counters = [RayCounter.remote(pause) for _ in range(num_counters)]
    final_count_futures = []
    for i in range(num_counters):
        for n in range(count_to):
            counters[i].next.remote()
        final_count_futures.append(counters[i].get_count.remote())
    return ray.get(final_count_futures)

@ray.remote
class Sleeper(object):
    def __init__(self):
        self.sleepValue = SLEEP

    def actor_func(self):
        started = time.time()  # instrumentation: the interval this call slept in
        time.sleep(self.sleepValue)
        return started, time.time(), os.getpid()

def ex4_one_actor():
    actor_example = Sleeper.remote()
    five_results = []
    for i in range(5):
        five_results.append(actor_example.actor_func.remote())
    return ray.get(five_results)

def ex4_five_actors():
    five_actors = [Sleeper.remote() for i in range(5)]
    five_results = []
    for actor_example in five_actors:
        five_results.append(actor_example.actor_func.remote())
    return ray.get(five_results)

one, five = ex4_one_actor(), ex4_five_actors()
seen["actors"] = {{
    "cpus": num_cpus_float, "game_pids": pids, "kept": kept,
    "counts": ray_counter_trial(5, num_counters=3),
    "one": [[a, b] for a, b, _ in one], "one_pids": sorted({{p for _, _, p in one}}),
    "five": [[a, b] for a, b, _ in five], "five_pids": sorted({{p for _, _, p in five}}),
    "most_at_once": [most_at_once([(a, b) for a, b, _ in one]),
                     most_at_once([(a, b) for a, b, _ in five])],
}}
seen["worker_pids"] = sorted({{r.pid for r in ray.diagnostics.task_records() if r.pid}})
ray.shutdown()
print("SEEN " + json.dumps(seen))
"""


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    directory = tmp_path_factory.mktemp("seeds")
    cluster = DaskCluster(str(directory), workers=4).start(timeout=40)
    try:
        script = helpers.write_script(str(directory), "seeds.py", PROGRAM.format(sleep=SLEEP))
        proc = subprocess.run([sys.executable, script, cluster.address],
                              env=helpers.script_env(), capture_output=True, text=True,
                              timeout=70, check=False)
        assert proc.returncode == 0, proc.stderr[-4000:]
        [line] = [line for line in proc.stdout.splitlines() if line.startswith("SEEN ")]
        result = json.loads(line[5:])
        result["cluster_pids"] = sorted(cluster.worker_pids())
        yield result
    finally:
        left = cluster.stop()
        assert not left, f"processes left behind by the cluster: {left}"


def test_the_profiling_loops_keep_their_lesson_on_the_cluster(seen):
    loops = seen["loops"]
    assert loops["results"] == [[None] * 4] * 3
    t1, t2, t3 = loops["seconds"]
    print(f"ex1 {t1:.3f} s, ex2 {t2:.3f} s, ex3 {t3:.3f} s: ex1/ex2 = {t1 / t2:.1f}x")
    assert t1 >= 4 * SLEEP  # get in the loop: the four sleeps run one after another
    assert t3 >= 4 * SLEEP / 2 + SLEEP  # Amdahl: the driver's serial work, then the last
    assert t2 < t1, f"get after the loop took {t2:.2f} s, get in the loop {t1:.2f} s"
    at_once = loops["at_once"]
    assert at_once["ex1"] == [4, 1]  # never two at once: each get waited for its task
    assert at_once["ex2"][0] == 4 and at_once["ex2"][1] >= 3  # the four slots in use
    assert ["get-in-loop", "ex1"] in loops["findings"]
    assert not [f for f in loops["findings"] if f[0] == "get-in-loop" and f[1] == "ex2"]


def test_the_tips_hold_on_the_cluster(seen):
    tips = seen["tips"]
    values, (count, at_once) = tips["tip1"]
    assert values == [0, 1, 2, 3] and count == 4 and at_once >= 3
    tiny, mega = tips["tip2"]
    assert tiny == list(range(300)) and mega == list(range(300))
    assert tips["tip3"] == [[4_000_000] * 4] * 2
    order, total = tips["tip4"]
    assert order == [3, 2, 1, 0] and total == 6  # wait hands back the fastest first


def test_the_actor_lessons_hold_on_the_cluster(seen):
    actors = seen["actors"]
    assert actors["cpus"] == 4.0
    assert actors["kept"] == [7] * 4  # the initial state and six steps, kept by each actor
    for pids in actors["game_pids"]:
        assert len(set(pids)) == 1 and pids[0] in seen["cluster_pids"]  # one process each
    assert actors["counts"] == [5, 5, 5]  # each counter saw its calls in order
    assert len(actors["one_pids"]) == 1 and actors["most_at_once"][0] == 1
    assert actors["most_at_once"][1] >= 3  # five actors: their calls overlap
    assert set(actors["five_pids"]) <= set(seen["cluster_pids"])
    assert set(seen["worker_pids"]) <= set(seen["cluster_pids"])  # all ran on the cluster
