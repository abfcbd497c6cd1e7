"""One behaviour suite, run against every backend: the embedded runtime and a real Dask
distributed cluster (``dask scheduler`` + two ``dask worker`` processes, one thread and
``CPU=1`` each, started through the CLI by ``dask_cluster.DaskCluster``).

Both runtimes offer two one-CPU slots, so the same tests mean the same thing on both. A
gap of one backend is an ``xfail(strict=True)`` naming the reason (``gap``), never a
skip: when the gap closes, the suite says so.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid

import pytest
from tests.helpers import arrive_and_wait, attempts, count_attempt, wait_for_file
from tests import support

import lightwork
from lightwork import exceptions

pytestmark = pytest.mark.lightwork_only
pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")

# ``LIGHTWORK_TEST_BACKENDS=distributed`` runs one half (``make test`` runs the cluster
# half again on the oldest supported distributed).
BACKENDS = os.environ.get("LIGHTWORK_TEST_BACKENDS", "local,distributed").split(",")


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request, shared_dask_cluster):
    """The runtime under test, with two one-CPU slots; yields the backend's name."""
    if lightwork.is_initialized():
        lightwork.shutdown()
    if request.param == "local":
        lightwork.init(num_cpus=2)
    else:
        lightwork.init(address=shared_dask_cluster.scheduler_file)
    try:
        if request.param != "local":
            shared_dask_cluster.wait_for_workers(support.cluster_client())
        yield request.param
    finally:
        lightwork.shutdown()


def gap(backend_name: str, reason: str):
    """Mark a test as a known gap of one backend (strict: it must fail there)."""
    return pytest.mark.lw_gap(backend_name, reason)


@pytest.fixture(autouse=True)
def _apply_gaps(request, backend):
    marker = request.node.get_closest_marker("lw_gap")
    if marker is not None and marker.args[0] == backend:
        request.applymarker(pytest.mark.xfail(strict=True, reason=marker.args[1]))


# ---- tasks ------------------------------------------------------------------------------
@lightwork.remote
def add(a, b=0):
    return a + b


@lightwork.remote
def fresh():
    return uuid.uuid4().hex


@lightwork.remote
def describe(box):
    return [type(item).__name__ for item in box], lightwork.get(box[0])


@lightwork.remote(num_returns=3)
def three(x):
    return x, x + 1, x + 2


@lightwork.remote
def fail(message):
    raise ValueError(message)


@lightwork.remote
def touch(path):
    time.sleep(0.3)
    open(path, "w").close()


def test_task_result_and_arguments(backend):
    assert lightwork.backend() == backend
    assert lightwork.get(add.remote(1, b=2)) == 3
    assert lightwork.get([add.remote(i, i) for i in range(20)]) == [2 * i for i in range(20)]


def test_top_level_refs_are_resolved_and_refs_in_containers_stay_refs(backend):
    stored = lightwork.put(40)
    assert lightwork.get(add.remote(stored, b=add.remote(1, 1))) == 42
    assert lightwork.get(describe.remote([lightwork.put("x"), 1])) == (["ObjectRef", "int"], "x")


def test_a_borrowed_ref_outlives_the_drivers_ref(backend):
    """The driver drops its only ref right after the submit; the task still reads it."""
    ref = describe.remote([lightwork.put(list(range(1000)))])
    assert lightwork.get(ref)[1] == list(range(1000))


def test_num_returns(backend):
    refs = three.remote(10)
    assert len(refs) == 3 and lightwork.get(refs) == [10, 11, 12]
    assert lightwork.get(refs[2]) == 12


def test_identical_calls_run_twice(backend):
    first, second = fresh.remote(), fresh.remote()
    assert lightwork.get(first) != lightwork.get(second)


def test_a_task_whose_ref_was_dropped_still_runs(backend, tmp_path):
    path = str(tmp_path / "ran")
    touch.remote(path)  # the ref is dropped at once
    assert wait_for_file(path, 20)


def test_task_name_option(backend):
    assert lightwork.get(add.options(name="custom").remote(1, 1)) == 2


# ---- objects ----------------------------------------------------------------------------
def test_put_get_and_get_order(backend):
    refs = [lightwork.put(i) for i in range(5)]
    assert lightwork.get(refs[::-1]) == [4, 3, 2, 1, 0]
    assert lightwork.get([refs[0], refs[0]]) == [0, 0]  # get accepts duplicates


@lightwork.remote
def gated(path, value):
    wait_for_file(path, 20)
    return value


def test_get_timeout(backend, tmp_path):
    gate = str(tmp_path / "gate")
    ref = gated.remote(gate, 1)
    with pytest.raises(exceptions.GetTimeoutError):
        lightwork.get(ref, timeout=0.3)
    open(gate, "w").close()
    assert lightwork.get(ref, timeout=20) == 1


def test_wait_num_returns_timeout_and_order(backend, tmp_path):
    gate = str(tmp_path / "gate")
    done = [lightwork.put(i) for i in range(3)]
    slow = gated.remote(gate, "slow")
    refs = [slow, *done]
    ready, not_ready = lightwork.wait(refs, num_returns=2, timeout=10)
    assert ready == done[:2] and not_ready == [slow, done[2]]
    ready, not_ready = lightwork.wait(refs, num_returns=4, timeout=0.2)
    assert ready == done and not_ready == [slow]
    with pytest.raises(ValueError, match="unique"):
        lightwork.wait([slow, slow])
    open(gate, "w").close()
    ready, _ = lightwork.wait(refs, num_returns=4, timeout=20)
    assert ready == refs


# ---- errors -----------------------------------------------------------------------------
def test_task_error_is_the_users_type_with_the_remote_traceback(backend):
    with pytest.raises(ValueError) as caught:
        lightwork.get(fail.remote("the message"))
    assert isinstance(caught.value, exceptions.RayTaskError)
    text = str(caught.value)
    assert "the message" in text and "raise ValueError(message)" in text


def test_get_of_several_raises_the_first_failure_without_waiting_for_the_rest(
        backend, tmp_path):
    """As in Ray: a failed object ends a ``get`` of several at once, though others are
    still pending (here one that would wait 20 s for a gate opened only afterwards)."""
    gate = str(tmp_path / "gate")
    slow = gated.remote(gate, "slow")
    with pytest.raises(ValueError, match="fails first"):
        lightwork.get([slow, fail.remote("fails first")], timeout=15)
    failed = fail.remote("already failed")
    with pytest.raises(ValueError):
        lightwork.get(failed, timeout=15)
    with pytest.raises(ValueError, match="already failed"):  # failed before the get
        lightwork.get([slow, failed], timeout=15)
    open(gate, "w").close()
    assert lightwork.get(slow, timeout=20) == "slow"


@lightwork.remote
def fail_plainly():
    raise Exception("a plain Exception")


def test_a_plain_exception_arrives_as_the_task_error_itself(backend):
    """The cause's class is ``Exception``, which the task error is already: Ray raises
    the ``RayTaskError`` itself, not a class derived from both."""
    with pytest.raises(exceptions.RayTaskError) as caught:
        lightwork.get(fail_plainly.remote(), timeout=20)
    assert caught.type is exceptions.RayTaskError
    assert "a plain Exception" in str(caught.value)


