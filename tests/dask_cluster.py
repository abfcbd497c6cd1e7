"""A real Dask cluster for the tests: ``dask scheduler`` and ``dask worker`` processes.

Started through the dask CLI exactly as a user would (random free ports, no dashboard),
each in a process group of its own so teardown can check that nothing is left behind.
Each also dies with the test process (``PR_SET_PDEATHSIG``): a run killed by a timeout,
where no teardown runs, leaves no cluster behind to load the machine (a worker under its
nanny exits with the nanny).
Workers run under a nanny (as by default), so a worker killed by a test is restarted.

Starting and stopping one costs seconds, so the modules that need a plain two-worker
cluster share one for the whole session (``shared_dask_cluster`` in ``conftest.py``; those
modules run last, so no other test sees its processes); tests that stop the scheduler or
need other sizes start their own.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

import psutil

DASK = os.path.join(os.path.dirname(sys.executable), "dask")


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """In the child, before exec: SIGTERM when ``parent`` (the test process) is gone."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request was made
        os._exit(1)


class DaskCluster:
    """``workers`` single-thread workers, each declaring ``CPU=cpus_per_worker``."""

    def __init__(self, directory: str, workers: int = 2, cpus_per_worker: int = 1) -> None:
        self.directory = directory
        self.scheduler_file = os.path.join(directory, "scheduler.json")
        self.count = workers
        self.cpus = cpus_per_worker
        self.processes: list[subprocess.Popen] = []

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(os.path.join(self.directory, f"{name}.log"), "wb")
        self.processes.append(subprocess.Popen(
            [DASK, *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=lambda parent=os.getpid(): _die_with(parent),
            env={**os.environ, "PYTHONFAULTHANDLER": "1",
                 # The scheduler gives up on a task at its first lost worker: lightwork
                 # counts each loss against the task's own max_retries (as the README
                 # asks of a cluster's scheduler).
                 "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}))
        log.close()

    def start(self, timeout: float = 40.0) -> DaskCluster:
        self._spawn("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", "0",
                                  "--no-dashboard", "--scheduler-file", self.scheduler_file])
        for index in range(self.count):
            self._spawn(f"worker{index}", [
                "worker", "--scheduler-file", self.scheduler_file, "--host", "127.0.0.1",
                "--nthreads", "1", "--resources", f"CPU={self.cpus}", "--no-dashboard",
                "--name", f"w{index}"])
        deadline = time.monotonic() + timeout
        while len(self.worker_pids()) < self.count or not self._registered():
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the dask cluster did not start in {timeout} s; see the "
                                   f"logs in {self.directory}")
            if any(p.poll() is not None for p in self.processes):
                self.stop()
                raise RuntimeError(f"a dask process exited at start; see {self.directory}")
            time.sleep(0.2)
        return self

    def _registered(self) -> bool:
        """Every worker has registered with the scheduler (its log says so)."""
        registered = 0
        for index in range(self.count):
            with open(os.path.join(self.directory, f"worker{index}.log"), "rb") as f:
                registered += b"Registered to:" in f.read()
        return registered == self.count and os.path.exists(self.scheduler_file)

    def wait_for_workers(self, client, timeout: float = 40.0) -> None:
        """Wait until every worker runs and the scheduler knows it (``client``: a connected
        ``distributed.Client``). A test that killed a worker leaves its nanny restarting
        it: the next module of a shared cluster must get it back whole."""
        deadline = time.monotonic() + timeout
        while (len(self.worker_pids()) < self.count
               or len(client.scheduler_info()["workers"]) < self.count):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the dask cluster has fewer than {self.count} workers after "
                                   f"{timeout} s; see the logs in {self.directory}")
            time.sleep(0.1)

    @property
    def address(self) -> str:
        with open(self.scheduler_file) as f:
            return json.load(f)["address"]

    def worker_pids(self) -> list[int]:
        """Pids of the worker processes (the nannies' children)."""
        pids = []
        for process in self.processes[1:]:
            try:
                pids += [c.pid for c in psutil.Process(process.pid).children()
                         if "multiprocessing" not in " ".join(c.cmdline())
                         or "spawn_main" in " ".join(c.cmdline())]
            except psutil.NoSuchProcess:
                pass
        return pids

    def stop(self) -> list[str]:
        """Stop every process; return descriptions of any left behind (none expected)."""
        groups = [p.pid for p in self.processes]
        deadline = time.monotonic() + 15
        # Workers first, then the scheduler: a worker told by a closing scheduler to close
        # while its nanny also asks it to can hang until the nanny kills it 8 s later.
        for batch in (self.processes[1:], self.processes[:1]):
            for process in batch:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in batch:
                try:
                    process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)
        time.sleep(0.3)
        left = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if os.getpgid(proc.pid) in groups and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])}")
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        for group in groups:  # never leave them to the next test, but report them
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left
