"""The programs of the Ray guides we promise to run unchanged after
``import lightwork as ray`` (shared/seeds/002: "Tips for first-time users";
shared/seeds/000: the ex1/ex2/ex3 loops of "Profile Ray programs"), with shorter sleeps.

Results are checked exactly; the lessons only loosely, using lower bounds that physics
guarantees (serial sleeps add up) and upper bounds with wide margins, best of two runs.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

import lightwork as ray
from tests.helpers import arrive_and_wait, run_script, write_script

pytestmark = pytest.mark.usefixtures("ray_start")

SLEEP = 0.2


@pytest.fixture(scope="module", autouse=True)
def warm_workers(ray_start, tmp_path_factory):
    """Make sure 4 workers exist, so the timing lessons measure scheduling, not start-up."""
    d = tmp_path_factory.mktemp("warm")
    meet = ray.remote(arrive_and_wait)
    assert ray.get([meet.remote(str(d), str(i), 4) for i in range(4)], timeout=60) == [True] * 4


# ---- seeds/000: the profiling loops -------------------------------------------------


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
    list3 = []  # the guide appends to list2 here, a typo; the lesson is unchanged
    for i in range(4):
        other_func()
        list3.append(func.remote())
    return ray.get(list3)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def test_profiling_loops_results_and_lesson():
    t1, r1 = timed(ex1)
    t2, r2 = min(timed(ex2), timed(ex2), key=lambda x: x[0])
    t3, r3 = timed(ex3)
    assert r1 == r2 == r3 == [None] * 4
    assert t1 >= 4 * SLEEP  # get inside the loop: serial
    assert t2 < 3 * SLEEP, f"ex2 (get after the loop) took {t2:.2f} s; ex1 {t1:.2f} s"
    assert t3 >= 4 * SLEEP / 2 + SLEEP  # Amdahl: serial driver work + the last task
    assert t2 < t1 and t2 < t3


def test_profiling_loops_script_runs_unchanged(tmp_path):
    script = write_script(
        str(tmp_path),
        "loops.py",
        """
import lightwork as ray
import time

@ray.remote
def func():
    time.sleep(0.05)

def ex1():
    list1 = []
    for i in range(5):
        list1.append(ray.get(func.remote()))
    return list1

def ex2():
    list2 = []
    for i in range(5):
        list2.append(func.remote())
    return ray.get(list2)

def other_func():
    time.sleep(0.03)

def ex3():
    list3 = []
    for i in range(5):
        other_func()
        list3.append(func.remote())
    return ray.get(list3)

def main():
    ray.init()
    print(ex1(), ex2(), ex3())

if __name__ == "__main__":
    main()
""",
    )
    proc = run_script(script, timeout=50)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == " ".join([str([None] * 5)] * 3)


# ---- seeds/002: tips for first-time users ------------------------------------------


@ray.remote
def do_some_work(x):
    time.sleep(SLEEP)  # Replace this with work you need to do.
    return x


def test_tip1_remote_returns_ids_and_get_after_loop_is_parallel():
    results = [do_some_work.remote(x) for x in range(4)]
    assert all(isinstance(r, ray.ObjectRef) for r in results)
    assert all(str(r) for r in results)  # printable, as the guide prints them

    def serial():
        return [ray.get(do_some_work.remote(x)) for x in range(4)]

    def parallel():
        return ray.get([do_some_work.remote(x) for x in range(4)])

    t_serial, r_serial = timed(serial)
    t_parallel, r_parallel = min(timed(parallel), timed(parallel), key=lambda x: x[0])
    assert ray.get(results) == r_serial == r_parallel == [0, 1, 2, 3]
    assert t_serial >= 4 * SLEEP
    assert t_parallel < 3 * SLEEP, f"parallel {t_parallel:.2f} s vs serial {t_serial:.2f} s"


def tiny_work(x):
    time.sleep(0.0001)  # replace this is with work you need to do
    return x


def test_tip2_tiny_tasks_and_mega_work_give_the_same_results():
    remote_tiny = ray.remote(tiny_work)
    result_ids = [remote_tiny.remote(x) for x in range(1000)]
    assert ray.get(result_ids) == list(range(1000))

    @ray.remote
    def mega_work(start, end):
        return [tiny_work(x) for x in range(start, end)]

    result_ids = []
    [result_ids.append(mega_work.remote(x * 100, (x + 1) * 100)) for x in range(10)]
    results = ray.get(result_ids)
    assert [x for chunk in results for x in chunk] == list(range(1000))

    @ray.remote
    def no_work(x):
        return x

    num_calls = 100
    assert [ray.get(no_work.remote(x)) for x in range(num_calls)] == list(range(num_calls))


def test_tip3_large_argument_by_value_and_by_put():
    @ray.remote
    def no_work(a):
        return

    a = np.zeros((1000, 2000))  # 16 MB
    assert ray.get([no_work.remote(a) for x in range(10)]) == [None] * 10
    a_id = ray.put(np.zeros((1000, 2000)))
    assert ray.get([no_work.remote(a_id) for x in range(10)]) == [None] * 10


def test_tip4_pipeline_with_wait():
    @ray.remote
    def random_work(x):
        time.sleep(random.uniform(0, 0.3))  # Replace this with work you need to do.
        return x

    def process_results(results):
        sum = 0
        for x in results:
            time.sleep(0.01)  # Replace this with some processing code.
            sum += x
        return sum

    def process_incremental(sum, result):
        time.sleep(0.01)  # Replace this with some processing code.
        return sum + result

    data_list = ray.get([random_work.remote(x) for x in range(4)])
    assert process_results(data_list) == 6

    result_ids = [random_work.remote(x) for x in range(4)]
    sum = 0
    processed = 0
    while len(result_ids):
        done_id, result_ids = ray.wait(result_ids)
        assert len(done_id) == 1
        sum = process_incremental(sum, ray.get(done_id[0]))
        processed += 1
    assert (sum, processed) == (6, 4)


def test_tip4_wait_hands_back_results_in_completion_order():
    @ray.remote
    def work_for(x, seconds):
        time.sleep(seconds)
        return x

    # x=0 sleeps longest; gaps of 0.4 s leave room for a loaded machine.
    result_ids = [work_for.remote(x, 0.4 * (3 - x)) for x in range(4)]
    order = []
    while result_ids:
        done_id, result_ids = ray.wait(result_ids)
        order.append(ray.get(done_id[0]))
    assert order == [3, 2, 1, 0]


# ---- Ray's tasks guide: a request the machine can never meet ------------------------


@pytest.mark.lightwork_only  # (the warning's words are lightwork's)
def test_a_program_that_never_reads_an_infeasible_task_runs_to_its_end(tmp_path):
    """The tasks guide submits a task asking for more CPUs than a small machine has and
    never reads it: on Ray, the task waits with a warning and the program goes on."""
    script = write_script(
        str(tmp_path),
        "tasks_guide.py",
        """
import lightwork as ray

ray.init(num_cpus=2)

@ray.remote
def my_function():
    return 1

assert ray.get(my_function.remote()) == 1
my_function.options(num_cpus=3).remote()   # never read
print("the end")
""",
    )
    proc = run_script(script, timeout=50)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "the end"
    # The warning names the resource and what the session has, at the user's line.
    assert "tasks_guide.py:" in proc.stderr and "my_function.options(num_cpus=3)" in proc.stderr
    assert "needs 3 CPU but the runtime has 2 CPU in total" in proc.stderr, proc.stderr
