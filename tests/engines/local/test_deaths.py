"""Objects outlive the process that made them; lost task results are rebuilt (lineage).

A dead worker's objects are adopted by the driver: their bytes are in the
driver's table or in /dev/shm, so they stay readable. A value is really lost only when
its segment file vanishes; the tests remove the file by hand to make that happen, then
check what is rebuilt (task results, by re-running the task within max_retries) and what
raises (puts, actor results, tasks that may not be re-run), and with which message.
"""

from __future__ import annotations

import os
import signal

import pytest
from tests.helpers import attempts, count_attempt, still_running, wait_until
from tests import support

import lightwork as ray
import lightwork.exceptions as exc

pytestmark = [pytest.mark.usefixtures("ray_start"), pytest.mark.lightwork_only]

BIG = 400_000  # bytes: over the shared-memory threshold, so the value is a segment file


def segment_of(ref: ray.ObjectRef) -> str:
    path = support.object_entry(ref).stored.path
    assert path is not None, "the value was inlined; make it bigger"
    return path


def entry_of(ref: ray.ObjectRef):
    return support.object_entry(ref)


def segment_freed(path: str) -> bool:
    """The store no longer counts ``path`` as a live value (it unlinked or pooled it)."""
    return path not in support.store().live


def worker_gone(pid: int) -> bool:
    return pid not in support.worker_pids()


@ray.remote
def put_in_worker(size: int):
    return os.getpid(), [ray.put(b"w" * size)]


@ray.remote
def make_bytes(directory: str, fill: bytes) -> bytes:
    count_attempt(directory)
    return fill * BIG


@ray.remote
def first_byte_and_length(directory: str, data: bytes) -> tuple[bytes, int]:
    count_attempt(directory)
    return data[:1] * BIG, len(data)


@ray.remote
class Holder:
    def pid(self) -> int:
        return os.getpid()

    def put_something(self) -> list:
        return [ray.put(b"a" * BIG)]

    def big(self) -> bytes:
        return b"r" * BIG


# ---- adoption ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [100, BIG], ids=["inline", "segment"])
def test_put_by_a_worker_that_died_stays_readable_and_is_adopted(size):
    pid, [ref] = ray.get(put_in_worker.remote(size), timeout=20)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: worker_gone(pid), timeout=5, message="the runtime to see the death")
    assert entry_of(ref).owner == 0
    assert entry_of(ref).orphaned_by != 0
    assert ray.get(ref, timeout=10) == b"w" * size


def test_put_by_a_dead_actor_stays_readable():
    holder = Holder.remote()
    pid = ray.get(holder.pid.remote())
    [ref] = ray.get(holder.put_something.remote())
    ray.kill(holder)
    wait_until(lambda: not still_running([pid]) and worker_gone(pid), timeout=5,
               message="the actor to die")
    assert ray.get(ref, timeout=5) == b"a" * BIG


def test_pending_result_of_a_task_submitted_by_a_dead_worker_still_arrives(tmp_path):
    gate = str(tmp_path / "go")

    @ray.remote
    def child() -> str:
        import time as t

        while not os.path.exists(gate):
            t.sleep(0.01)
        return "child done"

    @ray.remote
    def parent():
        return os.getpid(), [child.remote()]

    pid, [ref] = ray.get(parent.remote(), timeout=20)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: worker_gone(pid), timeout=5, message="the runtime to see the death")
    open(gate, "w").close()
    assert ray.get(ref, timeout=20) == "child done"


def test_adopted_object_is_freed_when_the_last_ref_goes():
    pid, [ref] = ray.get(put_in_worker.remote(BIG), timeout=20)
    path = segment_of(ref)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: worker_gone(pid), timeout=5, message="the runtime to see the death")
    object_id = ref.id
    del ref
    wait_until(lambda: object_id not in support.object_ids() and segment_freed(path),
               timeout=5, message="the adopted object to be freed")


# ---- what really cannot be recovered ------------------------------------------------


