"""The cluster backend across simulated hosts: what crosses a network, crossing one.

Three hosts on one machine (``tests/hosts.py``: a network namespace each, with its own
``/tmp`` and ``/dev/shm``, on a bridge): host A runs ``dask scheduler`` and the
driver, B and C one ``dask worker`` each (2 threads, ``CPU=2`` and a resource naming
the host, so a test can place a task on one). Every driver is a script run on host A;
it prints one JSON line of facts that the test checks. Nothing here can pass through
a shared ``/dev/shm`` or ``/tmp``: a value or a control socket that a test finds on the
other side crossed the network.

What is covered: large values both ways, a ref borrowed by a task on another host,
actors called from the driver and from a task on the other host, a worker process
killed mid-task and its task retried, the CLI on the driver's host (and not on
another), and the timeline's clock across hosts. One test runs on links of 1 ms each
way (``tests/wire.py``), so that nothing in the backend assumes a sub-millisecond
network: its timeouts, its batching, its waits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from tests import helpers, hosts

pytestmark = pytest.mark.lightwork_only
pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")

WHY_NOT = hosts.skip_reason()
if WHY_NOT:
    pytest.skip(WHY_NOT, allow_module_level=True)

DASK = os.path.join(os.path.dirname(sys.executable), "dask")
PORT = 8786


class HostCluster:
    def __init__(self, delay_ms: float = 0) -> None:
        self.hosts = hosts.SimulatedHosts(("a", "b", "c"), delay_ms=delay_ms)
        self.logs = tempfile.mkdtemp(prefix="lwhosts-", dir="/var/tmp")
        self.env = helpers.script_env()
        self.env["DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES"] = "0"
        self.nannies: dict[str, subprocess.Popen] = {}

    @property
    def address(self) -> str:
        return f"tcp://{self.hosts.address('a')}:{PORT}"

    def _spawn(self, host: str, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(os.path.join(self.logs, f"{name}.log"), "wb")
        try:
            return self.hosts.popen(host, argv, stdout=log, stderr=subprocess.STDOUT,
                                    env=self.env)
        finally:
            log.close()

    def start(self) -> HostCluster:
        self.hosts.start()
        self._spawn("a", "scheduler", [DASK, "scheduler", "--host", self.hosts.address("a"),
                                       "--port", str(PORT), "--no-dashboard"])
        for host in ("b", "c"):
            self.nannies[host] = self._spawn(host, f"worker-{host}", [
                DASK, "worker", self.address, "--host", self.hosts.address(host),
                "--nthreads", "2", "--resources", f"CPU=2,host_{host}=1", "--no-dashboard",
                "--name", f"w{host}"])
        # Inside the test timeout (60 s, stacks at 50): a cluster that cannot start fails
        # with its logs, not with the run's timeout.
        deadline = time.monotonic() + 35
        while not all(self._registered(host) for host in ("b", "c")):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster on simulated hosts did not start:\n"
                                   + self.log_tails())
            if any(p.poll() is not None for p in self.hosts.processes):
                raise RuntimeError("a dask process on a simulated host exited at start:\n"
                                   + self.log_tails())
            time.sleep(0.2)
        return self

    def log_tails(self) -> str:
        tails = []
        for name in sorted(os.listdir(self.logs)):
            with open(os.path.join(self.logs, name), "rb") as f:
                tails.append(f"--- {name}\n" + f.read()[-2000:].decode(errors="replace"))
        return "\n".join(tails)

    def _registered(self, host: str) -> bool:
        with open(os.path.join(self.logs, f"worker-{host}.log"), "rb") as f:
            return b"Registered to:" in f.read()

    def drive(self, body: str, timeout: float = 120) -> dict:
        """Run a driver script on host A; the facts it printed as its last JSON line."""
        script = PRELUDE.format(address=self.address, scheduler=self.hosts.address("a")) + body
        done = self.hosts.run("a", [sys.executable, "-c", script], timeout=timeout,
                              env=self.env)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        self.hosts.stop()
        shutil.rmtree(self.logs, ignore_errors=True)


PRELUDE = """
import json, os, socket, sys, time
import lightwork

lightwork.init(address={address!r})

def host_of():
    # this host's address on the bridge (a UDP "connect" sends nothing): .2 is host B
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect(({scheduler!r}, 9))
    try:
        return probe.getsockname()[0]
    finally:
        probe.close()

def report(**facts):
    print(json.dumps(facts), flush=True)
