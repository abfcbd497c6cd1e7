"""Remote functions: submission, results, options, argument passing, nesting; and the
task-side API that Ray programs rely on: ``retry_exceptions`` matching an
exception that could not travel as itself, recursive ``cancel``, ``max_calls``, the
``memory`` resource, nested tasks inheriting their parent's ``runtime_env``, and GPU ids
inside placement-group bundles.

The remote-function tests share one 4-CPU runtime (``ray_start``). Parallelism is
checked structurally with a file-system barrier (N tasks inside it at once), never by
timing. The task-side API's tests (the classes at the end) run on a runtime of their own
(``task_api_runtime``: 2 CPUs, 2 GPUs and a logical ``memory`` resource).

Each test passes against Ray too (``LIGHTWORK_TEST_AGAINST_RAY=1``) unless its docstring
says lightwork is stricter there on purpose.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
import time

import pytest

import lightwork as ray
from tests.helpers import (arrive_and_wait, attempts, count_attempt, process_running,
                           wait_for_file, wait_until)

pytestmark = pytest.mark.usefixtures("ray_start")

MEMORY = 4 * 2**30  # the task-side API runtime's logical `memory` resource, in bytes


@pytest.fixture(scope="module")
def task_api_runtime(ray_start):
    """2 CPUs, 2 GPUs and ``MEMORY``, in place of the shared runtime. It asks for
    ``ray_start`` (which every test of the module has) so that one is set up first and
    never replaces this one."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=2, _memory=MEMORY)
    yield
    ray.shutdown()


ON_THE_TASK_API_RUNTIME = pytest.mark.usefixtures("task_api_runtime")


# ==== remote functions: submission, results, options, arguments, nesting ==============

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


@pytest.mark.parametrize("target", ["function", "class"])
def test_empty_parentheses_on_the_decorator_are_a_typeerror(target):
    """``@remote()`` is a slip for ``@remote``: Ray refuses it, and so does lightwork,
    for a function and for an actor class alike, saying which two forms work."""
    with pytest.raises((TypeError, AssertionError)):  # (Ray's is an AssertionError)
        if target == "function":
            @ray.remote()
            def f():
                return 1
        else:
            @ray.remote()
            class A:
                pass


@pytest.mark.lightwork_only
def test_the_decorator_error_names_both_forms():
    with pytest.raises(TypeError, match=r"no parentheses .*num_cpus=2"):
        ray.remote()


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


# ==== the task-side API Ray programs rely on (on ``task_api_runtime``) ================

# -- retry_exceptions -----------------------------------------------------------------
class TwoArgError(Exception):
    """Its __init__ needs two arguments: pickle's default rebuild (args=(message,)) fails."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}: {detail}")
        self.code = code


class RetryBase(Exception):
    pass


class UnpicklableError(RetryBase):
    """Holds a lock: it can be pickled neither as itself nor as its state."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def _fail_then_succeed(directory: str, failures: int, make_error):
    if count_attempt(directory) < failures:
        raise make_error()
    return "done"


class TestRetryExceptions:
    """``retry_exceptions``."""

    pytestmark = ON_THE_TASK_API_RUNTIME

    def test_retry_exceptions_retries_an_error_whose_init_takes_two_arguments(self, tmp_path):
        task = ray.remote(max_retries=3, retry_exceptions=[TwoArgError])(_fail_then_succeed)
        ref = task.remote(str(tmp_path), 2, lambda: TwoArgError(7, "flaky"))
        assert ray.get(ref, timeout=30) == "done"
        assert len(attempts(str(tmp_path))) == 3

    def test_retry_exceptions_matches_an_unpicklable_error_by_its_class_hierarchy(self, tmp_path):
        """The error arrives as UnserializableException; its base class still matches."""
        task = ray.remote(max_retries=3, retry_exceptions=[RetryBase])(_fail_then_succeed)
        ref = task.remote(str(tmp_path), 2, lambda: UnpicklableError("flaky"))
        assert ray.get(ref, timeout=30) == "done"
        assert len(attempts(str(tmp_path))) == 3

    def test_retry_exceptions_does_not_retry_an_unpicklable_error_of_another_class(self, tmp_path):
        task = ray.remote(max_retries=3, retry_exceptions=[TwoArgError])(_fail_then_succeed)
        ref = task.remote(str(tmp_path), 5, lambda: UnpicklableError("not retried"))
        with pytest.raises(Exception, match="not retried") as info:
            ray.get(ref, timeout=30)
        assert isinstance(info.value, ray.exceptions.RayTaskError)
        assert len(attempts(str(tmp_path))) == 1

    def test_retry_exceptions_gives_up_after_max_retries_for_an_unpicklable_error(self, tmp_path):
        task = ray.remote(max_retries=2, retry_exceptions=[UnpicklableError])(_fail_then_succeed)
        ref = task.remote(str(tmp_path), 10, lambda: UnpicklableError("always"))
        with pytest.raises(Exception, match="always"):
            ray.get(ref, timeout=30)
        assert len(attempts(str(tmp_path))) == 3