def test_lost_put_of_a_dead_worker_raises_owner_died():
    pid, [ref] = ray.get(put_in_worker.remote(BIG), timeout=20)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: worker_gone(pid), timeout=5, message="the runtime to see the death")
    os.unlink(segment_of(ref))
    with pytest.raises(exc.OwnerDiedError, match=r"vanished.*had died") as info:
        ray.get(ref, timeout=10)
    assert isinstance(info.value, exc.ObjectLostError)
    with pytest.raises(exc.OwnerDiedError):  # and it keeps saying so
        ray.get(ref, timeout=10)


def test_lost_put_of_the_driver_raises_object_lost():
    ref = ray.put(b"d" * BIG)
    os.unlink(segment_of(ref))
    with pytest.raises(exc.ObjectLostError, match="put") as info:
        ray.get(ref, timeout=10)
    assert not isinstance(info.value, exc.OwnerDiedError)


def test_lost_actor_result_is_not_rebuilt():
    holder = Holder.remote()
    ref = holder.big.remote()
    ray.wait([ref], timeout=20)
    os.unlink(segment_of(ref))
    with pytest.raises(exc.ObjectReconstructionFailedError, match="actor call"):
        ray.get(ref, timeout=10)
    ray.kill(holder)


# ---- lineage reconstruction ----------------------------------------------------------


def test_lost_task_result_is_rebuilt_by_rerunning_its_task(tmp_path):
    ref = make_bytes.options(max_retries=2).remote(str(tmp_path), b"x")
    ray.wait([ref], timeout=20)
    os.unlink(segment_of(ref))
    assert ray.get(ref, timeout=20) == b"x" * BIG
    assert len(attempts(str(tmp_path))) == 2
    # The rebuilt value is a new segment, freed like any other.
    path = segment_of(ref)
    del ref
    wait_until(lambda: ray.get([]) == [] and segment_freed(path), timeout=5,
               message="the rebuilt value to be freed")


def test_rebuilding_counts_against_max_retries(tmp_path):
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    os.mkdir(first), os.mkdir(second)
    ref = make_bytes.options(max_retries=1).remote(first, b"x")
    ray.wait([ref], timeout=20)
    # Read by tasks only: a value the driver has mapped stays readable here anyway.
    os.unlink(segment_of(ref))
    assert ray.get(first_byte_and_length.remote(second, ref), timeout=20) == (b"x" * BIG, BIG)
    os.unlink(segment_of(ref))
    with pytest.raises(exc.ObjectReconstructionFailedError, match="max_retries=1"):
        ray.get(first_byte_and_length.remote(second, ref), timeout=20)
    assert len(attempts(first)) == 2


def test_value_the_driver_has_mapped_survives_its_file(tmp_path):
    ref = make_bytes.remote(str(tmp_path), b"m")
    value = ray.get(ref, timeout=20)  # held: the driver keeps the segment mapped
    os.unlink(segment_of(ref))
    assert ray.get(ref, timeout=20) == value == b"m" * BIG
    assert len(attempts(str(tmp_path))) == 1


def test_lost_segment_is_never_recycled_for_a_new_value(tmp_path):
    ref = make_bytes.options(max_retries=2).remote(str(tmp_path), b"z")
    ray.wait([ref], timeout=20)
    lost = segment_of(ref)
    os.unlink(lost)
    assert ray.get(ref, timeout=20) == b"z" * BIG
    assert all(segment.path != lost for segment in support.store().free)
    assert ray.get(ray.put(b"p" * BIG), timeout=10) == b"p" * BIG


def test_task_with_max_retries_zero_is_not_rebuilt(tmp_path):
    ref = make_bytes.options(max_retries=0).remote(str(tmp_path), b"x")
    ray.wait([ref], timeout=20)
    os.unlink(segment_of(ref))
    with pytest.raises(exc.ObjectReconstructionFailedError, match="cannot be re-run"):
        ray.get(ref, timeout=10)
    assert len(attempts(str(tmp_path))) == 1


def test_lost_results_are_rebuilt_recursively(tmp_path):
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    os.mkdir(first), os.mkdir(second)
    a = make_bytes.remote(first, b"a")
    b = first_byte_and_length.remote(second, a)
    ray.wait([b], timeout=20)
    os.unlink(segment_of(a))
    os.unlink(segment_of(b))
    assert ray.get(b, timeout=20) == (b"a" * BIG, BIG)
    assert len(attempts(first)) == 2 and len(attempts(second)) == 2


