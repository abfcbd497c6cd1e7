"""The advisor: each mistake is reported; the corrected program is not.

Every test runs a program with the mistake and checks the finding (kind, evidence, call
site), then the corrected program on a fresh runtime and checks silence for that kind.
Programs are small versions of the Ray guides' examples.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import warnings

import pytest

import lightwork
from tests.helpers import OtherProgramsLoad
from tests import support
from tests.diagnostics.conftest import CPUS
from lightwork.kernel.run import RunRecord
from lightwork.diagnostics.advisor import PINNED_MIN_AGE_S, AdviceWarning
from lightwork.diagnostics._rules_load import OVERSUBSCRIBED_CPU

pytestmark = pytest.mark.lightwork_only


class LogOnlyRun(RunRecord):
    """A run with no engine behind it: the advisor reads its log; nothing ends by
    itself, nothing can be cancelled or killed."""

    def add_task_listener(self, listener):
        pass

    def remove_task_listener(self, listener):
        pass

    def resources(self):
        return {}, {}  # (cpu_total: 1, as for a run that cannot tell)

    def cancel(self, object_ids, force):
        raise AssertionError("the advisor never cancels")

    def kill_actor(self, actor_id):
        raise AssertionError("the advisor never kills")


def kinds(findings):
    return {finding.kind for finding in findings}


def findings_of(kind):
    return [f for f in lightwork.advise(print_report=False) if f.kind == kind]


@lightwork.remote
def sleeper(seconds):
    time.sleep(seconds)
    return seconds


def test_get_in_a_loop_is_reported_with_its_line_and_submit_all_is_not(runtime):
    runtime()
    results = []
    for _ in range(5):
        results.append(lightwork.get(sleeper.remote(0.05)))  # the mistake: this line
    line = _line_of("results.append(lightwork.get(sleeper.remote(0.05)))")
    [finding] = findings_of("get-in-loop")
    assert finding.callsite[0] == __file__ and finding.callsite[1] == line
    assert finding.evidence["gets_in_a_row"] >= 4
    assert "submit all" in finding.suggestion

    runtime()
    refs = [sleeper.remote(0.05) for _ in range(5)]
    lightwork.get(refs)
    assert findings_of("get-in-loop") == []


def test_tiny_tasks_are_reported_with_a_batch_size_and_batched_tasks_are_not(runtime):
    @lightwork.remote
    def add_one(x):
        return x + 1

    runtime()
    lightwork.get([add_one.remote(i) for i in range(400)])
    [finding] = findings_of("tiny-tasks")
    # Counted when the rule fired: the advisor's thread may look while tasks still run.
    assert 200 <= finding.evidence["tasks"] <= 400
    assert finding.evidence["suggested_batch"] >= 2
    assert f"about {finding.evidence['suggested_batch']} items" in finding.suggestion

    @lightwork.remote
    def add_one_to_each(xs):
        deadline = time.perf_counter() + 0.005  # a batch is a few ms of work
        out = [x + 1 for x in xs]
        while time.perf_counter() < deadline:
            pass
        return out

    runtime()
    lightwork.get([add_one_to_each.remote(list(range(i, i + 20))) for i in range(0, 400, 20)])
    assert findings_of("tiny-tasks") == []


def test_same_large_argument_by_value_is_reported_and_put_once_is_not(runtime):
    np = pytest.importorskip("numpy")

    @lightwork.remote
    def total(a):
        return float(a.sum())

    array = np.ones(300_000)  # 2.4 MB
    runtime()
    lightwork.get([total.remote(array) for _ in range(4)])
    [finding] = findings_of("large-arg-repeated")
    assert finding.evidence["bytes"] == array.nbytes and finding.evidence["times"] >= 3
    assert "lightwork.put" in finding.suggestion

    runtime()
    ref = lightwork.put(array)
    lightwork.get([total.remote(ref) for _ in range(4)])
    assert findings_of("large-arg-repeated") == []


def test_waiting_for_the_slowest_is_reported_and_wait_loop_is_not(runtime):
    # The slow task runs far longer than the others (not just 0.7 s): on a loaded machine
    # dispatch delays stretch the get, and the rule asks the slowest task to stand out
    # by half of it.
    durations = [0.05, 0.05, 0.05, 1.5]
    runtime()
    with OtherProgramsLoad() as load:
        lightwork.get([sleeper.remote(d) for d in durations])
    found = findings_of("wait-for-slowest")
    if not found:
        # The slow task sleeps: with every core busy with other programs the advisor
        # cannot tell its sleep from being kept off the cores, and rightly says nothing.
        load.skip_if_busy(limit=0.75)
    [finding] = found
    assert finding.evidence["objects"] == 4
    assert finding.evidence["spread_s"] >= 0.3
    assert "lightwork.wait" in finding.suggestion

    runtime()
    pending = [sleeper.remote(d) for d in durations]
    while pending:
        done, pending = lightwork.wait(pending, num_returns=1)
        lightwork.get(done[0])
    assert findings_of("wait-for-slowest") == []


def test_one_busy_actor_is_reported_and_a_pool_of_actors_is_not(runtime):
    @lightwork.remote
    class Sleeper:
        def work(self, seconds):
            time.sleep(seconds)
            return seconds

    runtime()
    one = Sleeper.remote()
    # Calls long enough that the gaps between them (dispatch, which a loaded machine
    # slows) stay well inside the rule's "busy 70% of the time".
    lightwork.get([one.work.remote(0.25) for _ in range(9)])
    [finding] = findings_of("actor-bottleneck")
    assert finding.evidence["calls"] >= 5
    assert finding.evidence["mean_queued_s"] > finding.evidence["mean_run_s"]
    assert "ActorPool" in finding.suggestion and "(Sleeper)" in finding.title

    runtime()
    pool = [Sleeper.remote() for _ in range(CPUS)]
    lightwork.get([pool[i % CPUS].work.remote(0.08) for i in range(2 * CPUS)])
    assert findings_of("actor-bottleneck") == []


def test_serial_driver_work_between_submissions_is_reported(runtime):
    def other_work():  # the driver computes: its main thread's CPU time is the evidence
        deadline = time.thread_time() + 0.1
        while time.thread_time() < deadline:
            pass

    runtime()
    # Workers started first: a fresh fork server that preloads the libraries earlier tests
    # imported (pandas, dask) would add its start to the window the rule divides by.
    lightwork.get([sleeper.remote(0) for _ in range(CPUS)])
    refs = []
    for _ in range(6):
        other_work()
        refs.append(sleeper.remote(0.1))
    lightwork.get(refs)
    [finding] = findings_of("serial-driver")
    assert finding.evidence["serial_s"] >= 0.4
    assert "Amdahl" in finding.title

    runtime()  # corrected: submit first, then the driver's own work overlaps the tasks
    refs = [sleeper.remote(0.1) for _ in range(6)]
    for _ in range(6):
        other_work()
    lightwork.get(refs)
    assert findings_of("serial-driver") == []


def _burn_in_threads(threads, seconds):
    data = b"x" * (8 << 20)
    deadline = time.monotonic() + seconds

    def burn():
        while time.monotonic() < deadline:
            hashlib.sha256(data).digest()  # releases the GIL: truly parallel

    workers = [threading.Thread(target=burn) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return threads


def skip_unless_cores_are_idle():
    """CPU-time findings measure how much CPU tasks got: other programs' load on the
    machine (a parallel test run, say) takes it from them, so wait for idle cores."""
    import psutil

    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two cores")
    for _ in range(10):
        if psutil.cpu_percent(interval=0.3) < 30:
            return
    pytest.skip("the machine's cores are busy with other programs")


def test_a_task_using_more_cores_than_its_share_is_reported(runtime):
    skip_unless_cores_are_idle()
    runtime()
    burner = lightwork.remote(_burn_in_threads)
    with OtherProgramsLoad() as load:
        lightwork.get(burner.remote(4, 1.2))
    load.skip_if_busy()
    from lightwork.diagnostics import task_records

    [record] = [r for r in task_records() if r.name == "_burn_in_threads"]
    assert record.cpu_time > 0  # measured
    cores = record.cpu_time / (record.finished - record.args_loaded)
    if cores <= OVERSUBSCRIBED_CPU:  # (the rule's line, per CPU asked for)
        pytest.skip(f"the task got only {cores:.2f} cores of the machine's "
                    f"{os.cpu_count()}: something else took the rest, so it used no more "
                    "than its share")
    [finding] = findings_of("oversubscription")
    assert finding.evidence["cores_used"] > 1.5
    assert "num_cpus" in finding.suggestion

    runtime()
    lightwork.get(burner.remote(1, 1.2))
    assert findings_of("oversubscription") == []


def _spin(seconds):
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass
    return seconds


def test_more_cpu_bound_tasks_at_once_than_cores_is_reported_at_init(runtime):
    skip_unless_cores_are_idle()
    cores = os.cpu_count() or 1
    spin = lightwork.remote(_spin)
    runtime(num_cpus=cores + 2)
    with OtherProgramsLoad() as load:
        lightwork.get([spin.remote(0.3) for _ in range(cores + 2)])
    load.skip_if_busy()
    [finding] = findings_of("fewer-slots")
    assert finding.evidence["num_cpus"] == cores + 2 and finding.evidence["cores"] == cores
    assert finding.evidence["tasks_at_once"] > cores
    assert finding.callsite is not None and finding.callsite[2] == "start"  # the init call

    runtime(num_cpus=cores)  # corrected: one slot per core
    lightwork.get([spin.remote(0.3) for _ in range(cores + 2)])
    assert findings_of("fewer-slots") == []

    runtime(num_cpus=cores + 2)  # more slots than cores is right for tasks that wait
    lightwork.get([sleeper.remote(0.3) for _ in range(cores + 2)])
    assert findings_of("fewer-slots") == []


def test_store_filled_by_forgotten_refs_is_reported_and_released_refs_are_not(runtime):
    runtime()
    kept = [lightwork.put(bytes(70 << 20)) for _ in range(4)]  # 280 MB, never used again
    assert findings_of("refs-pinned") == []  # just made: the driver may be about to use them
    time.sleep(PINNED_MIN_AGE_S + 0.1)
    [finding] = findings_of("refs-pinned")
    assert finding.evidence["objects"] == 4 and finding.evidence["bytes"] >= 280 << 20
    kept.append(lightwork.put(bytes(70 << 20)))
    time.sleep(PINNED_MIN_AGE_S + 0.1)
    [finding] = findings_of("refs-pinned")  # reported once, with the peak's figures
    assert finding.evidence["objects"] == 5 and finding.evidence["bytes"] >= 350 << 20
    del kept

    runtime()
    for _ in range(4):
        ref = lightwork.put(bytes(70 << 20))
        assert len(lightwork.get(ref)) == 70 << 20
        del ref
    time.sleep(PINNED_MIN_AGE_S + 0.1)
    assert findings_of("refs-pinned") == []


def test_pinned_results_are_counted_in_full_and_named_by_their_call_site(runtime):
    """Once reported "4 objects (1.9 GB) at (no call site)" while 16 were pinned."""
    make = lightwork.remote(_make_bytes)
    runtime()
    refs = [make.remote(20 << 20) for _ in range(16)]  # the line named
    line = _line_of("refs = [make.remote(20 << 20) for _ in range(16)]")
    lightwork.wait(refs, num_returns=len(refs))
    time.sleep(PINNED_MIN_AGE_S + 0.1)
    [finding] = findings_of("refs-pinned")
    assert finding.evidence["objects"] == 16 and finding.evidence["bytes"] >= 320 << 20
    assert finding.evidence["largest_source"] == "_make_bytes"
    assert finding.callsite is not None and finding.callsite[1] == line
    del refs


def _make_bytes(size):
    return bytes(size)


def test_well_written_programs_get_no_finding(runtime):
    np = pytest.importorskip("numpy")
    runtime()

    @lightwork.remote
    def chunk_sum(xs):
        time.sleep(0.02)
        return sum(xs)

    @lightwork.remote
    def scale(a, k):
        time.sleep(0.02)
        return float(a.sum()) * k

    @lightwork.remote
    class Worker:
        def work(self, x):
            time.sleep(0.02)
            return x * 2

    # a pipeline with wait
    pending = [sleeper.remote(0.02 * (i % 3 + 1)) for i in range(8)]
    while pending:
        done, pending = lightwork.wait(pending, num_returns=1)
        lightwork.get(done)
    # batched tasks
    lightwork.get([chunk_sum.remote(list(range(i, i + 100))) for i in range(0, 1000, 100)])
    # a big argument put once
    ref = lightwork.put(np.ones(400_000))
    lightwork.get([scale.remote(ref, k) for k in range(6)])
    # a pool of actors
    pool = lightwork.util.ActorPool([Worker.remote() for _ in range(CPUS)])
    assert sorted(pool.map_unordered(lambda a, v: a.work.remote(v), range(8))) == [
        2 * v for v in range(8)
    ]
    assert lightwork.advise(print_report=False) == []


def test_findings_warn_once_in_the_users_thread_and_filters_apply(runtime):
    runtime()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AdviceWarning)
        for _ in range(6):
            lightwork.get(sleeper.remote(0.03))
        time.sleep(0.4)  # the advisor looks every 0.25 s
        lightwork.get(sleeper.remote(0.0))
        lightwork.get(sleeper.remote(0.0))
    advice = [w for w in caught if issubclass(w.category, AdviceWarning)]
    assert len(advice) == 1 and "get-in-loop" in str(advice[0].message)
    assert advice[0].filename == __file__

    runtime()
    with warnings.catch_warnings():
        warnings.simplefilter("error", AdviceWarning)
        with pytest.raises(AdviceWarning, match="get-in-loop"):
            for _ in range(12):
                lightwork.get(sleeper.remote(0.03))
                time.sleep(0.03)


def test_advisor_off_means_no_warnings_but_advise_still_reads_the_log(runtime, capsys):
    runtime(advisor=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AdviceWarning)
        for _ in range(5):
            lightwork.get(sleeper.remote(0.03))
        time.sleep(0.3)
        lightwork.get(sleeper.remote(0.0))
    assert not [w for w in caught if issubclass(w.category, AdviceWarning)]
    findings = lightwork.advise()
    assert "get-in-loop" in kinds(findings)
    printed = capsys.readouterr().out
    assert "get-in-loop" in printed and "fix:" in printed


def test_advise_without_a_runtime_says_what_to_do(fresh_runtime):
    with pytest.raises(RuntimeError, match="before lightwork.shutdown"):
        lightwork.advise()


def _line_of(text):
    with open(__file__) as source:
        for number, line in enumerate(source, 1):
            if text in line and "_line_of" not in line:
                return number
    raise AssertionError(text)


@lightwork.remote
class _Selfish:
    def inner(self):
        return "inner"

    def outer(self, me):
        return lightwork.get(me.inner.remote())  # waits for a call queued behind itself


def test_an_actor_getting_its_own_call_is_named(runtime):
    """``advise`` once said nothing looked wrong while an actor waited for its
    own call. The runtime now refuses that get (ActorDeadlockError); the advisor names it."""
    deadlock_error = getattr(lightwork.exceptions, "ActorDeadlockError", None)
    if deadlock_error is None:
        pytest.skip("this lightwork does not detect an actor's get of its own call yet")
    runtime()
    actor = _Selfish.remote()
    with pytest.raises(deadlock_error):
        lightwork.get(actor.outer.remote(actor), timeout=30)
    [finding] = findings_of("actor-deadlock")
    assert finding.evidence["method"] == "_Selfish.outer"
    assert finding.evidence["waits_for"] == ["_Selfish.inner"]
    assert "async" in finding.suggestion and "max_concurrency" in finding.suggestion


def test_the_runtimes_deadlock_reports_become_findings_once(runtime, monkeypatch):
    """The advisor reads the runtime's reports (``node.actors.deadlocks``, the shape the
    runtime records them in) and names each once."""
    from collections import deque

    runtime()
    report = {"time": time.time(), "actor_id": 7, "class_name": "Single",
              "method": "Single.outer", "callsite": "prog.py:12 in outer",
              "waits_for": ["Single.inner"]}
    node = support.driver_node()
    monkeypatch.setattr(node.actors, "deadlocks", deque([report, dict(report)]), raising=False)
    [finding] = findings_of("actor-deadlock")
    assert "Single.outer" in finding.title and "prog.py:12" in finding.title
    assert finding.evidence["waits_for"] == ["Single.inner"]
    assert findings_of("actor-deadlock") == [finding]  # once, however often it is asked


def test_big_puts_are_logged_as_lightworks_copying_and_small_ones_are_not(runtime):
    from lightwork.diagnostics import blocked_spans

    runtime()
    before = time.monotonic()
    small = lightwork.put(b"x" * 100)
    big = lightwork.put(b"x" * (8 << 20))
    puts = [span for span in blocked_spans() if span.kind == "put" and span.start >= before]
    assert len(puts) == 1 and puts[0].end >= puts[0].start
    assert lightwork.get(small) == b"x" * 100 and len(lightwork.get(big)) == 8 << 20


def test_the_main_threads_submissions_carry_its_busy_time_and_others_do_not(runtime):
    from lightwork.diagnostics import task_records

    runtime()
    main_refs = []
    for _ in range(3):
        time.sleep(0.01)  # past the sampling interval: each submission is sampled
        main_refs.append(sleeper.remote(0))
    lightwork.get(main_refs)
    other_refs = []
    thread = threading.Thread(target=lambda: other_refs.extend(
        sleeper.remote(0) for _ in range(3)))
    thread.start()
    thread.join()
    lightwork.get(other_refs)
    by_id = {r.task_id: r for r in task_records()}
    core = support.running_backend()
    main = [by_id[core.task_id_of(ref.id)] for ref in main_refs]
    other = [by_id[core.task_id_of(ref.id)] for ref in other_refs]
    assert all(r.driver_busy >= r.driver_cpu > 0 for r in main)
    assert [r.driver_busy for r in main] == sorted(r.driver_busy for r in main)
    assert all(r.driver_busy == 0 for r in other)  # another thread's clock is not the driver's


def test_advise_waits_for_a_look_that_took_records_it_has_not_folded_in(monkeypatch):
    # The advisor's thread takes the new records under the runtime's lock, reads /proc,
    # then folds them into the rules. advise() looking in between must wait for that
    # look, not answer without the records it holds.

    from lightwork.kernel.events import EventLog, TaskRecord
    from lightwork.diagnostics import advisor as advisor_module
    from lightwork.diagnostics._rules_load import TINY_MIN_TASKS

    node = LogOnlyRun()  # a run with no engine behind it: only its log and lock
    node.lock, node.log = threading.RLock(), EventLog()
    advisor = node.advisor = advisor_module.Advisor(node, cpus=2, cores=2)
    site = ("job.py", 7, "main")
    for task_id in range(TINY_MIN_TASKS * 2):  # a flood of 10 µs tasks: tiny-tasks
        at = 100.0 + task_id * 1e-3
        node.log.finish_task(TaskRecord(
            task_id, "f", 0, at, started=at, args_loaded=at, finished=at + 1e-5,
            stored=at + 1e-5, seen=at + 1e-5, state="FINISHED", callsite=site))
    between, resume = threading.Event(), threading.Event()

    def idle_cores():  # the thread's look, between taking and folding, waits here
        if threading.current_thread() is thread_look:
            between.set()
            resume.wait(30)
        return None

    monkeypatch.setattr(advisor_module, "machine_idle_core_s", idle_cores)
    thread_look = threading.Thread(target=advisor.step)
    thread_look.start()
    assert between.wait(30)  # it holds every record now
    answers: list[set[str]] = []
    caller = threading.Thread(target=lambda: answers.append(
        {finding.kind for finding in advisor_module.current_findings(node)}))
    caller.start()
    caller.join(0.5)  # time enough to answer at once, had it not waited
    resume.set()
    caller.join(30)
    thread_look.join(30)
    assert answers == [{"tiny-tasks"}]


def test_an_advisor_whose_look_fails_says_why_and_stops_being_fed(fresh_runtime, monkeypatch,
                                                                  capsys, wait_until):
    # The advisor must never disturb the program: a look that raises prints the error,
    # ends the thread, and the log stops keeping spans and tallying records for looks
    # that will not come; tasks run on.
    from lightwork.diagnostics import advisor as advisor_module

    def broken_look(self, node):
        raise ZeroDivisionError("a rule's bug")

    monkeypatch.setattr(advisor_module.Advisor, "_look", broken_look)
    fresh_runtime.init(num_cpus=2)
    node = support.driver_node()
    assert node.log.watching
    wait_until(lambda: not node.log.watching, timeout=10, message="the log unwatched")
    assert "ZeroDivisionError: a rule's bug" in capsys.readouterr().err
    square = fresh_runtime.remote(lambda x: x * x)
    assert fresh_runtime.get([square.remote(i) for i in range(20)], timeout=30) == [
        i * i for i in range(20)]
    with node.lock:
        assert node.log._tally is None and node.log.fresh_spans is None


def test_a_fast_loop_of_gets_is_get_in_loop_though_the_look_samples_its_records():
    """Thousands of tiny synchronous calls in one look: the look reads a sample of the
    records, but every record a one-object get waited for, so the get-in-loop chain holds
    (it was found for a slow loop only)."""

    from lightwork.kernel.events import DriverSpan, EventLog, TaskRecord
    from lightwork.diagnostics import advisor as advisor_module
    from lightwork.diagnostics._advice_rules import SAMPLE_PER_STEP

    node = LogOnlyRun()  # a run with no engine behind it: only its log and lock
    node.lock, node.log = threading.RLock(), EventLog()
    advisor = node.advisor = advisor_module.Advisor(node, cpus=2, cores=2)
    submit_site, get_site = ("job.py", 7, "main"), ("job.py", 8, "main")
    calls = SAMPLE_PER_STEP * 6  # a sample of one record in six
    for task_id in range(1, calls + 1):  # each: submitted, runs 1 µs, got, 60 µs apart
        at = 100.0 + task_id * 60e-6
        node.log.finish_task(TaskRecord(
            task_id, "f", 0, at, started=at + 5e-6, args_loaded=at + 5e-6,
            finished=at + 6e-6, stored=at + 7e-6, seen=at + 20e-6, state="FINISHED",
            callsite=submit_site))
        node.log.add_span(DriverSpan("get", at + 1e-6, at + 50e-6, 1, 1,
                                     first_object_id=task_id + 10**6, callsite=get_site,
                                     first_task_id=task_id))
    advisor.step()
    [finding] = [f for f in advisor.findings if f.kind == "get-in-loop"]
    assert finding.callsite == get_site and finding.evidence["gets_in_a_row"] >= 4