def test_an_argument_error_fails_the_dependent_task(backend):
    with pytest.raises(ValueError, match="upstream"):
        lightwork.get(add.remote(fail.remote("upstream"), 1))


@lightwork.remote
def flaky(directory, failures):
    if count_attempt(directory) < failures:
        raise ConnectionError("transient")
    return "ok"


def test_retry_exceptions_by_type(backend, tmp_path):
    retried = flaky.options(max_retries=2, retry_exceptions=[ConnectionError])
    assert lightwork.get(retried.remote(str(tmp_path), 2)) == "ok"
    assert len(attempts(str(tmp_path))) == 3
    other = tmp_path / "other"
    other.mkdir()
    not_retried = flaky.options(max_retries=2, retry_exceptions=[KeyError])
    with pytest.raises(ConnectionError):
        lightwork.get(not_retried.remote(str(other), 5))
    assert len(attempts(str(other))) == 1


@lightwork.remote
def record_pid_and_wait(directory, gate):
    count_attempt(directory)
    wait_for_file(gate, 30)
    return os.getpid()


def test_a_worker_killed_mid_task_is_retried(backend, tmp_path, wait_until):
    gate = str(tmp_path / "gate")
    ref = record_pid_and_wait.remote(str(tmp_path), gate)
    [pid] = wait_until(lambda: attempts(str(tmp_path)), timeout=20, message="the task to start")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: len(attempts(str(tmp_path))) == 2, timeout=40, message="the retry")
    open(gate, "w").close()
    assert lightwork.get(ref, timeout=40) != pid


@lightwork.remote
def record_pid_and_sum(directory, gate, array):
    count_attempt(directory)
    wait_for_file(gate, 30)
    return os.getpid(), float(array.sum())


def test_a_worker_killed_mid_task_is_retried_with_its_large_argument_as_passed(
        backend, tmp_path, wait_until):
    """A 4 MB array goes by value: the retry sees it as it was at the call."""
    np = pytest.importorskip("numpy")
    array = np.arange(1 << 19, dtype=np.float64)
    expected = float(array.sum())
    gate = str(tmp_path / "gate")
    ref = record_pid_and_sum.remote(str(tmp_path), gate, array)
    array[:] = 0.0
    [pid] = wait_until(lambda: attempts(str(tmp_path)), timeout=20, message="the task to start")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: len(attempts(str(tmp_path))) == 2, timeout=40, message="the retry")
    open(gate, "w").close()
    again, total = lightwork.get(ref, timeout=40)
    assert (again != pid, total) == (True, expected)


@lightwork.remote
def die(directory):
    count_attempt(directory)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("max_retries", [0, 2])
def test_a_task_that_kills_its_worker_every_time_fails_with_worker_crashed(
        backend, tmp_path, max_retries):
    """Each lost worker counts against the task's own max_retries."""
    with pytest.raises(exceptions.WorkerCrashedError):
        lightwork.get(die.options(max_retries=max_retries).remote(str(tmp_path)), timeout=50)
    assert len(attempts(str(tmp_path))) == max_retries + 1


@lightwork.remote
def die_once(directory):
    if count_attempt(directory) == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


def test_a_task_lost_with_its_worker_and_its_dependent_are_retried(backend, tmp_path):
    """The dependent was submitted before its argument's worker died: it runs on the
    retried argument."""
    first = die_once.options(max_retries=1).remote(str(tmp_path))
    second = add.options(max_retries=0).remote(first, "!")
    assert lightwork.get(second, timeout=50) == "survived!"
    assert lightwork.get(first) == "survived"
    assert len(attempts(str(tmp_path))) == 2


@lightwork.remote
def die_at_gate_once(directory, kill_gate, gate):
    if count_attempt(directory) == 0:
        wait_for_file(kill_gate, 30)
        os.kill(os.getpid(), signal.SIGKILL)
    wait_for_file(gate, 30)
    return "retried"


def test_wait_keeps_a_task_lost_with_its_worker_not_ready_while_it_is_retried(
        backend, tmp_path, wait_until):
    """Ray's semantics: the loss is not the task's end while max_retries allows a retry."""
    import threading

    kill_gate, gate = str(tmp_path / "kill"), str(tmp_path / "gate")
    ref = die_at_gate_once.options(max_retries=1).remote(str(tmp_path), kill_gate, gate)
    wait_until(lambda: attempts(str(tmp_path)), timeout=20, message="the task to start")
    # The worker dies while wait() blocks (its callbacks are on the first try's future).
    threading.Timer(0.3, lambda: open(kill_gate, "w").close()).start()
    # (2 s: the loss comes at 0.3 s; a wait that took it for the task's end returns then.)
    ready, not_ready = lightwork.wait([ref], timeout=2)
    assert (ready, not_ready) == ([], [ref])
    wait_until(lambda: len(attempts(str(tmp_path))) == 2, timeout=20,
               message="the retry to start")  # (it then waits for its gate)
    open(gate, "w").close()
    assert lightwork.wait([ref], timeout=30) == ([ref], [])
    assert lightwork.get(ref) == "retried"


def test_wait_counts_a_task_that_lost_its_worker_on_every_try_once_retries_are_used(
        backend, tmp_path):
    ref = die.options(max_retries=2).remote(str(tmp_path))
    assert lightwork.wait([ref], timeout=50) == ([ref], [])
    assert len(attempts(str(tmp_path))) == 3
    with pytest.raises(exceptions.WorkerCrashedError):
        lightwork.get(ref, timeout=20)


# ---- nested tasks -----------------------------------------------------------------------
@lightwork.remote
def tree(depth, fanout):
    if depth == 0:
        return 1
    return sum(lightwork.get([tree.remote(depth - 1, fanout) for _ in range(fanout)]))


def test_nested_tasks_get_without_deadlock(backend):
    """More tasks block in get at once than there are slots: blocked tasks free theirs."""
    assert lightwork.get(tree.remote(3, 2), timeout=60) == 8


# ---- cancel -----------------------------------------------------------------------------
def test_cancel_a_pending_task(backend, tmp_path):
    gate = str(tmp_path / "gate")
    blockers = [gated.remote(gate, i) for i in range(2)]  # both slots busy
    pending = gated.remote(gate, "never")
    lightwork.cancel(pending)
    open(gate, "w").close()
    with pytest.raises(exceptions.TaskCancelledError):
        lightwork.get(pending, timeout=20)
    assert lightwork.get(blockers, timeout=20) == [0, 1]