"""


def host_cluster(delay_ms: float = 0):
    built = HostCluster(delay_ms)
    try:
        yield built.start()
    finally:
        built.stop()


@pytest.fixture(scope="module")
def cluster():
    yield from host_cluster()


def test_tasks_run_on_both_worker_hosts_and_large_values_cross(cluster):
    facts = cluster.drive("""
import numpy as np

@lightwork.remote
def double(array):
    return host_of(), float(array.sum()), array * 2

array = np.arange(8 << 20, dtype=np.float64)  # 64 MB
ref = lightwork.put(array)
out = {}
for host in ("b", "c"):
    where, total, doubled = lightwork.get(
        double.options(resources={"host_" + host: 1}).remote(ref), timeout=60)
    out[host] = [where, total == float(array.sum()), bool((doubled == array * 2).all())]
# Small results come back by the workers' replies, from the other hosts too.
from lightwork.kernel import backend
replies = backend.installed().replies
before = replies.received
small = [lightwork.get(double.options(resources={"host_" + host: 1}).remote(np.ones(4)),
                       timeout=60)[0] for host in ("b", "c")]
report(out=out, small=small, replied=replies.received - before)
""")
    b, c = cluster.hosts.address("b"), cluster.hosts.address("c")
    assert facts["out"] == {"b": [b, True, True], "c": [c, True, True]}
    assert (facts["small"], facts["replied"]) == ([b, c], 2)


def test_a_ref_made_on_one_host_is_read_on_another(cluster):
    facts = cluster.drive("""
import numpy as np

@lightwork.remote
def make():
    return [lightwork.put(np.full(2 << 20, 3.0))], host_of()  # 16 MB, owned on its host

@lightwork.remote
def read(refs):
    return float(lightwork.get(refs[0]).sum()), host_of()

refs, made_on = lightwork.get(make.options(resources={"host_b": 1}).remote(), timeout=60)
total, read_on = lightwork.get(read.options(resources={"host_c": 1}).remote(refs), timeout=60)
report(made_on=made_on, read_on=read_on, total=total,
       driver_total=float(lightwork.get(refs[0], timeout=60).sum()))
""")
    assert facts["made_on"] == cluster.hosts.address("b")
    assert facts["read_on"] == cluster.hosts.address("c")
    assert facts["total"] == facts["driver_total"] == 3.0 * (2 << 20)


def test_an_actor_on_one_host_is_called_from_the_driver_and_the_other_host(cluster):
    facts = cluster.drive("""
@lightwork.remote
class Log:
    def __init__(self):
        self.items = []
    def add(self, item):
        self.items.append(item)
        return host_of()
    def read(self):
        return self.items

@lightwork.remote
def add_from_task(log, items):
    for item in items:
        lightwork.get(log.add.remote(item))
    return host_of()

log = Log.options(resources={"host_b": 1}).remote()
first = [lightwork.get(log.add.remote(i), timeout=60) for i in range(3)]
task_on = lightwork.get(add_from_task.options(resources={"host_c": 1}).remote(log, [3, 4]),
                        timeout=60)
report(actor_on=sorted(set(first)), task_on=task_on,
       items=lightwork.get(log.read.remote(), timeout=60))
""")
    assert facts["actor_on"] == [cluster.hosts.address("b")]
    assert facts["task_on"] == cluster.hosts.address("c")
    assert facts["items"] == [0, 1, 2, 3, 4]


def test_a_worker_killed_mid_task_and_its_task_retried(cluster):
    facts = cluster.drive("""
import signal

@lightwork.remote
class Attempts:
    def __init__(self):
        self.pids = []
    def started(self, pid):
        self.pids.append(pid)
    def read(self):
        return self.pids

@lightwork.remote(max_retries=2)
def slow(attempts):
    lightwork.get(attempts.started.remote(os.getpid()))
    if len(lightwork.get(attempts.read.remote())) == 1:
        time.sleep(60)  # the first attempt: killed here
    return host_of(), os.getpid()

attempts = Attempts.options(resources={"host_c": 1}).remote()
ref = slow.options(resources={"host_b": 1}).remote(attempts)
deadline = time.monotonic() + 60
while not lightwork.get(attempts.read.remote()):
    assert time.monotonic() < deadline, "the first attempt never started"
    time.sleep(0.05)
first_pid = lightwork.get(attempts.read.remote())[0]
os.kill(first_pid, signal.SIGKILL)  # one machine's pids: the worker on host B dies
where, pid = lightwork.get(ref, timeout=90)
report(first_pid=first_pid, pid=pid, where=where, attempts=len(lightwork.get(attempts.read.remote())))
""", timeout=180)
    assert facts["where"] == cluster.hosts.address("b")  # the nanny's new worker ran it
    assert facts["pid"] != facts["first_pid"] and facts["attempts"] == 2


CLI_DRIVER = """
@lightwork.remote
def square(x):
    return x * x

