"""The actor lessons we promise to run unchanged after ``import lightwork as ray``:
shared/seeds/003 ("Ray Crash Course - Actors": Game of Life games as actors stepped
with ``wait``, ``cluster_resources``, the Counter/RayCounter exercise) and the actor
part of shared/seeds/000 (five calls to one ``Sleeper`` vs five ``Sleeper`` actors).

The lessons' own code is copied as printed, with smaller grids, fewer steps and shorter
sleeps. What the lessons leave to library files (``game_of_life.py``'s rules, the
``run_ray_games`` helper of ``actor_lesson_util.py``) is written here; the only
instrumentation is that a ``State`` remembers which process made it and when, that
``Sleeper.actor_func`` returns the ``time.time()`` interval it slept in (and its pid),
and that the two ``ex4`` versions return what their ``ray.get`` gave them.

What each lesson teaches is checked structurally where it can be (which process ran a
call, whether two calls' execution intervals overlap, what state an actor kept), and
otherwise only with bounds physics guarantees (serial sleeps add up), best of two runs.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import lightwork as ray
from tests.helpers import descendants, still_running, wait_until

pytestmark = pytest.mark.usefixtures("ray_start")


# ---- game_of_life.py (the library file the lesson imports) -----------------------------


class State:
    def __init__(self, grid=None, size=10):
        if grid is not None:
            self.size = len(grid)
            self.grid = grid
        else:
            self.size = size
            self.grid = np.random.randint(2, size=size * size).reshape((size, size))
        # Instrumentation for the tests: where and when this state was made.
        self.pid = os.getpid()
        self.made_at = time.time()

    def living_cells(self):
        cells = [(i, j) for i in range(self.size) for j in range(self.size) if self.grid[i][j] != 0]
        return zip(*cells)


class ConwaysRules:
    def step(self, state):
        """
        Determine the next values for all the cells, based on the current
        state. Creates a new State with the changes.
        """
        new_grid = state.grid.copy()
        for i in range(state.size):
            for j in range(state.size):
                new_grid[i][j] = self.apply_rules(i, j, state)
        new_state = State(grid=new_grid)
        return new_state

    def apply_rules(self, i, j, state):
        # A live cell holds its age (1..N), as in the lesson's implementation.
        n = state.size
        neighbours = sum(
            1
            for di in (-1, 0, 1)
            for dj in (-1, 0, 1)
            if (di or dj) and state.grid[(i + di) % n][(j + dj) % n] != 0
        )
        age = state.grid[i][j]
        if age != 0:
            return age + 1 if neighbours in (2, 3) else 0
        return 1 if neighbours == 3 else 0


class Game:
    def __init__(self, initial_state, rules):
        self.states = [initial_state]
        self.rules = rules

    def step(self, num_steps=1):
        """Take 1 or more steps, returning a list of new states."""
        new_states = [self.rules.step(self.states[-1]) for _ in range(num_steps)]
        self.states.extend(new_states)
        return new_states


# ---- actor_lesson_util.run_ray_games (the lesson describes it, does not print it) -------


def run_ray_games(game_actors, graphs, steps, batch_size, pause_between_batches):
    """Step every game ``steps`` times, ``batch_size`` steps per call, handling each
    game's new states as soon as they arrive (``ray.wait``); return the lesson's tuple.
    ``graphs`` is None here: the tests keep the states instead of plotting them."""
    start = time.time()
    batches = steps // batch_size
    remaining = {a: batches for a in game_actors}
    pending = {a.step.remote(batch_size): a for a in game_actors}
    received = {a: [] for a in game_actors}
    while pending:
        (ready,), _ = ray.wait(list(pending), num_returns=1)
        actor = pending.pop(ready)
        received[actor].extend(ray.get(ready))
        remaining[actor] -= 1
        if remaining[actor]:
            if pause_between_batches:
                time.sleep(pause_between_batches)
            pending[actor.step.remote(batch_size)] = actor
    duration = time.time() - start
    run_ray_games.received = list(received.values())  # for the tests to inspect
    return len(game_actors), steps, batch_size, duration


# ---- the lesson's code (seeds/003), as printed, sizes shrunk -----------------------------
# fmt: off

steps = 25
game_size = 50
x_grid = 2
y_grid = 2
shrink_factor = y_grid
small_game_size = round(game_size / shrink_factor)


@ray.remote
class RayGame(Game):
    def __init__(self, initial_state, rules):
        super().__init__(initial_state, rules)

    def get_states(self):
        return self.states

    def get_rules(self):
        return self.rules


def new_ray_game(game_size):
    initial_state = State(size=game_size)
    rules = ConwaysRules()
    ray_game_actor = RayGame.remote(initial_state, rules)  # Note that .remote(...) is used to construct the instance.
    return ray_game_actor


def try_ray_game_actor():
    ray_game_actor = new_ray_game(small_game_size)
    print(f"Actor for game: {ray_game_actor}")
    init_states = ray.get(ray_game_actor.step.remote())
    print(f"\nInitial state:\n{init_states[0]}")
    new_states = ray.get(ray_game_actor.step.remote())
    print(f"\nState after step #1:\n{new_states[0]}")


def do_ray_trial(graphs, num_games=1, steps=steps, batch_size=1, game_size_for_each=game_size, pause_between_batches=0.0):
    game_actors = [new_ray_game(game_size_for_each) for _ in range(num_games)]
    return run_ray_games(game_actors, graphs, steps, batch_size, pause_between_batches)


class Counter:
    """Remember how many times ``next()`` has been called."""

    def __init__(self, pause):
        self.count = 0
        self.pause = pause

    def next(self):
        time.sleep(self.pause)
        self.count += 1
        return self.count


@ray.remote
class RayCounter(Counter):
    """Remember how many times ``next()`` has been called."""

    def __init__(self, pause):
        super().__init__(pause)

    def get_count(self):
        return self.count


def counter_trial(count_to, num_counters = 1, pause = 0.01):
    print('not ray: count_to = {:5d}, num counters = {:4d}, pause = {:5.3f}: '.format(count_to, num_counters, pause), end='')
    start = time.time()
    counters = [Counter(pause) for _ in range(num_counters)]
    for i in range(num_counters):
        for n in range(count_to):
            counters[i].next()
    duration = time.time() - start
    print('time = {:9.5f} seconds'.format(duration))
    return count_to, num_counters, pause, duration


def ray_counter_trial(count_to, num_counters = 1, pause = 0.01):
    print('ray: count_to = {:5d}, num counters = {:4d}, pause = {:5.3f}: '.format(count_to, num_counters, pause), end='')
    start = time.time()
    final_count_futures = []
    counters = [RayCounter.remote(pause) for _ in range(num_counters)]
    for i in range(num_counters):
        for n in range(count_to):
            counters[i].next.remote()
        final_count_futures.append(counters[i].get_count.remote())
    ray.get(final_count_futures) # Discard result, but wait until finished!
    duration = time.time() - start
    print('time = {:9.5f} seconds'.format(duration))
    return count_to, num_counters, pause, duration
# fmt: on


# ---- seeds/000: the Sleeper actor -------------------------------------------------------

SLEEP = 0.3  # the guide sleeps 0.5 s


@ray.remote
class Sleeper(object):
    def __init__(self):
        self.sleepValue = SLEEP

    # Equivalent to func(), but defined within an actor
    def actor_func(self):
        started = time.time()  # instrumentation: the interval this call slept in
        time.sleep(self.sleepValue)
        return started, time.time(), os.getpid()


def ex4_one_actor():
    # This is suboptimal in Ray, and should only be used for the sake of this example
    actor_example = Sleeper.remote()

    five_results = []
    for i in range(5):
        five_results.append(actor_example.actor_func.remote())

    # Wait until the end to call ray.get()
    return ray.get(five_results)


def ex4_five_actors():
    # Modified to create five separate Sleepers
    five_actors = [Sleeper.remote() for i in range(5)]

    # Each call to actor_func now goes to a different Sleeper
    five_results = []
    for actor_example in five_actors:
        five_results.append(actor_example.actor_func.remote())

    return ray.get(five_results)


def overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1]


def union_length(intervals):
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


# ---- tests: Game of Life ---------------------------------------------------------------


def test_game_actor_keeps_its_states_between_calls(capsys):
    try_ray_game_actor()
    out = capsys.readouterr().out
    assert "Actor for game:" in out and "State after step #1:" in out

    game = new_ray_game(small_game_size)
    first = ray.get(game.step.remote())
    second = ray.get(game.step.remote())
    states = ray.get(game.get_states.remote())
    assert len(first) == len(second) == 1 and len(states) == 3
    # The actor stepped from the state it kept: step 2 continues step 1.
    np.testing.assert_array_equal(states[1].grid, first[0].grid)
    np.testing.assert_array_equal(states[2].grid, second[0].grid)
    np.testing.assert_array_equal(ConwaysRules().step(states[1]).grid, second[0].grid)
    # Both steps ran in the actor's process, never in the driver.
    assert first[0].pid == second[0].pid != os.getpid()
    assert isinstance(ray.get(game.get_rules.remote()), ConwaysRules)


def test_game_state_is_read_through_an_accessor_not_an_attribute():
    game = new_ray_game(small_game_size)
    with pytest.raises(AttributeError) as info:
        game.states  # noqa: B018  (the lesson: "mygame.state ... doesn't work for actors")
    assert "states" in str(info.value)
    assert len(ray.get(game.get_states.remote())) == 1


def test_games_as_actors_each_run_in_their_own_process_stepped_with_wait():
    num_cpus_float = ray.cluster_resources()["CPU"]
    assert num_cpus_float == 4.0 and isinstance(num_cpus_float, float)

    num_games, n_steps, batch, duration = do_ray_trial(
        None,
        num_games=round(num_cpus_float),
        steps=steps,
        batch_size=1,
        game_size_for_each=game_size,
        pause_between_batches=0.0,
    )
    assert (num_games, n_steps, batch) == (4, steps, 1) and duration > 0
    per_game = run_ray_games.received
    assert [len(states) for states in per_game] == [steps] * 4
    # Each game is an actor pinned to one worker process of its own.
    pids = [{s.pid for s in states} for states in per_game]
    assert all(len(p) == 1 for p in pids), pids
    assert len(set().union(*pids)) == 4 and os.getpid() not in set().union(*pids)
    # Driven by wait, the games advanced side by side: the span from each game's first
    # to its last new state overlaps every other game's (one game at a time would
    # finish each before the next began).
    spans = [(states[0].made_at, states[-1].made_at) for states in per_game]
    for i, span in enumerate(spans):
        assert all(overlaps(span, other) for other in spans[i + 1 :]), spans


def test_batches_give_the_same_number_of_states():
    for batch in [1, 5]:
        num_games, n_steps, batch_size, _ = do_ray_trial(
            None,
            num_games=2,
            steps=steps,
            batch_size=batch,
            game_size_for_each=small_game_size,
            pause_between_batches=0.0,
        )
        assert [len(s) for s in run_ray_games.received] == [steps, steps]
        assert batch_size == batch


def test_games_go_out_of_scope_and_their_processes_end():
    """The lesson wraps the games in ``do_ray_trial`` "so that our actors go out of
    scope and the worker slots are reclaimed when the function call returns"."""
    do_ray_trial(None, num_games=3, steps=2, game_size_for_each=small_game_size)
    game_pids = {states[0].pid for states in run_ray_games.received}
    assert len(game_pids) == 3
    run_ray_games.received = None  # the states hold no handles, but drop them anyway
    wait_until(
        lambda: not still_running(game_pids),
        timeout=10,
        message=f"the games' actor processes {sorted(game_pids)} to exit",
    )
    # Reaped too (a zombie is gone once the fork server reaps it, a moment later).
    wait_until(lambda: not game_pids & set(descendants()), timeout=10,
               message=f"the games' actor processes {sorted(game_pids)} to be reaped")