def test_force_cancel_of_a_running_task(backend, tmp_path, wait_until):
    """Embedded: the worker is killed and get raises. Distributed cannot stop a running
    task: it says so (UnsupportedOnBackend, also a NotImplementedError) and the task runs
    on. Both are the specified behaviour (the README's table lists the difference)."""
    gate = str(tmp_path / "gate")
    ref = record_pid_and_wait.remote(str(tmp_path), gate)
    wait_until(lambda: attempts(str(tmp_path)), timeout=20, message="the task to start")
    if backend == "local":
        lightwork.cancel(ref, force=True)
        with pytest.raises((exceptions.TaskCancelledError, exceptions.WorkerCrashedError)):
            lightwork.get(ref, timeout=20)
        return
    with pytest.raises(exceptions.UnsupportedOnBackend, match="cancel.*distributed") as caught:
        lightwork.cancel(ref, force=True)
    assert isinstance(caught.value, NotImplementedError)
    assert "cancel() without force" in str(caught.value)
    open(gate, "w").close()
    assert lightwork.get(ref, timeout=20)


@lightwork.remote
def meet(directory, name, parties):
    return arrive_and_wait(directory, name, parties, limit=5)


@gap("distributed", "distributed cannot interrupt a running task: cancel() without force "
     "makes its get raise TaskCancelledError, but the task runs to its end on its worker "
     "and keeps its slot (README, the backend table)")
def test_cancel_interrupts_a_running_task_and_frees_its_slot(backend, tmp_path, wait_until):
    gate = str(tmp_path / "gate")
    ref = record_pid_and_wait.remote(str(tmp_path), gate)
    wait_until(lambda: attempts(str(tmp_path)), timeout=20, message="the task to start")
    lightwork.cancel(ref)
    try:
        with pytest.raises(exceptions.TaskCancelledError):
            lightwork.get(ref, timeout=20)
        barrier = tmp_path / "barrier"
        barrier.mkdir()
        # Both slots at once, the gate still closed: only if the cancel freed the first.
        # (wait, not get: where it did not, one meeting queues behind the gate.)
        # (5 s: locally both meet at once; on distributed, where this test is a known
        # gap, the whole wait runs, in both halves of `make test`.)
        meetings = [meet.remote(str(barrier), str(i), 2) for i in range(2)]
        ready, _ = lightwork.wait(meetings, num_returns=2, timeout=5)
        assert len(ready) == 2 and lightwork.get(meetings) == [True, True]
    finally:
        open(gate, "w").close()


def test_placement_groups_and_a_hard_node_affinity(backend):
    """Locally a group reserves its bundles and a task may be pinned to the node; on
    distributed neither exists, and each says so at the call, with what to do instead."""
    from lightwork.util import placement_group, remove_placement_group
    from lightwork.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = lightwork.get_runtime_context().get_node_id()
    pinned = add.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
    loose = add.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True))
    assert lightwork.get(loose.remote(1, 1), timeout=30) == 2  # a preference: met anywhere
    if backend == "local":
        group = placement_group([{"CPU": 1}])
        assert lightwork.get(group.ready(), timeout=30) == group
        remove_placement_group(group)
        assert lightwork.get(pinned.remote(1, 2), timeout=30) == 3
        return
    with pytest.raises(exceptions.UnsupportedOnBackend,
                       match=r"placement groups.*distributed.*--resources"):
        placement_group([{"CPU": 1}])
    with pytest.raises(exceptions.UnsupportedOnBackend,
                       match=r"NodeAffinity.*distributed.*resources=.*soft=True"):
        pinned.remote(1, 2)


# ---- resources --------------------------------------------------------------------------
def test_an_impossible_resource_request_warns_and_its_get_raises_naming_it(backend):
    # As on Ray, .remote() returns and the program goes on; where Ray's get would wait
    # forever, lightwork's raises at once.
    with pytest.warns(exceptions.UnschedulableRequestWarning, match="add.*3 CPU"):
        cpus = add.options(num_cpus=3).remote(1)
    with pytest.warns(exceptions.UnschedulableRequestWarning, match="1 TPU"):
        tpu = add.options(resources={"TPU": 1}).remote(1)
    ready, pending = lightwork.wait([cpus, tpu], num_returns=2, timeout=30)
    assert ready == [cpus, tpu] and pending == []  # ready, with their errors
    with pytest.raises(exceptions.TaskUnschedulableError, match=r"3 CPU.*options\(\)"):
        lightwork.get(cpus, timeout=30)
    with pytest.raises(exceptions.TaskUnschedulableError, match="TPU"):
        lightwork.get(tpu, timeout=30)
    assert lightwork.get(add.remote(1, 2), timeout=30) == 3  # the session goes on


@lightwork.remote
def incr_through(handle):
    try:
        return lightwork.get(handle.incr.remote(), timeout=30)
    except exceptions.ActorUnschedulableError as error:  # (not a wait: a GetTimeoutError)
        return str(error)


def test_an_impossible_actor_warns_and_its_calls_raise_naming_it(backend):
    with pytest.warns(exceptions.UnschedulableRequestWarning, match="Counter.*1 GPU"):
        counter = Counter.options(num_gpus=1).remote()
    call = counter.incr.remote()
    assert lightwork.wait([call], timeout=30)[0] == [call]
    with pytest.raises(exceptions.ActorUnschedulableError, match="Counter.*1 GPU"):
        lightwork.get(call, timeout=30)
    # Its handle passed to a task: the calls made there fail the same way, at once.
    assert re.search("Counter.*1 GPU", lightwork.get(incr_through.remote(counter), timeout=60))


def test_invalid_resource_requests_stay_value_errors(backend):
    with pytest.raises(ValueError, match="num_cpus"):
        add.options(num_cpus=-1).remote(1)
    with pytest.raises(ValueError, match="num_gpus"):
        add.options(num_gpus="two").remote(1)


def test_cluster_resources(backend, wait_until):
    # A worker killed by an earlier test comes back (its nanny restarts it) in a moment.
    wait_until(lambda: lightwork.cluster_resources()["CPU"] == 2, timeout=30,
               message="both slots to be up")
    assert len(lightwork.nodes()) == (1 if backend == "local" else 2)


def test_a_running_task_takes_a_cpu_from_the_available_resources(backend, wait_until, tmp_path):
    # As in Ray: a num_cpus=1 task holds one CPU while it runs (on the cluster it takes a
    # worker's thread, not a declared CPU: counted all the same).
    wait_until(lambda: lightwork.available_resources().get("CPU") == 2, timeout=30,
               message="both slots to be free")
    gate = str(tmp_path / "gate")
    ref = gated.remote(gate, 1)
    try:
        wait_until(lambda: lightwork.available_resources().get("CPU") == 1, timeout=20,
                   message="the running task to hold a CPU")
        assert lightwork.cluster_resources()["CPU"] == 2
    finally:
        open(gate, "w").close()
    assert lightwork.get(ref, timeout=30) == 1
    wait_until(lambda: lightwork.available_resources().get("CPU") == 2, timeout=20,
               message="the CPU to be given back")


@lightwork.remote
def give_lock():
    return threading.Lock()


@lightwork.remote(num_returns=2)
def give_lock_and_one():
    return threading.Lock(), 1