start = time.time()
results = lightwork.get([square.options(resources={"host_" + h: 1}).remote(i)
                         for i in range(8) for h in ("b", "c")], timeout=60)
end = time.time()
gate = "/tmp/gate"
print(json.dumps({"ready": True, "start": start, "end": end}), flush=True)
while not os.path.exists(gate):
    time.sleep(0.02)
lightwork.shutdown()
report(done=True)
"""


def test_the_cli_attaches_on_the_drivers_host_and_its_timeline_spans_both(cluster):
    script = PRELUDE.format(address=cluster.address,
                             scheduler=cluster.hosts.address("a")) + CLI_DRIVER
    driver = cluster.hosts.popen("a", [sys.executable, "-c", script], env=cluster.env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = driver.stdout.readline()
        assert line, driver.stderr.read()
        window = json.loads(line)

        def cli(host, *args):
            return cluster.hosts.run(host, [sys.executable, "-m", "lightwork", *args],
                                     env=cluster.env, timeout=60)

        status = cli("a", "status", "--format", "json")
        assert status.returncode == 0, status.stderr
        facts = json.loads(status.stdout)
        assert facts["backend"] == "distributed" and facts["worker_count"] == 2
        assert facts["tasks"]["finished"] >= 16

        elsewhere = cli("b", "status")  # B's /tmp has no session of this driver
        assert elsewhere.returncode != 0 and "no running lightwork" in (
            elsewhere.stdout + elsewhere.stderr).lower()

        timeline = cli("a", "timeline", "-o", "/tmp/trace.json")
        assert timeline.returncode == 0, timeline.stderr
        trace = json.loads(cluster.hosts.run("a", ["cat", "/tmp/trace.json"]).stdout)
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        spans = [e for e in events if e.get("name") == "square" and e.get("ph") == "X"]
        assert len({e["pid"] for e in spans}) == 2, "the spans name both workers' processes"
        # Each span was run between the driver's submit and its last result, on the
        # driver's clock: the workers' times were put on it, not left on their own.
        assert len(spans) == 16
        assert all(span["dur"] >= 0 for span in spans)
        first, last = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
        assert (last - first) / 1e6 <= (window["end"] - window["start"]) + 0.05, (first, last)
    finally:
        cluster.hosts.run("a", ["touch", "/tmp/gate"])
        out, err = driver.communicate(timeout=60)
    assert '"done": true' in out, err


@pytest.fixture(scope="module")
def delayed_cluster():
    yield from host_cluster(delay_ms=1)


def test_on_links_of_one_millisecond_every_kind_of_call_holds(delayed_cluster):
    facts = delayed_cluster.drive("""
import numpy as np

start = time.perf_counter()  # a round trip to host B: its refusal of a closed port
try:
    socket.create_connection(({worker_host!r}, 9), timeout=10).close()
except ConnectionRefusedError:
    pass
rtt_ms = (time.perf_counter() - start) * 1e3

@lightwork.remote
def add(x, y):
    return x + y

@lightwork.remote
def outer(n):
    return sum(lightwork.get([add.remote(i, i) for i in range(n)]))

@lightwork.remote
class Counter:
    def __init__(self):
        self.n = 0
    def incr(self):
        self.n += 1
        return self.n

sync = [lightwork.get(add.remote(i, 1), timeout=30) for i in range(20)]
batch = lightwork.get([add.remote(i, i) for i in range(200)], timeout=60)
ready, pending = lightwork.wait([add.remote(1, 1) for _ in range(10)], num_returns=10,
                                timeout=30)
counter = Counter.remote()
counts = lightwork.get([counter.incr.remote() for _ in range(30)], timeout=60)
big = np.ones(4 << 20)  # 32 MB by value
report(rtt_ms=rtt_ms, sync=sync == [i + 1 for i in range(20)],
       batch=batch == [2 * i for i in range(200)], ready=len(ready),
       counts=counts == list(range(1, 31)),
       nested=lightwork.get(outer.remote(20), timeout=60),
       big=bool(lightwork.get(add.remote(big, big), timeout=60).sum() == 2 * big.size))
""".replace("{worker_host!r}", repr(delayed_cluster.hosts.address("b"))), timeout=240)
    assert facts["rtt_ms"] >= 2.0, "the wire did not delay the links"
    assert facts["sync"] and facts["batch"] and facts["counts"] and facts["big"]
    assert facts["ready"] == 10 and facts["nested"] == sum(2 * i for i in range(20))
