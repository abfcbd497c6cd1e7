"""The advisor's findings for Ray's catalogue of anti-patterns, and stuck calls.

Each test runs the mistake (Ray's own doc program where it has one) and checks the
finding: kind, the user's line, the evidence and the cost; then the fixed program, which
must draw nothing of that kind. ``test_advisor_corpus.py`` runs more correct programs.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import warnings

import numpy as np
import pytest

import lightwork
from lightwork.diagnostics.advisor import AdviceWarning, Advisor, analyse, report
from lightwork.kernel.events import DriverSpan
from tests.diagnostics.conftest import CPUS

pytestmark = pytest.mark.lightwork_only




def findings_of(kind):
    return [f for f in lightwork.advise(print_report=False) if f.kind == kind]


def _line_of(text):
    with open(__file__) as source:
        return next(number for number, line in enumerate(source, 1) if text in line)


@lightwork.remote
def no_op(i):
    return i


@lightwork.remote
def first_item(value):
    time.sleep(0.3)  # still running when the next calls are submitted
    return float(value[0][0] if isinstance(value, tuple) else value[0])


# -- get in a loop: Ray's anti_pattern_ray_get_loop.py ------------------------------------
def test_rays_get_loop_program_is_named_with_its_whole_cost(runtime):
    runtime()
    sequential = []
    for i in range(100):
        sequential.append(lightwork.get(no_op.remote(i)))  # Ray's mistake
    refs = [no_op.remote(i) for i in range(100)]  # Ray's fix
    assert lightwork.get(refs) == sequential
    [finding] = findings_of("get-in-loop")
    assert finding.callsite[1] == _line_of("sequential.append(lightwork.get(no_op.remote(i)))")
    # Its figures followed the whole loop, not only the gets that first showed it.
    assert finding.evidence["gets_in_a_row"] >= 50
    assert finding.cost_s == pytest.approx(finding.evidence["blocked_s"], abs=1e-3)
    assert finding.cost_s > 0 and "cost so far" in report([finding])


def test_findings_are_ranked_by_their_cost(runtime):
    runtime()
    for i in range(20):
        lightwork.get(no_op.remote(i))  # cheap: a few ms blocked
    for _ in range(5):
        lightwork.get(sleep_then.remote(0.4))  # dearer: 2 s blocked
    findings = lightwork.advise(print_report=False)
    costs = [f.cost_s for f in findings]
    assert findings and costs == sorted(costs, reverse=True)
    assert findings[0].evidence["function"].endswith("sleep_then")
    text = report(findings)
    if "no_op" in text:  # (the cheap loop is named too when the machine was quiet)
        assert text.index("sleep_then") < text.index("no_op")


@lightwork.remote
def sleep_then(seconds):
    time.sleep(seconds)
    return seconds


# -- the same large argument by value ----------------------------------------------------
def test_the_third_copy_of_a_big_argument_warns_at_its_remote_call(runtime):
    runtime()
    array = np.ones(3 << 17)  # 3 MB
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refs = [first_item.remote(array) for _ in range(4)]  # the mistake
        # Said at the third .remote(), before any of the tasks ended.
        said = [w for w in caught if issubclass(w.category, AdviceWarning)]
    assert said and "large-arg-repeated" in str(said[0].message)
    assert said[0].filename == __file__
    assert said[0].lineno == _line_of("refs = [first_item.remote(array) for _ in range(4)]")
    assert lightwork.get(refs) == [1.0] * 4
    [finding] = findings_of("large-arg-repeated")
    assert finding.evidence["times"] == 4 and finding.cost_s > 0

    runtime()
    ref = lightwork.put(array)  # the fix
    assert lightwork.get([first_item.remote(ref) for _ in range(4)]) == [1.0] * 4
    assert findings_of("large-arg-repeated") == []


def test_a_big_array_inside_a_fresh_tuple_is_the_same_argument_again(runtime):
    runtime()
    array = np.ones(3 << 17)
    refs = [first_item.remote((array, i)) for i in range(3)]
    assert lightwork.get(refs) == [1.0] * 3
    [finding] = findings_of("large-arg-repeated")
    assert finding.evidence["times"] == 3

    runtime()  # a new array each call is not a repeat
    refs = [first_item.remote((np.ones(3 << 17), i)) for i in range(3)]
    assert lightwork.get(refs) == [1.0] * 3
    assert findings_of("large-arg-repeated") == []


# -- redefining a remote function in a loop -----------------------------------------------
def test_a_remote_function_defined_in_a_loop_is_named_at_its_definition(runtime):
    runtime()
    refs = []
    for i in range(6):
        @lightwork.remote
        def step(x):  # the mistake: a new remote function each time round
            return x + 1

        refs.append(step.remote(i))
    assert lightwork.get(refs) == list(range(1, 7))
    [finding] = findings_of("redefined-remote")
    assert finding.callsite[0] == __file__
    assert finding.callsite[1] in (_line_of("def step(x):  # the mistake") - 1,
                                   _line_of("def step(x):  # the mistake"))
    assert finding.evidence["definitions"] == 6 and "once" in finding.suggestion

    runtime()  # the fix: defined once, called many times
    assert lightwork.get([no_op.remote(i) for i in range(6)]) == list(range(6))
    assert findings_of("redefined-remote") == []


def test_redefinitions_are_found_in_a_saved_log_too():
    advisor = Advisor(cpus=2, cores=2)
    spans = [DriverSpan("define", t, t + 0.002, 1, 1, callsite=("etl.py", 7, "parse"))
             for t in range(5)]
    advisor.feed([], spans)
    [finding] = advisor.findings
    assert finding.kind == "redefined-remote" and finding.callsite == ("etl.py", 7, "parse")


# -- a closure capturing a large object ----------------------------------------------------
BIG_TABLE = np.ones(1 << 18)  # 2 MB


@lightwork.remote
def look_up_global(i):
    return float(BIG_TABLE[i])


@lightwork.remote
def look_up(table, i):
    return float(table[i])


def test_a_function_capturing_a_big_global_is_named_with_that_global(runtime):
    runtime()
    assert lightwork.get(look_up_global.remote(3)) == 1.0
    [finding] = findings_of("large-closure")
    assert "`BIG_TABLE`" in finding.title and finding.evidence["bytes"] >= 1 << 21
    assert finding.callsite[2] == "look_up_global"

    runtime()  # the fix: the table goes to the store once, the function stays small
    table = lightwork.put(BIG_TABLE)
    assert lightwork.get([look_up.remote(table, i) for i in range(3)]) == [1.0] * 3
    assert findings_of("large-closure") == []


# -- stuck calls -----------------------------------------------------------------------------
@lightwork.remote
def fetch(wait, timeout=None):
    if not wait:
        return b"ok"
    left, right = socket.socketpair()
    left.settimeout(timeout)
    try:
        return left.recv(16)  # waits for a peer that never writes
    except socket.timeout:
        return b"timed out"
    finally:
        left.close()
        right.close()


@lightwork.remote
def wait_forever():
    threading.Event().wait()


@lightwork.remote
def spin(seconds):
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass
    return seconds


def test_a_call_stuck_far_past_its_history_is_named_with_where_it_waits(runtime, monkeypatch):
    monkeypatch.setenv("LIGHTWORK_STUCK_AFTER_S", "1")
    runtime()
    assert lightwork.get([fetch.remote(False) for _ in range(3)]) == [b"ok"] * 3
    ref = fetch.remote(True)  # the stuck call
    ready, _ = lightwork.wait([ref], timeout=4)
    assert ready == []
    [finding] = findings_of("stuck-task")
    assert finding.callsite[1] == _line_of("ref = fetch.remote(True)  # the stuck call")
    assert "left.recv(16)" in finding.title and "fetch()" in finding.title
    assert finding.evidence["longest_earlier_s"] is not None
    assert finding.cost_s >= 1
    lightwork.cancel(ref, force=True)

    runtime()  # the fix: the wait has a timeout
    monkeypatch.setenv("LIGHTWORK_STUCK_AFTER_S", "1")
    assert lightwork.get([fetch.remote(False) for _ in range(3)]) == [b"ok"] * 3
    assert lightwork.get(fetch.remote(True, timeout=0.5)) == b"timed out"
    assert findings_of("stuck-task") == []


def test_with_no_history_an_idle_call_past_the_threshold_is_stuck_and_work_is_not(
        runtime, monkeypatch):
    monkeypatch.setenv("LIGHTWORK_STUCK_AFTER_S", "1")
    runtime()
    busy = spin.remote(3.5)  # long work, no history: not stuck
    stuck = wait_forever.remote()
    assert lightwork.get(busy) == 3.5
    [finding] = findings_of("stuck-task")
    assert finding.evidence["function"].endswith("wait_forever")
    assert "no CPU" in finding.evidence["why"]
    assert "wait_forever" in finding.title
    lightwork.cancel(stuck, force=True)


# -- a first batch dominated by workers starting and importing ------------------------------
SLOW_MODULE = '''
import time
time.sleep(0.6)  # a heavy import (pandas, scikit-learn) in a few lines


def clean(i):
    return i * 2
'''


@pytest.fixture
def slow_import(tmp_path, monkeypatch):
    """A module that takes 0.6 s to import, imported by the driver only after init()
    (so no worker has it yet): each worker imports it when it loads ``clean``."""
    (tmp_path / "slow_to_import.py").write_text(SLOW_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.delitem(__import__("sys").modules, "slow_to_import", raising=False)

    def load():
        import slow_to_import

        return lightwork.remote(slow_to_import.clean)

    return load


def test_a_first_batch_spent_importing_is_named_and_a_warm_batch_is_not(runtime, slow_import):
    runtime()
    clean = slow_import()
    assert lightwork.get([clean.remote(i) for i in range(8)]) == [i * 2 for i in range(8)]
    [finding] = findings_of("startup-dominated")
    assert finding.callsite[1] == _line_of("assert lightwork.get([clean.remote(i) for i in range(8)])")
    assert finding.evidence["startup_s"] >= 0.5 and finding.cost_s >= 0.5
    assert "second batch" in finding.suggestion
    # The second batch runs on warm workers: nothing more is said.
    assert lightwork.get([clean.remote(i) for i in range(8)]) == [i * 2 for i in range(8)]
    assert len(findings_of("startup-dominated")) == 1


def test_workers_warmed_first_draw_no_startup_finding(runtime, slow_import):
    runtime()
    clean = slow_import()
    assert lightwork.get([clean.remote(i) for i in range(CPUS)]) == [i * 2 for i in range(CPUS)]
    assert lightwork.get([clean.remote(i) for i in range(8)]) == [i * 2 for i in range(8)]  # timed
    timed = _line_of("for i in range(8)]) == [i * 2 for i in range(8)]  # timed")
    assert [f for f in findings_of("startup-dominated") if f.callsite[1] == timed] == []


# -- what the runtime sees while serving a worker -----------------------------------------
@lightwork.remote
def produce():
    time.sleep(0.2)  # not ready when the consumer asks for it
    return 1


@lightwork.remote
def pass_via_nested_ref(refs):
    return sum(lightwork.get(refs))  # the mistake: get inside the task


@lightwork.remote
def pass_via_direct_arg(*values):
    return sum(values)


def test_a_task_getting_refs_from_a_container_argument_is_named(runtime):
    runtime()
    ref = pass_via_nested_ref.remote([produce.remote() for _ in range(3)])  # Ray's mistake
    assert lightwork.get(ref) == 3
    [finding] = findings_of("get-of-nested-args")
    assert finding.callsite[1] == _line_of("ref = pass_via_nested_ref.remote([produce.remote()")
    assert finding.evidence["refs"] == 3 and "*refs" in finding.suggestion
    assert finding.evidence["get_callsite"][1] == _line_of("return sum(lightwork.get(refs))")

    runtime()  # Ray's fix: the refs as direct arguments
    assert lightwork.get(pass_via_direct_arg.remote(*[produce.remote() for _ in range(3)])) == 3
    assert findings_of("get-of-nested-args") == []


@lightwork.remote
def returns_a_put_ref():
    return lightwork.put(np.ones(10))  # the mistake


@lightwork.remote
def returns_the_value():
    return np.ones(10)


@lightwork.remote(num_returns="dynamic")
def yields_values(count):
    for value in range(count):
        yield value


def test_a_task_returning_its_own_put_ref_is_named_and_a_dynamic_generator_is_not(runtime):
    runtime()
    assert float(lightwork.get(lightwork.get(returns_a_put_ref.remote())).sum()) == 10.0
    [finding] = findings_of("returned-put-ref")
    assert finding.evidence["function"].endswith("returns_a_put_ref")
    assert finding.callsite[1] == _line_of("lightwork.get(lightwork.get(returns_a_put_ref.remote()))")

    runtime()  # the fix, and lightwork's own refs of a dynamic generator
    assert float(lightwork.get(returns_the_value.remote()).sum()) == 10.0
    assert [lightwork.get(r) for r in lightwork.get(yields_values.remote(3))] == [0, 1, 2]
    assert findings_of("returned-put-ref") == []


@lightwork.remote
class AsyncFetcher:
    async def blocking(self):
        return lightwork.get(produce.remote())  # the mistake: blocks the event loop

    async def awaiting(self):
        return await produce.remote()


def test_a_blocking_get_in_an_async_method_is_named_and_await_is_not(runtime):
    runtime()
    fetcher = AsyncFetcher.remote()
    # Held up while it blocks: the actor's other calls (it still works).
    calls = [fetcher.awaiting.remote(), fetcher.blocking.remote(), fetcher.awaiting.remote()]
    assert lightwork.get(calls) == [1, 1, 1]
    deadline = time.monotonic() + 5
    while not findings_of("blocking-in-async-actor") and time.monotonic() < deadline:
        time.sleep(0.1)
    [finding] = findings_of("blocking-in-async-actor")
    assert finding.callsite[1] == _line_of("return lightwork.get(produce.remote())  # the mistake")
    assert "await" in finding.suggestion and "blocking" in finding.evidence["method"]

    runtime()
    fetcher = AsyncFetcher.remote()
    assert lightwork.get([fetcher.awaiting.remote() for _ in range(3)]) == [1, 1, 1]
    assert findings_of("blocking-in-async-actor") == []


# -- forking in application code ------------------------------------------------------------
@lightwork.remote
def forks_a_pool():
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as pool:  # the mistake
        return sum(pool.map(abs, range(-3, 3)))


@lightwork.remote
def one_item(value):
    return abs(value)


def test_a_fork_in_a_task_or_in_the_running_driver_is_named(runtime):
    runtime()
    assert lightwork.get(forks_a_pool.remote()) == 9
    pid = os.fork()  # the driver's own fork, with lightwork's threads running
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 5
    while len(findings_of("fork-in-task")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    found = {f.callsite[1]: f for f in findings_of("fork-in-task")}
    in_task = found[_line_of('get_context("fork").Pool(2) as pool:  # the mistake')]
    assert in_task.evidence["function"].endswith("forks_a_pool")
    assert "spawn" in in_task.suggestion
    in_driver = found[_line_of("pid = os.fork()  # the driver's own fork")]
    assert in_driver.evidence["function"] is None and "driver" in in_driver.title

    runtime()  # the fix: the items as tasks
    assert sum(lightwork.get([one_item.remote(v) for v in range(-3, 3)])) == 9
    assert findings_of("fork-in-task") == []


# -- get unnecessarily: Ray's anti_pattern_unnecessary_ray_get.py ---------------------------
@lightwork.remote
def generate_rollout():
    return np.ones((1000, 500))  # 4 MB


@lightwork.remote
def reduce_rollout(rollout):
    return float(rollout.sum())


def test_a_fetched_value_passed_back_by_value_is_named_and_its_ref_is_not(runtime):
    runtime()
    rollout = lightwork.get(generate_rollout.remote())
    reduced = lightwork.get(reduce_rollout.remote(rollout))  # Ray's mistake
    assert reduced == 500_000.0
    [finding] = findings_of("unneeded-get")
    assert finding.callsite[1] == _line_of("reduced = lightwork.get(reduce_rollout.remote(rollout))")
    assert finding.evidence["bytes"] == rollout.nbytes and "remote(ref)" in finding.suggestion

    runtime()  # Ray's fix: the ref goes straight to the next task
    assert lightwork.get(reduce_rollout.remote(generate_rollout.remote())) == 500_000.0
    fresh = np.ones((1000, 500))  # and a value of the driver's own is no fetched value
    assert lightwork.get(reduce_rollout.remote(fresh)) == 500_000.0
    assert findings_of("unneeded-get") == []


# -- too many objects at once: Ray's anti_pattern_ray_get_too_many_objects.py --------------
@lightwork.remote
def big_block(i):
    return np.full(8 << 20, i, dtype=np.uint8)  # 8 MB


def test_a_get_of_values_filling_the_store_is_named_and_batches_are_not(runtime, tmp_path):
    runtime(object_store_memory=128 << 20)
    blocks = lightwork.get([big_block.remote(i) for i in range(10)])  # the mistake: 80 MB
    assert [int(block[0]) for block in blocks] == list(range(10))
    del blocks
    [finding] = findings_of("get-too-many")
    assert finding.callsite[1] == _line_of("blocks = lightwork.get([big_block.remote(i)")
    assert finding.evidence["objects"] == 10 and finding.evidence["bytes"] >= 80 << 20
    assert finding.evidence["store_budget"] == 128 << 20 and "batches" in finding.suggestion
    lightwork.timeline(str(tmp_path / "trace.json"))  # saved: the bytes and the budget
    data = json.loads((tmp_path / "trace.json").read_text())["otherData"]["advisor_input"]
    assert "get-too-many" in {finding.kind for finding in analyse(data)}

    runtime(object_store_memory=128 << 20)  # the fix: take them a few at a time
    refs, total = [big_block.remote(i) for i in range(10)], 0
    while refs:
        done, refs = lightwork.wait(refs, num_returns=min(2, len(refs)))
        total += sum(int(block[0]) for block in lightwork.get(done))
    assert total == 45
    assert findings_of("get-too-many") == []


# -- globals to share state: Ray's anti_pattern_global_variables.py ---------------------------
shared_offset = 3


@lightwork.remote
class Adder:
    def add(self, x):
        return x + shared_offset


@lightwork.remote
class AdderWithState:
    def __init__(self, offset):
        self.offset = offset

    def set(self, offset):
        self.offset = offset

    def add(self, x):
        return x + self.offset


def test_a_global_rebound_after_shipping_is_named_and_actor_state_is_not(runtime):
    global shared_offset
    runtime()
    adder = Adder.remote()
    assert lightwork.get(adder.add.remote(1)) == 4
    shared_offset = 4  # the mistake: the actor keeps the value it was shipped with
    try:
        time.sleep(0.6)  # (a look sees the change; calls after it are named)
        assert lightwork.get(adder.add.remote(1)) == 4  # still 3 in the actor
        call_line = _line_of("assert lightwork.get(adder.add.remote(1)) == 4  # still 3")
        [finding] = findings_of("global-changed")
        assert finding.callsite[1] == call_line
        assert finding.evidence["global"] == "shared_offset" and "actor" in finding.suggestion
    finally:
        shared_offset = 3

    runtime()  # the fix: the state lives in the actor, changed through its methods
    adder = AdderWithState.remote(3)
    assert lightwork.get(adder.add.remote(1)) == 4
    adder.set.remote(4)
    time.sleep(0.6)
    assert lightwork.get(adder.add.remote(1)) == 5
    assert findings_of("global-changed") == []


# -- a task or actor method writing a module global -----------------------------------------
calls_counted = 0
_cache = None


@lightwork.remote
def count_call():
    global calls_counted
    calls_counted += 1  # the mistake: the worker's copy changes, the driver's never does
    return calls_counted


@lightwork.remote
class CountingActor:
    def add(self, n):
        global calls_counted
        calls_counted += n  # the same mistake in an actor's method
        return calls_counted


@lightwork.remote
class Counter:  # the fix: the state lives in an actor
    def __init__(self):
        self.count = 0

    def add(self, n):
        self.count += n
        return self.count


@lightwork.remote
def count_with(counter):
    return lightwork.get(counter.add.remote(1))


@lightwork.remote
def cached_lookup(i):
    global _cache
    if _cache is None:  # a per-worker cache, built once: correct
        _cache = list(range(10))
    return _cache[i]


def test_a_task_or_method_rebinding_a_global_is_named_and_an_actor_is_not(runtime):
    runtime()
    assert sorted(lightwork.get([count_call.remote() for _ in range(4)]))[0] == 1  # calls
    actor = CountingActor.remote()
    assert lightwork.get([actor.add.remote(2) for _ in range(2)]) == [2, 4]  # method calls
    assert calls_counted == 0  # the driver's copy never changed
    found = {f.evidence["function"].rsplit(".", 1)[-1]: f for f in findings_of("global-write")}
    task = found["count_call"]
    assert task.callsite[1] == _line_of("for _ in range(4)]))[0] == 1  # calls")
    assert task.evidence["globals"] == ["calls_counted"]
    assert task.evidence["written_at"][1] == _line_of("calls_counted += 1  # the mistake")
    assert "actor" in task.suggestion and "calls_counted" in task.title
    method = found["add"]
    assert method.callsite[1] == _line_of("for _ in range(2)]) == [2, 4]  # method calls")
    assert "self.calls_counted" in method.suggestion

    runtime()  # the fix: an actor holds the count; and a per-worker cache is no mistake
    counter = Counter.remote()
    assert sorted(lightwork.get([count_with.remote(counter) for _ in range(4)])) == [1, 2, 3, 4]
    assert lightwork.get([cached_lookup.remote(i) for i in range(6)]) == list(range(6))
    assert findings_of("global-write") == []


# -- refs serialized out of band: pickle, cloudpickle, their hex ------------------------------
@lightwork.remote
def pickles_its_ref():
    import pickle

    blob = pickle.dumps(lightwork.put(5))  # inside a task: the same mistake
    return lightwork.get(pickle.loads(blob))


@lightwork.remote
def total_of(refs):
    return sum(lightwork.get(refs))


def test_a_ref_pickled_or_rebuilt_from_its_hex_is_named_and_kept_alive(runtime):
    import gc
    import pickle

    runtime()
    ref = lightwork.put([1, 2, 3])
    blob = pickle.dumps(ref)  # Ray's mistake: the bytes hold the ref out of lightwork's sight
    hex_id = ref.hex()
    del ref
    gc.collect()
    # The program stays correct: the pickled ref's object was kept.
    assert lightwork.get(pickle.loads(blob), timeout=10) == [1, 2, 3]
    rebuilt = lightwork.ObjectRef.from_hex(hex_id)  # a ref rebuilt from its id
    assert lightwork.get(rebuilt, timeout=10) == [1, 2, 3]
    assert lightwork.get(pickles_its_ref.remote()) == 5
    found = {(f.evidence["how"], f.callsite[1]): f for f in findings_of("ref-out-of-band")}
    pickled = found["pickle", _line_of("blob = pickle.dumps(ref)  # Ray's mistake")]
    assert "kept until shutdown" in pickled.title and "pass the ref itself" in pickled.suggestion
    assert pickled.evidence["ref"] == hex_id
    assert ("hex", _line_of("rebuilt = lightwork.ObjectRef.from_hex(hex_id)")) in found
    in_task = found["pickle", _line_of("blob = pickle.dumps(lightwork.put(5))")]
    assert in_task.evidence["function"].endswith("pickles_its_ref")

    runtime()  # the fix: refs passed as they are, in an argument's list, or captured
    refs = [lightwork.put(i) for i in range(3)]
    assert lightwork.get(total_of.remote(refs)) == 3

    @lightwork.remote
    def reads_captured():
        return lightwork.get(refs[0])

    assert lightwork.get(reads_captured.remote()) == 0
    assert lightwork.get(lightwork.put(refs)) == refs  # a put of refs: lightwork's own pickle
    assert findings_of("ref-out-of-band") == []


def test_a_ref_rebuilt_from_bad_ids_says_what_to_pass(runtime):
    runtime()
    with pytest.raises(TypeError, match="ref.hex"):
        lightwork.ObjectRef.from_hex(12)
    with pytest.raises(ValueError, match="not a hex id"):
        lightwork.ObjectRef.from_hex("zz")
    with pytest.raises(ValueError, match="Ray's are 28"):
        lightwork.ObjectRef(bytes(28))
    ref = lightwork.put("x")
    assert lightwork.get(lightwork.ObjectRef.from_binary(ref.binary())) == "x"


# -- the same programs, from a saved timeline (`lightwork advise FILE`) ----------------------
def test_a_saved_timeline_names_the_catalogue_findings_its_log_holds(runtime, tmp_path):
    import json

    from lightwork.diagnostics.advisor import analyse

    runtime(advisor=False)
    refs = []
    for i in range(6):
        @lightwork.remote
        def again(x):  # defined anew each time round
            return x

        refs.append(again.remote(i))
    assert lightwork.get(refs) == list(range(6))

    @lightwork.remote
    def carries_the_table(i):  # (a new definition: pickled in this session)
        return float(BIG_TABLE[i])

    assert lightwork.get(carries_the_table.remote(0)) == 1.0
    rollout = lightwork.get(generate_rollout.remote())
    assert lightwork.get(reduce_rollout.remote(rollout)) == 500_000.0
    lightwork.timeline(str(tmp_path / "trace.json"))
    lightwork.shutdown()
    data = json.loads((tmp_path / "trace.json").read_text())["otherData"]["advisor_input"]
    kinds = {finding.kind for finding in analyse(data)}
    assert {"redefined-remote", "large-closure", "unneeded-get"} <= kinds


def test_a_remote_builtin_is_shipped_without_a_definition_to_read(runtime):
    runtime()
    assert lightwork.get(lightwork.remote(abs).remote(-3)) == 3  # no code, no class
    assert lightwork.get(lightwork.remote(time.sleep).remote(0)) is None
    assert [f.kind for f in lightwork.advise(print_report=False)
            if f.kind in ("redefined-remote", "large-closure", "global-changed")] == []