def test_an_unpicklable_value_is_a_serialization_error_naming_it(backend):
    """A task's unpicklable result is that task's error, and an unpicklable argument or
    put fails at once, each naming what could not be pickled (on distributed the result
    was a RuntimeSystemError, "could not fetch a result", after distributed logged the
    task's whole payload, and an argument a bare TypeError)."""
    from lightwork.kernel.serialization import SerializationError

    with pytest.raises(SerializationError, match="lock"):
        lightwork.get(give_lock.remote(), timeout=30)
    lock_ref, _ = give_lock_and_one.remote()
    with pytest.raises(SerializationError, match="lock"):
        lightwork.get(lock_ref, timeout=30)
    with pytest.raises(SerializationError, match="lock"):
        add.remote(threading.Lock())
    journal = Journal.remote()
    with pytest.raises(SerializationError, match="lock"):
        journal.add.remote(threading.Lock(), 0)
    with pytest.raises(SerializationError, match="lock"):
        lightwork.put(threading.Lock())
    assert lightwork.get(add.remote(1, 1), timeout=20) == 2


# ---- actors -----------------------------------------------------------------------------
@lightwork.remote
class Counter:
    def __init__(self):
        self.count = 0

    def incr(self):
        self.count += 1
        return self.count


def test_actor_calls_run_in_order(backend):
    counter = Counter.remote()
    assert lightwork.get([counter.incr.remote() for _ in range(1000)]) == list(range(1, 1001))


@lightwork.remote
class Journal:
    """Records each caller's entries in the order they arrive."""

    def __init__(self):
        self.entries = {}

    def add(self, caller, index):
        self.entries.setdefault(caller, []).append(index)

    def of(self, caller):
        return self.entries.get(caller, [])


@lightwork.remote
def write_entries(journal, caller, count):
    refs = [journal.add.remote(caller, index) for index in range(count)]
    lightwork.get(refs, timeout=30)
    return lightwork.get(journal.of.remote(caller), timeout=30)


def test_each_callers_calls_run_in_that_callers_order(backend):
    """Three callers at once (the driver and two tasks holding the handle): each one's
    calls run in the order it made them."""
    journal = Journal.remote()
    writers = [write_entries.remote(journal, name, 300) for name in ("task-a", "task-b")]
    mine = [journal.add.remote("driver", index) for index in range(300)]
    lightwork.get(mine, timeout=30)
    assert lightwork.get(writers, timeout=60) == [list(range(300))] * 2
    assert lightwork.get(journal.of.remote("driver"), timeout=20) == list(range(300))


@lightwork.remote
class Relay:
    """Holds a handle to another actor, given to its constructor or to a call."""

    def __init__(self, target=None):
        self.target = target

    def through_kept(self, times):
        return lightwork.get([self.target.incr.remote() for _ in range(times)], timeout=30)[-1]

    def through(self, target):
        return lightwork.get(target.incr.remote(), timeout=30)


def test_an_actor_handle_passed_to_another_actor(backend):
    counter = Counter.remote()
    relay = Relay.remote(counter)
    assert lightwork.get(relay.through_kept.remote(3), timeout=30) == 3
    assert lightwork.get(Relay.remote().through.remote(counter), timeout=30) == 4
    assert lightwork.get(counter.incr.remote(), timeout=20) == 5


def test_a_detached_actor_outlives_its_handles(backend):
    import gc

    keeper = Counter.options(name="keeper", lifetime="detached").remote()
    assert lightwork.get(keeper.incr.remote(), timeout=20) == 1
    del keeper
    gc.collect()
    time.sleep(0.5)  # an actor with no handle left would be ending now
    found = lightwork.get_actor("keeper")
    assert lightwork.get(found.incr.remote(), timeout=20) == 2
    lightwork.kill(found)


@lightwork.remote
class Meeter:
    def meet(self, directory, name, parties):
        return arrive_and_wait(directory, name, parties)


def test_actors_run_at_the_same_time(backend, tmp_path):
    """Three actors on two slots: two share a worker and must still run at once."""
    actors = [Meeter.remote() for _ in range(3)]
    assert lightwork.get([a.meet.remote(str(tmp_path), str(i), 3)
                          for i, a in enumerate(actors)], timeout=40) == [True] * 3


def test_max_concurrency_runs_calls_of_one_actor_at_once(backend, tmp_path):
    actor = Meeter.options(max_concurrency=2).remote()
    assert lightwork.get([actor.meet.remote(str(tmp_path), str(i), 2) for i in range(2)],
                         timeout=40) == [True, True]


@lightwork.remote
class AsyncGate:
    def __init__(self):
        import asyncio

        self.opened = asyncio.Event()

    async def wait_open(self):
        await self.opened.wait()
        return "through"

    async def open(self):
        self.opened.set()
        return "opened"


def test_async_actor_runs_calls_concurrently(backend):
    gate = AsyncGate.remote()
    waiting = gate.wait_open.remote()
    assert lightwork.get(gate.open.remote(), timeout=20) == "opened"
    assert lightwork.get(waiting, timeout=20) == "through"


@lightwork.remote
class Broken:
    def __init__(self):
        raise RuntimeError("constructor failed")

    def ping(self):
        return "pong"


def test_an_actor_whose_constructor_raised_is_dead(backend):
    broken = Broken.remote()
    with pytest.raises(exceptions.ActorDiedError, match="constructor failed"):
        lightwork.get(broken.ping.remote(), timeout=20)


def test_a_killed_actor_is_dead(backend):
    counter = Counter.remote()
    assert lightwork.get(counter.incr.remote()) == 1
    lightwork.kill(counter)
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(counter.incr.remote(), timeout=20)


@lightwork.remote
class Pid:
    def pid(self):
        return os.getpid()


def test_an_actor_whose_worker_is_killed_is_dead_and_nothing_hangs(backend):
    actor = Pid.remote()
    os.kill(lightwork.get(actor.pid.remote(), timeout=20), signal.SIGKILL)
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(actor.pid.remote(), timeout=40)


@lightwork.remote
class Restartable:
    """Records each run of its constructor (its pid) in ``directory``."""

    def __init__(self, directory):
        count_attempt(directory)

    def pid(self):
        return os.getpid()

    def pid_after(self, started, gate):
        open(started, "w").close()
        wait_for_file(gate, 30)
        return os.getpid()


def _both_slots_up(wait_until):
    """A worker killed by an earlier test is back (its nanny restarts it): a restart
    has somewhere to go."""
    wait_until(lambda: lightwork.cluster_resources()["CPU"] == 2, timeout=30,
               message="both slots to be up")


def test_an_actor_with_max_restarts_comes_back_after_its_worker_dies(backend, tmp_path,
                                                                     wait_until):
    _both_slots_up(wait_until)
    actor = Restartable.options(max_restarts=1).remote(str(tmp_path))
    first = lightwork.get(actor.pid.remote(), timeout=20)
    os.kill(first, signal.SIGKILL)
    second = wait_until(lambda: _pid_or_none(actor), timeout=40, message="the restart")
    assert second != first
    assert attempts(str(tmp_path)) == [first, second]  # its constructor ran again
    os.kill(second, signal.SIGKILL)  # its one restart is used: this loss is final
    died = wait_until(lambda: _death_of(actor), timeout=40, message="the final death")
    assert "max_restarts" in str(died)
    assert len(attempts(str(tmp_path))) == 2
    [row] = [a for a in lightwork.state.list_actors() if a["actor_id"] == actor._ref.hex()]
    assert (row["state"], row["restarts"], row["max_restarts"]) == ("DEAD", 1, 1)


