"""cancel() wins in every state of a task, with and without force.

Each test holds the task at one point with a gate the test controls, cancels it there,
and checks that ``get`` raises TaskCancelledError, that the task's body never ran (or was
interrupted), and that the worker pool still works. The points:

* queued: every slot is busy, the task waits in the driver's ready queue;
* dispatched: the task frame reached its worker, which has not started it (held by the
  runtime's test-only gate, ``LIGHTWORK_TEST_GATE_DIR``: this is the race that was lost);
* starting: the worker is loading its arguments (an argument that blocks in unpickling);
* running: the task's body is running;
* pipelined: the task is queued on a worker behind another (short) task.
"""

from __future__ import annotations

import os

import pytest
from tests.helpers import wait_for_file, wait_until
from tests import support

import lightwork as ray
from lightwork import exceptions as exc

pytestmark = pytest.mark.lightwork_only  # the gates are lightwork's own test hooks


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gates")
    if ray.is_initialized():
        ray.shutdown()
    os.environ["LIGHTWORK_TEST_GATE_DIR"] = str(directory)
    try:
        ray.init(num_cpus=2)
    finally:
        del os.environ["LIGHTWORK_TEST_GATE_DIR"]
    yield directory
    ray.shutdown()


def _node():

    return support.driver_node()


def _task_of(ref):
    node = _node()
    with node.lock:
        return node.tasks.get(node.objects.entries[ref.id].task_id)


def gated_task(name: str, result: str):
    """A task that marks that it ran, optionally says it entered and waits for its
    release gate, and returns ``result``.

    Each call makes a distinct remote function (its name is part of its pickled bytes,
    hence of its key), so each keeps its own mean run time: pipelining depends on it
    (``scheduler.pipeline_depth``).
    """

    def run(entered: str = "", release: str = "", ran: str = "") -> str:
        if ran:
            open(ran, "w").close()
        if entered:
            open(entered, "w").close()
        if release:
            wait_for_file(release, limit=30)
        return result

    run.__name__ = run.__qualname__ = name
    return ray.remote(run)


body = gated_task("body", "finished")


def _expect_cancelled(ref):
    with pytest.raises(exc.TaskCancelledError):
        ray.get(ref, timeout=15)


def _pool_still_works():
    assert ray.get([body.remote() for _ in range(4)], timeout=20) == ["finished"] * 4


def _fill_slots(tmp_path, n=2):
    """n tasks running and held; returns (refs, release path)."""
    release = str(tmp_path / "holders-release")
    refs = [body.remote(str(tmp_path / f"holder-{i}"), release) for i in range(n)]
    for i in range(n):
        assert wait_for_file(str(tmp_path / f"holder-{i}"), limit=20)
    return refs, release


@pytest.mark.parametrize("force", [False, True])
def test_cancel_while_queued_in_the_driver(gate_dir, tmp_path, force):
    holders, release = _fill_slots(tmp_path)
    ran = str(tmp_path / "ran")
    ref = body.remote(ran=ran)
    ray.cancel(ref, force=force)
    _expect_cancelled(ref)  # at once, while both slots are still held
    open(release, "w").close()
    assert ray.get(holders, timeout=20) == ["finished"] * 2  # force killed nobody else
    _pool_still_works()
    assert not os.path.exists(ran)


@pytest.mark.parametrize("force", [False, True])
def test_cancel_between_dispatch_and_start(gate_dir, tmp_path, force):
    name = f"held-dispatch-{force}"
    hold = gate_dir / f"dispatched-{name}.hold"
    reached = gate_dir / f"dispatched-{name}.reached"
    hold.touch()
    ran = str(tmp_path / "ran")
    ref = body.options(name=name).remote(ran=ran)
    assert wait_for_file(str(reached), limit=20)  # on its worker, not started
    ray.cancel(ref, force=force)
    if not force:
        # The worker has the task and the SIGINT found nothing running: the cancel must
        # still win when the task starts.
        task = _task_of(ref)
        assert task is not None and task.worker is not None
    hold.unlink()
    _expect_cancelled(ref)
    assert not os.path.exists(ran)
    _pool_still_works()


