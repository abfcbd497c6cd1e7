"""What the runtime keeps out of CPython's cyclic collector, and that nothing leaks for it
(``kernel/collector.py``).

With ``lightwork._collector`` built (``make`` builds it), a new task's ref, spec and table
entry leave the collector; without it (``LIGHTWORK_PURE_PYTHON=1``, which ``make test``
also runs this file under) they stay in it. Either way an untracked object must never
sit in a cycle that becomes garbage: the tests below build the cycles the module
docstring names (a spec and its worker's slot, an entry and an error's traceback) and
check that what they reach is freed.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
import textwrap
import weakref

import pytest
from tests.helpers import run_script, wait_for_file, write_script

import lightwork as ray
from tests.support import driver_node
from lightwork.kernel import collector
from lightwork.kernel.events import TaskRecord
# The collector's clients: the local engine's records it keeps out of the cyclic GC.
from lightwork.engines.local.objects import ObjectEntry, ObjectTable
from lightwork.engines.local.scheduler import TaskSpec

pytestmark = pytest.mark.lightwork_only  # the runtime's own objects

FORCED_PURE = bool(os.environ.get("LIGHTWORK_PURE_PYTHON"))


def test_the_compiled_module_is_used_unless_the_fallback_is_forced():
    # make builds it; a missing compiler would show here, not as a slow runtime.
    assert collector.COMPILED is not FORCED_PURE
    assert (collector.untrack_hot is None) is FORCED_PURE


def test_a_new_tasks_ref_spec_and_entry_leave_the_collector_with_the_compiled_module(
        fresh_runtime, tmp_path):
    fresh_runtime.init(num_cpus=1)
    gate = str(tmp_path / "gate")
    ref = gated.remote(gate)
    node = driver_node()
    with node.lock:
        entry = node.objects.entries[ref.id]
        spec = node.tasks[entry.task_id]
        tracked = [gc.is_tracked(obj) for obj in (ref, spec, entry)]
        record_tracked = gc.is_tracked(spec.record)
    assert tracked == [FORCED_PURE] * 3
    assert not record_tracked  # records leave it either way (ctypes without the module)
    open(gate, "w").close()
    assert ray.get(ref, timeout=20) == "opened"
    # A ref made any other way (here: unpickled, a borrowed copy) stays tracked.
    import pickle

    assert gc.is_tracked(pickle.loads(pickle.dumps(ref)))


def test_an_actor_calls_spec_leaves_the_collector_as_well(fresh_runtime, tmp_path):
    fresh_runtime.init(num_cpus=1)
    holder = Holder.remote()
    gate = str(tmp_path / "gate")
    ref = holder.hold.remote(gate)
    node = driver_node()
    with node.lock:
        spec = node.tasks[node.objects.entries[ref.id].task_id]
        assert spec.actor_id and gc.is_tracked(spec) is FORCED_PURE
    open(gate, "w").close()
    assert ray.get(ref, timeout=20) == "opened"


def test_an_entry_that_takes_an_error_returns_to_the_collector_and_its_cycle_is_freed():
    # An error's traceback holds the frames it passed through, and a frame may hold the
    # entry: entry -> error -> traceback -> frame -> entry. Left untracked, the entry
    # would keep that cycle alive for ever.
    class Boom(Exception):
        pass

    table = ObjectTable()
    entry = table.create(7, 0)
    assert gc.is_tracked(entry) is FORCED_PURE

    def fail(entry):
        try:
            raise Boom("no")
        except Boom as error:
            table.resolve(entry, None, error)  # this frame holds entry: the cycle
            return weakref.ref(error)

    error_alive = fail(entry)
    assert gc.is_tracked(entry)
    del table.entries[7], entry
    gc.collect()
    assert error_alive() is None


def test_shutdown_empties_the_workers_queues_so_the_specs_in_them_are_freed(tmp_path):
    # A running spec and its worker's slot are a cycle (spec.worker -> slot -> inflight
    # -> spec) that the collector cannot see with the spec untracked: shutdown breaks it.
    # What the spec holds (here the retry_exceptions classes) must then be freed.
    script = write_script(str(tmp_path), "driver.py", textwrap.dedent(f"""
        import gc, os, weakref
        import lightwork
        from tests import support

        def make(gate):
            class Flaky(Exception):
                pass

            @lightwork.remote(retry_exceptions=[Flaky], max_retries=1)
            def hold(gate):
                import time
                while not os.path.exists(gate):
                    time.sleep(0.01)
                return 1

            return hold, weakref.ref(Flaky)

        lightwork.init(num_cpus=1)
        hold, flaky = make({str(tmp_path / "gate")!r})
        refs = [hold.remote({str(tmp_path / "gate")!r}) for _ in range(3)]
        node = support.driver_node()
        while True:
            with node.lock:
                slots = list(node.scheduler.workers.values())
                if any(slot.inflight for slot in slots):
                    break
        lightwork.shutdown()
        assert all(not slot.inflight for slot in slots), "a queue kept its specs"
        del hold, refs, node, slots
        gc.collect()
        gc.collect()
        print("freed" if flaky() is None else "leaked")
    """))
    result = run_script(script, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("freed")


def test_a_spec_leaves_its_workers_slot_when_it_ends(fresh_runtime):
    fresh_runtime.init(num_cpus=1)
    ref = quick.remote(3)
    node = driver_node()
    with node.lock:
        spec = node.tasks[node.objects.entries[ref.id].task_id]
    assert ray.get(ref, timeout=20) == 4
    assert spec.worker is None  # no spec -> slot reference once out of the queue


def test_the_fallback_runs_a_batch_with_everything_in_the_collector(tmp_path):
    script = write_script(str(tmp_path), "driver.py", textwrap.dedent("""
        import gc
        import lightwork
        from lightwork.kernel import collector

        @lightwork.remote
        def double(x):
            return 2 * x

        assert not collector.COMPILED and collector.untrack_hot is None
        lightwork.init(num_cpus=2)
        refs = [double.remote(i) for i in range(2_000)]
        assert all(gc.is_tracked(ref) for ref in refs)
        assert lightwork.get(refs) == [2 * i for i in range(2_000)]
        lightwork.shutdown()
        print("ok")
    """))
    result = run_script(script, timeout=60, env={"LIGHTWORK_PURE_PYTHON": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


# --- maker: the hot path's records, specs and entries --------------------------------


@pytest.mark.parametrize("values", [
    (7, "f", 0, 1.5),  # the required fields only
    (7, "f", 0, 1.5, 1.5, 120, ("a.py", 3, "main"), 0.5),  # as submit_task passes them
    tuple(range(len(dataclasses.fields(TaskRecord)))),  # every field
])
def test_a_made_record_equals_the_one_its_class_makes(values):
    made = collector.maker(TaskRecord, collector.keep_out_of_collector)(*values)
    assert type(made) is TaskRecord
    assert made == TaskRecord(*values)
    assert not gc.is_tracked(made) or FORCED_PURE and collector.keep_out_of_collector is \
        collector._nothing  # out of the collector, unless nothing here can untrack


def test_a_made_spec_and_entry_equal_their_classes_and_are_untracked_where_that_pays():
    record = TaskRecord(1, "f", 0, 1.0)
    spec_values = (1, b"key", "f", None, (), (2,), 1, (), 0, False, 0, record, 0, 0, True)
    spec = collector.maker(TaskSpec, collector.untrack_hot)(*spec_values)
    entry = collector.maker(ObjectEntry, collector.untrack_hot)(2, 0, 1, 1.0, 0, None, None, True)
    assert dataclasses.astuple(spec) == dataclasses.astuple(TaskSpec(*spec_values))
    assert entry == ObjectEntry(2, 0, 1, 1.0, 0, None, None, True)
    assert [gc.is_tracked(spec), gc.is_tracked(entry)] == [FORCED_PURE] * 2
    # Without an untrack, a made object stays in the collector.
    assert gc.is_tracked(collector.maker(ObjectEntry, None)(3, 0))


def test_a_maker_refuses_a_wrong_count_or_keywords_with_the_class_named():
    make = collector.maker(ObjectEntry, collector.untrack_hot)
    named = "ObjectEntry" if collector.COMPILED else ""  # the fallback is the class itself
    with pytest.raises(TypeError, match=named):
        make(1)  # owner is required too
    with pytest.raises(TypeError, match=named):
        make(*range(len(dataclasses.fields(ObjectEntry)) + 1))
    if collector.COMPILED:  # (the class itself takes keywords, as a dataclass does)
        with pytest.raises(TypeError, match="by position only"):
            make(1, 0, task_id=3)


def test_a_maker_refuses_a_class_it_cannot_make_faithfully():
    @dataclasses.dataclass(slots=True)
    class WithFactory:
        items: list = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match="WithFactory.items has no plain default"):
        collector.maker(WithFactory, None)


@pytest.mark.skipif(FORCED_PURE, reason="the compiled Maker's own checks")
def test_the_compiled_maker_refuses_names_that_are_not_the_classes_slots():
    from lightwork._collector import Maker

    class Plain:  # attributes in a __dict__, no slots
        pass

    with pytest.raises(TypeError, match="not a slot of"):
        Maker(Plain, ("x",), (None,), 0, False)
    with pytest.raises(TypeError, match="not a slot of"):
        Maker(ObjectEntry, ("held",), (None,), 0, False)  # a method, not a slot
    with pytest.raises(ValueError, match="one default per name"):
        Maker(ObjectEntry, ("object_id",), (), 0, False)


def test_made_objects_free_what_they_hold_and_keep_no_extra_reference_to_defaults():
    make = collector.maker(ObjectEntry, collector.untrack_hot)

    class Value:
        pass

    value = Value()
    held = weakref.ref(value)
    entry = make(1, 0, 0, 0.0, 0, value)
    del value
    assert held() is not None
    del entry  # untracked: reference counting alone must free it and what it holds
    assert held() is None
    make_record = collector.maker(TaskRecord, collector.keep_out_of_collector)
    default = TaskRecord(1, "f", 0, 0.0).state  # a string every new record shares
    before = sys.getrefcount(default)
    made = [make_record(i, "f", 0, 0.0) for i in range(1_000)]
    assert sys.getrefcount(default) == before + 1_000
    del made
    assert sys.getrefcount(default) == before


@ray.remote
def gated(gate):
    wait_for_file(gate, limit=30)
    return "opened"


@ray.remote
def quick(x):
    return x + 1


@ray.remote
class Holder:
    def hold(self, gate):
        wait_for_file(gate, limit=30)
        return "opened"


def test_dropping_the_drivers_refs_frees_only_what_nothing_else_holds():
    # ObjectTable.release_driver_holds, the ref drain's pass over the ids the driver let
    # go of: bare values and empty entries go at once; a holder, a ref made again, a
    # segment's value and an actor handle each take their own way.
    from lightwork.kernel.serialization import Stored

    released: list[str] = []
    freed_actors: list[int] = []
    table = ObjectTable(release_segment=released.append)
    table.on_actor_freed = freed_actors.append
    bare, empty, worker_held, again, segment, handle = (
        table.create(object_id, 0, object_id) for object_id in range(1, 7))
    table.resolve(bare, b"value")
    worker_held.add_holder(3)
    table.resolve(segment, Stored(b"", (), "/segment", 10))
    table.actor_handles.add(6)
    table.release_driver_holds([1, 2, 3, 4, 5, 6, 99], still_held=lambda object_id: object_id == 4)
    assert sorted(table.entries) == [3, 4]
    assert table.freed_count == 4
    assert not worker_held.driver_holds and again.driver_holds  # (a ref to 4 lives again)
    assert released == ["/segment"] and freed_actors == [6]
    assert table.bytes_in_segments == 0
