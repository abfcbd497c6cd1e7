"""The diagnostics on the distributed backend, against a real cluster (``dask scheduler``
plus two single-thread ``dask worker`` processes, ``dask_cluster.DaskCluster``).

The event log is filled from the workers' own stamps (``engines/distributed/record.py``);
these tests check what each reader makes of it: task records (times on one clock,
worker pids, errors, retries, actor calls), the timeline (the same format checks as a
local one, one row per worker and per actor), the state API, the advisor's get-in-loop
and large-arg-repeated findings, and ``stack()`` through ``client.run``.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import time
import types

import pytest
from tests.helpers import script_env, write_script
from tests import support
from tests.diagnostics.test_timeline import check_trace, process_names, spans

import lightwork
from lightwork import exceptions
from lightwork.engines.distributed import record as cluster_record

pytestmark = pytest.mark.lightwork_only
pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")


@lightwork.remote
def slow_add(a, b=0):
    time.sleep(0.02)
    return a + b


@lightwork.remote
def fails():
    raise KeyError("missing")


_tries = {"n": 0}


@lightwork.remote(max_retries=2, retry_exceptions=[OSError])
def flaky_once():
    _tries["n"] += 1  # per worker process: the first try fails, the retry succeeds
    if _tries["n"] % 2:
        raise OSError("first try")
    return "ok"


@lightwork.remote
def sleeps_in_marker_function(seconds):
    def lightwork_stack_marker():
        time.sleep(seconds)

    lightwork_stack_marker()
    return seconds


@lightwork.remote
class Tally:
    def __init__(self):
        self.n = 0

    def bump(self):
        self.n += 1
        return self.n


def records_named(name):
    return [r for r in lightwork.diagnostics.task_records() if r.name.endswith(name)]


def test_task_records_carry_worker_times_on_the_driver_clock(cluster):
    before = time.monotonic()
    submit_line = inspect.currentframe().f_lineno + 1
    assert lightwork.get([slow_add.remote(i) for i in range(6)]) == list(range(6))
    after = time.monotonic()
    records = records_named("slow_add")
    assert len(records) == 6
    for r in records:
        assert r.state == "FINISHED" and r.error is None
        assert before <= r.submitted <= r.started <= r.args_loaded <= r.finished <= r.stored
        assert r.stored <= after + 0.5  # within the clock-offset estimate's error
        assert r.finished - r.args_loaded >= 0.015  # the sleep ran between the stamps
        assert r.pid in cluster.worker_pids() and r.worker_id > 0
        assert r.arg_size > 0 and r.callsite[0] == __file__ and r.callsite[1] == submit_line


def test_errors_and_retries_are_recorded(cluster):
    with pytest.raises(KeyError):
        lightwork.get(fails.remote())
    [failed] = records_named("fails")
    assert failed.state == "FAILED" and "KeyError" in failed.error
    assert lightwork.get(flaky_once.remote()) == "ok"
    [retried] = records_named("flaky_once")
    assert retried.state == "FINISHED" and retried.attempt == 1
    assert len(retried.retries) == 1 and "OSError: first try" in retried.retries[0][1]
    assert retried.started <= retried.retries[0][0] <= retried.finished


def test_actor_calls_are_recorded_from_the_actor_side(cluster):
    tally = Tally.remote()
    assert lightwork.get([tally.bump.remote() for _ in range(5)]) == [1, 2, 3, 4, 5]
    calls = records_named("Tally.bump")
    assert len(calls) == 5 and all(c.actor_id and c.state == "FINISHED" for c in calls)
    assert len({c.worker_id for c in calls}) == 1  # the actor's own row
    assert calls[0].worker_id not in {r.worker_id for r in records_named("slow_add")}
    rows = lightwork.state.list_tasks(filters=[("name", "=", "Tally.bump")])
    assert len(rows) == 5 and {row["type"] for row in rows} == {"ACTOR_TASK"}


def test_timeline_passes_the_format_checks_with_a_row_per_worker_and_actor(cluster, tmp_path):
    tally = Tally.remote()
    lightwork.get([slow_add.remote(i) for i in range(4)] + [tally.bump.remote()])
    path = str(tmp_path / "trace.json")
    assert lightwork.timeline(path) is None
    from tests.diagnostics.test_timeline import load_trace

    events = load_trace(path)
    check_trace(events)
    names = process_names(events)
    workers = [n for n in names.values() if n.startswith("worker tcp://")]
    actors = [n for n in names.values() if n.startswith("actor Tally on tcp://")]
    assert len(workers) == 2 and actors, names
    pids = {str(pid) for pid in cluster.worker_pids()}
    assert all(name.rsplit("(pid ", 1)[1].rstrip(")") in pids for name in workers + actors)
    task_pids = {e["pid"] for e in spans(events, name="slow_add", cat="task")}
    assert task_pids and all(names[pid].startswith("worker tcp://") for pid in task_pids)
    assert any(names[e["pid"]].startswith("actor Tally")
               for e in spans(events, name="Tally.bump", cat="task"))
    assert spans(events, name="get", cat="driver")  # the driver's blocked time


@lightwork.remote
def produce(nbytes):
    time.sleep(0.4)  # the two producers run at once, so on the two workers
    return b"x" * nbytes


@lightwork.remote
def joined_length(a, b):
    return len(a) + len(b)


@lightwork.remote
class Blobs:
    def blob(self, nbytes):
        return b"y" * nbytes


def test_a_dependency_fetched_from_the_other_worker_is_a_transfer_with_its_bytes(
        cluster, tmp_path):
    """The consumer of two results made on different workers fetches one of them: the
    log has that transfer (source worker, the bytes distributed moved) on the consumer's
    row, and every task's and actor call's result size."""
    from distributed.sizeof import safe_sizeof

    # Both workers up (a test before may have killed one), so the two producers, which
    # run at once, take one each.
    cluster.wait_for_workers(support.cluster_client())
    small, large = produce.remote(60_000), produce.remote(300_000)
    consumer = joined_length.remote(small, large)
    assert lightwork.get(consumer) == 360_000
    blobs = Blobs.remote()
    assert len(lightwork.get(blobs.blob.remote(70_000))) == 70_000
    path = str(tmp_path / "trace.json")
    lightwork.timeline(path)  # (syncs the log)

    producers = records_named("produce")
    [joined] = records_named("joined_length")
    [call] = records_named("Blobs.blob")
    assert sorted(r.result_size for r in producers) == [
        safe_sizeof(b"x" * 60_000), safe_sizeof(b"x" * 300_000)]
    assert joined.result_size == safe_sizeof(360_000) and joined.state == "FINISHED"
    assert call.result_size == safe_sizeof(b"y" * 70_000)
    assert len({r.worker_id for r in producers}) == 2, "the producers shared a worker"
    [fetched] = [r for r in producers if r.worker_id != joined.worker_id]

    log = support.recorder()
    address_of = {row: address for address, row in log.rows.items()
                  if isinstance(address, str)}
    [transfer] = [t for t in log.transfers if t.task_id == joined.task_id]
    assert transfer.source == address_of[fetched.worker_id]
    assert transfer.nbytes == fetched.result_size
    assert transfer.worker_id == joined.worker_id
    assert fetched.stored <= transfer.start + 0.05  # on the one clock (within its error)
    assert transfer.start <= transfer.stop <= joined.started + 0.05

    from tests.diagnostics.test_timeline import load_trace

    events = load_trace(path)
    check_trace(events)
    [span] = [e for e in spans(events, name="transfer", cat="transfer")
              if e["args"]["task_id"] == joined.task_id]
    assert span["args"]["bytes"] == fetched.result_size
    assert span["args"]["from"] == address_of[fetched.worker_id]
    [task_span] = [e for e in spans(events, name="joined_length", cat="task")]
    assert span["pid"] == task_span["pid"]  # on the receiving worker's row
    assert process_names(events)[span["pid"]].startswith(
        f"worker {address_of[joined.worker_id]}")
    lightwork.kill(blobs)


@lightwork.remote
def fails_with(a, b):
    raise ValueError(f"got {len(a)} and {len(b)} bytes")


def test_a_task_that_fails_after_a_fetch_keeps_its_transfer(cluster):
    small, large = produce.remote(20_000), produce.remote(200_000)
    with pytest.raises(ValueError, match="got 20000 and 200000 bytes"):
        lightwork.get(fails_with.remote(small, large))
    lightwork.diagnostics.task_records()  # (syncs the log)
    producers = records_named("produce")[-2:]
    [failed] = records_named("fails_with")
    assert failed.state == "FAILED" and failed.result_size == 0
    assert len({r.worker_id for r in producers}) == 2, "the producers shared a worker"
    [fetched] = [r for r in producers if r.worker_id != failed.worker_id]
    log = support.recorder()
    [transfer] = [t for t in log.transfers if t.task_id == failed.task_id]
    assert transfer.nbytes == fetched.result_size and transfer.worker_id == failed.worker_id


def test_summary_and_task_listing(cluster):
    lightwork.get([slow_add.remote(1) for _ in range(3)])
    summary = lightwork.state.summarize_tasks()
    by_name = {s["name"]: s for s in summary["functions"]}
    assert by_name["slow_add"]["count"] >= 3 and by_name["slow_add"]["p50_run_s"] >= 0.015
    assert lightwork.state.list_tasks(state="FINISHED", limit=2)


def test_a_cancelled_task_ends_in_the_log(cluster):
    blocker = sleeps_in_marker_function.remote(1.0)
    other = sleeps_in_marker_function.remote(1.0)  # two slots busy: the next one waits
    pending = slow_add.remote(100)
    lightwork.cancel(pending)
    with pytest.raises(exceptions.TaskCancelledError):
        lightwork.get(pending)
    task_id = support.task_id_of(pending)
    [record] = [r for r in lightwork.diagnostics.task_records() if r.task_id == task_id]
    assert record.state == "FAILED" and "TaskCancelledError" in record.error
    assert lightwork.get([blocker, other]) == [1.0, 1.0]
    assert not [r for r in lightwork.diagnostics.task_records(include_unfinished=True)
                if r.task_id == task_id and r.state != "FAILED"]


def test_advisor_names_get_in_loop_on_the_cluster(cluster):
    for i in range(8):
        lightwork.get(slow_add.remote(i))  # the anti-pattern, on purpose
    kinds = {f.kind for f in lightwork.advise(print_report=False)}
    assert "get-in-loop" in kinds


@lightwork.remote
def total(array):
    return float(array.sum())


@lightwork.remote
class Summer:
    def total(self, array):
        return float(array.sum())


def test_advisor_names_a_large_argument_sent_again_and_again_on_the_cluster(cluster):
    np = pytest.importorskip("numpy")
    array = np.ones(300_000)  # 2.4 MB, by value each time: the anti-pattern, on purpose
    lightwork.get([total.remote(array) for _ in range(4)])
    summer = Summer.remote()
    lightwork.get([summer.total.remote(array) for _ in range(4)])
    found = [f for f in lightwork.advise(print_report=False) if f.kind == "large-arg-repeated"]
    assert {f.evidence["function"] for f in found} >= {"total", "Summer.total"}
    assert all(f.evidence["bytes"] == array.nbytes for f in found)
    ref = lightwork.put(np.zeros(300_000))  # put once: not reported
    lightwork.get([total.remote(ref) for _ in range(4)])
    assert len([f for f in lightwork.advise(print_report=False)
                if f.kind == "large-arg-repeated"]) == len(found)


BIG_GLOBAL = bytes(3 << 20)  # captured by value in the function below: the mistake


def test_advisor_names_redefinitions_and_big_closures_on_the_cluster(cluster):
    refs = []
    for i in range(5):
        @lightwork.remote
        def again(x):  # defined anew each time round: the mistake
            return x

        refs.append(again.remote(i))

    @lightwork.remote
    def carries_a_global():
        return len(BIG_GLOBAL)

    assert lightwork.get(refs) == list(range(5))
    assert lightwork.get(carries_a_global.remote()) == 3 << 20
    found = {f.kind: f for f in lightwork.advise(print_report=False)}
    assert found["redefined-remote"].evidence["definitions"] == 5
    assert "`BIG_GLOBAL`" in found["large-closure"].title


def test_stack_shows_every_worker_thread_through_the_engine(cluster):
    ref = sleeps_in_marker_function.remote(3.0)
    deadline = time.monotonic() + 20
    text = ""
    while time.monotonic() < deadline:
        text = str(lightwork.stack())
        if "lightwork_stack_marker" in text:
            break
        time.sleep(0.2)
    assert "lightwork_stack_marker" in text
    assert text.count("=== worker ") == 2 and "tcp://127.0.0.1:" in text
    for pid in cluster.worker_pids():
        assert f"(pid {pid})" in text
    assert lightwork.get(ref) == 3.0


@lightwork.remote
def waits_for_a_peer(wait):
    import socket

    if not wait:
        return b"ok"
    left, right = socket.socketpair()
    left.settimeout(wait)  # (long past the finding: the worker is free again after it)
    try:
        return left.recv(16)  # waits for a peer that never writes
    except socket.timeout:
        return b"timed out"
    finally:
        left.close()
        right.close()


@lightwork.remote
def spins(seconds):
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass
    return seconds


def test_a_task_stuck_on_a_cluster_worker_is_named_with_where_it_waits(cluster, monkeypatch):
    monkeypatch.setenv("LIGHTWORK_STUCK_AFTER_S", "1")  # (read when advise() analyses)
    assert lightwork.get([waits_for_a_peer.remote(0) for _ in range(3)]) == [b"ok"] * 3
    stuck = waits_for_a_peer.remote(12.0)  # the stuck task
    busy = spins.remote(6.0)  # long work on the other worker, no history: not stuck
    deadline = time.monotonic() + 30
    found = []
    while not found and time.monotonic() < deadline:
        time.sleep(1.0)
        found = [f for f in lightwork.advise(print_report=False) if f.kind == "stuck-task"]
    [finding] = found
    assert finding.evidence["function"] == "waits_for_a_peer"
    assert "left.recv(16)" in finding.title and "waits_for_a_peer()" in finding.title
    assert "no CPU" in finding.evidence["why"] and "tcp://" in finding.evidence["why"]
    assert finding.callsite[1] == inspect.getsourcelines(
        test_a_task_stuck_on_a_cluster_worker_is_named_with_where_it_waits)[1] + 3
    assert finding.cost_s >= 1
    assert lightwork.get(busy) == 6.0
    assert lightwork.get(stuck, timeout=30) == b"timed out"


@lightwork.remote
def from_the_first_session(i):
    return i


def test_a_new_session_on_the_same_cluster_sees_only_its_own_tasks(cluster):
    """Drivers one after another on one cluster: what the workers stamped for a session
    that ended before pulling it never reaches the next session's log (the stamps are
    kept per session and the end of a session drops its own)."""
    lightwork.get([from_the_first_session.remote(i) for i in range(8)])
    lightwork.shutdown()  # at once: the workers still hold these stamps
    lightwork.init(address=cluster.scheduler_file)
    refs = [slow_add.remote(i) for i in range(4)]
    lightwork.get(refs)
    records = lightwork.diagnostics.task_records()
    assert sorted(r.name.rsplit(".", 1)[-1] for r in records) == ["slow_add"] * 4
    events = lightwork.timeline()
    check_trace(events)  # one flow arrow per task
    assert not [e for e in events if "from_the_first_session" in str(e.get("name"))]


OTHER_DRIVER = """
import json, sys, time
import lightwork