class _BlocksWhileLoading:
    """An argument whose unpickling in the worker waits at a gate (args loading)."""

    def __init__(self, entered: str, release: str):
        self.entered, self.release = entered, release

    def __reduce__(self):
        return (_load_slowly, (self.entered, self.release))


def _load_slowly(entered: str, release: str):
    if os.path.exists(entered):  # only the first load waits (a retry would not)
        return
    open(entered, "w").close()
    wait_for_file(release, limit=30)
    return


@pytest.mark.parametrize("force", [False, True])
def test_cancel_while_arguments_load(gate_dir, tmp_path, force):
    entered, release = str(tmp_path / "loading"), str(tmp_path / "release")
    ran = str(tmp_path / "ran")
    ref = _takes_arg.remote(_BlocksWhileLoading(entered, release), ran)
    assert wait_for_file(entered, limit=20)
    ray.cancel(ref, force=force)
    _expect_cancelled(ref)
    assert not os.path.exists(ran)
    open(release, "w").close()
    _pool_still_works()


@ray.remote
def _takes_arg(_value, ran: str):
    open(ran, "w").close()
    return "finished"


@pytest.mark.parametrize("force", [False, True])
def test_cancel_while_running(gate_dir, tmp_path, force):
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    ref = body.remote(entered, release)
    assert wait_for_file(entered, limit=20)
    ray.cancel(ref, force=force)
    _expect_cancelled(ref)
    open(release, "w").close()
    _pool_still_works()


quick = gated_task("quick", "quick")  # only ever run briefly, so it is pipelined


@pytest.mark.parametrize("force", [False, True])
def test_cancel_while_pipelined_behind_another_task(gate_dir, tmp_path, force):
    # quick's mean run time is far below a millisecond: it is queued behind running
    # quick tasks when every slot is busy.
    ray.get([quick.remote() for _ in range(50)], timeout=20)
    release = str(tmp_path / "release")
    heads = [quick.remote(str(tmp_path / f"head-{i}"), release) for i in range(2)]
    for i in range(2):
        assert wait_for_file(str(tmp_path / f"head-{i}"), limit=20)
    ran = str(tmp_path / "ran")
    ref = quick.remote(ran=ran)
    wait_until(lambda: (_task_of(ref) or 0) and _task_of(ref).worker is not None,
               timeout=10, message="the task to be queued on a busy worker")
    task = _task_of(ref)
    assert task.worker.inflight[0] is not task  # behind a running head
    ray.cancel(ref, force=force)
    _expect_cancelled(ref)  # at once: the heads still hold their workers
    open(release, "w").close()
    assert ray.get(heads, timeout=20) == ["quick", "quick"]  # force killed neither head
    assert not os.path.exists(ran)
    _pool_still_works()


def test_the_issue_scenario_cancel_right_after_a_slot_frees(gate_dir, tmp_path):
    # Two long tasks fill both slots; one finishes; a task that never ends is submitted
    # and cancelled at once: get must return (the cancel used to be lost in flight).
    release_one = str(tmp_path / "release-one")
    first = body.remote(str(tmp_path / "a"), release_one)
    second = body.remote(str(tmp_path / "b"), str(tmp_path / "release-two"))
    assert wait_for_file(str(tmp_path / "a"), limit=20)
    assert wait_for_file(str(tmp_path / "b"), limit=20)
    open(release_one, "w").close()
    assert ray.get(first, timeout=20) == "finished"
    for _ in range(20):
        forever = body.remote(release=str(tmp_path / "never"))
        ray.cancel(forever)
        _expect_cancelled(forever)
    open(tmp_path / "release-two", "w").close()
    assert ray.get(second, timeout=20) == "finished"