def test_an_actor_without_restarts_is_not_rebuilt_behind_our_back(backend, tmp_path):
    actor = Restartable.remote(str(tmp_path))
    pid = lightwork.get(actor.pid.remote(), timeout=20)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(actor.pid.remote(), timeout=40)
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(actor.pid.remote(), timeout=40)
    assert attempts(str(tmp_path)) == [pid]


@pytest.mark.parametrize("max_task_retries", [0, 1])
def test_a_call_in_flight_when_the_actor_dies(backend, tmp_path, wait_until,
                                              max_task_retries):
    """Ray's semantics: the call fails with ActorDiedError unless max_task_retries lets
    it run again on the restarted actor."""
    _both_slots_up(wait_until)
    since = time.time()
    actor = Restartable.options(max_restarts=1, max_task_retries=max_task_retries).remote(
        str(tmp_path))
    first = lightwork.get(actor.pid.remote(), timeout=20)
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    in_flight = actor.pid_after.remote(started, gate)
    wait_until(lambda: os.path.exists(started), timeout=20, message="the call to start")
    os.kill(first, signal.SIGKILL)
    open(gate, "w").close()
    if max_task_retries:
        second = lightwork.get(in_flight, timeout=40)
    else:
        with pytest.raises(exceptions.ActorDiedError, match="max_task_retries"):
            lightwork.get(in_flight, timeout=40)
        second = wait_until(lambda: _pid_or_none(actor), timeout=40, message="the restart")
    assert second != first
    assert attempts(str(tmp_path)) == [first, second]
    _check_the_restart_is_recorded(actor, first, second, max_task_retries, since)


def _check_the_restart_is_recorded(actor, first, second, max_task_retries, since):
    """list_actors, list_tasks and the timeline tell the restart as the embedded runtime
    does: no call of the actor is left live (those its lost worker answered included),
    the call in flight is FINISHED after an 'actor restarted' retry or FAILED with
    ActorDiedError, and the new incarnation's calls are on a row of its own process."""
    actor_hex = actor._ref.hex()
    [row] = [a for a in lightwork.state.list_actors() if a["actor_id"] == actor_hex]
    assert (row["state"], row["restarts"], row["pid"]) == ("ALIVE", 1, second)
    calls = [t for t in lightwork.state.list_tasks(limit=10_000)
             if t["name"].startswith("Restartable.") and t["submitted_at"] >= since]
    assert calls and all(t["state"] in ("FINISHED", "FAILED") for t in calls), calls
    [in_flight] = [t for t in calls if t["name"].endswith("pid_after")]
    events = lightwork.timeline()
    restarted = [e for e in events if e.get("ph") == "i"
                 and e["name"].startswith("actor restarted:")
                 and e["name"].endswith("pid_after")]
    if max_task_retries:
        assert in_flight["state"] == "FINISHED" and len(restarted) == 1
    else:
        assert in_flight["state"] == "FAILED" and "ActorDiedError" in in_flight["error"]
        assert not restarted
    labels = {e["pid"]: e["args"]["name"] for e in events
              if e.get("ph") == "M" and e["name"] == "process_name"}
    runs = sorted((e["ts"], e["pid"]) for e in events if e.get("ph") == "X"
                  and e["name"].endswith((".pid", ".pid_after")))
    assert f"pid {second}" in labels[runs[-1][1]]


@lightwork.remote
def call_through_a_restart(actor, directory, name):
    """Calls ``actor`` from a task (a borrowed handle), before and after its worker dies,
    at the test's signals (files in ``directory``)."""
    open(os.path.join(directory, f"{name}-running"), "w").close()
    wait_for_file(os.path.join(directory, "call"), 30)
    before = lightwork.get(actor.pid.remote(), timeout=20)
    open(os.path.join(directory, f"{name}-called"), "w").close()
    wait_for_file(os.path.join(directory, "call-again"), 30)
    return before, lightwork.get(actor.pid.remote(), timeout=50)


def test_a_handle_in_another_process_waits_for_the_restart(backend, tmp_path, wait_until):
    """A task holding the handle calls while the owner restarts the actor: the call
    waits for the restart and reaches the new actor, as the owner's own calls do. Two
    such tasks run at once, each holding a slot, so one runs on a worker the actor does
    not share (on distributed, the other may die with the actor's worker)."""
    _both_slots_up(wait_until)
    actor = Restartable.options(max_restarts=1).remote(str(tmp_path))
    first = lightwork.get(actor.pid.remote(), timeout=20)
    signals = tmp_path / "signals"
    signals.mkdir()
    holders = [call_through_a_restart.options(max_retries=0).remote(actor, str(signals), name)
               for name in ("a", "b")]

    def all_there(suffix):
        return all((signals / f"{name}-{suffix}").exists() for name in ("a", "b"))

    wait_until(lambda: all_there("running"), timeout=30, message="both tasks to run")
    open(signals / "call", "w").close()
    wait_until(lambda: all_there("called"), timeout=30, message="both tasks to call")
    os.kill(first, signal.SIGKILL)
    # Once the loss is known (a call sent before that would be in flight, and fail under
    # max_task_retries=0), they call at once: while the actor restarts.
    wait_until(lambda: _restarts_of(actor) == 1, timeout=30, message="the loss to be seen")
    open(signals / "call-again", "w").close()
    results = []
    for holder in holders:
        try:
            results.append(lightwork.get(holder, timeout=60))
        except exceptions.WorkerCrashedError:
            assert backend == "distributed"  # it ran on the actor's worker
    [_first, second] = attempts(str(tmp_path))
    assert results and all(r == (first, second) for r in results), results
    assert second != first


def _restarts_of(actor):
    [row] = [a for a in lightwork.state.list_actors() if a["actor_id"] == actor._ref.hex()]
    return row["restarts"]


@lightwork.remote
def pid_through(actor):
    return lightwork.get(actor.pid.remote(), timeout=30)


def test_a_handle_in_another_process_sees_a_killed_actor_dead(backend, tmp_path):
    """Killed, an actor with restarts left is dead for every handle, at once."""
    actor = Restartable.options(max_restarts=1).remote(str(tmp_path))
    assert lightwork.get(pid_through.remote(actor), timeout=30) == lightwork.get(
        actor.pid.remote(), timeout=20)
    lightwork.kill(actor)
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(pid_through.remote(actor), timeout=40)
    assert len(attempts(str(tmp_path))) == 1