# ---- tests: Counter / RayCounter exercise ---------------------------------------------


def test_ray_counters_count_in_call_order():
    counters = [RayCounter.remote(0.0) for _ in range(3)]
    nexts = [[c.next.remote() for _ in range(10)] for c in counters]
    finals = [c.get_count.remote() for c in counters]
    # Calls from one caller run in submission order: next() returns 1..10 and
    # get_count(), sent last, sees all ten.
    assert [ray.get(refs) for refs in nexts] == [list(range(1, 11))] * 3
    assert ray.get(finals) == [10, 10, 10]


def test_counter_exercise_one_actor_is_serial_several_run_side_by_side():
    count_to, pause = 4, 0.1
    _, _, _, plain_one = counter_trial(count_to, 1, pause)
    _, _, _, plain_four = counter_trial(count_to, 4, pause)
    # Plain counters: every pause is paid in turn.
    assert plain_one >= count_to * pause
    assert plain_four >= 4 * count_to * pause

    # One actor: its calls run one after another, so the pauses still add up.
    _, _, _, ray_one = ray_counter_trial(count_to, 1, pause)
    assert ray_one >= count_to * pause
    # Four actors: each pays its own pauses, at the same time as the others; serial
    # execution could not finish before all 16 pauses (1.6 s) had elapsed.
    best_four = min(ray_counter_trial(count_to, 4, pause)[3] for _ in range(2))
    assert count_to * pause <= best_four < 4 * count_to * pause * 0.8