# -- recursive cancel -----------------------------------------------------------------
@ray.remote
class Box:
    """Collects the refs that nested tasks send out, so the driver can get them."""

    def __init__(self) -> None:
        self.items: list = []

    def add(self, item) -> None:
        self.items.append(item)

    def contents(self) -> list:
        return self.items


@ray.remote
def _nested(box, depth: int, sleep_s: float) -> str:
    """Submit one task of ``depth - 1`` (its ref goes to ``box``), then sleep."""
    if depth > 0:
        box.add.remote([_nested.remote(box, depth - 1, sleep_s)])
    # Short sleeps: Ray's cancel (force=False) interrupts Python code between two calls,
    # not a long time.sleep (lightwork's SIGINT interrupts either).
    deadline = time.monotonic() + sleep_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return f"finished at depth {depth}"


def _nested_refs(box, count: int) -> list:
    def enough():
        contents = ray.get(box.contents.remote(), timeout=10)
        return contents if len(contents) >= count else None

    refs = wait_until(enough, timeout=20, message=f"{count} nested refs")
    return [item[0] for item in refs]


@ray.remote
def _wait_for_child(box) -> str:
    child = _nested.remote(box, 0, 60.0)
    box.add.remote([child])
    return ray.get(child)


@ray.remote(max_concurrency=2)
class _Submitter:
    def __init__(self) -> None:
        self.children: list = []

    def submit_and_sleep(self) -> str:
        self.children.append(_nested.remote(None, 0, 60.0))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return "call finished"

    def submitted(self) -> list:
        return self.children


