"""Remote functions: submission, results, options, argument passing, nesting.

All tests share one 4-CPU runtime (``ray_start``). Parallelism is checked
structurally with a file-system barrier (N tasks inside it at once), never by timing.
"""

from __future__ import annotations

import importlib
import os
import sys
import time

import pytest

import lightwork as ray
from tests.helpers import arrive_and_wait, wait_for_file

pytestmark = pytest.mark.usefixtures("ray_start")


@ray.remote
def add(a, b=10):
    return a + b


@ray.remote
def echo(*args, **kwargs):
    return args, kwargs


def test_remote_returns_objectref_before_task_finishes(tmp_path):
    ref = ray.remote(wait_for_file).remote(str(tmp_path / "go"))
    assert isinstance(ref, ray.ObjectRef)
    ready, not_ready = ray.wait([ref], timeout=0)
    assert ready == [] and not_ready == [ref]
    (tmp_path / "go").touch()
    assert ray.get(ref, timeout=10) is True


def test_positional_keyword_and_default_arguments():
    assert ray.get(add.remote(1, 2)) == 3
    assert ray.get(add.remote(1)) == 11
    assert ray.get(add.remote(a=5, b=-5)) == 0
    args, kwargs = ray.get(echo.remote(1, "two", [3], x={"y": None}))
    assert args == (1, "two", [3]) and kwargs == {"x": {"y": None}}


def test_get_of_list_keeps_submission_order():
    @ray.remote
    def slow_inverse(i):
        time.sleep(0.01 * (10 - i))  # later tasks finish first
        return i

    refs = [slow_inverse.remote(i) for i in range(10)]
    assert ray.get(refs) == list(range(10))


def test_tasks_run_in_parallel_in_distinct_workers(tmp_path):
    @ray.remote
    def meet(name):
        return arrive_and_wait(str(tmp_path), name, parties=4), os.getpid()

    results = ray.get([meet.remote(str(i)) for i in range(4)], timeout=30)
    assert all(met for met, _ in results), "4 one-CPU tasks did not run at once on 4 CPUs"
    pids = {pid for _, pid in results}
    assert len(pids) == 4 and os.getpid() not in pids


def test_tasks_run_outside_the_driver_process():
    @ray.remote
    def pid():
        return os.getpid()

    assert ray.get(pid.remote()) != os.getpid()


def test_bare_and_parameterised_decorator():
    @ray.remote
    def bare():
        return "bare"

    @ray.remote(num_cpus=1, max_retries=0)
    def with_options():
        return "options"

    assert ray.get([bare.remote(), with_options.remote()]) == ["bare", "options"]


def test_calling_remote_function_directly_is_typeerror_pointing_to_remote():
    with pytest.raises(TypeError, match=r"\.remote\(\)"):
        add(1, 2)


def test_num_returns_gives_one_ref_per_value():
    @ray.remote(num_returns=3)
    def three():
        return 1, "b", [3]

    refs = three.remote()
    assert isinstance(refs, (list, tuple)) and len(refs) == 3
    assert all(isinstance(r, ray.ObjectRef) for r in refs)
    assert len(set(refs)) == 3
    assert ray.get(list(refs)) == [1, "b", [3]]


def test_num_returns_one_gives_a_single_ref():
    @ray.remote(num_returns=1)
    def pair():
        return (1, 2)

    ref = pair.remote()
    assert isinstance(ref, ray.ObjectRef)
    assert ray.get(ref) == (1, 2)


def test_num_returns_zero_runs_the_task_and_returns_none(tmp_path):
    @ray.remote(num_returns=0)
    def touch(path):
        open(path, "w").close()

    assert touch.remote(str(tmp_path / "ran")) is None
    assert wait_for_file(tmp_path / "ran")
    time.sleep(0.5)  # its end reaches the driver
    # Its end left the runtime working (it broke the driver's I/O thread once).
    assert ray.get(add.remote(1, 2), timeout=30) == 3


def test_options_override_for_one_call_only():
    @ray.remote
    def two():
        return 1, 2

    a, b = two.options(num_returns=2, name="renamed-two").remote()
    assert ray.get([a, b]) == [1, 2]
    # The original function keeps its own options.
    assert ray.get(two.remote()) == (1, 2)


def test_options_num_cpus_reflected_in_assigned_resources():
    @ray.remote
    def assigned():
        return ray.get_runtime_context().get_assigned_resources()

    assert ray.get(assigned.remote()).get("CPU") == pytest.approx(1)
    assert ray.get(assigned.options(num_cpus=2).remote()).get("CPU") == pytest.approx(2)


def test_top_level_objectref_arguments_are_resolved_to_values():
    x = ray.put(41)
    assert ray.get(add.remote(x, 1)) == 42
    assert ray.get(add.remote(a=x, b=add.remote(1, 1))) == 43
    # A chain of dependent tasks.
    ref = add.remote(0, 1)
    for _ in range(5):
        ref = add.remote(ref, 1)
    assert ray.get(ref) == 6


def test_objectrefs_nested_in_containers_are_passed_as_refs():
    inner = ray.put("payload")

    @ray.remote
    def inspect_arg(container):
        ref = container["refs"][0]
        return isinstance(ref, ray.ObjectRef), ray.get(ref)

    assert ray.get(inspect_arg.remote({"refs": [inner]})) == (True, "payload")