def test_argument_lost_before_a_task_reads_it_is_rebuilt_first(tmp_path):
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    os.mkdir(first), os.mkdir(second)
    a = make_bytes.remote(first, b"q")
    ray.wait([a], timeout=20)
    os.unlink(segment_of(a))
    assert ray.get(first_byte_and_length.remote(second, a), timeout=20) == (b"q" * BIG, BIG)
    assert len(attempts(first)) == 2 and len(attempts(second)) == 1


def test_value_lost_before_a_nested_get_is_rebuilt(tmp_path):
    @ray.remote
    def read_inside(refs: list) -> int:
        return len(ray.get(refs[0]))

    a = make_bytes.remote(str(tmp_path), b"n")
    ray.wait([a], timeout=20)
    os.unlink(segment_of(a))
    assert ray.get(read_inside.remote([a]), timeout=20) == BIG
    assert len(attempts(str(tmp_path))) == 2


def test_result_whose_argument_was_freed_cannot_be_rebuilt(tmp_path):
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    os.mkdir(first), os.mkdir(second)
    b = first_byte_and_length.remote(second, make_bytes.remote(first, b"f"))
    ray.wait([b], timeout=20)
    os.unlink(segment_of(b))
    with pytest.raises(exc.ObjectReconstructionFailedError, match="was freed"):
        ray.get(b, timeout=10)


def test_retry_after_a_crash_that_left_a_result_segment_behind(tmp_path):
    """The worker wrote its result's segment, then died before reporting it: the retry
    writes the same path again (regression: O_EXCL made the retry fail)."""

    @ray.remote(max_retries=1)
    def write_then_die(directory: str) -> bytes:
        if count_attempt(directory) == 0:
            # What the worker does on return, done early, then a crash before the DONE.
            from lightwork.kernel import serialization

            worker = support.current_worker()
            return_id = worker.current[5][0]
            serialization.serialize(b"old" * BIG, f"{worker.shm_dir}/{return_id:x}")
            os.kill(os.getpid(), signal.SIGKILL)
        return b"new" * BIG

    assert ray.get(write_then_die.remote(str(tmp_path)), timeout=20) == b"new" * BIG
    assert len(attempts(str(tmp_path))) == 2


# ---- regressions found by the chaos suite ----------------------------------------------


def test_failed_object_is_freed_after_its_error_was_raised():
    """Raising the table's own exception object hung the get's frames, and the ref in
    them, on its traceback: the failed object was never freed."""

    @ray.remote(max_retries=0)
    def crash() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    ref = crash.remote()
    object_id = ref.id
    with pytest.raises(exc.WorkerCrashedError):
        ray.get(ref, timeout=20)
    with pytest.raises(exc.WorkerCrashedError):  # raised again, as a fresh copy
        ray.get(ref, timeout=20)
    del ref
    import gc

    gc.collect()
    wait_until(lambda: ray.get([]) == [] and object_id not in support.object_ids(),
               timeout=5, message="the failed object to be freed")


def test_result_of_a_quick_call_arrives_while_the_next_call_blocks(tmp_path):
    """Workers hold tiny tasks' results back to send them in batches; a result held while
    the next call ran forever never arrived (found by the actor backpressure test)."""
    gate = str(tmp_path / "gate")

    @ray.remote
    class Worker:
        def quick(self) -> str:
            return "quick"

        def block(self) -> str:
            import time as t

            while not os.path.exists(gate):
                t.sleep(0.005)
            return "unblocked"

    # Both calls queue before the actor has started, so they reach it in one batch: the
    # second is already waiting in the worker when the first finishes.
    actor = Worker.remote()
    quick, blocked = actor.quick.remote(), actor.block.remote()
    assert ray.get(quick, timeout=10) == "quick"
    open(gate, "w").close()
    assert ray.get(blocked, timeout=10) == "unblocked"
    ray.kill(actor)