def test_a_task_given_a_killed_actor_sees_it_dead(backend):
    """A process that first meets a handle after its actor was killed (no restarts) gets
    ActorDiedError, not a wait: on distributed the killed actor's key is forgotten, and a
    want of an unknown key is ignored, so the task's call waited out its own timeout
    (30 s here)."""
    actor = Pid.remote()
    lightwork.get(actor.pid.remote(), timeout=20)
    lightwork.kill(actor)
    with pytest.raises(exceptions.ActorDiedError, match="killed"):
        lightwork.get(pid_through.remote(actor), timeout=40)


@lightwork.remote
class GatedStart:
    """Its constructor waits for ``gate``."""

    def __init__(self, gate):
        wait_for_file(gate, 30)

    def answer(self):
        return 42


def test_calls_made_while_the_actor_is_built_finish_though_its_handle_is_dropped(
        backend, tmp_path):
    """Calls keep their actor: dropped at once, the handle's queued calls (its constructor
    still waits) run once it is up (on distributed they failed with "not known to this
    session")."""
    import gc

    gate = str(tmp_path / "gate")
    actor = GatedStart.remote(gate)
    refs = [actor.answer.remote() for _ in range(3)]
    del actor
    gc.collect()
    lightwork.get(add.remote(1, 1), timeout=20)  # a call into the runtime: drops apply
    open(gate, "w").close()
    assert lightwork.get(refs, timeout=30) == [42, 42, 42]


def test_a_named_actor_whose_handles_are_all_dropped_is_no_longer_found(backend, wait_until):
    """Not detached, a named actor ends with its last handle and its name goes (Ray's
    lifetime); on distributed its directory entry once kept it alive for the whole
    session."""
    import gc

    name = f"dropped-{uuid.uuid4().hex[:8]}"
    actor = Pid.options(name=name).remote()
    lightwork.get(actor.pid.remote(), timeout=20)
    assert lightwork.get(lightwork.get_actor(name).pid.remote(), timeout=20)
    del actor
    gc.collect()

    def gone():
        lightwork.get(add.remote(1, 1), timeout=20)  # a call into the runtime: drops apply
        try:
            lightwork.get_actor(name)
        except ValueError:
            return True
        return False

    wait_until(gone, timeout=20, message="the name of the dropped actor to go")


def _death_of(actor):
    """The ActorDiedError a call to ``actor`` raises, or None while it answers."""
    try:
        lightwork.get(actor.pid.remote(), timeout=20)
    except exceptions.ActorDiedError as died:
        return died
    return None


def _pid_or_none(actor):
    try:
        return lightwork.get(actor.pid.remote(), timeout=20)
    except exceptions.ActorDiedError:
        return None


def test_named_actors_get_actor_and_get_if_exists(backend):
    named = Counter.options(name="the-counter").remote()
    assert lightwork.get(named.incr.remote()) == 1
    found = lightwork.get_actor("the-counter")
    assert lightwork.get(found.incr.remote()) == 2
    same = Counter.options(name="the-counter", get_if_exists=True).remote()
    assert lightwork.get(same.incr.remote()) == 3
    with pytest.raises(ValueError, match="the-counter"):
        Counter.options(name="the-counter").remote()
    lightwork.kill(named)
    with pytest.raises(ValueError, match="no live actor"):
        lightwork.get_actor("the-counter")


def test_get_actor_of_an_unknown_name_says_so(backend):
    with pytest.raises(ValueError, match="no live actor named 'nobody'"):
        lightwork.get_actor("nobody")


@lightwork.remote
def use_counter(counter, times):
    return lightwork.get([counter.incr.remote() for _ in range(times)])[-1]


def test_actor_handle_passed_to_a_task(backend):
    counter = Counter.remote()
    assert lightwork.get(use_counter.remote(counter, 3), timeout=30) == 3
    assert lightwork.get(counter.incr.remote()) == 4


@lightwork.remote
class Gated:
    def value_after(self, gate):
        wait_for_file(gate, 30)
        return 41

    def error_after(self, gate):
        wait_for_file(gate, 30)
        raise ValueError("the actor call failed")


def test_a_pending_actor_result_passed_to_a_task(backend, tmp_path):
    """.remote() returns while the actor call still waits for its gate (on distributed the
    call's result reaches the task through a bridge key); its error fails the task."""
    import threading

    from tests.helpers import HANG_LIMIT_S

    gate = str(tmp_path / "gate")
    actor = Gated.remote()
    assert lightwork.get(actor.__ray_ready__.remote(), timeout=20) is True
    made = []
    submit = threading.Thread(target=lambda: made.append((
        add.remote(actor.value_after.remote(gate), 1),
        add.remote(actor.error_after.remote(gate), 1))))
    submit.start()
    submit.join(HANG_LIMIT_S)  # the gate is shut: a .remote() that waited would hang here
    assert made, ".remote() waited for the actor call it was given"
    open(gate, "w").close()
    value, failed = made[0]
    assert lightwork.get(value, timeout=30) == 42
    with pytest.raises(ValueError, match="the actor call failed"):
        lightwork.get(failed, timeout=30)


def test_an_actor_method_error_is_the_users_type(backend):
    counter = Counter.remote()
    with pytest.raises(AttributeError):
        lightwork.get(counter.missing.remote())


@lightwork.remote
def count_up(n):
    yield from range(n)


def test_generator_task_streams(backend):
    assert [lightwork.get(ref) for ref in count_up.remote(3)] == [0, 1, 2]


@lightwork.remote
def yield_then_wait(gate):
    yield "first"
    wait_for_file(gate, 30)
    yield "second"


def test_generator_items_come_as_they_are_yielded(backend, tmp_path):
    gate = str(tmp_path / "gate")
    stream = yield_then_wait.remote(gate)
    first = next(stream)  # the task is still running: it waits for the gate
    assert lightwork.get(first, timeout=20) == "first"
    assert not os.path.exists(gate)
    open(gate, "w").close()
    assert lightwork.get(next(stream), timeout=20) == "second"
    with pytest.raises(StopIteration):
        next(stream)


@lightwork.remote
def fail_after_two():
    yield 0
    yield 1
    raise ValueError("the third item failed")


def test_generator_error_mid_stream_comes_at_its_item(backend):
    stream = fail_after_two.remote()
    assert lightwork.get(next(stream), timeout=20) == 0
    assert lightwork.get(next(stream), timeout=20) == 1
    with pytest.raises(ValueError, match="the third item failed"):
        lightwork.get(next(stream), timeout=20)
    with pytest.raises(StopIteration):
        next(stream)


@lightwork.remote
def many_blocks(n):
    for index in range(n):
        yield bytes([index]) * 100_000


def test_a_generator_dropped_early_releases_its_items(backend, wait_until):
    before = _cluster_keys() if backend == "distributed" else set()
    stream = many_blocks.remote(5)
    assert lightwork.get(next(stream), timeout=20) == b"\x00" * 100_000
    del stream
    if backend == "distributed":  # its items' keys go once the task ends
        _wait_until_freed(wait_until, before, 20, "the unread items to be released on the cluster")