def test_a_task_that_raises_keyboard_interrupt_itself_is_an_error_not_a_cancel(gate_dir):
    @ray.remote(max_retries=0)
    def interrupts():
        raise KeyboardInterrupt("from the task")

    with pytest.raises((exc.TaskError, KeyboardInterrupt), match="from the task") as info:
        ray.get(interrupts.remote(), timeout=20)
    assert not isinstance(info.value, exc.TaskCancelledError)
    _pool_still_works()


@ray.remote
def returns_big_even_when_cancelled(entered: str, release: str):
    """Catches the cancel's KeyboardInterrupt and still returns 4 MB (a segment)."""
    open(entered, "w").close()
    try:
        wait_for_file(release, limit=30)
    except KeyboardInterrupt:
        pass
    return b"x" * (4 << 20)


def test_a_cancelled_task_that_catches_the_interrupt_and_returns_keeps_its_result(
        gate_dir, tmp_path):
    """The task catches the cancel's KeyboardInterrupt and returns a value too big to
    send inline: as in Ray, that value is the result (every get gives it: the task has
    ended, not stuck PENDING), and dropping the ref frees its segment."""
    entered = str(tmp_path / "entered")
    ref = returns_big_even_when_cancelled.remote(entered, str(tmp_path / "never"))
    assert wait_for_file(entered, limit=20)
    node = _node()
    segment = f"{node.session.shm_dir}/{ref.id:x}"  # where the worker writes the result
    ray.cancel(ref)
    assert ray.get(ref, timeout=20) == b"x" * (4 << 20)
    assert len(ray.get(ref, timeout=20)) == 4 << 20
    assert _task_of(ref) is None
    del ref
    wait_until(lambda: segment not in node.store.live, timeout=20,
               message="the dropped result's segment to be released")
    _pool_still_works()


@ray.remote
def reports_cancel(entered: str, release: str) -> str:
    open(entered, "w").close()
    try:
        wait_for_file(release, limit=30)
    except KeyboardInterrupt:
        return f"interrupted, is_canceled={ray.get_runtime_context().is_canceled()}"
    return "not interrupted"


def test_a_task_that_catches_the_cancel_sees_is_canceled_and_its_return_is_the_result(
        gate_dir, tmp_path):
    entered = str(tmp_path / "entered")
    ref = reports_cancel.remote(entered, str(tmp_path / "never"))
    assert wait_for_file(entered, limit=20)
    ray.cancel(ref)
    assert ray.get(ref, timeout=20) == "interrupted, is_canceled=True"
    _pool_still_works()


def test_a_task_that_lets_the_cancel_through_is_still_cancelled(gate_dir, tmp_path):
    entered = str(tmp_path / "entered")
    ref = body.remote(entered=entered, release=str(tmp_path / "never"))
    assert wait_for_file(entered, limit=20)
    ray.cancel(ref)
    _expect_cancelled(ref)
    _pool_still_works()


@ray.remote
class _Marks:
    def mark(self, path):
        open(path, "w").close()
        return "ran"

    async def mark_async(self, path):
        open(path, "w").close()
        return "ran"


@pytest.mark.parametrize("method", ["mark", "mark_async"])
def test_cancel_an_actor_call_between_dispatch_and_start(gate_dir, tmp_path, method):
    """The call reached the actor's process, which has not started it: the SIGINT finds
    nothing running, and the cancel must still win when the call starts."""
    actor = _Marks.remote()
    assert ray.get(actor.__ray_ready__.remote(), timeout=20)
    name = f"_Marks.{method}"
    hold = gate_dir / f"dispatched-{name}.hold"
    reached = gate_dir / f"dispatched-{name}.reached"
    hold.touch()
    ran = str(tmp_path / "ran")
    ref = getattr(actor, method).remote(ran)
    assert wait_for_file(str(reached), limit=20)
    ray.cancel(ref)
    hold.unlink()
    _expect_cancelled(ref)
    assert not os.path.exists(ran)
    assert ray.get(getattr(actor, method).remote(str(tmp_path / "after")), timeout=20) == "ran"