@ray.remote
def _submit_short_child_then_sleep(box) -> str:
    box.add.remote([_nested.remote(box, 0, 2.0)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "parent finished"


class TestRecursiveCancel:
    """Recursive cancel."""

    pytestmark = ON_THE_TASK_API_RUNTIME

    @pytest.mark.parametrize("force", [False, True])
    def test_recursive_cancel_cancels_running_and_pending_descendants(self, force):
        """With 2 CPUs the parent and its child run and the grandchild waits for a slot:
        cancelling the parent cancels both (Ray's default, recursive=True)."""
        box = Box.remote()
        parent = _nested.remote(box, 2, 60.0)
        child, grandchild = _nested_refs(box, 2)
        ray.cancel(parent, force=force)
        # force=True kills the parent's worker: in Ray that worker owned the child's ref, so
        # getting it raises OwnerDiedError; lightwork's driver adopts the objects of a dead
        # worker, and the child's own cancel is what it reports.
        errors = (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError,
                  ray.exceptions.OwnerDiedError)
        for ref in (parent, child, grandchild):
            with pytest.raises(errors):
                ray.get(ref, timeout=20)

    def test_recursive_cancel_of_a_task_blocked_in_get_cancels_what_it_waits_for(self):
        box = Box.remote()
        parent = _wait_for_child.remote(box)
        (child,) = _nested_refs(box, 1)
        ray.cancel(parent)
        for ref in (parent, child):
            with pytest.raises(ray.exceptions.TaskCancelledError):
                ray.get(ref, timeout=20)

    def test_recursive_cancel_of_an_actor_call_cancels_the_tasks_it_submitted(self):
        actor = _Submitter.remote()
        call = actor.submit_and_sleep.remote()
        (child,) = wait_until(lambda: ray.get(actor.submitted.remote(), timeout=10), timeout=20,
                              message="the call's child task")
        ray.cancel(call)
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(child, timeout=20)
        ray.kill(actor)

    def test_cancel_with_recursive_false_leaves_children_running(self):
        box = Box.remote()
        parent = _submit_short_child_then_sleep.remote(box)
        (child,) = _nested_refs(box, 1)
        ray.cancel(parent, recursive=False)
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(parent, timeout=20)
        assert ray.get(child, timeout=20) == "finished at depth 0"

    def test_recursive_cancel_of_a_finished_task_leaves_its_children_alone(self):
        @ray.remote
        def submit_and_return(box):
            box.add.remote([_nested.remote(box, 0, 1.0)])
            return "parent done"

        box = Box.remote()
        parent = submit_and_return.remote(box)
        assert ray.get(parent, timeout=20) == "parent done"
        (child,) = _nested_refs(box, 1)
        ray.cancel(parent)
        assert ray.get(child, timeout=20) == "finished at depth 0"


# -- max_calls --------------------------------------------------------------------------
def _pid_and_square(x: int) -> tuple[int, int]:
    return os.getpid(), x * x




class TestMaxCalls:
    """``max_calls``."""

    pytestmark = ON_THE_TASK_API_RUNTIME

    def test_max_calls_replaces_the_worker_after_n_calls(self):
        """Each worker process runs at most 2 calls of the function, one call at a time."""
        task = ray.remote(max_calls=2, max_retries=0)(_pid_and_square)
        results = [ray.get(task.remote(i), timeout=20) for i in range(8)]
        assert [square for _, square in results] == [i * i for i in range(8)]
        pids = [pid for pid, _ in results]
        assert max(pids.count(pid) for pid in set(pids)) <= 2
        assert len(set(pids)) >= 4
        finished = [pid for pid in set(pids) if pids.count(pid) == 2]
        assert finished  # a worker that ran its 2 calls exits
        wait_until(lambda: not any(process_running(pid) for pid in finished), timeout=30,
                   message="the retired workers to exit")

    def test_max_calls_under_a_burst_keeps_every_result_and_the_limit(self):
        """Many short calls at once: calls queued on a retiring worker run elsewhere."""
        task = ray.remote(max_calls=3, max_retries=0)(_pid_and_square)
        results = ray.get([task.remote(i) for i in range(60)], timeout=60)
        assert [square for _, square in results] == [i * i for i in range(60)]
        pids = [pid for pid, _ in results]
        assert max(pids.count(pid) for pid in set(pids)) <= 3

    def test_max_calls_counts_only_its_own_function(self):
        limited = ray.remote(max_calls=1)(_pid_and_square)
        free = ray.remote(_pid_and_square)
        free_pids = {ray.get(free.remote(1), timeout=20)[0] for _ in range(6)}
        limited_pids = [ray.get(limited.remote(2), timeout=20)[0] for _ in range(4)]
        assert len(set(limited_pids)) == 4
        assert len(free_pids) < 6  # plain calls keep reusing the pool's processes

    def test_max_calls_counts_calls_that_raise(self):
        def fail_with_pid():
            raise ValueError(f"worker-pid<{os.getpid()}>")

        task = ray.remote(max_calls=1, max_retries=0)(fail_with_pid)
        pids = set()
        for _ in range(3):
            with pytest.raises(ValueError, match="worker-pid") as info:
                ray.get(task.remote(), timeout=20)
            pids.add(re.search(r"worker-pid<(\d+)>", str(info.value)).group(1))
        assert len(pids) == 3

    def test_max_calls_cannot_be_set_in_options(self):
        with pytest.raises(ValueError, match="max_calls"):
            ray.remote(_pid_and_square).options(max_calls=2)


# -- the memory resource ----------------------------------------------------------------
def _hold_until_released(started: str, release: str) -> str:
    open(started, "w").close()
    deadline = time.monotonic() + 30
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "released"


class TestTheMemoryResource:
    """The ``memory`` resource."""

    pytestmark = ON_THE_TASK_API_RUNTIME

    def test_memory_is_a_resource_of_the_runtime(self):
        assert ray.cluster_resources()["memory"] == pytest.approx(MEMORY)
        assert ray.available_resources()["memory"] == pytest.approx(MEMORY)

    def test_a_task_with_memory_reserves_it_while_it_runs(self, tmp_path):
        started, release = str(tmp_path / "started"), str(tmp_path / "release")
        task = ray.remote(memory=2**30)(_hold_until_released)
        ref = task.remote(started, release)
        wait_until(lambda: os.path.exists(started), timeout=20, message="the task to start")
        wait_until(lambda: ray.available_resources().get("memory") == pytest.approx(MEMORY - 2**30),
                   timeout=10, message="1 GiB of memory to be reserved")
        open(release, "w").close()
        assert ray.get(ref, timeout=20) == "released"
        wait_until(lambda: ray.available_resources().get("memory") == pytest.approx(MEMORY),
                   timeout=10, message="the memory to come back")

    def test_tasks_whose_memory_does_not_fit_together_run_one_at_a_time(self, tmp_path):
        """Two CPUs are free, but 3 GiB + 3 GiB does not fit in 4 GiB: the second waits."""
        task = ray.remote(memory=3 * 2**30)(_hold_until_released)
        first = task.remote(str(tmp_path / "first"), str(tmp_path / "release-first"))
        second = task.remote(str(tmp_path / "second"), str(tmp_path / "release-second"))
        wait_until(lambda: os.path.exists(tmp_path / "first"), timeout=20, message="the first task")
        time.sleep(0.5)
        assert not os.path.exists(tmp_path / "second")
        open(tmp_path / "release-first", "w").close()
        wait_until(lambda: os.path.exists(tmp_path / "second"), timeout=20,
                   message="the second task")
        open(tmp_path / "release-second", "w").close()
        assert ray.get([first, second], timeout=20) == ["released", "released"]

    def test_an_actor_with_memory_holds_it_for_its_life(self):
        @ray.remote(memory=2**30)
        class Holder:
            def ping(self) -> str:
                return "pong"

        holder = Holder.remote()
        assert ray.get(holder.ping.remote(), timeout=20) == "pong"
        wait_until(lambda: ray.available_resources().get("memory") == pytest.approx(MEMORY - 2**30),
                   timeout=10, message="the actor's memory to be reserved")
        ray.kill(holder)
        wait_until(lambda: ray.available_resources().get("memory") == pytest.approx(MEMORY),
                   timeout=10, message="the actor's memory to come back")

    @pytest.mark.lightwork_only
    def test_a_task_asking_for_more_memory_than_the_runtime_has_fails_at_once(self):
        """Ray leaves an infeasible task pending forever; its get raises here."""
        task = ray.remote(memory=2 * MEMORY)(_pid_and_square)
        with pytest.warns(ray.exceptions.UnschedulableRequestWarning, match="memory"):
            ref = task.remote(1)
        with pytest.raises(ray.exceptions.TaskUnschedulableError, match="GiB"):
            ray.get(ref, timeout=30)

    def test_memory_goes_in_its_own_option_not_in_resources(self):
        """lightwork refuses it at @remote, Ray at .remote()."""
        with pytest.raises(ValueError, match="memory"):
            ray.remote(resources={"memory": 2**30})(_pid_and_square).remote(1)


# -- runtime_env inheritance -------------------------------------------------------------
ENV_NAMES = ("LW_TEST_A", "LW_TEST_B", "LW_TEST_C")


@ray.remote
def _read_env() -> dict:
    return {name: os.environ.get(name) for name in ENV_NAMES}


@ray.remote
def _read_env_and_nested() -> tuple:
    """This task's env, and the env of a task it submits without an env of its own."""
    return ray.get(_read_env.remote(), timeout=20), ray.get(_read_env.remote(), timeout=20)


@ray.remote
def _parent_of_children() -> dict:
    own = {"env_vars": {"LW_TEST_B": "child", "LW_TEST_C": "c"}}
    return {
        "plain": ray.get(_read_env.remote(), timeout=20),
        "own": ray.get(_read_env.options(runtime_env=own).remote(), timeout=20),
        "grandchild": ray.get(_read_env_and_nested.remote(), timeout=20),
        "grandchild_under_own": ray.get(
            _read_env_and_nested.options(runtime_env=own).remote(), timeout=20),
    }


@ray.remote
class _EnvReader:
    def read(self) -> dict:
        return {name: os.environ.get(name) for name in ENV_NAMES}

    def read_nested(self) -> dict:
        return ray.get(_read_env.remote(), timeout=20)


@ray.remote
def _make_actor_and_read() -> dict:
    actor = _EnvReader.remote()
    return ray.get(actor.read.remote(), timeout=20)


class TestRuntimeEnvInheritance:
    """``runtime_env`` inheritance."""

    pytestmark = ON_THE_TASK_API_RUNTIME

    def test_nested_tasks_inherit_the_parents_runtime_env_and_merge_env_vars(self):
        parent_env = {"env_vars": {"LW_TEST_A": "a", "LW_TEST_B": "parent"}}
        seen = ray.get(_parent_of_children.options(runtime_env=parent_env).remote(), timeout=60)
        inherited = {"LW_TEST_A": "a", "LW_TEST_B": "parent", "LW_TEST_C": None}
        merged = {"LW_TEST_A": "a", "LW_TEST_B": "child", "LW_TEST_C": "c"}
        assert seen["plain"] == inherited
        assert seen["own"] == merged
        assert seen["grandchild"] == (inherited, inherited)
        assert seen["grandchild_under_own"] == (merged, merged)
        # Nothing leaked into the pool's processes: a task from the driver sees none of it.
        assert ray.get([_read_env.remote() for _ in range(4)], timeout=20) == [
            dict.fromkeys(ENV_NAMES)] * 4

    def test_actors_made_by_a_task_and_tasks_submitted_by_an_actor_inherit_its_env(self):
        env = {"env_vars": {"LW_TEST_A": "from-parent"}}
        expected = {"LW_TEST_A": "from-parent", "LW_TEST_B": None, "LW_TEST_C": None}
        assert (ray.get(_make_actor_and_read.options(runtime_env=env).remote(), timeout=60)
                == expected)
        actor = _EnvReader.options(runtime_env=env).remote()
        assert ray.get(actor.read_nested.remote(), timeout=30) == expected
        ray.kill(actor)


# -- GPU ids, in and out of placement-group bundles --------------------------------------
def _gpu_view() -> tuple:
    return tuple(ray.get_gpu_ids()), os.environ.get("CUDA_VISIBLE_DEVICES"), os.getpid()


def _in_bundle(group, index: int = -1):
    from lightwork.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)


@pytest.fixture
def two_gpu_bundles():
    from lightwork.util import placement_group, remove_placement_group

    group = placement_group([{"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}])
    ray.get(group.ready(), timeout=20)
    yield group
    remove_placement_group(group)


class _GpuActor:
    def __init__(self) -> None:
        self.at_init = tuple(ray.get_gpu_ids())

    def view(self) -> tuple:
        return self.at_init, tuple(ray.get_gpu_ids()), os.environ.get("CUDA_VISIBLE_DEVICES")


class TestGpuIds:
    """GPU ids, in and out of placement-group bundles."""

    pytestmark = ON_THE_TASK_API_RUNTIME

    def test_a_gpu_task_sees_its_gpu_ids_and_runs_in_a_fresh_process_each_call(self):
        """Ray's default for a function declared with num_gpus is max_calls=1."""
        task = ray.remote(num_gpus=1)(_gpu_view)
        views = [ray.get(task.remote(), timeout=20) for _ in range(3)]
        for ids, visible, _ in views:
            assert len(ids) == 1 and ids[0] in (0, 1)
            assert visible == str(ids[0])
        assert len({pid for _, _, pid in views}) == 3

    def test_gpu_tasks_and_cpu_tasks_never_share_a_worker(self):
        """As in Ray: a task that needs a GPU gets a worker of its own, even when a
        worker that ran CPU tasks is idle, and a CPU task never runs where a GPU task
        set CUDA_VISIBLE_DEVICES (max_calls=0 keeps the GPU worker for reuse)."""
        cpu = ray.remote(_gpu_view)
        gpu = ray.remote(num_gpus=1, max_calls=0)(_gpu_view)
        cpu_pids = {ray.get(cpu.remote(), timeout=20)[2] for _ in range(4)}
        gpu_views = [ray.get(gpu.remote(), timeout=20) for _ in range(3)]
        gpu_pids = {pid for _, _, pid in gpu_views}
        assert not cpu_pids & gpu_pids
        assert len(gpu_pids) == 1  # the GPU kind's worker is reused by GPU tasks
        after = [ray.get(cpu.remote(), timeout=20) for _ in range(4)]
        assert not {pid for _, _, pid in after} & gpu_pids
        assert all(ids == () and visible is None for ids, visible, _ in after)

    def test_a_burst_of_short_gpu_tasks_each_gets_one_gpu_and_gives_it_back(self):
        """Each call retires its worker (max_calls=1): calls queued there run elsewhere."""
        task = ray.remote(num_gpus=1)(_gpu_view)
        views = ray.get([task.remote() for _ in range(8)], timeout=45)
        assert all(len(ids) == 1 and visible == str(ids[0]) for ids, visible, _ in views)
        both = ray.remote(num_gpus=2)(_gpu_view)
        assert sorted(ray.get(both.remote(), timeout=20)[0]) == [0, 1]

    def test_tasks_in_a_gpu_bundle_get_the_bundles_gpu(self, two_gpu_bundles):
        task = ray.remote(num_gpus=1, num_cpus=1)(_gpu_view)
        first = [ray.get(task.options(scheduling_strategy=_in_bundle(two_gpu_bundles, 0)).remote(),
                         timeout=20) for _ in range(3)]
        second = ray.get(task.options(scheduling_strategy=_in_bundle(two_gpu_bundles, 1)).remote(),
                         timeout=20)
        bundle_0_ids = {view[0] for view in first}
        assert len(bundle_0_ids) == 1  # the same GPU every time
        (ids,) = bundle_0_ids
        assert len(ids) == 1 and first[0][1] == str(ids[0])
        assert len(second[0]) == 1 and second[0] != ids
        assert second[1] == str(second[0][0])

    def test_fractional_tasks_in_a_bundle_share_its_gpu(self, tmp_path, two_gpu_bundles):
        task = ray.remote(num_gpus=0.5, num_cpus=0)(_gpu_view)
        whole = ray.remote(num_gpus=1, num_cpus=0)(_gpu_view)
        (bundle_ids, _, _) = ray.get(
            whole.options(scheduling_strategy=_in_bundle(two_gpu_bundles, 1)).remote(), timeout=20)
        halves = ray.get([task.options(scheduling_strategy=_in_bundle(two_gpu_bundles, 1)).remote()
                          for _ in range(2)], timeout=20)
        assert len(bundle_ids) == 1
        assert [view[0] for view in halves] == [bundle_ids, bundle_ids]

    def test_a_gpu_reserved_by_a_group_is_not_given_to_tasks_outside_it(self):
        from lightwork.util import placement_group, remove_placement_group

        group = placement_group([{"GPU": 1}])
        ray.get(group.ready(), timeout=20)
        try:
            inside = ray.remote(num_gpus=1, num_cpus=0)(_gpu_view)
            (group_ids, _, _) = ray.get(
                inside.options(scheduling_strategy=_in_bundle(group, 0)).remote(), timeout=20)
            outside = [ray.get(ray.remote(num_gpus=1)(_gpu_view).remote(), timeout=20)[0]
                       for _ in range(3)]
            assert len(group_ids) == 1
            assert all(len(ids) == 1 and ids != group_ids for ids in outside)
        finally:
            remove_placement_group(group)
        # Removed: both GPUs are the node's again.
        both = ray.remote(num_gpus=2)(_gpu_view)
        assert sorted(ray.get(both.remote(), timeout=20)[0]) == [0, 1]

    def test_an_actor_in_a_gpu_bundle_gets_the_bundles_gpu_for_its_life(self, two_gpu_bundles):
        probe = ray.remote(num_gpus=1, num_cpus=0)(_gpu_view)
        (bundle_ids, _, _) = ray.get(
            probe.options(scheduling_strategy=_in_bundle(two_gpu_bundles, 1)).remote(), timeout=20)
        actor = ray.remote(num_gpus=1, num_cpus=0)(_GpuActor).options(
            scheduling_strategy=_in_bundle(two_gpu_bundles, 1)).remote()
        at_init, in_call, visible = ray.get(actor.view.remote(), timeout=20)
        assert at_init == in_call == bundle_ids
        assert visible == str(bundle_ids[0])
        ray.kill(actor)

    def test_an_actor_with_a_gpu_gets_its_id(self):
        actor = ray.remote(num_gpus=1)(_GpuActor).remote()
        at_init, in_call, visible = ray.get(actor.view.remote(), timeout=20)
        assert len(in_call) == 1 and at_init == in_call and visible == str(in_call[0])
        ray.kill(actor)

    # Last in the module: it replaces the module's runtime with one of default size.
    def test_the_default_memory_is_what_is_available_less_the_object_store(self, fresh_runtime):
        store = 128 * 2**20
        ray.init(num_cpus=1, object_store_memory=store)
        memory = ray.cluster_resources()["memory"]
        with open("/proc/meminfo") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        assert 0 < memory <= fields["MemTotal"] - store
        # Within what was available at init, give or take other programs' churn since.
        assert memory == pytest.approx(fields["MemAvailable"] - store, rel=0.2)