@lightwork.remote
def theirs(i):
    time.sleep(0.01)
    return i

lightwork.init(address=sys.argv[1])
for _ in range(6):
    lightwork.get([theirs.remote(i) for i in range(5)])
    time.sleep(0.2)  # the other driver pulls meanwhile
records = lightwork.diagnostics.task_records()
print(json.dumps(sorted(r.name.rsplit(".", 1)[-1] for r in records)))
lightwork.shutdown()
"""


def test_two_drivers_at_once_on_one_cluster_each_log_only_their_own(cluster, tmp_path):
    """Two drivers at once: each driver's pulls take only its own stamps, so neither
    steals the other's tasks (which would leave them unreported there)."""
    script = write_script(str(tmp_path), "other_driver.py", OTHER_DRIVER)
    other = subprocess.Popen([sys.executable, script, cluster.scheduler_file],
                             env=script_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        ours = 0
        while other.poll() is None and ours < 400:
            lightwork.get([slow_add.remote(i) for i in range(2)])
            ours += 2
            lightwork.diagnostics.task_records()  # a pull, while the other driver runs
        out, err = other.communicate(timeout=30)
    finally:
        if other.poll() is None:
            other.kill()
            other.communicate()
    assert other.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == ["theirs"] * 30
    names = {r.name.rsplit(".", 1)[-1] for r in lightwork.diagnostics.task_records()}
    assert "theirs" not in names and "slow_add" in names


@lightwork.remote
def nested_inner(x):
    return x * 2


@lightwork.remote
def nested_outer(x):
    return lightwork.get(nested_inner.remote(x))


@lightwork.remote
class NestingActor:
    async def submit(self, x):
        return await nested_inner.remote(x)


def test_nested_submissions_are_logged_by_the_driver_that_started_them(cluster):
    """A task's or an async actor's own submissions carry its driver's session, so
    their stamps reach that driver's log."""
    actor = NestingActor.remote()
    assert lightwork.get([nested_outer.remote(1), actor.submit.remote(2)]) == [2, 4]
    deadline = time.monotonic() + 10
    while len(records_named("nested_inner")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the nested tasks' stamps may come a pull after their callers'
    assert len(records_named("nested_inner")) == 2
    lightwork.kill(actor)


def test_take_keeps_each_sessions_reports_apart():
    for session in (1, 2):
        cluster_record.forget(session=session)
    cluster_record.note(1, 10, "mine", 0, 1.0, 1.0, 2.0, 2.0, None)
    cluster_record.note(2, 20, "theirs", 0, 1.0, 1.0, 2.0, 2.0, None)
    assert [r[0] for r in cluster_record.take(session=1)["reports"]] == [10]
    cluster_record.forget(session=2)  # its driver ended
    assert cluster_record.take(session=2)["reports"] == []
    for session in range(100, 100 + cluster_record.MAX_SESSIONS + 1):  # drivers that died
        cluster_record.note(session, 1, "f", 0, 1.0, 1.0, 2.0, 2.0, None)
    assert len(cluster_record._reports) <= cluster_record.MAX_SESSIONS
    assert cluster_record.take(session=100)["reports"] == []  # the oldest ring went


def test_event_budget_zero_turns_the_cluster_log_off(cluster):
    lightwork.shutdown()  # the module's session; a session of its own with the log off
    try:
        lightwork.init(address=cluster.scheduler_file, event_budget=0)
        assert lightwork.get(slow_add.remote(1)) == 1
        with pytest.raises(exceptions.UnsupportedOnBackend, match="event_budget=0"):
            lightwork.timeline()
    finally:
        lightwork.shutdown()


# ---- the clock, without a cluster -------------------------------------------------------
class _FakeBackend:
    client = None

    def resources(self):
        return {"CPU": 2.0}, {"CPU": 2.0}


def test_worker_times_are_shifted_by_the_best_round_trips_offset():
    log = cluster_record.ClusterLog(_FakeBackend(), budget=10)
    log.submitted(7, "f", None, 10)
    submitted = log.tasks[7].record.submitted
    wall = log.log.started_at_wall + (submitted - log.log.started_at)  # driver's wall then
    skew = 100.0  # the worker's clock runs 100 s ahead
    reply = {"pid": 42, "now": wall + skew + 1.0, "dropped": 0, "reports": [
        (7, "f", 0, wall + skew + 0.5, wall + skew + 0.6, wall + skew + 0.9,
         wall + skew + 0.95, None, ())]}
    log._merge("tcp://w:1", reply, wall + 0.99, wall + 1.01)  # a 20 ms round trip
    [record] = log.log.ended_records()
    assert record.started == pytest.approx(submitted + 0.5, abs=0.02)
    assert record.stored == pytest.approx(submitted + 0.95, abs=0.02)
    assert record.pid == 42 and record.worker_id == 1 and not log.tasks
    # a later, slower round trip does not replace the better estimate
    log._merge("tcp://w:1", {**reply, "now": wall + skew + 5.0, "reports": []},
               wall + 1.0, wall + 3.0)
    assert log._offsets["tcp://w:1"][0] == pytest.approx(0.02)


def test_a_start_before_its_submission_is_clamped():
    log = cluster_record.ClusterLog(_FakeBackend(), budget=10)
    log.submitted(1, "f", None, 0)
    submitted = log.tasks[1].record.submitted
    wall = log.log.started_at_wall + (submitted - log.log.started_at)
    reply = {"pid": 1, "now": wall, "dropped": 3, "reports": [
        (1, "f", 0, wall - 0.01, wall, wall + 0.1, wall + 0.1, None, ())]}
    log._merge("tcp://w:1", reply, wall, wall)
    [record] = log.log.ended_records()
    assert record.started == pytest.approx(submitted)
    assert record.finished - record.started == pytest.approx(0.11)
    assert log.log.dropped_tasks == 3


def test_calls_one_after_another_keep_their_order_across_pulls():
    """A later pull's better clock estimate (here: the worker is 10 ms ahead, not 0) never
    puts a call before the one it followed, and applies in full to later stamps."""
    log = cluster_record.ClusterLog(_FakeBackend(), budget=10)
    for task_id in (1, 2, 3):
        log.submitted(task_id, "f", None, 0)
    submitted = log.tasks[1].record.submitted
    wall = log.log.started_at_wall + (submitted - log.log.started_at)

    def call(task_id, start, end):
        return (task_id, "f", 7, wall + start, wall + start, wall + end, wall + end, None, ())

    log._merge("tcp://w:1", {"pid": 1, "now": wall + 0.52, "dropped": 0,
                             "reports": [call(1, 0.1, 0.2)]}, wall + 0.5, wall + 0.54)
    log._merge("tcp://w:1", {"pid": 1, "now": wall + 1.011, "dropped": 0,
                             "reports": [call(2, 0.2005, 0.3), call(3, 0.5, 0.6)]},
               wall + 1.0, wall + 1.002)
    first, second, third = sorted(log.log.ended_records(), key=lambda r: r.task_id)
    assert first.finished == pytest.approx(submitted + 0.2)
    assert first.finished <= second.started <= second.finished <= third.started
    assert third.started == pytest.approx(submitted + 0.49)  # the better estimate


def test_a_reports_size_and_transfers_are_put_on_the_driver_clock():
    log = cluster_record.ClusterLog(_FakeBackend(), budget=10)
    log.submitted(3, "f", None, 10)
    submitted = log.tasks[3].record.submitted
    wall = log.log.started_at_wall + (submitted - log.log.started_at)
    skew = 50.0  # the worker's clock runs 50 s ahead
    fetch = (wall + skew + 0.1, wall + skew + 0.3, "tcp://other:2", 4096)
    reply = {"pid": 9, "now": wall + skew + 1.0, "dropped": 0, "reports": [
        (3, "f", 0, wall + skew + 0.4, wall + skew + 0.5, wall + skew + 0.6,
         wall + skew + 0.7, None, (), 1234, (fetch,))]}
    log._merge("tcp://w:1", reply, wall + 0.99, wall + 1.01)
    [record] = log.log.ended_records()
    assert record.result_size == 1234
    [transfer] = log.transfers
    assert transfer.task_id == 3 and transfer.worker_id == record.worker_id
    assert transfer.source == "tcp://other:2" and transfer.nbytes == 4096
    assert transfer.start == pytest.approx(submitted + 0.1, abs=0.02)
    assert transfer.stop == pytest.approx(submitted + 0.3, abs=0.02)
    from lightwork.diagnostics.timeline import build_trace

    trace = build_trace(log.timeline_data())
    check_trace(trace)
    [span] = spans(trace, name="transfer", cat="transfer")
    assert span["args"] == {"task_id": 3, "bytes": 4096, "from": "tcp://other:2"}
    assert span["dur"] == pytest.approx(200_000, abs=1)  # microseconds


def test_transfers_into_reads_the_running_tasks_fetches_and_their_bytes(monkeypatch):
    import distributed

    from lightwork.engines.distributed import worker as cluster_worker

    assert cluster_worker.transfers_into() == ()  # outside a Dask task
    fetched = {"action": "transfer", "start": 110.0, "stop": 110.5, "source": "tcp://a:1"}
    forgotten = {"action": "transfer", "start": 111.0, "stop": 111.2, "source": "tcp://b:2"}
    task = types.SimpleNamespace(startstops=[
        fetched, {"action": "compute", "start": 100.0, "stop": 101.0}, forgotten])
    worker = types.SimpleNamespace(
        scheduler_delay=10.0, get_current_task=lambda: "k",
        state=types.SimpleNamespace(tasks={"k": task}),
        transfer_incoming_log=[{"start": 110.0, "who": "tcp://b:2", "total": 1},
                               {"start": 110.0, "who": "tcp://a:1", "total": 5000}])
    monkeypatch.setattr(distributed, "get_worker", lambda: worker)
    assert cluster_worker.transfers_into() == (
        (100.0, 100.5, "tcp://a:1", 5000),  # on the worker's own clock
        (101.0, 101.2, "tcp://b:2", 0))  # its log entry is gone: bytes unknown
    del worker.transfer_incoming_log  # a distributed without it: bytes unknown, no error
    assert [t[3] for t in cluster_worker.transfers_into()] == [0, 0]


def test_take_hands_each_report_out_once():
    cluster_record.take(session=5)
    for i in range(3):
        cluster_record.note(5, i, "g", 0, 1.0, 1.0, 2.0, 2.0, None)
    reply = cluster_record.take(session=5)
    assert [r[0] for r in reply["reports"]] == [0, 1, 2] and reply["dropped"] == 0
    assert cluster_record.take(session=5)["reports"] == []