def test_task_can_return_an_objectref_created_inside_it():
    @ray.remote
    def make():
        return [ray.put("made in a worker")]

    [ref] = ray.get(make.remote())
    assert isinstance(ref, ray.ObjectRef)
    assert ray.get(ref) == "made in a worker"


def test_nested_tasks_do_not_deadlock_when_all_slots_hold_parents():
    @ray.remote
    def child(i):
        return i * 10

    @ray.remote
    def parent(i):
        return ray.get(child.remote(i)) + 1

    # 8 parents on 4 CPUs: every slot is taken by a parent blocked in get.
    assert ray.get([parent.remote(i) for i in range(8)], timeout=30) == [
        i * 10 + 1 for i in range(8)
    ]


def test_recursive_tasks_deeper_than_the_number_of_slots():
    @ray.remote
    def depth(n):
        if n == 0:
            return 0
        return ray.get(depth.remote(n - 1)) + 1

    assert ray.get(depth.remote(6), timeout=40) == 6


def test_wait_inside_a_task():
    @ray.remote
    def leaf(i):
        return i

    @ray.remote
    def waiter():
        refs = [leaf.remote(i) for i in range(4)]
        ready, not_ready = ray.wait(refs, num_returns=4, timeout=20)
        return ray.get(ready), not_ready

    assert ray.get(waiter.remote(), timeout=30) == ([0, 1, 2, 3], [])


def test_put_and_get_inside_a_task():
    @ray.remote
    def roundtrip(v):
        return ray.get(ray.put(v))

    assert ray.get(roundtrip.remote({"k": [1, 2]})) == {"k": [1, 2]}


def test_redefined_remote_function_runs_newest_definition():
    @ray.remote
    def version():
        return 1

    assert ray.get(version.remote()) == 1

    @ray.remote  # noqa: F811 - the point of the test
    def version():
        return 2

    assert ray.get([version.remote() for _ in range(8)]) == [2] * 8


def test_task_reloading_a_helper_module_sees_the_changed_file(tmp_path):
    name = f"lw_reload_helper_{os.getpid()}_{time.time_ns()}"
    source = tmp_path / f"{name}.py"
    source.write_text("VALUE = 1\n")

    @ray.remote
    def read_value(directory, module_name):
        if directory not in sys.path:
            sys.path.insert(0, directory)
        module = importlib.import_module(module_name)
        module = importlib.reload(module)
        return module.VALUE

    refs = [read_value.remote(str(tmp_path), name) for _ in range(4)]
    assert ray.get(refs, timeout=20) == [1] * 4
    source.write_text("VALUE = 'two, a longer line'\n")
    # Bytecode caches are keyed on mtime and size: change both.
    later = time.time() + 5
    os.utime(source, (later, later))
    refs = [read_value.remote(str(tmp_path), name) for _ in range(4)]
    assert ray.get(refs, timeout=20) == ["two, a longer line"] * 4


def test_runtime_context_ids_inside_tasks():
    @ray.remote
    def ids():
        ctx = ray.get_runtime_context()
        return ctx.get_job_id(), ctx.get_task_id(), ctx.get_worker_id()

    driver_job = ray.get_runtime_context().get_job_id()
    (job1, task1, worker1), (job2, task2, worker2) = ray.get([ids.remote(), ids.remote()])
    assert job1 == job2 == driver_job and driver_job
    assert task1 and task2 and task1 != task2
    assert worker1 and worker2


def test_get_gpu_ids_is_empty_without_gpus():
    @ray.remote
    def gpus():
        return ray.get_gpu_ids()

    assert ray.get_gpu_ids() == []
    assert ray.get(gpus.remote()) == []


def test_many_small_tasks_all_complete():
    @ray.remote
    def square(x):
        return x * x

    assert ray.get([square.remote(i) for i in range(500)], timeout=40) == [
        i * i for i in range(500)
    ]


def test_task_with_many_objectref_arguments():
    refs = [add.remote(i, 0) for i in range(200)]

    @ray.remote
    def total(*values):
        return sum(values)

    assert ray.get(total.remote(*refs), timeout=30) == sum(range(200))


@ray.remote
def _types_and_values(*args, **kwargs):
    named = {key: (type(value).__name__, value) for key, value in kwargs.items()}
    return [(type(arg).__name__, arg) for arg in args], named


def test_scalar_arguments_arrive_as_sent_positional_or_keyword():
    """Plain scalars take the C pickler's quick path (calls.prepare_args); the values and
    their exact types must come through it unchanged, mixed with refs or not."""
    scalars = (0, -(2**70), 1.5, float("inf"), "", "é", b"", b"\x00\xff", True, False, None)
    positional, keywords = ray.get(_types_and_values.remote(*scalars), timeout=20)
    assert positional == [(type(a).__name__, a) for a in scalars]
    assert keywords == {}
    positional, keywords = ray.get(
        _types_and_values.remote(7, ray.put("via a ref"), flag=True, size=3), timeout=20)
    assert positional == [("int", 7), ("str", "via a ref")]
    assert keywords == {"flag": ("bool", True), "size": ("int", 3)}