def _cluster_keys():
    """The keys the scheduler holds now (after the driver applied its refs' releases)."""
    backend = support.running_backend()
    backend._drain()  # releases apply at the next call into the backend: this is one
    return set(backend.client.run_on_scheduler(
        lambda dask_scheduler: list(dask_scheduler.tasks)))


def _wait_until_freed(wait_until, before, timeout, what):
    """Wait until the scheduler holds no key it did not hold ``before``; if it still does
    at the deadline, say which keys and who wants them (how a worker's late release was
    found: an inner key wanted by a ``Client-worker-…``; see
    test_a_ref_a_worker_drops_outside_any_call_frees_its_object)."""
    try:
        wait_until(lambda: _cluster_keys() <= before, timeout=timeout, message=what)
    except AssertionError as exc:
        left = sorted(map(str, _cluster_keys() - before))[:10]

        def describe(dask_scheduler, keys=tuple(left)):
            return {str(key): (task.state, sorted(str(c.client_key) for c in task.who_wants),
                               len(task.waiters or ()))
                    for key, task in dask_scheduler.tasks.items() if str(key) in keys}

        states = support.running_backend().client.run_on_scheduler(describe)
        raise AssertionError(f"{exc}; left (state, wanted by, waiters): {states}") from None


@lightwork.remote
def wrap_a_put(size):
    return [lightwork.put(b"i" * size)]


def test_refs_returned_inside_a_result_are_freed_with_it(backend, wait_until):
    before = _cluster_keys() if backend == "distributed" else set()
    outer = wrap_a_put.remote(100_000)
    [inner] = lightwork.get(outer, timeout=20)
    assert lightwork.get(inner, timeout=20) == b"i" * 100_000
    if backend == "distributed":
        assert len(_cluster_keys() - before) == 2  # the result and the object inside
    del outer, inner
    if backend == "distributed":
        _wait_until_freed(wait_until, before, 20,
                          "the object inside the result to be freed on the cluster")


@lightwork.remote
def put_inside_a_put(size):
    return lightwork.put([lightwork.put(b"p" * size)])


@lightwork.remote(num_returns=2)
def a_put_in_each_part(size):
    return [lightwork.put(b"a" * size)], [lightwork.put(b"b" * size)]


@lightwork.remote
class Wrapper:
    def wrap(self, size):
        return [lightwork.put(b"w" * size)]

    def wrap_after(self, gate, size):
        wait_for_file(gate, 30)
        return [lightwork.put(b"w" * size)]


@lightwork.remote
def sleep_until(path):
    return wait_for_file(path, 30)


@lightwork.remote
def size_inside(wrapped):
    [inner] = wrapped
    return len(lightwork.get(inner, timeout=20))


def test_refs_inside_a_pending_actor_result_passed_to_a_task_reach_it(backend, tmp_path):
    """The actor call is still running when its result is passed to a task (on
    distributed, through a bridge key); the task starts only after the driver has
    dropped every ref of its own to that result: the object inside lives until the task
    has it."""
    import gc

    gate, slots_free = str(tmp_path / "gate"), str(tmp_path / "free")
    wrapper = Wrapper.remote()
    assert lightwork.get(wrapper.__ray_ready__.remote(), timeout=20) is True
    blockers = [sleep_until.remote(slots_free) for _ in range(2)]  # both slots taken
    wrapped = wrapper.wrap_after.remote(gate, 50_000)
    size = size_inside.remote(wrapped)
    open(gate, "w").close()
    lightwork.wait([wrapped], timeout=20)
    del wrapped
    for _ in range(3):
        gc.collect()
        lightwork.get(lightwork.put(0))  # a call into the runtime applies releases
        time.sleep(0.3)  # (and they reach the scheduler)
    open(slots_free, "w").close()
    assert lightwork.get(size, timeout=30) == 50_000
    lightwork.get(blockers, timeout=20)



def test_refs_inside_puts_parts_and_actor_results_are_freed_with_them(backend, wait_until):
    """The objects inside a put value (from the driver or a task), inside one of several
    returns, and inside an actor call's result live as long as that outer object."""
    wrapper = Wrapper.remote()
    assert lightwork.get(wrapper.__ray_ready__.remote(), timeout=20) is True
    before = _cluster_keys() if backend == "distributed" else set()
    size = 100_000
    driver_put = lightwork.put([lightwork.put(b"d" * size)])
    task_put = lightwork.get(put_inside_a_put.remote(size), timeout=20)
    parts = a_put_in_each_part.remote(size)
    wrapped = wrapper.wrap.remote(size)
    time.sleep(0.5)  # the inner objects' makers have long dropped their own refs
    [d] = lightwork.get(driver_put)
    [p] = lightwork.get(task_put, timeout=20)
    [[a], [b]] = lightwork.get(parts, timeout=20)
    [w] = lightwork.get(wrapped, timeout=20)
    assert lightwork.get([d, p, a, b, w], timeout=20) == [
        b"d" * size, b"p" * size, b"a" * size, b"b" * size, b"w" * size]
    del driver_put, task_put, parts, wrapped, d, p, a, b, w
    if backend == "distributed":
        _wait_until_freed(wait_until, before, 30, "the objects inside to be freed on the cluster")


@lightwork.remote
def put_and_drop_it_later(gate, size):
    """Puts an object and leaves its only ref to a thread that drops it once ``gate``
    exists: after this task has ended, outside any call into the runtime."""
    holder = [lightwork.put(b"t" * size)]

    def drop():
        wait_for_file(gate, 30)
        holder.clear()

    threading.Thread(target=drop, daemon=True).start()
    return size


def test_a_ref_a_worker_drops_outside_any_call_frees_its_object(backend, wait_until, tmp_path):
    """A worker process may drop a ref while it makes no call into the runtime: in a
    thread of the user's, in the cycle collector, or (seen on distributed, the rare leak
    of the test above) when the worker's profiler lets go of a task's sampled frame. The
    object is freed then, not at that process's next call, which may never come."""
    before = _cluster_keys() if backend == "distributed" else set()
    gate = str(tmp_path / "gate")
    assert lightwork.get(put_and_drop_it_later.remote(gate, 100_000), timeout=20) == 100_000
    if backend == "distributed":  # held by the thread until the gate opens
        assert any(str(key).startswith("bytes-") for key in _cluster_keys() - before)
    open(gate, "w").close()
    if backend == "distributed":
        _wait_until_freed(wait_until, before, 20, "the object the thread dropped to be freed")


def test_a_ref_the_driver_drops_is_freed_without_another_call(backend, wait_until):
    """A program may drop a big object, then compute on its own or wait for input,
    making no call into the runtime for a long time: the object is freed meanwhile."""
    if backend == "distributed":
        client = support.running_backend().client

        def keys():  # the scheduler's keys, read without a call into the backend
            return {str(key) for key in client.run_on_scheduler(
                lambda dask_scheduler: list(dask_scheduler.tasks))}

        before = keys()
    ref = lightwork.put(b"x" * 200_000)
    object_id = ref.id
    if backend == "distributed":
        [made] = keys() - before
        assert made.startswith("bytes-")
        del ref
        wait_until(lambda: made not in keys(), timeout=20,
                   message="the dropped object freed in the cluster")
    else:
        node = support.driver_node()

        def freed():
            with node.lock:
                return object_id not in node.objects.entries

        del ref
        wait_until(freed, timeout=20, message="the dropped object freed")


