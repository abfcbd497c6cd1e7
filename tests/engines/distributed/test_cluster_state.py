"""The state API and the ``lightwork`` command on the distributed backend, against a real
cluster (``dask scheduler`` plus two single-thread ``dask worker`` processes).

The listings read the scheduler and the workers through the engine
(``engines/distributed/state.py``); the command attaches to a driver running on the cluster
through the same control socket as a local session (``engines/distributed/control.py``):
here the driver is a real program in another process, ``import lightwork as ray`` with
the cluster's address, and every command is another process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests import helpers, support
import pytest
from tests.dask_cluster import DaskCluster

import lightwork
from lightwork import exceptions

pytestmark = pytest.mark.lightwork_only
pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")


@pytest.fixture(scope="module")
def cluster(shared_dask_cluster):
    if lightwork.is_initialized():
        lightwork.shutdown()
    lightwork.init(address=shared_dask_cluster.scheduler_file)
    try:
        shared_dask_cluster.wait_for_workers(support.cluster_client())
    finally:
        lightwork.shutdown()
    try:
        yield shared_dask_cluster
    finally:
        if lightwork.is_initialized():
            lightwork.shutdown()


@pytest.fixture
def connected(cluster):
    lightwork.init(address=cluster.scheduler_file)
    try:
        yield cluster
    finally:
        lightwork.shutdown()


@lightwork.remote
def parked(path, size=10):
    while not os.path.exists(path):
        time.sleep(0.02)
    return b"r" * size


@lightwork.remote
def after(value):
    return len(value)


@lightwork.remote
class Counter:
    def __init__(self):
        self.n = 0

    def bump(self):
        self.n += 1
        return self.n


def until(predicate, timeout=30.0):
    """``helpers.wait_until`` with a long wait (on a loaded host the workers' reports can
    take seconds), naming the condition by its function and line."""
    where = getattr(predicate, "__code__", None)
    message = f"{predicate.__name__} (line {where.co_firstlineno if where else '?'})"
    return helpers.wait_until(predicate, timeout, 0.05, message)


def test_listings_mean_what_they_mean_locally(connected, tmp_path):
    cluster = connected
    gate = str(tmp_path / "gate")
    counter = Counter.options(name="counter").remote()
    assert lightwork.get([counter.bump.remote() for _ in range(3)]) == [1, 2, 3]
    blob = lightwork.put(b"x" * 200_000)
    running = parked.remote(gate, 50_000)
    waiting = after.remote(running)  # waits for an argument
    try:
        rows = until(lambda: [r for r in lightwork.state.list_tasks()
                              if r["name"].endswith("parked") and r["state"] == "RUNNING"])
        pids = set(cluster.worker_pids())
        assert rows[0]["pid"] in pids and rows[0]["worker_id"] > 0
        # Listed once the scheduler has the submission (on a loaded machine it may come
        # after the parked task is seen running; until then no state of its own is known).
        [pending] = until(lambda: [r for r in lightwork.state.list_tasks(name="after")
                                   if r["state"] == "PENDING_ARGS_AVAIL"])

        workers = lightwork.state.list_workers()
        assert [w["kind"] for w in workers] == ["driver", "task", "task"]
        assert workers[0]["pid"] == os.getpid() and workers[0]["worker_id"] == 0
        assert {w["pid"] for w in workers[1:]} == pids
        assert all(w["address"].startswith("tcp://127.0.0.1:") for w in workers[1:])
        busy = [w for w in workers[1:] if w["state"] == "RUNNING"]
        assert len(busy) == 1 and busy[0]["running"].endswith("parked")
        assert busy[0]["worker_id"] == rows[0]["worker_id"]  # the same numbering as tasks
        assert busy[0]["task_id"] == rows[0]["task_id"]
        assert all(w["rss"] > 10e6 and w["alive_s"] > 0 for w in workers[1:])
        assert [w["pid"] for w in lightwork.state.list_workers(state="RUNNING")] == [
            busy[0]["pid"]]

        [actor] = lightwork.state.list_actors()
        assert actor["class_name"].endswith("Counter") and actor["name"] == "counter"
        assert actor["state"] == "ALIVE" and actor["calls_done"] == 3
        assert actor["pid"] in pids and actor["address"].startswith("tcp://")

        objects = {o["object_id"]: o for o in lightwork.state.list_objects()}
        put_row = objects[blob.hex()]
        assert put_row["task_name"] == "(put)" and put_row["state"] == "READY"
        assert put_row["size"] >= 200_000 and put_row["location"].startswith("worker tcp://")
        running_row = objects[running.hex()]
        assert running_row["state"] == "PENDING"
        assert "USED_BY_PENDING_TASK" in running_row["reference_kinds"]
        assert objects[counter._ref.hex()]["reference_kind"] == "ACTOR_HANDLE"

        memory = lightwork.state.memory_summary()
        assert memory["objects"] == len(objects) and memory["total_bytes"] >= 200_000
        assert memory["largest"][0]["object_id"] == blob.hex()

        status = lightwork.state.status()
        assert status["worker_count"] == 2 and status["actors"] == {"ALIVE": 1}
        assert status["tasks"]["running"] == 1 and status["tasks"]["waiting_for_args"] == 1
        assert status["resources"]["total"]["CPU"] == 2.0
    finally:
        open(gate, "w").close()
    assert lightwork.get(waiting) == 50_000


@lightwork.remote
def holds_while_parked(boxed, path):
    """Borrows ``boxed[0]`` (a ref inside a list stays a ref) until the gate opens."""
    while not os.path.exists(path):
        time.sleep(0.02)
    return len(lightwork.get(boxed[0]))


@lightwork.remote
def child(path):
    while not os.path.exists(path):
        time.sleep(0.02)
    return b"c" * 3000


@lightwork.remote
def parent(path):
    """Submits a child from its worker and holds its ref until the child ends."""
    return len(lightwork.get(child.remote(path)))


@lightwork.remote
class Keeper:
    """Keeps a borrowed ref in its state, and an actor of its own."""

    def __init__(self, boxed):
        self.kept = boxed
        self.inner = Counter.remote()

    def inner_bumps(self):
        return lightwork.get(self.inner.bump.remote())

    def inner_id(self):
        return self.inner._ref.hex()


def _held_by_other_sessions(backend):
    """What the workers hold for a session tag that is not ours."""
    from lightwork.engines.distributed.worker import held_refs

    replies = backend.client.run(held_refs, session=backend.session_tag + 1)
    return [entry for reply in replies.values() for entry in reply["refs"] + reply["actors"]]


def test_objects_and_actors_held_on_the_workers_are_listed_with_their_owners(connected,
                                                                             tmp_path):
    gate = str(tmp_path / "gate")
    backend = support.backend()
    # The actors first, while both worker threads are free: distributed may place an
    # actor's creation on a worker whose one thread a parked task holds, where it would
    # wait for the gate (this hung the test now and then).
    keeper_blob = lightwork.put(b"k" * 50_000)
    keeper = Keeper.remote([keeper_blob])
    keeper_blob_hex = keeper_blob.hex()
    del keeper_blob  # only the actor's state holds it now
    assert lightwork.get(keeper.inner_bumps.remote()) == 1
    inner_hex = lightwork.get(keeper.inner_id.remote())
    borrowed = lightwork.put(b"b" * 100_000)
    borrowed_hex = borrowed.hex()
    holding = holds_while_parked.remote([borrowed], gate)
    del borrowed  # only the task holds it now
    outer = parent.remote(gate)
    try:
        workers = {w["worker_id"]: w for w in lightwork.state.list_workers()[1:]}
        labels = {f"worker {wid}" for wid in workers}

        def child_listed():
            rows = {o["object_id"]: o for o in lightwork.state.list_objects()}
            made_by_child = [o for o in rows.values()
                             if (o["task_name"] or "").endswith("child")]
            return (rows, made_by_child) if made_by_child and borrowed_hex in rows else None

        objects, [child_row] = until(child_listed)
        row = objects[borrowed_hex]  # a driver's put, held by the parked task only
        assert row["owner"] == "driver" and row["size"] >= 100_000
        assert len(row["holders"]) == 1 and row["holders"][0] in labels
        kept = objects[keeper_blob_hex]  # held by the actor's state only
        assert kept["owner"] == "driver" and kept["holders"][0] in labels
        # The child's ref: made (owned) by the worker running its parent, held there.
        assert child_row["owner"] in labels and child_row["holders"] == [child_row["owner"]]
        assert child_row["state"] == "PENDING"
        assert objects[keeper._ref.hex()]["owner"] == "driver"

        actors = {a["actor_id"]: a for a in lightwork.state.list_actors()}
        assert actors[keeper._ref.hex()]["owner"] == "driver"
        inner = actors[inner_hex]  # created by the Keeper, in its worker's process
        assert inner["class_name"].endswith("Counter") and inner["state"] == "ALIVE"
        assert inner["owner"] in labels and inner["calls_done"] == 1
        assert inner["address"] in {w["address"] for w in workers.values()}
        assert [a["actor_id"] for a in actors.values() if a["owner"] == "driver"] == [
            keeper._ref.hex()]

        memory = lightwork.state.memory_summary()
        assert {g["owner"] for g in memory["by_owner"]} >= {"driver", child_row["owner"]}
        # Another session's view of the same workers has none of it.
        assert _held_by_other_sessions(backend) == []
    finally:
        open(gate, "w").close()
    assert lightwork.get([holding, outer]) == [100_000, 3000]
    lightwork.kill(keeper)
    # What the tasks held is let go with them; the killed actor's state goes with it.
    until(lambda: borrowed_hex not in {o["object_id"] for o in lightwork.state.list_objects()})


@lightwork.remote
def sized(n):
    return b"s" * n


@lightwork.remote
def wraps_its_own(path):
    """Returns refs it made (a put, a child's result) inside its result; writes their ids."""
    inner = [lightwork.put(b"p" * 60_000), sized.remote(2000)]
    with open(path, "w") as f:
        f.write(" ".join(ref.hex() for ref in inner))
    return inner


@lightwork.remote
def produce(n):
    for i in range(n):
        yield b"g" * 1000 * (i + 1)


@lightwork.remote
def reads_a_stream(path, gate):
    """Holds the first item of a generator it reads until the gate opens."""
    first = next(produce.remote(3))
    with open(path + ".tmp", "w") as f:
        f.write(first.hex())
    os.rename(path + ".tmp", path)
    while not os.path.exists(gate):
        time.sleep(0.02)
    return len(lightwork.get(first))


def test_refs_inside_results_and_items_read_by_a_task_are_listed(connected, tmp_path):
    inner_file, item_file, gate = (str(tmp_path / n) for n in ("inner", "item", "gate"))
    outer = wraps_its_own.remote(inner_file)
    assert lightwork.wait([outer], timeout=30)[0] == [outer]  # not read: nothing borrowed
    reading = reads_a_stream.remote(item_file, gate)
    try:
        until(lambda: os.path.exists(item_file))
        inner = open(inner_file).read().split()
        with open(item_file) as f:
            item = f.read()
        rows = {o["object_id"]: o for o in lightwork.state.list_objects()}
        labels = {f"worker {w['worker_id']}" for w in lightwork.state.list_workers()[1:]}
        for hex_id in inner:  # kept only by the result they are inside
            row = rows[hex_id]
            assert row["reference_kind"] == "CAPTURED_IN_OBJECT", row
            assert row["contained_in"] == 1 and row["holders"] == [] and row["owner"] in labels
            assert row["state"] == "READY"
        assert rows[inner[0]]["task_name"] == "(put)" and rows[inner[0]]["size"] >= 60_000
        assert rows[inner[1]]["task_name"].endswith("sized")
        assert rows[outer.hex()]["holders"] == ["driver"]
        # The generator's item, held by the task reading it (its consumer thread filed it).
        assert rows[item]["holders"][0] in labels and rows[item]["size"] >= 1000
        assert rows[item]["reference_kind"] == "LOCAL_REFERENCE"
    finally:
        open(gate, "w").close()
    assert lightwork.get(reading, timeout=30) == 1000
    del outer  # the result goes, and the refs inside it with it
    until(lambda: not set(inner) & {o["object_id"] for o in lightwork.state.list_objects()})


@lightwork.remote
def lists_from_a_task():
    try:
        lightwork.state.list_tasks()
    except exceptions.UnsupportedOnBackend as exc:
        return str(exc)
    return "no error"


def test_the_state_api_inside_a_task_says_where_to_call_it(connected):
    message = lightwork.get(lists_from_a_task.remote())
    assert "inside a task is not supported on the distributed backend" in message
    assert "from the driver" in message


def test_a_killed_actor_is_listed_dead(connected):
    counter = Counter.remote()
    assert lightwork.get(counter.bump.remote()) == 1
    lightwork.kill(counter)
    [row] = [a for a in lightwork.state.list_actors() if a["actor_id"] == counter._ref.hex()]
    assert row["state"] == "DEAD" and "killed" in row["death_cause"]


def test_bad_filters_say_what_to_do(connected):
    with pytest.raises(ValueError, match="unknown filter key 'colour'"):
        lightwork.state.list_workers(colour="red")
    with pytest.raises(ValueError, match="cannot list 'gadgets'"):
        lightwork.state.query("list", kind="gadgets")


# ---- the command from another terminal ------------------------------------------------
# What both driver scripts below run: a task parked until a gate file appears (its marker
# function shows in stacks), and an actor.
DRIVER_REMOTES = """@ray.remote
def parked(path):
    def lightwork_cli_marker():
        while not os.path.exists(path):
            time.sleep(0.02)
    lightwork_cli_marker()
    return True

@ray.remote
class Tally:
    def add(self, n):
        return n
"""

DRIVER = """
import os, sys, time
import lightwork as ray

context = ray.init(address={address!r})

@ray.remote
def square(x):
    return x * x

""" + DRIVER_REMOTES + """
tally = Tally.remote()
ray.get([square.remote(i) for i in range(6)] + [tally.add.remote(1)])
blob = ray.put(b"x" * 300_000)
gate = sys.argv[1]
waiting = parked.remote(gate)
print("SOCKET", os.path.join(context["session_dir"], "control.sock"), flush=True)
while not os.path.exists(gate):
    time.sleep(0.02)
ray.get(waiting)
session_dir = context["session_dir"]
ray.shutdown()
assert not os.path.exists(session_dir), "the session directory outlived shutdown"
print("DONE", flush=True)
"""


@pytest.fixture(scope="module")
def driver(cluster):
    info = helpers.start_session_driver(DRIVER.format(address=cluster.address))
    yield info
    helpers.stop_session_driver(info)


def command(info, *args):
    return subprocess.run([sys.executable, "-m", "lightwork", *args], env=info["env"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_command_attaches_to_a_driver_on_the_cluster(driver, cluster, tmp_path):
    assert os.stat(driver["socket"]).st_mode & 0o777 == 0o600
    status = command(driver, "status", "--format", "json")
    assert status.returncode == 0, status.stderr
    facts = json.loads(status.stdout)
    assert facts["driver_pid"] == driver["pid"] and facts["backend"] == "distributed"
    assert facts["worker_count"] == 2 and facts["tasks"]["finished"] >= 7

    table = command(driver, "status")
    assert table.returncode == 0 and "workers    2" in table.stdout, table.stdout + table.stderr
    assert f"cluster    {cluster.address}" in table.stdout

    workers = command(driver, "list", "workers", "--format", "json")
    rows = json.loads(workers.stdout)
    assert {r["pid"] for r in rows[1:]} == set(cluster.worker_pids())

    for kind in ("tasks", "actors", "objects"):
        listed = command(driver, "list", kind)
        assert listed.returncode == 0, listed.stderr
    assert "Tally" in command(driver, "list", "actors").stdout
    assert "square" in command(driver, "summary", "tasks").stdout
    advice = command(driver, "advise", "--format", "json")
    assert advice.returncode == 0 and isinstance(json.loads(advice.stdout), list), advice.stderr
    memory = command(driver, "memory")
    assert memory.returncode == 0 and "(put)" in memory.stdout, memory.stderr

    trace = tmp_path / "trace.json"
    timeline = command(driver, "timeline", "-o", str(trace))
    assert timeline.returncode == 0, timeline.stderr
    from tests.diagnostics.test_timeline import check_trace, load_trace

    events = load_trace(str(trace))
    check_trace(events)
    assert any(e.get("name") == "square" and e.get("ph") == "X" for e in events)

    def stack_with_marker():
        result = command(driver, "stack")
        return result if "lightwork_cli_marker" in result.stdout else None

    stack = until(stack_with_marker)
    assert stack.stdout.count("=== worker ") == 2


# A driver with the event log off, reaching the cluster through LIGHTWORK_ADDRESS only.
QUIET_DRIVER = """
import os, sys, time
import lightwork as ray

context = ray.init(event_budget=0)  # the address comes from LIGHTWORK_ADDRESS
assert ray.backend() == "distributed", ray.backend()

""" + DRIVER_REMOTES + """
tally = Tally.remote()
assert ray.get(tally.add.remote(1)) == 1
blob = ray.put(b"x" * 300_000)
waiting = parked.remote(sys.argv[1])
print("SOCKET", os.path.join(context["session_dir"], "control.sock"), flush=True)
ray.get(waiting)
ray.shutdown()
print("DONE", flush=True)
"""


def test_the_command_attaches_with_the_event_log_off(cluster, monkeypatch):
    """As on a local session: event_budget=0 turns off the task records, not the command.
    The scheduler was started with --no-dashboard: the status names no Dask dashboard
    (its HTTP server is up all the same)."""
    monkeypatch.setenv("LIGHTWORK_ADDRESS", cluster.address)
    info = helpers.start_session_driver(QUIET_DRIVER)
    try:
        facts = json.loads(command(info, "status", "--format", "json").stdout)
        assert facts["backend"] == "distributed" and facts["address"] == cluster.address
        assert facts["worker_count"] == 2 and facts["event_log"]["budget"] == 0
        assert facts["dask_dashboard"] is None
        table = command(info, "status")
        assert table.returncode == 0 and f"cluster    {cluster.address}\n" in table.stdout
        assert "Dask dashboard" not in table.stdout

        rows = json.loads(command(info, "list", "workers", "--format", "json").stdout)
        assert {r["pid"] for r in rows[1:]} == set(cluster.worker_pids())
        assert "Tally" in command(info, "list", "actors").stdout
        memory = command(info, "memory")
        assert memory.returncode == 0 and "(put)" in memory.stdout, memory.stderr
        for verb in (("list", "tasks"), ("summary", "tasks"), ("timeline",)):
            refused = command(info, *verb)
            assert refused.returncode != 0 and "event_budget=0" in refused.stderr, (
                verb, refused.stdout, refused.stderr)

        def stack_with_marker():
            result = command(info, "stack")
            return result if "lightwork_cli_marker" in result.stdout else None

        assert until(stack_with_marker).stdout.count("=== worker ") == 2
    finally:
        helpers.stop_session_driver(info)


def test_the_dask_dashboard_is_named_only_when_the_scheduler_serves_it():
    import distributed

    from lightwork.engines.distributed.state import _dashboard_link

    for address, served in (("127.0.0.1:0", True), (None, False)):
        with distributed.LocalCluster(n_workers=0, processes=False,
                                      dashboard_address=address) as local, \
                distributed.Client(local) as client:
            link = _dashboard_link(client)
            assert (link == client.dashboard_link) if served else link is None, (address, link)
            if served:
                assert link.endswith("/status")


def test_a_stopped_scheduler_makes_diagnostics_fail_fast_and_say_why(tmp_path):
    import signal

    if lightwork.is_initialized():
        lightwork.shutdown()
    cluster = DaskCluster(str(tmp_path), workers=1).start()
    try:
        lightwork.init(address=cluster.scheduler_file)
        assert lightwork.get(after.remote(b"abc")) == 3
        cluster.processes[0].send_signal(signal.SIGKILL)  # the scheduler
        until(lambda: support.cluster_client().status != "running")
        log = support.recorder()
        dashboard_sync = lambda: log.answer_query("dashboard_sync", {})  # noqa: E731
        for call in (lightwork.state.status, lightwork.state.list_workers,
                     lightwork.state.list_tasks, lightwork.diagnostics.task_records,
                     dashboard_sync):
            start = time.monotonic()
            with pytest.raises(exceptions.RuntimeSystemError, match="does not answer.*shutdown"):
                call()
            assert time.monotonic() - start < 5, call  # not the client's reconnect timeout
    finally:
        lightwork.shutdown()
        assert not cluster.stop()