@ray.remote(max_concurrency=2)
class _ThreadedMarks:
    def mark(self, path):
        open(path, "w").close()
        return "ran"


@pytest.mark.parametrize("actor_class, method", [(_ThreadedMarks, "mark"), (_Marks, "mark_async")],
                         ids=["threaded", "async"])
def test_a_pool_thread_finds_the_cancel_before_the_main_thread_handles_the_signal(
        gate_dir, tmp_path, actor_class, method):
    """Threaded and async actors start calls on pool threads, while the SIGINT handler
    runs on the main thread once it gets the GIL: on a loaded host the pool thread could
    start a cancelled call first (it failed that way). A gate holds the handler here, so
    the call must be found cancelled without it."""
    actor = actor_class.remote()
    call = getattr(actor, method)
    # One call first: a new worker reads its cancel file at its first start check anyway.
    assert ray.get(call.remote(str(tmp_path / "first")), timeout=20) == "ran"
    name = f"{actor_class.__name__}.{method}"
    dispatched = gate_dir / f"dispatched-{name}.hold"
    dispatched_reached = gate_dir / f"dispatched-{name}.reached"
    handler, handler_reached = gate_dir / "sigint-handler.hold", gate_dir / "sigint-handler.reached"
    for stale in (dispatched_reached, handler_reached):  # left by earlier tests' gates
        stale.unlink(missing_ok=True)
    dispatched.touch()
    handler.touch()
    try:
        ran = str(tmp_path / "ran")
        ref = call.remote(ran)
        assert wait_for_file(str(dispatched_reached), limit=20)
        ray.cancel(ref)
        assert wait_for_file(str(handler_reached), limit=20)  # signalled, flag not yet up
        dispatched.unlink()
        _expect_cancelled(ref)
        assert not os.path.exists(ran)
    finally:
        dispatched.unlink(missing_ok=True)
        handler.unlink()
    assert ray.get(call.remote(str(tmp_path / "after")), timeout=20) == "ran"


def test_a_cancelled_actor_call_that_returns_a_big_result_releases_it(gate_dir, tmp_path):
    @ray.remote
    class Big:
        def big(self, entered, release):
            open(entered, "w").close()
            wait_for_file(release, limit=30)
            return b"x" * (4 << 20)

    actor = Big.remote()
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    ref = actor.big.remote(entered, release)
    assert wait_for_file(entered, limit=20)
    node = _node()
    segment = f"{node.session.shm_dir}/{ref.id:x}"
    ray.cancel(ref)
    open(release, "w").close()
    _expect_cancelled(ref)
    _expect_cancelled(ref)
    with node.lock:
        pooled = {s.path for s in node.store.free}
    assert segment not in node.store.live
    assert not os.path.exists(segment) or segment in pooled


def test_a_task_interrupted_by_cancel_fails_as_a_task_error_too(gate_dir, tmp_path):
    """As Ray's is a RayTaskError(TaskCancelledError): ``except TaskError`` catches a task
    the cancel interrupted; a task cancelled before it ran is only a TaskCancelledError."""
    entered = str(tmp_path / "entered")
    running = body.remote(entered=entered, release=str(tmp_path / "never"))
    assert wait_for_file(entered, limit=20)
    ray.cancel(running)
    with pytest.raises(exc.TaskError, match="TaskCancelledError: .*while it ran") as info:
        ray.get(running, timeout=20)
    assert isinstance(info.value, exc.TaskCancelledError)

    @ray.remote
    def never_runs(_dependency):
        return "ran"

    blocker = body.remote(release=str(tmp_path / "never-either"))
    waiting = never_runs.remote(blocker)  # waits for its argument: not started
    ray.cancel(waiting)
    with pytest.raises(exc.TaskCancelledError) as info:
        ray.get(waiting, timeout=20)
    assert not isinstance(info.value, exc.TaskError)
    ray.cancel(blocker)
    _pool_still_works()