@lightwork.remote(num_returns="dynamic")
def dynamic_count(n):
    yield from range(n)


def test_a_dynamic_generator_task(backend):
    items = lightwork.get(dynamic_count.remote(3), timeout=20)
    assert [lightwork.get(ref) for ref in items] == [0, 1, 2]


@lightwork.remote(num_returns="dynamic")
def dynamic_fail_at(count, fail_at):
    for index in range(count):
        if index == fail_at:
            raise ValueError(f"failed at item {index}")
        yield index


@lightwork.remote
class DynamicSource:
    @lightwork.method(num_returns="dynamic")
    def items(self, count, fail_at=None):
        for index in range(count):
            if index == fail_at:
                raise ValueError(f"failed at item {index}")
            yield -index


def test_a_dynamic_generator_error_mid_way_is_its_last_item(backend):
    """As in Ray: the items yielded before the error stay readable; the error is the
    last item. For a task and for an actor method alike."""
    source = DynamicSource.remote()
    for made, values in ((dynamic_fail_at.remote(4, 2), [0, 1]),
                         (source.items.remote(4, fail_at=1), [0])):
        refs = list(lightwork.get(made, timeout=20))
        assert len(refs) == len(values) + 1
        assert lightwork.get(refs[:-1], timeout=20) == values
        with pytest.raises(ValueError, match=f"failed at item {len(values)}"):
            lightwork.get(refs[-1], timeout=20)
    assert [lightwork.get(r) for r in lightwork.get(source.items.remote(2))] == [0, -1]


@lightwork.remote
class AsyncDynamicSource:
    @lightwork.method(num_returns="dynamic")
    async def items(self, count, fail_at=None):
        for index in range(count):
            if index == fail_at:
                raise ValueError(f"failed at item {index}")
            yield index * 10


@pytest.mark.lightwork_only  # Ray refuses an async generator with num_returns="dynamic"
def test_a_dynamic_async_generator_method(backend):
    source = AsyncDynamicSource.remote()
    refs = list(lightwork.get(source.items.remote(3, fail_at=2), timeout=20))
    assert lightwork.get(refs[:2], timeout=20) == [0, 10]
    with pytest.raises(ValueError, match="failed at item 2"):
        lightwork.get(refs[2], timeout=20)


def env_value(name):
    return os.environ.get(name)


def test_a_per_task_runtime_env(backend):
    """Locally the task sees its env vars; on distributed, where tasks share a worker
    process, the backend says it cannot keep them apart instead of leaking them."""
    task = lightwork.remote(env_value).options(
        runtime_env={"env_vars": {"LIGHTWORK_CONFORMANCE_ENV": "set"}})
    if backend == "local":
        assert lightwork.get(task.remote("LIGHTWORK_CONFORMANCE_ENV"), timeout=30) == "set"
        return
    with pytest.raises(exceptions.UnsupportedOnBackend, match="runtime_env.*distributed"):
        task.remote("LIGHTWORK_CONFORMANCE_ENV")


def pid_of_worker():
    return os.getpid()


def test_max_calls(backend):
    """Locally each worker process runs one call, then a fresh one takes its slot; on
    distributed, where a worker process runs every task it gets, the backend says so."""
    task = lightwork.remote(max_calls=1)(pid_of_worker)
    if backend == "local":
        pids = [lightwork.get(task.remote(), timeout=30) for _ in range(3)]
        assert len(set(pids)) == 3
        return
    with pytest.raises(exceptions.UnsupportedOnBackend, match="max_calls.*distributed"):
        task.remote()


@lightwork.remote
class EnvReader:
    def read(self, name):
        return os.environ.get(name)


def test_an_actors_runtime_env(backend):
    """Locally the actor has a process of its own and sees its env vars; on distributed it
    shares a worker process with tasks and other actors, so the backend refuses."""
    options = {"runtime_env": {"env_vars": {"LIGHTWORK_CONFORMANCE_ACTOR_ENV": "set"}}}
    if backend == "local":
        reader = EnvReader.options(**options).remote()
        assert lightwork.get(reader.read.remote("LIGHTWORK_CONFORMANCE_ACTOR_ENV"),
                             timeout=30) == "set"
        return
    with pytest.raises(exceptions.UnsupportedOnBackend, match="actor's runtime_env.*leak"):
        EnvReader.options(**options).remote()
    reader = EnvReader.remote()  # the worker's environment did not change
    assert lightwork.get(reader.read.remote("LIGHTWORK_CONFORMANCE_ACTOR_ENV")) is None


def inc(x):
    return x + 1


def test_dask_graphs_run_on_the_backend(backend):
    pytest.importorskip("dask")
    import lightwork.dask

    graph = {"a": 1, "b": (inc, "a"), "c": (inc, "b"), "d": (sum, ["b", "c"])}
    assert lightwork.dask.get(graph, "d") == 5


# ---- diagnostics ------------------------------------------------------------------------
def test_timeline_state_and_advisor_read_the_run(backend):
    from tests.diagnostics.test_timeline import check_trace

    refs = [add.remote(i) for i in range(4)]
    lightwork.get(refs)
    events = lightwork.timeline()
    check_trace(events)
    assert sum(1 for e in events if e.get("ph") == "X" and e["name"] == "add") >= 4
    summary = {s["name"]: s for s in lightwork.state.summarize_tasks()["functions"]}
    assert summary["add"]["count"] >= 4
    ids = {support.task_id_of(ref) for ref in refs}
    records = [r for r in lightwork.diagnostics.task_records() if r.task_id in ids]
    assert len(records) == 4 and all(r.state == "FINISHED" and r.worker_id > 0 for r in records)
    assert isinstance(lightwork.advise(print_report=False), list)
    assert "Thread MainThread" in str(lightwork.stack())


def test_state_listings_have_the_same_fields_on_both_backends(backend):
    from lightwork.kernel import views

    ref = lightwork.put(b"z" * 1000)
    lightwork.get(add.remote(1, 2))
    listings = {"actors": lightwork.state.list_actors, "workers": lightwork.state.list_workers,
                "objects": lightwork.state.list_objects}
    for kind, lister in listings.items():
        for row in lister():
            assert set(views.KEYS[kind]) <= set(row), (kind, row)
    workers = lightwork.state.list_workers()
    assert workers[0]["kind"] == "driver" and len(workers) >= 2
    assert ref.hex() in {o["object_id"] for o in lightwork.state.list_objects()}
    memory = lightwork.state.memory_summary()
    assert {"objects", "total_bytes", "by_owner", "by_reference_kind", "largest"} <= set(memory)
    status = lightwork.state.status()
    assert status["resources"]["total"]["CPU"] >= 1 and status["worker_count"] >= 1