def test_counter_exercise_zero_pause_runs():
    assert ray_counter_trial(10, 2, 0.0)[:3] == (10, 2, 0.0)
    assert counter_trial(10, 2, 0.0)[:3] == (10, 2, 0.0)


# ---- tests: the Sleeper actor (seeds/000) ----------------------------------------------


def test_one_sleeper_actor_runs_the_five_calls_one_after_another():
    results = ex4_one_actor()
    intervals = [(start, end) for start, end, _ in results]
    assert len({pid for _, _, pid in results}) == 1
    # In submission order, each call starting after the previous one ended.
    for before, after in zip(intervals, intervals[1:]):
        assert after[0] >= before[1], intervals
    assert all(end - start >= SLEEP for start, end in intervals)


def test_five_sleeper_actors_run_the_calls_at_the_same_time():
    results = ex4_five_actors()
    intervals = [(start, end) for start, end, _ in results]
    assert len({pid for _, _, pid in results}) == 5  # five actors, five processes
    # The calls overlap: each one shares time with another, and together they cover
    # less time than run end to end (one actor needs the full sum, as above).
    for i, interval in enumerate(intervals):
        assert any(overlaps(interval, other) for j, other in enumerate(intervals) if j != i)
    assert union_length(intervals) < sum(end - start for start, end in intervals) / 2
